"""The differential between NVIDIA's `cudnn` and `cudnn_pygraph` on one classic graph,
up to what a machine without a GPU can answer: each package's verdict (which call raised
what, or validated) and the backend graph each lowers to, compared as the backend's own
JSON (`repr()` of the frontend's backend_graph).

The lowered JSON is compared field by field with tensors named by role, not by uid: a
tensor by the first node port that writes it ("#3.O": node 3's port O), else by the first
that reads it ("#0<EPSILON"), a ragged offset by the tensor it offsets ("#0<Q~ragged_offset"),
and a ragged_offset_name field holds that role. uids are compared as a field of their own, so a renumbering shows as one
difference, not as every tensor differing. Each difference has a signature without
values or names ("SDPA.generate_stats", "tensor.data_type"): signatures group graphs into
causes (tests/backend/test_classic_differential_cpu.py, tools/classic_differential.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import classic_graphs as cg

# fields of the backend's JSON that say which build made it, not what the graph is
_BUILD_FIELDS = ("gid", "cudnn_backend_version", "cudnn_frontend_version", "json_version")


@dataclasses.dataclass
class Outcome:
    """One package's answer: `stage` is where it stopped ("build": one of the calls
    raised; "validate"; "lower": validate passed but the backend graph could not be made;
    "ok"), `error` the exception's type name and message."""

    stage: str
    error: str = ""
    message: str = ""
    lowered: dict | None = None
    error_bases: tuple = ()  # the type names of the exception's classes, itself first

    @property
    def verdict(self):
        return self.stage if self.stage == "ok" else f"{self.stage}:{self.error}"

    def __str__(self):
        return "ok" if self.stage == "ok" else f"{self.stage}: {self.error}: {self.message[:300]}"


@functools.cache
def packages():
    """{"nvidia": cudnn, "ours": cudnn_pygraph}; NVIDIA's lowering asks the driver for a
    default handle, which a machine without a GPU lacks: there it lowers handle-less (the
    backend graph needs no handle up to validate(), the way ours lowers)."""
    import cudnn

    import cudnn_pygraph

    if not _has_gpu():
        cudnn._pygraph.pygraph._backend_handle_for_lowering = lambda self, kwargs: None
    return {"nvidia": cudnn, "ours": cudnn_pygraph}


def _has_gpu():
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _lowered_json(name, graph):
    """The backend graph a validated graph lowers to, as JSON (a dict)."""
    if name == "ours":
        from cudnn_pygraph.backend import lowering

        backend = lowering.lowered(graph).backend
    else:
        backend = graph._lowered_graph
        if backend is None:  # validated natively by a python family: lower it here
            backend = graph._lower_to_cpp()
            backend.validate()
    return json.loads(repr(backend))


def run(name, desc, *, deviceless=True):
    """(Outcome, graph or None, {name: tensor}) of `desc` through package `name`."""
    module = packages()[name]
    try:
        graph, env = cg.build(module, desc, deviceless=deviceless)
    except Exception as exc:  # noqa: BLE001 — the outcome records what any call raised
        return _failed("build", exc), None, {}
    try:
        graph.validate()
    except Exception as exc:  # noqa: BLE001
        return _failed("validate", exc), graph, env
    try:
        lowered = _lowered_json(name, graph)
    except Exception as exc:  # noqa: BLE001
        return _failed("lower", exc), graph, env
    return Outcome("ok", lowered=lowered), graph, env


def _failed(stage, exc):
    bases = tuple(k.__name__ for k in type(exc).__mro__)
    return Outcome(stage, type(exc).__name__, str(exc), error_bases=bases)


# ---------------------------------------------------------------- comparing lowered graphs
def canonical(doc):
    """The backend JSON with tensors keyed by role and uids as a field: {"context",
    "nodes": [{...}], "tensors": {role: {...}}}."""
    tensors = {t["uid"]: t for t in doc.get("tensors", [])}
    role = {}
    nodes = doc.get("nodes", [])
    for i, node in enumerate(nodes):  # what a node writes, then what a node reads
        for port, uid in sorted(node.get("outputs", {}).items()):
            role.setdefault(uid, f"#{i}.{port}")
    for i, node in enumerate(nodes):
        for port, uid in sorted(node.get("inputs", {}).items()):
            role.setdefault(uid, f"#{i}<{port}")
    by_name = {t.get("name"): uid for uid, t in tensors.items()}
    for uid, t in tensors.items():  # a ragged offset: by the first tensor it offsets
        ragged = by_name.get(t.get("ragged_offset_name"))
        if ragged is not None and uid in role:
            role.setdefault(ragged, f"{role[uid]}~ragged_offset")
    for uid, t in tensors.items():
        role.setdefault(uid, f"tensor:{t.get('name')}")
    tensors = {
        uid: dict(t, ragged_offset_name=role.get(by_name.get(t["ragged_offset_name"])))
        if t.get("ragged_offset_name") is not None
        else t
        for uid, t in tensors.items()
    }
    nodes = []
    for node in doc.get("nodes", []):
        n = dict(node)
        for side in ("inputs", "outputs"):
            n[side] = {p: role.get(u, u) for p, u in sorted(node.get(side, {}).items())}
        nodes.append(n)
    ctx = {k: v for k, v in doc.items() if k not in _BUILD_FIELDS + ("nodes", "tensors")}
    return {"context": ctx, "nodes": nodes, "tensors": {role[u]: t for u, t in tensors.items()}}


def differences(ours, nvidia):
    """[(signature, path, ours, nvidia)] between two lowered JSON docs."""
    a, b = canonical(ours), canonical(nvidia)
    out = []
    _diff_dict(out, "context", "context", a["context"], b["context"])
    if len(a["nodes"]) != len(b["nodes"]):
        out.append(("node count", "nodes", len(a["nodes"]), len(b["nodes"])))
    for na, nb in zip(a["nodes"], b["nodes"]):
        tag = nb.get("tag", "?")
        _diff_dict(out, tag, f"node {nb.get('name')}", na, nb)
    for role in sorted(set(a["tensors"]) | set(b["tensors"])):
        ta, tb = a["tensors"].get(role), b["tensors"].get(role)
        if ta is None or tb is None:
            out.append(("tensor presence", f"tensor {role}", ta is not None, tb is not None))
            continue
        if role.startswith("#") and "." in role:
            kind = "virtual" if tb.get("is_virtual") else "output"
        else:
            kind = "scalar" if tb.get("is_pass_by_value") else "input"
        _diff_dict(out, f"tensor({kind})", f"tensor {role}", ta, tb)
    return out


def is_name(signature):
    """A difference in a name only (a tensor's, a node's, a ragged offset's)."""
    return signature.endswith("name")


def _diff_dict(out, sig, path, a, b):
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
        if va != vb:
            out.append((f"{sig}.{key}", f"{path}.{key}", va, vb))


# ---------------------------------------------------------------- one graph, both packages
def same_verdict(ours, nvidia):
    """The same stage, and ours raised NVIDIA's error type or a subclass of a class of that
    name (an `except` written for NVIDIA's error catches ours). Outcomes of run()."""
    if ours.stage != nvidia.stage:
        return False
    return ours.stage == "ok" or nvidia.error in ours.error_bases


@dataclasses.dataclass
class Result:
    desc: cg.GraphDesc
    ours: Outcome
    nvidia: Outcome
    diffs: list

    @property
    def verdicts_agree(self):
        return same_verdict(self.ours, self.nvidia)

    @property
    def lowered_equal(self):
        return self.ours.stage == self.nvidia.stage == "ok" and not self.diffs

    @property
    def agree(self):
        return self.verdicts_agree and not self.diffs

    def findings(self):
        """Each disagreement on its own line, values and names left out, so a pattern can
        match one known class without hiding a new one beside it: "verdict ours=V
        nvidia=V | <ours' message> | <nvidia's message>" or "lowered <signature>".
        [] when the packages agree."""
        if not self.verdicts_agree:
            return [
                (
                    f"verdict ours={self.ours.verdict} nvidia={self.nvidia.verdict} | "
                    f"{self.ours.message[:200]} | {self.nvidia.message[:200]}"
                )
            ]
        return sorted({f"lowered {d[0]}" for d in self.diffs})

    def causes(self):
        """The disagreement's classes for a summary: the verdict pair, or the
        difference signatures, names apart from the rest (a graph whose only difference
        is a name has one cause; one with both has two). [] when the packages agree."""
        if not self.verdicts_agree:
            return [f"verdict ours={self.ours.verdict} nvidia={self.nvidia.verdict}"]
        names = sorted({d[0] for d in self.diffs if is_name(d[0])})
        rest = sorted({d[0] for d in self.diffs if not is_name(d[0])})
        return [f"lowered {', '.join(sig)}" for sig in (rest, names) if sig]

    def report(self):
        lines = [f"ours:   {self.ours}", f"nvidia: {self.nvidia}"]
        shown = [d for d in self.diffs if not is_name(d[0])] or self.diffs
        lines += [f"  {path}: ours={_short(a)} nvidia={_short(b)}" for _, path, a, b in shown[:8]]
        return "\n".join(lines)


def _short(v):
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 80 else text[:77] + "..."


def compare(desc):
    ours, _, _ = run("ours", desc)
    nvidia, _, _ = run("nvidia", desc)
    diffs = []
    if ours.lowered is not None and nvidia.lowered is not None:
        diffs = differences(ours.lowered, nvidia.lowered)
    return Result(desc, ours, nvidia, diffs)


# ---------------------------------------------------------------- the open disagreement classes
# The classes of disagreement still open, found by this differential (the CI test xfails
# each until it is gone; tools/classic_differential.py groups its findings by them).
# id -> (family pattern, finding pattern, reason). A finding is one line of
# classic_diff.Result.findings(): "verdict ours=... nvidia=... | <ours> | <nvidia>" or
# "lowered <signature>".
KNOWN = {
    "sdpa-declared-output-dims": (
        r"sdpa_.*!",
        r"verdict ours=validate:IllFormedError nvidia=ok \| .*: (O|dQ|dK|dV): declared dims",
        (
            "with a hostile q / k / v (an extent doubled) the caller's O / dQ / dK / dV keep dims "
            "the attention does not produce: NVIDIA's validate() and its backend's validate() "
            "accept the declaration (planning judges it); ours refuses it at validate(), kept on "
            "purpose: our python SDPA engines size what they write by q / k / v, so a graph whose "
            "outputs contradict them must not reach one (structured ops, which only the backend "
            "runs, keep the caller's dims as NVIDIA's do)"
        ),
    ),
    "batchnorm-none-running-stats": (
        r"norm_batchnorm",
        (
            r"verdict ours=\S+ nvidia=validate:TypeError \| .* \| "
            r"batchnorm\(\): incompatible function arguments"
        ),
        (
            "batchnorm training without running statistics (in_running_mean=None, "
            "in_running_var=None, momentum=None) is refused by NVIDIA's validate() with a "
            "TypeError about its own binding's signature: its lowering leaves out the Nones its "
            "batchnorm binding needs passed. A bug of NVIDIA's, not a rule: ours keeps the "
            "classic meaning (no running statistics) and lowers it (the backend accepts it)"
        ),
    ),
}


def known_class(family, finding):
    """The KNOWN id a finding of a graph of `family` belongs to, or None (a new one)."""
    for key, (fam, pattern, _) in KNOWN.items():
        if re.match(fam, family) and re.match(pattern, finding):
            return key
    return None
