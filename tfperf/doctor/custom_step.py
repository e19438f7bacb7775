"""Your training step: "is my custom training loop faster in tf.function or XLA? Why NaN under mixed_float16?"

A custom loop's step timed four ways, and under mixed_float16 where it first goes
non-finite.

People who write their own loop ask what `fit` users ask (does tf.function, XLA or mixed precision speed it up?)
and one more: why it ends in NaN under mixed_float16. The step is the user's function `step(model, optimizer, batch)`
returning the loss. It is timed eagerly, in a `tf.function`, with `jit_compile=True` and under this machine's mixed
policy, each on a copy of the model from the same weights. Then it runs eagerly under mixed_float16 with Keras'
`LossScaleOptimizer`, the optimizer's `apply` watched: step by step, the loss, the loss scale, the variables whose
gradients are not finite and whether the step scaled its loss; when the loss is not finite before any update, the
first layer whose output overflows float16 is found by running the model's layers one by one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tfperf.deploy.errors import first_line
from tfperf.deploy.loader import Subject
from tfperf.doctor.experiment import Context, Experiment, Section, flag
from tfperf.doctor.options import DoctorError, Finding, MIN_GAIN, Options
from tfperf.doctor.targets import PLAIN_BATCH, mixed_code
from tfperf.doctor.xla import NO_STRINGS, XLA_REFUSED, xla_reason

TABLE = "your training step"
EAGER, GRAPH, XLA = "your step, eager", "your step in tf.function", "tf.function, jit_compile=True"
WATCHED_STEPS, QUICK_WATCHED_STEPS = 30, 12
FLOAT16_MAX = 65504.0


def load_step(source: str) -> Callable:
    """The user's `module:function` step (the loader's ModelError, one line, when there is none)."""
    from tfperf.deploy.loader import import_callable

    return import_callable(source, "function")


def _finite(values) -> bool:
    return all(bool(np.all(np.isfinite(np.asarray(v, dtype=np.float64)))) for v in values)


def _loss_value(loss: Any, source: str) -> float:
    if loss is None:
        raise DoctorError(f"{source} returned None, not the loss: return the step's loss (a scalar tensor)")
    try:
        return float(np.asarray(loss, dtype=np.float64).mean())
    except (TypeError, ValueError):
        raise DoctorError(f"{source} returned {type(loss).__name__}, not the loss: return the step's loss "
                          f"(a scalar tensor)") from None


def check_step(subject: Subject, options: Options, batch: tuple) -> None:
    """Run the user's step once on a copy of the model, before anything is measured: DoctorError in one line when it
    fails or returns no loss."""
    import keras

    if subject.fresh is None:
        raise DoctorError("--train-step trains the Keras model: give a .keras file or module:factory, not a SavedModel")
    try:
        loss = options.step(subject.fresh(None), keras.optimizers.Adam(1e-3), batch)
    except Exception as exc:
        raise DoctorError(f"{options.step_source}(model, optimizer, batch) failed on the doctor's batch: "
                          f"{type(exc).__name__}: {first_line(exc)}") from None
    _loss_value(loss, options.step_source)


def step_rows(subject: Subject, step: Callable, batch: tuple, mixed: str | None, source: str
              ) -> tuple[list[tuple[str, Callable, str, str]], dict[str, str]]:
    """(row, call, code, cost) for each way the step runs, each on its own copy of the model and its own optimizer;
    the eager row first (the baseline: the step as written). A way that fails is named in the second value."""
    import keras
    import tensorflow as tf

    def fresh(policy: str | None = None):
        model = subject.fresh(policy)
        optimizer = keras.optimizers.Adam(1e-3)
        if policy == "mixed_float16":  # float16 needs its loss scaled, or small gradients vanish
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        return model, optimizer

    model, optimizer = fresh()
    eager = (lambda: step(model, optimizer, batch))
    try:
        _loss_value(eager(), source)
    except DoctorError:
        raise
    except Exception as exc:
        raise DoctorError(f"{source}(model, optimizer, batch) failed on the doctor's batch: {type(exc).__name__}: "
                          f"{first_line(exc)}") from None
    rows = [(EAGER, eager, "", "")]
    skipped = {}
    ways = [(GRAPH, None, {}, "train_step = tf.function(step)   # then train_step(model, optimizer, batch)",
             "a trace per new input signature"),
            (XLA, None, {"jit_compile": True}, "train_step = tf.function(step, jit_compile=True)",
             "an XLA compile per new input shape")]
    if mixed:
        ways.append((f"{mixed}, in tf.function", mixed, {},
                     mixed_code(mixed, subject.builds_under_policy) + "; then tf.function(step)"
                     + ("; wrap the optimizer in keras.mixed_precision.LossScaleOptimizer and scale the loss"
                        if mixed == "mixed_float16" else ""),
                     "lower-precision activations: check the loss"))
    for row, policy, compiled, code, cost in ways:
        if compiled and any(i.dtype == "string" for i in subject.inputs):  # refused before compiling
            skipped[f"{TABLE}: {row}"] = XLA_REFUSED + f"the model {NO_STRINGS}"
            continue
        model_, optimizer_ = fresh(policy)
        traced = tf.function(lambda x, model_=model_, optimizer_=optimizer_: step(model_, optimizer_, x), **compiled)
        call = (lambda traced=traced: traced(batch))
        try:
            call()  # traced (and compiled) here; the timer's own first call repeats nothing
        except Exception as exc:
            skipped[f"{TABLE}: {row}"] = (XLA_REFUSED + xla_reason(exc) if compiled else
                                          f"{type(exc).__name__}: {first_line(exc)}")
            continue
        rows.append((row, call, code, cost))
    return rows, skipped


@dataclasses.dataclass(frozen=True)
class Watched:
    """One step of the step under mixed_float16: its loss, the loss scale after it, what was not finite."""

    loss: float
    scale: float | None
    bad_gradients: tuple[str, ...]  # variables whose gradient had an inf or NaN at this step
    bad_weights: tuple[str, ...]  # variables holding an inf or NaN after it
    scaled: bool  # the step called optimizer.scale_loss


@dataclasses.dataclass(frozen=True)
class Overflow:
    """The step's run under mixed_float16, step by step, and the layer that overflows when the loss does at once."""

    steps: tuple[Watched, ...]
    variables: int
    initial_scale: float
    applied: bool  # the step applied its gradients through the optimizer
    overflowing_layer: str | None = None  # the first layer whose float16 output is not finite

    def first(self, what: str) -> int | None:
        for k, s in enumerate(self.steps, start=1):
            bad = {"loss": not math.isfinite(s.loss), "gradient": bool(s.bad_gradients),
                   "weight": bool(s.bad_weights)}[what]
            if bad:
                return k
        return None

    def describe(self) -> str:
        n = len(self.steps)
        scales = [s.scale for s in self.steps if s.scale is not None]
        words = [f"Your step under mixed_float16 with Keras' LossScaleOptimizer, {n} steps run eagerly, the optimizer "
                 f"watched:"]
        loss_at, grad_at, weight_at = self.first("loss"), self.first("gradient"), self.first("weight")
        if grad_at:
            names = self.steps[grad_at - 1].bad_gradients
            words.append(f"the first non-finite gradient at step {grad_at}, of "
                         + ", ".join(f"`{v}`" for v in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                                                      else "")
                         + f" ({len(names)} of {self.variables} variables)")
            if not self.steps[-1].bad_gradients and all(s.scaled for s in self.steps) and not loss_at:
                words.append("while the loss scale came down to its level, as the LossScaleOptimizer expects (it "
                             "skips those steps), and finite after;")
            else:
                last = max(k for k, s in enumerate(self.steps, start=1) if s.bad_gradients)
                words.append(f"and at {sum(1 for s in self.steps if s.bad_gradients)} of {n} steps, the last at step "
                             f"{last}: each of those updates skipped;")
        else:
            words.append("every gradient finite;" if self.applied else
                         "no gradient seen: the step never called the optimizer's apply_gradients or apply;")
        words.append(f"the loss first not finite at step {loss_at};" if loss_at else "the loss finite throughout;")
        words.append(f"the weights first not finite after step {weight_at}." if weight_at else
                     "the weights stayed finite.")
        if scales:
            skipped = sum(1 for a, b in zip([self.initial_scale, *scales], scales) if b < a)
            words.append(f"The loss scale went from {self.initial_scale:g} to {scales[-1]:g} ({skipped} steps skipped "
                         f"for non-finite gradients, each halving it).")
        advice = []
        if loss_at == 1 and self.overflowing_layer:
            advice.append(f"The loss is not finite before any update: layer `{self.overflowing_layer}` gives values "
                          f"beyond float16's range ({FLOAT16_MAX:g}) with the initial weights. Keep it in float32: "
                          f"make it with dtype='float32' (and cast its input), or scale its values down.")
        if not any(s.scaled for s in self.steps) and self.applied:
            advice.append("Your step never calls optimizer.scale_loss: under mixed_float16 small gradients underflow "
                          "to zero. Take the gradient of `optimizer.scale_loss(loss)` inside the tape; the "
                          "LossScaleOptimizer unscales it and skips steps whose gradients are not finite.")
        if weight_at:
            advice.append("Non-finite values reached the weights: the step updates them without the "
                          "LossScaleOptimizer's check (assigning, or an optimizer of its own).")
        return " ".join(words + advice)


def overflowing_layer(model, x) -> str | None:
    """The first layer (in the model's graph order) whose output holds an inf or NaN on `x`."""
    import keras

    from tfperf.doctor.xla import graph_nodes, run_nodes

    found = graph_nodes(model)
    if found is None:
        return None
    functional, nodes = found
    seen: list[str] = []

    def checked(node, args, kwargs):
        outputs = node.operation(*args, **kwargs)
        if not seen and not _finite(keras.tree.flatten(outputs)):
            seen.append(node.operation.name)
        return outputs

    run_nodes(nodes, {id(s): v for s, v in zip(functional.inputs, keras.tree.flatten(x))}, checked)
    return seen[0] if seen else None


def watch_overflow(subject: Subject, step: Callable, batch: tuple, steps: int) -> Overflow:
    """Run the step eagerly `steps` times under mixed_float16 with a LossScaleOptimizer whose `apply` and
    `scale_loss` are watched: what went non-finite first, and where."""
    import keras

    model = subject.fresh("mixed_float16")
    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    seen: dict[str, Any] = {}
    apply, scale_loss = optimizer.apply, optimizer.scale_loss

    def watched_apply(grads, trainable_variables=None):
        seen["bad"] = tuple(v.path if hasattr(v, "path") else v.name
                            for g, v in zip(grads, trainable_variables or model.trainable_variables)
                            if g is not None and not _finite([g]))
        return apply(grads, trainable_variables)

    def watched_scale(loss):
        seen["scaled"] = True
        return scale_loss(loss)

    optimizer.apply, optimizer.scale_loss = watched_apply, watched_scale
    watched, applied = [], False
    for _ in range(steps):
        seen.clear()
        loss = _loss_value(step(model, optimizer, batch), "the step")
        applied = applied or "bad" in seen
        scale = float(optimizer.dynamic_scale.numpy()) if optimizer.built else None
        weights = tuple(v.path for v in model.trainable_variables if not _finite([v.numpy()]))
        watched.append(Watched(loss, scale, seen.get("bad", ()), weights, bool(seen.get("scaled"))))
        if weights:  # nothing after this step can say more
            break
    layer = overflowing_layer(model, batch[0]) if watched and not math.isfinite(watched[0].loss) else None
    return Overflow(tuple(watched), len(model.trainable_variables), float(optimizer.initial_scale), applied, layer)


def custom_step(subject: Subject, rec, options: Options, progress, batch: tuple) -> tuple[list[Finding], dict,
                                                                                          Overflow | None]:
    """The user's step (options.step) timed eagerly, in tf.function, with XLA and under the mixed policy, raced
    against the step as written; then its run under mixed_float16 watched."""
    from tfperf.gpus import mixed_policy_here
    from tfperf.measure import Timer
    from tfperf.records.jsonl import race_table

    if subject.fresh is None:
        raise DoctorError("--train-step trains the Keras model: give a .keras file or module:factory, not a SavedModel")
    progress("your training step")
    rows, skipped = step_rows(subject, options.step, batch, mixed_policy_here(), options.step_source)
    examples = int(np.shape(batch[0] if not isinstance(batch[0], dict) else next(iter(batch[0].values())))[0])
    timers = []
    for row, call, _, _ in rows:
        timer = Timer(call, name=row, items_per_call=examples)
        timer.start(warmup=0)
        timers.append(timer)
    raced = race_table(rec, TABLE, timers, metrics=lambda m, _: {"samples_per_s": m.items_per_s,
                                                                 "ms_per_step": m.median_s * 1e3,
                                                                 "first_call_s": m.first_call_s},
                       primary="samples_per_s", lower_is_better=False, rounds=options.rounds, threshold=MIN_GAIN,
                       max_extensions=options.max_extensions, min_time_s=options.min_time_s, seed=options.seed,
                       warmup=0)
    findings = [Finding(TABLE, row, EAGER, raced.comparisons[row], code, cost) for row, _, code, cost in rows[1:]
                if row in raced.comparisons]
    overflow = None
    try:
        overflow = watch_overflow(subject, options.step, batch, QUICK_WATCHED_STEPS if options.quick else WATCHED_STEPS)
    except DoctorError:
        raise
    except Exception as exc:
        skipped[f"{TABLE}: under mixed_float16"] = f"{type(exc).__name__}: {first_line(exc)}"
    return findings, skipped, overflow


def first_batch(subject: Subject, options: Options, batch_size: int) -> tuple:
    """The batch the step is timed on: the first of the user's pipeline, or synthetic inputs and targets."""
    from tfperf.doctor.targets import synthetic_rows

    if options.data is not None:
        first = next(iter(options.data.dataset))
        return tuple(first[:2])
    return synthetic_rows(subject, options, batch_size)


def prepare(subject: Subject, options: Options) -> Options:
    """--train-step imported and tried on one batch before anything is measured."""
    if options.step_source is None or options.step is not None:
        return options
    options = dataclasses.replace(options, step=load_step(options.step_source))
    check_step(subject, options, first_batch(subject, options, PLAIN_BATCH))
    return options


def run(ctx: Context) -> Section:
    """The user's step, timed and watched under mixed_float16, as a section of the report."""
    findings, skipped, overflow = custom_step(ctx.subject, ctx.recorder, ctx.options, ctx.progress,
                                              first_batch(ctx.subject, ctx.options, PLAIN_BATCH))
    detail = f"\n## Your training step under mixed_float16\n\n{overflow.describe()}\n" if overflow else ""
    return Section(EXPERIMENT.name, findings, skipped, overflow, detail=detail)


EXPERIMENT = Experiment(
    name=TABLE, question="Is my custom training loop faster in tf.function or XLA? Why NaN under mixed_float16?",
    run=run, budgeted=False, applies=lambda subject, options: options.step is not None, prepare=prepare,
    flags=(flag("--train-step", metavar="MODULE:FUNCTION",
                help="your own training loop's step: a function step(model, optimizer, batch) that trains one batch "
                     "(inputs, targets) and returns the loss (needs --loss for the targets, or --data); timed "
                     "eagerly, in tf.function, with XLA and under mixed precision, then run under mixed_float16 to "
                     "find the first non-finite loss, gradient and variable (about 20 s for a small model)"),),
    rules=(lambda args: "--train-step runs your step on the doctor's batches: give --loss (a Keras loss name, for the "
                        "targets it makes, such as sparse_categorical_crossentropy)"
           if args.train_step and not args.loss else None,))
