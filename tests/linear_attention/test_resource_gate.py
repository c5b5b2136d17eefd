"""The resource gate (tools/la_resources.py): every shipped config of every linear-attention
kernel, compiled for sm_90 without a GPU, is a row of the committed table
bench/results/la_resources.md. The table must be current (its digest is the kernels'
sources': a kernel or config that changed without regenerating it fails here) and no
program in it may need more shared memory than an H200 block has, fail to compile, or spill
more than the tool's allowances (which only shrink). Compiling everything takes minutes, so
CI checks the committed table; `python3 tools/la_resources.py` regenerates it."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("la_resources", ROOT / "tools" / "la_resources.py")
gate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate)


def test_committed_table_is_current_and_within_the_h200s_resources():
    table = gate.parse_table(gate.TABLE.read_text())
    assert len(table["rows"]) > 20, "the table lists too few programs"
    assert gate.problems(table, gate.digest(), gate.ALLOWED_SPILLS) == []


def _table(digest, rows, failed=()):
    head = (
        "| kernel | program | family | configs | dtype | K=V | used by | regs | spill stores "
        "| spill loads | smem bytes | per SM |"
    )
    lines = [f"{gate.DIGEST_LINE}{digest}", "", head, "|---" * 12 + "|"]
    for kernel, stores, smem in rows:
        lines.append(
            f"| {kernel} | BV=64 w4 s2 | kda | wide | bf16 | 128 | fwd | 255 | {stores} "
            f"| {stores} | {smem} | 1 |"
        )
    lines += [f"FAILED: {f}" for f in failed]
    return gate.parse_table("\n".join(lines) + "\n")


def test_the_gate_fails_a_stale_table_a_spill_an_overflow_and_a_failed_case():
    current = gate.digest()
    clean = _table(current, [("state_fwd", 0, 1024)])
    assert gate.problems(clean, current, {}) == []

    stale = _table("0" * 64, [("state_fwd", 0, 1024)])
    assert any("stale" in p for p in gate.problems(stale, current, {}))

    spill = _table(current, [("state_fwd", 0, 1024), ("wy_bwd", 8, 1024)])
    found = gate.problems(spill, current, {})
    assert len(found) == 1 and "wy_bwd" in found[0] and "8 bytes" in found[0]
    assert gate.problems(spill, current, {"wy_bwd": 8}) == []

    over = _table(current, [("state_bwd", 0, gate.MAX_SHARED + 1)])
    assert any("shared memory" in p for p in gate.problems(over, current, {}))

    failed = _table(current, [("state_fwd", 0, 1024)], failed=["kda wide bf16 K=V=128 fwd: X"])
    assert any("failed" in p for p in gate.problems(failed, current, {}))

    assert gate.problems(_table(current, []), current, {}) == ["the table has no rows"]


def test_an_allowance_above_what_the_kernel_spills_now_must_come_down():
    current = gate.digest()
    table = _table(current, [("wy_bwd", 8, 1024)])
    found = gate.problems(table, current, {"wy_bwd": 64})
    assert len(found) == 1 and "lower its allowance" in found[0]


def test_the_digest_follows_every_kernel_source(tmp_path, monkeypatch):
    kernels = tmp_path / "src" / "cudnn_pygraph" / "engines" / "linear_attention" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "configs.py").write_text("CONFIGS = ()\n")
    (kernels / "state.py").write_text("# a kernel\n")
    monkeypatch.setattr(gate, "ROOT", tmp_path)
    monkeypatch.setattr(gate, "KERNELS", kernels)
    before = gate.digest()
    (kernels / "configs.py").write_text("CONFIGS = ((),)\n")
    edited = gate.digest()
    (kernels / "gated.py").write_text("# a new kernel file\n")
    added = gate.digest()
    assert len({before, edited, added}) == 3
    # what compiles is the same: a comment or a docstring edited, the table stays current
    (kernels / "configs.py").write_text('"""The configs."""\nCONFIGS = ((),)  # why\n')
    assert gate.digest() == added
