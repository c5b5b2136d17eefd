"""matmul's validate() rules hold against NVIDIA's: a table of declarations with NVIDIA's
verdict (re-observed live when its package is installed) and a seeded random sweep of
matmul + epilogue declarations whose verdicts must agree."""

import random

import pytest
from matmul_declarations import random_case, same_verdict, verdict

import cudnn_pygraph as ours
from cudnn_pygraph.backend import lowering

try:
    import cudnn as nvidia
except ImportError:
    nvidia = None

REASON = lowering.unavailable_reason() if nvidia is not None else "not installed"
# NVIDIA's matmul validate() lowers to its backend (no python engine is offered for it)
needs_backend = pytest.mark.skipif(REASON is not None, reason=f"the backend cannot lower: {REASON}")

# id: (declaration, NVIDIA's verdict: "ok" or "ValueError", what our refusal names)
RULES = {
    "plain": ({"a": [2, 64, 32], "b": [2, 32, 128]}, "ok", None),
    "K-mismatch": ({"a": [2, 64, 32], "b": [2, 33, 128]}, "ValueError", "B: K mismatch"),
    "batch-broadcast": ({"a": [4, 64, 32], "b": [1, 32, 128]}, "ok", None),
    "batch-mismatch": ({"a": [4, 64, 32], "b": [3, 32, 128]}, "ValueError", "do not broadcast"),
    "rank-2-B-under-rank-3-A": ({"a": [4, 128, 3], "b": [3, 256]}, "ok", None),
    "rank-3-B-under-rank-4-A": ({"a": [2, 4, 128, 3], "b": [4, 3, 256]}, "ok", None),
    "rank-mismatch-batch-clash": ({"a": [2, 4, 64, 8], "b": [3, 8, 16]}, "ValueError", "axis 1"),
    "int8": ({"a": [64, 32], "b": [32, 16], "dtypes": ("INT8", "INT8")}, "ok", None),
    "mixed-dtypes": ({"a": [64, 32], "b": [32, 16], "dtypes": ("HALF", "FLOAT")}, "ok", None),
    "bias-epilogue": ({"a": [2, 64, 32], "b": [2, 32, 128], "epilogue": ("bias", [1, 1, 128])},
                      "ok", None),
    "epilogue-bad-broadcast": (
        {"a": [2, 64, 32], "b": [2, 32, 128], "epilogue": ("add", [1, 1, 129])},
        "ValueError", "dim 2"),
}  # fmt: skip


@pytest.mark.parametrize("case", RULES, ids=list(RULES))
def test_our_verdict_is_the_classic_one(case):
    decl, expected, names = RULES[case]
    result = verdict(ours, decl)
    if expected == "ok":
        assert result == ("ok", ""), result
    else:
        assert result[0] != "ok" and names in result[1], result


@needs_backend
@pytest.mark.parametrize("case", RULES, ids=list(RULES))
def test_nvidia_gives_the_recorded_verdict(case):
    decl, expected, _ = RULES[case]
    assert verdict(nvidia, decl)[0] == expected


@needs_backend
@pytest.mark.parametrize("seed", range(3))
def test_random_declarations_agree_with_nvidia(seed):
    rng = random.Random(seed)
    for _ in range(80):
        case = random_case(rng)
        theirs, mine = verdict(nvidia, case), verdict(ours, case)
        assert same_verdict(theirs, mine), (case, theirs, mine)
