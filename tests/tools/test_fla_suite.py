"""tools/fla_suite.py's reading of the two runs: a case the accelerated run fails is named, a
case it never reached (its run cut by the time limit) is counted apart, and an interrupted
run's own entry is not a case."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fla_suite", ROOT / "tools" / "fla_suite.py")
fla_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fla_suite)


def _junit(tmp_path, name, cases):
    body = "".join(
        f'<testcase classname="{cls}" name="{n}">{child}</testcase>' for cls, n, child in cases
    )
    path = tmp_path / name
    path.write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    return str(path)


def test_a_cut_run_counts_unreached_cases_apart_from_regressions(tmp_path):
    fail = '<failure message="AssertionError: db ratio 0.0059">trace</failure>'
    plain = fla_suite.outcomes(_junit(tmp_path, "plain.xml", [
        ("tests.ops.test_gdn", "test_a", ""),
        ("tests.ops.test_gdn", "test_b", ""),
        ("tests.ops.test_gdn", "test_c", ""),
        ("tests.ops.test_gdn", "test_d", fail),
    ]))  # fmt: skip
    accelerated = fla_suite.outcomes(_junit(tmp_path, "acc.xml", [
        ("tests.ops.test_gdn", "test_a", ""),
        ("tests.ops.test_gdn", "test_b", fail),
        ("tests.ops.test_gdn", "test_d", ""),
        ("", "", '<error message="KeyboardInterrupt"/>'),
    ]))  # fmt: skip
    assert "::" not in accelerated and len(accelerated) == 3
    routes = {"test_gdn::test_a": "ours", "test_gdn::test_b": "ours", "test_gdn::test_d": "ours"}
    row = fla_suite.compare(plain, accelerated, routes)
    assert row["regressions"] == [("test_gdn::test_b", "AssertionError: db ratio 0.0059", "ours")]
    assert row["unreached"] == 1 and row["gains"] == ["test_gdn::test_d"]
    assert row["fla"] == {"passed": 3, "failed": 1, "skipped": 0} and row["ours"] == 3
    text = fla_suite.table({"test_gdn.py": row, "test_kda.py": None})
    assert "| test_gdn.py | 3 / 1 / 0 | 2 / 1 / 0 | 3 | 0 | 1 | 1 |" in text
    assert "test_gdn::test_b" in text and "| test_kda.py | did not finish |" in text


def test_runs_of_separate_calls_merge_into_one_record_and_table(tmp_path):
    record = tmp_path / "outcomes.json"
    plain = {"test_gdn::test_a": ("passed", ""), "test_gdn::test_b": ("passed", "")}
    accelerated = {"test_gdn::test_a": ("passed", ""), "test_gdn::test_b": ("failed", "db")}
    routes = {"test_gdn::test_a": "ours", "test_gdn::test_b": "ours"}
    # a first call runs fla's own mode only: no row yet
    fla_suite.merged(record, {("test_gdn.py", False): (plain, {})})
    assert fla_suite.rows_of(fla_suite.merged(record, {}), ["test_gdn.py"]) == {"test_gdn.py": None}
    # a second call runs the accelerated mode; a third that left no results erases nothing
    fla_suite.merged(record, {("test_gdn.py", True): (accelerated, routes)})
    rec = fla_suite.merged(record, {("test_gdn.py", True): ({}, {})})
    row = fla_suite.rows_of(rec, ["test_gdn.py", "test_kda.py"])
    assert row["test_kda.py"] is None
    assert row["test_gdn.py"]["regressions"] == [("test_gdn::test_b", "db", "ours")]
    assert row["test_gdn.py"]["fla"]["passed"] == 2 and row["test_gdn.py"]["ours"] == 2
