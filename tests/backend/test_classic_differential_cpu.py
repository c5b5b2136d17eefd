"""The differential that keeps classic parity true, without a GPU: random classic graphs
(classic_graphs.py) built through NVIDIA's `cudnn` and through `cudnn_pygraph` with the
same calls must get the same verdict (the same call raising the same error type, or
validate() passing) and lower to the same backend graph (classic_diff.py compares the
backend's own JSON).

Each family must agree except for the KNOWN disagreement classes below; each known class
is an xfail (strict) that turns into a failure the day it is fixed, so the entry is then
deleted and the family held to full agreement. A new disagreement fails
test_family_agrees_but_for_known_classes with the graph's calls and both outcomes.
The GPU half (plans, bitwise outputs, python plans vs the backend) is
bench/classic_differential.py.
"""

import collections
import re

import pytest

cudnn_nv = pytest.importorskip("cudnn")

import classic_diff as cd
import classic_graphs as cg

from cudnn_pygraph.backend import lowering

if lowering.unavailable_reason() is not None:
    pytest.skip(
        f"the backend cannot lower here: {lowering.unavailable_reason()}", allow_module_level=True
    )

GRAPHS_PER_FAMILY = 100


# id -> (family pattern, finding pattern, reason). A finding is one line of
# classic_diff.Result.findings(): "verdict ours=... nvidia=... | <ours> | <nvidia>" or
# "lowered <signature>".
KNOWN = {
    "port-names": (
        r".*",
        r"lowered tensor\((output|virtual|scalar)\)\.name$",
        (
            "an op's output tensor is named '<node>::<port>' with our port names (output, mean, "
            "inv_variance) where NVIDIA's use the backend's (OUT_0, MEAN, INV_VARIANCE); a "
            "tensor_scalar gets a name where NVIDIA's has none"
        ),
    ),
    "sdpa-output-types-unset": (
        r"sdpa_",
        r"lowered (SDPA\.compute_data_type|tensor\(output\)\.data_type)$",
        (
            "sdpa / sdpa_backward lower their O / dQ / dK / dV without a data type and the node "
            "without compute_data_type; NVIDIA's lowering sets the io type and FLOAT"
        ),
    ),
    "tensor-scalar-float-is-float": (
        r"norm_",
        r"lowered tensor\(scalar\)\.data_type$",
        (
            "tensor_scalar(1e-5) lowers as a FLOAT scalar; NVIDIA's backend keeps a Python float "
            "as DOUBLE"
        ),
    ),
    "tuple-attr-lowered-as-list": (
        r"sdpa_",
        (
            r"verdict ours=(validate|lower):cudnnGraphNotSupportedError nvidia=ok \| .*"
            r"(dropout must be a tuple|bad_cast)"
        ),
        (
            "lowering.py _Builder.value turns the dropout tuple (p, seed, offset) into a list, "
            "which the backend's sdpa binding refuses"
        ),
    ),
    "score-mod-callable": (
        r"sdpa_fwd_score_mod",
        r"verdict ours=validate:cudnnGraphNotSupportedError nvidia=ok \| .*score_mod",
        "a score_mod callable is refused at lowering (uid namespace); NVIDIA's lowers it",
    ),
    "slice-output-type": (
        r"layout_slice",
        r"verdict ours=validate:cudnnGraphNotSupportedError nvidia=ok \| .*data types should match",
        (
            "a slice feeding another op gets the intermediate data type; the backend wants the "
            "input's (NVIDIA's sets it)"
        ),
    ),
    "concatenate-infers-dims": (
        r"layout_concatenate",
        r"verdict ours=ok nvidia=validate:ValueError \| .*dims not set",
        "concatenate's output dims are inferred by ours; NVIDIA's validate() wants them set",
    ),
    "sdpa-rules-at-lowering": (
        r"sdpa_",
        r"verdict ours=lower:cudnnGraphNotSupportedError nvidia=validate:cudnnGraphNotSupportedError",
        (
            "SDPA support rules (sliding window with s_q > s_kv; bottom-right causal with bias, "
            "alibi or dropout) pass our validate() and fail at lowering; NVIDIA's validate() "
            "refuses them"
        ),
    ),
    "batchnorm-none-running-stats": (
        r"norm_batchnorm",
        r"verdict ours=ok nvidia=validate:TypeError",
        (
            "batchnorm(in_running_mean=None, in_running_var=None, momentum=None) passes ours; "
            "NVIDIA's binding refuses the explicit Nones"
        ),
    ),
}


@pytest.fixture(scope="module")
def results():
    """{family: [Result]} over GRAPHS_PER_FAMILY seeds of each family."""
    out = collections.defaultdict(list)
    for family in cg.FAMILIES:
        for i in range(GRAPHS_PER_FAMILY):
            desc = cg.generate(i * len(cg.FAMILIES) + list(cg.FAMILIES).index(family), family)
            out[family].append(cd.compare(desc))
    return out


def known_class(result, finding):
    for key, (family, pattern, _) in KNOWN.items():
        if re.match(family, result.desc.family) and re.match(pattern, finding):
            return key
    return None


@pytest.mark.parametrize("family", list(cg.FAMILIES))
def test_family_agrees_but_for_known_classes(results, family):
    new = [(r, f) for r in results[family] for f in r.findings() if known_class(r, f) is None]
    if new:
        r, f = new[0]
        pytest.fail(
            f"{len(new)} new disagreement(s) in {family}; the first, {r.desc.name}:\n{f}\n"
            f"{r.desc.describe()}\n{r.report()}"
        )


@pytest.mark.parametrize(
    "key",
    [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=v[2])) for k, v in KNOWN.items()],
)
def test_known_disagreement_is_gone(results, key):
    hits = [
        r.desc.name
        for rs in results.values()
        for r in rs
        for f in r.findings()
        if known_class(r, f) == key
    ]
    assert not hits, f"{key} in {len(hits)} graphs, e.g. {hits[0]}"


def test_families_are_exercised(results):
    """Most graphs of every family validate in both packages: a generator drawing graphs
    both refuse would test nothing."""
    for family, rs in results.items():
        both_ok = sum(r.ours.stage == r.nvidia.stage == "ok" for r in rs)
        assert both_ok >= len(rs) // 2, f"{family}: only {both_ok}/{len(rs)} graphs lower in both"


# ---------------------------------------------------------------- the instruments themselves
def test_a_graph_description_is_a_pure_function_of_its_seed():
    for seed in range(16):
        assert cg.generate(seed).describe() == cg.generate(seed).describe()
    assert cg.generate(3).describe() != cg.generate(3 + len(cg.FAMILIES)).describe()


def test_one_description_drives_both_packages_with_the_same_calls():
    import cudnn_pygraph

    desc = cg.generate(0, "matmul")
    for module in (cudnn_nv, cudnn_pygraph):
        g, env = cg.build(module, desc)
        assert set(desc.outputs) <= set(env)
        assert type(g).__module__.split(".")[0] == module.__name__


def test_differences_name_a_changed_field_and_ignore_uid_renumbering():
    desc = cg.generate(0, "matmul")
    ours = cd.run("ours", desc)[0].lowered
    assert cd.differences(ours, ours) == []
    renumbered = _renumber(ours, offset=100)
    assert cd.differences(renumbered, ours) == [
        (sig, path, a, b)
        for sig, path, a, b in cd.differences(renumbered, ours)
        if sig.endswith(".uid")
    ]
    changed = _renumber(ours, offset=0)
    changed["tensors"][0]["dim"] = [7, 7, 7]
    diffs = cd.differences(changed, ours)
    assert [d[0] for d in diffs] == ["tensor(input).dim"]


def _renumber(doc, offset):
    import copy

    doc = copy.deepcopy(doc)
    for t in doc["tensors"]:
        t["uid"] += offset
    for n in doc["nodes"]:
        for side in ("inputs", "outputs"):
            n[side] = {p: u + offset for p, u in n[side].items()}
    return doc
