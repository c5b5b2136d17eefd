"""Gated DeltaNet forward / forward+backward: our Triton kernels vs fla-core's
chunk_gated_delta_rule, side by side in one run (H200; bf16, H=HV=16, K=V=128, l2norm on).

Checks correctness first (our O and final state against fla's, and our gradients finite),
then times with CUDA events (median of REPS; each call queued behind a GPU sleep so that
the events time the kernels, not the host's launches: bench/timing.py) and prints a
Markdown table.

  PYTHONPATH=src python bench/gdn.py            # needs fla-core 0.6.0 importable
  PYTHONPATH=src python bench/gdn.py --no-fla --profile --only "(a)"
                                                # per-kernel CUDA time of ours (torch.profiler)
  PYTHONPATH=src python bench/gdn.py --no-fla --sweep --only "(a),(b)" [--entries few,wide]
                                                # every named config of kernels/configs.py
                                                # (a plan's KERNEL_CFG knob): time +
                                                # agreement; a new entry goes into that
                                                # table only with tests/gpu/test_gdn_gpu.py
  PYTHONPATH=src python bench/gdn.py --chain [--no-fla]
                                                # one sequence of 131072 tokens: the
                                                # chain of pieces (kernels/chain.py, the
                                                # SEQ_PIECES knob the hook picks) vs uncut
                                                # vs fla; goal chain >= 3x uncut forward
  PYTHONPATH=src python bench/gdn.py --saved [--only "(a)"] [--config wide-unfused]
                                                # the backward from the forward's saved
                                                # factors vs the recomputing one (before /
                                                # after), launchers and the torch op's
                                                # autograd; bytes kept per chunk and head
  PYTHONPATH=src python bench/gdn.py --host --only "(a)"
                                                # host us per forward call: torch op vs
                                                # launcher vs the bare launch sequence
                                                # (needs the built C extension)

fla compiles and autotunes every kernel on its first call (most of a 110-130 s step went to
it in the H200 runs): to reach every row, run one `--only` row per step.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys

import torch
from runner import first, select
from timing import device_ms, host_us, kernel_table, launcher_compiles, use_compiled_cache

from cudnn_pygraph.engines.linear_attention.kernels.chain import (
    chain_backward,
    chain_forward,
    chain_workspace_bytes,
)
from cudnn_pygraph.engines.linear_attention.kernels.chunk_index import max_chunks
from cudnn_pygraph.engines.linear_attention.kernels.gdn import (
    gdn_backward,
    gdn_forward,
    gdn_workspace_bytes,
)
from cudnn_pygraph.engines.linear_attention.kernels.gdn_workspace import saved_factors

H = 16
DIM = 128
REPS = 20
WARMUP = 3
REPS_HOST = 200


def make_inputs(seqlens, with_state):
    total = sum(seqlens)
    dev = "cuda"
    bf = torch.bfloat16
    x = {
        "q": torch.randn(total, H, DIM, device=dev, dtype=bf),
        "k": torch.randn(total, H, DIM, device=dev, dtype=bf),
        "v": torch.randn(total, H, DIM, device=dev, dtype=bf),
        "g": torch.nn.functional.logsigmoid(torch.randn(total, H, device=dev)).to(bf),
        "beta": torch.rand(total, H, device=dev).to(bf),
    }
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], device=dev, dtype=torch.int32)
    init = (0.1 * torch.randn(len(seqlens), H, DIM, DIM, device=dev)) if with_state else None
    return x, cu, init


def median_ms(fn):
    return device_ms(fn, reps=REPS, warmup=WARMUP)


class Ours:
    """Our launchers on one problem; `config` names a kernels/configs.py entry (None: the
    config the family hook would list first for this batch); `pieces` > 0 runs every
    sequence as a chain of that many pieces (kernels/chain.py; no checkpoints then)."""

    def __init__(self, x, cu, init, config=None, pieces=0):
        self.x, self.cu, self.init, self.config = x, cu, init, config
        self.pieces = pieces
        total, n = x["q"].shape[0], cu.numel() - 1
        size = (total, n, H, H, H, DIM, DIM, torch.bfloat16)
        fwd_ws = gdn_workspace_bytes(*size, backward=False)
        bwd_ws = max(gdn_workspace_bytes(*size, backward=True, has_checkpoints=True, saved=s)
                     for s in (False, True))  # fmt: skip
        bwd_ws = max(bwd_ws, gdn_workspace_bytes(*size, backward=True))
        if pieces:
            size = (total, n, pieces, H, H, H, DIM, DIM, torch.bfloat16)
            fwd_ws = chain_workspace_bytes(*size, backward=False)
            bwd_ws = chain_workspace_bytes(*size, backward=True)
        self.ws = torch.empty(max(fwd_ws, bwd_ws), dtype=torch.uint8, device="cuda")
        self.o = torch.empty_like(x["v"])
        self.final = torch.empty_like(init) if init is not None else None
        self.do = torch.randn_like(x["v"])
        self.grads = {n: torch.empty_like(t) for n, t in x.items()}
        self.dinit = torch.empty_like(init) if init is not None else None
        self.dfinal = torch.randn_like(init) if init is not None else None
        self.ckpt = torch.empty(max_chunks(total, n), H, DIM, DIM, device="cuda")
        self.use_ckpt = False
        # --saved: the bf16 checkpoints and the saved factors (kernels/gdn_workspace.py)
        self.ckpt16 = torch.empty(max_chunks(total, n), H, DIM, DIM, device="cuda",
                                  dtype=torch.bfloat16)  # fmt: skip
        self.saved = {
            name: torch.zeros(shape, dtype=dtype, device="cuda")
            for name, (dtype, shape) in saved_factors(total, H, DIM, DIM, torch.bfloat16).items()
        }
        self.use_saved = False

    def _ckpt(self):
        if self.use_saved:
            return self.ckpt16
        return self.ckpt if self.use_ckpt else None

    def _launchers(self):
        if self.pieces:
            return (
                functools.partial(chain_forward, pieces=self.pieces),
                functools.partial(chain_backward, pieces=self.pieces),
            )
        return gdn_forward, gdn_backward

    def forward(self):
        with launcher_compiles(self, "forward"):
            self._forward(self.x)

    def _forward(self, x):
        self._launchers()[0](
            x["q"],
            x["k"],
            x["v"],
            x["g"],
            x["beta"],
            self.cu,
            scale=DIM**-0.5,
            o=self.o,
            initial_state=self.init,
            final_state=self.final,
            use_qk_l2norm=True,
            workspace=self.ws,
            checkpoints=self._ckpt(),
            config=self.config,
            **({"saved": self.saved} if self.use_saved else {}),
        )

    def backward(self):
        with launcher_compiles(self, "backward"):
            self._backward(self.x, self.grads)

    def _backward(self, x, d):
        self._launchers()[1](
            x["q"],
            x["k"],
            x["v"],
            x["g"],
            x["beta"],
            self.cu,
            self.do,
            scale=DIM**-0.5,
            dq=d["q"],
            dk=d["k"],
            dv=d["v"],
            dg=d["g"],
            dbeta=d["beta"],
            initial_state=self.init,
            d_final_state=self.dfinal,
            d_initial_state=self.dinit,
            use_qk_l2norm=True,
            workspace=self.ws,
            checkpoints=self._ckpt(),
            config=self.config,
            **({"saved": self.saved} if self.use_saved else {}),
        )

    def forward_backward(self):
        self.forward()
        self.backward()

    def forward_backward_ckpt(self):
        """The forward saves the per-chunk states (checkpoint_every_n_tokens=64) and the
        backward reads them instead of recomputing the state recurrence."""
        self.use_ckpt = True
        try:
            self.forward()
            self.backward()
        finally:
            self.use_ckpt = False


def saved_rows(only, config=None):
    """Before / after of the backward that reads the forward's saved factors: our
    launchers' forward under `config` (None: the rule's pick; a name in kernels/configs.py:
    the saving forward's walk fused or not), plain and saving the bf16 checkpoints and the
    factors, forward +
    backward recomputing the WY stage and the state walk (before) and reading them (after),
    and the torch op a model calls (gated_delta_net under autograd: it saves and reads),
    with the gradients' largest relative difference between the two backwards and the
    bytes kept per chunk of 64 tokens and head."""
    from cudnn_pygraph.linear_attention.ops import gated_delta_net

    print("| shape | init/final state | fwd ms | fwd saving ms | fwd+bwd recompute ms (before) "
          "| fwd+bwd saved ms (after) | after / before | torch op fwd+bwd ms | saved MB "
          "| grads max rel diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for case in select("la", only):
        name, seqlens = case.name, case.params["seqlens"]
        for with_state in (False, True):
            torch.manual_seed(1)
            x, cu, init = make_inputs(seqlens, with_state)
            ours = Ours(x, cu, init, config)
            fwd = median_ms(ours.forward)
            before = median_ms(ours.forward_backward)
            base = [t.clone() for t in ours.grads.values()]
            ours.use_saved = True
            fwd_saving = median_ms(ours.forward)
            after = median_ms(ours.forward_backward)
            ours.use_saved = False
            diff = max_rel_diff(list(ours.grads.values()), base)
            mb = (ours.ckpt16.nbytes + sum(t.nbytes for t in ours.saved.values())) / 2**20
            leaves = [t.detach().clone().requires_grad_() for t in x.values()]
            h0 = init.transpose(-1, -2).contiguous().requires_grad_() if init is not None else None
            d_o = ours.do[None]

            def op():
                o, ht = gated_delta_net(*(t[None] for t in leaves), scale=DIM**-0.5,
                                        initial_state=h0, output_final_state=h0 is not None,
                                        cu_seqlens=cu, use_qk_l2norm_in_kernel=True)  # fmt: skip
                outs, grads = [o], [d_o]
                if ht is not None:
                    outs.append(ht)
                    grads.append(ours.dfinal.transpose(-1, -2))
                torch.autograd.backward(outs, grads)

            op_ms = median_ms(op)
            print(
                f"| {name} | {'yes' if with_state else 'no'} | {fwd:.3f} | {fwd_saving:.3f} | "
                f"{before:.3f} | {after:.3f} | {after / before:.2f}x | {op_ms:.3f} | "
                f"{mb:.0f} | {diff:.1e} |",
                flush=True,
            )
    # One chunk of 64 tokens and one head: each saved [T, H, X] tensor keeps 64 X elements.
    per_chunk = sum(t.element_size() * t.shape[-1] * 64 for t in ours.saved.values())
    per_chunk += ours.ckpt16.element_size() * DIM * DIM
    print(f"\nbytes kept per chunk of 64 tokens and head (K = V = {DIM}, bf16): "
          f"{per_chunk / 1024:.2f} KB")  # fmt: skip


def fla_forward(x, cu, init):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    h0 = init.transpose(-1, -2).contiguous() if init is not None else None  # fla: [N, H, K, V]
    o, ht = chunk_gated_delta_rule(
        x["q"][None],
        x["k"][None],
        x["v"][None],
        x["g"][None],
        x["beta"][None],
        scale=DIM**-0.5,
        initial_state=h0,
        output_final_state=init is not None,
        cu_seqlens=cu,  # int64, made once per row: fla caches its chunk indices by identity
        use_qk_l2norm_in_kernel=True,
    )
    return o[0], (ht.transpose(-1, -2) if ht is not None else None)


def fla_forward_backward(x, cu, init):
    leaves = {n: t.detach().requires_grad_() for n, t in x.items()}
    o, _ = fla_forward(leaves, cu, init)
    o.backward(torch.ones_like(o))


def profile_kernels(only):
    """Per-kernel CUDA time of our forward and backward (torch.profiler), one shape."""
    case = first("la", only)
    name, seqlens = case.name, case.params["seqlens"]
    x, cu, init = make_inputs(seqlens, with_state=False)
    ours = Ours(x, cu, init)
    print(f"{name}: 5 x (forward + backward)")
    print(kernel_table(ours.forward_backward))


def sweep_entries(x, cu, init, entries):
    """(label, Ours) for the config the hook picks for this batch and each named config of
    kernels/configs.py whose name holds one of `entries` (every one when None), selected by
    name as a plan's knob selects it. Every Ours gets the same dO and d_final (ones), so
    entries compare output for output."""
    from cudnn_pygraph.engines.linear_attention.kernels.configs import CONFIG_NAMES

    names = [None] + [n for n in CONFIG_NAMES if not entries or any(e in n for e in entries)]
    for name in names:
        ours = Ours(x, cu, init, config=name)
        ours.do = torch.ones_like(ours.do)
        ours.dfinal = torch.ones_like(ours.dfinal)
        yield name or "picked", ours


def max_rel_diff(outs, base) -> float:
    """The largest relative difference of paired tensors; NaN-aware, so a miscompiled
    config's NaN does not read as 0."""
    return max((rel(a, b) for a, b in zip(outs, base)), key=lambda d: (math.isnan(d), d))


def sweep_configs(only, entries=None):
    """Time our forward and forward+backward under each named config on the shapes whose name
    holds one of the comma-separated `only` substrings, with the largest relative difference
    of O and of every gradient from the picked config's."""
    for case in select("la", only):
        name, seqlens = case.name, case.params["seqlens"]
        torch.manual_seed(1)
        x, cu, init = make_inputs(seqlens, with_state=True)
        print(f"{name}: | config | fwd ms | fwd+bwd ms | max rel diff vs picked (O, grads) |")
        print("|---|---|---|---|")
        base = None
        for label, ours in sweep_entries(x, cu, init, entries):
            try:
                ours.forward_backward()
                outs = [ours.o.clone()] + [t.clone() for t in ours.grads.values()]
                base = base or outs
                diff = max_rel_diff(outs, base)
                fwd, fb = median_ms(ours.forward), median_ms(ours.forward_backward)
                print(f"| {label} | {fwd:.3f} | {fb:.3f} | {diff:.1e} |", flush=True)
            except Exception as err:  # noqa: BLE001 (a config that does not fit: report it)
                print(f"| {label} | failed: {str(err)[:80]} | | |", flush=True)


def host_time(only):
    """Host microseconds per forward call with a drained queue (synchronize before each
    call, the wall around the call alone: bench/timing.py host_us), median of REPS_HOST: the
    torch op (gated_delta_net: graph cache, then the plan's replay of its recorded launches), our
    launcher (gdn_forward with a given workspace: validation, carving, Triton's JIT per
    launch), the same kernels launched bare through the JIT (each recorded launch replayed
    with its recorded arguments), and launched raw (runtime/launch_replay.py over this
    call's buffers: Triton's C launcher alone, the floor)."""
    from cudnn_pygraph.linear_attention.ops import gated_delta_net
    from cudnn_pygraph.runtime.launch_replay import build_replay, record_launches

    case = first("la", only)
    name, seqlens = case.name, case.params["seqlens"]
    x, cu, init = make_inputs(seqlens, with_state=False)
    ours = Ours(x, cu, init)

    def op():
        gated_delta_net(
            x["q"][None], x["k"][None], x["v"][None], x["g"][None], x["beta"][None],
            scale=DIM**-0.5, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip

    with record_launches() as record:  # holds the JIT patch: not ours.forward's cache routing
        ours._forward(ours.x)
    roots = [(n, t) for n, t in x.items()] + [("cu", cu), ("o", ours.o), ("ws", ours.ws)]
    replay, reason = build_replay(record, roots, "bench")
    if replay is None:
        raise SystemExit(f"not replayable: {reason}")
    ptrs = tuple(t.data_ptr() for _, t in roots)
    stream = torch.cuda.current_stream().cuda_stream

    def bare():
        for kernel, grid, args, kwargs in record.jit_calls:
            kernel[grid](*args, **kwargs)

    def raw():
        replay(ptrs, stream)

    def us(fn):
        return host_us(fn, calls=1, reps=REPS_HOST, warmup=WARMUP, drain=torch.cuda.synchronize)

    o_launcher = ours.o.clone()
    ours.o.fill_(float("nan"))
    raw()
    torch.cuda.synchronize()
    assert torch.equal(ours.o, o_launcher), "raw replay differs from the launcher"
    op_us, launcher_us = us(op), us(ours.forward)
    bare_us, raw_us = us(bare), us(raw)
    print(f"{name}: host us per forward call (drained queue), {len(record.jit_calls)} launches")
    print("| torch op | launcher (gdn_forward) | bare JIT launches | raw launches (replay) "
          "| op / bare JIT | op / raw |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    print(
        f"| {op_us:.1f} | {launcher_us:.1f} | {bare_us:.1f} | {raw_us:.1f} | "
        f"{op_us / bare_us:.2f}x | {op_us / raw_us:.2f}x |"
    )


def chain_rows(no_fla):
    """One sequence of 131072 tokens, H16: a chain of one wave of pieces (SMs // H, the
    spec's count) vs the uncut run vs fla, forward and fwd+bwd; "hook picks" is what
    kernels/splitting.py chooses for this GPU (0: uncut), forward and backward."""
    from cudnn_pygraph.engines.linear_attention.kernels.splitting import (
        MAX_PIECES,
        choose_pieces,
    )

    case = first("la.chain")
    name, seqlens = case.name, case.params["seqlens"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pieces = min(sms // H, MAX_PIECES)
    rule = {"dim_v": DIM, "batch_invariant": False}
    picks = [choose_pieces(1, H, sum(seqlens), sms, backward=b, **rule) for b in (False, True)]
    torch.manual_seed(1)
    x, cu, init = make_inputs(seqlens, with_state=True)
    uncut, chain = Ours(x, cu, init), Ours(x, cu, init, pieces=pieces)
    chain.do, chain.dfinal = uncut.do, uncut.dfinal
    uncut.forward()
    chain.forward()
    check = f"O {rel(chain.o, uncut.o):.1e}, state {rel(chain.final, uncut.final):.1e}"
    uncut.backward()
    chain.backward()
    check += f", grads {max(rel(chain.grads[n], uncut.grads[n]) for n in x):.1e}"
    fwd = {"uncut": median_ms(uncut.forward), "chain": median_ms(chain.forward)}
    fb = {"uncut": median_ms(uncut.forward_backward), "chain": median_ms(chain.forward_backward)}
    fla_fwd = fla_fb = "-"
    if not no_fla:
        cu64 = cu.long()
        o_ref, _ = fla_forward(x, cu64, init)
        check += f"; chain O vs fla {rel(chain.o, o_ref):.1e}"
        fla_fwd = f"{median_ms(lambda: fla_forward(x, cu64, init)):.3f}"
        try:
            fla_fb = f"{median_ms(lambda: fla_forward_backward(x, cu64, init)):.3f}"
        except RuntimeError as err:  # fla's Hopper guard on Triton < 3.7.1
            print(f"fla backward: {str(err)[:160]}", file=sys.stderr)
            fla_fb = "refused"
    print(
        "| shape | pieces | hook picks (fwd, bwd) | uncut fwd ms | chain fwd ms | chain fwd speedup "
        "| fla fwd ms | uncut fwd+bwd ms | chain fwd+bwd ms | fla fwd+bwd ms | chain vs uncut |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {name} | {pieces} | {picks[0]}, {picks[1]} | {fwd['uncut']:.3f} | {fwd['chain']:.3f} | "
        f"{fwd['uncut'] / fwd['chain']:.2f}x | {fla_fwd} | {fb['uncut']:.3f} | "
        f"{fb['chain']:.3f} | {fla_fb} | {check} |",
        flush=True,
    )


def quick_fla_autotune():
    """fla autotunes each kernel on its first call (38-70 s per op, cold): every candidate
    config is compiled and timed by triton.testing.do_bench (25 ms warm-up + 100 ms of
    repetitions by default). Shorten the timing to 5 + 25 ms per candidate; the candidates
    and the choice rule stay fla's own."""
    import functools

    import triton.testing
    from triton.runtime import autotuner

    quick = functools.partial(triton.testing.do_bench, warmup=5, rep=25)
    autotuner.Autotuner.do_bench = property(lambda self: quick)


def compile_only_fla_autotune():
    """fla's autotuner compiling every candidate config and timing none: each candidate runs
    once (that compiles it into Triton's cache), the first is taken, and no pick is written
    to the autotuning cache. Several such processes side by side (one core each) fill
    Triton's cache, so that the process that then autotunes for real (quick_fla_autotune,
    alone on the GPU) spends its time timing candidates, not compiling them."""
    from triton.runtime import autotuner

    def run_once(kernel_call, quantiles):
        kernel_call()
        return [1.0] * len(quantiles)

    def no_pick_kept(self, tuning_key, configs, bench_fn):
        bench_fn()
        return False

    autotuner.Autotuner.do_bench = property(lambda self: run_once)
    autotuner.Autotuner.check_disk_cache = no_pick_kept


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-fla", action="store_true")
    parser.add_argument("--only", default=None, help="substring of a shape name")
    parser.add_argument("--profile", action="store_true", help="per-kernel times, then exit")
    parser.add_argument("--sweep", action="store_true", help="alternative configs, then exit")
    parser.add_argument("--host", action="store_true", help="host time per call, then exit")
    parser.add_argument("--entries", default=None, help="sweep: comma-separated label parts")
    parser.add_argument("--chain", action="store_true", help="chain vs uncut vs fla, then exit")
    parser.add_argument(
        "--cache-dir", default=None, help="keep compiles here (bench/timing.py use_compiled_cache)"
    )
    parser.add_argument("--saved", action="store_true", help="saved factors vs recompute")
    parser.add_argument(
        "--config", default=None, help="--saved: our launchers' config (kernels/configs.py)"
    )
    args = parser.parse_args()
    use_compiled_cache(args.cache_dir)
    if args.saved:
        saved_rows(args.only, args.config)
        return
    if args.chain:
        if not args.no_fla:
            quick_fla_autotune()
        chain_rows(args.no_fla)
        return
    if args.host:
        host_time(args.only)
        return
    if args.profile:
        profile_kernels(args.only)
        return
    if args.sweep:
        sweep_configs(args.only, args.entries.split(",") if args.entries else None)
        return
    if not args.no_fla:
        quick_fla_autotune()
    # Rows print as they complete (a partial run still leaves a table).
    print(
        "| shape | init/final state | ours fwd ms | ours fwd Mtok/s | fla fwd ms | fwd speedup "
        "vs fla | ours fwd+bwd ms | fwd+bwd / own fwd | fwd+bwd with checkpoints ms (/ own "
        "fwd) | fla fwd+bwd ms | check |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for case in select("la", args.only):
        name, seqlens = case.name, case.params["seqlens"]
        tokens = sum(seqlens)
        for with_state in (False, True):
            torch.manual_seed(1)
            x, cu, init = make_inputs(seqlens, with_state)
            ours = Ours(x, cu, init)
            ours.forward()
            check = ""
            fla_fwd_ms = fla_bwd = None
            if not args.no_fla:
                # fla derives its chunk indices with a host sync (.tolist()) and caches them
                # by the cu_seqlens tensor's identity: one int64 tensor per row keeps the
                # sync out of the timed calls (runs 1-7 passed a fresh cu.long() per call).
                cu = cu.long()
                o_ref, ht_ref = fla_forward(x, cu, init)
                check = f"O vs fla {rel(ours.o, o_ref):.1e}"
                if init is not None:
                    check += f", state {rel(ours.final, ht_ref):.1e}"
                fla_fwd_ms = median_ms(lambda x=x, cu=cu, init=init: fla_forward(x, cu, init))
                try:
                    fla_forward_backward(x, cu, init)
                    fla_bwd = median_ms(
                        lambda x=x, cu=cu, init=init: fla_forward_backward(x, cu, init)
                    )
                    fla_bwd = f"{fla_bwd:.3f}"
                except RuntimeError as err:
                    fla_bwd = "refused"
                    print(f"fla backward refused: {str(err)[:120]}", file=sys.stderr)
            fwd_ms = median_ms(ours.forward)
            try:
                ours.backward()
                finite = all(torch.isfinite(t).all().item() for t in ours.grads.values())
                check += "" if finite else ", NON-FINITE GRADS"
                fb_ms = median_ms(ours.forward_backward)
                ck_ms = median_ms(ours.forward_backward_ckpt)
            except Exception as err:  # noqa: BLE001 (any failure: report it, measure the rest)
                print(f"our backward failed: {err}", file=sys.stderr)
                fb_ms = ck_ms = float("nan")
            ff_s = f"{fla_fwd_ms:.3f}" if fla_fwd_ms is not None else "-"
            speedup = f"{fla_fwd_ms / fwd_ms:.2f}x" if fla_fwd_ms is not None else "-"
            print(
                f"| {name} | {'yes' if with_state else 'no'} | {fwd_ms:.3f} | "
                f"{tokens / fwd_ms / 1e3:.1f} | {ff_s} | {speedup} | {fb_ms:.3f} | "
                f"{fb_ms / fwd_ms:.2f}x | {ck_ms:.3f} ({ck_ms / fwd_ms:.2f}x) | "
                f"{fla_bwd or '-'} | {check} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
