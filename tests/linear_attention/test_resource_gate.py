"""The resource gate (tools/la_resources.py): every shipped config of every linear-attention
kernel, compiled for sm_90 without a GPU, is a row of the committed table
bench/results/la_resources.md. The table must be current (its digest is the kernels'
sources': a kernel or config that changed without regenerating it fails here) and no
program in it may need more shared memory than an H200 block has, fail to compile, have a
tensor-core product whose operand slot its loop refills while it reads (a race on the GPU),
or spill more than the tool's allowances (which only shrink). Compiling everything takes minutes, so
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


def test_the_table_holds_every_call_a_training_step_makes():
    # The torch ops under autograd run the forward that saves the factors and the backward
    # that reads them: programs of their own (stores / loads the plain calls lack); gdp's
    # ops save none, and its sub-token rows make programs of their own too.
    table = gate.parse_table(gate.TABLE.read_text())
    for gating in gate.GATINGS:
        calls = set()
        for row in table["rows"]:
            if gating in row["family"].split():
                calls.update(c.strip() for c in row["used by"].split(","))
        assert set(gate.calls_of(gating)) <= calls, (gating, set(gate.calls_of(gating)) - calls)


def _table(digest, rows, failed=()):
    head = (
        "| kernel | program | family | configs | dtype | K=V | used by | regs | spill stores "
        "| spill loads | smem bytes | per SM | refilled while read |"
    )
    lines = [f"{gate.DIGEST_LINE}{digest}", "", head, "|---" * 13 + "|"]
    for kernel, stores, smem, *refills in rows:
        lines.append(
            f"| {kernel} | BV=64 w4 s2 | kda | wide | bf16 | 128 | fwd | 255 | {stores} "
            f"| {stores} | {smem} | 1 | {refills[0] if refills else 0} |"
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


def test_the_gate_fails_a_product_refilled_while_it_reads():
    current = gate.digest()
    found = gate.problems(_table(current, [("wy_bwd", 0, 1024, 1)]), current, {})
    assert len(found) == 1 and "wy_bwd" in found[0] and "refill" in found[0]


def _pipelined_loop(gram_first):
    """A TTGIR loop as Triton 3.6 pipelines wy_bwd's key pass: k in a buffer of 2 slots, kt
    in one of 3 (prefetching 2 ahead); the Gram k kt^T accumulates asynchronously, A^T dW
    is waited for, then the next slots are refilled."""
    gram = "    %g = ttng.warp_group_dot %k1, %kt1, %acc {inputPrecision = 0 : i32, isAsync = true}"
    body = [
        "    %k1 = ttg.memdesc_index %k[%i0] : !ttg.memdesc<2x64x64xf16>",
        "    %kt1 = ttg.memdesc_index %kt[%i1] : !ttg.memdesc<3x64x64xf16>",
        "    %p = ttng.warp_group_dot %at, %kt1, %zero {inputPrecision = 0 : i32, isAsync = true}",
        "    %pw:2 = ttng.warp_group_dot_wait %p, %kt1 {pendings = 0 : i32}",
        "    %k2 = ttg.memdesc_index %k[%i2] : !ttg.memdesc<2x64x64xf16>",
        "    %c1 = ttg.async_copy_global_to_local %kp, %k2 mask %m other %z",
        "    %kt2 = ttg.memdesc_index %kt[%i3] : !ttg.memdesc<3x64x64xf16>",
        "    %c2 = ttg.async_copy_global_to_local %ktp, %kt2 mask %m other %z",
    ]
    body.insert(2 if gram_first else 4, gram)
    return "\n".join([
        "  %k = ttg.local_alloc : () -> !ttg.memdesc<2x64x64xf16, #shared, #smem, mutable>",
        "  %kt = ttg.local_alloc : () -> !ttg.memdesc<3x64x64xf16, #shared, #smem, mutable>",
        "  %r:2 = scf.for %it = %c0 to %c2 step %c1 iter_args(%acc = %zero) -> (tensor) {",
        *body,
        "    scf.yield %g",
        "  }",
    ])  # fmt: skip


def test_a_product_left_in_flight_over_a_refilled_slot_is_found():
    # The Gram issued after the waited product stays in flight while k's slot (2 slots,
    # refilled 2 ahead: the same slot) is refilled: found. Issued before it, the wait
    # retires it first; kt's 3 slots leave the slot being read alone either way.
    late = _pipelined_loop(gram_first=False)
    assert gate.refilled_while_read(late) == [late.splitlines().index(next(
        ln for ln in late.splitlines() if "%g = " in ln)) + 1]  # fmt: skip
    assert gate.refilled_while_read(_pipelined_loop(gram_first=True)) == []
