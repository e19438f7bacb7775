"""Alternatives measured side by side: shuffled interleaved rounds, and races that run on while undecided.

`interleave` gives every timer its share of samples in each round, in a shuffled order, so that a
slow phase of the machine falls on all of them alike; `race` compares each timer with the first and
adds rounds while a comparison's interval straddles a verdict's bar. Timers are anything with
`name`, `start`, `take`, `profile` and `_measurement` (a `SampleSource`): a `Timer`, or a `RemoteTimer`
whose samples are taken in another process (no TensorFlow is needed in this one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from tfperf.measure import stats
from tfperf.measure.measurement import Measurement, versus


class SampleSource(Protocol):
    """What `interleave` needs of a timer: a `Timer`, or a `RemoteTimer` served by another process."""

    name: str

    def start(self, warmup: int = 1) -> float | None: ...

    def take(self, samples: int) -> list[float]: ...

    def profile(self, profile_dir: str | None, *, steps: int = 10) -> None: ...

    def _measurement(self, samples: Sequence[float], *, rounds: int) -> Measurement: ...


def _share(timer: SampleSource, per_round_s: float) -> int:
    """Samples a timer takes per round to fill `per_round_s`: one when a single call already does (a slow
    call is not made three times just to be timed), else from the median of three calls."""
    first = timer.take(1)[0]
    if first >= per_round_s:
        return 1
    typical = float(np.median([first, *timer.take(2)]))
    return max(1, round(per_round_s / max(typical, 1e-9)))


def interleave(timers: Sequence[SampleSource], *, rounds: int = 10, samples: int | None = None,
               warmup: int = 1, min_time_s: float = 0.5, seed: int = 0,
               profile_dir: str | None = None, profile_steps: int = 10,
               after: Sequence[Measurement] = ()) -> list[Measurement]:
    """Measure alternatives in `rounds` rounds; each round takes a share of every timer's samples, the
    timers in a shuffled order, so that slow phases of the machine fall on all of them alike.

    `samples` is each timer's total (rounded up to whole rounds); with None, each timer takes as many
    as fill about `min_time_s`, estimated from up to three calls after its warm-up (`_share`). Compare the results with
    `versus`, which pairs them round by round. `after` continues earlier measurements of the same
    timers (from interleave, in the same order; with `samples` None, at the same share per round):
    their rounds come first in what is returned.
    """
    if not timers:
        raise ValueError("interleave needs at least one timer")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if samples is not None and samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    names = [t.name for t in timers]
    if len(set(names)) != len(names):
        raise ValueError(f"timers need distinct names, got {names}")
    if after and [m.name for m in after] != names:
        raise ValueError(f"`after` must hold the same timers' measurements in order, got {[m.name for m in after]}")
    for t in timers:
        t.start(warmup)
    if samples is not None:
        per_round = [-(-samples // rounds)] * len(timers)
    elif after:  # the same share per round as before, so that every round weighs the same
        per_round = [m.n // m.rounds for m in after]
    else:
        per_round = [_share(t, min_time_s / rounds) for t in timers]
    rng = np.random.default_rng(seed)
    taken: list[list[float]] = [[] for _ in timers]
    for _ in range(rounds):
        for i in rng.permutation(len(timers)):
            taken[i].extend(timers[i].take(per_round[i]))
    for t in timers:
        t.profile(profile_dir, steps=profile_steps)
    if after:
        return [t._measurement([*m.samples_s, *s], rounds=m.rounds + rounds) for t, m, s in zip(timers, after, taken)]
    return [t._measurement(s, rounds=rounds) for t, s in zip(timers, taken)]


Baseline = str | Callable[[Mapping[str, Measurement]], Measurement]


def race(timers: Sequence[SampleSource], *, rounds: int, samples: int | None = None, threshold: float = 0.0,
         max_extensions: int = 2, seed: int = 0, warmup: int = 1, min_time_s: float = 0.5,
         profile_dir: str | None = None, profile_steps: int = 10,
         on_first_rounds: Callable[[list[Measurement]], None] | None = None,
         against: Mapping[str, Baseline] | None = None) -> tuple[list[Measurement], list[stats.Comparison]]:
    """Interleave the timers and compare each with its baseline (`versus`); while a comparison's CI
    straddles a verdict's bar (not `decided`), run `rounds` more rounds of the timers it compares (and
    only those), at most `max_extensions` times: a gain near the bar is then settled by more data, not
    by which side one run's noise fell on, and no time is spent on comparisons already decided (their
    verdict stands as first reached). `on_first_rounds` sees the measurements before any extension (a
    training race reads its losses there, after the same epochs for everyone).

    `against` maps a timer's name to its baseline: another timer's name, or a function of the
    measurements by name (e.g. two timers' samples added, `one_after_another`; every timer then counts
    as compared); by default every timer after the first is compared with the first. Returns the
    measurements, in the timers' order, and the comparisons, in the order of `against`."""
    names = [t.name for t in timers]
    pairs = dict(against) if against is not None else {name: names[0] for name in names[1:]}

    def compare(by_name: Mapping[str, Measurement], row: str) -> stats.Comparison:
        base = pairs[row]
        return versus(base(by_name) if callable(base) else by_name[base], by_name[row], threshold=threshold)

    ms = interleave(timers, rounds=rounds, samples=samples, warmup=warmup, min_time_s=min_time_s, seed=seed,
                    profile_dir=profile_dir, profile_steps=profile_steps)
    if on_first_rounds is not None:
        on_first_rounds(ms)
    found = dict(zip(names, ms))
    comparisons = {row: compare(found, row) for row in pairs}
    for extension in range(1, max_extensions + 1):
        open_rows = [row for row, c in comparisons.items() if not c.decided]
        if not open_rows:
            break
        involved = {n for row in open_rows for n in ([row, pairs[row]] if not callable(pairs[row]) else names)}
        chosen = [t for t in timers if t.name in involved]
        more = interleave(chosen, rounds=rounds, samples=samples, warmup=0, min_time_s=min_time_s,
                          seed=seed + extension, after=[found[t.name] for t in chosen])
        found.update({t.name: m for t, m in zip(chosen, more)})
        comparisons.update({row: compare(found, row) for row in open_rows})
    return [found[n] for n in names], list(comparisons.values())
