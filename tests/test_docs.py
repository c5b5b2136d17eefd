"""The docs stay true: every code block in README.md and docs/ runs as written (python
blocks each in a fresh interpreter, command blocks line by line, in a user's environment:
no TRITON_INTERPRET set, a private autotune cache); docs/ops.md is what
tools/gen_op_reference.py renders from the OpSpec tables (stale -> this fails; regenerate
it), every relative link in docs/ resolves, README's links resolve (absolute under pyproject's
Source URL once the project has one, for PyPI),
every module the architecture page names exists, and bench/plot.py turns results tables
into charts (and copes with results that do not exist yet)."""

import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from cudnn_pygraph.graph.ops import OPS

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load(ROOT / "tools" / "gen_op_reference.py", "gen_op_reference")
plot = _load(ROOT / "bench" / "plot.py", "bench_plot")


def test_op_reference_is_fresh():
    assert (DOCS / "ops.md").read_text() == gen.render(), (
        "docs/ops.md is stale: run PYTHONPATH=src python tools/gen_op_reference.py"
    )


def test_op_reference_has_every_op_with_its_parameters():
    text = gen.render()
    for name, spec in OPS.items():
        section = text.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0]
        for p in spec.params:
            assert f"| `{p.name}` |" in section, (name, p.name)
        assert ("python-only (never lowers)" in section) == (spec.backend_method is None), name


DOC_FILES = sorted(DOCS.glob("*.md"))


# ---------------------------------------------------------------- code blocks run as written
FENCE = re.compile(r"^(<!-- not run: [^>]+ -->\n)?```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
RUN_LANGS = ("python", "bash")
# Command lines a page may show that the suite does not run: installs (CI's own first step)
# and the test suite itself.
NOT_RUN_COMMANDS = ("pip install", "python -m pytest")
PAGES = [ROOT / "README.md", *DOC_FILES]


def code_blocks(page):
    """[(lang, body, marked_not_run)] in page order."""
    return [(lang, body, bool(mark)) for mark, lang, body in FENCE.findall(page.read_text())]


def _blocks_to_run():
    out = []
    for page in PAGES:
        for i, (lang, body, marked) in enumerate(code_blocks(page)):
            if lang in RUN_LANGS and not marked:
                out.append(pytest.param(page, lang, body, id=f"{page.name}-{i}-{lang}"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_code_block_says_whether_it_runs(page):
    for lang, body, _marked in code_blocks(page):
        assert lang in (*RUN_LANGS, "text"), (
            f"{page.name}: a ```{lang or ''} block: say python or bash (run by this test) or "
            f"text (a listing), or mark it <!-- not run: why -->\n{body[:200]}"
        )


def _user_env(tmp_path):
    """A user's shell: this package on the path, TRITON_INTERPRET as a user leaves it
    (unset), the autotune and compiled-plan caches private to the test."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env["CUDNN_PYGRAPH_AUTOTUNE_CACHE"] = str(tmp_path / "autotune")
    env["CUDNN_PYGRAPH_COMPILED_CACHE"] = str(tmp_path / "compiled")
    return env


def _commands(body):
    """The command lines of a bash block: comments dropped, `a && b` split."""
    for line in body.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for cmd in line.split("&&"):
            cmd = cmd.strip()
            if not cmd.startswith(NOT_RUN_COMMANDS):
                yield cmd


def _argv(cmd):
    """A documented command as argv for this interpreter (cudnn-pygraph is the installed
    entry point of `python -m cudnn_pygraph`); leading VAR=value words become env."""
    words = shlex.split(cmd)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = str(ROOT / value) if name == "PYTHONPATH" else value
    if words[0] == "cudnn-pygraph":
        words = [sys.executable, "-m", "cudnn_pygraph", *words[1:]]
    elif words[0] == "python":
        words = [sys.executable, *words[1:]]
    return words, env


def _run_page_prefix(page, upto, tmp_path, env):
    """Run the python blocks before block `upto` on `page` (files a later command reads,
    such as my_graph.json, are written by them)."""
    for lang, body, marked in code_blocks(page)[:upto]:
        if lang == "python" and not marked and "open(" in body:
            _run_python(body, tmp_path, env)


def _run_python(body, cwd, env):
    proc = subprocess.run(
        [sys.executable, "-c", body],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{body}\n--- stderr\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.mark.parametrize("page, lang, body", _blocks_to_run())
def test_code_block_runs_as_written(page, lang, body, tmp_path):
    env = _user_env(tmp_path)
    if lang == "python":
        _run_python(body, tmp_path, env)
        return
    blocks = code_blocks(page)
    _run_page_prefix(page, [b[1] for b in blocks].index(body), tmp_path, env)
    for cmd in _commands(body):
        argv, extra = _argv(cmd)
        cwd = ROOT if any(a.endswith(".py") and "/" in a for a in argv[1:2]) else tmp_path
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 0, (
            f"{cmd}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
        assert "Traceback" not in proc.stderr, proc.stderr


def test_readme_keeps_two_commands_and_links_that_resolve():
    text = (ROOT / "README.md").read_text()
    commands = [
        c
        for lang, body, _ in code_blocks(ROOT / "README.md")
        if lang == "bash"
        for c in body.strip().splitlines()
    ]
    assert len(commands) == 2, commands  # install + demo, install + tests
    # PyPI renders README without the repository, so its links must be absolute there: under
    # the Source URL pyproject declares. The project has no public address yet, so none is
    # declared (an invented one would be a broken link everywhere) and the links are relative.
    source = re.search(r'^Source = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    prefix = f"{source.group(1)}/blob/main/" if source else ""
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets
    for target in targets:
        assert target.startswith(prefix) and ("://" in target) == bool(source), target
        assert (ROOT / target.removeprefix(prefix).split("#")[0]).exists(), target


@pytest.mark.parametrize("doc", DOC_FILES, ids=[d.name for d in DOC_FILES])
def test_relative_links_resolve(doc):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
        if "://" in target:
            continue
        assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


def test_architecture_names_modules_that_exist():
    text = (DOCS / "architecture.md").read_text()
    named = set(re.findall(r"`?((?:graph|planning|engines|backend|runtime)/[\w/]+\.py)", text))
    named |= set(re.findall(r"\b((?:cli|demo|__main__)\.py)", text))
    assert len(named) > 15
    pkg = ROOT / "src" / "cudnn_pygraph"
    missing = sorted(p for p in named if not (pkg / p).exists())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


# ---------------------------------------------------------------- charts
GEMM_TABLE = """# GEMM
## bf16 GEMM
| M | N | K | best config | ours ms | ours TFLOP/s | torch.matmul ms | torch TFLOP/s | ours/torch |
|---|---|---|---|---|---|---|---|---|
| 1024 | 1024 | 1024 | t | 0.0300 | 70 | 0.0280 | 76 | 0.93x |
| 4096 | 4096 | 4096 | t | 0.2000 | 680 | 0.2200 | 620 | 1.10x |
"""
SDPA_TABLE = """## sdpa fwd
| shape | ours best (config) | ours ms | backend ms | ours/torch | ours/backend |
|---|---|---|---|---|---|
| b4 s2048 | cfg | 1.0 | 0.9 | 1.20x | 0.90x |
| b1 s8192 | cfg | 1.0 | 0.9 | — | 0.95x |
"""
GDN_TABLE = """| shape | init/final state | ours fwd ms | fla fwd ms | fwd speedup vs fla | fwd+bwd / own fwd |
|---|---|---|---|---|---|
| 4x2048 | yes | 1.0 | 1.5 | 1.50x | 3.10x |
"""
BACKEND_TABLE = """| graph | burst | ours | theirs | ours/theirs (min) | ours/floor (min) |
|---|---:|---:|---:|---:|---:|
| matmul bf16 | 1 | 22.8 / 26.7 | 26.2 / 28.4 | 0.87 | 1.72 |
|  | rel err | 1.7e-03 | 1.7e-03 | | |
"""
HOST_TABLE = """| graph | plan | burst | ours | backend | host ours/backend (min) |
|---|---|---:|---:|---:|---:|
| decode B4 | triton_sdpa_decode[NUM_WARPS=4, SPLIT_KV=16] | 8 | 11.4 / 11.7 | 9.9 / 10.4 | 1.14 |
"""
NO_RATIO = """| case | min ns/call |
|---|---:|
| from_objects | 355 |
"""


@pytest.mark.parametrize(
    "text, labels, series",
    [
        (GEMM_TABLE, ["1024 x 1024 x 1024", "4096 x 4096 x 4096"], {"ours/torch": [0.93, 1.10]}),
        (
            SDPA_TABLE,
            ["b4 s2048", "b1 s8192"],
            {"ours/torch": [1.20, None], "ours/backend": [0.90, 0.95]},
        ),
        (
            GDN_TABLE,
            ["4x2048, yes"],
            {"fwd speedup vs fla": [1.50]},
        ),  # "/ own fwd" is not vs a peer
        (
            BACKEND_TABLE,
            ["matmul bf16, 1"],
            {"ours/theirs (min)": [0.87], "ours/floor (min)": [1.72]},
        ),
        (
            HOST_TABLE,
            ["decode B4, 8"],
            {"host ours/backend (min)": [1.14]},
        ),  # the plan's full name is the table's, not the bar's label
        (NO_RATIO, None, None),
    ],
    ids=[
        "gemm-mnk-label",
        "sdpa-missing-cell",
        "gdn-own-ratio-excluded",
        "plain-ratios-note-row-dropped",
        "plan-column-not-in-label",
        "a-unit-is-not-a-ratio",
    ],
)
def test_plot_reads_ratio_columns(text, labels, series):
    tables = plot.parse_tables(text)
    if labels is None:
        assert tables == []
        return
    (table,) = tables
    assert table.labels == labels and table.series == series


def test_plot_charts_results_and_lists_them(tmp_path, capsys):
    results, img, doc = tmp_path / "results", tmp_path / "img", tmp_path / "docs" / "benchmarks.md"
    results.mkdir()
    (results / "gemm.md").write_text(GEMM_TABLE + "\n" + GDN_TABLE)
    (results / "host.md").write_text(NO_RATIO)
    doc.parent.mkdir()
    doc.write_text(f"# Benchmarks\n\nintro\n\n{plot.INDEX_BEGIN}\nold\n{plot.INDEX_END}\n\ntail\n")
    rc = plot.main(["--results", str(results), "--img", str(img), "--doc", str(doc)])
    text = doc.read_text()
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2 and "needs matplotlib: pip install matplotlib" in capsys.readouterr().err
        return
    assert rc == 0
    for png in ("gemm.png", "gemm-2.png"):
        assert (img / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](../img/{png})" in text
    assert "[host](../results/host.md)" in text and "(no ratio table to chart)" in text
    assert (
        text.startswith("# Benchmarks\n\nintro\n")
        and text.endswith("\ntail\n")
        and "old" not in text
    )


RUNS = """# sdpa
## Run 2, 2026-11-30 10:00 UTC (the latest)
NVIDIA H200 (sm_90), torch 2.11.0+cu130, triton 3.6.0, libcudnn 9.19.0
{table}
## Run 1, 2026-11-29 09:00 UTC
NVIDIA H100, torch 2.9.0, triton 3.5.0
{old}
"""


@pytest.mark.parametrize("newest_first", [True, False], ids=["newest-first", "oldest-first"])
def test_plot_charts_the_latest_run_of_a_table_and_names_gpu_date_versions(newest_first):
    new = SDPA_TABLE.split("\n", 1)[1]
    old = new.replace("1.20x", "0.50x")
    text = RUNS.format(table=new, old=old)
    if not newest_first:  # the same runs, history first: the dates decide, not the order
        head, run2 = text.split("## Run 2", 1)
        run2, run1 = run2.split("## Run 1", 1)
        text = head + "## Run 1" + run1 + "## Run 2" + run2
    (table,) = plot.latest_per_kind(plot.parse_tables(text))
    assert table.series["ours/torch"][0] == 1.20
    assert (
        table.caption()
        == "NVIDIA H200 · 2026-11-30 10:00 · torch 2.11.0+cu130, triton 3.6.0, libcudnn 9.19.0"
    )


@pytest.mark.parametrize(
    "header, way",
    [
        ("ours/torch", "higher"),
        ("fwd speedup vs fla", "higher"),
        ("torch/first", "higher"),
        ("ours/theirs (min)", "lower"),
        ("op / raw", "lower"),
        ("host ours/backend (min)", "lower"),
        ("ours/backend", "higher"),
    ],
)
def test_plot_says_which_way_is_better(header, way):
    assert plot.better(header) == way


def test_plot_refuses_a_ratio_column_without_a_direction():
    with pytest.raises(ValueError, match="no rule in bench/plot.py BETTER"):
        plot.better("mine/yours")


def test_every_committed_ratio_column_has_a_direction():
    for f in sorted((ROOT / "bench" / "results").glob("*.md")):
        for table in plot.parse_tables(f.read_text()):
            for header in table.series:
                assert plot.better(header) in ("higher", "lower"), (f.name, header)


def test_plot_without_results_is_not_an_error(tmp_path):
    doc = tmp_path / "benchmarks.md"
    rc = plot.main(
        ["--results", str(tmp_path / "none"), "--img", str(tmp_path / "img"), "--doc", str(doc)]
    )
    assert rc == 0 and "No results are committed yet" in doc.read_text()
    assert not (tmp_path / "img").exists()


def test_the_committed_benchmarks_page_charts_the_latest_run_of_each_table(tmp_path):
    """docs/benchmarks.md is what bench/plot.py renders from bench/results now: one chart
    per table's latest run, none superseded (results committed without re-plotting fail)."""
    pytest.importorskip("matplotlib")
    import shutil

    shutil.copytree(ROOT / "bench" / "results", tmp_path / "bench" / "results")
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.parent.mkdir()
    shutil.copy(ROOT / "docs" / "benchmarks.md", doc)
    argv = ["--results", str(tmp_path / "bench" / "results"), "--img", str(doc.parent / "img")]
    assert plot.main([*argv, "--doc", str(doc)]) == 0
    assert doc.read_text() == (ROOT / "docs" / "benchmarks.md").read_text(), (
        "docs/benchmarks.md is stale: run python bench/plot.py"
    )


# ---------------------------------------------------------------- facts read from the code
def test_every_page_a_doc_names_exists():
    """A bare mention of a page (`see linear-attention.md`, `bench/results/gdn.md`) names a
    file of the repository, relative to the page or to the root, as a link would."""
    for page in PAGES:
        for named in re.findall(r"(?<![\w/.-])((?:\.\./)?[\w./-]*[\w-]+\.md)\b", page.read_text()):
            if "://" in named:
                continue
            assert (page.parent / named).exists() or (ROOT / named).exists(), (
                f"{page.name} names {named}, which is not in the repository"
            )


def test_head_dims_the_docs_state_are_the_served_ones():
    from cudnn_pygraph.engines.linear_attention.kernels.configs import SUPPORTED_HEAD_DIMS

    stated = []
    for page in PAGES:
        for listed in re.findall(r"K and V(?: are|:) ([\d, or]+\d)", page.read_text()):
            stated.append((page.name, tuple(int(d) for d in re.findall(r"\d+", listed))))
    assert stated, "no page states the served head dims"
    assert {dims for _, dims in stated} == {tuple(SUPPORTED_HEAD_DIMS)}, stated


def test_the_cache_layout_the_docs_give_is_the_codes_schema():
    from cudnn_pygraph.runtime.compiled_cache import SCHEMA

    versions = re.findall(r"<root>/v(\d+)/", (DOCS / "compiled-cache.md").read_text())
    assert versions and set(versions) == {str(SCHEMA)}, versions


def engine_rows():
    """The table docs/gpus.md shows, rendered from each engine's capability row."""
    import importlib

    from cudnn_pygraph.planning import manifest

    short = {"BFLOAT16": "bf16", "HALF": "fp16", "FLOAT": "fp32"}
    lines = [
        "| family | engine | GPU (compute capability) | CPU (Triton interpreter) | dtypes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for family in manifest.FAMILIES:
        for slot in family.slots:
            caps = getattr(importlib.import_module(slot.module), slot.factory).capabilities
            arch = (
                f"sm_{caps.sm_lo} and newer"
                if caps.sm_hi is None
                else f"sm_{caps.sm_lo} to sm_{caps.sm_hi}"
            )
            dtypes = ", ".join(sorted(short.get(d.name, d.name.lower()) for d in caps.dtypes))
            cpu = "yes" if caps.runs_on_interpreter else "no"
            lines.append(f"| {family.name} | `{slot.name}` | {arch} | {cpu} | {dtypes or 'any'} |")
    return "\n".join(lines)


def test_the_gpu_table_is_the_engines_capability_rows():
    text = (DOCS / "gpus.md").read_text()
    shown = text.split("-->\n", 1)[1].split("\n<!-- end engine rows -->", 1)[0]
    assert shown == engine_rows(), "docs/gpus.md is stale; its rows should read:\n" + engine_rows()
