"""A complete python engine in one file: a Triton swish (y = x * sigmoid(x)) for a
one-node pointwise graph, with a tuning axis, a heuristics hook, and a manifest row
injected through manifest.use_families — the same path production engines and the tests
take (there is no registration call).

Run it:  PYTHONPATH=src python examples/one_file_engine.py
Without a GPU the kernel runs under the Triton interpreter on the CPU (TRITON_INTERPRET=1
must be set before triton is imported; this file does that first).

Read top to bottom: the kernel, the knobs, the engine (check_support -> build_plan ->
execute), the heuristics hook, the manifest row, and main() planning a graph with it.
docs/writing-an-engine.md explains each step.
"""

import dataclasses
import os

from cudnn_pygraph.planning.device import detect_device

if detect_device() is None:  # no GPU: the interpreter, chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import cudnn_pygraph as cudnn  # noqa: E402
from cudnn_pygraph.planning import manifest  # noqa: E402
from cudnn_pygraph.planning.engine import (  # noqa: E402
    BaseEngine,
    Capabilities,
    CompiledPlan,
    PlanConfig,
    require_module,
)
from cudnn_pygraph.planning.facts import graph_device  # noqa: E402
from cudnn_pygraph.planning.heuristics import BACKEND  # noqa: E402

SERVED = (cudnn.data_type.HALF, cudnn.data_type.FLOAT)
# A family index far from the shipped ones (0..6): ids 20_000 + 90 * 100 + slot.
EXAMPLE_FAMILY_INDEX = 90


# ---------------------------------------------------------------- the kernel
def _kernel():
    """Imported lazily: deciding whether we COULD serve a graph must not import Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def swish_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        y = x / (1.0 + tl.exp(-x))
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

    return swish_kernel


# ---------------------------------------------------------------- knobs
@dataclasses.dataclass(frozen=True)
class SwishKnobs:
    """Performance-only: every value computes the same function."""

    block: int = 1024
    num_warps: int = 4


BLOCKS = (1024, 256, 4096)  # the domain of the one tuning axis, default first


# ---------------------------------------------------------------- the engine
class TritonSwishEngine(BaseEngine):
    name = "example_triton_swish"
    capabilities = Capabilities(sm_lo=70, dtypes=frozenset(SERVED))
    # Triton's BLOCK is a tile of the flattened output: TILE_M in the one knob vocabulary.
    KNOB_FIELDS = {cudnn.knob_type.TILE_M: "block", cudnn.knob_type.NUM_WARPS: "num_warps"}
    knob_class = SwishKnobs

    def check_support(self, graph):
        """Decide everything the declaration decides; decline by raising, naming the rule."""
        require_module("triton", self.name)
        nodes = graph.nodes
        if len(nodes) != 1 or nodes[0].op != "swish":
            raise NotImplementedError("serves a graph of exactly one swish node")
        x, y = nodes[0].inputs["input"], nodes[0].outputs["output"]
        if tuple(x.dim) != tuple(y.dim):
            raise NotImplementedError(
                f"input dims {list(x.dim)} differ from output dims {list(y.dim)}"
            )
        for port, t in (("input", x), ("output", y)):
            if tuple(t.stride) != _dense(t.dim):
                raise NotImplementedError(f"{port}: stride {list(t.stride)} is not dense row-major")
        self.capabilities.require(
            graph_device(graph), dtypes=[("input", x.data_type), ("output", y.data_type)]
        )

    def build_plan(self, graph, plan, ctx):
        """Build EXACTLY the config plan.knobs names; settle every per-call fact here."""
        node = graph.nodes[0]
        x, y = node.inputs["input"], node.outputs["output"]
        return SwishPlan(_kernel(), plan.knobs, x.uid, y.uid, _numel(x.dim))


class SwishPlan(CompiledPlan):
    workspace_size = 0

    def __init__(self, kernel, knobs, x_uid, y_uid, n):
        self.kernel, self.knobs, self.n = kernel, knobs, n
        self.uids = (x_uid, y_uid)
        self.grid = (-(-n // knobs.block),)
        self.positions = None  # resolved once, on the first pack (positions are stable)

    def execute(self, graph, pack, ctx):
        import torch

        if self.positions is None:
            self.positions = [pack.index_of(u) for u in self.uids]
        for i, name in zip(self.positions, ("input", "output")):
            pack.check_extent(i, name)  # a buffer smaller than declared: refused, nothing launched
        x_buf, y_buf = pack.operands(self.positions)
        x, y = torch.from_dlpack(x_buf), torch.from_dlpack(y_buf)  # zero-copy views
        self.kernel[self.grid](x, y, self.n, BLOCK=self.knobs.block, num_warps=self.knobs.num_warps)


def _dense(dim):
    strides, acc = [], 1
    for d in reversed(dim):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _numel(dim):
    n = 1
    for d in dim:
        n *= d
    return n


# ---------------------------------------------------------------- who goes first
def recommend(kind, facts, offered):
    """Complete configs from facts alone, the default first: an autotuner times them all.
    Nothing here has been measured against the backend, so ours lead (the historical
    order) and the BACKEND marker puts the backend's block behind them."""
    ours = [PlanConfig(eid, SwishKnobs(block=b)) for eid in offered for b in BLOCKS]
    if kind is cudnn.heur_mode.FALLBACK:
        return ours[:1] + [BACKEND]
    return ours + ([] if kind is cudnn.heur_mode.OPENSOURCE else [BACKEND])


# ---------------------------------------------------------------- the manifest row
EXAMPLE_FAMILY = manifest.EngineFamily(
    "example_swish",
    index=EXAMPLE_FAMILY_INDEX,
    anchors=("swish",),
    slots=(manifest.EngineSlot(0, TritonSwishEngine.name, __name__, "TritonSwishEngine"),),
    heuristics=(__name__, "recommend"),
)


def with_example_family():
    """The shipped table plus this family: `with with_example_family(): ...`."""
    return manifest.use_families(manifest.FAMILIES + (EXAMPLE_FAMILY,))


def swish_graph(shape=(4, 1000), dtype=cudnn.data_type.HALF):
    g = cudnn.pygraph(
        name="example_swish", io_data_type=dtype, compute_data_type=cudnn.data_type.FLOAT
    )
    x = g.tensor(list(shape), name="x")
    y = g.swish(x)
    y.set_output(True).set_data_type(dtype)
    return g, x, y


def main():
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with with_example_family():
        g, x, y = swish_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        print(g.explain())
        g.build_plans()
        xs = torch.randn(x.dim, device=device).half()
        ys = torch.full(y.dim, float("nan"), device=device).half()  # poisoned
        g.execute({x: xs, y: ys})
        ref = torch.nn.functional.silu(xs.double())
        err = float(torch.linalg.vector_norm(ys.double() - ref) / torch.linalg.vector_norm(ref))
        print(f"ran {g.get_plan_name_at_index(g.selected_plan)}: ||out-ref||/||ref|| = {err:.2e}")
    return err


if __name__ == "__main__":
    main()
