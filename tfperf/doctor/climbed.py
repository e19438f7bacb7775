"""What the best-configuration search (tfperf/doctor/search.py) works with and finds: a configuration of compile()
and fit(), the lines that apply it, each rung the climb tried, and the answer as the report says it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tfperf.doctor.confirm import confirmation_text
from tfperf.doctor.targets import PLAIN_BATCH, mixed_code
from tfperf.records.units import number

EXAMPLES_SAID = 10_000  # the gain in seconds for this many examples, where the user's epoch is not known
EXCHANGED = " (an exchange)"  # how an exchange's row ends (search.EXCHANGES)


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration of compile() and fit(): plain `model.fit(x, y)` at the user's batch is `plain_fit(...)`
    (Config() at Keras' default batch)."""

    jit_compile: bool = False
    steps_per_execution: int = 1
    policy: str | None = None
    batch: int = PLAIN_BATCH
    base: int = PLAIN_BATCH  # the user's own batch: plain fit's, which a batch change is said against

    @property
    def label(self) -> str:
        """What it changes from plain fit, or "plain fit"."""
        changes = [*(["jit_compile=True"] if self.jit_compile else []),
                   *([f"steps_per_execution={self.steps_per_execution}"] if self.steps_per_execution > 1 else []),
                   *([self.policy] if self.policy else []),
                   *([f"batch {self.batch}"] if self.batch != self.base else [])]
        return ", ".join(changes) or f"plain fit (batch {self.base})"

    @property
    def learning_rate_scale(self) -> float:
        """The square-root rule: a batch k times larger takes k times fewer steps, each sqrt(k) times larger."""
        return math.sqrt(self.batch / self.base)

    def compile_options(self) -> dict[str, Any]:
        """compile()'s keywords that differ from its defaults."""
        return {**({"jit_compile": True} if self.jit_compile else {}),
                **({"steps_per_execution": self.steps_per_execution} if self.steps_per_execution > 1 else {})}


def change(knob: str, value: Any) -> str:
    """What setting one knob to a value says, as a row: "jit_compile=True", "batch 128", "float32"."""
    if knob == "batch":
        return f"batch {value}"
    if knob == "policy":
        return value or "float32"
    return f"{knob}={value}"


def code_lines(config: Config, builds_under_policy: bool) -> list[str]:
    """The recommendation as the lines a user changes: the policy (where the model is built or loaded), compile()
    with the user's own optimizer and loss, fit() with the batch, and the learning rate scaled with it."""
    lines = [mixed_code(config.policy, builds_under_policy)] if config.policy else []
    if config.batch != config.base:
        lines.append(f"optimizer.learning_rate = float(optimizer.learning_rate) * {config.learning_rate_scale:.3g}  "
                     f"# sqrt({config.batch}/{config.base}): fewer, larger steps (linear: "
                     f"x{config.batch / config.base:.3g}"
                     f"; a schedule: scale its initial rate)")
    keywords = "".join(f", {k}={v!r}" for k, v in config.compile_options().items())
    lines.append(f"model.compile(optimizer=optimizer, loss=loss{keywords})")
    lines.append(f"model.fit(x, y, batch_size={config.batch})")
    return lines


@dataclasses.dataclass
class Rung:
    """One rung tried: against what, its comparison, whether it was kept, its loss beside plain fit's."""

    row: str
    base: str
    comparison: Any  # stats.Comparison
    kept: bool
    loss: float
    plain_loss: float
    note: str = ""
    batch: int | None = None  # the candidate's batch


OVER_YOURS = "the best against the best at your batch"  # where the best raised the batch


def batch_paid(best: Config, at_your_batch: Config, comparisons: dict[str, Any]) -> tuple[Config, Any]:
    """The configuration to recommend, and the comparison that set the larger batch aside (None where it did not):
    the climb kept the larger batch where its interval cleared the bar; it is set aside where the headline race, in
    a fresh process, puts it below the same changes at the user's batch. On the benchmark's Transformer the climb
    kept batch 512 at 1.25x (95% CI 1.05-1.37x) where the fresh race put it at 1.57x against plain fit and the best
    at the user's batch at 1.70x. Not where the fresh race merely cannot tell them apart: its epochs (512 rows there)
    carry a fixed cost a larger batch does not shrink, and batch 64 read 1.06x (0.94-1.17x) over batch 32 in it where
    a plain script's epochs of 2,048 rows measured 1.24x."""
    c = comparisons.get(OVER_YOURS)
    if c is None or c.ratio >= 1.0:
        return best, None
    return at_your_batch, c


@dataclasses.dataclass
class Climbed:
    """What the search found: the rungs, the best configuration (and the best at the user's batch size), the
    headline race against plain fit, and the confirmation in a fresh process."""

    rungs: list[Rung]
    best: Config
    at_your_batch: Config
    headline: dict[str, Any]  # row -> stats.Comparison against plain fit
    code: list[str]
    confirmed: dict[str, Any] | None = None  # the fresh process's reply
    losses: dict[str, float] = dataclasses.field(default_factory=dict)  # final loss per headline row
    plain: Config = dataclasses.field(default_factory=Config)  # plain fit at the user's batch
    rates: dict[str, float] = dataclasses.field(default_factory=dict)  # examples a second per headline row
    epoch: int | None = None  # the examples in one of the user's epochs (--epoch-examples), where known
    cut: list[str] = dataclasses.field(default_factory=list)  # the climb's races the budget left out
    drawn: list[str] = dataclasses.field(default_factory=list)  # the layers that draw at random in training
    apart: bool = False  # the headline race ran in a fresh process, not the climb's (tfperf/doctor/apart.py)
    # The climb's best, set aside where its larger batch was not faster than `best` (the best at the user's batch)
    # in the headline race, and that comparison.
    set_aside: tuple[Config, Any] | None = None

    @property
    def pays(self) -> bool:
        """Whether the best configuration measured faster than plain fit in its own race."""
        from tfperf.measure.stats import FASTER

        return self.best != self.plain and self.headline[self.best.label].verdict == FASTER

    def describe(self) -> str:
        """The answer first: the recommendation, its gain, its code, and the confirmation."""
        if self.best == self.plain and not self.rungs:  # the budget held no race (a model whose builds are long)
            return f"**Best configuration for training**: plain fit, as no change was raced.{self._cut_text()}\n"
        if self.best == self.plain:
            tried = ", ".join(r.row for r in self.rungs)
            return (f"**Best configuration for training**: plain fit; no change tried on top of it paid "
                    f"({tried}).{self._cut_text()}\n")
        c = self.headline[self.best.label]
        if not self.pays:
            return (f"**Best configuration for training**: plain fit. The climb kept {self.best.label}, but raced "
                    f"against plain fit in a race of its own it measured {c.describe()}: nothing is recommended "
                    f"(rerun without --quick for more rounds).{self._cut_text()}\n")
        apart = ", raced in a fresh process that trained nothing else" if self.apart else ""
        lines = [f"**Best configuration for training**: {self.best.label}: {c.describe()} against plain fit "
                 f"(batch {self.plain.batch}){apart}, every kept rung on top of the ones before it"
                 f"{self._in_seconds()}. "
                 f"Apply it as:", "",
                 "```python", *self.code, "```", ""]
        lines.append("Each kept rung's gain on top of those before it: " + "; ".join(
            f"{r.row} {r.comparison.describe()}" for r in self.rungs if r.kept and (
                self.set_aside is None or r.batch in (None, self.plain.batch))) + "." + self._set_aside_text()
            + self._cut_text() + self._drawn_text())
        if self.best.batch != self.plain.batch:
            lines.append(self._batch_text())
        lines.append(self._confirmation())
        return "\n".join(lines) + "\n"

    def _set_aside_text(self) -> str:
        """Why the climb's best, at a larger batch, is not the one recommended (empty where it is)."""
        if self.set_aside is None:
            return ""
        climbed, c = self.set_aside
        kept = [r for r in self.rungs if r.kept and r.batch not in (None, self.plain.batch)]
        said = f" ({'; '.join(f'{r.row} {r.comparison.describe()}' for r in kept)})" if kept else ""
        losses = ""
        if climbed.label in self.losses and self.plain.label in self.losses:
            losses = (f"; its loss after the same examples was {number(self.losses[climbed.label], 4)} against "
                      f"plain fit's {number(self.losses[self.plain.label], 4)}")
        return (f" The climb kept {climbed.label}{said}, but in the race of its own it measured "
                f"{c.describe()} against the above at your batch of {self.plain.batch}: a larger batch changes the "
                f"optimisation, so it is recommended only where it pays{losses}.")

    def _drawn_text(self) -> str:
        """That the model draws at random in training, so no change's loss was held to another's (empty if not)."""
        if not self.drawn:
            return ""
        return (f" The model draws at random in training ({', '.join(self.drawn)}): two runs from the same weights end "
                f"at different losses, so no change was held to the loss of the configuration it changes; each "
                f"loss is in the climb's lines.")

    def _cut_text(self) -> str:
        """The races the budget left out, in one sentence (empty where it left none out)."""
        if not self.cut:
            return ""
        return (f" The --budget left out the climb's {'race' if len(self.cut) == 1 else 'races'} of "
                f"{'; '.join(self.cut)} (each under Not measured with its estimate): a larger --budget, or a run "
                f"without --quick, races {'it' if len(self.cut) == 1 else 'them'}, and may find more.")

    def _in_seconds(self) -> str:
        """The gain in the user's time: an epoch of theirs (where known), else every 10,000 examples."""
        plain, best = self.rates.get(self.plain.label), self.rates.get(self.best.label)
        if not plain or not best:
            return ""
        examples, what = (self.epoch, f"an epoch of your {self.epoch:,} examples") if self.epoch else (
            EXAMPLES_SAID, f"every {EXAMPLES_SAID:,} examples")
        return (f": {what} in {number(examples / best, 2)} s instead of {number(examples / plain, 2)} s "
                f"(at the examples a second measured here)")

    def _batch_text(self) -> str:
        loss, plain = self.losses[self.best.label], self.losses[self.plain.label]
        said = (f"Batch {self.best.batch} changes the optimisation: after the same examples its loss was "
                f"{number(loss, 4)} "
                f"against plain fit's {number(plain, 4)} (learning rate scaled by the square-root rule).")
        if self.at_your_batch == self.plain:
            return said + f" At your batch of {self.plain.batch}, no other change paid."
        return said + (f" At your batch of {self.plain.batch}, the best is {self.at_your_batch.label}: "
                       f"{self.headline[self.at_your_batch.label].describe()} against plain fit.")

    def climb_text(self) -> str:
        """Every rung tried, against what, and whether it was kept: the report's own part for the search."""
        lines = ["## Best configuration: the climb", "",
                 "Each knob's values are raced together on top of the best configuration so far, from the same "
                 "weights on the same rows; the fastest is kept where its 95% interval clears the bar and its loss "
                 "after the same examples agrees with the configuration it changes (a larger batch's loss is said, "
                 "not held to the bar). A knob is raced again once the others changed." + (
                     " Where a pass changed nothing, XLA and the mixed policy, which can each pay alone and not "
                     "together, were exchanged." if any(r.row.endswith(EXCHANGED) for r in self.rungs) else ""), ""]
        for r in self.rungs:
            lines.append(f"- {r.row}, on top of {r.base}: {r.comparison.describe()}; final loss "
                         f"{number(r.loss, 4)} (plain "
                         f"fit {number(r.plain_loss, 4)}): {'**kept**' if r.kept else 'not kept'}"
                         + (f" ({r.note})" if r.note and not r.kept else ""))
        return "\n".join(lines) + "\n"

    def _confirmation(self) -> str:
        # Only a headline raced apart from the climb is confirmed: the code blocks are built in a second process.
        how = ("the code above and plain fit's lines, built as printed in a second fresh process, raced in the same "
               "rounds")
        return confirmation_text(self.confirmed, how, lambda c: f"{c['plain_samples_per_s']:,.0f} -> "
                                 f"{c['best_samples_per_s']:,.0f} examples/s", self.headline[self.best.label],
                                 apart=True)
