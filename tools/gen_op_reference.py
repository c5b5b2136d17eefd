"""Generate docs/ops.md, the op reference, from the OpSpec tables (graph/ops/).

    PYTHONPATH=src python tools/gen_op_reference.py           # rewrite docs/ops.md
    PYTHONPATH=src python tools/gen_op_reference.py --check   # exit 1 when it is stale

The tables are the ONE source: this script only formats them (tests/test_docs.py fails
when the committed page differs from what it renders)."""

import argparse
import enum
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "ops.md"

GROUP_TITLES = {
    "MATMUL": "Matmul",
    "POINTWISE": "Pointwise",
    "STRUCTURED": "Structured (norms, reductions, conv, block scale, MoE, layout)",
    "SDPA": "Attention (SDPA)",
    "LINEAR_ATTENTION": "Linear attention (python-only)",
}
# A group's prose, under its title: what its ops are for beyond one op's table.
GROUP_NOTES = {
    "LINEAR_ATTENTION": [
        "The arithmetic of every op here is pinned by the linear-attention spec (shapes THD,",
        "states V-major `[N, HO, V, K]`); which engine serves which op is the manifest's",
        "(`cudnn_pygraph/planning/manifest.py`).",
        "",
        "The summary ops describe one span of tokens of each sequence, for context",
        "parallelism: `<op>_summary` returns `H` (the span's final state from a zero seed) and",
        "`M_buf` (its state transition, stored transposed), fp32, so spans compose forward as",
        "`X_next = X @ M_buf + H`; `<op>_summary_bwd` returns `G` (the gradient the span's",
        "outputs send to its incoming state) and, with `output_transition=True`,",
        "`transition` (`M_buf` transposed), so state gradients compose backward as",
        "`dX = dX_next @ transition + G`.",
        "",
        "torch users:",
        "",
        "- `cudnn_pygraph.linear_attention.ops.gated_delta_net`: fla's `chunk_gated_delta_rule`",
        "  over cached gdn / gdn_bwd graphs ([getting started](getting-started.md)).",
        "- `cudnn_pygraph.linear_attention.gdp.gated_delta_product`: fla's",
        "  `chunk_gated_delta_product` (num_householder Householder rows per token: k / v /",
        "  beta at T * n rows, q / g at T) over cached gdp / gdp_bwd graphs, with autograd;",
        "  `gated_delta_product_overwrite_state` updates a state (or pool) in place.",
        "- `cudnn_pygraph.linear_attention.summary.gdn_summary(k, v, g, beta, cu_seqlens, ...)`",
        "  -> `(H, M_buf)` and `gdn_summary_bwd(q, k, g, beta, cu_seqlens, dO, scale=...,",
        "  output_transition=False, ...)` -> `(G, transition | None)`: the summary graphs",
        "  on THD tensors, no autograd; `kda_summary` / `kda_summary_bwd` (g `[T, HO, K]`,",
        "  `gate_lower_bound`), `gdn2_summary` / `gdn2_summary_bwd` (the write gate `w` in the",
        "  forward, `gate_lower_bound` as kda's) and `gdp_summary` / `gdp_summary_bwd`",
        "  (`num_householder=n`: k / v / beta at T * n rows) the same for the other families.",
        "- `cudnn_pygraph.linear_attention.cp.gated_delta_net_cp(q, k, v, g, beta, ...,",
        "  group=None)`: Gated DeltaNet with each sequence split across the ranks of a",
        "  torch.distributed process group (NCCL, gloo). Every rank passes its own span",
        "  `[B, T_r, ...]` of the B sequences (rank 0 the first tokens; T_r may differ by",
        "  rank) and `gated_delta_net`'s other arguments. The forward summarizes the span,",
        "  all-gathers the summaries (one collective of `B x HO x (V + K) x K` fp32 per rank),",
        "  composes the seed of its span and runs it; the backward does the same in reverse",
        "  (one all-gather of `2 x B x HO x V x K` fp32). It returns this rank's span of `o`",
        "  and the whole sequences' final state (the same on every rank). Gradients are",
        "  those of the loss summed over the ranks: for the span's q, k, v, g, beta on its",
        "  rank; `final_state`'s incoming gradients are summed over the group;",
        "  `initial_state`'s gradient is whole on rank 0 and zero elsewhere, and `A_log` /",
        "  `dt_bias` get each rank's share (sum them over the group, as data parallelism",
        "  does for parameters). A span is summarized in pieces (`piece_tokens`, a multiple",
        "  of 64; by default enough to keep every SM walking), folded pairwise in fp32.",
        "- `cudnn_pygraph.linear_attention.cp.kimi_delta_attention_cp(q, k, v, g, beta, ...,",
        "  group=None)`: the same for Kimi Delta Attention, with `kimi_delta_attention`'s",
        "  arguments (g `[B, T_r, HO, K]`, `lower_bound`, `A_log` / `dt_bias` by keyword).",
        "- `cudnn_pygraph.linear_attention.cp.gated_delta_net_v2_cp(q, k, v, g, beta, w, ...,",
        "  group=None)`: the same for GDN-2, with `gated_delta_net_v2`'s arguments but",
        "  `[B, T_r, ...]` spans and no cu_seqlens (g / beta `[B, T_r, HO, K]`, w",
        "  `[B, T_r, HO, V]`, V-major states, `gate_lower_bound` by keyword); dW is this",
        "  rank's span's.",
        "- `cudnn_pygraph.linear_attention.cp.gated_delta_product_cp(q, k, v, g, beta,",
        "  num_householder, ..., group=None)`: the same for Gated DeltaProduct, with",
        "  `gated_delta_product`'s arguments (k / v / beta `[B, T_r * n, ...]`: a span holds",
        "  whole tokens).",
        "",
    ],
}


def _default(param):
    from cudnn_pygraph.graph.opspec import REQUIRED

    d = param.default
    if d is REQUIRED:
        return "required"
    if isinstance(d, enum.Enum):
        return f"`{type(d).__name__}.{d.name}`"
    if isinstance(d, str):
        return f'`"{d}"`'
    return f"`{d!r}`"


def _kind(param):
    from cudnn_pygraph.graph.opspec import PortKind

    return {
        PortKind.TENSOR: "tensor",
        PortKind.OPTIONAL_TENSOR: "tensor, optional",
        PortKind.TENSOR_LIST: "list of tensors",
        PortKind.OUTPUT_TENSOR: "tensor the op writes (caller-created)",
        PortKind.ATTR: "attribute",
    }[param.kind]


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _op_section(spec):
    backend = (
        f"backend builder `{spec.backend_method}`"
        if spec.backend_method
        else "python-only (never lowers)"
    )
    lines = [
        f"### `{spec.name}`",
        "",
        _cell(spec.doc) if spec.doc else "",
        "",
        f"Group: {spec.group.value}; {backend}; returns "
        + ("a list" if spec.returns_list else "one tensor")
        + ".",
        "",
    ]
    lines += ["| parameter | kind | default | notes |", "|---|---|---|---|"]
    for p in spec.params:
        notes = []
        if p.enum is not None:
            notes.append(f"one of `{p.enum.__name__}`")
        if p.choices:
            notes.append("one of " + ", ".join(f"`{c!r}`" for c in p.choices))
        if p.name in spec.python_only_attrs:
            notes.append("python-only attribute")
        lines.append(f"| `{p.name}` | {_kind(p)} | {_default(p)} | {_cell('; '.join(notes))} |")
    outs = []
    for o in spec.outputs:
        if o.when is None:
            outs.append(f"`{o.name}`")
        else:
            name = getattr(o.when, "__name__", "")
            why = f": {name.strip('_')}" if name and name != "<lambda>" else ""
            outs.append(f"`{o.name}` (conditional{why})")
    lines += ["", "Outputs: " + ", ".join(outs) + ".", ""]
    return lines


def render():
    from cudnn_pygraph.graph.ops import OPS

    by_group = {}
    for spec in OPS.values():
        by_group.setdefault(spec.group.name, []).append(spec)
    lines = [
        "# Op reference",
        "",
        "<!-- Generated by tools/gen_op_reference.py from the OpSpec tables; do not edit. -->",
        "",
        "Every op a `cudnn_pygraph.pygraph` can hold, as its OpSpec declares it: the builder's",
        "parameters in positional order (ports and attributes, with defaults), its outputs",
        "(conditional ones are `None` when not produced), and the backend builder it lowers to",
        "or that it is python-only. Call an op as a graph method: `graph.<op>(...)`.",
        "",
        f"{len(OPS)} ops.",
        "",
    ]
    for group in GROUP_TITLES:
        specs = sorted(by_group.get(group, []), key=lambda s: s.name)
        if specs:
            lines.append(
                f"- [{GROUP_TITLES[group]}](#{_anchor(GROUP_TITLES[group])}): "
                + ", ".join(f"`{s.name}`" for s in specs)
            )
    lines.append("")
    for group, title in GROUP_TITLES.items():
        specs = sorted(by_group.get(group, []), key=lambda s: s.name)
        if not specs:
            continue
        lines += [f"## {title}", "", *GROUP_NOTES.get(group, ())]
        for spec in specs:
            lines += _op_section(spec)
    unknown = set(by_group) - set(GROUP_TITLES)
    if unknown:
        raise SystemExit(
            f"gen_op_reference: no title for op group(s) {sorted(unknown)}: add them to GROUP_TITLES"
        )
    return "\n".join(lines).rstrip() + "\n"


def _anchor(title):
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/ops.md is stale")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(
                f"{OUT.relative_to(ROOT)} is stale: run PYTHONPATH=src python tools/gen_op_reference.py",
                file=sys.stderr,
            )
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
