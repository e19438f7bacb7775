"""Two runs' records compared row by row: ratio with its CI, a rank test, and what changed around them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfperf.measure import stats
from tfperf.records.report import per_call_samples, speedup

Record = Mapping[str, Any]
Key = tuple[str, str, str]
IMPROVED, REGRESSED, UNCHANGED, NOT_JUDGED = "improved", "regressed", "no significant change", "not judged"
SIGNIFICANCE = 0.05
# What a figure depends on; a difference here explains a change better than the code does.
ENV_KEYS = ("tensorflow", "keras", "python", "cpu", "cores", "gpus", "intra_op_threads", "inter_op_threads",
            "xla_auto_jit", "tf_xla_flags", "dtype_policy", "variables", "git_dirty")
# Arguments that say where output goes, not what was measured.
IGNORED_ARGS = ("out", "profile")


@dataclasses.dataclass(frozen=True)
class RowChange:
    """One row in both runs: B's ratio over A on the primary metric (above 1: B is better)."""

    key: Key
    metric: str
    a: float
    b: float
    ratio: float
    ci95: tuple[float, float] | None
    p_value: float | None
    status: str


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

    @property
    def regressions(self) -> list[RowChange]:
        return [r for r in self.rows if r.status == REGRESSED]

    @property
    def geometric_mean(self) -> float | None:
        """Geometric mean of B's ratios over A on every row with a positive ratio."""
        ratios = [r.ratio for r in self.rows if math.isfinite(r.ratio) and r.ratio > 0]
        return stats.geometric_mean(ratios) if ratios else None


def judge(a: Record, b: Record, *, threshold: float, seed: int = 0) -> RowChange:
    """Row b against row a: significant when the rank test says so and the CI excludes 1; counted only
    when the change is also larger than `threshold`."""
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
        if significant and ratio > 1 + threshold:
            status = IMPROVED
        elif significant and ratio < 1 / (1 + threshold):
            status = REGRESSED
        else:
            status = UNCHANGED
    return RowChange(key, metric, value_a, value_b, ratio, ci, p, status)


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


def _differences(a: Mapping[str, Any], b: Mapping[str, Any], keys: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}


def compare_runs(a: Sequence[Record], b: Sequence[Record], *, threshold: float = 0.05) -> RunComparison:
    """Compare run B with run A (its baseline), row by row, with what differs in environment and arguments."""
    index_a = {(r["recipe"], r["table"], r["row"]): r for r in a}
    index_b = {(r["recipe"], r["table"], r["row"]): r for r in b}
    rows, mismatches = [], []
    for key, rb in index_b.items():
        ra = index_a.get(key)
        if ra is None:
            continue
        if ra["primary"] != rb["primary"] or ra["primary"] not in ra["metrics"]:
            mismatches.append(f"{' / '.join(key)}: primary metric {ra['primary']!r} in A, {rb['primary']!r} in B")
            continue
        rows.append(judge(ra, rb, threshold=threshold))
    env_a, env_b = (a[0]["env"] if a else {}), (b[0]["env"] if b else {})
    args_keys = sorted((set(a[0]["args"]) | set(b[0]["args"])) - set(IGNORED_ARGS)) if a and b else []
    return RunComparison(
        rows=rows,
        only_in_a=[k for k in index_a if k not in index_b],
        only_in_b=[k for k in index_b if k not in index_a],
        metric_mismatches=mismatches,
        env_differences=_differences(env_a, env_b, ENV_KEYS),
        args_differences=_differences(a[0]["args"], b[0]["args"], args_keys) if a and b else {},
        threshold=threshold,
    )
