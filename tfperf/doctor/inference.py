"""Inference: "which way of calling my model is fastest, at batch 1 and in batches, and does XLA help?"

predict(), model(x), tf.function, XLA, LiteRT and ONNX Runtime at each batch size, each checked against the model's
own outputs; where XLA fails, the layers it cannot compile, and the rest compiled around them. Each row is raced
against the call a user serves with (tfperf.doctor.calls.serving_baseline), not predict().

The LiteRT and ONNX Runtime rows time the very files `tfperf export` writes (the same conversion, the
same check against the model), so that the advice to use one is the export command that makes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tfperf.deploy.formats import FLOAT_TOLERANCE, NOT_EVIDENCE, agreement, constant
from tfperf.deploy.errors import first_line
from tfperf.deploy.inputs import check_runs, make_inputs, to_numpy, to_tensors
from tfperf.deploy.loader import Subject
from tfperf.doctor.calls import RUNTIMES, STOCHASTIC_MARGIN, Call, Table, Tables, serving_baseline
from tfperf.doctor.facts import mfu
from tfperf.doctor.experiment import Context, Experiment, Section
from tfperf.doctor.options import MIN_GAIN, Finding, Options, model_flags
from tfperf.doctor.xla import NO_STRINGS, XLA_REFUSED, XlaFailure, bisect, compiled_around, xla_reason
from tfperf.extras import MissingExtra
from tfperf.gpus import exact_float32, float32_tolerance, tf32_here
from tfperf.records.units import number

XLA_ROW = "tf.function, jit_compile=True"


def export_command(subject: Subject, options: Options, fmt: str) -> list[str]:
    """The `tfperf export` command (its arguments after `tfperf`) that writes the artifact a runtime row timed."""
    return ["export", subject.source, "--format", fmt, *model_flags(subject, options)]


def exported_runtimes(subject: Subject, options: Options, workdir: Path
                      ) -> tuple[dict[str, Callable], dict, dict, dict[str, Path]]:
    """Each runtime with the model exported to it as its `tfperf export` command does (the same conversion
    and check against the model, from the model being timed), loaded with all cores: (calls on inputs by
    name, what could not be exported and why, the export commands, the export folders)."""
    import shlex

    from tfperf.deploy.layout import export_subject, load

    runners, skipped, commands, folders = {}, {}, {}, {}
    for row, fmt in RUNTIMES.items():
        try:
            exported = export_subject(subject, workdir / "exports", name=fmt, format=fmt, sample=options.sample,
                                      seed=options.seed)
            runners[row] = load(exported.path, threads=os.cpu_count())
            folders[row] = Path(exported.path)
        except MissingExtra as exc:  # not installed here: said, with the extra that brings it
            skipped[row] = str(exc)
            continue
        except Exception as exc:  # a converter that cannot take this model: a finding, not a failure
            skipped[row] = f"export failed: {type(exc).__name__}: {first_line(exc)}"
            continue
        commands[row] = shlex.join(["tfperf", *export_command(subject, options, fmt)])
    return runners, skipped, commands, folders


def candidate_calls(subject: Subject, batch: int, flat, tensors, graph, xla, runtimes: Mapping[str, Any],
                    commands: Mapping[str, str]) -> dict[str, Call]:
    """The rows at one batch size. Each: the call, whether it answers in the model's structure (named by the
    subject's head) or by name already (an exported runtime), the code that applies it, and what it costs."""
    calls: dict[str, Call] = {}
    if subject.kind == "keras":
        # Keras' array adapter takes no NumPy unicode arrays ("Invalid dtype: str480"): string inputs go as tensors.
        strings = any(i.dtype == "string" for i in subject.inputs)
        packed, model = (tensors if strings else subject.pack(flat)), subject.model
        calls["predict()"] = (lambda: model.predict(packed, batch_size=batch, verbose=0), True, "", "")
        calls["model(x)"] = (lambda: model(tensors, training=False), True,
                             "y = model(x, training=False)   # instead of model.predict(x) for small batches",
                             "none: the same model in eager mode")
    else:
        calls["signature"] = (lambda: subject.call(tensors), True, "", "")
    calls["tf.function"] = (
        lambda: graph(tensors), True,
        "serve = tf.function(lambda x: model(x, training=False), input_signature=[...])  # None batch axis",
        "one trace per input signature (see retracing)")
    calls[XLA_ROW] = (
        lambda: xla(tensors), True,
        "serve = tf.function(lambda x: model(x, training=False), jit_compile=True, input_signature=[...])",
        "an XLA compile for every new input shape (first call below)")
    for row, runner in runtimes.items():
        calls[row] = ((lambda runner=runner: runner(flat)), False, commands[row],
                      "a converted copy to ship and keep in step with the model; float32, checked against it")
    return calls


def reference_answers(subject: Subject, flat, batch: int, skipped: dict[str, str]) -> tuple[dict, float]:
    """The model's answers at this batch, in exact float32 (not TF32, Ampere GPUs' default), and how far they
    move between calls; what they cannot show (a stochastic model, outputs alike on every row) said in `skipped`."""
    with exact_float32():
        reference = check_runs(subject, flat)
        own = own_difference(subject, flat, reference)
    if own > FLOAT_TOLERANCE:
        skipped[f"exact agreement at batch {batch}"] = (
            f"the model is stochastic: two calls on the same inputs differed by up to {number(own, 2)} of "
            f"their scale, so "
            f"each row was held to differing from the model by at most {STOCHASTIC_MARGIN:g}x that (its tolerance "
            f"column), which shows the answers are alike, not equal")
    if batch > 1 and constant(reference):
        skipped[f"agreement at batch {batch}"] = (f"{NOT_EVIDENCE}: every output is the same on all {batch} rows, "
                                                  f"so max_relative_diff shows nothing of how the rows compute")
    return reference, own


def own_difference(subject: Subject, flat, reference, calls: int = 2) -> float:
    """How far the model's answers to the same inputs move from call to call, relative to their scale: 0 for a
    deterministic model, more for one that samples in its forward pass."""
    return max(max((a["relative"] for a in agreement(reference, check_runs(subject, flat)).values()), default=0.0)
               for _ in range(calls))


def checked_timers(subject: Subject, calls: dict[str, Call], batch: int, reference,
                   skipped: dict[str, str]) -> tuple[dict[str, float], list]:
    """A Timer per row whose first call (tracing, compiling: timed apart) answered, and how far each answer
    is from the reference; a row that fails is dropped from `calls` and named in `skipped`."""
    from tfperf.measure import Timer

    diffs, timers = {}, []
    for row, (fn, structured, _, _) in list(calls.items()):
        timer = Timer(fn, name=row, items_per_call=batch)
        try:
            out = timer.first_call()
            got = to_numpy(subject.head(out)) if structured else out
            diffs[row] = max((a["relative"] for a in agreement(reference, got).values()), default=0.0)
        except Exception as exc:
            skipped[f"{row} at batch {batch}"] = (XLA_REFUSED + xla_reason(exc) if "jit_compile" in row
                                                  else f"{type(exc).__name__}: {first_line(exc)}")
            del calls[row]
            continue
        timers.append(timer)
    return diffs, timers


def xla_fallback(subject: Subject, tensors, reason: str) -> tuple[XlaFailure, Callable | None]:
    """Where XLA fails on the model (a bisection of its layers) and its call with the rest compiled, or None."""
    found = bisect(subject.model, tensors) if subject.kind == "keras" else None
    if found is None or not found.refusals:
        return XlaFailure(reason, found), None
    try:
        around = compiled_around(subject.model, found.failing)
    except Exception as exc:
        return XlaFailure(reason, found, not_timed=f"{type(exc).__name__}: {first_line(exc)}"), None
    return XlaFailure(reason, found, row=f"jit_compile=True around {', '.join(found.failing)}"), around


def _profile(profiler, timers, raced, batch: int, facts: Mapping[str, Any], *, memory: bool,
             runtimes: Mapping[str, Any]) -> None:
    """tf.function at this batch traced; with `memory`, the peak of each TensorFlow row (the other runtimes
    allocate outside its view)."""
    by_name = {t.name: t for t in timers}
    flops = facts.get("flops_per_example")
    if "tf.function" in by_name:
        profiler.trace(by_name["tf.function"], f"tf.function at batch {batch}", f"inference-batch-{batch}",
                       call_s=raced["tf.function"].median_s, flops_per_call=flops * batch if flops else None)
    if memory:
        for row in [r for r in by_name if r not in runtimes and r != "tf.function"]:
            profiler.peak(by_name[row], f"{row} at batch {batch}", f"inference-batch-{batch}")


def _xla_findings(raced, calls: Mapping[str, Call], batch: int, failure: XlaFailure | None,
                  agrees: Callable[[str], bool]) -> list[Finding]:
    """XLA against tf.function: the question users ask is whether to turn it on for a function they already
    trace (and, where XLA fails on the model, whether compiling around what it refuses pays)."""
    from tfperf.measure import versus

    found = []
    for row in (XLA_ROW, failure.row if failure else None):
        if "tf.function" in raced.measurements and row in raced.measurements:
            _, _, code, cost = calls[row]
            found.append(Finding(f"XLA at batch {batch}", "jit_compile=True" if row == XLA_ROW else row,
                                 "tf.function", versus(raced["tf.function"], raced[row], threshold=MIN_GAIN),
                                 code, cost, agrees(row)))
    return found


def inference(subject: Subject, rec, options: Options, workdir: Path, progress,
              facts: Mapping[str, Any], profiler=None) -> tuple[list[Finding], dict, Tables]:
    """predict() / model(x) / tf.function / XLA / LiteRT / ONNX Runtime, at each batch size, against the user's
    call there; where XLA fails, the layers it cannot compile (bisected) and the model with the rest compiled, timed
    beside them. `profiler` (a ProfilePass) then traces tf.function at the smallest and largest batch, and the peak
    memory of each TensorFlow row at the largest."""
    import tensorflow as tf

    from tfperf.records.jsonl import race_table

    findings, skipped, found = [], {}, Tables()
    runtimes, commands = {}, {}
    # TensorFlow's own rows run with TF32 where it is on (Ampere and newer GPUs): they are held to what TF32
    # allows, the exports (float32 on the CPU) to FLOAT_TOLERANCE; the reference is exact float32.
    tensorflow_bar, why = float32_tolerance(FLOAT_TOLERANCE, tf32_here())

    own = [0.0]  # how far the model's own answers move between calls on the same inputs (0: deterministic)

    def tolerance(row: str) -> float:
        return max(FLOAT_TOLERANCE if row in runtimes else tensorflow_bar, STOCHASTIC_MARGIN * own[0])

    if options.exported:
        runtimes, failed, commands, found.exports = exported_runtimes(subject, options, workdir)
        found.commands = commands
        skipped.update(failed)
    batches = [b for b in options.batch_sizes if subject.fixed_batch in (None, b)]
    if not batches:
        skipped["batch sweep"] = f"the signature takes only batch {subject.fixed_batch}"
        batches = [subject.fixed_batch]
    graph = tf.function(subject.call)
    xla = tf.function(subject.call, jit_compile=True)
    failure, around = None, None  # where XLA fails: why, and the model with the rest compiled
    for batch in batches:
        progress(f"inference at batch {batch}")
        flat = make_inputs(subject, batch, seed=options.seed, sample=options.sample)
        tensors = subject.pack(to_tensors(flat))
        reference, own[0] = reference_answers(subject, flat, batch, skipped)
        calls = candidate_calls(subject, batch, flat, tensors, graph, xla, runtimes, commands)
        baseline = serving_baseline(subject, batch)
        calls = {baseline: calls.pop(baseline), **calls}  # race_table judges every row against the first
        if any(i.dtype == "string" for i in subject.inputs):  # refused before compiling: see xla.NO_STRINGS
            del calls[XLA_ROW]
            skipped[f"{XLA_ROW} at batch {batch}"] = XLA_REFUSED + f"the model {NO_STRINGS}"
        diffs, timers = checked_timers(subject, calls, batch, reference, skipped)
        if failure is None and f"{XLA_ROW} at batch {batch}" in skipped:
            failure, around = xla_fallback(subject, tensors,
                                           skipped[f"{XLA_ROW} at batch {batch}"].removeprefix(XLA_REFUSED))
        if around is not None:
            extra = {failure.row: ((lambda: around(tensors)), True, f"serve = tfperf.doctor.xla.compiled_around("
                                   f"model, {failure.bisection.failing!r})", "an XLA compile for every new input shape; "
                                   "the layers left out run as before")}
            more_diffs, more_timers = checked_timers(subject, extra, batch, reference, skipped)
            calls.update(extra)
            diffs.update(more_diffs)
            timers += more_timers
        baseline = next(iter(calls))  # the user's call, unless it failed here (then said in skipped)
        table = "batch 1 latency" if batch == 1 else f"throughput at batch {batch}"
        raced = race_table(
            rec, table, timers,
            metrics=lambda m, _: {"ms_per_call": m.median_s * 1e3, "p99_ms": m.p99_s * 1e3,
                                  "rows_per_s": m.items_per_s, "first_call_s": m.first_call_s, "batch": batch,
                                  "max_relative_diff": diffs[m.name], "tolerance": tolerance(m.name),
                                  **mfu(m.items_per_s, facts)},
            primary="ms_per_call" if batch == 1 else "rows_per_s", lower_is_better=batch == 1,
            rounds=options.rounds, threshold=MIN_GAIN, max_extensions=options.max_extensions,
            min_time_s=options.min_time_s, seed=options.seed, warmup=0)
        found.tables.append(Table(batch, baseline, dict(calls), {row: diffs[row] <= tolerance(row) for row in calls},
                                  flat, reference, max(FLOAT_TOLERANCE, STOCHASTIC_MARGIN * own[0]), raced, own[0]))
        for row, c in raced.comparisons.items():
            _, _, code, cost = calls[row]
            agrees = diffs[row] <= tolerance(row)
            note = "" if agrees else (f"outputs differ from the model's by up to {number(diffs[row], 2)} of their scale"
                                      + (f" ({why})" if why and row not in runtimes else ""))
            findings.append(Finding(table, row, baseline, c, code, cost, agrees, note))
        if profiler is not None and batch in (batches[0], batches[-1]):  # after the race: never a sample
            _profile(profiler, timers, raced, batch, facts, memory=batch == batches[-1], runtimes=runtimes)
        findings += _xla_findings(raced, calls, batch, failure, agrees=lambda row: diffs[row] <= tolerance(
            "tf.function"))
    found.failure = failure
    return findings, skipped, found


def given_precision(subject: Subject, options: Options) -> tuple[list[tuple[str, Any]], dict[str, str]]:
    """Whether a mixed policy in force took effect in the model as given: (what, effect.PolicyEffect) pairs, and
    why not checked."""
    from tfperf.doctor.effect import policy_effect

    if subject.kind != "keras":
        return [], {}
    try:
        inputs = subject.pack(to_tensors(make_inputs(subject, 2, seed=options.seed, sample=options.sample)))
        return [("the model as given", policy_effect(subject.model, inputs))], {}
    except Exception as exc:  # a model that cannot be traced in a tf.function says so elsewhere too
        return [], {"mixed precision check": f"{type(exc).__name__}: {first_line(exc)}"}


def batch_steps(subject: Subject, options: Options) -> list[str]:
    """The progress steps: one per batch size the model takes."""
    batches = [b for b in options.batch_sizes if subject.fixed_batch in (None, b)] or [subject.fixed_batch]
    return [f"inference at batch {b}" for b in batches]


def run(ctx: Context) -> Section:
    """The inference experiment as a section of the report."""
    precision, skipped = given_precision(ctx.subject, ctx.options)
    findings, left_out, found = inference(ctx.subject, ctx.recorder, ctx.options, ctx.workdir, ctx.progress,
                                          ctx.facts, ctx.profiler)
    failure = found.failure
    return Section(EXPERIMENT.name, findings, {**skipped, **left_out}, found, precision=precision,
                   detail=f"\n## When XLA fails\n\n{failure.describe()}\n" if failure is not None else "")


EXPERIMENT = Experiment(
    name="inference", question="Which way of calling my model is fastest, at batch 1 and in batches? Does XLA help?",
    run=run, steps=batch_steps)
