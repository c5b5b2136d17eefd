"""The launch closure and its checker, on CPU: a stand-in for Triton's compiled kernel records
what the closure would launch, so the arg_plan and the rules are tested without a GPU."""

import pytest

from cudnn_pygraph.engines.gemm.kernels.chain import step
from cudnn_pygraph.engines.gemm.kernels.knobs import GemmKnobs
from cudnn_pygraph.engines.gemm.kernels.launch import _lower, kernel_signature
from cudnn_pygraph.engines.gemm.kernels.matmul import gemm_kernel
from cudnn_pygraph.engines.gemm.kernels.spec import GemmSpec

KNOBS = GemmKnobs(128, 256, 64, 3, 8, 8)
NUM_SMS = 132


class _Recorder:
    """Stands in for Triton's CompiledKernel: `run.launch` records its arguments."""

    def __init__(self):
        self.calls = []
        self.function = 0xF00
        self.packed_metadata = (8, 1, 1024)
        outer = self

        class _Run:
            launch_cooperative_grid = False
            launch_pdl = False
            global_scratch_size = 0
            profile_scratch_size = 0

            @staticmethod
            def launch(*args):
                outer.calls.append(args)

        self.run = _Run()


class _FakeScratch(dict):
    """Stands in for ScratchPerStream: a distinct address per stream."""

    def __missing__(self, stream):
        self[stream] = 0x5000 + 0x100 * stream
        return self[stream]


def _closure(spec):
    rec, sig, cx, arg_plan, constants = kernel_signature(spec, KNOBS)
    kernel = _Recorder()
    scratch = _FakeScratch()
    return rec, cx, kernel, _lower(rec, KNOBS, kernel, arg_plan, constants, scratch, NUM_SMS)


FLAVOURS = [
    ("plain", ()),
    ("bias-gelu_tanh", (step("bias", "col", "bf16"), step("gelu_tanh"))),
    ("scale-value-add-tile", (step("scale", "value"), step("add", "tile", "fp16"))),
    (
        "four-operands-two-values",
        (
            step("scale", "scalar", "fp32"),
            step("scale", "value"),
            step("bias", "col", "bf16"),
            step("mul", "row", "fp32"),
            step("add", "value"),
            step("add", "tile", "bf16"),
        ),
    ),
]


@pytest.mark.parametrize("use_tma", [True, False], ids=["tma", "pointers"])
@pytest.mark.parametrize("name,chain", FLAVOURS, ids=[f[0] for f in FLAVOURS])
def test_one_arg_plan_loop_serves_every_flavour(name, chain, use_tma):
    spec = GemmSpec("bf16", "bf16", "bf16", "row", "col", "row", chain, use_tma)
    rec, cx, kernel, launch = _closure(spec)
    T, V = rec.n_tensors, rec.n_values
    epi = tuple(0x10000 + 0x100 * i for i in range(T))
    estrides = tuple(x for i in range(T) for x in (1000 + i, 2000 + i, 3000 + i))
    values = tuple(0.5 + i for i in range(V))
    strides = (4096 * 64, 64, 1, 64 * 4096, 1, 64, 4096 * 300, 4096, 1) + estrides
    launch(0xA000, 0xB000, 0xC000, epi, 300, 4096, 64, 2, strides, values, 7)
    (call,) = kernel.calls
    grid, stream, scratch, args = call[:3], call[3], call[7], call[13:]
    tiles = 3 * 16 * 2  # ceil(300/128) * ceil(4096/256) * batch
    assert grid == (min(tiles, NUM_SMS), 1, 1) and stream == 7 and scratch == 0x5000 + 0x700
    got = dict(zip(gemm_kernel.arg_names, args))
    assert len(args) == len(gemm_kernel.arg_names)
    expect = {
        "a_ptr": 0xA000,
        "b_ptr": 0xB000,
        "c_ptr": 0xC000,
        "M": 300,
        "N": 4096,
        "K": 64,
        "BATCH": 2,
        "s_am": 64,
        "s_bn": 64,
        "s_cb": 4096 * 300,
    }
    for i in range(T):
        expect[f"e{i}_ptr"] = epi[i]
        expect[f"e{i}_sm"] = 2000 + i
    for i in range(V):
        expect[f"v{i}"] = values[i]
    for name_, value in expect.items():
        assert got[name_] == value, name_
    for name_, value in cx.items():  # every compile-time position carries its constant
        assert got[name_] == value, name_


def _legal_call():
    # bf16 A [2, 128, 64] row, B [2, 64, 256] col, C [2, 128, 256] row; all 16B aligned.
    return dict(
        a=0xA000,
        b=0xB000,
        c=0xC000,
        epi=(),
        M=128,
        N=256,
        K=64,
        batch=2,
        strides=(128 * 64, 64, 1, 256 * 64, 1, 64, 128 * 256, 256, 1),
        values=(),
        stream=0,
    )


REFUSED = [
    ("tma-misaligned-a", dict(a=0xA002), "tma_pointer_alignment"),
    ("tma-misaligned-c", dict(c=0xC008), "tma_pointer_alignment"),
    (
        "tma-odd-row-stride",
        dict(strides=(128 * 65, 65, 1, 256 * 64, 1, 64, 128 * 256, 256, 1)),
        "tma_stride_alignment",
    ),
    (
        "unit-stride-broken",
        dict(strides=(128 * 64, 64, 2, 256 * 64, 1, 64, 128 * 256, 256, 1)),
        "layout_unit_stride",
    ),
    ("zero-M", dict(M=0), "extent_positive"),
    ("zero-batch", dict(batch=0), "extent_positive"),
]


@pytest.mark.parametrize("name,change,rule", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_call_names_its_rule_and_launches_nothing(name, change, rule):
    spec = GemmSpec("bf16", "bf16", "bf16", "row", "col", "row", (), use_tma=True)
    _, _, kernel, launch = _closure(spec)
    call = _legal_call() | change
    with pytest.raises(ValueError, match=rule):
        launch(**call)
    assert kernel.calls == []


def test_pointer_plan_serves_misaligned_pointers():
    """Alignment is a TMA rule only: the pointer path must not refuse a legal call."""
    spec = GemmSpec("bf16", "bf16", "bf16", "row", "col", "row", (), use_tma=False)
    _, _, kernel, launch = _closure(spec)
    odd_strides = (128 * 65, 65, 1, 256 * 65, 1, 65, 128 * 256, 256, 1)
    launch(**(_legal_call() | dict(a=0xA002, strides=odd_strides)))
    assert len(kernel.calls) == 1


def test_spec_declines_a_chain_that_does_not_fit():
    too_many = tuple(step("add", "tile", "fp16") for _ in range(5))
    with pytest.raises(ValueError, match="tensor operands"):
        GemmSpec("fp16", "fp16", "fp16", chain=too_many)
    with pytest.raises(ValueError, match="must match"):
        GemmSpec("fp16", "bf16", "fp16")
    with pytest.raises(ValueError, match="use_tma"):
        GemmSpec("fp16", "fp16", "fp16", a_major="strided", use_tma=True)


def test_descriptor_scratch_is_one_buffer_per_stream():
    """Launches in flight on two streams must not share the descriptors' scratch."""
    from cudnn_pygraph.engines.gemm.kernels.launch import ScratchPerStream

    scratch = ScratchPerStream(132 * 384, "cpu")
    first, other = scratch[7], scratch[8]
    assert first != other and scratch[7] == first  # stable per stream, distinct across
    assert ScratchPerStream(0, "cpu")[7] is None  # the pointer path needs none
