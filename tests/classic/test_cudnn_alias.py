"""`sys.modules["cudnn"] = cudnn_pygraph` (what FlashInfer / TransformerEngine users do,
since those libraries `import cudnn` themselves) works: our backend is still NVIDIA's
compiled module, found by its distribution, and a FlashInfer-shaped program plans through
the alias. Also: a backend refusal names our node once, then the backend's message."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cudnn_pygraph as cudnn
from cudnn_pygraph.backend import lowering

REASON = lowering.unavailable_reason()
needs_backend = pytest.mark.skipif(
    REASON is not None, reason=f"the backend cannot run here: {REASON}"
)
PROGRAM = Path(__file__).with_name("flashinfer_alias_program.py")
# the backend's own words for the refusal the program provokes
ALIBI_RULE = "alibi"


@pytest.fixture(scope="module")
def alias_report():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, str(PROGRAM)], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_backend
def test_the_alias_keeps_nvidias_backend(alias_report):
    assert alias_report["cudnn_is_ours"] and alias_report["cudnn_still_ours"]
    assert alias_report["builder_module"] == "cudnn._compiled_module"
    assert alias_report["backend_version"] == lowering.frontend().libcudnn_version


@needs_backend
def test_a_flashinfer_shaped_program_plans_through_the_alias(alias_report):
    # A GPU or the Triton interpreter (CI) lets our SDPA engines plan it; jit then
    # builds, and the graph_cache hit returns the same built graph.
    assert "not_planned" not in alias_report, alias_report.get("not_planned")
    assert alias_report["plans"] > 0 and alias_report["cache_hit"]
    assert len(alias_report["uids"]) == len(set(alias_report["uids"])) == 8


@needs_backend
def test_a_refusal_through_the_alias_names_the_node_once(alias_report):
    assert_named_once(alias_report["refusal"], "sdpa", "attn_alibi")


def assert_named_once(message, op, node):
    assert message is not None, "the backend accepted a graph it refuses"
    assert len(re.findall(rf"node '{node}'", message)) == 1, message
    assert message.startswith(f"{op} node '{node}': "), message
    assert ALIBI_RULE in message.split(": ", 1)[1].lower(), message  # then the backend's words


def _alibi_graph():
    g = cudnn.pygraph(
        name="alibi",
        io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        sm_version=90,
        sm_count=132,
    )
    q, k, v = (g.tensor([1, 2, 64, 64], name=n) for n in "qkv")
    x = g.scale(q, g.tensor([1, 1, 1, 1], name="s"), name="prescale")
    o, _ = g.sdpa(
        x, k, v, attn_scale=0.125, use_alibi_mask=True, generate_stats=False, name="attn_alibi"
    )
    o.set_output(True)
    return g


@needs_backend
@pytest.mark.parametrize("path", ["lowering", "validate", "plan"])
def test_a_refusal_names_the_node_once(path):
    g = _alibi_graph()
    with pytest.raises(cudnn.cudnnGraphNotSupportedError) as err:
        if path == "lowering":
            lowering.lowered(g)
        elif path == "validate":
            g.validate()
        else:
            g.create_execution_plans([cudnn.heur_mode.A])
    message = str(err.value)
    assert_named_once(message[message.index("sdpa node") :], "sdpa", "attn_alibi")
    assert message.count("node 'attn_alibi'") == 1, message


@needs_backend
def test_an_error_of_ours_is_not_renamed(monkeypatch):
    # Lowering calls the backend's builders; should one hand back an error of ours (a
    # builder that reaches this package again), it passes through with its node named once.
    g = _alibi_graph()
    fe = lowering.frontend()

    def sdpa(self, *args, **kwargs):
        raise cudnn.cudnnGraphNotSupportedError("sdpa node 'attn_alibi': refused inside")

    monkeypatch.setattr(fe, "errors", fe.errors + (cudnn.cudnnGraphNotSupportedError,))
    monkeypatch.setattr(fe, "builder", type("B", (fe.builder,), {"sdpa": sdpa}))
    with pytest.raises(cudnn.cudnnGraphNotSupportedError) as err:
        lowering.construct(g)
    assert str(err.value) == "sdpa node 'attn_alibi': refused inside"
