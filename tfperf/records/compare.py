"""Two runs compared row by row: B's ratio over A, judged against what two runs of the same code on this
machine differ by (an A/A calibration), or, without one, by the samples within each run and a stated
threshold; each recipe's headline set against the range a rerun was expected to land in."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfperf.measure import stats
from tfperf.records.findings import Headline
from tfperf.records.noise import Noise, differences, within_sd
from tfperf.records.report import per_call_samples, speedup
from tfperf.records.runs import Run

Record = Mapping[str, Any]
Key = tuple[str, str, str]
IMPROVED, REGRESSED, UNCHANGED, NOT_JUDGED = "improved", "regressed", "no significant change", "not judged"
SIGNIFICANCE = 0.05
# Run-to-run changes have heavier tails than a normal: in an A/A compare of 281 rows here (a calibration of 3 runs
# against a run 10 minutes later), 5.7% of rows lay beyond their 95% band (a normal: 5%) but 2.1% beyond twice it
# (a normal: 0.01%), where a whole recipe's process ran 20-40% off. Student's t with 4 degrees of freedom puts
# 1.7% there: the gate's p-values are read from it, so that one such process does not fail a build.
TAIL_DF = 4.0
# The smallest change that counts on top of the noise, as a fraction.
THRESHOLD = 0.05
# Without a calibration a change must clear this: the samples within one run say nothing of the next run,
# and two clean runs of the same code on the machines tfperf was built on differed by up to this much in
# most rows (README, "What compare promises").
UNCALIBRATED_THRESHOLD = 0.25
# What a figure depends on; a difference here explains a change better than the code does.
ENV_KEYS = ("tensorflow", "keras", "python", "cpu", "cores", "usable_cores", "gpus", "intra_op_threads",
            "inter_op_threads", "xla_auto_jit", "tf_xla_flags", "dtype_policy", "variables", "git_dirty")
# Arguments that say where output goes, not what was measured.
IGNORED_ARGS = ("out", "profile")


def judge(a: Record, b: Record, *, threshold: float, seed: int = 0) -> RowChange:
    """Row b against row a by their samples alone: significant when the rank test says so and the CI
    excludes 1; counted only when the change is also larger than `threshold`."""
    key = (b["recipe"], b["table"], b["row"])
    metric = b["primary"]
    value_a, value_b = float(a["metrics"][metric]), float(b["metrics"][metric])
    ratio = speedup(b, a)
    ci, p, status = None, None, NOT_JUDGED
    if a.get("samples_s") and b.get("samples_s") and math.isfinite(ratio):
        sa, sb = per_call_samples(a), per_call_samples(b)
        per_call, (low, high) = stats.ratio_ci(sa, sb, seed=seed)
        # The samples are the evidence, the metric their summary: each run's metric is proportional to its
        # time per call (or its inverse), with a factor of its own (items, bytes per call) read from the
        # median it was computed from. So the figures and the ratio follow the samples.
        value_a, value_b = at_samples_median(a, sa), at_samples_median(b, sb)
        if value_a and value_b:
            ratio = value_a / value_b if b["lower_is_better"] else value_b / value_a
        scale = ratio / per_call
        ci = (low * scale, high * scale)
        p = stats.mann_whitney_p(sa, sb)
        significant = p < SIGNIFICANCE and (ci[0] > 1 or ci[1] < 1)
        status = _status(significant, ratio, threshold)
    return RowChange(key, metric, value_a, value_b, ratio, ci, p, status, judged_by="samples" if ci else "")


def _status(significant: bool, ratio: float, threshold: float) -> str:
    if significant and ratio > 1 + threshold:
        return IMPROVED
    if significant and ratio < 1 / (1 + threshold):
        return REGRESSED
    return UNCHANGED


def at_samples_median(record: Record, per_call: Sequence[float]) -> float:
    """The record's primary metric as its samples give it: the stored figure, scaled from the median it
    was computed from (`timing.median_s`) to the median of the samples now in the record."""
    value = float(record["metrics"][record["primary"]])
    timing = record.get("timing") or {}
    if not timing.get("median_s"):
        return value  # an older record: the figure as stored
    recorded = timing["median_s"] / timing.get("block_size", 1)
    now = float(np.median(per_call))
    return value * now / recorded if record["lower_is_better"] else value * recorded / now


def geometric_mean_of(runs: Sequence[Run], key: Key) -> tuple[float | None, int]:
    """A row's primary metric over the runs that measured it (their geometric mean), and how many did."""
    values = [float(r["metrics"][r["primary"]]) for run in runs for r in run.records
              if (r["recipe"], r["table"], r["row"]) == key and r["metrics"].get(r["primary"]) is not None]
    values = [v for v in values if math.isfinite(v) and v > 0]
    return (stats.geometric_mean(values), len(values)) if values else (None, 0)


def judge_by_noise(a_runs: Sequence[Run], b_runs: Sequence[Run], a: Record, b: Record, noise: Noise) -> RowChange | None:
    """Row b against A by the calibration: B's ratio over A (geometric means over each side's runs) against
    the spread two runs of the same code show (never less than the two rows' own intervals within their runs
    allow). Its status waits for `compare_runs`, which controls the false alarms over all rows; None when a
    side has no figure."""
    key = (b["recipe"], b["table"], b["row"])
    spread = noise.spread((*key, "primary"))
    (value_a, runs_a), (value_b, runs_b) = geometric_mean_of(a_runs, key), geometric_mean_of(b_runs, key)
    if value_a is None or value_b is None:
        return None
    ratio = value_a / value_b if b["lower_is_better"] else value_b / value_a
    within = math.sqrt(within_sd(a.get("ci95")) ** 2 / runs_a + within_sd(b.get("ci95")) ** 2 / runs_b)
    sd = max(spread.sd * math.sqrt(1 / runs_a + 1 / runs_b), within)
    band = math.exp(stats.t_quantile(0.975, spread.df) * sd)
    # The band is where 95% of reruns land (and they do, here); the p-value that gates is read from heavier tails.
    p = stats.t_two_sided_p(math.log(ratio) / sd, min(spread.df, TAIL_DF)) if sd > 0 else (
        0.0 if ratio != 1 else 1.0)
    return RowChange(key, b["primary"], value_a, value_b, ratio, (ratio / band, ratio * band), p, UNCHANGED,
                     noise=band, runs=(runs_a, runs_b), judged_by="noise")


def headline_changes(a_run: Run, b_run: Run, noise: Noise | None) -> list[HeadlineChange]:
    """Each recipe's headline in both runs, with the range A's rerun was expected to land in."""
    found = []
    for recipe, a in a_run.headlines.items():
        b = b_run.headlines.get(recipe)
        if b is None:
            continue
        found.append(HeadlineChange(recipe, a, b, noise.headline_rerun(recipe, a) if noise is not None else None,
                                    (stolen_while(a_run, recipe), stolen_while(b_run, recipe))))
    return found


def stolen_while(run: Run, recipe: str) -> float | None:
    """The share of the machine's CPU time its hypervisor took while the recipe ran (None where unrecorded)."""
    return next((r["env"].get("cpu_steal") for r in run.records if r["recipe"] == recipe), None)


def _differences(a: Mapping[str, Any], b: Mapping[str, Any], keys: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}


def compare_runs(a: Sequence[Run], b: Sequence[Run], *, threshold: float | None = None,
                 noise: Noise | None = None) -> RunComparison:
    """Compare run B with run A (its baseline), row by row, each side one run or several of the same code.

    With `noise` (a calibration), a row changed when B's ratio over A lies beyond what runs of the same code
    differ by, with the false discovery rate over all rows held at 5% (Benjamini-Hochberg: in an A/A
    comparison, the chance that any row is called changed is at most 5%), and by more than `threshold`
    (default 5%). Without one, by the samples within the first run of each side and `threshold` (default
    UNCALIBRATED_THRESHOLD)."""
    if threshold is None:
        threshold = THRESHOLD if noise is not None else UNCALIBRATED_THRESHOLD
    first_a, first_b = a[0] if a else Run.of([]), b[0] if b else Run.of([])
    index_a = {(r["recipe"], r["table"], r["row"]): r for r in first_a.records}
    index_b = {(r["recipe"], r["table"], r["row"]): r for r in first_b.records}
    rows, mismatches = [], []
    for key, rb in index_b.items():
        ra = index_a.get(key)
        if ra is None:
            continue
        if ra["primary"] != rb["primary"] or ra["primary"] not in ra["metrics"]:
            mismatches.append(f"{' / '.join(key)}: primary metric {ra['primary']!r} in A, {rb['primary']!r} in B")
            continue
        by_noise = judge_by_noise(a, b, ra, rb, noise) if noise is not None else None
        rows.append(by_noise or judge(ra, rb, threshold=threshold))
    noisy = [i for i, r in enumerate(rows) if r.judged_by == "noise"]
    rejected = stats.benjamini_hochberg([rows[i].p_value for i in noisy], SIGNIFICANCE) if noisy else []
    for i, significant in zip(noisy, rejected):
        rows[i] = dataclasses.replace(rows[i], status=_status(significant, rows[i].ratio, threshold))
    env_a, env_b = first_a.env, first_b.env
    args_a = first_a.records[0]["args"] if first_a.records else {}
    args_b = first_b.records[0]["args"] if first_b.records else {}
    args_keys = sorted((set(args_a) | set(args_b)) - set(IGNORED_ARGS))
    return RunComparison(
        rows=rows,
        only_in_a=[k for k in index_a if k not in index_b],
        only_in_b=[k for k in index_b if k not in index_a],
        metric_mismatches=mismatches,
        env_differences=_differences(env_a, env_b, ENV_KEYS),
        args_differences=_differences(args_a, args_b, args_keys),
        threshold=threshold,
        headlines=headline_changes(first_a, first_b, noise),
        noise=noise,
        calibration_differences=differences(noise, env_b) if noise is not None else {},
        runs=(len(a), len(b)),
    )


@dataclasses.dataclass(frozen=True)
class RowChange:
    """One row in both runs: B's ratio over A on the primary metric (above 1: B is better).

    `noise` is the factor within which two runs of the same code differ 95% of the time (1.12: 12%) when an
    A/A calibration judged the row (`judged_by` "noise"); "samples" when the samples within one run did."""

    key: Key
    metric: str
    a: float
    b: float
    ratio: float
    ci95: tuple[float, float] | None
    p_value: float | None
    status: str
    noise: float | None = None
    runs: tuple[int, int] = (1, 1)
    judged_by: str = ""

    @property
    def share_of_noise(self) -> float | None:
        """How large the change is next to the noise band: under 1, runs of the same code differ this much."""
        if self.noise is None or self.noise <= 1 or not self.ratio > 0:
            return None
        return abs(math.log(self.ratio)) / math.log(self.noise)


@dataclasses.dataclass(frozen=True)
class HeadlineChange:
    """A recipe's headline in runs A and B, and where A's rerun was expected to land (95%), if known."""

    recipe: str
    a: Headline
    b: Headline
    rerun: tuple[float, float] | None
    stolen: tuple[float | None, float | None] = (None, None)  # CPU time the hypervisor took in A and in B

    @property
    def inside(self) -> bool | None:
        """Whether B's figure fell inside A's rerun range (None when either is unknown)."""
        if self.rerun is None or self.b.value is None:
            return None
        return self.rerun[0] <= self.b.value <= self.rerun[1]

    @property
    def verdicts_agree(self) -> bool:
        return self.a.verdict == self.b.verdict


@dataclasses.dataclass(frozen=True)
class RunComparison:
    """Everything `tfperf compare` reports about two runs."""

    rows: list[RowChange]
    only_in_a: list[Key]
    only_in_b: list[Key]
    metric_mismatches: list[str]
    env_differences: dict[str, tuple[Any, Any]]
    args_differences: dict[str, tuple[Any, Any]]
    threshold: float
    headlines: list[HeadlineChange] = dataclasses.field(default_factory=list)
    noise: Noise | None = None
    calibration_differences: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    runs: tuple[int, int] = (1, 1)

    @property
    def regressions(self) -> list[RowChange]:
        return [r for r in self.rows if r.status == REGRESSED]

    @property
    def geometric_mean(self) -> float | None:
        """Geometric mean of B's ratios over A on every row with a positive ratio."""
        ratios = [r.ratio for r in self.rows if math.isfinite(r.ratio) and r.ratio > 0]
        return stats.geometric_mean(ratios) if ratios else None
