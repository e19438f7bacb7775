"""What the best-configuration search's races cost on this model and this machine, measured as it climbs, and
whether the next race fits in what is left of the run's budget (--quick's 3 minutes).

A race costs a build for each configuration not already training (a fresh copy compiled, its first epoch traced and
run: 3-4 s on a two-block Transformer, 7-8 s with XLA, on 2 cores) and its rounds of one epoch each. The climb asks
before each race whether it and what must follow it (the headline race and the confirmation, in fresh processes)
still fit; where they do not, the race is left out and said, and the climb goes on with what it kept.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Iterable, Mapping

from tfperf.doctor.climbed import Config

# An XLA build not yet measured on this model, as a multiple of one without XLA: its compile about doubled a build on
# a two-block Transformer (6.6-8.2 s against 3.0-3.7 s, AMD EPYC, 2 cores).
XLA_BUILD = 2.0
# A headline process before its first build: Python, TensorFlow and the model (4-6 s measured as the doctor's own
# start-up here); a code block's build traces fit's step twice, as a user's first fit does (the climb's do not).
CHILD_START_S = 6.0
CHILD_BUILD = 1.5
# The headline race's extensions counted as run, for the headline's configurations only: an extension runs only the
# timers of a comparison still undecided. On Keras Applications' MobileNetV2 (alpha 0.35, 32x32) the headline took
# 88 s where its rounds alone were estimated at about 22 s. Counted for the code blocks' timers too, the estimate for
# the fresh processes on the benchmark's Transformer was 52-55 s where they took 47 s twice (none extended), and it
# left out a batch race that fitted (the best of 60 combinations was in it); counted as here, 48 s.
HEADLINE_EXTENSIONS = 1


@dataclasses.dataclass
class Costs:
    """The seconds each configuration measured: to build (by label, with whether it was XLA) and an epoch."""

    builds: dict[str, tuple[bool, float]] = dataclasses.field(default_factory=dict)
    epochs: dict[str, float] = dataclasses.field(default_factory=dict)

    def built(self, config: Config, seconds: float) -> None:
        """Record a configuration's build."""
        self.builds[config.label] = (config.jit_compile, seconds)

    def raced(self, medians: Mapping[str, float]) -> None:
        """Record the median epoch of each configuration raced, by label."""
        self.epochs.update(medians)

    def build(self, config: Config) -> float:
        """A build's seconds: its own where measured, else the mean of those with the same XLA setting, else of the
        others (times XLA_BUILD for an XLA one); 0 where nothing was measured yet."""
        if config.label in self.builds:
            return self.builds[config.label][1]
        alike = [s for jit, s in self.builds.values() if jit == config.jit_compile]
        if alike:
            return statistics.fmean(alike)
        others = [s for _, s in self.builds.values()]
        return statistics.fmean(others) * (XLA_BUILD if config.jit_compile else 1.0) if others else 0.0

    def epoch(self, config: Config, like: Config) -> float:
        """An epoch's seconds: its own where measured, else the configuration it changes (`like`), else the
        slowest measured."""
        return self.epochs.get(config.label, self.epochs.get(like.label, max(self.epochs.values(), default=0.0)))

    def race(self, configs: Iterable[Config], like: Config, rounds: int, started: Iterable[str] = ()) -> float:
        """A race's seconds: a build for each configuration not in `started`, and `rounds` epochs of each."""
        started = set(started)
        configs = list(configs)
        return (sum(self.build(c) for c in configs if c.label not in started)
                + rounds * sum(self.epoch(c, like) for c in configs))

    def after_climb(self, configs: Iterable[Config], plain: Config, rounds: int,
                    extensions: int = HEADLINE_EXTENSIONS, cores: int | None = None) -> float:
        """What must follow the climb (tfperf/doctor/apart.py): a fresh process that builds `configs` (plain fit,
        the best, the best at the user's batch) and one that builds their code blocks, started
        side by side on the machine's `cores`; then one race of all of them, `rounds` epochs each, and `extensions`
        times as many more of the configurations (an extension runs only an undecided comparison's timers; the code
        blocks' are not counted)."""
        configs = list(dict.fromkeys(configs))
        builds = sum(self.build(c) for c in configs)  # each has its code block too (the best at the user's batch's
        processes = [CHILD_START_S + builds, CHILD_START_S + CHILD_BUILD * builds]  # where the best raised the batch)
        together = max(max(processes), sum(processes) / min(len(processes), cores or os.cpu_count() or 1))
        epochs = sum(self.epoch(c, plain) for c in configs)
        return together + rounds * (2 + extensions) * epochs


@dataclasses.dataclass
class Budget:
    """The time the climb may take: until `ends_by` (time.perf_counter()'s clock; None: no budget), keeping what
    must follow it; what it measured so far (`costs`), the headline's configurations as they stand (plain fit, the
    best, the best at the user's batch) and the races it left out (`cut`)."""

    ends_by: float | None
    rounds: int  # the headline race's and the confirmation's
    costs: Costs = dataclasses.field(default_factory=Costs)
    heading: tuple[Config, ...] = ()
    cut: list[str] = dataclasses.field(default_factory=list)
    cores: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)  # the headline's processes share them

    def left(self) -> float:
        """Seconds until the budget is spent (infinite without one)."""
        return float("inf") if self.ends_by is None else self.ends_by - time.perf_counter()

    def after_s(self, kept: Config | None = None) -> float:
        """The seconds the headline race and the confirmation will take, as the best stands now, or with `kept` as
        the best (a new batch puts it beside the best at the user's batch: one more configuration to race)."""
        plain, best = self.heading[0], self.heading[1 if len(self.heading) > 1 else 0]
        heading = self.heading
        if kept is not None:
            at_yours = self.heading[2] if len(self.heading) > 2 else best if best.batch == plain.batch else plain
            heading = tuple(dict.fromkeys((plain, kept, kept if kept.batch == plain.batch else at_yours)))
        return self.costs.after_climb(heading, plain, self.rounds, cores=self.cores)

    def fits(self, race_s: float, candidates: Iterable[Config] = ()) -> bool:
        """Whether a race of about `race_s` seconds, and what must follow it whichever of its `candidates` it keeps,
        fit in what is left. (On a scripted climb the after-climb time grew from 60 s to 72 s when a batch race kept
        a new batch, and the run went past its budget.)"""
        if self.ends_by is None or not self.heading:
            return True
        return race_s + max([self.after_s(), *[self.after_s(c) for c in candidates]]) <= self.left()

    def refusal(self, step: str, race_s: float, partly: bool = False) -> str:
        """Why the race `step`, of about `race_s` seconds, is not run (`partly`: why its candidates named in `step`
        are not); `step` is noted as cut."""
        self.cut.append(step)
        return (f"not raced: about {race_s:.0f} s{' for the race with them' if partly else ''}, where "
                f"{max(self.left(), 0.0):.0f} s of the --budget were left and the headline race and the confirmation "
                f"need about {self.after_s():.0f} s (measured on this model as the climb went); without --quick, or "
                f"with a larger --budget, it runs")
