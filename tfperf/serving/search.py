"""The search for the best serving configuration within a latency budget, pruned as Model Analyzer prunes.

Each configuration is swept in closed loop (concurrency 1, 2, 4, ...) until its percentile passes the
budget or throughput stops growing; its closed-loop rate is the throughput of the highest concurrency
still within the budget (perf_analyzer's latency-bound mode). The pruning: a runtime and thread count
that misses the budget one request at a time is dropped with everything built on it (batching only
adds to a lone request's time); instances, and then max_batch_size under each batching policy, grow
while the rate gains at least `min_gain` (5%) over the step before. The best few are then searched in
open loop (LoadGen's Server scenario: Poisson arrivals, latency from scheduled time) for the highest
rate whose percentile stays within the budget, and the winner is validated by a longer LoadGen run.

The search itself only calls `sweep(config)`; measuring lives in `tfperf.serving.pipeline`, so that the
pruning is tested on sweeps of known speed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

from tfperf.measure.load import LoadLevel
from tfperf.serving.batcher import BatchingOptions
from tfperf.serving.configs import ServingConfig

MIN_GAIN = 0.05  # Model Analyzer stops growing a dimension when throughput gains less than this


@dataclasses.dataclass(frozen=True)
class Budget:
    """A latency bound on a percentile of requests: p99 within 10 ms by default."""

    latency_s: float = 0.010
    percentile: float = 99.0

    def met(self, level: LoadLevel) -> bool:
        return level.count > 0 and not level.errors and level.percentile_s(self.percentile) <= self.latency_s

    def __str__(self) -> str:
        return f"p{self.percentile:g} <= {self.latency_s * 1e3:g} ms"


@dataclasses.dataclass(frozen=True)
class Swept:
    """One configuration's closed-loop sweep, or why it was dropped."""

    config: ServingConfig
    levels: tuple[LoadLevel, ...] = ()
    dropped: str | None = None  # why: it fails, disagrees with the model, or misses the budget alone
    padding: float | None = None  # tokens asked for over tokens computed (requests of different lengths)
    splits: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)  # level label -> the
    # server's own split of the time (tfperf.serving.scrape), when its metrics were read
    outputs_vary: bool | None = None  # False: the model answered every request alike (agreement shows nothing)

    def rate_within(self, budget: Budget) -> float:
        """The throughput of the best level whose percentile is within the budget (0 when none is)."""
        return max((lv.throughput for lv in self.levels if budget.met(lv)), default=0.0)

    def best_level(self, budget: Budget) -> LoadLevel | None:
        within = [lv for lv in self.levels if budget.met(lv)]
        return max(within, key=lambda lv: lv.throughput) if within else None


def concurrency_sweep(measure: Callable[[int], LoadLevel], budget: Budget, *, start: int = 1, limit: int = 64,
                      min_gain: float = MIN_GAIN, factor: int = 2, bisect: int = 0) -> list[LoadLevel]:
    """Closed-loop levels at concurrency start, `factor` times that, ... until the percentile passes the budget,
    throughput gains under `min_gain`, or `limit` is reached; a step that would pass `limit` measures `limit`
    itself (1, 4, 16, 32 at a factor of 4 and a limit of 32), so a server still gaining is measured there. Where
    the budget stopped it, up to `bisect` more levels halve the gap between the last level within it and the first
    over (perf_analyzer's --binary-search): the answer is not one of the doubling's levels. In concurrency order."""
    measured, concurrency = {}, start
    while concurrency <= limit:
        level = measured[concurrency] = measure(concurrency)
        if not budget.met(level):
            break
        within = [c for c in measured if c < concurrency]
        if within and level.throughput < measured[max(within)].throughput * (1 + min_gain):
            break
        if concurrency == limit:
            break
        concurrency = min(concurrency * factor, limit)
    over = [c for c, level in measured.items() if not budget.met(level)]
    met = [c for c, level in measured.items() if budget.met(level)]
    if over and met:
        low, high = max(met), min(over)
        for _ in range(bisect):
            middle = (low + high) // 2
            if middle == low:
                break
            measured[middle] = measure(middle)
            low, high = (middle, high) if budget.met(measured[middle]) else (low, middle)
    return [measured[c] for c in sorted(measured)]


@dataclasses.dataclass(frozen=True)
class Space:
    """What the search may try: runtimes, threads per runtime, instances, and batching."""

    runtimes: tuple[str, ...]
    threads: dict[str, tuple[int | None, ...]]  # runtime -> thread counts to try (None: the runtime's own)
    instances: tuple[int, ...] = (1, 2, 4)
    batch_sizes: tuple[int, ...] = (4, 8, 16, 32, 64)
    timeouts_us: tuple[int, ...] = (1000,)  # batching policies that wait; "run when idle" is always tried
    min_gain: float = MIN_GAIN
    # How batches of requests of different lengths are padded (BatchingOptions fields): each tried in turn;
    # ({},): requests all of one length.
    length_policies: tuple[dict, ...] = ({},)


def _grow(sweep: Callable[[ServingConfig], Swept], configs: Sequence[ServingConfig], budget: Budget,
          min_gain: float, swept: list[Swept]) -> Swept | None:
    """Sweep configurations in order while each gains at least `min_gain` over the previous; the best."""
    best: Swept | None = None
    for config in configs:
        result = sweep(config)
        swept.append(result)
        if result.dropped:
            break
        if best is not None and result.rate_within(budget) < best.rate_within(budget) * (1 + min_gain):
            if result.rate_within(budget) > best.rate_within(budget):
                best = result
            break
        best = result
    return best


def search(sweep: Callable[[ServingConfig], Swept], space: Space, budget: Budget,
           should_stop: Callable[[], bool] = lambda: False) -> list[Swept]:
    """Every configuration swept, in the order tried (dropped ones with their reason); pruned as the module says."""
    swept: list[Swept] = []
    for runtime in space.runtimes:
        for threads in space.threads.get(runtime, (None,)):
            if should_stop():
                return swept
            alone = sweep(ServingConfig(runtime, threads, 1))
            swept.append(alone)
            if alone.dropped or not alone.levels or not budget.met(alone.levels[0]):
                continue  # fails, or misses the budget one request at a time: nothing built on it can meet it
            more = [ServingConfig(runtime, threads, n) for n in space.instances if n > 1]
            best = _grow(sweep, more, budget, space.min_gain, swept) if more else None
            if best is None or best.rate_within(budget) < alone.rate_within(budget):
                best = alone
            instances = best.config.instances
            for policy in space.length_policies:
                for timeout in (None, *space.timeouts_us):  # None: a batch runs as soon as a thread is idle
                    if should_stop():
                        return swept
                    batched = [ServingConfig(runtime, threads, instances, BatchingOptions(
                        max_batch_size=size, batch_timeout_micros=timeout or 0, idle_runs_now=timeout is None,
                        **policy)) for size in space.batch_sizes]
                    _grow(sweep, batched, budget, space.min_gain, swept)
    return swept


def ranked(swept: Sequence[Swept], budget: Budget) -> list[Swept]:
    """The configurations that meet the budget at some load, best closed-loop rate first."""
    usable = [s for s in swept if not s.dropped and s.rate_within(budget) > 0]
    return sorted(usable, key=lambda s: -s.rate_within(budget))


def bracket_rate(within: Callable[[float], bool], start: float, *, steps: int = 4, up: float = 1.15,
                 down: float = 0.7, limit: float = math.inf) -> tuple[float, float]:
    """The highest rate found within the budget and the lowest found over it (inf when none was), probing
    from `start` up by `up` while within and down by `down` while over, `steps` probes at most, never above
    `limit` (the capacity measured in closed loop: a higher rate only builds a queue, which a short probe
    may not live long enough to see)."""
    met, missed, rate = 0.0, math.inf, min(start, limit)
    for _ in range(steps):
        if within(rate):
            met = max(met, rate)
            if min(rate * up, limit) >= missed or rate >= limit:
                break
            rate = min(rate * up, limit)
        else:
            missed = min(missed, rate)
            rate = max(rate * down, met * (1 + (up - 1) / 2)) if met else rate * down
            if met and rate >= missed:
                break
    return met, missed
