"""tools/classic_samples.py on a tiny synthetic notebook, without a GPU: which cells it
runs, that `import cudnn` is bound to the package under test, what it records of each
check and of the first failing cell, and the table it writes."""

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "classic_samples", ROOT / "tools" / "classic_samples.py"
)
cs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cs)


def cell(source, kind="code"):
    return {"cell_type": kind, "source": source, "metadata": {}}


def notebook(*cells):
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": list(cells)}


SYNTHETIC = notebook(
    cell("# A sample\n", "markdown"),
    cell(
        [
            "!pip install nvidia-cudnn-frontend\n",
            "%matplotlib inline\n",
            "import cudnn\n",
            "NAME = cudnn.__name__\n",
        ]
    ),
    cell("%%bash\nexit 1\n"),
    cell(
        "import torch\n"
        "a = torch.full((3,), float(len(NAME)))\n"
        "b = a + torch.tensor([0.0, 0.5, 0.25])\n"
        "torch.testing.assert_close(a, b, atol=1.0, rtol=0)\n"
    ),
    cell("same = torch.allclose(a, b)\n"),
    cell("raise ZeroDivisionError(NAME)\n"),
    cell("never = True\n"),
)


def test_code_cells_drop_shell_and_magic_lines_and_skip_cell_magics():
    cells = cs.code_cells(SYNTHETIC)
    assert [i for i, _ in cells] == [1, 3, 4, 5, 6]  # markdown and the %%bash cell left out
    assert cells[0][1] == "import cudnn\nNAME = cudnn.__name__"
    assert all("!pip" not in src and "%matplotlib" not in src for _, src in cells)


def test_code_cells_accept_a_string_source_and_drop_an_empty_cell():
    nb = notebook(cell("x = 1\n"), cell("!nvidia-smi\n"), cell(""))
    assert cs.code_cells(nb) == [(0, "x = 1")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("cudnn")
    d = tmp_path_factory.mktemp("samples")
    (d / "01_synthetic.ipynb").write_text(json.dumps(SYNTHETIC))
    return cs.run_all(d, jobs=2, timeout=120, work=d / "work")


@pytest.mark.parametrize("package, module", [("nvidia", "cudnn"), ("ours", "cudnn_pygraph")])
def test_a_run_records_the_first_failing_cell_and_each_check(runs, package, module):
    res = runs[("01_synthetic.ipynb", package)]
    assert res["status"] == "error"
    assert (res["failed_cell"], res["error_type"], res["error"]) == (5, "ZeroDivisionError", module)
    assert res["cells_run"] == 3
    checks = res["checks"]
    assert [(c["cell"], c["call"], c["passed"]) for c in checks] == [
        (3, "assert_close", True),
        (4, "allclose", False),
    ]
    assert [c["max_abs_diff"] for c in checks] == [0.5, 0.5]


def test_the_table_gives_both_outcomes_and_the_difference_between_packages(runs):
    for res in runs.values():  # make the run count as one that ran to the end
        res["status"] = "ran"
    text = cs.render(runs, "python tools/classic_samples.py DIR", "DIR")
    row = next(ln for ln in text.splitlines() if ln.startswith("| 01_synthetic"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == cells[2] == "ran (2 checks)"
    assert cells[3] == "0.5 / 0.5"
    assert cells[4] == "8"  # len("cudnn_pygraph") - len("cudnn"): the checked tensors differ


def test_a_notebook_past_its_timeout_is_recorded_as_a_timeout(tmp_path):
    (tmp_path / "02_slow.ipynb").write_text(
        json.dumps(notebook(cell("import time\ntime.sleep(60)\n")))
    )
    results = cs.run_all(tmp_path, jobs=2, timeout=1, only="02_", work=tmp_path / "work")
    assert {r["status"] for r in results.values()} == {"timeout"}
    assert "timeout: Timeout" in cs.outcome(results[("02_slow.ipynb", "ours")])


def test_under_ours_the_lowering_still_reaches_nvidias_frontend(tmp_path):
    """The rebinding of `cudnn` must not hand our lowering our own package."""
    pytest.importorskip("cudnn")
    nb = notebook(
        cell(
            "from cudnn_pygraph.backend import lowering\nFE = lowering.frontend().module.__name__\n"
            "raise KeyError(FE)\n"
        )
    )
    (tmp_path / "03_frontend.ipynb").write_text(json.dumps(nb))
    res = cs.run_all(tmp_path, jobs=1, timeout=120, only="03_", work=tmp_path / "work")
    assert res[("03_frontend.ipynb", "ours")]["error"].strip("'").startswith("cudnn.")


def test_each_run_draws_the_same_unseeded_inputs(tmp_path):
    """A notebook that seeds nothing draws, under either package, what SEED gives."""
    torch = pytest.importorskip("torch")
    numpy = pytest.importorskip("numpy")
    pytest.importorskip("cudnn")
    nb = notebook(
        cell(
            "import random, numpy, torch\n"
            "v = torch.tensor([random.random(), numpy.random.rand(), float(torch.rand(()))])\n"
            "torch.testing.assert_close(v, v)\n"
        )
    )
    (tmp_path / "04_unseeded.ipynb").write_text(json.dumps(nb))
    res = cs.run_all(tmp_path, jobs=2, timeout=120, only="04_", work=tmp_path / "work")
    import random

    random.seed(cs.SEED)
    numpy.random.seed(cs.SEED)
    torch.manual_seed(cs.SEED)
    expected = [random.random(), numpy.random.rand(), float(torch.rand(()))]
    for package in cs.PACKAGES:
        run = res[("04_unseeded.ipynb", package)]
        assert run["status"] == "ran"
        kept = torch.load(pathlib.Path(run["out_dir"]) / "checks.pt")
        assert kept[0].tolist() == pytest.approx(expected, rel=1e-6)
    assert cs.cross_difference(*res.values()) == 0.0


def test_the_surface_scan_names_what_each_package_lacks(tmp_path):
    import types

    nb = notebook(
        cell(
            "g = cudnn.pygraph()\nx = cudnn.data_type.HALF\ny = cudnn.data_type.NO_SUCH\n"
            "cudnn.backend_version()\n"
        )
    )
    (tmp_path / "07_scan.ipynb").write_text(json.dumps(nb))
    full = types.SimpleNamespace(
        pygraph=1, data_type=types.SimpleNamespace(HALF=1), backend_version=1
    )
    bare = types.SimpleNamespace(pygraph=1, data_type=types.SimpleNamespace(HALF=1))
    missing = cs.missing_attributes(tmp_path, {"nvidia": full, "ours": bare})
    assert missing == {
        "cudnn.backend_version": (["07"], ["ours"]),
        "cudnn.data_type.NO_SUCH": (["07"], ["nvidia", "ours"]),
    }
    text = cs.render({}, "cmd", "DIR", missing)
    assert "| `cudnn.backend_version` | ours | 07 |" in text
