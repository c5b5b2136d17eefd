"""cu_seqlens tables a hostile caller may pass with 16 THD tokens, one per way a table
can be wrong: the CPU op tests (tests/ops/test_sdpa_op_hostile_input.py) and the GPU race
and memcheck suite (tests/gpu/test_op_races_gpu.py) both feed them to the attention op."""

BAD_TABLES = {
    "past-the-end": [0, 5, 20],
    "far-past-the-end": [0, 5, 100000],
    "negative": [0, -3, 16],
    "decreasing": [0, 12, 5, 16],
    "not-from-0": [3, 5, 16],
    "no-sequence": [0],
    "int64-wraps-to-valid": [0, 2**32 + 5, 16],
}
