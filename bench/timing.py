"""The bench harness's one clock: every figure a bench script reports comes from here.

Three measurements, one statistic: each is the MEDIAN over its repeats (never the min, never
a mean), so two tables of the project read the same way.

  device_ms        a call's device time in ms, by CUDA events with the host's launch time
                   kept out (below)
  back_to_back_ms  ms per call of a burst issued back to back from a drained queue, end to
                   end: host and device overlapping, as a serving or training loop runs
  host_us          the host's own µs per call (a burst by the wall, the queue drained before
                   it and not waited for inside it): what our Python and the launch cost

device_kernels_ms splits a call's device time by kernel (torch.profiler, each call profiled
alone, the same median); kernel_table is that profile as a table to read, not a figure.
And `Stopwatch`, the wall clock for what happens once (a cold start, a budget, a progress
line), never repeated into a statistic. tests/test_bench_harness.py fails on any other
timer in bench/.

device_ms: each repetition first queues a GPU sleep long enough for the host to enqueue the
whole call behind it, so the start event fires with the call's kernels already queued and
the pair of events measures the device alone. Without it, a call whose host side is slower
than its kernels (fla's forward: ~8 Triton launches through the JIT, ~50 us each on the
H200's host) is timed as host latency (bench/results/gdn.md has the runs that were).
A call that synchronizes with the host inside (a .item(), a .tolist()) still waits out the
sleep and is then timed with its host latency; such a call is named in the table's notes.

torch is imported where a measurement needs it, so the host-only scripts and the CPU smoke
test import this module without touching CUDA.
"""

from __future__ import annotations

import statistics
import time

# The one statistic of every figure (see the module docstring).
STATISTIC = statistics.median

# ~5 ms at the H200's 1.98 GHz: more than any measured host enqueue of one call.
SLEEP_CYCLES = 10_000_000


def device_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median over `reps` of one call's device time in ms (see the module docstring)."""
    import torch

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
    return STATISTIC([s.elapsed_time(e) for s, e in pairs])


def back_to_back_ms(fn, calls: int = 50, warmup: int = 3) -> float:
    """ms per call of `calls` calls issued back to back from a drained queue, the median of
    5 bursts: the measurement autotune ranks plans by (planning/autotune.back_to_back_ms).
    Host and device overlap as in a serving loop, so it reads the device rate when the host
    keeps up and the host's when it does not (what `device_ms` keeps out)."""
    import torch

    from cudnn_pygraph.planning import autotune

    times = autotune.back_to_back_ms(
        lambda _: fn(), warmup, 5, burst=calls, drain=torch.cuda.synchronize
    )
    return STATISTIC(times)


def host_us(fn, calls: int = 1, reps: int = 25, warmup: int = 10, drain=None) -> float:
    """The host's µs per call: the median over `reps` bursts of `calls` calls, each burst by
    the wall divided by `calls`. `drain` (torch.cuda.synchronize on the GPU, None for work
    that never queues any) empties the queue before each burst, outside the clock, and is
    not waited for inside it: the figure is what issuing costs, not what running costs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        if drain is not None:
            drain()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    if drain is not None:
        drain()
    return STATISTIC(samples)


class Stopwatch:
    """Wall seconds since it was made: for what happens once, a cold start, a run's budget,
    a progress line; a repeated figure is one of the three above."""

    def __init__(self):
        self._t0 = time.perf_counter()

    @property
    def s(self) -> float:
        return time.perf_counter() - self._t0

    @property
    def ms(self) -> float:
        return self.s * 1e3

    def over(self, budget_s: float) -> bool:
        return self.s > budget_s


def _profiled(fn, reps, warm=True):
    import torch

    if warm:
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages()


def kernel_table(fn, reps: int = 5) -> str:
    """Per-kernel device time of `reps` calls after one warm call (torch.profiler's table,
    heaviest kernel first): where a call's time goes, to read, not a figure to report."""
    return _profiled(fn, reps).table(sort_by="device_time_total", row_limit=20)


def device_kernels_ms(fn, reps: int = 5, per_launch: bool = False) -> dict:
    """{kernel name: device ms per call} of every kernel the call ran (torch's own and
    copies included), the median over `reps` calls each profiled alone after a warm one;
    `per_launch`: ms per launch of the kernel instead (a call may launch one several times)."""
    samples = {}
    for rep in range(reps):
        for event in _profiled(fn, 1, warm=rep == 0):
            # torch >= 2.4 names it device_time_total (0 for a host-only event); older
            # torch only has cuda_time_total
            total = getattr(event, "device_time_total", None)
            if total is None:
                total = event.cuda_time_total
            if total:
                ms = total / 1000 / (event.count if per_launch else 1)
                samples.setdefault(event.key, [0.0] * reps)[rep] = ms
    return {name: STATISTIC(ms) for name, ms in samples.items()}


def launch_sites(fn, pattern: str) -> dict:
    """{kernel name: {call site: device ms}} of one call (after a warm one), for the kernels
    whose name matches `pattern` (a regular expression): the innermost cudnn_pygraph frame
    of the host op that launched each (torch's copies and elementwise kernels carry no name
    of ours; this says which line of ours asked for them)."""
    import re

    import torch

    fn()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    # verbose: torch 2.11 attaches the Python stack to each op event only in this mode
    config = torch._C._profiler._ExperimentalConfig(verbose=True)
    with torch.profiler.profile(
        activities=activities, with_stack=True, experimental_config=config
    ) as prof:
        fn()
        torch.cuda.synchronize()
    sites = {}
    for event in prof.events():
        for kernel in getattr(event, "kernels", ()):
            if not re.search(pattern, kernel.name):
                continue
            ours = [f for f in (event.stack or ()) if "cudnn_pygraph" in f]
            site = ours[0] if ours else f"{event.name} (no frame of ours)"
            by_site = sites.setdefault(kernel.name, {})
            by_site[site] = by_site.get(site, 0.0) + kernel.duration / 1000
    return sites


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
