"""bench/la_stages.py without a GPU: which stage each of our kernels and each fla-core 0.6.0
kernel is booked to, the stage arithmetic (bytes, FLOPs, the floor at the H200's rates) and
the table it prints when fla refuses a pass."""

import importlib.util
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("la_stages", BENCH / "la_stages.py")
st = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(st)

OURS = {
    "wy_solve_kernel": "wy",
    "state_fwd_kernel": "state",
    "output_fwd_kernel": "output",
    "dv_local_kernel": "dv",
    "state_bwd_kernel": "dh",
    "dqk_kernel": "dqk",
    "wy_bwd_kernel": "wy_bwd",
    "wy_bwd_keys_kernel": "wy_bwd",
    "subchunk_diag_rows_kernel": "wy",
    "subchunk_diag_kernel": "wy",
    "state_bwd_operands_kernel": "dh",
    "dqk_sliced_kernel": "dqk",
    "group_reduce_kernel": "other",
    "_chunk_offsets_kernel": "other",
    "_poison_dense_kernel": "other",
    "_dense_copy_kernel": "other",
}
# Kernel names in fla-core 0.6.0 (fla/ops/{gated_delta_rule,kda,gdn2,gated_delta_product,
# common,utils}, fla/modules/l2norm), and torch's own.
FLA = {
    "l2norm_fwd_kernel": "gates",
    "l2norm_bwd_kernel": "gates",
    "chunk_local_cumsum_scalar_kernel": "gates",
    "kda_gate_chunk_cumsum_vector_kernel": "gates",
    "chunk_gated_delta_rule_fwd_kkt_solve_kernel": "wy",
    "chunk_scaled_dot_kkt_fwd_kernel": "wy",
    "solve_tril_16x16_kernel": "wy",
    "merge_16x16_to_64x64_inverse_kernel": "wy",
    "recompute_w_u_fwd_kernel": "wy",
    "chunk_kda_fwd_kernel_intra_sub_chunk": "wy",
    "chunk_gdn2_fwd_kernel_inter_solve_fused": "wy",
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": "state",
    "chunk_gated_delta_product_fwd_kernel_h_blockdim64": "state",
    "chunk_fwd_kernel_o": "output",
    "chunk_gated_delta_product_fwd_kernel_o": "output",
    "chunk_bwd_kernel_dv_local": "dv",
    "chunk_kda_bwd_kernel_dAv": "dv",
    "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64": "dh",
    "chunk_bwd_kernel_dqkwg": "dqk",
    "chunk_kda_bwd_kernel_wy_dqkg_fused": "dqk",
    "prepare_wy_repr_bwd_kernel": "wy_bwd",
    "chunk_kda_bwd_kernel_intra": "wy_bwd",
    "chunk_gdn2_bwd_kernel_intra": "wy_bwd",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": "other",
}


@pytest.mark.parametrize("name,stage", [*OURS.items(), *FLA.items()])
def test_each_kernel_is_booked_to_the_stage_it_computes(name, stage):
    assert st.stage_of(name) == stage


def test_by_stage_sums_a_profile_and_names_its_kernels():
    staged = st.by_stage({"wy_solve_kernel": 0.5, "recompute_w_u_fwd_kernel": 0.25, "x": 0.1})
    assert staged["wy"][0] == pytest.approx(0.75)
    assert staged["wy"][1] == [("wy_solve_kernel", 0.5), ("recompute_w_u_fwd_kernel", 0.25)]
    assert staged["other"] == (pytest.approx(0.1), [("x", 0.1)])
    assert staged["dh"] == (0.0, [])


def test_kernel_cells_name_the_slowest_kernels_with_their_time_and_count_the_rest():
    # torch's kernels spell whole functor types: a cell names the function, not its type
    copy = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
            "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>(int)")  # fmt: skip
    profile = {copy: 0.3, "subchunk_scores_kernel": 2.0, "Memcpy DtoD (Device -> Device)": 0.2}
    profile.update({f"k{i}": 0.01 * i for i in range(1, 5)})
    staged = {"ours": {"fwd": st.by_stage(profile)}}
    assert st._kernels(staged, "ours", "wy") == "subchunk_scores_kernel 2.000"
    cell = st._kernels(staged, "ours", "other")
    assert cell.startswith("elementwise_kernel 0.300, Memcpy DtoD 0.200, k4 0.040, k3 0.030")
    assert cell.endswith("(+2 more)")
    assert st._kernels(staged, "ours", "dh") == "-"


def test_stage_arithmetic_counts_every_token_and_head():
    tokens, heads, d = 8 * 4096, 16, 128
    state = st.stage_cost("gdn", "state", [4096] * 8, heads, d, d)
    assert state["bf16"] == 4 * tokens * heads * d * d  # v_new = u - w S and S += k^T v_new
    # a ragged batch pays whole chunks: 1, 64 and 65 tokens are 1 + 1 + 2 chunks
    assert st.chunks([1, 64, 65]) == 4
    ragged = st.stage_cost("gdn", "state", [1, 64, 65], 1, d, d)
    assert ragged["bf16"] == 4 * 4 * 64 * d * d


def test_gdp_is_gdn_on_its_expanded_timeline_and_per_key_decay_costs_fp32_work():
    for stage in st.STAGE_IDS:
        assert st.stage_cost("gdp", stage, [100, 37], 4, 64, 64, n=3) == st.stage_cost(
            "gdn", stage, [300, 111], 4, 64, 64
        )
    gdn = st.stage_cost("gdn", "wy", [4096], 16, 128, 128)
    kda = st.stage_cost("kda", "wy", [4096], 16, 128, 128)
    assert gdn["fp32"] == 0 < kda["fp32"] and kda["bytes"] > gdn["bytes"]
    with pytest.raises(ValueError, match="stage"):
        st.stage_cost("gdn", "nope", [64], 1, 64, 64)


def test_the_gdn_forward_floor_at_row_a_is_its_tensor_core_time():
    # 8 x 4096 tokens, H16, K = V = 128: the products at 989 (bf16) and 494 (tf32) TFLOP/s
    # outweigh q, k, v, g, beta in and o out at 4.8 TB/s (issue 30: about 0.13 ms).
    cost = st.fused_cost("gdn", [4096] * 8, 16, 128, 128)
    assert cost["bytes"] == pytest.approx(8 * 4096 * 16 * (4 * 128 * 2 + 4 + 2))
    assert st.floor_ms(cost) == pytest.approx(0.125, abs=0.005)
    backward = st.fused_cost("gdn", [4096] * 8, 16, 128, 128, backward=True)
    assert st.floor_ms(backward) > 3 * st.floor_ms(cost)


def test_the_table_names_the_losing_stage_and_reads_refused_for_a_refused_pass(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("la_families", None)
    sides = {
        "ours": {
            "fwd": {"wy_solve_kernel": 0.3, "state_fwd_kernel": 0.4},
            "fb": {"wy_solve_kernel": 0.6, "state_fwd_kernel": 0.4, "wy_bwd_kernel": 2.0},
        },
        "fla": {
            "fwd": {"chunk_gated_delta_rule_fwd_kkt_solve_kernel": 0.2, "chunk_fwd_kernel_h": 0.5},
            "fb": {
                "chunk_gated_delta_rule_fwd_kkt_solve_kernel": 0.4,
                "prepare_wy_repr_bwd_kernel": 0.5,
            },
        },
    }
    text = "\n".join(st.family_table("kda", [4096] * 8, sides))
    assert "Loses most to fla: **bwd: WY backward, intra-chunk dA** (+1.500 ms" in text
    wy_row = next(line for line in text.splitlines() if line.startswith("| intra-chunk"))
    assert "| 0.300 | 0.600 | 0.200 | 0.400 |" in wy_row and "chunk_gated_delta_rule" in wy_row
    sides["fla"]["fb"] = "refused"
    text = "\n".join(st.family_table("gdn", [4096] * 8, sides))
    assert "| 0.300 | 0.600 | 0.200 | refused |" in text and "Loses most" not in text


def test_bench_plot_knows_which_way_each_ratio_column_of_the_la_tables_is_better(monkeypatch):
    # bench/results/la_stages.md and la_training.md are charted by bench/plot.py, which
    # refuses a ratio column it has no direction for (tests/test_docs.py).
    def load(name):
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    monkeypatch.syspath_prepend(str(BENCH))
    plot, training = load("plot"), load("la_training")
    sides = {"ours": {"fwd": {"wy_solve_kernel": 0.3}, "fb": {"wy_solve_kernel": 0.6}}}
    stage_lines = st.family_table("kda", [4096] * 8, sides)
    cells = "| kda | (a) | no | 1 / 1 | 2 / 2 | 1 / 1 | 2 / 2 | - | - | 1.00x | 1.00x | 0.1 / 0.4 | 5.0x |"
    text = "\n".join(["## t", "", *stage_lines[:2], stage_lines[3], "", training.HEADER,
                      "|---" * 13 + "|", cells])  # fmt: skip
    tables = plot.parse_tables(text)
    headers = [h for t in tables for h in t.series]
    assert {"ours/floor fwd+bwd", "fla / ours fwd", "fla / ours fwd+bwd"} <= set(headers)
    assert {plot.better(h) for h in headers} <= {"higher", "lower"}
    assert plot.better("ours/floor fwd+bwd") == "lower"
