"""tfperf compare: ratios with CIs from the samples, significance, a threshold, and an exit code CI can gate on."""

import json

import pytest

from tfperf.measure import Measurement
from tfperf.records.compare import IMPROVED, NOT_JUDGED, REGRESSED, UNCHANGED, compare_runs
from tfperf.records.jsonl import make_record, write_records

ENV = {"cpu": "test cpu", "cores": 2, "gpus": [], "python": "3.11", "tensorflow": "2.21.0", "keras": "3",
       "tfperf": "0.1.0", "git_commit": None}


def run_records(scale=1.0, *, rows=("a", "b"), env=ENV, args=None, samples=True):
    records = []
    for i, row in enumerate(rows):
        base = (i + 1) * 1e-3
        m = Measurement(row, tuple(scale * base * (1 + 0.03 * (k % 5)) for k in range(30)))
        records.append(make_record("demo", "t", row, {"ms": m.median_s * 1e3}, primary="ms", lower_is_better=True,
                                   args=args or {"quick": True, "out": "x"}, env=env,
                                   measurement=m if samples else None))
    return records


def test_the_same_run_shows_no_significant_change():
    result = compare_runs(run_records(), run_records())
    assert [r.status for r in result.rows] == [UNCHANGED, UNCHANGED]
    assert result.regressions == [] and result.geometric_mean == pytest.approx(1.0)
    assert all(r.ci95[0] <= 1.0 <= r.ci95[1] for r in result.rows)


def test_a_slower_run_regresses_and_a_faster_one_improves():
    slower = compare_runs(run_records(), run_records(1.5))
    assert [r.status for r in slower.rows] == [REGRESSED, REGRESSED]
    assert slower.rows[0].ratio == pytest.approx(1 / 1.5) and slower.rows[0].p_value < 0.05
    assert slower.geometric_mean == pytest.approx(1 / 1.5)
    assert [r.status for r in compare_runs(run_records(1.5), run_records()).rows] == [IMPROVED, IMPROVED]


def test_the_samples_decide_when_a_copy_scales_them_and_not_the_stored_figures():
    slower = run_records()
    for r in slower:
        r["samples_s"] = [1.5 * t for t in r["samples_s"]]
    result = compare_runs(run_records(), slower)
    assert [r.status for r in result.rows] == [REGRESSED, REGRESSED]
    assert result.rows[0].ratio == pytest.approx(1 / 1.5) and result.rows[0].b == pytest.approx(1.5 * result.rows[0].a)
    low, high = result.rows[0].ci95
    assert low <= 1 / 1.5 <= high


def test_a_change_under_the_threshold_does_not_count():
    result = compare_runs(run_records(), run_records(1.03), threshold=0.05)
    assert [r.status for r in result.rows] == [UNCHANGED, UNCHANGED]
    assert [r.status for r in compare_runs(run_records(), run_records(1.03), threshold=0.0).rows] == [
        REGRESSED, REGRESSED]


def test_rows_without_samples_are_not_judged():
    result = compare_runs(run_records(samples=False), run_records(2.0, samples=False))
    assert [r.status for r in result.rows] == [NOT_JUDGED, NOT_JUDGED] and result.regressions == []


def test_rows_and_differences_present_on_one_side_are_reported():
    result = compare_runs(run_records(rows=("a", "gone")), run_records(rows=("a", "new"),
                          env={**ENV, "tensorflow": "2.22.0"}, args={"quick": False, "out": "y"}))
    assert result.only_in_a == [("demo", "t", "gone")] and result.only_in_b == [("demo", "t", "new")]
    assert result.env_differences == {"tensorflow": ("2.21.0", "2.22.0")}
    assert result.args_differences == {"quick": (True, False)}  # where output went does not matter


def save(path, records):
    write_records(path, records)
    return path


def test_cli_exits_0_on_the_same_records_and_1_naming_regressed_rows(tmp_path, tfperf_cli):
    a = save(tmp_path / "a.jsonl", run_records())
    same = tfperf_cli("compare", a, a)
    assert same.returncode == 0 and "0 improved, 0 regressed" in same.stdout
    assert "no significant change" in same.stdout and "geometric mean of B vs A: 1.000x" in same.stdout
    slow = save(tmp_path / "slow.jsonl", run_records(1.5))
    proc = tfperf_cli("compare", a, slow, check=False)
    assert proc.returncode == 1 and "regressed: t / a" in proc.stderr and "t / b" in proc.stderr
    assert tfperf_cli("compare", a, slow, "--threshold", "0.6").returncode == 0  # 1.5x is under 60%


def test_cli_warns_when_environments_differ_and_lists_one_sided_rows(tmp_path, tfperf_cli):
    a = save(tmp_path / "a.jsonl", run_records(rows=("a", "gone")))
    b = save(tmp_path / "b.jsonl", run_records(rows=("a", "new"), env={**ENV, "cores": 8}))
    proc = tfperf_cli("compare", a, b)
    assert "warning: cores differs: 2 in A, 8 in B" in proc.stderr
    assert "only in A: demo / t / gone" in proc.stdout and "only in B: demo / t / new" in proc.stdout


def test_cli_compares_old_records_without_samples_by_their_medians(tmp_path, tfperf_cli):
    old = [json.loads(json.dumps(r)) for r in run_records(samples=False)]
    a = save(tmp_path / "a.jsonl", old)
    b = save(tmp_path / "b.jsonl", run_records(3.0, samples=False))
    proc = tfperf_cli("compare", a, b)
    assert proc.returncode == 0 and "not judged (no samples)" in proc.stdout and "0.333x" in proc.stdout


def test_cli_refuses_a_bad_threshold_in_one_line(tmp_path, tfperf_cli):
    a = save(tmp_path / "a.jsonl", run_records())
    proc = tfperf_cli("compare", a, a, "--threshold", "lots", check=False)
    assert proc.returncode == 2 and "must be a number" in proc.stderr and len(proc.stderr.splitlines()) == 1
