"""The public vocabulary: enums, the knob vocabulary and the error types.

Every enum value equals the cuDNN backend's value of the same name (nvidia-cudnn-frontend
1.32.0, `cudnn._pybind_module.<enum>`); conversion to the backend's objects happens only
in `cudnn_pygraph.backend.lowering`. tests/test_backend_surface.py checks every value
against the installed backend. This module imports nothing heavy.
"""

import enum


class data_type(enum.IntEnum):
    NOT_SET = 0
    FLOAT = 1
    DOUBLE = 2
    HALF = 3
    INT8 = 4
    INT32 = 5
    INT8x4 = 6
    UINT8 = 7
    UINT8x4 = 8
    INT8x32 = 9
    BFLOAT16 = 10
    INT64 = 11
    BOOLEAN = 12
    FP8_E4M3 = 14
    FP8_E5M2 = 15
    FAST_FLOAT_FOR_FP8 = 16
    FP8_E8M0 = 17
    FP8_E5M3 = 18
    FP4_E2M1 = 19
    INT4 = 20


# Width of one element in bits; the variant pack and alignment rules read it.
ELEMENT_BITS = {
    data_type.FLOAT: 32,
    data_type.DOUBLE: 64,
    data_type.HALF: 16,
    data_type.INT8: 8,
    data_type.INT32: 32,
    data_type.INT8x4: 32,
    data_type.UINT8: 8,
    data_type.UINT8x4: 32,
    data_type.INT8x32: 256,
    data_type.BFLOAT16: 16,
    data_type.INT64: 64,
    data_type.BOOLEAN: 8,
    data_type.FP8_E4M3: 8,
    data_type.FP8_E5M2: 8,
    data_type.FAST_FLOAT_FOR_FP8: 8,
    data_type.FP8_E8M0: 8,
    data_type.FP8_E5M3: 8,
    data_type.FP4_E2M1: 4,
    data_type.INT4: 4,
}


class heur_mode(enum.IntEnum):
    A = 0
    B = 1
    FALLBACK = 2
    # Mode A without the backend's recommendation: the python engines ARE the open-source
    # implementation (spec: "Ranking and the one plan list").
    OPENSOURCE = 3


FRONTEND_KNOB_TYPE_BASE = 1000


class knob_type(enum.IntEnum):
    """ONE knob vocabulary for backend and python plans.

    Backend band [0, FRONTEND_KNOB_TYPE_BASE): the backend's own names and values (0..32
    in nvidia-cudnn-frontend 1.32.0), frozen. Frontend band [FRONTEND_KNOB_TYPE_BASE, ...):
    axes the backend has no word for; the first ten are NVIDIA's own frontend-band names
    and values. Both bands are append-only; a frontend-band value never reaches the
    backend. A python engine reuses a backend type whenever the meaning matches, so each
    knob type has one meaning:
      TILE_M / TILE_N / TILEK   an output tile's rows / columns / the K step (Triton BLOCK_*)
      STAGES                    software-pipelining depth (Triton num_stages)
      SWIZZLE                   CTA rasterization for L2 reuse (a GEMM's GROUP_M)
      SPLIT_K_SLC               split-K slices
    and mints one only for an axis the backend cannot name (NUM_WARPS).
    """

    NOT_SET = 0
    SWIZZLE = 1
    TILE_SIZE = 2
    EDGE = 3
    MULTIPLY = 4
    SPLIT_K_BUF = 5
    TILEK = 6
    STAGES = 7
    REDUCTION_MODE = 8
    SPLIT_K_SLC = 9
    IDX_MODE = 10
    SPECFILT = 11
    KERNEL_CFG = 12
    WORKSPACE = 13
    TILE_CGA_M = 14
    TILE_CGA_N = 15
    BLOCK_SIZE = 16
    OCCUPANCY = 17
    ARRAY_SIZE_PER_THREAD = 18
    SPLIT_COLS = 19
    TILE_ROWS = 20
    TILE_COLS = 21
    LOAD_SIZE = 22
    CTA_COUNT = 23
    STREAM_K = 24
    SPLIT_P_SLC = 25
    TILE_M = 26
    TILE_N = 27
    WARP_SPEC_CFG = 28
    SWAP_AB = 29
    INPUT_TMA_ENABLE = 30
    OUTPUT_TMA_ENABLE = 31
    TILE_CGA = 32
    # ---- frontend band: python engines only; never sent to the backend ----
    SCHED_POLICY = FRONTEND_KNOB_TYPE_BASE + 0
    PACK_GQA = FRONTEND_KNOB_TYPE_BASE + 1
    SPLIT_KV = FRONTEND_KNOB_TYPE_BASE + 2
    PIPELINE_ARCH = FRONTEND_KNOB_TYPE_BASE + 3
    MMA_TILE_M = FRONTEND_KNOB_TYPE_BASE + 4
    MMA_TILE_N = FRONTEND_KNOB_TYPE_BASE + 5
    MMA_TILE_K = FRONTEND_KNOB_TYPE_BASE + 6
    CTA_GROUP = FRONTEND_KNOB_TYPE_BASE + 7
    WARPS_M = FRONTEND_KNOB_TYPE_BASE + 8
    WARPS_N = FRONTEND_KNOB_TYPE_BASE + 9
    # ours: Triton's warps per program (the backend's WARP_SPEC_CFG means something else)
    NUM_WARPS = FRONTEND_KNOB_TYPE_BASE + 10
    # ours: the register cap per thread a kernel is compiled with (ptxas maxnreg; 0 = the
    # compiler's choice)
    MAX_REGS = FRONTEND_KNOB_TYPE_BASE + 11
    # ours: the SDPA prefill's lazy accumulator rescale (1 = on)
    LAZY_RESCALE = FRONTEND_KNOB_TYPE_BASE + 12
    # ours: sequence splitting, the pieces every sequence is cut into (0 = uncut, P >= 1 = a
    # chain of P pieces whose states are composed)
    SEQ_PIECES = FRONTEND_KNOB_TYPE_BASE + 13


def is_frontend_knob_type(kt: knob_type | int) -> bool:
    return int(kt) >= FRONTEND_KNOB_TYPE_BASE


class norm_forward_phase(enum.IntEnum):
    NOT_SET = 0
    INFERENCE = 1
    TRAINING = 2


class reduction_mode(enum.IntEnum):
    NOT_SET = 0
    ADD = 1
    MUL = 2
    MIN = 3
    MAX = 4
    AMAX = 5
    AVG = 6
    NORM1 = 7
    NORM2 = 8
    MUL_NO_ZEROS = 9


class tensor_reordering(enum.IntEnum):
    NONE = 0
    INT8x32 = 1
    F16x16 = 2
    F8_128x4 = 3


class diagonal_alignment(enum.IntEnum):
    TOP_LEFT = 0
    BOTTOM_RIGHT = 1


class attention_implementation(enum.IntEnum):
    AUTO = 0
    COMPOSITE = 1
    UNIFIED = 2


class scalar_type(enum.IntEnum):
    RUNTIME_PARAM = 0
    COMPILE_TIME_CONST = 1


class reshape_mode(enum.IntEnum):
    VIEW_ONLY = 1
    LOGICAL = 2


class moe_grouped_matmul_mode(enum.IntEnum):
    NONE = 1
    GATHER = 2
    SCATTER = 3
    COMBINE = 4


class convolution_mode(enum.IntEnum):
    CONVOLUTION = 1
    CROSS_CORRELATION = 2


class behavior_note(enum.IntEnum):
    RUNTIME_COMPILATION = 1
    REQUIRES_FILTER_INT8x32_REORDER = 2
    REQUIRES_BIAS_INT8x32_REORDER = 3
    SUPPORTS_CUDA_GRAPH_NATIVE_API = 4
    CUBLASLT_DEPENDENCY = 5


class numerical_note(enum.IntEnum):
    TENSOR_CORE = 1
    DOWN_CONVERT_INPUTS = 2
    REDUCED_PRECISION_REDUCTION = 3
    FFT = 4
    NONDETERMINISTIC = 5
    WINOGRAD = 6
    WINOGRAD_TILE_4x4 = 7
    WINOGRAD_TILE_6x6 = 8
    WINOGRAD_TILE_13x13 = 9
    STRICT_NAN_PROP = 10


class build_plan_policy(enum.IntEnum):
    HEURISTICS_CHOICE = 0
    ALL = 1


class cuda_graph_retention(enum.IntEnum):
    PER_GRAPH = 0
    NONE = 1


# Every enum the op surface takes, by the name the backend gives it. The OpSpec tables,
# the JSON form and lowering look enums up here: one table.
ENUMS = {
    cls.__name__: cls
    for cls in (
        data_type,
        heur_mode,
        knob_type,
        norm_forward_phase,
        reduction_mode,
        tensor_reordering,
        diagonal_alignment,
        attention_implementation,
        scalar_type,
        reshape_mode,
        moe_grouped_matmul_mode,
        convolution_mode,
        behavior_note,
        numerical_note,
        build_plan_policy,
        cuda_graph_retention,
    )
}


# The classic package numbers its node kinds from 1 in this order (it is an `auto()`
# enum); the order is part of the value, so the names stay in that order.
NodeType = enum.Enum(
    "NodeType",
    (
        "COMPOSITE CONV_FPROP CONV_DGRAD CONV_WGRAD GENSTATS RESHAPE SLICE CONCATENATE "
        "TRANSPOSE ROPE ROPE_BWD MOE_GROUPED_MATMUL_BWD MATMUL MATMUL_FP8 POINTWISE "
        "REDUCTION RMSNORM RMSNORM_BWD LAYERNORM LAYERNORM_BWD ADALAYERNORM "
        "ADALAYERNORM_BWD INSTANCENORM INSTANCENORM_BWD BATCHNORM BATCHNORM_INFERENCE "
        "BATCHNORM_BWD SDPA SDPA_BWD SDPA_FP8 SDPA_FP8_BWD SDPA_MXFP8 SDPA_MXFP8_BWD GDN "
        "GDN_BWD KDA KDA_BWD GDN2 GDN2_BWD MOE_GROUPED_MATMUL BLOCK_SCALE_QUANTIZE "
        "BLOCK_SCALE_DEQUANTIZE GDP GDP_BWD GDN_SUMMARY KDA_SUMMARY GDN2_SUMMARY "
        "GDP_SUMMARY GDN_SUMMARY_BWD KDA_SUMMARY_BWD GDN2_SUMMARY_BWD GDP_SUMMARY_BWD "
        "MAMBA2 MAMBA2_BWD MAMBA2_SUMMARY MAMBA2_SUMMARY_BWD "
    ),
    module=__name__,
)
NodeType.__doc__ = "Operation node kinds, by the classic package's names and numbers."


# ---------------------------------------------------------------- errors
class cudnnGraphNotSupportedError(Exception):
    """The classic error: this graph (or this engine, for this graph) is not supported.

    Raised at validate() for a semantically invalid graph, and by an engine's
    check_support() to decline.
    """


class GraphStateError(RuntimeError):
    """A call not allowed in the graph's current lifecycle state (a mutation after the
    freeze, a second create_execution_plans(), execute before build)."""


class BackendUnavailableError(ImportError):
    """The cuDNN backend (the `cudnn` extra) is not installed or cannot load here."""


# The exception types a user mistake may surface as; anything else escaping the graph
# API is a bug of ours (the property test in tests/test_graph_properties.py holds this).
CLASSIC_ERRORS = (cudnnGraphNotSupportedError, TypeError, ValueError, GraphStateError)
