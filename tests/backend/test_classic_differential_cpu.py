"""The differential that keeps classic parity true, without a GPU: random classic graphs
(classic_graphs.py) built through NVIDIA's `cudnn` and through `cudnn_pygraph` with the
same calls must get the same verdict (the same call raising the same error type, or
validate() passing) and lower to the same backend graph (classic_diff.py compares the
backend's own JSON).

Each family must agree except for the disagreement classes in classic_diff.KNOWN; each known class
is an xfail (strict) that turns into a failure the day it is fixed, so the entry is then
deleted and the family held to full agreement. A new disagreement fails
test_family_agrees_but_for_known_classes with the graph's calls and both outcomes.
The GPU half (plans, bitwise outputs, python plans vs the backend) is
tools/classic_differential.py.
"""

import collections

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


@pytest.fixture(scope="module")
def results():
    """{family: [Result]} over GRAPHS_PER_FAMILY seeds of each family."""
    out = collections.defaultdict(list)
    for family in cg.FAMILIES:
        for i in range(GRAPHS_PER_FAMILY):
            desc = cg.generate(i * len(cg.FAMILIES) + list(cg.FAMILIES).index(family), family)
            out[family].append(cd.compare(desc))
    return out


@pytest.mark.parametrize("family", list(cg.FAMILIES))
def test_family_agrees_but_for_known_classes(results, family):
    new = [
        (r, f)
        for r in results[family]
        for f in r.findings()
        if cd.known_class(r.desc.family, f) is None
    ]
    if new:
        r, f = new[0]
        pytest.fail(
            f"{len(new)} new disagreement(s) in {family}; the first, {r.desc.name}:\n{f}\n"
            f"{r.desc.describe()}\n{r.report()}"
        )


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=v[2]))
        for k, v in cd.KNOWN.items()
    ],
)
def test_known_disagreement_is_gone(results, key):
    hits = [
        r.desc.name
        for rs in results.values()
        for r in rs
        for f in r.findings()
        if cd.known_class(r.desc.family, f) == key
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
