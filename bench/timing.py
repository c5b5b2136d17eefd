"""Kernel time by CUDA events, with the host's launch time kept out of the figure.

Each repetition first queues a GPU sleep long enough for the host to enqueue the whole call
behind it, so the start event fires with the call's kernels already queued and the pair of
events measures the device alone. Without it, a call whose host side is slower than its
kernels (fla's forward: ~8 Triton launches through the JIT, ~50 us each on the H200's host)
is timed as host latency: bench/gdn.py's runs 1-6 timed fla's forward of row (a) at
2.1-2.4 ms that way, against the 0.924 ms BRIEF.md records for the same shape.
A call that synchronizes with the host inside (a .item(), a .tolist()) still waits out the
sleep and is then timed with its host latency; such a call is named in the table's notes.
"""

from __future__ import annotations

import statistics

import torch

# ~5 ms at the H200's 1.98 GHz: more than any measured host enqueue of one call.
SLEEP_CYCLES = 10_000_000


def device_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median over `reps` of one call's device time in ms (see the module docstring)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
        torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs)


def back_to_back_ms(fn, calls: int = 50, warmup: int = 3) -> float:
    """ms per call of `calls` calls issued back to back from a drained queue, the median of
    5 bursts: the measurement autotune ranks plans by (planning/autotune.back_to_back_ms).
    Host and device overlap as in a serving loop, so it reads the device rate when the host
    keeps up and the host's when it does not (what `device_ms` keeps out)."""
    from cudnn_pygraph.planning import autotune

    times = autotune.back_to_back_ms(
        lambda _: fn(), warmup, 5, burst=calls, drain=torch.cuda.synchronize
    )
    return statistics.median(times)


def _profiled(fn, reps):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages()


def kernel_table(fn, reps: int = 5) -> str:
    """Per-kernel device time of `reps` calls after one warm call (torch.profiler's table,
    heaviest kernel first): where a call's time goes, not a timing to report as one."""
    return _profiled(fn, reps).table(sort_by="cuda_time_total", row_limit=20)


def device_kernels_ms(fn, reps: int = 5) -> dict:
    """{kernel name: device ms per call} of the same profile, every kernel the call ran
    (torch's own and copies included)."""
    out = {}
    for event in _profiled(fn, reps):
        # torch >= 2.4 names it device_time_total (0 for a host-only event); older torch
        # only has cuda_time_total
        total = getattr(event, "device_time_total", None)
        if total is None:
            total = event.cuda_time_total
        if total:
            out[event.key] = total / 1000 / reps
    return out


def kernel_ms(fn, reps: int = 5) -> dict:
    """{kernel name: device ms per call} of the same profile, Triton kernels only."""
    return {
        name.removesuffix("_kernel"): ms
        for name, ms in device_kernels_ms(fn, reps).items()
        if name.endswith("_kernel")
    }


_CACHE_DIR = []


def use_compiled_cache(cache_dir) -> None:
    """Keep this process's compiles in `cache_dir` (None: the defaults), so a later run on a
    machine holding that directory times instead of compiling: our kernels in the project's
    compiled-plan cache (runtime/compiled_cache.py: the torch ops' plans compile there, and
    so does a launcher called directly inside `launcher_compiles`, as a config sweep
    calls it), Triton's own cache and its autotuning results (fla's kernels and the configs
    fla's autotuner picked) beside it. Call before the first kernel compiles."""
    import os

    if cache_dir is None:
        return
    cache_dir = os.path.abspath(cache_dir)
    os.makedirs(os.path.join(cache_dir, "triton"), mode=0o700, exist_ok=True)
    os.chmod(cache_dir, 0o700)  # the compiled-plan cache refuses a root others may write
    os.environ["CUDNN_PYGRAPH_COMPILED_CACHE"] = os.path.join(cache_dir, "plans")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
    os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
    _CACHE_DIR.append(cache_dir)


def launcher_compiles(owner, part):
    """A context for calling our launchers directly (not through a torch op's plan): with a
    cache directory in use, the first call of `part` by `owner` (a bench's problem object)
    compiles its kernels into the compiled-plan cache; later calls run bare (the kernels
    are loaded), so the routing costs no host time in what is timed. Never around a torch
    op's call (its plan build routes its own compiles)."""
    import contextlib

    done = owner.__dict__.setdefault("_compiled_parts", set())
    if not _CACHE_DIR or part in done:
        return contextlib.nullcontext()
    done.add(part)
    from cudnn_pygraph.runtime.launch_replay import cached_jit_compiles

    return cached_jit_compiles()
