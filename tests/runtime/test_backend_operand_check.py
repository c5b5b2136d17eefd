"""A backend plan reads each operand through its pointer alone, as the graph declares it.
Every buffer it would misread is refused before the backend is called, naming the operand
and the rule, on both of its execute paths: the C hot path (RawExecutor, from make_call)
and the general path (BackendPlan.execute: handles, workspaces, overrides).

Runs without a GPU: the backend is a recorder standing in for _execute_with_raw_ptrs, so
a refusal is visible as "the recorder was never called". The CUDA buffers are
__cuda_array_interface__ producers over addresses nobody dereferences; a buffer on another
device is an OperandBuffer the pack described on device 1.
"""

import types

import numpy as np
import pytest
import torch

import cudnn_pygraph as cudnn
from cudnn_pygraph._types import CLASSIC_ERRORS
from cudnn_pygraph.backend.backend_plans import BackendPlan
from cudnn_pygraph.runtime.execute import ExecutionContext, GraphLayout
from cudnn_pygraph.runtime.variant_pack import DeclaredLayout, VariantPack

pytestmark = pytest.mark.both_variant_packs  # native and pure-Python (conftest)

HALF = cudnn.data_type.HALF
DEVICE = 0
BASE = {"A": 0x10000, "B": 0x20000, "C": 0x30000}
# The declaration: A [1, 16, 8] @ B [1, 8, 4] -> C [1, 16, 4], half, row-major.
DECLARED = {"A": ((1, 16, 8), (128, 8, 1)), "B": ((1, 8, 4), (32, 4, 1)),
            "C": ((1, 16, 4), (64, 4, 1))}  # fmt: skip


def matmul_graph():
    g = cudnn.pygraph(io_data_type=HALF)
    a = g.tensor([1, 16, 8], name="A")
    b = g.tensor([1, 8, 4], name="B")
    c = g.matmul(a, b)
    c.set_output(True).set_name("C")
    return g, {"A": a, "B": b, "C": c}


class Cuda:
    """A CUDA buffer seen from the CPU: shape, typestr, strides in ELEMENTS (None: dense)."""

    def __init__(self, address, shape, typestr="<f2", strides=None, readonly=False):
        item = int(typestr[2:])
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (address, readonly),
            "strides": None if strides is None else tuple(s * item for s in strides),
            "version": 3,
        }


class DLPackOn:
    """A DLPack producer that names its device (the exchange an OperandBuffer does)."""

    def __init__(self, buffer):
        self.buffer = buffer

    def __dlpack__(self, **kwargs):
        return self.buffer.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.buffer.__dlpack_device__()


def on_device(device_id, address, shape, strides):
    """A buffer on CUDA device `device_id`, as a DLPack producer that says so."""
    layout = DeclaredLayout([(1, shape, strides, int(HALF), 16)])
    pack = VariantPack.from_objects(
        layout, [Cuda(address, shape, strides=strides)], device_id=device_id
    )
    return DLPackOn(pack.operands([0])[0])


class Harness:
    """A built backend plan over a recorder, and its two execute paths."""

    def __init__(self):
        self.graph, self.tensors = matmul_graph()
        self.calls = []
        lowered = types.SimpleNamespace(
            backend=types.SimpleNamespace(_execute_with_raw_ptrs=self._raw), fe=None
        )
        self.layout = GraphLayout(self.graph)
        self.plan = BackendPlan(lowered, 0, 0, len(self.layout.tensors), DEVICE)
        self.plan._default_bh = 0xBEEF  # the per-device handle needs a GPU: given here
        bound = types.SimpleNamespace(
            graph=self.graph, layout=self.layout, is_current=lambda: True, general=self.general
        )
        self.hot = self.plan.make_call(bound)

    def _raw(self, address, n, workspace, handle, index):
        import ctypes

        self.calls.append(list((ctypes.c_void_p * n).from_address(address)))

    def general(self, bindings):
        pack = self.layout.pack(bindings)
        self.plan.execute(self.graph, pack, ExecutionContext(0xBEEF, None, None, None))

    def bind(self, name, obj):
        """The well-formed pack with `name` rebound to `obj`, keyed by the graph's tensors."""
        bindings = {t: Cuda(BASE[n], DECLARED[n][0]) for n, t in self.tensors.items()}
        bindings[self.tensors[name]] = obj
        return bindings


def hostile(name):
    """(id, factory) rows: each binds something the backend would misread to `name`."""
    (shape, strides), at = DECLARED[name], BASE[name]
    numel = int(np.prod(shape))
    rows = [
        ("too-small-by-one", lambda: Cuda(at, (numel - 1,))),
        ("too-small-by-half", lambda: Cuda(at, (shape[0], shape[1] // 2, shape[2]))),
        ("empty", lambda: Cuda(at, (0,))),
        ("float32-declared-extents", lambda: Cuda(at, shape, "<f4")),
        ("int8-declared-extents", lambda: Cuda(at, shape, "|i1")),
        ("float64-declared-extents", lambda: Cuda(at, shape, "<f8")),
        ("transposed", lambda: Cuda(at, shape, strides=(strides[0], 1, shape[1]))),
        ("broadcast", lambda: Cuda(at, shape, strides=(strides[0], 0, 1))),
        ("padded-rows", lambda: Cuda(at, shape, strides=(2 * strides[0], 2 * shape[2], 1))),
        ("negative-stride", lambda: Cuda(at + 2 * numel, shape, strides=(strides[0], -shape[2], 1))),
        ("strided-other-extents", lambda: Cuda(at, (shape[1], 2 * shape[2]), strides=(4 * shape[2], 2))),
        ("cpu-torch", lambda: torch.zeros(shape, dtype=torch.float16)),
        ("cpu-numpy", lambda: np.zeros(shape, np.float16)),
        ("other-device", lambda: on_device(1, at, shape, strides)),
        ("overflowing-extents", lambda: Cuda(at, (2**62, 4), strides=(2**62, 1))),
    ]  # fmt: skip
    return [(f"{name}-{kind}", make) for kind, make in rows]


ROWS = hostile("A") + hostile("B") + hostile("C") + [
    ("C-read-only", lambda: Cuda(BASE["C"], DECLARED["C"][0], readonly=True)),
    ("C-read-only-numpy", lambda: np.frombuffer(bytes(128), np.float16).reshape(1, 16, 4)),
    ("A-bool", lambda: True),
    ("A-null-address", lambda: 0),
    ("A-negative-address", lambda: -4096),
    ("A-not-an-operand", lambda: "0x1000"),
]  # fmt: skip


@pytest.fixture
def harness():
    return Harness()


def test_well_formed_buffers_reach_the_backend_on_both_paths(harness):
    """The control: what the rows below change is the only reason they are refused."""
    for call in (harness.hot, harness.general):
        call(harness.bind("A", Cuda(BASE["A"], DECLARED["A"][0])))
    assert harness.calls == [[BASE["A"], BASE["B"], BASE["C"]]] * 2


@pytest.mark.parametrize(
    "bound",
    [
        ("bare-address", lambda: BASE["A"]),
        ("numpy-int64-address", lambda: np.int64(BASE["A"])),
        ("dense-2d-cover", lambda: Cuda(BASE["A"], (16, 8))),  # FlashInfer's [m, k] -> [1, m, k]
        ("flat-byte-blob", lambda: Cuda(BASE["A"], (256,), "|u1")),
        ("same-width-int16-read-as-half", lambda: Cuda(BASE["A"], (1, 16, 8), "<i2")),
        ("extent-1-axis-any-stride", lambda: Cuda(BASE["A"], (1, 16, 8), strides=(7, 8, 1))),
        ("read-only-input", lambda: Cuda(BASE["A"], (1, 16, 8), readonly=True)),
    ],
    ids=lambda b: b[0],
)
def test_what_the_pack_rule_reads_as_declared_is_served(harness, bound):
    """The spec's rule: a bare address lends the declaration, a dense cover is described
    from the graph, a same-width dtype is read as the declared one: the backend reads
    these exactly as declared, so they go through."""
    for call in (harness.hot, harness.general):
        call(harness.bind("A", bound[1]()))
    assert [c[0] for c in harness.calls] == [BASE["A"]] * 2


@pytest.mark.parametrize("path", ["hot", "general"])
@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_a_buffer_the_backend_would_misread_is_refused_before_any_call(harness, row, path):
    row_id, make = row
    name = row_id.split("-")[0]
    call = harness.hot if path == "hot" else harness.general
    with pytest.raises(CLASSIC_ERRORS) as caught:
        call(harness.bind(name, make()))
    assert f"'{name}'" in str(caught.value), "the refusal names the operand"
    assert harness.calls == [], "nothing reached the backend"


def test_the_rule_is_named(harness):
    cases = {
        "cpu-torch": ("A", torch.zeros(1, 16, 8, dtype=torch.float16), "rule: device"),
        "float32": ("B", Cuda(BASE["B"], (1, 8, 4), "<f4"), "rule: dtype"),
        "transposed": ("A", Cuda(BASE["A"], (1, 16, 8), strides=(128, 1, 16)), "rule: layout"),
        "small": ("C", Cuda(BASE["C"], (1, 8, 4)), "spans 64 bytes and the declaration reads 128"),
        "read-only": ("C", Cuda(BASE["C"], (1, 16, 4), readonly=True), "read-only"),
    }
    for name, obj, rule in cases.values():
        with pytest.raises(CLASSIC_ERRORS, match=rule):
            harness.hot(harness.bind(name, obj))
    assert harness.calls == []


def test_a_cuda_array_interface_names_no_ordinal_so_its_device_is_the_callers_word():
    """__cuda_array_interface__ says CUDA but not which device: like a bare address, the
    pack takes the caller's device_id for it, and the device check compares the type only;
    a DLPack producer names its ordinal, and another one is refused."""
    layout = DeclaredLayout([(1, (1, 16, 8), (128, 8, 1), int(HALF), 16)], names=["A"])
    VariantPack.from_objects(layout, [Cuda(0x1000, (1, 16, 8))]).check_declared(2, 1)
    named = on_device(0, 0x1000, (1, 16, 8), (128, 8, 1))
    with pytest.raises(ValueError, match="on cuda:0 and this plan runs on cuda:1"):
        VariantPack.from_objects(layout, [named]).check_declared(2, 1)


def test_a_layout_without_a_declaration_checks_only_the_device():
    """A deserialized backend graph has no IR: its slots are placeholders, so any CUDA
    buffer is the caller's word; a CPU buffer is still refused."""
    layout = DeclaredLayout([(5, (1,), (1,), int(cudnn.data_type.UINT8), 8)], described=False)
    strided = Cuda(0x1000, (4, 4), "<f4", strides=(8, 2))
    VariantPack.from_objects(layout, [strided]).check_declared(2, 0)
    with pytest.raises(ValueError, match="rule: device"):
        VariantPack.from_objects(layout, [torch.zeros(4)]).check_declared(2, 0)


# ---------------------------------------------------------------- pass-by-value and ragged
def _declared(host=(), ragged=()):
    # slot 0: a [1, 1, 1, 1] float scalar; slot 1: a [2, 4, 8, 16] half q (padded THD)
    return DeclaredLayout(
        [(1, (1, 1, 1, 1), (1, 1, 1, 1), int(cudnn.data_type.FLOAT), 32),
         (2, (2, 4, 8, 16), (512, 16, 64, 1), int(HALF), 16)],
        names=["eps", "q"], host=host, ragged=ragged,
    )  # fmt: skip


def test_a_pass_by_value_scalar_is_read_from_host_memory():
    # NVIDIA's norm samples bind epsilon as a CPU tensor: the backend copies the value from
    # the host when the plan runs, so host memory is right there and device memory wrong.
    q = Cuda(BASE["A"], (2, 4, 8, 16), strides=(512, 16, 64, 1))
    host_eps = np.full((1, 1, 1, 1), 1e-5, dtype=np.float32)
    VariantPack.from_mapping(_declared(host=[0]), {1: host_eps, 2: q}).check_declared(2, 0)
    device_eps = Cuda(BASE["B"], (1, 1, 1, 1), typestr="<f4")
    pack = VariantPack.from_mapping(_declared(host=[0]), {1: device_eps, 2: q})
    with pytest.raises(ValueError, match=r"'eps'.*rule: host"):
        pack.check_declared(2, 0)
    # without the mark, a host buffer on a CUDA plan is the device rule's refusal
    pack = VariantPack.from_mapping(_declared(), {1: host_eps, 2: q})
    with pytest.raises(ValueError, match=r"'eps'.*rule: device"):
        pack.check_declared(2, 0)


def test_a_ragged_operand_may_be_the_packed_rows_under_a_padded_declaration():
    # FlashInfer binds a packed [tokens, h, d] buffer to a padded [b, h, s, d] declaration
    # whose ragged offset says where each sequence starts.
    eps = np.full((1, 1, 1, 1), 1e-5, dtype=np.float32)
    packed = Cuda(BASE["A"], (11, 4, 16))
    VariantPack.from_mapping(_declared(host=[0], ragged=[1]), {1: eps, 2: packed}).check_declared(
        2, 0
    )
    pack = VariantPack.from_mapping(_declared(host=[0]), {1: eps, 2: packed})
    with pytest.raises(ValueError, match=r"'q'"):
        pack.check_declared(2, 0)  # not ragged: the declared extent is read


def test_a_boolean_tensor_is_the_bit_packed_bytes_the_backend_writes():
    # NVIDIA's relu-bitmask sample binds a uint8 [N, C // 8] buffer to a BOOLEAN [N, C]
    # output: the backend stores booleans eight to a byte, so only the device is checked.
    layout = DeclaredLayout([(1, (4, 64), (64, 1), int(cudnn.data_type.BOOLEAN), 8)], names=["m"])
    VariantPack.from_mapping(layout, {1: Cuda(BASE["A"], (4, 8), typestr="<u1")}).check_declared(
        2, 0
    )
    on_host = np.zeros((4, 8), dtype=np.uint8)
    with pytest.raises(ValueError, match="'m'.*rule: device"):
        VariantPack.from_mapping(layout, {1: on_host}).check_declared(2, 0)


# ---------------------------------------------------------------- buffers the classic accepts
def _channels_last(shape):
    n, c, h, w = shape
    return (c * h * w, 1, c * w, c)


@pytest.mark.parametrize(
    "dtype, declared, buffer",
    [
        # a wgrad's DW (64, 32, 3, 3) bound to a (4, 32, 32, 32) allocation, channels-last
        (cudnn.data_type.HALF, (64, 32, 3, 3), (4, 32, 32, 32)),
        # an int8 conv's identity output (2, 4, 32, 32) bound to (2, 64, 32, 32)
        (cudnn.data_type.INT8, (2, 4, 32, 32), (2, 64, 32, 32)),
    ],
    ids=["wgrad-dw-half", "identity-out-int8"],
)
def test_a_larger_compact_buffer_is_read_for_its_declared_extent(dtype, declared, buffer):
    # The classic reads the declared extent from the pointer; a compact buffer (no gap, any
    # axis order) of at least those bytes holds it: accepted, described from the graph.
    bits = 16 if dtype == cudnn.data_type.HALF else 8
    typestr = "<f2" if bits == 16 else "|i1"
    layout = DeclaredLayout(
        [(1, declared, _channels_last(declared), int(dtype), bits)], names=["y"], written=[0]
    )
    big = Cuda(BASE["C"], buffer, typestr, strides=_channels_last(buffer))
    pack = VariantPack.from_objects(layout, [big])
    pack.check_declared(2, 0)
    assert pack.graph_described == {1}
    # what would reach past the buffer stays refused: fewer bytes, or a gapped view
    small = Cuda(BASE["C"], (1,) + declared[1:], typestr, strides=_channels_last(declared))
    gapped = Cuda(BASE["C"], buffer, typestr, strides=tuple(2 * s for s in _channels_last(buffer)))
    for refused in (small, gapped):
        with pytest.raises(ValueError, match="'y'"):
            VariantPack.from_objects(layout, [refused]).check_declared(2, 0)


def test_a_same_size_dtype_is_read_as_declared_with_one_warning(recwarn):
    # NVIDIA's ragged SDPA declared BFLOAT16 k / v, executed with float16 buffers: the
    # classic reads the bytes as bf16. Accepted, said once per dtype pair.
    bf16 = cudnn.data_type.BFLOAT16
    layout = DeclaredLayout(
        [(2, (2, 4, 8, 16), (512, 16, 64, 1), int(bf16), 16)], names=["k"], ragged=[0]
    )
    packed = Cuda(BASE["A"], (11, 4, 16))  # float16 rows
    for _ in range(2):
        VariantPack.from_mapping(layout, {2: packed}).check_declared(2, 0)
    said = [w for w in recwarn if "rule: dtype" in str(w.message)]
    assert len(said) == 1 and "'k'" in str(said[0].message)
    wider = Cuda(BASE["A"], (5, 4, 16), "<f4")  # fewer bytes than declared: its own dtype
    with pytest.raises(ValueError, match="'k'.*rule: dtype"):
        VariantPack.from_mapping(layout, {2: wider}).check_declared(2, 0)
