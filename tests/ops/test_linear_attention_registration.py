"""The linear-attention torch ops' registration and import paths: each family's custom ops
keep their torch.library names and schemas (saved graphs and exported programs name them),
their fakes give the shapes torch.compile traces with, and the public import paths (the
spec's `linear_attention.ops`, `.gdp`, `.summary`, `.cp`) name the functions written in
cudnn_pygraph/ops/linear_attention/. No kernel runs here: shapes and names only."""

import importlib
import subprocess
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

FLAGS = "bool use_qk_l2norm, bool use_beta_sigmoid, bool allow_neg_eigval, bool safe_gate"
TAIL = "str gate_domain, bool batch_invariant"
FWD = "Tensor? initial_state, Tensor? a_log, Tensor? dt_bias, float scale, bool output_final_state"
BWD = "Tensor do, Tensor? initial_state, Tensor? d_final_state, Tensor? a_log, Tensor? dt_bias, float scale"  # fmt: skip
POOL = "Tensor(a6!) state, Tensor? state_indices, Tensor? a_log, Tensor? dt_bias, float scale"
QKVGB = "Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta"
BOUNDED_FLAGS = f"{FLAGS}, float? gate_lower_bound"  # kda, gdn2
SCHEMAS = {
    "gdn_fwd": f"({QKVGB}, Tensor cu_seqlens, {FWD}, {FLAGS}, {TAIL}, bool state_v_first, bool save_for_backward) -> Tensor[]",  # fmt: skip
    "gdn_bwd": f"({QKVGB}, Tensor cu_seqlens, {BWD}, {FLAGS}, {TAIL}, bool state_v_first, Tensor[] saved) -> Tensor[]",  # fmt: skip
    "gdn_fwd_overwrite_state": f"({QKVGB}, Tensor cu_seqlens, {POOL}, {FLAGS}, {TAIL}) -> Tensor",
    "kda_fwd": f"({QKVGB}, Tensor cu_seqlens, {FWD}, {BOUNDED_FLAGS}, {TAIL}, bool state_v_first, bool save_for_backward) -> Tensor[]",  # fmt: skip
    "kda_bwd": f"({QKVGB}, Tensor cu_seqlens, {BWD}, {BOUNDED_FLAGS}, {TAIL}, bool state_v_first, Tensor[] saved) -> Tensor[]",  # fmt: skip
    "kda_fwd_overwrite_state": f"({QKVGB}, Tensor cu_seqlens, {POOL}, {BOUNDED_FLAGS}, {TAIL}) -> Tensor",  # fmt: skip
    "gdn2_fwd": f"({QKVGB}, Tensor w, Tensor cu_seqlens, {FWD}, {BOUNDED_FLAGS}, {TAIL}, bool save_for_backward) -> Tensor[]",  # fmt: skip
    "gdn2_bwd": f"({QKVGB}, Tensor w, Tensor cu_seqlens, {BWD}, {BOUNDED_FLAGS}, {TAIL}, Tensor[] saved) -> Tensor[]",  # fmt: skip
    "gdp_fwd": f"({QKVGB}, Tensor cu_seqlens, {FWD}, {FLAGS}, {TAIL}, bool state_v_first, SymInt num_householder) -> (Tensor, Tensor)",  # fmt: skip
    "gdp_bwd": f"({QKVGB}, Tensor cu_seqlens, {BWD}, {FLAGS}, {TAIL}, bool state_v_first, SymInt num_householder) -> Tensor[]",  # fmt: skip
    "gdp_fwd_overwrite_state": f"({QKVGB}, Tensor cu_seqlens, {POOL}, {FLAGS}, {TAIL}, SymInt num_householder) -> Tensor",  # fmt: skip
}
NEW = "cudnn_pygraph.ops.linear_attention"


def test_each_familys_ops_keep_their_names_and_schemas():
    for family in ("gdn", "kda", "gdn2", "gdp"):
        importlib.import_module(f"{NEW}.{family}")
    for name, schema in SCHEMAS.items():
        got = str(getattr(torch.ops.cudnn_pygraph, name).default._schema)
        assert got == f"cudnn_pygraph::{name}{schema}", name
    assert not hasattr(torch.ops.cudnn_pygraph, "gdn2_fwd_overwrite_state")


def test_the_fakes_give_each_familys_shapes():
    """T 5, H 2, K 64, V 128 (K != V tells a dK from a dV, a dBeta from gdn2's dW), N 2."""
    importlib.import_module(f"{NEW}.gdn2")
    importlib.import_module(f"{NEW}.gdp")
    ops = torch.ops.cudnn_pygraph
    flags = (True, False, False, False, "log", False)
    bounded = (*flags[:4], None, *flags[4:])  # gdn2's gate_lower_bound after safe_gate
    with FakeTensorMode():
        T, H, K, V, n = 5, 2, 64, 128, 2
        q, k, v = torch.empty(T, H, K), torch.empty(T, H, K), torch.empty(T, H, V)
        gk, bk, w = torch.empty(T, H, K), torch.empty(T, H, K), torch.empty(T, H, V)
        cu = torch.empty(3, dtype=torch.int32)
        h0 = torch.empty(2, H, V, K, dtype=torch.bfloat16)
        o, ht = ops.gdn2_fwd(q, k, v, gk, bk, w, cu, h0, None, None, 0.1, True, *bounded, False)
        assert o.shape == (T, H, V) and ht.shape == (2, H, V, K) and ht.dtype == torch.bfloat16
        do = torch.empty(T, H, V)
        grads = ops.gdn2_bwd(q, k, v, gk, bk, w, cu, do, h0, None, None, None, 0.1, *bounded, [])
        want = [(T, H, K), (T, H, K), (T, H, V), (T, H, K), (T, H, K), (T, H, V), (2, H, V, K)]
        assert [tuple(t.shape) for t in grads[:7]] == want
        assert [t.numel() for t in grads[7:]] == [0, 0]  # no safe_gate: no d_a_log, d_dt_bias
        # gdp: k / v / beta at T * n sub-token rows, o and the state at real tokens
        kn, vn, bn = torch.empty(T * n, H, K), torch.empty(T * n, H, V), torch.empty(T * n, H)
        g = torch.empty(T, H)
        out = ops.gdp_fwd(q, kn, vn, g, bn, cu, None, None, None, 0.1, False, *flags, False, n)
        assert isinstance(out, tuple) and out[0].shape == (T, H, V) and out[1].shape[0] == 0


def test_the_public_paths_name_the_family_modules():
    from cudnn_pygraph.linear_attention import cp, gdp, ops, summary

    for old in (cp, gdp, summary):
        assert old is importlib.import_module(f"{NEW}.{old.__name__.rpartition('.')[2]}")
    homes = {
        "gated_delta_net": "gdn",
        "gated_delta_net_overwrite_state": "gdn",
        "kimi_delta_attention": "kda",
        "kimi_delta_attention_overwrite_state": "kda",
        "gated_delta_net_v2": "gdn2",
        "gated_delta_product": "gdp",
    }
    assert sorted(ops.__all__) == sorted(homes)
    for name, module in homes.items():
        assert getattr(ops, name) is getattr(importlib.import_module(f"{NEW}.{module}"), name)


def test_gated_delta_product_imports_from_linear_attention_ops_first():
    """The spec's spelling, in a fresh interpreter where nothing else was imported first
    (an import cycle would fail here, not after another test imported the modules)."""
    code = (
        "from cudnn_pygraph.linear_attention.ops import gated_delta_product as f\n"
        "import cudnn_pygraph.linear_attention.gdp as gdp\n"
        "assert f is gdp.gated_delta_product\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
