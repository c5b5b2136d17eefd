"""tools/fla_suite.py's CPU half: reading pytest's JUnit files and naming, per case, what
the accelerated run lost or gained against fla's own run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import fla_suite  # noqa: E402

JUNIT = """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.ops.test_gdn" name="test_a[1]"/>
<testcase classname="tests.ops.test_gdn" name="test_b"><failure>AssertionError: dq
more</failure></testcase>
<testcase classname="tests.ops.test_gdn" name="test_c"><skipped message="needs sm100"/></testcase>
</testsuite></testsuites>"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_outcomes_reads_pass_fail_skip_with_the_first_message_line(tmp_path):
    got = fla_suite.outcomes(write(tmp_path, "j.xml", JUNIT))
    assert got == {
        "test_gdn::test_a[1]": ("passed", ""),
        "test_gdn::test_b": ("failed", "AssertionError: dq"),
        "test_gdn::test_c": ("skipped", "needs sm100"),
    }


def test_compare_names_regressions_and_gains_and_counts_routes():
    plain = {"m::a": ("passed", ""), "m::b": ("failed", "x"), "m::c": ("passed", "")}
    accel = {"m::a": ("failed", "boom"), "m::b": ("passed", ""), "m::c": ("passed", "")}
    routes = {"m::a": "ours", "m::b": "ours", "m::c": "fallback:head dim"}
    r = fla_suite.compare(plain, accel, routes)
    assert r["fla"] == {"passed": 2, "failed": 1, "skipped": 0}
    assert r["accelerated"] == {"passed": 2, "failed": 1, "skipped": 0}
    assert (r["ours"], r["fallback"]) == (2, 1)
    assert r["regressions"] == [("m::a", "boom", "ours")] and r["gains"] == ["m::b"]
    text = fla_suite.table({"test_gdn.py": r, "test_kda.py": None})
    assert "`m::a` (ours): boom" in text and "| test_kda.py | did not finish" in text
