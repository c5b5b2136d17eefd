#!/usr/bin/env python3
"""Regenerate src/cudnn_pygraph/graph/ops/backend_signatures.py from the INSTALLED
nvidia-cudnn-frontend: every builder method of its pybind graph class, with each
parameter's name, kind and default in positional order.

The OpSpec tables (graph/ops/*.py) read this data for names, positional order and
defaults, and add what a pybind signature cannot say (output port names, shape rules).
A test (tests/test_backend_surface.py) compares the live backend against it.

Usage:  python tools/gen_backend_signatures.py   (needs `pip install nvidia-cudnn-frontend`)
"""

import pathlib
import re

import cudnn

OUT = (
    pathlib.Path(__file__).resolve().parents[1]
    / "src/cudnn_pygraph/graph/ops/backend_signatures.py"
)
TENSOR = "cudnn._compiled_module.tensor"

# Methods of the builder class that are not op builders: planning, plan queries,
# serialization, tensor creation. They are the graph class's own API, not ops.
NOT_OPS = {
    "build",
    "build_operation_graph",
    "build_plan_at_index",
    "build_plans",
    "check_support",
    "create_execution_plan",
    "create_execution_plans",
    "deselect_behavior_notes",
    "deselect_engines",
    "deselect_numeric_notes",
    "deselect_workspace_greater_than",
    "deserialize",
    "get_behavior_notes",
    "get_behavior_notes_for_plan_at_index",
    "get_cuda_graph_retention",
    "get_engine_and_knobs_at_index",
    "get_engine_count",
    "get_execution_plan_count",
    "get_knobs_for_engine",
    "get_plan_name_at_index",
    "get_workspace_size",
    "get_workspace_size_plan_at_index",
    "key",
    "populate_cuda_graph",
    "query_tensor_attributes_of_uid",
    "select_behavior_notes",
    "select_numeric_notes",
    "serialize",
    "tensor",
    "tensor_like",
    "tensor_scalar",
    "update_cuda_graph",
    "validate",
    # deprecated aliases whose docstring is sdpa's / sdpa_backward's own
    "scaled_dot_product_flash_attention",
    "scaled_dot_product_flash_attention_backward",
}


def split_top(text):
    """Split on commas that are not inside brackets."""
    depth, cur, parts = 0, "", []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def kind_of(annotation):
    a = annotation.strip()
    if a == TENSOR:
        return "tensor"
    if a == f"{TENSOR} | None":
        return "tensor?"
    if a == f"collections.abc.Sequence[{TENSOR}]":
        return "tensors"
    if a.startswith("collections.abc.Callable"):
        return "callable?"
    if a == "collections.abc.Sequence[int]":
        return "ints"
    if a == "collections.abc.Sequence[slice]":
        return "slices"
    m = re.fullmatch(r"cudnn\._compiled_module\.(\w+)( \| None)?", a)
    if m:
        return "enum:" + m.group(1) + ("?" if m.group(2) else "")
    return {
        "float": "float",
        "int": "int",
        "bool": "bool",
        "str": "str",
        "object | None": "value?",
        "object": "value",
        "float | None": "float?",
        "int | None": "int?",
    }[a]


def parse(line):
    m = re.fullmatch(r"(\w+)\(self, (.*)\) -> (.*)", line.strip())
    name, params, ret = m.groups()
    out = []
    for p in split_top(params):
        if p in ("/", "*"):
            continue
        pname, rest = p.split(":", 1)
        if "=" in rest:
            ann, default = rest.split("=", 1)
            default = default.strip()
        else:
            ann, default = rest, None
        out.append((pname.strip(), kind_of(ann), default))
    return name, tuple(out), ret.strip().startswith("list[")


def main():
    graph_cls = cudnn._pybind_module.backend_graph
    sigs = {}
    for name in sorted(n for n in dir(graph_cls) if not n.startswith("_") and n not in NOT_OPS):
        lines = [
            l
            for l in (getattr(graph_cls, name).__doc__ or "").splitlines()
            if l.startswith(name + "(")
        ]
        merged, returns_list = {}, False
        for line in lines:  # overloads: union of their parameters, first order wins
            _, params, returns_list = parse(line)
            for p in params:
                merged.setdefault(p[0], p)
        sigs[name] = (tuple(merged.values()), returns_list)
    body = [
        f'"""Builder signatures of nvidia-cudnn-frontend {cudnn.__version__} (generated).',
        "",
        "Regenerate with `python tools/gen_backend_signatures.py`; do not edit by hand.",
        "Each op: ((param, kind, default-repr or None when required), ...), returns_list.",
        "Overloads (conv padding vs pre/post padding) are merged, first order wins.",
        '"""',
        "",
        f'BACKEND_VERSION = "{cudnn.__version__}"',
        "",
        "SIGNATURES = {",
    ]
    for name, (params, returns_list) in sigs.items():
        body.append(f"    {name!r}: (")
        body.append("        (")
        for p in params:
            body.append(f"            {p!r},")
        body.append("        ),")
        body.append(f"        {returns_list!r},")
        body.append("    ),")
    body.append("}")
    OUT.write_text("\n".join(body) + "\n")
    print(f"wrote {OUT} ({len(sigs)} ops)")


if __name__ == "__main__":
    main()
