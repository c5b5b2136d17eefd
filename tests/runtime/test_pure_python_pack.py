"""An install where the native variant pack was not built (pip found no C compiler): the
library runs end to end on the pure-Python pack, refuses a caller's mistake with the same
error, and doctor names which pack runs and why."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

pytestmark = pytest.mark.skipif(
    "python" not in os.environ.get("CUDNN_PYGRAPH_TEST_VARIANT_PACKS", "python"),
    reason="the pure-Python pack is not tested in this run (CUDNN_PYGRAPH_TEST_VARIANT_PACKS)",
)

SCRIPT = r"""
import json, sys
sys.modules["cudnn_pygraph.runtime._variant_pack"] = None  # the extension was not built
import torch
import cudnn_pygraph as cudnn
from cudnn_pygraph.cli import doctor_data, doctor_report
from cudnn_pygraph.runtime import variant_pack

FLOAT = cudnn.data_type.FLOAT
g = cudnn.pygraph(io_data_type=FLOAT, compute_data_type=FLOAT)
a, b = g.tensor([1, 8, 16], name="A"), g.tensor([1, 16, 8], name="B")
c = g.matmul(a, b).set_output(True).set_name("C")
g.create_execution_plans([cudnn.heur_mode.A])
g.build_plans()
ta, tb, tc = torch.randn(1, 8, 16), torch.randn(1, 16, 8), torch.full((1, 8, 8), float("nan"))
g.execute({a: ta, b: tb, c: tc})
try:
    g.execute({a: ta, b: tb})
    refusal = None
except Exception as error:
    refusal = [type(error).__module__ + "." + type(error).__name__, str(error)]
data = doctor_data()
print(json.dumps({
    "native": variant_pack.NATIVE,
    "pack_type": variant_pack.VariantPack.__module__ + variant_pack.implementation.__name__,
    "plan": g.get_plan_name_at_index(0),
    "err": float((tc - ta @ tb).abs().max()),
    "refusal": refusal,
    "doctor": data["variant_pack"],
    "doctor_line": next(x for x in doctor_report(data) if "variant pack" in x),
}))
"""


def test_without_the_native_module_the_library_runs_on_the_python_pack():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["native"] is False
    assert out["pack_type"].endswith("_variant_pack_python")
    assert out["plan"].startswith("triton_gemm[")
    assert out["err"] < 1e-3
    # the same classic error as the native pack, naming the operand not supplied
    assert out["refusal"][0] == "cudnn_pygraph.runtime.variant_pack.MissingOperandError"
    assert "'C'" in out["refusal"][1] and "not supplied" in out["refusal"][1]
    assert out["doctor"]["implementation"] == "python"
    assert "not built" in out["doctor"]["note"]
    assert out["doctor_line"].startswith("  variant pack") and "python" in out["doctor_line"]
