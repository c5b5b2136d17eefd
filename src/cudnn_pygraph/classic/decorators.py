"""The classic graph-building decorators: `graph()` opens a graph, `graph_cache(key_fn)`
memoizes a builder, `jit(heur_modes)` builds what the builder returns.

The usual stack (FlashInfer's cuDNN paths are written this way):

    @cudnn.jit(heur_modes=[cudnn.heur_mode.A])
    @cudnn.graph_cache(key_fn=lambda *a, **k: shapes_of(*a, **k))
    def build(handle, ...):
        with cudnn.graph(handle) as (g, _):
            q = g.tensor(...)
            ...
            return g, [q, k, v, o]

`build(...)` returns `(graph, [uid, ...])`; a second call with the same key returns the
same built graph and uids without planning again."""

from __future__ import annotations  # annotations stay text: no typing import

import contextlib
import functools

from .._types import GraphStateError, data_type, heur_mode

TYPE_CHECKING = False  # true for type checkers only: importing typing is not needed
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterator, Sequence

    from .._typing import DataTypeLike, FuncT, HandleLike
    from ..graph.tensor import Tensor
    from ..pygraph import pygraph

    # A builder jit() decorates returns (graph, tensors); the decorated call (graph, uids).
    BuildFn = Callable[..., tuple[pygraph, Sequence[Tensor]]]
    BuiltFn = Callable[..., tuple[pygraph, list[int]]]


def graph_cache(key_fn: Callable[..., Hashable], maxsize: int = 256) -> Callable[[FuncT], FuncT]:
    """Memoize a builder on `key_fn(*args, **kwargs)`: a hit returns the cached result,
    a miss builds and stores it; past `maxsize` entries the oldest one is dropped."""

    def decorator(func):
        cache = {}

        @functools.wraps(func)
        def cached(*args, **kwargs):
            key = key_fn(*args, **kwargs)
            if key in cache:
                return cache[key]
            result = func(*args, **kwargs)
            if len(cache) >= maxsize:
                cache.pop(next(iter(cache)))
            cache[key] = result
            return result

        return cached

    return decorator


def jit(
    heur_modes: heur_mode | int | list[heur_mode | int] | tuple[heur_mode | int, ...] = heur_mode.A,
    **kwargs: object,
) -> Callable[[BuildFn], BuiltFn]:
    """Build the graph a builder returns: the builder returns `(graph, tensors)`; the
    decorated call plans and builds the graph with `heur_modes` (one mode or a list)
    unless it already has plans (a graph_cache hit), and returns `(graph, uids)`.
    Extra keywords are accepted and unused, as classically."""
    modes = list(heur_modes) if isinstance(heur_modes, (list, tuple)) else [heur_modes]

    def decorator(func):
        @functools.wraps(func)
        def built(*args, **kw):
            g, tensors = func(*args, **kw)
            if not has_plans(g):
                g.build(modes)
            return g, [t.get_uid() for t in tensors]

        return built

    return decorator


def has_plans(g: pygraph) -> bool:
    """True once `g` was planned (a graph_cache hit). An unplanned graph has no plans:
    our pygraph says so with GraphStateError where the classic one answers 0."""
    try:
        return g.get_execution_plan_count() > 0
    except GraphStateError:
        return False


@contextlib.contextmanager
def graph(
    handle: HandleLike | None,
    name: str = "cudnn_graph",
    io_data_type: DataTypeLike = data_type.HALF,
    intermediate_data_type: DataTypeLike = data_type.FLOAT,
    compute_data_type: DataTypeLike = data_type.FLOAT,
    **graph_kwargs: object,
) -> Iterator[tuple[pygraph, list[Tensor]]]:
    """A new `pygraph` bound to `handle`, yielded as `(graph, [])`; keywords beyond the
    data types go to the pygraph constructor. Nothing happens at the block's exit: the
    caller (or `jit`) plans and builds."""
    from ..pygraph import pygraph

    g = pygraph(
        name=name,
        io_data_type=io_data_type,
        intermediate_data_type=intermediate_data_type,
        compute_data_type=compute_data_type,
        handle=handle,
        **graph_kwargs,
    )
    yield g, []
