"""Input pipeline: "is training waiting for data? My pipeline starts fast, then crawls: why?"

The user's own input pipeline (`--data module:function`): checked against the model before anything
is measured, trained on instead of synthetic arrays, and judged input-bound or not twice: by timing the
pipeline alone and the model step alone against the two together, and by the profiler's own step
breakdown. When it is input-bound, what recipes/input_pipeline.py teaches is measured on it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfperf.deploy.errors import first_line
from tfperf.deploy.loader import Subject, import_callable
from tfperf import flags
from tfperf.doctor.experiment import Context, Experiment, Section, flag
from tfperf.doctor.input_sources import input_sources
from tfperf.doctor.options import MIN_GAIN, QUICK, DoctorError, Finding, Options
from tfperf.measure.profiles import INPUT_BOUND_SHARE, InputAnalysis
from tfperf.records.units import number

CHECK_TABLE = "input pipeline: is training waiting for data?"
VARIANTS_TABLE = "input pipeline variants"
YOURS = "your pipeline (model.fit)"
STEP_ALONE = "model step alone (one batch in memory)"
PIPELINE_ALONE = "pipeline alone (iterated, no model)"


@dataclasses.dataclass(frozen=True)
class UserData:
    """The user's dataset, cut to one epoch of `steps` batches of `batch` examples."""

    source: str
    dataset: Any  # tf.data.Dataset of (inputs, targets[, sample_weights])
    batch: int
    steps: int

    @property
    def examples(self) -> int:
        return self.batch * self.steps


def describe_spec(spec: Any) -> str:
    """A dataset element's structure as dtype[shape] leaves, e.g. (float32[None, 28, 28, 1], int64[None])."""
    import tensorflow as tf

    text = tf.nest.map_structure(lambda s: f"{s.dtype.name}{list(s.shape)}".replace("None", "?"), spec)
    return str(text).replace("'", "")


def _check_inputs(spec: Any, subject: Subject, source: str) -> None:
    import tensorflow as tf

    names = [i.name for i in subject.inputs]
    if isinstance(spec, dict):
        missing = [n for n in names if n not in spec]
        if missing:
            raise DoctorError(f"{source} yields inputs named {sorted(spec)}; the model takes {names}: key the "
                              f"inputs by the model's input names")
        by_name = spec
    else:
        flat = tf.nest.flatten(spec)
        if len(flat) != len(names):
            raise DoctorError(f"{source} yields {len(flat)} input tensor(s), {describe_spec(spec)}; the model takes "
                              f"{len(names)}: {'; '.join(map(str, subject.inputs))}")
        by_name = dict(zip(names, flat))
    for want in subject.inputs:
        got = by_name[want.name]
        rank = got.shape.rank
        if rank == len(want.shape):
            raise DoctorError(f"{source} yields single examples ({describe_spec(got)} for {want}): batch them, "
                              f"e.g. return dataset.batch(32)")
        if rank is not None and rank != len(want.shape) + 1:
            raise DoctorError(f"{source} yields {describe_spec(got)} for the model's input {want}: give "
                              f"batches of the model's input shape")


def load_data(source: str, subject: Subject, loss: Callable, examples: int) -> UserData:
    """The dataset `module:function` returns, checked: a tf.data.Dataset of (inputs, targets) batches that
    the model takes and trains on with `loss` (its first batch is tried); cut to about `examples`
    examples per epoch. DoctorError (or the loader's ModelError) in one line otherwise."""
    import keras
    import tensorflow as tf

    if subject.fresh is None:
        raise DoctorError("--data trains the model: give a .keras file or module:factory, not a SavedModel")
    function = import_callable(source, "function")
    try:
        dataset = function()
    except Exception as exc:
        raise DoctorError(f"{source}() failed: {type(exc).__name__}: {first_line(exc)}") from None
    if not isinstance(dataset, tf.data.Dataset):
        raise DoctorError(f"{source}() returned {type(dataset).__name__}, not a tf.data.Dataset: return a dataset "
                          f"of (inputs, targets) batches")
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise DoctorError(f"{source}() yields {describe_spec(spec)}: training needs (inputs, targets) pairs, or "
                          f"(inputs, targets, sample_weights)")
    _check_inputs(spec[0], subject, source)
    try:
        first = next(iter(dataset.take(1)))
    except StopIteration:
        raise DoctorError(f"{source}() returned an empty dataset") from None
    except Exception as exc:
        raise DoctorError(f"reading the first batch of {source}() failed: {type(exc).__name__}: "
                          f"{first_line(exc)}") from None
    model = subject.fresh(None)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    try:
        model.test_on_batch(*first)
    except Exception as exc:
        raise DoctorError(f"the model does not take the first batch of {source}() ({describe_spec(spec)}) with "
                          f"this --loss: {type(exc).__name__}: {first_line(exc)}") from None
    batch = int(tf.nest.flatten(first[0])[0].shape[0])
    steps = max(1, math.ceil(examples / batch))
    known = int(dataset.cardinality())
    if 0 < known <= steps:
        steps = known
    else:  # longer, infinite or of unknown length: one epoch is its first `steps` batches
        dataset = dataset.take(steps)
    return UserData(source, dataset, batch, steps)


@dataclasses.dataclass(frozen=True)
class InputCheck:
    """Whether training waits for data: by timing (the step alone against the step on the pipeline) and
    by the profiler's step breakdown."""

    source: str
    share: float  # of a training step spent waiting for data, from the timing
    share_ci95: tuple[float, float]
    ms_per_batch: dict[str, float]  # YOURS, STEP_ALONE, PIPELINE_ALONE
    profiler: InputAnalysis | None
    long_run: Any = None  # input_sources.LongRun: the pipeline alone over a long run

    @property
    def timing_verdict(self) -> str:
        low, high = self.share_ci95
        if low >= INPUT_BOUND_SHARE:
            return "input-bound"
        return "not input-bound" if high < INPUT_BOUND_SHARE else "undecided"

    @property
    def input_bound(self) -> bool:
        """Input-bound by the timing or by the profiler's verdict."""
        return self.timing_verdict == "input-bound" or bool(self.profiler and self.profiler.input_bound)

    def describe(self) -> str:
        ms = self.ms_per_batch
        low, high = self.share_ci95
        lines = [f"Training on `{self.source}`: {number(ms[YOURS], 3)} ms per batch; the model step alone "
                 f"(one batch held "
                 f"in memory) {number(ms[STEP_ALONE], 3)} ms; the pipeline alone "
                 f"{number(ms[PIPELINE_ALONE], 3)} ms per batch. "
                 f"By this timing, {self.share:.0%} of a step waits for data (95% CI {low:.0%} to {high:.0%}): "
                 f"**{self.timing_verdict}** (from {INPUT_BOUND_SHARE:.0%}, XProf's bar)."]
        if self.profiler is not None:
            a = self.profiler
            average = ""
            if (a.input_share >= INPUT_BOUND_SHARE) != a.input_bound:  # a few steps carried the average past the bar
                shares = a.step_input_shares
                which = (f"the first waiting {shares[0]:.0%} while the pipeline starts" if shares and
                         shares[0] == max(shares) else "a few steps waiting far longer than the median")
                average = f"; {a.input_share:.0%} averaged over its {a.steps} steps, {which}"
            lines.append(f"The profiler: the median step {a.median_input_share:.0%} waiting for input "
                         f"({'input-bound' if a.input_bound else 'not input-bound'}{average}); "
                         f"XProf says: \"{a.conclusion}\""
                         + (f" Slowest stage: {a.slowest_stage}." if a.slowest_stage else ""))
            if self.timing_verdict == "undecided":  # nothing to agree with: said as such, not as agreement
                lines.append(f"The timing cannot say (its interval straddles {INPUT_BOUND_SHARE:.0%}); the "
                             f"profiler's verdict stands.")
            elif a.input_bound == (self.timing_verdict == "input-bound"):
                lines.append("The two agree.")
            else:
                lines.append("The two disagree: read the trace to see where the wait is.")
        if self.long_run is not None:
            lines.append(self.long_run.describe())
        return " ".join(lines)


def _variants(dataset) -> dict[str, tuple[Any, str, str]]:
    """The pipeline with each change the input_pipeline recipe teaches appended: (dataset, code, cost)."""
    import tensorflow as tf

    parallel = tf.data.Options()
    parallel.experimental_optimization.map_parallelization = True  # what num_parallel_calls does, map by map
    return {
        "+ prefetch": (dataset.prefetch(tf.data.AUTOTUNE), "dataset = dataset.prefetch(tf.data.AUTOTUNE)  # last",
                       "a few batches of memory"),
        "+ parallel map, prefetch": (
            dataset.with_options(parallel).prefetch(tf.data.AUTOTUNE),
            "dataset.map(load, num_parallel_calls=tf.data.AUTOTUNE) in your pipeline, then .prefetch(tf.data.AUTOTUNE)",
            "cores taken from the model's step; only stateless map functions run in parallel (not py_function)"),
        "+ cache, prefetch": (
            dataset.cache().prefetch(tf.data.AUTOTUNE),
            "dataset = dataset.cache().prefetch(tf.data.AUTOTUNE)  # cache(path) when an epoch does not fit in memory",
            "an epoch held in memory; the first epoch still loads (timed apart below); random augmentation before "
            "the cache repeats each epoch: apply it after"),
    }


def input_pipeline(subject: Subject, rec, options: Options, progress, profiler, facts,
                   workdir: Path) -> tuple[list[Finding], dict, InputCheck]:
    """Is training on the user's pipeline waiting for data? Does it decline over a long run, and would another
    source of the same examples be faster? If it waits, prefetch, parallel map and cache, measured."""
    import keras

    from tfperf.doctor.facts import mfu
    from tfperf.doctor.targets import training_loss
    from tfperf.measure import Timer
    from tfperf.records.jsonl import race_table
    from tfperf.train import StepMarker, fit_epochs

    progress("input pipeline")
    data: UserData = options.data
    model = subject.fresh(None)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=training_loss(options.loss, options.from_logits))
    yours, losses = fit_epochs(model, data.dataset, callbacks=[StepMarker()], shuffle=False)
    alone, _ = fit_epochs(model, data.dataset.take(1).cache().repeat(data.steps), shuffle=False)

    def iterate() -> None:
        for _ in data.dataset:
            pass

    timers = [Timer(yours, name=YOURS, items_per_call=data.examples),
              Timer(alone, name=STEP_ALONE, items_per_call=data.examples),
              Timer(iterate, name=PIPELINE_ALONE, items_per_call=data.examples)]
    race = dict(rounds=options.rounds, samples=options.rounds, threshold=MIN_GAIN,
                max_extensions=options.max_extensions, warmup=0, seed=options.seed)
    raced = race_table(rec, CHECK_TABLE, timers, metrics=lambda m, _: {
        "samples_per_s": m.items_per_s, "ms_per_batch": m.median_s / data.steps * 1e3}, primary="samples_per_s",
        lower_is_better=False, against={STEP_ALONE: YOURS, PIPELINE_ALONE: YOURS}, **race)
    traced = profiler.trace(timers[0], f"training on {data.source}", "input-pipeline", call_s=raced[YOURS].median_s,
                            steps_per_call=data.steps, calls=1,
                            flops_per_call=3 * facts["flops_per_example"] * data.examples
                            if facts.get("flops_per_example") else None) if profiler else None
    c = raced.comparisons[STEP_ALONE]  # how many times faster the step is without the pipeline
    waiting = [max(0.0, 1 - 1 / r) for r in (c.ratio, *c.ci95)]  # below 0: the step alone was no faster
    progress("input over a long run")
    sources, skipped, long_run = input_sources(data, rec, options, workdir / "input-sources")
    check = InputCheck(data.source, waiting[0], (waiting[1], waiting[2]),
                       {row: m.median_s / data.steps * 1e3 for row, m in raced.measurements.items()},
                       traced.input if traced else None, long_run)
    skipped["input pipeline: interleave"] = ("not measurable from outside your pipeline: it reads several files at "
                                             "once, Dataset.interleave(read, num_parallel_calls=tf.data.AUTOTUNE)")
    if not check.input_bound:
        skipped["input pipeline variants"] = "not input-bound: the pipeline keeps up with the model"
        # A faster source is advice only where training waits for its data.
        return [], skipped, check
    variants = _variants(data.dataset)
    trainers = [(YOURS, yours, losses)]
    for row, (dataset, _, _) in variants.items():
        epoch, row_losses = fit_epochs(model, dataset, shuffle=False)
        trainers.append((row, epoch, row_losses))
    # Each first epoch is timed apart (first_epoch_s): the cache's fills it.
    timers = [Timer(epoch, name=row, items_per_call=data.examples) for row, epoch, _ in trainers]
    raced = race_table(rec, VARIANTS_TABLE, timers, metrics=lambda m, _: {
        "samples_per_s": m.items_per_s, "first_epoch_s": m.first_call_s, **mfu(m.items_per_s, facts, passes=3)},
        primary="samples_per_s", lower_is_better=False, **race)
    final = {row: row_losses[-1] if row_losses else float("nan") for row, _, row_losses in trainers}
    findings = list(sources)
    for row, (_, code, cost) in variants.items():
        loss = final[row]
        agrees = math.isfinite(loss)
        findings.append(Finding(VARIANTS_TABLE, row, YOURS, raced.comparisons[row], code, cost, agrees,
                                "" if agrees else f"final loss {number(loss, 4)}: not finite"))
    return findings, skipped, check


def prepare(subject: Subject, options: Options) -> Options:
    """--data read and checked against the model before anything is measured."""
    from tfperf.doctor.targets import training_loss

    if options.data_source is None or options.data is not None:
        return options
    loss = training_loss(options.loss, options.from_logits)
    return dataclasses.replace(options, data=load_data(options.data_source, subject, loss, options.train_examples))


def run(ctx: Context) -> Section:
    """The input pipeline's check, long run and variants as a section; its verdict leads the report."""
    findings, skipped, check = input_pipeline(ctx.subject, ctx.recorder, ctx.options, ctx.progress, ctx.profiler,
                                              ctx.facts, ctx.workdir)
    return Section(EXPERIMENT.name, findings, skipped, check, lead=check.describe() + "\n",
                   leads=check.input_bound)  # training waits for its data: the pipeline's changes are the answer


EXPERIMENT = Experiment(
    name="input pipeline", question="Is training waiting for data? My pipeline starts fast, then crawls: why? "
                                    "Is from_generator slower than from_tensor_slices?",
    run=run, budgeted=False, applies=lambda subject, options: options.data is not None,
    steps=lambda subject, options: ["input pipeline", "input over a long run"], prepare=prepare,
    flags=(flag("--data", metavar="MODULE:FUNCTION",
                help="train on your own input pipeline: a function returning a tf.data.Dataset of (inputs, "
                     "targets) batches; doctor then says whether training waits for data and measures fixes"),
           flag("--long-run", type=flags.non_negative_int, metavar="SECONDS",
                help=f"with --data: read your pipeline alone this long to see whether it slows down as it goes "
                     f"(default {Options.long_run_s:.0f}; --quick {QUICK['long_run_s']:.0f}; 0 skips it); the same "
                     f"examples are also raced from tensors, a Python generator and TFRecord files")),
    rules=(lambda args: "--data is what the training experiments train on: add --train --loss LOSS (or "
                        "--train-step)" if args.data and not (args.train or args.train_step) else None,))
