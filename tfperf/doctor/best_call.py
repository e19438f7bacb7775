"""Best way to call: "what should my serving call be, one request at a time and in batches, with every change that
pays together?"

The inference tables race each way of calling the model against the user's own call, one batch size at a time. This
takes each goal in turn (latency: batch 1; throughput: rows a second at any larger batch swept) and races together
every way that keeps the model's answers, an export at every thread count (LiteRT and ONNX Runtime take theirs when
the export is loaded; TensorFlow's are fixed when it starts, which the threads section races in processes of their
own); the fastest is then raced against the user's call in a race of its own: one recommendation per goal, as code,
its gain in the goal's units.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from tfperf.deploy.errors import first_line
from tfperf.deploy.formats import FLOAT_TOLERANCE, agreement
from tfperf.doctor.call_confirm import SHELL, code_lines, confirm_calls
from tfperf.doctor.confirm import confirmation_text
from tfperf.doctor.experiment import Context, Experiment, Section, flag
from tfperf.doctor.calls import RUNTIMES, STOCHASTIC_MARGIN, Table, Tables
from tfperf.doctor.options import MIN_GAIN, Finding
from tfperf.records.units import number

GOALS = ("latency", "throughput")
HEADLINE_ROUNDS = 2  # the headline race takes this many times the rounds: it is the figure the user acts on


@dataclasses.dataclass(frozen=True)
class Way:
    """One way of calling the model: a row of an inference table, at its batch, with an exported runtime's threads
    (None: as the table ran it, all cores for an export, TensorFlow's own pools otherwise)."""

    row: str
    batch: int
    threads: int | None = None

    @property
    def label(self) -> str:
        """The row, its batch and its threads, as the report says it."""
        threads = "" if self.threads is None else f", {self.threads} thread" + ("s" if self.threads > 1 else "")
        return f"{self.row}{threads} at batch {self.batch}"


@dataclasses.dataclass
class Step:
    """One way the search raced: against what (the user's call), the comparison, and whether it was the fastest."""

    tried: str
    base: str
    comparison: Any  # stats.Comparison
    kept: bool


@dataclasses.dataclass
class Called:
    """One goal's answer: the user's call, the best way found, the steps to it, the headline race and the code."""

    goal: str
    baseline: Way
    best: Way
    steps: list[Step]
    measured: dict[str, Any] = dataclasses.field(default_factory=dict)  # Measurement by Way.label (the headline)
    headline: Any = None  # stats.Comparison of best against baseline, or None where the best is the user's call
    code: list[str] = dataclasses.field(default_factory=list)
    confirmed: dict[str, Any] | None = None  # the code block raced against the user's call in a fresh process
    spread: float = 0.0  # a stochastic model's own call-to-call difference (0: deterministic): "keeps" means "alike"

    @property
    def pays(self) -> bool:
        """Whether the headline race shows the best way faster than the user's call."""
        from tfperf.measure.stats import FASTER

        return self.headline is not None and self.headline.verdict == FASTER

    def units(self, way: Way) -> str:
        """The goal's figure for a way: ms a call for latency, rows a second for throughput."""
        m = self.measured[way.label]
        return (f"{number(m.median_s * 1e3, 3)} ms a call" if self.goal == "latency"
                else f"{m.items_per_s:,.0f} rows/s")

    def describe(self) -> str:
        """The answer first: the way to call, its gain in the goal's units against the user's call, its code."""
        title = f"**Best way to call for {self.goal}**"
        if self.headline is None:
            return (f"{title}: your call, {self.baseline.label}; nothing measured was faster with the same "
                    f"answers{self._kept()}.\n")
        versus = f"{self.units(self.best)} against {self.units(self.baseline)} for {self.baseline.label}"
        if not self.pays:
            return (f"{title}: your call, {self.baseline.label}. The search ended at {self.best.label}, but raced "
                    f"against your call in a race of its own it measured {self.headline.describe()} ({versus}): "
                    f"nothing is recommended.\n")
        lines = [f"{title}: {self.best.label}, {versus}: {self.headline.describe()}. Apply it as:", "",
                 "```python", *self.code, "```", "",
                 f"Every way that keeps the model's answers{self._kept()}, raced together against "
                 f"{self.baseline.label}: "
                 + "; ".join(f"{'**' * s.kept}{s.tried}{'**' * s.kept} {s.comparison.describe()}"
                             for s in sorted(self.steps, key=lambda s: -s.comparison.ratio)) + ".", "",
                 self._confirmation()]
        return "\n".join(lines) + "\n"

    def _kept(self) -> str:
        """What "keeps the answers" means for a stochastic model: alike within its own spread, not equal."""
        if self.spread <= FLOAT_TOLERANCE:  # a deterministic model's calls differ by float noise at most
            return ""
        return (f" (the model is stochastic: two calls on the same inputs differed by up to {number(self.spread, 2)} "
                f"of their scale, so each way was held to {STOCHASTIC_MARGIN:g}x that: alike, not equal)")

    def _confirmation(self) -> str:
        def figures(c: dict[str, Any]) -> str:
            if self.goal == "latency":
                return f"{number(c['your_ms'], 3)} -> {number(c['best_ms'], 3)} ms a call"
            return f"{c['your_rows_per_s']:,.0f} -> {c['best_rows_per_s']:,.0f} rows/s"

        exported = " (its export made there by its own command)" if any(
            line.startswith(SHELL) for line in self.code) else ""
        return confirmation_text(self.confirmed, f"the code above run in a fresh process{exported}, raced there "
                                                 f"against your call", figures, self.headline)


def goal_tables(tables: Sequence[Table], goal: str) -> list[Table]:
    """The tables a goal chooses among: batch 1 for latency (one request at a time), every batch above 1 for
    throughput."""
    return [t for t in tables if (t.batch == 1) == (goal == "latency")]


def thread_counts(cores: int) -> list[int]:
    """The thread counts an export is raced at besides all cores: 1 and each power of two below `cores`."""
    return [n for n in (1, *(2 ** k for k in range(1, cores.bit_length()))) if n < cores]


def thread_variants(table: Table, row: str, folder, counts: Sequence[int], skipped: dict[str, str]) -> dict[int, Any]:
    """The export loaded at each thread count, called as the code block calls it (tfperf.deploy.predict, which checks
    the inputs) on the table's rows, where its answers agree."""
    from tfperf.deploy.layout import load, predict

    variants = {}
    for n in counts:
        try:
            runner = load(folder, threads=n)
            got = predict(runner, table.inputs)
            differ = max((a["relative"] for a in agreement(table.reference, got).values()), default=0.0)
        except Exception as exc:  # a runtime that refuses a thread count: said, the others raced
            skipped[f"{row}, {n} threads"] = f"{type(exc).__name__}: {first_line(exc)}"
            continue
        if differ > table.tolerance:
            skipped[f"{row}, {n} threads"] = f"outputs differ from the model's by up to {number(differ, 2)}"
            continue
        variants[n] = lambda runner=runner: predict(runner, table.inputs)
    return variants


def race(ctx: Context, table_name: str, ways: dict[Way, Any], goal: str, rounds: int):
    """The ways raced in interleaved rounds, each against the first: records.jsonl.Raced, by Way.label."""
    from tfperf.measure import Timer
    from tfperf.records.jsonl import race_table

    timers = [Timer(fn, name=way.label, items_per_call=way.batch) for way, fn in ways.items()]
    for timer in timers:
        timer.first_call()
    return race_table(
        ctx.recorder, table_name, timers,
        metrics=lambda m, _: {"ms_per_call": m.median_s * 1e3, "rows_per_s": m.items_per_s},
        primary="ms_per_call" if goal == "latency" else "rows_per_s", lower_is_better=goal == "latency",
        rounds=rounds, threshold=MIN_GAIN, max_extensions=ctx.options.max_extensions,
        min_time_s=ctx.options.min_time_s, seed=ctx.options.seed, warmup=0)


# A row its table measured at least this many times slower than the user's call, at the fast end of its 95%
# interval, is not raced again: the tables' noise spread a row 49-83% about its median, not twice over, and
# predict() (a data adapter a call, 50-100 ms on a small model) took three quarters of this search's time.
OUT_OF_REACH = 2.0


def out_of_reach(table: Table, row: str) -> bool:
    """Whether `row` measured at least OUT_OF_REACH times slower than the table's baseline, its interval included."""
    c = table.raced.comparisons.get(row) if row != table.baseline else None
    return c is not None and c.ci95[1] * OUT_OF_REACH <= 1.0


def ways(found: Tables, tables: Sequence[Table], skipped: dict[str, str]) -> dict[Way, tuple[Table, Any]]:
    """Every way a goal chooses among: each row of its tables that keeps the model's answers and is not out of reach,
    an exported runtime at every thread count (1, each power of two below the cores, all cores), each with its table
    and its call."""
    cores = os.cpu_count() or 1
    found_ways: dict[Way, tuple[Table, Any]] = {}
    for table in tables:
        for row in table.raced.measurements:
            if not table.agrees.get(row):
                continue
            if out_of_reach(table, row):
                c = table.raced.comparisons[row]
                skipped[f"{EXPERIMENT.name}: {row} at batch {table.batch}"] = (
                    f"not raced again: {c.describe()} against {table.baseline} in its table")
                continue
            if row in RUNTIMES and row in found.exports:
                counts = [cores, *thread_counts(cores)]
                for n, call in thread_variants(table, row, found.exports[row], counts, skipped).items():
                    found_ways[Way(row, table.batch, n)] = (table, call)
            else:
                found_ways[Way(row, table.batch)] = (table, table.calls[row][0])
    return found_ways


def fastest(raced, candidates: Sequence[Way]) -> Way:
    """The way whose median time per row is least in a race."""
    return min(candidates, key=lambda way: raced[way.label].median_per_item_s)


def search(ctx: Context, found: Tables, goal: str, skipped: dict[str, str]) -> Called | None:
    """One goal's search: every way that keeps the answers raced together, the fastest then against the user's
    call in a race of its own, and its code."""
    tables = goal_tables(found.tables, goal)
    if not tables:
        swept = "batch 1 was not swept" if goal == "latency" else "no batch above 1 was swept"
        skipped[f"{EXPERIMENT.name} for {goal}"] = f"not run: {swept} (--batch-sizes)"
        return None
    user_table = tables[-1]  # the user's call at the largest batch the goal looks at
    baseline = Way(user_table.baseline, user_table.batch)
    # Every way raced together, not the fastest of one noisy table with its threads tried after: on a Transformer the
    # table's LiteRT row spread 49-83% about its median, and LiteRT at 1 thread beat ONNX Runtime at any count.
    candidates = ways(found, tables, skipped)
    calls = {baseline: user_table.calls[baseline.row][0], **{w: c for w, (_, c) in candidates.items() if w != baseline}}
    screened = race(ctx, f"best way to call: {goal}, every way", calls, goal, ctx.options.rounds)
    best = fastest(screened, list(calls))
    called = Called(goal, baseline, best, [Step(w.label, baseline.label, screened.comparisons[w.label], w == best)
                                           for w in list(calls)[1:]], spread=max(t.spread for t in tables))
    if best == baseline:
        return called
    raced = race(ctx, f"best way to call: {goal}", {baseline: calls[baseline], best: calls[best]}, goal,
                 HEADLINE_ROUNDS * ctx.options.rounds)
    table = candidates[best][0]
    called.measured, called.headline = raced.measurements, raced.comparisons[best.label]
    called.code = code_lines(ctx.subject, best.row, best.batch, best.threads, found.commands.get(best.row),
                             table.calls[best.row][2])
    return called


def run(ctx: Context) -> Section:
    """Each goal's search, as the section that leads the report where no flag asked another question."""
    found = ctx.sections.get("inference")
    if found is None or not isinstance(found.found, Tables) or not found.found.tables:
        return Section(EXPERIMENT.name, skipped={EXPERIMENT.name: "not run: the inference tables did not run"})
    skipped: dict[str, str] = {}
    answers = [a for goal in GOALS if (a := search(ctx, found.found, goal, skipped)) is not None]
    paying = [a for a in answers if a.pays]
    if paying and ctx.options.asked.get("no_confirm"):
        skipped[f"{EXPERIMENT.name}: confirmation"] = "not run (--no-confirm)"
    elif paying:
        replies = confirm_calls(ctx, [(a.best.batch, a.baseline.row, a.code) for a in paying],
                                HEADLINE_ROUNDS * ctx.options.rounds)
        for answer, reply in zip(paying, replies):
            answer.confirmed = reply
    findings = [Finding(f"{EXPERIMENT.name}: {a.goal}", a.best.label, a.baseline.label, a.headline,
                        f"the code block under 'Best way to call for {a.goal}'", "every step of it together")
                for a in answers if a.headline]
    return Section(EXPERIMENT.name, findings, skipped, answers, lead="\n".join(a.describe() for a in answers),
                   leads=leads(ctx.options))


def leads(options: Any) -> bool:
    """Whether the best way to call is what the run was asked: where no flag asked another question (--train,
    --shapes lead then, and a headline from here says "the largest gain", not "what this run was asked")."""
    return not (options.train or options.shapes)


EXPERIMENT = Experiment(
    name="best way to call", question="What should my serving call be, one request at a time and in batches, with "
                                      "every change that pays together?",
    run=run,
    flags=(flag("--no-confirm", action="store_true",
                help="skip running each recommended code block in a fresh process to confirm its gain (the best way "
                     "to call, and with --train the best configuration): a few seconds each"),))
