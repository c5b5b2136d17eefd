"""The GPU half of the classic differential, one graph: NVIDIA's `cudnn` and `cudnn_pygraph`
given the same random classic graph (classic_graphs.generate(seed)) and the same inputs,
and what each did, as one JSON-able record (`gpu_record`): the verdicts, the lowered
backend graphs (classic_diff.py), the build, the bits the backend's first plan of each
writes, every python plan of ours against our backend plan within the output dtype's
TOLERANCE, and the classic's leniencies (inputs rebound to other compact buffers and to
the other 16-bit float; NVIDIA's manual plan loop).

tools/classic_differential.py runs it over thousands of graphs in worker processes and
writes the page; tests/backend/test_differential_binding.py checks its input binding.
"""

from __future__ import annotations

import dataclasses
import math

import classic_diff as cd
import classic_graphs as cg

# (atol, rtol) of a python plan's output against the backend plan's, per output dtype
TOLERANCE = {"FLOAT": (2e-3, 2e-3), "HALF": (2e-2, 2e-2), "BFLOAT16": (6e-2, 6e-2)}
# NVIDIA's manual plan loop runs on every MANUAL_EVERY-th graph (it creates a plan per
# engine and KERNEL_CFG value)
MANUAL_EVERY = 4
# pass-by-value scalars by name prefix (the generator's names): host values
SCALARS = {
    "drop_seed": 1234,
    "drop_offset": 56,
    "attn_scale": 0.125,
    "eps": 1e-5,
    "momentum": 0.1,
    "alpha": 0.5,
    "s": 0.5,
    "fill": -1e4,
}


def _torch_dtype(torch, name):
    return {
        "FLOAT": torch.float32,
        "HALF": torch.float16,
        "BFLOAT16": torch.bfloat16,
        "INT32": torch.int32,
        "INT64": torch.int64,
        "UINT8": torch.uint8,
        "BOOLEAN": torch.bool,
        "DOUBLE": torch.float64,
    }[name]


def declared(desc):
    """{env name: (dim, stride, dtype name, pass_by_value)} of the graph's tensor() calls."""
    io = dict(desc.context).get("io_data_type")
    out = {}
    for c in desc.calls:
        if c.target is None and c.method == "tensor":
            kw = dict(c.kwargs)
            dtype = kw.get("data_type") or io
            out[c.outs] = (
                kw["dim"],
                kw.get("stride") or cg.row_major(kw["dim"]),
                dtype.member,
                bool(kw.get("is_pass_by_value")),
            )
    return out


def sdpa_kwargs(desc):
    for c in desc.calls:
        if c.method in ("sdpa", "sdpa_backward"):
            return dict(c.kwargs)
    return {}


def make_inputs(torch, desc, seed, device="cuda"):
    """{name: torch tensor} for every graph input, seeded; index-like inputs (sequence
    lengths, ragged offsets, page tables) get values their op can use."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    decl = declared(desc)
    feeds = {}
    seq = {}
    for which, src in (("q", "q"), ("kv", "k")):
        if f"seq_len_{which}" in decl:
            b = decl[f"seq_len_{which}"][0][0]
            s = (
                decl[src][0][2]
                if src in decl
                else sdpa_kwargs(desc).get("paged_attention_max_seq_len_kv")
            )
            seq[which] = torch.randint(1, s + 1, (b,), generator=gen, dtype=torch.int32)
    for name, (dim, stride, dtype, pbv) in decl.items():
        tdt = _torch_dtype(torch, dtype)
        if pbv:
            value = next(v for k, v in SCALARS.items() if name.startswith(k))
            feeds[name] = torch.full(dim, value, dtype=tdt)
            continue
        if name.startswith("seq_len_"):
            v = seq[name[len("seq_len_") :]].reshape(dim)
        elif name.startswith("ragged_"):
            which = name[len("ragged_") :]
            h, d = decl["q" if which == "q" else "k"][0][1], decl["q"][0][3]
            v = torch.zeros(dim[0], dtype=torch.int32)
            v[1:] = torch.cumsum(seq[which] * h * d, 0)
            v = v.reshape(dim)
        elif name.endswith("_table"):
            b, _, per, _ = dim
            v = torch.randperm(b * per, generator=gen).to(torch.int32).reshape(dim)
        elif name == "stats":
            v = torch.randn(dim, generator=gen) * 0.5 + math.log(decl["k"][0][2])
        elif name in ("inv_var", "rv"):
            v = torch.rand(dim, generator=gen) + 0.5
        elif tdt.is_floating_point:
            v = torch.randn(dim, generator=gen) * 0.5
        else:
            v = torch.randint(0, 4, dim, generator=gen)
        buf = torch.empty_strided(dim, stride, dtype=tdt, device=device)
        feeds[name] = buf.copy_(v.to(tdt))
    return feeds


def unshadowed(desc):
    """`desc` with every op result that reuses a graph input's name renamed (the generator
    names a matmul's bias tensor and the bias op after the same counter): cg.build keys its
    env by these names, so the input's buffer would otherwise be bound to the op's result
    and the input left unbound. The packages see the same calls (a node's `name` kwarg is
    untouched); only the env key changes."""
    inputs, rename = set(desc.inputs), {}

    def swap(v):
        if isinstance(v, cg.Ref):
            return cg.Ref(rename.get(v.name, v.name))
        if isinstance(v, tuple | list):
            return type(v)(swap(x) for x in v)
        return v

    def fresh(name):
        if name in inputs:  # later references mean this result, under its new key
            rename[name] = f"{name}~"
            return rename[name]
        return name

    calls = []
    for c in desc.calls:
        call = dataclasses.replace(
            c,
            target=rename.get(c.target, c.target),
            args=swap(c.args),
            kwargs=tuple((k, swap(v)) for k, v in c.kwargs),
        )
        if c.target is None and c.method != "tensor" and c.outs is not None:
            outs = c.outs
            outs = fresh(outs) if isinstance(outs, str) else tuple(o and fresh(o) for o in outs)
            call = dataclasses.replace(call, outs=outs)
        calls.append(call)
    outputs = tuple(rename.get(o, o) for o in desc.outputs)
    return dataclasses.replace(desc, calls=tuple(calls), outputs=outputs)


def callback_scalars(desc):
    """The values of the pass-by-value scalars a score_mod callback creates (a
    ("scale", v) step): no tensor() call declares them, so no feed binds them."""
    values = []
    for c in desc.calls:
        for _, v in c.kwargs:
            if isinstance(v, cg.ScoreMod):
                values += [op[1] for op in v.ops if isinstance(op, tuple)]
    return values


def _operand_uids(name, graph):
    """The uids the package's planned graph asks the caller to fill."""
    if name == "ours":
        from cudnn_pygraph.runtime.execute import GraphLayout

        return [t.uid for t in GraphLayout(graph).tensors]
    return list(graph._variant_pack_uids() or [])


def _uid(t):
    return t.get_uid() if hasattr(t, "get_uid") else t.uid


def _empty_like(torch, t):
    dt = _torch_dtype(torch, t.data_type.name)
    buf = torch.empty_strided(tuple(t.dim), tuple(t.stride), dtype=dt, device="cuda")
    return buf.fill_(float("nan")) if buf.is_floating_point() else buf.zero_()


def _classic_build(graph, module):
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([module.heur_mode.A, module.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()


def _plan_list(name, graph):
    return graph.plans if name == "ours" else graph._plans


def _run_plan(torch, graph, index, pack):
    graph.build_plan_at_index(index)
    size = graph.get_workspace_size_plan_at_index(index)
    ws = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
    graph.execute_plan_at_index(pack, ws, index)
    torch.cuda.synchronize()


def _same_bits(a, b):
    same = a == b
    if a.is_floating_point():
        same |= a.isnan() & b.isnan()
    return bool(same.all())


def _within(torch, out, ref, dtype):
    """(ok, worst |diff| / allowed) of a python plan's output against the backend's, where
    the backend wrote a finite value."""
    atol, rtol = TOLERANCE.get(dtype, (0.0, 0.0))
    o, r = out.double(), ref.double()
    mask = torch.isfinite(r)
    if not mask.any():
        return True, 0.0
    allowed = atol + rtol * r[mask].abs()
    ratio = float(((o[mask] - r[mask]).abs() / allowed).nan_to_num(float("inf")).max())
    return ratio <= 1.0, ratio


def gpu_record(seed):
    """Everything the GPU differential records of one graph (a JSON-able dict)."""
    import torch

    from cudnn_pygraph.planning import engine_ids

    desc = cg.generate(seed)
    rec = {"seed": seed, "family": desc.family}
    lowered, outcomes = {}, {}
    for name in cd.packages():
        outcome, _, _ = cd.run(name, desc, deviceless=False)
        rec[f"verdict_{name}"] = outcome.verdict
        rec[f"message_{name}"] = outcome.message[:300]
        lowered[name], outcomes[name] = outcome.lowered, outcome
    rec["verdicts_agree"] = cd.same_verdict(outcomes["ours"], outcomes["nvidia"])
    if lowered["ours"] is not None and lowered["nvidia"] is not None:
        rec["lowered_diffs"] = sorted(
            {d[0] for d in cd.differences(lowered["ours"], lowered["nvidia"])}
        )
    if not (rec["verdict_ours"] == rec["verdict_nvidia"] == "ok"):
        return rec
    # fresh graphs for the plans: the verdict's graphs carry the harness's own lowering
    graphs, envs, bound = {}, {}, unshadowed(desc)
    for name, module in cd.packages().items():
        graphs[name], envs[name] = cg.build(module, bound, deviceless=False)
        try:
            _classic_build(graphs[name], module)
            rec[f"build_{name}"] = "ok"
        except Exception as exc:  # noqa: BLE001 — recorded, compared
            rec[f"build_{name}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if not (rec["build_ours"] == rec["build_nvidia"] == "ok"):
        return rec
    feeds = make_inputs(torch, desc, seed)
    ours = graphs["ours"]
    out_t = {n: envs["ours"][n] for n in bound.outputs}
    outs, packs = {}, {}
    scalars = callback_scalars(desc)
    for name in cd.packages():
        outs[name] = {n: _empty_like(torch, t) for n, t in out_t.items()}
        env = envs[name]
        pack = {env[n]: v for n, v in feeds.items() if n in env}
        pack.update({env[n]: v for n, v in outs[name].items()})
        # a callback's scalar is no env entry: bound by uid, the one the package asks for
        unbound = sorted(set(_operand_uids(name, graphs[name])) - {_uid(t) for t in pack})
        if len(unbound) == len(scalars):
            pack.update(
                {
                    u: torch.full((1, 1, 1, 1), v, dtype=torch.float32)
                    for u, v in zip(unbound, scalars)
                }
            )
        packs[name] = pack
        first = [
            i
            for i, p in enumerate(_plan_list(name, graphs[name]))
            if getattr(p, "cpp_index", None) == 0
        ]
        if not first:
            rec[f"backend_plan_{name}"] = "no plan with backend index 0"
            return rec
        try:
            _run_plan(torch, graphs[name], first[0], pack)
            rec[f"backend_plan_{name}"] = "ok"
        except Exception as exc:  # noqa: BLE001
            rec[f"backend_plan_{name}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return rec
    rec["bitwise"] = {n: _same_bits(outs["ours"][n], outs["nvidia"][n]) for n in out_t}
    reference = {n: b.clone() for n, b in outs["ours"].items()}
    rec["python_plans"] = []
    for i, plan in enumerate(ours.plans):
        if engine_ids.is_backend_id(plan.engine_id):
            continue
        label = ours.get_plan_name_at_index(i)
        for b in outs["ours"].values():
            b.fill_(float("nan")) if b.is_floating_point() else b.zero_()
        try:
            _run_plan(torch, ours, i, packs["ours"])
        except Exception as exc:  # noqa: BLE001 — a python plan that fails to build or run
            rec["python_plans"].append(
                {"plan": label, "status": f"{type(exc).__name__}: {str(exc)[:200]}"}
            )
            continue
        verdicts = {}
        for n, t in out_t.items():
            ok, ratio = _within(torch, outs["ours"][n], reference[n], t.data_type.name)
            verdicts[n] = {"ok": ok, "ratio": round(ratio, 3)}
        rec["python_plans"].append({"plan": label, "status": "ran", "outputs": verdicts})
    first = {
        name: next(
            i for i, p in enumerate(_plan_list(name, g)) if getattr(p, "cpp_index", None) == 0
        )
        for name, g in graphs.items()
    }
    rec["larger_buffers"] = _rebound_run(
        torch, graphs, first, feeds, outs, envs, packs, _larger_compact
    )
    rec["same_size_dtypes"] = _rebound_run(
        torch, graphs, first, feeds, outs, envs, packs, _same_size_dtype
    )
    if seed % MANUAL_EVERY == 0:  # a loop over every engine's configs: not every graph
        rec["manual_plans"] = _manual_plans(bound)
    return rec


# ---------------------------------------------------------------- the classic's leniencies
# Each probe asks both packages the same thing; a record says what each did.
def _larger_compact(torch, buf):
    """A compact buffer of OTHER extents, twice the declared bytes, in a non-row-major
    order (a transposed (2, n) block), holding `buf`'s elements in the declared layout at
    its start: what the classic reads the declared extent from."""
    if buf.device.type != "cuda" or buf.numel() == 0:
        return buf
    span = 1 + sum((e - 1) * s for e, s in zip(buf.shape, buf.stride()))
    block = torch.empty(2 * span, dtype=buf.dtype, device=buf.device)
    block.as_strided(buf.shape, buf.stride()).copy_(buf)
    return block.view(2, span).t()


def _same_size_dtype(torch, buf):
    """The same bits under the other 16-bit float dtype (bf16 <-> fp16)."""
    other = {torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}.get(buf.dtype)
    return buf if other is None or buf.device.type != "cuda" else buf.view(other)


def _rebound_run(torch, graphs, first, feeds, outs, envs, packs, rebind):
    """Backend plan 0 of each package run again with every graph input rebound through
    `rebind`: {package: "ok" or the error, "bitwise": the outputs equal the first run's
    in both}, or None when `rebind` changes nothing for this graph."""
    if all(rebind(torch, v) is v for v in feeds.values()):
        return None
    out = {"bitwise": True}
    for name, g in graphs.items():
        env, saved = envs[name], {n: b.clone() for n, b in outs[name].items()}
        pack = dict(packs[name])
        pack.update({env[n]: rebind(torch, v) for n, v in feeds.items() if n in env})
        for b in outs[name].values():
            b.fill_(float("nan")) if b.is_floating_point() else b.zero_()
        try:
            _run_plan(torch, g, first[name], pack)
            out[name] = "ok"
            out["bitwise"] &= all(_same_bits(outs[name][n], saved[n]) for n in saved)
        except Exception as exc:  # noqa: BLE001 — recorded, compared
            out[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            out["bitwise"] = False
        for n, b in saved.items():
            outs[name][n].copy_(b)
    return out


def _manual_plans(desc):
    """NVIDIA's manual loop (test_conv_bias.py) on fresh graphs of each package: every
    engine of range(get_engine_count()), every KERNEL_CFG value; then check_support and
    build_plans. {package: (backend engine ids listed, "ok" or the error)}."""
    out = {}
    for name, module in cd.packages().items():
        g, _ = cg.build(module, desc, deviceless=False)
        try:
            g.validate()
            g.build_operation_graph()
            for engine in range(g.get_engine_count()):
                try:
                    knobs = g.get_knobs_for_engine(engine)
                except RuntimeError:
                    continue
                for knob in knobs:
                    if knob.type.name != "KERNEL_CFG":
                        continue
                    for cfg in range(knob.min_value, knob.max_value + 1, knob.stride or 1):
                        try:
                            g.create_execution_plan(engine, {knob.type: cfg})
                        except RuntimeError:
                            continue
            listed = [
                g.get_engine_and_knobs_at_index(i)[0] for i in range(g.get_execution_plan_count())
            ]
            g.check_support()
            g.build_plans()
            out[name] = (listed, "ok")
        except Exception as exc:  # noqa: BLE001 — recorded, compared
            out[name] = (None, f"{type(exc).__name__}: {str(exc)[:200]}")
    return out
