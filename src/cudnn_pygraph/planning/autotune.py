"""Autotune: build every plan in the graph's list, time each, select the fastest, and
remember the choice as (engine_id, knobs) in a persistent cache, so that a later process
planning the same declaration on the same device replays it without timing anything.

  graph.autotune(variant_pack, workspace, handle, warmup=, reps=, ...)
      -> AutotuneResult (selected index, engine_id, public knobs, per-plan medians,
         from_cache, the placement shard)

What is timed is what a serving loop pays: `back_to_back_ms`, the time per call of a burst
issued back to back from a drained queue, host and device together (a plan whose host side
is slower than its kernels is timed at its host rate). The same function is the benches'
(bench/sdpa_host.py), so a placement measured there is the figure autotune ranks by. Each
result names its shard -- the family's placement cell for the graph (EngineFamily.shard:
the cell the family hook places the backend by, e.g. "paged page_size=64") -- and the cache
entry records it beside every plan's time.

The cache follows the compiled-plan cache's safety rules (spec: "The compiled-plan
cache"):
  * identity is hashed whole: the graph's declaration (its IR JSON form), the device
    (name, compute capability, SM count), the package version and a digest of every .py
    in the package (an edited checkout does not move the version), the backend, torch
    and triton versions. An unreadable field hashes as "unknown", it is never skipped;
  * an entry is reused only under its own embedded key, compared field by field on load;
  * it is written through a temp file + os.replace, so a crash or a concurrent writer
    never leaves a loadable half-entry;
  * anything doubtful (missing, malformed, a key that differs, a recorded plan that is no
    longer in the list) is a MISS, never an error.
Location: CUDNN_PYGRAPH_AUTOTUNE_CACHE, else $XDG_CACHE_HOME/cudnn_pygraph/autotune
(~/.cache when XDG_CACHE_HOME is unset); CUDNN_PYGRAPH_DISABLE_AUTOTUNE_CACHE=1 turns it
off (every call times, nothing is read or written). A write retires the oldest dead
environment directories beyond CUDNN_PYGRAPH_AUTOTUNE_CACHE_MAX_ENVS (32).
"""

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import shutil
import statistics
import tempfile
import time

from .._log import log, progress
from .._types import GraphStateError, cudnnGraphNotSupportedError, knob_type
from ..runtime.compiled_cache import cache_home, source_digest
from ..runtime.compiled_cache import dist_version as _dist_version
from .engine import DECLINE_ERRORS
from .planner import planned

CACHE_ENV = "CUDNN_PYGRAPH_AUTOTUNE_CACHE"
DISABLE_ENV = "CUDNN_PYGRAPH_DISABLE_AUTOTUNE_CACHE"
MAX_ENVS_ENV = "CUDNN_PYGRAPH_AUTOTUNE_CACHE_MAX_ENVS"
_SCHEMA = "v1"  # bump on any incompatible change of the entry format or the key


@dataclasses.dataclass
class PlanTiming:
    index: int
    name: str
    median_ms: float | None  # None: the plan did not build or run here
    reason: str = ""  # why it has no time
    # what the call raised once the plan built (a refusal of the buffers, or a failure while
    # running), kept to re-raise a refusal that every built plan shares once
    error: Exception | None = dataclasses.field(default=None, repr=False, compare=False)


@dataclasses.dataclass
class AutotuneResult:
    index: int  # the selected position in graph.plans
    engine_id: int
    knobs: dict[knob_type, int]  # the public form create_execution_plan replays
    plan_name: str
    from_cache: bool  # True: replayed from the cache, nothing was timed
    timings: list[PlanTiming]  # empty on a cache hit
    cache_path: str | None  # the entry read or written; None with the cache off
    shard: str = ""  # "<family>/<cell>": the placement cell the timings speak for

    def first_listed_gap(self) -> float | None:
        """How much slower the plan list's FIRST runnable plan ran than the fastest one
        (0.0 when it is the fastest; None on a cache hit): what "the plan ranked first is
        within 3% of the fastest listed plan" reads."""
        timed = [t for t in self.timings if t.median_ms is not None]
        if not timed:
            return None
        first = min(timed, key=lambda t: t.index)
        best = min(t.median_ms for t in timed)
        return first.median_ms / best - 1.0 if best > 0 else 0.0

    def table(self) -> str:
        """The timings as aligned text, fastest first (what the CLI prints)."""
        if self.from_cache:
            return f"cache hit: #{self.index} {self.plan_name} (nothing timed)"
        rows = sorted(self.timings, key=lambda t: (t.median_ms is None, t.median_ms or 0.0))
        lines = []
        for t in rows:
            mark = "*" if t.index == self.index else " "
            cost = f"{t.median_ms:10.4f} ms" if t.median_ms is not None else f"  -- {t.reason}"
            lines.append(f" {mark}#{t.index} {t.name:<48} {cost}")
        return "\n".join(lines)


# ---------------------------------------------------------------- clocks
# Calls per timed burst: enough that one drain per burst costs little per call, few enough
# that a plan of a few ms is timed in well under a second.
BURST = 16


def back_to_back_ms(call, warmup, reps, *, burst=BURST, clock=time.perf_counter, drain=None):
    """End-to-end ms per call, one figure per rep: each rep drains the queue (`drain`, e.g.
    torch.cuda.synchronize; None on the CPU), reads `clock` (seconds), issues `burst` calls
    back to back, drains again and reads the clock. A plan whose host side outruns its
    kernels is timed at the device rate, one whose kernels outrun the host at the host
    rate: either way what a caller issuing it back to back pays per call (spec: "a number
    flat in the burst size is host-bound; one that climbs with it is the device rate").
    `call(i)` runs the plan once on rotation copy i (i counts through every call)."""
    n = 0
    for _ in range(warmup):
        call(n)
        n += 1
    out = []
    for _ in range(reps):
        if drain is not None:
            drain()
        t0 = clock()
        for _ in range(burst):
            call(n)
            n += 1
        if drain is not None:
            drain()
        out.append((clock() - t0) * 1e3 / burst)
    return out


def cuda_event_times(fn, warmup, reps, stream=None):
    """Per-call device times in ms from CUDA events, each rep between its own pair of
    events, from a drained queue. `stream` (a raw cudaStream_t int) is where the plans
    run when the caller's handle carries one; None is the current stream."""
    import torch

    ctx = (
        torch.cuda.stream(torch.cuda.ExternalStream(stream)) if stream else contextlib.nullcontext()
    )
    with ctx:
        for _ in range(warmup):
            fn(0)
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            starts[i].record()
            fn(i)
            ends[i].record()
        torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def default_timer(device, handle=None):
    """`back_to_back_ms`, draining the device (every stream, the handle's included) when the
    graph is planned for a GPU that torch can see; else on the CPU's clock alone (the
    Triton interpreter and CPU stand-ins)."""
    if device is not None and not device.is_interpreter:
        try:
            import torch

            if torch.cuda.is_available():
                return functools.partial(back_to_back_ms, drain=torch.cuda.synchronize)
        except ImportError:
            pass
    return back_to_back_ms


def shard_of(graph):
    """ "<family>/<cell>": the placement cell of a planned graph, read by the family's shard
    rule (EngineFamily.shard) from the same facts its hook ranked by; "<family>/" when the
    family names no cells, "" for a graph no family serves."""
    record = planned(graph)
    family = record.family if record is not None else None
    if family is None:
        return ""
    cell = ""
    if family.shard is not None:
        from . import facts, manifest

        cell = str(manifest.resolve(family.shard)(facts.family_facts(graph, family)))
    return f"{family.name}/{cell}"


# ---------------------------------------------------------------- rotating inputs
def rotated_packs(variant_pack, l2_bytes, max_copies=8):
    """Copies of the pack whose tensors are distinct allocations, so that consecutive
    reps do not read what the previous one left in L2. Only when the whole pack fits in
    L2 (a bigger one evicts itself) and every buffer can be cloned (torch tensors); else
    the caller's pack alone."""
    objs = list(variant_pack.values())
    if (
        l2_bytes <= 0
        or not objs
        or not all(hasattr(o, "clone") and hasattr(o, "nbytes") for o in objs)
    ):
        return [variant_pack]
    total = sum(int(o.nbytes) for o in objs)
    if total == 0 or total > l2_bytes:
        return [variant_pack]
    copies = min(max_copies, -(-2 * l2_bytes // total))  # enough to cycle through 2x L2
    return [variant_pack] + [
        {k: v.clone() for k, v in variant_pack.items()} for _ in range(copies - 1)
    ]


# ---------------------------------------------------------------- the key
def environment_key(device):
    """Everything but the graph: the device and the software that planned and built."""
    from .._version import __version__

    dev = (
        {
            "name": device.name,
            "cc": [device.major, device.minor],
            "sm_count": device.sm_count,
            "interpreter": device.is_interpreter,
        }
        if device is not None
        else "unknown"
    )
    return {
        "device": dev,
        "package": __version__,
        "sources": source_digest(),
        "backend": _dist_version("nvidia-cudnn-frontend"),
        "torch": _dist_version("torch"),
        "triton": _dist_version("triton"),
    }


def graph_digest(graph):
    """A stable digest of the graph's declaration (its IR JSON form, keys sorted)."""
    doc = json.dumps(graph.to_json(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


def _digest(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------- the cache
def cache_enabled():
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


def cache_root():
    given = os.environ.get(CACHE_ENV)
    return pathlib.Path(given) if given else cache_home() / "autotune"


def entry_path(key):
    """<root>/v1/<environment digest>/<graph digest>.json"""
    return cache_root() / _SCHEMA / _digest(key["environment"])[:24] / f"{key['graph']}.json"


# This process's cache traffic: hits, misses (no entry), invalid (an entry that was there
# but doubtful: unreadable, another key, a plan no longer listed), bypassed (cache off),
# written, pruned (environment directories retired).
_STATS = dict.fromkeys(("hits", "misses", "invalid", "bypassed", "written", "pruned"), 0)


def stats():
    """A copy of this process's cache counters."""
    return dict(_STATS)


def load_entry(key):
    """The recorded choice for `key`, or None (anything doubtful is a miss)."""
    path = entry_path(key)
    if not path.exists():
        return None
    try:
        entry = json.loads(path.read_text())
        if entry.get("key") != key:
            return None
        engine_id = int(entry["engine_id"])
        knobs = {knob_type[name]: int(v) for name, v in entry["knobs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return engine_id, knobs, path


def store_entry(key, engine_id, knobs, plan_name, timings, shard=""):
    """Write through a temp file in the same directory + os.replace (atomic on POSIX):
    a reader sees the old entry or the whole new one. A failure to write is not an
    error: the choice is still made in this process."""
    path = entry_path(key)
    entry = {
        "key": key,
        "engine_id": int(engine_id),
        "knobs": {knob_type(k).name: int(v) for k, v in knobs.items()},
        "plan_name": plan_name,
        "shard": shard,
        "timings_ms": {t.name: t.median_ms for t in timings},
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return None
    _STATS["written"] += 1
    _STATS["pruned"] += prune(keep=path.parent)
    return path


def prune(keep, max_environments=None):
    """Retire dead environments: every source edit and every release mints a new
    environment directory that is never hit again. Whole environment directories go,
    oldest first, beyond CUDNN_PYGRAPH_AUTOTUNE_CACHE_MAX_ENVS (32 by default); `keep`
    (this process's own) never does. Returns how many went; never raises."""
    if max_environments is None:
        try:
            max_environments = int(os.environ.get(MAX_ENVS_ENV, "32"))
        except ValueError:
            max_environments = 32
    try:
        envs = [d for d in (cache_root() / _SCHEMA).iterdir() if d.is_dir() and d != keep]
        envs.sort(key=lambda d: d.stat().st_mtime)
    except OSError:
        return 0
    doomed = envs[: max(0, len(envs) + 1 - max_environments)]
    for d in doomed:
        shutil.rmtree(d, ignore_errors=True)
    return len(doomed)


def list_entries():
    """Every readable entry under the root: (path, entry dict). Unreadable files are
    listed with entry None (what --show prints as 'unreadable')."""
    root = cache_root() / _SCHEMA
    out = []
    if not root.is_dir():
        return out
    for path in sorted(root.glob("*/*.json")):
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            out.append((path, None))
    return out


def clear():
    """Remove this schema's entries (the whole <root>/v1 tree); returns how many entry
    files went. Nothing outside the cache root is touched."""
    root = cache_root() / _SCHEMA
    if not root.is_dir():
        return 0
    count = len(list(root.glob("*/*.json")))
    shutil.rmtree(root, ignore_errors=True)
    return count


# ---------------------------------------------------------------- autotune
def _find_plan(graph, engine_id, knobs):
    for i in range(graph.get_execution_plan_count()):
        if graph.get_engine_and_knobs_at_index(i) == (engine_id, knobs):
            return i
    return None


def _buffer_nbytes(obj):
    n = getattr(obj, "nbytes", None)
    return int(n) if n is not None else None


def _workspace_for(needed, given, pack):
    """The caller's workspace when it is big enough (or none is needed); else a torch
    allocation on the pack's device; else None with the reason."""
    if needed <= 0:
        return given, ""
    have = _buffer_nbytes(given) if given is not None else 0
    if given is not None and (have is None or have >= needed):
        return given, ""
    try:
        import torch

        device = next((o.device for o in pack.values() if hasattr(o, "device")), "cpu")
        return torch.empty(needed, dtype=torch.uint8, device=device), ""
    except ImportError:
        return None, f"needs {needed} workspace bytes (caller gave {have})"


def autotune(
    graph,
    variant_pack,
    workspace=None,
    handle=None,
    *,
    warmup=3,
    reps=10,
    rotate_inputs=True,
    use_cache=True,
    timer=None,
):
    """Time every plan of a planned graph on the caller's buffers and select the fastest.

    warmup, reps: calls before timing, timed calls per plan (the median counts);
    rotate_inputs: time over distinct copies of the pack when it fits in L2 (GPU);
    use_cache: read and write the persistent cache (also off under
        CUDNN_PYGRAPH_DISABLE_AUTOTUNE_CACHE=1);
    timer: fn(call, warmup, reps) -> [ms per call, one per rep]; default
        `back_to_back_ms` (end to end, host and device). `call(i)` runs the plan once on
        rotation copy i.

    A plan that does not build or run here is skipped with its reason; none runs ->
    cudnnGraphNotSupportedError listing every reason. Returns an AutotuneResult and leaves
    the chosen plan selected (pinned) and built, ready for graph.execute()."""
    if warmup < 0 or reps < 1:
        raise ValueError(f"autotune(): warmup must be >= 0 and reps >= 1 (got {warmup}, {reps})")
    record = planned(graph)
    if record is None:
        raise GraphStateError("autotune(): call create_execution_plans() first")
    from .facts import graph_device

    device = graph_device(graph)
    use_cache = use_cache and cache_enabled()
    key = (
        {"graph": graph_digest(graph), "environment": environment_key(device)}
        if use_cache
        else None
    )

    if use_cache:
        hit = load_entry(key)
        if hit is not None:
            engine_id, knobs, path = hit
            index = _find_plan(graph, engine_id, knobs)
            if index is not None and _select_built(graph, record, index):
                _STATS["hits"] += 1
                log.info(
                    "autotune graph '%s': cache hit, #%d %s (%s)",
                    graph.name,
                    index,
                    graph.get_plan_name_at_index(index),
                    path,
                )
                return AutotuneResult(
                    index,
                    engine_id,
                    knobs,
                    graph.get_plan_name_at_index(index),
                    True,
                    [],
                    str(path),
                    shard_of(graph),
                )
        outcome = "invalid" if entry_path(key).exists() else "misses"
        _STATS[outcome] += 1
        log.info(
            "autotune graph '%s': cache %s, timing every plan",
            graph.name,
            "entry doubtful (a miss)" if outcome == "invalid" else "miss",
        )
    else:
        _STATS["bypassed"] += 1
        log.info("autotune graph '%s': cache off, timing every plan", graph.name)

    timer = timer or default_timer(device, handle)
    packs = (
        rotated_packs(variant_pack, device.l2_bytes if device else 0)
        if rotate_inputs
        else [variant_pack]
    )
    timings = []
    count = graph.get_execution_plan_count()
    with progress(f"autotune graph '{graph.name}' ({count} plans)"):
        for index in range(count):
            t = _time_plan(graph, record, index, packs, workspace, handle, timer, warmup, reps)
            timings.append(t)
            outcome = f"{t.median_ms:.4f} ms" if t.median_ms is not None else f"skipped: {t.reason}"
            log.info(
                "autotune graph '%s': %d/%d #%d %s %s",
                graph.name,
                index + 1,
                count,
                index,
                t.name,
                outcome,
            )
    timed = [t for t in timings if t.median_ms is not None]
    if not timed:
        _raise_callers_mistake(timings)
        raise cudnnGraphNotSupportedError(
            "autotune(): no plan runs here: "
            + "; ".join(f"#{t.index} {t.name}: {t.reason}" for t in timings)
        )
    best = min(timed, key=lambda t: (t.median_ms, t.index))  # ties keep the ranking's order
    _select_built(graph, record, best.index)
    engine_id, knobs = graph.get_engine_and_knobs_at_index(best.index)
    shard = shard_of(graph)
    path = store_entry(key, engine_id, knobs, best.name, timings, shard) if use_cache else None
    log.info(
        "autotune graph '%s': selected #%d %s (%.4f ms)%s",
        graph.name,
        best.index,
        best.name,
        best.median_ms,
        f", cached in {path}" if path else "",
    )
    return AutotuneResult(
        best.index, engine_id, knobs, best.name, False, timings, str(path) if path else None, shard
    )


def _raise_callers_mistake(timings):
    """Every plan that builds here refused the call with the same ValueError / TypeError:
    the buffers are wrong, not the plans (an output missing from the pack, a wrong shape).
    Say that once; a plan that does not build here has no say in it."""
    reached = [t for t in timings if t.error is not None]  # built, then called
    kinds = {(type(t.error), str(t.error)) for t in reached}
    error = reached[0].error if len(kinds) == 1 else None
    if isinstance(error, (ValueError, TypeError)):
        raise type(error)(
            f"autotune(): every plan that builds here refuses these buffers: {error}"
        ) from error


def _time_plan(graph, record, index, packs, workspace, handle, timer, warmup, reps):
    name = graph.get_plan_name_at_index(index)
    try:
        record.build_at(index)
        ws, why = _workspace_for(record.workspace_size_at(index), workspace, packs[0])
        if why:
            return PlanTiming(index, name, None, why)

        def call(i):
            graph.execute_plan_at_index(packs[i % len(packs)], ws, index, handle)

        call(0)  # a plan that refuses these buffers is skipped before it is timed
        times = timer(call, warmup, reps)
    except DECLINE_ERRORS as exc:
        return PlanTiming(index, name, None, str(exc) or type(exc).__name__)
    except (ValueError, TypeError) as exc:  # refused at execute: maybe the caller's buffers
        return PlanTiming(index, name, None, f"{type(exc).__name__}: {exc}", exc)
    except RuntimeError as exc:  # failed while running: it took the buffers
        return PlanTiming(index, name, None, f"{type(exc).__name__}: {exc}", exc)
    return PlanTiming(index, name, statistics.median(times))


def _select_built(graph, record, index):
    """Pin `index` and build it (the graph is then ready to execute); False when it no
    longer builds here (a cache entry that went stale is a miss)."""
    try:
        record.select(index)
        record.build_plans()
    except DECLINE_ERRORS:
        return False
    return True


__all__ = [
    "CACHE_ENV",
    "DISABLE_ENV",
    "MAX_ENVS_ENV",
    "AutotuneResult",
    "PlanTiming",
    "autotune",
    "back_to_back_ms",
    "cache_root",
    "clear",
    "cuda_event_times",
    "default_timer",
    "environment_key",
    "graph_digest",
    "list_entries",
    "prune",
    "source_digest",
    "stats",
    "shard_of",
]
