"""What a timing says: the raw samples of one timed function and their statistics (NumPy only).

A `Measurement` keeps the raw samples and knows its median, IQR, percentiles, the confidence interval
of its median and whether it is stable; `versus` turns two Measurements into a speedup with a
bootstrap confidence interval and a verdict. Nothing here imports TensorFlow: `tfperf compare` and
the report read stored samples with it and answer at once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tfperf.measure import stats

Clock = Callable[[], float]
LATENCY, THROUGHPUT = "latency", "throughput"


@dataclasses.dataclass(frozen=True)
class Elapsed:
    """What a timed function returns when only part of its call is the work: `fit` for one epoch
    returns the epoch's own time (from a callback), without the data adapter and callbacks it sets up."""

    seconds: float
    result: Any = None


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Raw samples of one timed function and what they say; times are seconds per call unless named per item.

    `samples_s` holds one clock reading per sample: one call in latency mode, `block_size` calls in
    throughput mode. With `rounds` > 1 the samples were taken in that many interleaved rounds, an
    equal number in each, in order.
    """

    name: str
    samples_s: tuple[float, ...]
    block_size: int = 1
    items_per_call: int = 1
    rounds: int = 1
    first_call_s: float | None = None
    overhead_s: float | None = None  # the sync and the clock read, per sample, timed on a null function

    def __post_init__(self):
        if len(self.samples_s) == 0:
            raise ValueError(f"measurement {self.name!r} has no samples: steps must be at least 1")
        if self.block_size < 1 or self.items_per_call < 1:
            raise ValueError(f"block_size and items_per_call must be at least 1, got "
                             f"{self.block_size} and {self.items_per_call}")
        if self.rounds < 1 or len(self.samples_s) % self.rounds:
            raise ValueError(f"{len(self.samples_s)} samples do not split into {self.rounds} equal rounds")

    @property
    def mode(self) -> str:
        """'latency' (one call per clock read) or 'throughput' (blocks of calls)."""
        return LATENCY if self.block_size == 1 else THROUGHPUT

    @property
    def n(self) -> int:
        """Number of samples."""
        return len(self.samples_s)

    # The statistics below are computed once per Measurement (it is frozen): a record asks for eight of them, and
    # `tfperf compare` over many runs asked for each again, sorting the same samples every time.
    @functools.cached_property
    def per_call_s(self) -> np.ndarray:
        """Each sample as seconds per call (read-only: it is shared by every statistic)."""
        per_call = np.asarray(self.samples_s, dtype=np.float64) / self.block_size
        per_call.flags.writeable = False
        return per_call

    @property
    def per_item_s(self) -> np.ndarray:
        """Each sample as seconds per item (a row, an example)."""
        return self.per_call_s / self.items_per_call

    def percentile_s(self, q: float) -> float:
        """A true percentile of the per-call times (np.percentile, nothing trimmed)."""
        return self._percentiles(q)[0]

    def _percentiles(self, *qs: float) -> list[float]:
        """Several percentiles, those not yet known computed in one pass and kept."""
        known = self.__dict__.setdefault("_percentiles_s", {})  # frozen: the cache lives beside the fields
        missing = [q for q in qs if q not in known]
        if missing:
            known.update(zip(missing, map(float, np.percentile(self.per_call_s, missing))))
        return [known[q] for q in qs]

    @property
    def median_s(self) -> float:
        return self.percentile_s(50)

    @property
    def p90_s(self) -> float:
        return self.percentile_s(90)

    @property
    def p99_s(self) -> float:
        return self.percentile_s(99)

    @property
    def min_s(self) -> float:
        return float(self.per_call_s.min())

    @property
    def max_s(self) -> float:
        return float(self.per_call_s.max())

    @property
    def mean_s(self) -> float:
        return float(self.per_call_s.mean())

    @property
    def iqr_s(self) -> float:
        """Interquartile range of the per-call times."""
        return self.percentile_s(75) - self.percentile_s(25)

    @functools.cached_property
    def ci95_s(self) -> tuple[float, float]:
        """95% confidence interval of the median time per call (order statistics, distribution-free)."""
        return stats.median_ci(self.per_call_s)

    @property
    def median_per_item_s(self) -> float:
        """Median time per call divided by the items in a call."""
        return self.median_s / self.items_per_call

    @property
    def items_per_s(self) -> float:
        """Items per second at the median time."""
        return self.items_per_call / self.median_s if self.median_s > 0 else float("inf")

    @property
    def relative_iqr(self) -> float:
        """IQR over median: the spread that makes a measurement untrustworthy when large."""
        return self.iqr_s / self.median_s if self.median_s > 0 else float("inf")

    @property
    def warnings(self) -> tuple[str, ...]:
        """Reasons not to trust this measurement, in words (empty when there are none)."""
        found = []
        if self.n >= 4 and self.relative_iqr > stats.UNSTABLE_IQR:
            found.append(f"unstable: IQR is {self.relative_iqr:.0%} of the median (over "
                         f"{stats.UNSTABLE_IQR:.0%}): more samples, or a quieter machine")
        if self.n < 6:
            found.append(f"only {self.n} samples: the 95% CI of the median is the whole range")
        if self.overhead_s is not None and self.overhead_s > 0.1 * self.median_s * self.block_size:
            found.append(f"sync and clock overhead ({self.overhead_s * 1e6:.1f} us) is over 10% of a sample: "
                         f"time blocks of calls (throughput mode)")
        return tuple(found)

    def summary(self) -> dict[str, Any]:
        """The figures a record keeps beside the raw samples."""
        self._percentiles(25, 50, 75, 90, 99)
        return {"n": self.n, "block_size": self.block_size, "rounds": self.rounds, "mode": self.mode,
                "first_call_s": self.first_call_s, "overhead_s": self.overhead_s,
                "median_s": self.median_s, "iqr_s": self.iqr_s, "p90_s": self.p90_s, "p99_s": self.p99_s,
                "ci95_s": list(self.ci95_s), "warnings": list(self.warnings)}

    def __str__(self) -> str:
        low, high = self.ci95_s
        return (f"{self.name}: median {_time(self.median_s)} (95% CI {_time(low)}-{_time(high)}), "
                f"IQR {_time(self.iqr_s)}, n={self.n}{' x ' + str(self.block_size) if self.block_size > 1 else ''}"
                + "".join(f"\n  WARNING: {w}" for w in self.warnings))


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def versus(baseline: Measurement, candidate: Measurement, *, threshold: float = 0.0,
           seed: int = 0, statistic: str = "median") -> stats.Comparison:
    """How many times faster `candidate` is than `baseline` per item, with a bootstrap 95% CI and a verdict.

    Measurements taken by the same `interleave` (the same rounds) are compared round by round. `statistic="mean"`
    compares their totals rather than their medians.
    """
    paired = baseline.rounds > 1 and baseline.rounds == candidate.rounds
    return stats.compare_times(baseline.per_item_s, candidate.per_item_s, names=(baseline.name, candidate.name),
                               rounds=baseline.rounds if paired else None, threshold=threshold, seed=seed,
                               statistic=statistic)


def one_after_another(measurements: Sequence[Measurement], *, name: str) -> Measurement:
    """What running the measured calls one after another costs: their per-call samples summed sample by
    sample. They must come from the same `interleave` (equal counts, the same rounds), so that each sum
    adds times taken in the same phase of the machine."""
    counts = {(m.n, m.rounds) for m in measurements}
    if len(counts) != 1:
        raise ValueError(f"cannot add samples of different counts or rounds: {sorted(counts)}")
    total = np.sum([m.per_call_s for m in measurements], axis=0)
    return Measurement(name=name, samples_s=tuple(float(t) for t in total), rounds=measurements[0].rounds)


def timing_ms(m: Measurement) -> dict[str, float | None]:
    """The usual columns of a timing table, in milliseconds per call."""
    return {
        "first_call_ms": None if m.first_call_s is None else m.first_call_s * 1e3,
        "median_ms": m.median_s * 1e3,
        "p90_ms": m.p90_s * 1e3,
        "p99_ms": m.p99_s * 1e3,
    }
