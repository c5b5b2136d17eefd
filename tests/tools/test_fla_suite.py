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


def test_outcomes_reads_pass_fail_skip_with_the_first_message_line(tmp_path):
    got = fla_suite.outcomes(_junit(tmp_path, "j.xml", [
        ("tests.ops.test_gdn", "test_a[1]", ""),
        ("tests.ops.test_gdn", "test_b", "<failure>AssertionError: dq\nmore</failure>"),
        ("tests.ops.test_gdn", "test_c", '<skipped message="needs sm100"/>'),
    ]))  # fmt: skip
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
    text = fla_suite.table({"test_gdn.py": {**r, "modes": list(fla_suite.MODES)}})
    assert "`m::a` (ours): boom" in text


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
    text = fla_suite.table({"test_gdn.py": {**row, "modes": list(fla_suite.MODES)},
                            "test_kda.py": None})  # fmt: skip
    assert "| test_gdn.py | 3 / 1 / 0 | 2 / 1 / 0 | 3 | 0 | 1 | 1 |" in text
    assert "test_gdn::test_b" in text and "| test_kda.py | not run | not run |" in text


def test_runs_of_separate_calls_merge_into_one_record_and_table(tmp_path):
    record = tmp_path / "outcomes.json"
    plain = {"test_gdn::test_a": ("passed", ""), "test_gdn::test_b": ("passed", "")}
    accelerated = {"test_gdn::test_a": ("passed", ""), "test_gdn::test_b": ("failed", "db")}
    routes = {"test_gdn::test_a": "ours", "test_gdn::test_b": "ours"}
    # a first call runs fla's own mode only: its counts, nothing compared yet
    fla_suite.merged(record, {("test_gdn.py", False): (plain, {})})
    first = fla_suite.rows_of(fla_suite.merged(record, {}), ["test_gdn.py", "test_kda.py"])
    assert first["test_kda.py"] is None and first["test_gdn.py"]["modes"] == ["fla"]
    assert "| test_gdn.py | 2 / 0 / 0 | not run | - | - | - | - |" in fla_suite.table(first)
    # a second call runs the accelerated mode; a third that left no results erases nothing
    fla_suite.merged(record, {("test_gdn.py", True): (accelerated, routes)})
    rec = fla_suite.merged(record, {("test_gdn.py", True): ({}, {})})
    row = fla_suite.rows_of(rec, ["test_gdn.py", "test_kda.py"])
    assert row["test_kda.py"] is None
    assert row["test_gdn.py"]["regressions"] == [("test_gdn::test_b", "db", "ours")]
    assert row["test_gdn.py"]["fla"]["passed"] == 2 and row["test_gdn.py"]["ours"] == 2
    # the accelerated mode alone (a record of another file): its counts, nothing compared
    fla_suite.merged(record, {("test_kda.py", True): (accelerated, routes)})
    alone = fla_suite.rows_of(fla_suite.merged(record, {}), ["test_kda.py"])
    assert "| test_kda.py | not run | 1 / 1 / 0 | 2 | 0 | - | - |" in fla_suite.table(alone)


def test_shards_split_a_file_and_a_run_of_the_missing_cases_merges_case_by_case(tmp_path):
    ids = [f"tests/ops/test_kda.py::test_varlen[D{d}]" for d in range(7)]
    parts = fla_suite.shards(ids, 3)
    assert sorted(sum(parts, [])) == sorted(ids) and len(parts) == 3
    assert fla_suite.shards(ids[:2], 5) == [[ids[0]], [ids[1]]]
    assert fla_suite.case_id(ids[0]) == "test_kda::test_varlen[D0]"
    assert fla_suite.case_id("tests/ops/t.py::TestX::test_y[a]") == "TestX::test_y[a]"
    record = tmp_path / "outcomes.json"
    first = {
        "test_kda::test_varlen[D0]": ("passed", ""),
        "test_kda::test_varlen[D1]": ("failed", "x"),
    }
    fla_suite.merged(
        record, {("test_kda.py", True): (first, {"test_kda::test_varlen[D0]": "ours"})}
    )
    # a later run of the missing cases adds to the record, and one it re-ran replaces its outcome
    later = {
        "test_kda::test_varlen[D1]": ("passed", ""),
        "test_kda::test_varlen[D2]": ("passed", ""),
    }
    rec = fla_suite.merged(record, {("test_kda.py", True): (later, {})}, replace=False)
    cases = rec["test_kda.py"]["accelerated"]["cases"]
    assert {c: v[0] for c, v in cases.items()} == {
        "test_kda::test_varlen[D0]": "passed",
        "test_kda::test_varlen[D1]": "passed",
        "test_kda::test_varlen[D2]": "passed",
    }
    assert rec["test_kda.py"]["accelerated"]["routes"] == {"test_kda::test_varlen[D0]": "ours"}
    # a whole run (replace) drops what it did not run
    rec = fla_suite.merged(record, {("test_kda.py", True): (first, {})})
    assert set(rec["test_kda.py"]["accelerated"]["cases"]) == set(first)


def test_a_run_queued_past_the_deadline_does_not_start(tmp_path, monkeypatch):
    # Runs beyond --jobs wait for a slot; one that would start with under a minute left
    # starts no pytest (the whole call ends by --timeout, whatever the queue).
    started = []
    monkeypatch.setattr(fla_suite.subprocess, "Popen", lambda *a, **k: started.append(a))
    test_file = tmp_path / "tests" / "ops" / "test_gdn.py"
    assert fla_suite.run(test_file, True, fla_suite.time.monotonic() + 30) == ({}, {})
    assert started == []


def test_runs_start_in_the_order_modes_names_them(tmp_path, monkeypatch):
    # A call cut short has run what started first: an accelerated-first call reaches the
    # acceptance cases of every file before fla's own mode of any.
    ops = tmp_path / "tests" / "ops"
    ops.mkdir(parents=True)
    for name in ("test_gdn.py", "test_kda.py"):
        (ops / name).write_text("")
    started = []
    monkeypatch.setattr(fla_suite, "collect", lambda path: [f"tests/ops/{path.name}::t"])
    monkeypatch.setattr(
        fla_suite, "run",
        lambda path, accelerated, deadline, ids=None: started.append((path.name, accelerated))
        or ({}, {}),
    )  # fmt: skip
    fla_suite.main(["--checkout", str(tmp_path), "--files", "test_gdn.py", "test_kda.py",
                    "--modes", "accelerated,fla", "--shards", "2"])  # fmt: skip
    assert started == [
        ("test_gdn.py", True), ("test_kda.py", True), ("test_gdn.py", False), ("test_kda.py", False),
    ]  # fmt: skip
