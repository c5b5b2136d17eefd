"""The linear-attention resource gate: every shipped config of every linear-attention
kernel compiled for sm_90 on a machine without a GPU, and what ptxas says each program
needs (registers, spill bytes, shared memory), as one committed table.

  python3 tools/la_resources.py            # compile all, write bench/results/la_resources.md
  python3 tools/la_resources.py --check    # no compiling: is the committed table current,
                                           # and does any row spill or overflow shared memory
  python3 tools/la_resources.py --quick    # bf16 at K = V = 128 only, printed: a candidate
                                           # config (added to kernels/configs.py) judged
                                           # before any GPU run
  python3 tools/la_resources.py --fp32     # also fp32 calls (the accuracy reference; ~2x
                                           # the compiling), printed, the table untouched

How: the real launchers (kernels/gdn.py, summary.py, chain.py) run on CPU tensors with
Triton's driver replaced by one that names an sm_90 target and launches nothing, so every
`kernel[grid](...)` a launcher makes compiles exactly the program it would launch on the
H200 (its config entry, the launcher's block narrowing, Triton's specialization of the
arguments) and returns. Nothing reads a kernel's output on the host (the launchers are
sync-free), so nothing needs to run. A program needing more shared memory than an H200
block may have raises Triton's OutOfResources here as the device's loader would, so
launch_within_shared_memory's fallback to fewer stages happens here too. ptxas -v (Triton's
own, sm_90a) on each distinct program gives registers and spill bytes.

Each program's TTGIR is also read for one pipelining race (refilled_while_read): an
asynchronous tensor-core product whose operand slot the loop refills before the product is
retired, which makes its result change from run to run on the GPU.

The table carries a digest of the kernels' sources (every .py of the kernels' package
folder: the kernels, their launchers and configs.py): tests/linear_attention/
test_resource_gate.py fails when the digest is not the sources' (a kernel or config changed
and the table was not regenerated), when a case failed to compile, when a program needs
more shared memory than an H200 block may have, when one has a product refilled while it
reads, or when one spills more than
ALLOWED_SPILLS below lets it.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import tokenize

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNELS = ROOT / "src" / "cudnn_pygraph" / "engines" / "linear_attention" / "kernels"
TABLE = ROOT / "bench" / "results" / "la_resources.md"
# An H200 / H100 block's shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB of
# the SM's 228 KB), the limit Triton's loader checks a program against.
MAX_SHARED = 232448
SM_REGISTERS = 64 * 1024
ARCH = 90
H = 16  # heads, as the benchmarks' rows: an int argument's divisibility is specialized on
DIGEST_LINE = "sources sha256: "
# The families by how they gate and which rows they read: gdp runs gdn's kernels on its
# timeline of n sub-tokens per token (gdp_engine.py), their SUB = n programs its own; n = 2
# and 3 (3 does not divide the chunk: its tiles start inside a token).
GATINGS = ("gdn", "kda", "gdn2", "gdp-n2", "gdp-n3")
# The calls of a training step with the saved factors: the families whose ops save them
# (gdp's do not: ops/linear_attention/family.py).
SAVED_CALLS = ("fwd-save", "bwd-saved")
BLOCKS = ("BK", "BV", "BA", "BG", "PART")


# Spill-store bytes a kernel may still have (its worst program, bf16, any K): the shipped
# configs that spill today, to be removed (issue 30; bench/results/la_resources.md lists
# each program). The gate fails on a spill above its kernel's allowance and on an allowance
# above what the kernel spills now, so the allowances only come down, to none.
ALLOWED_SPILLS = {
    # kda / gdn2 at K = 256 with checkpoints, the sub-chunk backward configs (the tree's:
    # 2344)
    "dqk": 2400,
    "dv_local": 192,
    "output_fwd": 836,
    "state_bwd": 1688,
    "state_fwd": 3624,
    "transition": 128,
    "wy_bwd": 268,
    # gdn2 at K = 256 under the tree configs; the sub-chunk configs' worst is 1148 (gdn2,
    # K = 256)
    "wy_solve": 5636,
}


def digest() -> str:
    """sha256 over the relative path and the code of every .py in the kernels' folder: its
    text without comments, docstrings and blank lines, so a table goes stale when what
    compiles changes, not when a comment does (and reads the same on every Python: a
    syntax tree's dump does not)."""
    h = hashlib.sha256()
    for path in sorted(KERNELS.glob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + _code(path).encode() + b"\0")
    return h.hexdigest()


def _code(path) -> str:
    text = path.read_text()
    lines = text.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
            and not lines[body[0].lineno - 1][: body[0].col_offset].strip()  # alone on its lines
        ):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    return "\n".join(
        line.rstrip() for n, line in enumerate(lines, 1) if n not in docstrings and line.strip()
    )


# ------------------------------------------------------------------ a pipelining race

_SLOT = re.compile(r"\s*(%[\w#]+) = ttg\.memdesc_index (%[\w#]+)\[")
_BUFFER = re.compile(r"\s*(%[\w#]+) = ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x")
_REFILL = re.compile(r"ttg\.async_copy_global_to_local %[\w#]+, (%[\w#]+)")
_ASYNC_DOT = re.compile(r"ttng\.warp_group_dot (%[\w#]+), (%[\w#]+), ")


def refilled_while_read(ttgir: str) -> list:
    """The asynchronous tensor-core products (wgmma) of a compiled program whose operand
    buffer the same loop iteration refills before any wait retires them, in a buffer with
    no slot to spare beyond how far the loop prefetches: the refill lands in the slot the
    product is still reading, and its result changes from run to run. Triton 3.6's
    pipeliner leaves such a product in flight when its result is only accumulated (the
    product's line numbers in the TTGIR)."""
    lines = ttgir.splitlines()
    buffer_of, slots = {}, {}
    for line in lines:
        if m := _SLOT.match(line):
            buffer_of[m.group(1)] = m.group(2)
        if m := _BUFFER.match(line):
            slots[m.group(1)] = int(m.group(2))
    found = []
    for i, line in enumerate(lines):
        if "ttng.warp_group_dot " not in line or "isAsync = true" not in line:
            continue
        read = {buffer_of[o] for o in _ASYNC_DOT.search(line).groups() if o in buffer_of}
        loop = [k for k in range(i) if "scf.for" in lines[k]]
        end = next((k for k in range(i, len(lines)) if "scf.yield" in lines[k]), None)
        if not read or not loop or end is None:
            continue
        body = lines[loop[-1] : end]
        refilled = {buffer_of.get(m.group(1)) for m in map(_REFILL.search, body) if m}
        ahead = max((slots[b] for b in refilled if b in slots), default=1) - 1
        for later in lines[i + 1 : end]:
            if "ttng.warp_group_dot_wait" in later and "pendings = 0" in later:
                break
            m = _REFILL.search(later)
            buffer = buffer_of.get(m.group(1)) if m else None
            if buffer in read and slots.get(buffer, 0) <= ahead:
                found.append(i + 1)
                break
    return found


# ------------------------------------------------------------------ the committed table


def parse_table(text: str) -> dict:
    """{"digest": str or None, "rows": [{column: value}], "failed": [str]} of a table."""
    out = {"digest": None, "rows": [], "failed": []}
    header = None
    for line in text.splitlines():
        if line.startswith(DIGEST_LINE):
            out["digest"] = line[len(DIGEST_LINE) :].strip()
        elif line.startswith("FAILED: "):
            out["failed"].append(line[len("FAILED: ") :])
        elif line.startswith("| kernel |"):
            header = [c.strip() for c in line.strip("|").split("|")]
        elif header and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out["rows"].append(dict(zip(header, cells)))
        elif not line.startswith("|"):
            header = None
    return out


def problems(table: dict, current: str, allowed_spills: dict) -> list:
    """What keeps a parsed table from passing the gate: stale, a failed case, a program over
    the shared-memory limit, a product refilled while it reads (refilled_while_read), a
    program that spills more than allowed_spills[kernel] bytes
    (stores), or an allowance above what the kernel spills now (the allowances only
    shrink)."""
    out = []
    if table["digest"] != current:
        out.append("the table is stale (its sources digest is not the sources'): run "
                   "python3 tools/la_resources.py")  # fmt: skip
    if not table["rows"]:
        out.append("the table has no rows")
    out += [f"a case failed to compile: {f}" for f in table["failed"]]
    worst = {}
    for row in table["rows"]:
        kernel = row["kernel"]
        shared = int(row["smem bytes"])
        if shared > MAX_SHARED:
            out.append(f"{kernel} ({row['program']}) needs {shared} bytes of shared memory "
                       f"> {MAX_SHARED}")  # fmt: skip
        refills = int(row.get("refilled while read", 0))
        if refills:
            out.append(f"{kernel} ({row['program']}, {row['used by']}): {refills} tensor-core "
                       "product(s) whose operand buffer the loop refills while they read it "
                       "(refilled_while_read): results change from run to run")  # fmt: skip
        stores = int(row["spill stores"])
        worst[kernel] = max(worst.get(kernel, 0), stores)
        if stores > allowed_spills.get(kernel, 0):
            out.append(f"{kernel} ({row['program']}, {row['used by']}) spills {stores} bytes "
                       f"(allowed {allowed_spills.get(kernel, 0)})")  # fmt: skip
    for kernel, allowed in allowed_spills.items():
        if worst.get(kernel, 0) < allowed:
            out.append(f"{kernel}: allowed {allowed} spill bytes but spills "
                       f"{worst.get(kernel, 0)} now: lower its allowance")  # fmt: skip
    return out


# ------------------------------------------------------------------ compiling without a GPU


class _CompileOnlyDriver:
    """What Triton's JIT asks of its driver before a launch: an sm_90 target, device 0."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", ARCH, 32)


class Recorder:
    """Every program the launchers compile: {hash: row}, each row with the cases using it."""

    def __init__(self):
        self.rows = {}
        self.case = None
        self.failed = []

    def seen(self, fn, compiled, reduced_from):
        row = self.rows.get(compiled.hash)
        if row is None:
            md = compiled.metadata
            cx = {fn.arg_names[k[0]]: v for k, v in compiled.src.constants.items()}
            blocks = " ".join(f"{b}={cx[b]}" for b in BLOCKS if b in cx)
            program = f"{blocks} w{md.num_warps} s{md.num_stages}".strip()
            if getattr(md, "maxnreg", None):
                program += f" maxnreg {md.maxnreg}"
            row = self.rows[compiled.hash] = {
                "kernel": fn.__name__.removesuffix("_kernel"),
                "program": program,
                "shared": md.shared,
                "warps": md.num_warps,
                "ptx": compiled.asm["ptx"],
                "refills": len(refilled_while_read(compiled.asm["ttgir"])),
                "uses": set(),
                "reduced": set(),
            }
        row["uses"].add(self.case)
        if reduced_from is not None:
            row["reduced"].add(reduced_from)


def _compile_only(recorder):
    """Patch Triton's JIT so a launch compiles for sm_90 and returns; returns the undo."""
    import triton.runtime.jit as jit
    from triton.runtime.driver import driver
    from triton.runtime.errors import OutOfResources

    original = jit.JITFunction.run
    asked_stages = {}

    def run(self, *args, grid, warmup, **kwargs):
        compiled = original(self, *args, grid=grid, warmup=True, **kwargs)
        key = (self.__name__, recorder.case)
        if compiled.metadata.shared > MAX_SHARED:
            asked_stages.setdefault(key, compiled.metadata.num_stages)
            raise OutOfResources(compiled.metadata.shared, MAX_SHARED, "shared memory")
        recorder.seen(self, compiled, asked_stages.pop(key, None))
        return compiled

    previous = driver._active  # None until a launch made one: reset_active would need a GPU
    driver.set_active(_CompileOnlyDriver())
    jit.JITFunction.run = run

    def undo():
        jit.JITFunction.run = original
        driver.set_active(previous)

    return undo


def _ptxas_facts(ptx: str) -> tuple:
    """(registers, spill store bytes, spill load bytes) from Triton's bundled ptxas -v."""
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        report = subprocess.run(
            [ptxas, f"-arch=sm_{ARCH}a", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    if regs is None or spills is None:
        raise RuntimeError(f"ptxas -v said nothing parsable:\n{report}")
    return int(regs.group(1)), int(spills.group(1)), int(spills.group(2))


# ------------------------------------------------------------------ the cases


def sub_tokens(gating) -> int:
    """Timeline rows per real token: gdp's n, 1 elsewhere."""
    return int(gating.removeprefix("gdp-n")) if gating.startswith("gdp-n") else 1


def calls_of(gating) -> tuple:
    """The launcher calls a training step of the family makes (CALLS, less the saved
    factors' pair where its ops save none)."""
    return tuple(c for c in CALLS if not (sub_tokens(gating) > 1 and c in SAVED_CALLS))


def _inputs(gating, dtype, dim, n_seqs=2, seq=64):
    """CPU tensors of one problem as the benchmarks build it (bench/kda.py, bench/gdn.py):
    bf16 q / k / v; gdn's g and beta bf16 [T, H]; kda's g fp32 [T, H, K]; gdn2's beta
    [T, H, K] and write gate [T, H, V]; an fp32 call fp32 throughout. gdp: seq real tokens a
    sequence, k / v / beta at their n sub-token rows, cu_seqlens on that timeline."""
    import torch

    n = sub_tokens(gating)
    total = n_seqs * seq
    low = dtype
    x = {name: torch.zeros(total * (1 if name == "q" else n), H, dim, dtype=low)
         for name in ("q", "k", "v")}  # fmt: skip
    if gating == "gdn" or n > 1:
        x["g"], x["beta"] = torch.zeros(total, H, dtype=low), torch.zeros(total * n, H, dtype=low)
    else:
        x["g"] = torch.zeros(total, H, dim, dtype=torch.float32)
        x["beta"] = torch.zeros(total, H, *((dim,) if gating == "gdn2" else ()), dtype=low)
    if gating == "gdn2":
        x["w"] = torch.zeros(total, H, dim, dtype=low)
    cu = torch.arange(0, total * n + 1, seq * n, dtype=torch.int32)
    return x, cu


def _saved(gating, config, x, n):
    """The checkpoints and saved factors a training step's forward writes and its backward
    reads (the torch ops' saved_buffers: 16-bit checkpoints in the inputs' dtype), or None
    where the family's saving graph does not list the config (configs.serves)."""
    import torch

    from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks
    from cudnn_pygraph.engines.linear_attention.kernels.configs import forms_scores, serves
    from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors

    per_key = gating in ("kda", "gdn2")
    if not serves(config, gate_per_key=per_key, saves_factors=True):
        return None
    total, dim = x["q"].shape[0], x["q"].shape[2]
    factors = saved_factors(total, H, dim, dim, x["v"].dtype, gate_per_key=per_key,
                            beta_per_key=gating == "gdn2", scores=forms_scores(config))  # fmt: skip
    saved = {name: torch.zeros(shape, dtype=dt) for name, (dt, shape) in factors.items()}
    ckpt = torch.zeros(max_chunks(total, n), H, dim, dim, dtype=x["v"].dtype)
    return ckpt, saved


def _run_case(gating, config, dtype, dim, what):
    """One launcher call (what: fwd, bwd, bwd-checkpoints, fwd-save, bwd-saved, summary,
    summary-bwd, chain-fwd, chain-bwd) with l2norm and initial / final state, as a training
    step makes it. fwd-save / bwd-saved: the pair a torch op runs under autograd (the
    forward writes the checkpoints and the saved factors, the backward reads them and
    recomputes nothing); a config the saving graph does not list has no such call."""
    import torch

    from cudnn_pygraph.engines.linear_attention.kernels import chain, gdn, summary
    from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks

    x, cu = _inputs(gating, dtype, dim)
    total, n = x["k"].shape[0], cu.numel() - 1
    per_key, w = gating in ("kda", "gdn2"), x.get("w")
    gate = {"gate_per_key": per_key, "write_gate": w}
    state = lambda: torch.zeros(n, H, dim, dim)  # noqa: E731
    ws = torch.empty(256 << 20, dtype=torch.uint8)  # more than any case here carves (untouched)
    common = {"scale": dim**-0.5, "use_qk_l2norm": True, "workspace": ws, "config": config,
              "sub_tokens": sub_tokens(gating)}  # fmt: skip
    grads = {f"d{k}": torch.empty_like(v) for k, v in x.items() if k != "w"}
    out = lambda: torch.empty_like(x["q"])  # noqa: E731 - O and dO: q's rows, v's heads
    if what == "fwd":
        gdn.gdn_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, o=out(),
                        initial_state=state(), final_state=state(), **gate, **common)  # fmt: skip
    elif what in ("fwd-save", "bwd-saved"):
        kept = _saved(gating, config, x, n)
        if kept is None:
            return
        ckpt, saved = kept
        if what == "fwd-save":
            gdn.gdn_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu,
                            o=out(), initial_state=state(),
                            final_state=state(), checkpoints=ckpt, saved=saved, **gate,
                            **common)  # fmt: skip
        else:
            gdn.gdn_backward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu,
                             out(), initial_state=state(),
                             d_final_state=state(), d_initial_state=state(), checkpoints=ckpt,
                             saved=saved, dwrite_gate=torch.empty_like(w) if w is not None
                             else None, **grads, **gate, **common)  # fmt: skip
    elif what in ("bwd", "bwd-checkpoints"):
        ckpt = torch.zeros(max_chunks(total, n), H, dim, dim) if what != "bwd" else None
        gdn.gdn_backward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, out(),
                         initial_state=state(), d_final_state=state(), d_initial_state=state(),
                         checkpoints=ckpt, dwrite_gate=torch.empty_like(w) if w is not None
                         else None, **grads, **gate, **common)  # fmt: skip
    elif what == "summary":
        common.pop("scale")
        summary.gdn_summary(x["k"], x["v"], x["g"], x["beta"], cu, h_out=state(),
                            m_out=state(), **gate, **common)  # fmt: skip
    elif what == "summary-bwd":
        summary.gdn_summary_bwd(x["q"], x["k"], x["g"], x["beta"], cu, out(),
                                g_out=state(), transition=state(), gate_per_key=per_key,
                                beta_per_key=w is not None, **common)  # fmt: skip
    elif what == "chain-fwd":
        chain.chain_forward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, pieces=2,
                            o=out(), initial_state=state(),
                            final_state=state(), **gate, **common)  # fmt: skip
    elif what == "chain-bwd":
        chain.chain_backward(x["q"], x["k"], x["v"], x["g"], x["beta"], cu,
                             out(), pieces=2, initial_state=state(),
                             d_final_state=state(), d_initial_state=state(),
                             dwrite_gate=torch.empty_like(w) if w is not None else None,
                             **grads, **gate, **common)  # fmt: skip
    else:
        raise ValueError(f"unknown case {what!r}")


CALLS = (
    "fwd", "bwd", "bwd-checkpoints", "fwd-save", "bwd-saved", "summary", "summary-bwd",
    "chain-fwd", "chain-bwd",
)  # fmt: skip


def cases(quick=False, fp32=False):
    """(gating, config, dtype name, K = V, call) of every case the table compiles: each
    family's gating under every named config at every served head dim in bf16 (what
    training runs), the summaries and the chain under the configs (they launch the same
    stages); fp32 adds fp32 calls (the accuracy reference, where the state walks drop
    pipeline stages), which the committed table leaves out: compiling them doubles the
    tool's time."""
    from cudnn_pygraph.engines.linear_attention.kernels.configs import (
        CONFIG_NAMES,
        SUPPORTED_HEAD_DIMS,
    )

    dtypes = ("bf16", "fp32") if fp32 else ("bf16",)
    dims = (128,) if quick else SUPPORTED_HEAD_DIMS
    for dtype in dtypes:
        for dim in dims:
            for gating in GATINGS:
                for config in CONFIG_NAMES:
                    for call in calls_of(gating):
                        yield gating, config, dtype, dim, call


def collect(quick=False, fp32=False, log=print):
    """Compile every case; returns the Recorder and the seconds it took."""
    # Before our kernels are decorated: compile, not interpret. An explicit false, not an
    # unset variable: on a machine without a GPU the package turns an unset one on
    # (planning/device.py interpreter_chosen).
    os.environ["TRITON_INTERPRET"] = "0"
    import torch

    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    recorder = Recorder()
    undo = _compile_only(recorder)
    t0 = time.perf_counter()
    try:
        for gating, config, dtype, dim, call in cases(quick, fp32):
            recorder.case = (gating, config, dtype, dim, call)
            t1 = time.perf_counter()
            try:
                _run_case(gating, config, dtypes[dtype], dim, call)
            except Exception as err:  # noqa: BLE001 - a case that does not compile is a row
                recorder.failed.append(f"{gating} {config} {dtype} K=V={dim} {call}: "
                                       f"{type(err).__name__}: {str(err)[:200]}")  # fmt: skip
            log(f"{gating:8} {config:13} {dtype} {dim:3} {call:16} "
                f"{time.perf_counter() - t1:6.1f} s", file=sys.stderr)  # fmt: skip
    finally:
        undo()
    return recorder, time.perf_counter() - t0


def _span(values):
    return ", ".join(str(v) for v in sorted(set(values), key=str))


def render(recorder, seconds, quick=False) -> str:
    import triton

    from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES

    t0 = time.perf_counter()
    lines = []
    for row in recorder.rows.values():
        regs, stores, loads = _ptxas_facts(row["ptx"])
        uses = row["uses"]
        calls = _span(u[4] for u in uses)
        gatings = [g for g in GATINGS if any(u[0] == g for u in uses)]
        configs = [c for c in CONFIG_NAMES if any(u[1] == c for u in uses)]
        per_sm = min(
            228 * 1024 // max(row["shared"], 1), SM_REGISTERS // (regs * 32 * row["warps"])
        )
        note = f" (from s{_span(row['reduced'])}: shared memory)" if row["reduced"] else ""
        lines.append((
            row["kernel"], row["program"] + note, " ".join(gatings), " ".join(configs),
            _span(u[2] for u in uses), _span(u[3] for u in uses), calls, regs, stores, loads,
            row["shared"], per_sm, row["refills"],
        ))  # fmt: skip
    ptxas_s = time.perf_counter() - t0
    lines.sort(key=lambda r: (r[0], r[4], r[5], r[1], r[2]))
    out = [
        "# Linear-attention kernels: registers, spills, shared memory (sm_90, no GPU)",
        "",
        f"Generated by `python3 tools/la_resources.py{' --quick' if quick else ''}`: every "
        "shipped config (kernels/configs.py) of every launcher (gdn / gdp, kda, gdn2 forward, "
        "backward with and without checkpoints, the training pair that saves the factors and "
        "reads them, summaries, chain of 2 pieces) compiled for "
        f"sm_90 on a CPU: bf16 calls (`--fp32` adds fp32 calls, not in this table), l2norm "
        f"and initial / final state on, H = {H}; triton {triton.__version__}, ptxas -v "
        f"sm_{ARCH}a. {len(lines)} distinct programs; compiling took {seconds:.0f} s (Triton's "
        f"own cache may have held some), ptxas -v {ptxas_s:.0f} s.",
        "One row per distinct compiled program; `used by` lists the launcher calls that build it. "
        "`per SM`: programs that fit on one SM by shared memory (228 KB) and registers (64K). "
        "`refilled while read`: tensor-core products the loop's prefetch overwrites while "
        "they read (refilled_while_read; the gate wants none). "
        f"A program over {MAX_SHARED} bytes of shared memory is retried with one stage fewer "
        "by the launcher (kernels/gdn.py launch_within_shared_memory), as on the GPU.",
        "",
        f"{DIGEST_LINE}{digest()}",
        "",
        "| kernel | program | family | configs | dtype | K=V | used by | regs | spill stores "
        "| spill loads | smem bytes | per SM | refilled while read |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in lines]
    if recorder.failed:
        out += [""] + [f"FAILED: {f}" for f in recorder.failed]
    spilling = [r for r in lines if r[8] or r[9]]
    out += ["", f"Programs that spill: {len(spilling)} of {len(lines)}."]
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="check the committed table only")
    parser.add_argument("--quick", action="store_true", help="bf16, K = V = 128; print only")
    parser.add_argument("--fp32", action="store_true", help="fp32 calls too; print only")
    parser.add_argument("--out", default=str(TABLE), help="where the table goes")
    args = parser.parse_args(argv)
    if args.check:
        found = problems(parse_table(pathlib.Path(args.out).read_text()), digest(), ALLOWED_SPILLS)
        print("\n".join(found) or "the table is current; no program spills past its allowance")
        return 1 if found else 0
    sys.path.insert(0, str(ROOT / "src"))
    recorder, seconds = collect(args.quick, args.fp32)
    text = render(recorder, seconds, args.quick)
    if args.quick or args.fp32:
        print(text)
    else:
        pathlib.Path(args.out).write_text(text)
        print(f"wrote {args.out}: {len(recorder.rows)} programs, {seconds:.0f} s compiling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
