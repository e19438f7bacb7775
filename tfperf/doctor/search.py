"""Best configuration: "what should my compile() and fit() say to train fastest, with every change that pays?"

The speed is in combinations: one switch raced alone against plain fit misses what two give together. This climbs
the cookbook's training ladder (recipes/training_ladder.py) on the user's model, one knob at a time: from plain
`model.fit(x, y)`, each knob's values (steps_per_execution 16 and 64, jit_compile, the mixed policy this hardware
supports, the batch up to 512) are raced together on top of the best configuration so far, and the fastest is kept
only where its interval clears the bar and its loss after the same examples agrees; then every knob is raced again on
a best that changed since, until a pass changes nothing (what one saves depends on the others). Every configuration
trains a fresh copy from the same weights on the same rows. A larger batch changes the optimisation, not only its speed:
its loss after the same examples stands beside plain fit's, with the learning rate scaled by the square-root rule
(as the ladder scales it), and the best configuration at the user's own batch size is raced beside it.

The result is one recommendation as code, its gain against plain fit measured in a race of its own, in a fresh
process that trained nothing else, and a confirmation: the code block applied as a user applies it, in a second fresh
process, raced in the same rounds (tfperf/doctor/apart.py).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from tfperf import flags
from tfperf.deploy.errors import first_line
from tfperf.deploy.loader import Subject
from tfperf.doctor.climb_costs import Budget
from tfperf.doctor.climbed import EXCHANGED, OVER_YOURS, Climbed, Config, Rung, batch_paid, change, code_lines
from tfperf.doctor.experiment import Context, Experiment, Section, flag
from tfperf.doctor.options import MIN_GAIN, QUICK_SEARCH_GRACE_S, Finding, Options
from tfperf.doctor.targets import PLAIN_BATCH, loss_check, random_in_training
from tfperf.doctor.trainers import Rows, trainer, training_rows

CLIMB = "best configuration: the climb"
HEADLINE = "best configuration against plain fit"
BATCHES = (64, 128, 256, 512)  # the batch is raised through these while it pays, up to the examples trained on
HEADLINE_ROUNDS = 2  # the headline race takes this many times the rounds: it is the figure the user acts on
# A plain epoch is made at least this long (rows doubled, up to MAX_GROWTH times the examples asked for): on a
# small model 512 rows train in 45 ms, and what a larger batch or a lower precision saves per step was lost in
# what every epoch costs (the MLP's climb stopped at batch 128 where 512 paid 2x in a plain script). Up to 8
# times: at 4 (2,048 rows) the MLP's best epoch took 55 ms, and its climb's races read 512 against 256 within noise.
EPOCH_S = {True: 0.2, False: 1.0}  # --quick, and not
MAX_GROWTH = 8


def _ladder(subject: Subject, options: Options) -> tuple[str | None, list[int]]:
    """The mixed policy this hardware supports, and the batch sizes the climb may raise the batch to."""
    from tfperf.gpus import mixed_policy_here

    top = MAX_GROWTH * options.train_examples  # the most rows the climb may train on (sized_rows)
    batches = [] if options.data is not None else [b for b in BATCHES if b <= top]
    return mixed_policy_here(), batches


def plain_fit(options: Options) -> Config:
    """Plain `model.fit(x, y)` at the user's batch (--train-batch; Keras' default 32)."""
    return Config(batch=options.train_batch, base=options.train_batch)


def knobs(mixed: str | None, batches: Sequence[int], strings: bool = False,
          base: int = PLAIN_BATCH) -> list[tuple[str, tuple]]:
    """The knobs in the order they are first raced, each with the values it may take: jit_compile (not for string
    inputs: XLA cannot compile string ops), the mixed policy this hardware supports, steps_per_execution, then the
    batch upward from the user's `base` (not where --data sets it). steps_per_execution after the two that make a
    step cheaper, which makes the fixed cost it saves a larger share: raced first, on plain fit's step, it read
    1.06-1.16x on the benchmark's Transformer, kept in two runs of four, where with XLA it was part of the best."""
    found: list[tuple[str, tuple]] = [] if strings else [("jit_compile", (False, True))]
    found += [("policy", (None, mixed))] if mixed else []
    found += [("steps_per_execution", (1, 16, 64))]
    larger = [b for b in batches if b > base]
    return found + ([("batch", (base, *larger))] if larger else [])


def sized_rows(subject: Subject, options: Options, budget: Budget | None = None) -> Rows:
    """The rows the climb trains on: doubled until a plain epoch takes EPOCH_S (timed once, after a first epoch),
    at most MAX_GROWTH times options.train_examples; the user's --data as it is. `budget` notes plain fit's costs."""
    rows = training_rows(subject, options)
    if rows.batch_given:
        return rows
    began = time.perf_counter()
    timer, _ = trainer(subject, plain_fit(options), rows)
    built = time.perf_counter() - began
    seconds = timer.take(1)[0]
    growth = 1
    while growth < MAX_GROWTH and seconds * growth < EPOCH_S[options.quick]:
        growth *= 2
    if budget is not None:
        budget.costs.built(plain_fit(options), built)
        budget.costs.raced({plain_fit(options).label: seconds * growth})
    return rows if growth == 1 else training_rows(subject, options, growth * options.train_examples)


def race(ctx: Context, configs: Sequence[Config], rows: Rows, *, rounds: int,
         failed: dict[str, str] | None = None, started: dict[str, tuple] | None = None,
         extensions: int | None = None, budget: Budget | None = None):
    """Train each configuration an epoch at a time in interleaved rounds: (measurements by label, comparisons of
    each against the first, final losses by label after as many epochs for every one). With `failed`, a
    configuration after the first that cannot train (an XLA refusal, memory) is named there and left out. With
    `started`, a configuration's trainer is taken from there where it is (and put there where it is not): going on
    training the same copy costs an epoch, where a new one is built, compiled and run a first epoch. `extensions`:
    at most this many rounds more for a comparison its rounds left undecided (default: the options'). `budget`
    notes each build's seconds and each configuration's median epoch."""
    from tfperf.measure.rounds import race as interleaved

    def build(config: Config) -> tuple:
        began = time.perf_counter()
        made = trainer(ctx.subject, config, rows)
        if budget is not None:
            budget.costs.built(config, time.perf_counter() - began)
        return made

    made = []
    for config in configs:
        try:
            if started is None:
                made.append((config, *build(config)))
                continue
            if config.label not in started:
                started[config.label] = build(config)
            made.append((config, *started[config.label]))
        except Exception as exc:
            if failed is None or config == configs[0]:
                raise
            failed[config.label] = f"{type(exc).__name__}: {first_line(exc)}"
    losses: dict[str, float] = {}

    def read(_):  # after the same examples for each: a trainer taken from `started` has run more epochs
        epochs = min(len(made_losses) for _, _, made_losses in made)
        losses.update({c.label: made_losses[epochs - 1] for c, _, made_losses in made})

    options = ctx.options
    ms, comparisons = interleaved([t for _, t, _ in made], rounds=rounds, samples=rounds, threshold=MIN_GAIN,
                                  max_extensions=options.max_extensions if extensions is None else extensions,
                                  warmup=0, seed=options.seed, on_first_rounds=read)
    if budget is not None:
        budget.costs.raced({m.name: m.median_s for m in ms})
    return {m.name: m for m in ms}, dict(zip([c.label for c, _, _ in made[1:]], comparisons)), losses


# A climb's race takes at most one extension where its rounds left it undecided (the headline race takes the
# options' extensions): the climb races ten knobs' worth, and --quick's run is to end within 3 minutes.
CLIMB_EXTENSIONS = 1


def trial(ctx: Context, rows: Rows, best: Config, knob: str, values: Sequence[Any], plain_loss: float,
          skipped: dict[str, str], suffix: str = "", started: dict[str, tuple] | None = None,
          budget: Budget | None = None,
          on_race: Callable[[list[Rung], Config], None] = lambda rungs, best: None) -> tuple[list[Rung], Config]:
    """One knob's other values raced together against the best so far, and recorded: the rungs, and the best after
    it (the fastest candidate faster than the best with a loss that agrees; a new batch's loss is said, not held).
    Where the budget holds part of the race, the values it left out are raced next against the best after it, as
    many as then fit (`on_race` is told each race's rungs and best in turn): on the Transformer at --quick the batch
    race took 512 alone, and the climb ended with 22 s more than the headline needed, 64 left out (in the best of 60
    combinations)."""
    found: list[Rung] = []
    while values := [v for v in values if v != getattr(best, knob)]:
        changed = [(change(knob, v), dataclasses.replace(best, **{knob: v})) for v in values]
        part: dict[str, str] = {}
        cut = len(budget.cut) if budget is not None else 0
        rungs, best = candidates_raced(ctx, rows, best, changed, knob, plain_loss, part, suffix, started,
                                       budget=budget)
        found += rungs
        on_race(rungs, best)
        # Neither those raced nor those that failed (out of memory) are raced again.
        done = {rung.row for rung in rungs} | {key.removeprefix(f"{CLIMB}: ") for key in part}
        values = [v for v in values if change(knob, v) + suffix not in done]
        if not rungs or not values or budget is None:
            if budget is not None and found and budget.cut[cut:] == [f"{knob}{suffix}"]:  # a later race refused
                # whole: it names the values it left out, as a part race does
                named = f"{knob}{suffix}: {', '.join(change(knob, v) for v in values)}"
                part[f"{CLIMB}: {named}"] = part.pop(f"{CLIMB}: {knob}{suffix}")
                budget.cut[-1] = named
            skipped.update(part)
            break
        # The refusal named the values raced next: said again by the race that leaves them out, if one does.
        skipped.update({key: why for key, why in part.items() if not key.startswith(f"{CLIMB}: {knob}{suffix}: ")})
        del budget.cut[cut:]
        plain_loss = rungs[0].plain_loss
    return found, best


def fitted(budget: Budget | None, best: Config, changed: Sequence[tuple[str, Config]], rounds: int,
           started: Sequence[str], step: str, skipped: dict[str, str]) -> tuple[list[tuple[str, Config]], float]:
    """The candidates a race takes within the budget, and its estimated seconds (NaN without a budget): all of them
    where they fit, else the most that fit: the first (the smallest step up), then the last (the largest batch,
    steps_per_execution=64), then the others spread down every other value; those left out are said in `skipped`,
    and raced after it where they then fit (`trial`). On the Transformer the batch race (four builds with XLA, about
    49 s) did not fit whole where two of its batches did; taken from the largest down (512, 128) it missed batch 64,
    which with XLA and steps_per_execution=64 was the best of 60 combinations (2.08x against XLA alone's 1.53x); and
    where one fitted, 512 alone (1.14x slower) left 64, 128 and 256 out (its best of 60 was at batch 64 in each of
    three screens)."""
    if budget is None:
        return list(changed), math.nan
    whole = budget.costs.race([best, *[config for _, config in changed]], best, rounds, started)
    middle = list(changed[1:-1])[::-1]
    preferred = list(dict.fromkeys([*changed[:1], *changed[-1:], *middle[::2], *middle[1::2]]))
    for count in range(len(changed), 0, -1):
        taken = [candidate for candidate in changed if candidate in preferred[:count]]
        estimated = budget.costs.race([best, *[config for _, config in taken]], best, rounds, started)
        if budget.fits(estimated, [config for _, config in taken]):
            if count < len(changed):
                left_out = ", ".join(row for row, config in changed if (row, config) not in taken)
                skipped[f"{CLIMB}: {step}: {left_out}"] = budget.refusal(f"{step}: {left_out}", whole, partly=True)
            return taken, estimated
    skipped[f"{CLIMB}: {step}"] = budget.refusal(step, whole)
    return [], math.nan


def candidates_raced(ctx: Context, rows: Rows, best: Config, changed: Sequence[tuple[str, Config]], step: str,
                     plain_loss: float, skipped: dict[str, str], suffix: str = "",
                     started: dict[str, tuple] | None = None, rounds: int | None = None,
                     extensions: int = CLIMB_EXTENSIONS, budget: Budget | None = None) -> tuple[list[Rung], Config]:
    """Candidates (row, config) raced together against the best so far, and recorded: the rungs, and the best
    after (the fastest faster than the best whose loss agrees with it, at the same batch). `rounds`: default the
    options'; `extensions`: at most this many more where a comparison is undecided (and the options' at most);
    `budget`: the race is left out, and said, where it would not leave the headline and the confirmation their time."""
    from tfperf.measure.stats import FASTER

    rounds, extensions = rounds or ctx.options.rounds, min(extensions, ctx.options.max_extensions)
    # Its extensions counted as run: on the Transformer the first race and the batch race took 28 s and 49 s where
    # their rounds alone were estimated at 17 s and 37 s; each was extended.
    changed, estimated = fitted(budget, best, changed, rounds * (1 + extensions), started or (), step + suffix,
                                skipped)
    if not changed:
        return [], best
    candidates = {config.label: (row, config) for row, config in changed}
    configs = [best, *[c for _, c in candidates.values()]]
    ctx.progress(f"best configuration: {step}{suffix}")
    failed: dict[str, str] = {}
    began = time.perf_counter()
    try:
        ms, comparisons, losses = race(ctx, configs, rows, rounds=rounds, failed=failed, started=started,
                                       extensions=extensions, budget=budget)
    except Exception as exc:  # a configuration that failed mid-race (memory): said, and the climb goes on without
        skipped[f"{CLIMB}: {step}{suffix}"] = f"{type(exc).__name__}: {first_line(exc)}"
        return [], best
    plain_loss = losses[best.label] if best == plain_fit(ctx.options) else plain_loss
    took = time.perf_counter() - began
    skipped.update({f"{CLIMB}: {candidates[label][0]}{suffix}": why for label, why in failed.items()})
    found, winner = [], best
    # A model that draws at random in training ends two runs from the same weights at different losses: no change
    # is held to the loss of the one it changes (on BERT, jit_compile 1.41x faster was lost to dropout's draws).
    drawn = random_in_training(getattr(ctx.subject, "model", None))
    for label, c in comparisons.items():
        row, candidate = candidates[label]
        loss = losses[label]
        # A new batch's loss is said beside plain fit's (in the climb's lines), not held to a bar; any other change
        # is held to the configuration it changes.
        agrees, note = (True, "") if candidate.batch != best.batch or drawn else loss_check(
            row, loss, losses[best.label], best.label)
        found.append(Rung(row + suffix, best.label, c, c.verdict == FASTER and agrees, loss, plain_loss, note,
                          candidate.batch))
        # The fastest by its ratio to the best so far, round by round (the figure the climb prints), not by its
        # median rate: a batch 512 said "1.86x faster" was passed over for a batch 256 said "1.75x faster".
        if found[-1].kept and (winner == best or c.ratio > comparisons[winner.label].ratio):
            winner = candidate
    for rung, (label, c) in zip(found, comparisons.items()):
        rung.kept = label == winner.label
        if c.verdict == FASTER and not rung.kept and not rung.note:
            rung.note = f"{candidates[winner.label][0]} was faster still"
        ctx.recorder.add(CLIMB, rung.row, {"samples_per_s": ms[label].items_per_s, "on_top_of": best.label,
                                           "kept": rung.kept, "final_loss": rung.loss, "plain_fit_loss": plain_loss,
                                           "batch": candidates[label][1].batch, "rows": rows.examples,
                                           # the race's seconds beside what the budget estimated for it
                                           "race_s": took,
                                           **({"race_estimated_s": estimated} if budget is not None else {})},
                         primary="samples_per_s", lower_is_better=False, measurement=ms[label], comparison=c,
                         versus_first=False)
    return found, winner


ONE_SWITCH_FOLDED = ("not run at --quick: the best configuration races each switch on top of the others; without "
                     "--quick (or with --no-search) each is also raced alone against plain fit, with whether mixed "
                     "precision took effect and, where it is slower, why, kernel by kernel")
MAX_PASSES = 3  # the knobs are raced again while a pass changes the best; mixed precision pays at a larger batch
# What each knob's gain depends on: it is raced again once one of these changed. XLA, the precision and the batch
# each change the cost of an example's work. steps_per_execution saves a step's fixed cost, the same in seconds
# whatever the step does, but a race reads it against the step: a step made cheaper (XLA, a cheaper precision) makes
# it a larger share. On the benchmark's Transformer it read 1.07-1.09x (undecided) against plain fit in two runs of
# four and was lost for the run, where on top of XLA it was part of the best (2.05x confirmed against 1.50x for XLA
# alone). A larger batch makes it a smaller share: no reason to race it again there.
DEPENDS_ON = {"steps_per_execution": ("jit_compile", "policy"), "jit_compile": ("policy", "batch"),
              "policy": ("jit_compile", "batch"), "batch": ("jit_compile", "policy")}
# Knobs whose gain only grows with what they depend on: once kept they stay, raced again only where not kept.
AGAIN_ONLY_WHERE_PLAIN = ("steps_per_execution",)
# Knobs that may each pay alone and not together, both changing how the step is compiled: on a two-block
# Transformer on the CPU, XLA paid 1.29x at batch 32 and was kept first; with it, mixed_bfloat16 measured slower at
# every batch, where mixed_bfloat16 without XLA at batch 512 was the fastest of 60 combinations (the climb reached
# 0.79 of it). Once a pass changes nothing, the one kept is exchanged for the other, and the climb goes on from there.
EXCHANGES = (("jit_compile", "policy"),)


def exchanges(best: Config, plain: Config, ladder: Sequence[tuple[str, tuple]]) -> list[tuple[str, Config]]:
    """The best with one knob of a pair in EXCHANGES put back to plain fit's and the other, still plain fit's,
    set to each of its values, at the best's batch and the largest the climb may take: (row, config). What the
    other saves can show only at a larger batch (on the Transformer mixed_bfloat16 in place of XLA measured 1.03x at
    batch 256, where at 512 it was the fastest of 60 combinations); the batches between cost a build each (8 s on
    that Transformer with XLA) and the batch is raced again around the one kept."""
    values, found = dict(ladder), []
    batches = sorted({best.batch, max(values.get("batch", ()), default=best.batch)})
    for pair in EXCHANGES:
        for kept, other in (pair, pair[::-1]):
            if kept not in values or other not in values or getattr(best, other) != getattr(plain, other) or (
                    getattr(best, kept) == getattr(plain, kept)):
                continue
            found += [(f"{change(other, v)} instead of {change(kept, getattr(best, kept))}"
                       f"{'' if b == best.batch else ', ' + change('batch', b)}{EXCHANGED}",
                       dataclasses.replace(best, **{kept: getattr(plain, kept), other: v, "batch": b}))
                      for v in values[other] if v != getattr(plain, other) for b in batches]
    return found


def neighbours(values: Sequence[int], current: int) -> list[int]:
    """The batch raced again: the values either side of the current one. Each batch was raced once, all of them
    together; on the Transformer a pass after the exchange raced all five again (four builds of about 8 s), where the
    others had measured 1.2-1.6x slower."""
    at = list(values).index(current)
    return list(values)[max(0, at - 1):at + 2]


def values_again(knob: str, values: Sequence[Any], current: Any) -> Sequence[Any]:
    """A knob's values raced again: the batch's neighbours; steps_per_execution's largest alone (it saves the most
    of a step's fixed cost, and a race of one build fits where a race of two did not: on the Transformer at --quick
    the two, about 26 s with XLA, were left out by the budget); the others' all."""
    if knob == "batch":
        return neighbours(values, current)
    return list(values)[-1:] if knob in AGAIN_ONLY_WHERE_PLAIN else values


def climb(ctx: Context, rows: Rows, skipped: dict[str, str], started: dict[str, tuple] | None = None,
          budget: Budget | None = None) -> tuple[Config, Config, list[Rung]]:
    """Each knob's values raced together on top of the best so far, the fastest that pays kept; then each knob
    raced again on a best whose knobs it depends on changed since, until a pass changes nothing: what a rung saves
    depends on the others (on a small conv net the fastest of 60 combinations was steps_per_execution=64,
    mixed_bfloat16 and batch 128, where a climb of one rung at a time, each tried once, kept neither mixed precision
    nor batch 128). Where a pass changes nothing, XLA and the mixed policy are exchanged once (EXCHANGES), and the
    climb goes on where that paid. Returns the best, the best at the user's batch (before the batch rose), and the
    rungs tried; `started` keeps the trainers of plain fit and of those two, trained on from race to race. With
    `budget`, a race that would not leave the headline and the confirmation their time is left out, and said."""
    strings = any(i.dtype == "string" for i in ctx.subject.inputs)  # XLA cannot compile string ops
    ladder = knobs(*_ladder(ctx.subject, ctx.options), strings=strings, base=ctx.options.train_batch)
    if rows.batch_given:
        ladder = [(knob, values) for knob, values in ladder if knob != "batch"]
    plain = plain_fit(ctx.options)
    best, at_your_batch, tried, plain_loss = plain, plain, [], math.nan
    raced_on: dict[str, Config] = {}  # each knob, and the best it was last raced on
    started = {} if started is None else started
    budget = budget or Budget(None, ctx.options.rounds)
    budget.heading = (plain,)

    def step(found: list[Rung], new_best: Config) -> None:
        nonlocal best, at_your_batch, plain_loss
        best, plain_loss = new_best, found[0].plain_loss if found else plain_loss
        tried.extend(found)
        at_your_batch = best if best.batch == plain.batch else at_your_batch
        budget.heading = tuple(dict.fromkeys((plain, best, at_your_batch)))
        for label in set(started) - {plain.label, best.label, at_your_batch.label}:
            del started[label]  # a configuration not kept: its model's memory back

    turn, passes, exchanged = 0, MAX_PASSES, False
    while turn < passes:
        start, suffix = best, f", again (pass {turn + 1})" if turn else ""
        for knob, values in ladder:
            if knob in raced_on and (all(getattr(raced_on[knob], k) == getattr(best, k) for k in DEPENDS_ON[knob])
                                     or knob in AGAIN_ONLY_WHERE_PLAIN and getattr(best, knob) != getattr(plain, knob)):
                continue
            again = knob in raced_on
            trial(ctx, rows, best, knob, values_again(knob, values, getattr(best, knob)) if again else values,
                  plain_loss, skipped, suffix, started, budget, on_race=step)
            raced_on[knob] = best  # its values were raced with the other knobs as they are now
        turn += 1
        # A climb the budget cut is not done one knob at a time: the exchange (which gives up a knob measured
        # faster) waits for a climb that is.
        if best == start and (exchanged or budget.cut or not exchanges(best, plain, ladder)):
            break
        if best == start:  # nothing left to climb one knob at a time: one exchange, then the passes it needs
            exchanged = True
            # With the headline's rounds and the options' extensions: it gives up a knob that measured faster for
            # one that measured slower on it, and what it gains is smaller (the Transformer's 1.13x read 1.06x,
            # 95% CI 0.95-1.22x, in a climb's six rounds).
            step(*candidates_raced(ctx, rows, best, exchanges(best, plain, ladder), "an exchange", plain_loss,
                                   skipped, started=started, rounds=HEADLINE_ROUNDS * ctx.options.rounds,
                                   extensions=ctx.options.max_extensions, budget=budget))
            passes = turn + MAX_PASSES - 1 if best != start else turn
    return best, at_your_batch, tried


# The headline race's answer: comparisons against plain fit, final losses, examples a second, each by label.
Headline = tuple[dict[str, Any], dict[str, float], dict[str, float]]


def headline(ctx: Context, best: Config, at_your_batch: Config, rows: Rows, started: dict[str, tuple],
             code: list[str] | None) -> tuple[Headline, dict[str, Any], str | None]:
    """The best configuration against plain fit, in a race of its own with more rounds (and, where it raised the
    batch, the best at the user's batch beside it and its code block), recorded: (comparisons against plain fit by
    label, and the best's against the best at the user's batch by OVER_YOURS; final losses by label; examples a
    second by label), the confirmations of the code blocks by label where asked, and why the race ran in this
    process (None: it ran in a fresh process, and the code blocks in another: tfperf/doctor/apart)."""
    from tfperf.doctor.apart import race_apart
    from tfperf.measure.measurement import versus

    plain, rounds = plain_fit(ctx.options), HEADLINE_ROUNDS * ctx.options.rounds
    beside = at_your_batch not in (plain, best)
    configs = [plain, *([at_your_batch] if beside else []), best]
    if rows.batch_given or not hasattr(rows.y, "shape"):  # only arrays and one output's targets are handed over
        ctx.progress("best configuration against plain fit")
        ms, comparisons, losses = race(ctx, configs, rows, rounds=rounds, started=started)
        confirmed, here = {}, ("raced in this process, after the climb (a process that has trained many "
                               "configurations can read a gain high): a fresh process trains on arrays and one "
                               "output's targets, not --data or several outputs")
    else:
        started.clear()  # the models' memory back before the processes start
        builds = ctx.subject.builds_under_policy
        apart = race_apart(ctx, plain, at_your_batch, best, rows, rounds, code,
                           code_lines(plain, builds) if code else None,
                           code_lines(at_your_batch, builds) if code and beside else None)
        ms, comparisons, losses, here = apart.measurements, apart.comparisons, apart.losses, None
        # (the best's last: where it is the best at the user's batch, its code block is the one confirmed)
        confirmed = {at_your_batch.label: apart.confirmed_at_your_batch, best.label: apart.confirmed}
    if beside:  # the larger batch against the same changes at the user's: it changes the optimisation, so must pay
        comparisons[OVER_YOURS] = versus(ms[at_your_batch.label], ms[best.label], threshold=MIN_GAIN,
                                         seed=ctx.options.seed)
    recommended, _ = batch_paid(best, at_your_batch, comparisons)
    for config in configs:
        # The knobs as values too: `tfperf watch --apply` reads them to apply the best to the user's own run.
        ctx.recorder.add(HEADLINE, config.label, {"samples_per_s": ms[config.label].items_per_s,
                                                  "final_loss": losses.get(config.label, math.nan),
                                                  "batch": config.batch,
                                                  "steps_per_execution": config.steps_per_execution,
                                                  "jit_compile": config.jit_compile,
                                                  "policy": config.policy or "float32",
                                                  # what the report recommends (`tfperf watch --apply` applies it)
                                                  "recommended": config == recommended},
                         primary="samples_per_s", lower_is_better=False, measurement=ms[config.label],
                         comparison=comparisons.get(config.label), versus_first=False)
    return (comparisons, losses, {label: m.items_per_s for label, m in ms.items()}), confirmed, here


def run(ctx: Context) -> Section:
    """The climb, the headline race, the code block and its confirmation, as the section that leads the report."""
    if any(getattr(s.found, "input_bound", False) for s in ctx.sections.values()):
        return Section(EXPERIMENT.name, skipped={EXPERIMENT.name: "not run: training waits for its data; fix the "
                                                                  "input pipeline first"})
    if ctx.subject.fresh is None:
        return Section(EXPERIMENT.name, skipped={EXPERIMENT.name: "not run: a SavedModel has no Keras model to "
                                                                  "compile and fit"})
    grace = QUICK_SEARCH_GRACE_S if ctx.options.quick and not ctx.options.budget_given else 0.0
    budget = Budget(None if ctx.ends_by is None else ctx.ends_by + grace, HEADLINE_ROUNDS * ctx.options.rounds)
    rows, started = sized_rows(ctx.subject, ctx.options, budget), {}
    skipped = {} if ctx.options.races_one_switch else {"training, one switch at a time": ONE_SWITCH_FOLDED}
    climbed, at_your_batch, tried = climb(ctx, rows, skipped, started, budget)
    plain, code = plain_fit(ctx.options), code_lines(climbed, ctx.subject.builds_under_policy)
    no_confirm = ctx.options.asked.get("no_confirm")
    (comparisons, losses, rates), confirmed, here = headline(
        ctx, climbed, at_your_batch, rows, started, None if no_confirm else code) if climbed != plain else (
        ({}, {}, {}), {}, None)
    started.clear()
    best, set_aside = batch_paid(climbed, at_your_batch, comparisons)
    found = Climbed(tried, best, at_your_batch, comparisons, code_lines(best, ctx.subject.builds_under_policy),
                    losses=losses, plain=plain, rates=rates, epoch=ctx.options.asked.get("epoch_examples"),
                    cut=budget.cut, drawn=random_in_training(ctx.subject.model), apart=best != plain and here is None,
                    set_aside=(climbed, set_aside) if set_aside is not None else None)
    confirmed = confirmed.get(best.label)
    if here:
        skipped[HEADLINE] = here
    findings = []
    if found.pays and no_confirm:
        skipped[f"{EXPERIMENT.name}: confirmation"] = "not run (--no-confirm)"
    elif found.pays and here:
        skipped[f"{EXPERIMENT.name}: confirmation"] = "not run: " + here.split(": ", 1)[1]
    elif found.pays:
        found.confirmed = confirmed
    if best != plain:
        findings.append(Finding(HEADLINE, best.label, plain.label, comparisons[best.label], "; ".join(found.code),
                                "every change of the code block together" + (
                                    "; a larger batch changes the optimisation: check the loss, scale the learning "
                                    "rate" if best.batch != plain.batch else "")))
    return Section(EXPERIMENT.name, findings, skipped, found, lead=found.describe(), detail=found.climb_text(),
                   leads=True)


EXPERIMENT = Experiment(
    name="best configuration", question="What should my compile() and fit() say to train fastest, with every change "
                                        "that pays together?",
    # The answer --train asks for is not cut by --budget (as --serve's is not): on MobileNetV2 at --quick the
    # one-switch race alone spent the 150 s, and the search was only listed under "Not measured".
    run=run, applies=lambda subject, options: options.searches, budgeted=False,
    flags=(flag("--epoch-examples", type=flags.positive_int, metavar="N",
                help="with --train: the examples in one of your epochs, so that the gain is said in seconds an "
                     "epoch (tfperf watch --capture passes it; default: seconds for every 10,000 examples)"),
           flag("--no-search", action="store_true",
                help="with --train: skip the best-configuration search (at --quick, the one-switch race runs "
                     "instead)"),),
    rules=(lambda args: "--epoch-examples is for --train (the gain of its best configuration, in seconds an epoch)"
           if args.epoch_examples and not args.train else None,),
    steps=lambda subject, options: [f"best configuration: {knob}" for knob, _ in knobs(*_ladder(subject, options))]
    + ["best configuration against plain fit (and its code block, confirmed)"])
