"""The classic differential: random classic graphs (tests/backend/classic_graphs.py) built
through NVIDIA's `cudnn` and through `cudnn_pygraph` with the same calls.

On the GPU, per graph:
  * verdict: the same call raises the same error type, or validate() passes in both;
  * lowered: both lower to the same backend graph (the backend's JSON, classic_diff.py);
  * build: our classic build sequence (build_operation_graph, create_execution_plans
    [A, FALLBACK], check_support, build_plans) succeeds where NVIDIA's does;
  * bitwise: the backend's first plan (C++ plan index 0) of each package, executed on the
    same inputs, writes the same bits to every output (NaN equal to NaN);
  * python plans: every python plan of ours that builds agrees with our backend plan on
    every output it writes (Stats, score_max, score_sum_exp included), within the output
    dtype's tolerance (TOLERANCE);
  * the classic's leniencies: backend plan 0 run again with every input rebound to a
    larger compact buffer (other extents, the declared layout at its start), then with
    16-bit float inputs rebound as the other 16-bit float (same bits): each package
    accepts or refuses alike, and what runs writes the first run's bits; and NVIDIA's
    manual plan loop (get_engine_count, get_knobs_for_engine, create_execution_plan per
    KERNEL_CFG) on fresh graphs lists the same engines and builds alike.
Without a GPU (--cpu) only the first two run, over more graphs.

    PYTHONPATH=$PWD/src:$PWD/tests python bench/classic_differential.py \\
        [--graphs 2400] [--budget-s 240] [--workers 14] [--out bench/results/classic_differential.md]
    PYTHONPATH=$PWD/src python bench/classic_differential.py --cpu --graphs 2400

Graphs run in `--workers` subprocesses (seed i goes to worker i % workers); a worker that
dies (a sticky CUDA error) is restarted after the graph it died on, which is recorded.
The page keeps the other mode's section: a GPU run and a CPU run live side by side.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import math
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "backend"))

import classic_diff as cd
import classic_graphs as cg

OUT = ROOT / "bench" / "results" / "classic_differential.md"
# (atol, rtol) of a python plan's output against the backend plan's, per output dtype
TOLERANCE = {"FLOAT": (2e-3, 2e-3), "HALF": (2e-2, 2e-2), "BFLOAT16": (6e-2, 6e-2)}
# pass-by-value scalars by name prefix (the generator's names): host values
# NVIDIA's manual plan loop runs on every MANUAL_EVERY-th graph (it creates a plan per
# engine and KERNEL_CFG value)
MANUAL_EVERY = 4
# how long past the budget a worker may finish its graph before it is killed
GRACE_S = 30
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


# ---------------------------------------------------------------- the CPU half
def cpu_run(seeds):
    return [cd.compare(cg.generate(seed)) for seed in seeds]


def cpu_section(results, seconds, command):
    fams = collections.Counter(_row(r) for r in results)
    agree = collections.Counter(_row(r) for r in results if r.agree)
    agree_names_apart = collections.Counter(_row(r) for r in results if _agree_names_apart(r))
    verdict = sum(r.verdicts_agree for r in results)
    both_ok = sum(r.ours.stage == r.nvidia.stage == "ok" for r in results)
    equal = sum(r.lowered_equal for r in results)
    names_apart = sum(_agree_names_apart(r) and r.ours.stage == "ok" for r in results)
    lines = [
        "## CPU run",
        "",
        f"{_today()}, {_versions()}. Command: `{command}` ({seconds:.0f} s).",
        "",
        (
            f"{len(results)} graphs; the same verdict from both packages: {verdict}; both lowered: {both_ok}, "
            f"of which to an equal backend graph: {equal}, and equal but for tensor names: {names_apart}."
        ),
        "",
        "| family | graphs | agree fully | agree but for tensor names |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {f} | {fams[f]} | {agree[f]} | {agree_names_apart[f]} |" for f in sorted(fams)]
    lines += [
        "",
        "### Disagreements by class (most graphs first)",
        "",
        "A class is an entry of classic_diff.KNOWN (its reason follows the id) or, for a",
        "disagreement no entry covers, `new:` and the finding without its messages.",
        "",
    ]
    lines += _causes(results, _classes, lambda r: r.report())
    return "\n".join(lines)


def _classes(result):
    out = []
    for f in result.findings():
        key = cd.known_class(result.desc.family, f)
        out.append(f"{key}: {cd.KNOWN[key][2]}" if key else f"new: {f.split(' | ')[0]}")
    return sorted(set(out))


def _row(result):
    """The table row of a graph: its family, hostile graphs (classic_graphs.mutate) apart."""
    family, hostile, _ = result.desc.family.partition("!")
    return f"{family} (hostile input)" if hostile else family


def _agree_names_apart(r):
    return r.verdicts_agree and not [d for d in r.diffs if not cd.is_name(d[0])]


def _causes(results, causes_of, report_of, limit=40):
    by_cause = collections.defaultdict(list)
    for r in results:
        for c in causes_of(r):
            by_cause[c].append(r)
    lines = []
    for i, (cause, rs) in enumerate(sorted(by_cause.items(), key=lambda kv: -len(kv[1]))[:limit]):
        fams = collections.Counter(r.desc.family for r in rs)
        first = rs[0]
        spread = ", ".join(f"{f} {n}" for f, n in fams.most_common())
        lines += [
            f"{i + 1}. **{cause}**: {len(rs)} graphs ({spread}); e.g. `{first.desc.name}`:",
            "",
            "   ```",
            *("   " + ln for ln in first.desc.describe().splitlines()),
            *("   " + ln for ln in report_of(first).splitlines()),
            "   ```",
            "",
        ]
    if len(by_cause) > limit:
        lines.append(f"... and {len(by_cause) - limit} rarer causes.")
    return lines or ["none"]


# ---------------------------------------------------------------- the GPU half: one graph
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


def worker(start, step, count, deadline, out_path):
    """Graphs start, start+step, ... (count of them) until the deadline, one JSON line
    each, flushed as it is written (the parent restarts a worker that dies)."""
    with open(out_path, "a") as f:
        for k in range(count):
            if time.time() > deadline:
                break
            seed = start + k * step
            try:
                rec = gpu_record(seed)
            except Exception as exc:  # noqa: BLE001 — the harness's own failure on this graph
                rec = {
                    "seed": seed,
                    "family": cg.generate(seed).family,
                    "harness_error": f"{type(exc).__name__}: {str(exc)[:300]}",
                }
            f.write(json.dumps(rec) + "\n")
            f.flush()


def gpu_run(graphs, workers, budget_s):
    """[record] of up to `graphs` graphs in `workers` subprocesses within budget_s."""
    deadline = time.time() + budget_s
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="classic_diff_"))
    per = -(-graphs // workers)
    slots = {
        w: {"next": w, "left": per, "proc": None, "file": tmp / f"w{w}.jsonl"}
        for w in range(workers)
    }
    crashed = []

    def launch(w):
        s = slots[w]
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            str(s["next"]),
            str(workers),
            str(s["left"]),
            str(deadline),
            str(s["file"]),
        ]
        s["proc"] = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    for w in slots:
        launch(w)
    while any(s["proc"] is not None for s in slots.values()):
        time.sleep(0.5)
        for w, s in slots.items():
            p = s["proc"]
            if p is not None and p.poll() is None and time.time() > deadline + GRACE_S:
                p.kill()  # one graph past the budget (a hung compile): its record is lost
            if p is None or p.poll() is None:
                continue
            s["proc"] = None
            done = _read_lines(s["file"])
            seen = {r["seed"] for r in done}
            k = 0
            while s["next"] + k * workers in seen:
                k += 1
            if p.returncode != 0 and time.time() < deadline and k < s["left"]:
                dead = s["next"] + k * workers
                crashed.append(
                    {
                        "seed": dead,
                        "family": cg.generate(dead).family,
                        "harness_error": f"worker died (rc {p.returncode}): {p.stderr.read()[-300:]}",
                    }
                )
                s["next"], s["left"] = dead + workers, s["left"] - k - 1
                launch(w)
    records = crashed
    for s in slots.values():
        records += _read_lines(s["file"])
    return sorted(records, key=lambda r: r["seed"])


def _tail(jsonl):
    try:
        return jsonl.with_suffix(".err").read_text()[-300:]
    except OSError:
        return ""


def _read_lines(path):
    try:
        return [json.loads(ln) for ln in pathlib.Path(path).read_text().splitlines() if ln.strip()]
    except OSError:
        return []


# ---------------------------------------------------------------- the GPU report
def gpu_findings(rec):
    """One line per disagreement of a GPU record ([] when none); verdict and lowered lines
    in classic_diff.Result.findings()'s form, so classic_diff.KNOWN classifies them."""
    out = []
    if "harness_error" in rec:
        return [f"harness: {rec['harness_error'][:120]}"]
    if not rec["verdicts_agree"]:
        out.append(
            f"verdict ours={rec['verdict_ours']} nvidia={rec['verdict_nvidia']} | "
            f"{rec['message_ours'][:200]} | {rec['message_nvidia'][:200]}"
        )
    out += [f"lowered {d}" for d in rec.get("lowered_diffs") or []]
    if "build_ours" in rec and (rec["build_ours"] == "ok") != (rec["build_nvidia"] == "ok"):
        out.append(f"build ours={rec['build_ours'][:80]} nvidia={rec['build_nvidia'][:80]}")
    for name in ("ours", "nvidia"):
        v = rec.get(f"backend_plan_{name}")
        if v not in (None, "ok"):
            out.append(f"backend plan {name}: {v[:100]}")
    if rec.get("bitwise") and not all(rec["bitwise"].values()):
        out.append(
            "backend outputs differ in bits: "
            + ", ".join(n for n, ok in rec["bitwise"].items() if not ok)
        )
    for p in rec.get("python_plans", []):
        if p["status"] != "ran":
            continue
        bad = [f"{n} x{v['ratio']}" for n, v in p["outputs"].items() if not v["ok"]]
        if bad:
            out.append(f"python plan {p['plan'].split('[')[0]} off the backend: " + ", ".join(bad))
    for probe in ("larger_buffers", "same_size_dtypes"):
        r = rec.get(probe)
        if r and (r.get("ours") != r.get("nvidia") or not r["bitwise"]):
            out.append(
                f"{probe}: ours={r.get('ours', '')[:80]} nvidia={r.get('nvidia', '')[:80]} "
                f"bitwise={r['bitwise']}"
            )
    manual = rec.get("manual_plans")
    if manual and manual["ours"] != manual["nvidia"]:
        out.append(f"manual plans: ours={manual['ours']} nvidia={manual['nvidia']}"[:300])
    return out


def gpu_section(records, seconds, command):
    both_valid = [r for r in records if r.get("verdict_ours") == r.get("verdict_nvidia") == "ok"]
    lowered_equal = sum(
        not [d for d in (r.get("lowered_diffs") or []) if not cd.is_name(d)] for r in both_valid
    )
    built = [r for r in both_valid if "build_ours" in r]
    same_build = sum((r["build_ours"] == "ok") == (r["build_nvidia"] == "ok") for r in built)
    both_built = sum(r["build_ours"] == r["build_nvidia"] == "ok" for r in built)
    executed = [r for r in records if r.get("bitwise")]
    bitwise = sum(all(r["bitwise"].values()) for r in executed)
    py = [p for r in records for p in r.get("python_plans", [])]
    py_ran = [p for p in py if p["status"] == "ran"]
    py_ok = sum(all(v["ok"] for v in p["outputs"].values()) for p in py_ran)
    verdicts = sum(bool(r.get("verdicts_agree")) for r in records)

    def probe_row(key):
        tried = [r[key] for r in records if r.get(key)]
        same = sum(p.get("ours") == p.get("nvidia") and p["bitwise"] for p in tried)
        ran = sum(p.get("nvidia") == "ok" for p in tried)
        return f"{same} of {len(tried)} (NVIDIA's ran {ran})"

    manual = [r["manual_plans"] for r in records if r.get("manual_plans")]
    manual_same = sum(m["ours"] == m["nvidia"] for m in manual)
    harness = sum("harness_error" in r for r in records)
    lines = [
        "## GPU run",
        "",
        f"{_today()}, {_versions()}. Command: `{command}` ({seconds:.0f} s).",
        "",
        "| what | count |",
        "| --- | --- |",
        f"| graphs tried | {len(records)} |",
        f"| same validate() verdict (ours raised the classic type or a subclass) | {verdicts} |",
        f"| both validated: equal lowered graph (names apart) | {lowered_equal} of {len(both_valid)} |",
        f"| same build outcome (both built) | {same_build} of {len(built)} ({both_built}) |",
        f"| backend plans run in both: bitwise-equal outputs | {bitwise} of {len(executed)} |",
        f"| python plans tried / ran / within tolerance on every output | {len(py)} / {len(py_ran)} / {py_ok} |",
        f"| inputs rebound to larger compact buffers: same outcome, same bits | {probe_row('larger_buffers')} |",
        f"| 16-bit float inputs rebound as the other 16-bit float: same outcome, same bits | {probe_row('same_size_dtypes')} |",
        f"| NVIDIA's manual KERNEL_CFG loop: same engines listed, same outcome | {manual_same} of {len(manual)} |",
        f"| harness errors (a worker died, or the harness failed on a graph) | {harness} |",
        "",
        "### Disagreements by cause",
        "",
    ]

    class _R:  # the shape _causes() reads
        def __init__(self, rec):
            self.rec, self.desc = rec, cg.generate(rec["seed"])

    def report(r):
        rec = r.rec
        keys = (
            "verdict_ours",
            "message_ours",
            "verdict_nvidia",
            "message_nvidia",
            "build_ours",
            "build_nvidia",
            "backend_plan_ours",
            "backend_plan_nvidia",
            "bitwise",
            "harness_error",
        )
        text = [f"{k}: {rec[k]}" for k in keys if rec.get(k) not in (None, "")]
        text += [
            f"python plan {p['plan']}: {p['status']} {p.get('outputs', '')}"
            for p in rec.get("python_plans", [])
        ]
        return "\n".join(text)

    def classes(r):
        out = set()
        for f in gpu_findings(r.rec):
            key = cd.known_class(r.rec["family"], f)
            out.add(f"{key}: {cd.KNOWN[key][2]}" if key else f"new: {f.split(' | ')[0]}")
        return sorted(out)

    lines += _causes([_R(r) for r in records], classes, report)
    return "\n".join(lines)


# ---------------------------------------------------------------- the page
def _today():
    return datetime.date.today().isoformat()


def _versions():
    parts = []
    try:
        import cudnn

        parts.append(
            f"nvidia-cudnn-frontend {cudnn.__version__}, libcudnn {cudnn.backend_version()}"
        )
    except Exception as exc:  # noqa: BLE001 — a version line, not a requirement
        parts.append(f"cudnn: {type(exc).__name__}")
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        parts.append(f"torch {torch.__version__}, {gpu}")
    except ImportError:
        parts.append("torch absent")
    return "; ".join(parts)


HEADER = """# Classic differential: NVIDIA's `cudnn` vs `cudnn_pygraph` on random classic graphs

Graphs from tests/backend/classic_graphs.py (seeded: graph `<family>-<seed>` is
`classic_graphs.generate(seed)`), compared by bench/classic_differential.py (see its
docstring for what each count means). The CI test tests/backend/test_classic_differential_cpu.py
holds the CPU half: its KNOWN table is the list of disagreement classes still open.
"""


def write_page(path, section):
    """Replace this mode's section of the page, keeping the other mode's."""
    path = pathlib.Path(path)
    old = path.read_text() if path.exists() else ""
    sections = {}
    for chunk in ("\n" + old).split("\n## ")[1:]:
        title = chunk.split("\n", 1)[0]
        sections[title] = "## " + chunk.rstrip() + "\n"
    title = section.split("\n", 1)[0][3:]
    sections[title] = section.rstrip() + "\n"
    order = [t for t in ("GPU run", "CPU run") if t in sections] + [
        t for t in sections if t not in ("GPU run", "CPU run")
    ]
    path.write_text(HEADER + "\n" + "\n".join(sections[t] for t in order))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        start, step, count, deadline, out = argv[1:6]
        worker(int(start), int(step), int(count), float(deadline), out)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="verdicts and lowered graphs only (no GPU)")
    p.add_argument("--graphs", type=int, default=2400)
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    command = "python bench/classic_differential.py " + " ".join(argv)
    t0 = time.monotonic()
    if args.cpu:
        results = cpu_run(range(args.graphs))
        section = cpu_section(results, time.monotonic() - t0, command)
    else:
        records = gpu_run(args.graphs, args.workers, args.budget_s)
        section = gpu_section(records, time.monotonic() - t0, command)
    write_page(args.out, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
