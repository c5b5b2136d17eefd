"""Import boundaries, in a fresh interpreter: describing and validating an sdpa graph
and a gdn graph imports none of torch, triton, numpy or the cuDNN backend, nothing of
ours beyond the IR and validate()'s planning modules, and nothing outside the standard
library. Prints the cost over an empty interpreter (a figure, never asserted)."""

import json
import os
import re
import subprocess
import sys

SCRIPT = r"""
import json, sys, time
base = set(sys.modules)
t0 = time.perf_counter()
import cudnn_pygraph as cudnn
dt = cudnn.data_type
g = cudnn.pygraph(io_data_type=dt.BFLOAT16)
q = g.tensor([2, 8, 1024, 128]); k = g.tensor([2, 8, 1024, 128]); v = g.tensor([2, 8, 1024, 128])
o, _ = g.sdpa(q, k, v, attn_scale=0.088, use_causal_mask=True, generate_stats=False)
o.set_output(True)
g.validate()
h = cudnn.pygraph(io_data_type=dt.BFLOAT16)
T, H, K = 256, 4, 128
x = h.tensor([T, H, K])
gate = h.tensor([T, H], data_type=dt.FLOAT)
cu = h.tensor([3], data_type=dt.INT32)
out = h.gdn(x, x, x, gate, gate, cu, use_qk_l2norm=True)
h.validate()
elapsed = time.perf_counter() - t0
new = sorted(set(sys.modules) - base)
print(json.dumps({"seconds": elapsed, "modules": new}))
"""

HEAVY = ("torch", "triton", "numpy", "cudnn")

# What describing and validating may load of ours: the vocabulary, the IR, the facade,
# the planning modules that decide validate()'s timing (never an engine, the backend, the
# runtime or the planner).
ALLOWED_OURS = re.compile(
    r"cudnn_pygraph(\._types|\._version|\.pygraph|\.graph(\..*)?|\.planning"
    r"|\.planning\.(engine_ids|manifest|validation))?$"
)


def test_graph_api_imports_nothing_heavy():
    # The sdpa graph validates natively (no backend lowering) because a python SDPA engine
    # is offered by default.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("CUDNN_PYGRAPH_ENABLE_OPT_IN_ENGINES", None)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    heavy = [m for m in report["modules"] if m.split(".")[0] in HEAVY]
    assert heavy == [], f"the graph API imported {heavy}"
    ours = [m for m in report["modules"] if m.split(".")[0] == "cudnn_pygraph"]
    assert [m for m in ours if not ALLOWED_OURS.match(m)] == []
    # Everything else is the standard library: which of its modules load differs by
    # Python version, so only their provenance is asserted, never their number.
    foreign = [m for m in report["modules"] if m.split(".")[0] != "cudnn_pygraph"]
    outside = [m for m in foreign if m.split(".")[0].lstrip("_") not in STDLIB]
    assert outside == [], f"the graph API imported non-stdlib modules {outside}"
    print(
        f"\nimport + describe + validate sdpa and gdn graphs: {report['seconds'] * 1e3:.1f} ms, "
        f"{len(ours)} modules of ours, {len(foreign)} of the standard library"
    )


STDLIB = {name.lstrip("_") for name in sys.stdlib_module_names}
