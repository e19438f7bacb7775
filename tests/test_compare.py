"""tfperf compare: ratios with CIs from the samples, significance, a threshold, and an exit code CI can gate on."""

import json

import numpy as np

import pytest

from tfperf.measure import Measurement
from tfperf.records import compare
from tfperf.records.compare import IMPROVED, NOT_JUDGED, REGRESSED, UNCHANGED
from tfperf.records.jsonl import make_record, write_records
from tfperf.records.runs import Run

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


def compare_runs(a, b, **kwargs):
    """Two single runs held in memory, compared."""
    return compare.compare_runs([Run.of(a)], [Run.of(b)], **kwargs)


def test_the_same_run_shows_no_significant_change():
    result = compare_runs(run_records(), run_records())
    assert [r.status for r in result.rows] == [UNCHANGED, UNCHANGED]
    assert result.regressions == [] and result.geometric_mean == pytest.approx(1.0)
    assert all(r.ci95[0] <= 1.0 <= r.ci95[1] for r in result.rows)


def test_a_slower_run_regresses_and_a_faster_one_improves():
    slower = compare_runs(run_records(), run_records(1.5))
    assert [r.status for r in slower.rows] == [REGRESSED, REGRESSED] and slower.threshold == 0.25  # uncalibrated
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
    assert proc.returncode == 1 and "regressed: demo: t / a" in proc.stderr and "t / b" in proc.stderr
    assert "no calibration: rows judged by the samples within each run" in proc.stdout
    assert tfperf_cli("compare", a, slow, "--threshold", "0.6").returncode == 0  # 1.5x is under 60%


def test_cli_warns_when_environments_differ_and_lists_one_sided_rows(tmp_path, tfperf_cli):
    a = save(tmp_path / "a.jsonl", run_records(rows=("a", "gone")))
    b = save(tmp_path / "b.jsonl", run_records(rows=("a", "new"), env={**ENV, "cores": 8}))
    proc = tfperf_cli("compare", a, b)
    assert "warning: cores differs: 2 in A, 8 in B; the rows are judged all the same" in proc.stderr
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


# Runs with known noise: each run's figure moves by a log-normal factor of its own (what changes from one
# process to the next), while the samples within a run stay tight, as on a shared machine.
QUIET, LOUD = 0.03, 0.25


def noisy_run(rng, sds, *, slower=None, recipe="demo"):
    """One run: row i's time is (i+1) ms times exp(N(0, sds[i])), times slower[row] where given."""
    records = []
    for i, sd in enumerate(sds):
        row = f"r{i}"
        ms = (i + 1) * float(np.exp(rng.normal(0, sd))) * (slower or {}).get(row, 1.0)
        m = Measurement(row, tuple(ms * 1e-3 * (1 + 0.01 * (k % 5)) for k in range(30)))
        records.append(make_record(recipe, "t", row, {"ms": m.median_s * 1e3}, primary="ms", lower_is_better=True,
                                   args={"quick": True}, env=ENV, measurement=m))
    return Run.of(records)


def test_the_noise_of_repeated_runs_is_each_figures_spread_pulled_toward_its_recipes():
    from tfperf.records.noise import Noise, measure_noise

    rng = np.random.default_rng(0)
    sds = [QUIET] * 8 + [LOUD]
    noise = measure_noise([noisy_run(rng, sds) for _ in range(12)], "calibration")
    quiet, loud = noise.spread(("demo", "t", "r0", "primary")), noise.spread(("demo", "t", "r8", "primary"))
    assert quiet.sd < 0.06 and loud.sd > 0.15 and quiet.df == loud.df > 11  # its own runs and the prior's
    unknown = noise.spread(("demo", "t", "new row", "primary"))
    assert unknown.source == "its recipe's figures" and unknown.df == noise.machine[1] < 11
    assert noise.spread(("other", "t", "r0", "primary")).source == "the machine's figures"
    again = Noise.from_json(json.loads(json.dumps(noise.to_json())), "noise.json")
    assert again.spread(("demo", "t", "r8", "primary")) == loud and again.runs == 12
    with pytest.raises(ValueError, match="needs at least 2"):
        measure_noise([noisy_run(rng, sds)])
    with pytest.raises(ValueError, match="not a calibration tfperf wrote"):
        Noise.from_json({"format": "something else"}, "x.json")


@pytest.mark.slow
def test_a_calibrated_compare_of_runs_of_the_same_code_seldom_calls_a_change_where_the_samples_cry_wolf():
    """A/A: each pair of runs judged against a calibration of three other runs (a new one each time: the rate a
    user meets on average). The samples within a run see none of the run-to-run noise and cry wolf."""
    from tfperf.records.noise import measure_noise

    rng = np.random.default_rng(1)
    sds = [QUIET] * 10 + [LOUD] * 2
    false_alarms = by_samples = 0
    for _ in range(100):
        noise = measure_noise([noisy_run(rng, sds) for _ in range(3)])
        a, b = noisy_run(rng, sds), noisy_run(rng, sds)
        calibrated = compare.compare_runs([a], [b], noise=noise)
        false_alarms += bool(calibrated.regressions)
        by_samples += bool(compare.compare_runs([a], [b], threshold=0.05).regressions)
    assert false_alarms <= 8  # about 5%: BH over the rows, and the calibration's own error
    assert by_samples > 50
    row = calibrated.rows[0]
    assert row.judged_by == "noise" and row.noise is not None and row.share_of_noise is not None


def test_a_calibrated_compare_catches_a_slowdown_beyond_the_rows_noise_and_names_those_rows():
    from tfperf.records.noise import measure_noise

    rng = np.random.default_rng(2)
    sds = [QUIET] * 10 + [LOUD] * 2
    slowed = {"r1": 1.6, "r3": 1.6, "r10": 1.6}  # r10 is a loud row: 60% is within its noise, seen or not
    caught = wrong = 0
    for _ in range(20):
        noise = measure_noise([noisy_run(rng, sds) for _ in range(3)])
        result = compare.compare_runs([noisy_run(rng, sds)], [noisy_run(rng, sds, slower=slowed)], noise=noise)
        named = {r.key[2] for r in result.regressions}
        caught += {"r1", "r3"} <= named
        wrong += bool(named - set(slowed))
    assert caught >= 18 and wrong <= 2  # the quiet rows that slowed, and seldom a row that did not


def test_a_side_with_repeated_runs_is_judged_by_its_geometric_mean_with_a_narrower_band():
    from tfperf.records.noise import measure_noise

    rng = np.random.default_rng(3)
    sds = [QUIET] * 6
    noise = measure_noise([noisy_run(rng, sds) for _ in range(3)])
    one = compare.compare_runs([noisy_run(rng, sds)], [noisy_run(rng, sds)], noise=noise)
    three = compare.compare_runs([noisy_run(rng, sds) for _ in range(3)], [noisy_run(rng, sds) for _ in range(3)],
                                 noise=noise)
    assert three.runs == (3, 3) and three.rows[0].runs == (3, 3)
    assert three.rows[0].noise - 1 == pytest.approx((one.rows[0].noise - 1) / np.sqrt(3), rel=0.05)


def test_a_rerun_lands_inside_the_rerun_range_about_95_percent_of_the_time():
    from tfperf.records.noise import measure_noise, rerun_range

    rng = np.random.default_rng(4)
    sds = [QUIET] * 6 + [LOUD] * 3
    inside = total = 0
    for _ in range(60):
        noise = measure_noise([noisy_run(rng, sds) for _ in range(3)])
        first, rerun = noisy_run(rng, sds), noisy_run(rng, sds)
        for a, b in zip(first.records, rerun.records):
            low, high = rerun_range(a["metrics"]["ms"], noise.spread(("demo", "t", a["row"], "primary")), a["ci95"])
            inside += low <= b["metrics"]["ms"] <= high
            total += 1
    assert 0.90 <= inside / total <= 0.995


def test_a_report_resting_on_few_runs_says_how_much_wider_its_rerun_ranges_are(tmp_path):
    from tfperf.records.noise import measure_noise
    from tfperf.records.report import intervals_note

    rng = np.random.default_rng(5)
    noise = measure_noise([noisy_run(rng, [QUIET] * 6) for _ in range(3)], str(tmp_path))
    note = intervals_note(noise, tmp_path)
    # Student's t at 2 degrees of freedom against the normal: 4.30 / 1.96.
    assert "this folder's own 3 runs" in note and "2 degrees of freedom" in note and "up to 2.2x as wide" in note
    many = measure_noise([noisy_run(rng, [QUIET] * 6) for _ in range(5)], str(tmp_path))
    assert "degrees of freedom" not in intervals_note(many, tmp_path)


def test_compare_of_two_folders_sets_headlines_against_the_rerun_range(tmp_path, tfperf_cli):
    from tfperf.records.findings import Headline

    rng = np.random.default_rng(5)
    sds = [QUIET] * 6

    def folder(path, runs, headline_value):
        for k, run in enumerate(runs):
            where = path if k == 0 else path / "repeats" / str(k + 1)
            write_records(where / "demo.jsonl", run.records)
            Headline("r5 against r0", f"{headline_value:.2f}x faster", "faster", value=headline_value,
                     unit="x", ci95=(headline_value * 0.98, headline_value * 1.02)).save(where, "demo")
        return path

    a = folder(tmp_path / "a", [noisy_run(rng, sds) for _ in range(3)], 6.0)
    run_b = noisy_run(rng, sds)
    for record in run_b.records:  # B's run saw 2% of the CPU time stolen; A's records predate the field
        record["env"] = {**record["env"], "cpu_steal": 0.02}
    b = folder(tmp_path / "b", [run_b], 6.1)
    proc = tfperf_cli("compare", a, b)
    assert proc.returncode == 0 and f"calibration: 3 runs" in proc.stdout and "the change is" in proc.stdout
    assert "| demo | 6.00x | 6.10x |" in proc.stdout and "| yes | faster | - / 2.0% |" in proc.stdout
    assert "B's figure inside A's rerun range for 1 of 1; verdicts agree for 1 of 1" in proc.stdout
    slow = folder(tmp_path / "slow", [noisy_run(rng, sds, slower={"r2": 1.5, "r4": 1.5})], 6.0)
    proc = tfperf_cli("compare", a, slow, check=False)
    assert proc.returncode == 1 and "regressed: demo: t / r2" in proc.stderr and "t / r4" in proc.stderr
    assert "r0" not in proc.stderr
    (tmp_path / "empty").mkdir()
    for bad, what in ((tmp_path / "nowhere", "no such records file or results folder"),
                      (tmp_path / "empty", "holds no records")):
        proc = tfperf_cli("compare", a, bad, check=False)
        assert proc.returncode == 2 and what in proc.stderr and len(proc.stderr.splitlines()) == 1
    other = tmp_path / "other"
    write_records(other / "other.jsonl", noisy_run(rng, sds, recipe="other").records)
    proc = tfperf_cli("compare", a, other, check=False)
    assert proc.returncode == 2 and "share no (recipe, table, row)" in proc.stderr
    proc = tfperf_cli("compare", b, b, "--calibration", b, check=False)
    assert proc.returncode == 2 and "holds 1 run and no noise.json" in proc.stderr


def test_compare_says_when_the_cores_differ_and_still_judges_the_rows():
    rng = np.random.default_rng(6)
    one_core = noisy_run(rng, [QUIET] * 3, slower={"r0": 2.0, "r1": 2.0, "r2": 2.0})
    for r in one_core.records:
        r["env"] = {**ENV, "usable_cores": 1}
    result = compare.compare_runs([noisy_run(rng, [QUIET] * 3)], [one_core])
    assert result.env_differences["usable_cores"] == (None, 1)
    assert {r.key[2] for r in result.regressions} == {"r0", "r1", "r2"}


def test_a_run_whose_figures_move_with_heavy_tails_seldom_fails_the_gate():
    """A/A where a run's factor is Student's t with 3 degrees of freedom (one process in fifty 30-40% off, as
    measured here), not normal: the gate reads its p-values from heavy tails and still catches a real 60%."""
    from tfperf.records.noise import measure_noise

    rng = np.random.default_rng(5)
    sds = [QUIET] * 10

    def heavy_run(slower=None):
        factors = [float(np.exp(sd * rng.standard_t(3) / np.sqrt(3))) for sd in sds]
        return noisy_run(rng, [0.0] * len(sds), slower={f"r{i}": f * (slower or {}).get(f"r{i}", 1.0)
                                                         for i, f in enumerate(factors)})

    false_alarms = caught = 0
    for _ in range(100):
        noise = measure_noise([heavy_run() for _ in range(3)])
        false_alarms += bool(compare.compare_runs([heavy_run()], [heavy_run()], noise=noise).regressions)
        slowed = compare.compare_runs([heavy_run()], [heavy_run(slower={"r2": 1.6})], noise=noise)
        caught += "r2" in {r.key[2] for r in slowed.regressions}
    assert false_alarms <= 8 and caught >= 90
