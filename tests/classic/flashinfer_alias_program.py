"""Run by test_cudnn_alias.py in a fresh interpreter: what a FlashInfer user's process
does. `sys.modules["cudnn"] = cudnn_pygraph` first, then FlashInfer-shaped code that says
`import cudnn` and builds its paged decode graph with cudnn.jit / cudnn.graph_cache /
cudnn.graph, as FlashInfer's cuDNN decode path declares it. Prints one JSON report."""

import json
import sys

import cudnn_pygraph

sys.modules["cudnn"] = cudnn_pygraph
import cudnn  # the library's own import, after the alias

from cudnn_pygraph.backend import lowering

B, H_QO, H_KV, D, PAGE, MAX_PAGES = 2, 4, 2, 64, 16, 2
I32 = cudnn.data_type.INT32
report = {"cudnn_is_ours": cudnn is cudnn_pygraph}


@cudnn.jit(heur_modes=[cudnn.heur_mode.A])
@cudnn.graph_cache(key_fn=lambda handle, batch: ("decode", batch))
def build_decode(handle, batch):
    # sm_version / sm_count: the deviceless request, so the backend's validate() of an
    # sdpa graph needs no GPU
    with cudnn.graph(handle, io_data_type=cudnn.data_type.HALF, sm_version=90, sm_count=132) as (
        g,
        _,
    ):
        q = g.tensor([batch, H_QO, 1, D], [H_QO * D, D, H_QO * D, 1], name="q")
        k = g.tensor([batch * MAX_PAGES, H_KV, PAGE, D], name="k_cache")
        v = g.tensor([batch * MAX_PAGES, H_KV, PAGE, D], name="v_cache")
        table_k = g.tensor([batch, 1, MAX_PAGES, 1], data_type=I32, name="table_k")
        table_v = g.tensor([batch, 1, MAX_PAGES, 1], data_type=I32, name="table_v")
        len_q = g.tensor([batch, 1, 1, 1], data_type=I32, name="seq_len_q")
        len_kv = g.tensor([batch, 1, 1, 1], data_type=I32, name="seq_len_kv")
        o, _ = g.sdpa(
            q, k, v, seq_len_q=len_q, seq_len_kv=len_kv, use_padding_mask=True,
            generate_stats=False, attn_scale=0.125, paged_attention_k_table=table_k,
            paged_attention_v_table=table_v, paged_attention_max_seq_len_kv=PAGE * MAX_PAGES,
            name="decode",
        )  # fmt: skip
        o.set_output(True).set_dim([batch, H_QO, 1, D]).set_stride([H_QO * D, D, H_QO * D, 1])
        g.validate()
        # the backend's own validate(), on the builder lowering found
        report["builder_module"] = type(lowering.lowered(g).backend).__module__
        return g, [q, k, v, table_k, table_v, len_q, len_kv, o]


def refused_graph():
    """An sdpa the backend refuses (alibi with a right band bound) after another node."""
    g = cudnn.pygraph(
        name="alibi", io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT,
        sm_version=90, sm_count=132,
    )  # fmt: skip
    q, k, v = (g.tensor([1, 2, 64, 64], name=n) for n in "qkv")
    x = g.scale(q, g.tensor([1, 1, 1, 1], name="s"), name="prescale")
    o, _ = g.sdpa(
        x, k, v, attn_scale=0.125, use_alibi_mask=True, generate_stats=False, name="attn_alibi"
    )
    o.set_output(True)
    try:
        lowering.lowered(g)
    except cudnn.cudnnGraphNotSupportedError as exc:
        return str(exc)
    return None


handle = None  # a cudnnHandle needs a GPU; FlashInfer passes its own where there is one
try:
    g, uids = build_decode(handle, B)
    report["plans"] = g.get_execution_plan_count()
    report["cache_hit"] = build_decode(handle, B)[0] is g
    report["uids"] = uids
except cudnn.cudnnGraphNotSupportedError as exc:  # nothing can plan here
    report["not_planned"] = str(exc)
report["backend_version"] = cudnn.backend_version()
report["refusal"] = refused_graph()
report["cudnn_still_ours"] = sys.modules["cudnn"] is cudnn_pygraph
print(json.dumps(report))
