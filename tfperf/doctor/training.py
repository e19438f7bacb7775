"""Training: "does steps_per_execution, XLA or mixed precision help my fit? Why did mixed precision make it slower?"

Plain fit against steps_per_execution, jit_compile, mixed precision and larger batches, from the same weights."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tfperf import flags
from tfperf.deploy.errors import first_line
from tfperf.deploy.loader import Subject, all_layers
from tfperf.doctor.facts import mfu
from tfperf.doctor.effect import policy_effect
from tfperf.doctor.experiment import Context, Experiment, Section, flag
from tfperf.doctor.xla import NO_STRINGS, XLA_REFUSED, xla_reason
from tfperf.doctor.options import MIN_GAIN, DoctorError, Finding, Options
from tfperf.doctor.targets import loss_check, mixed_code, synthetic_rows, training_loss
from tfperf.gpus import mixed_policy_here


KERNELS_QUICK_S = 60  # --quick traces a slower mixed row kernel by kernel only when its epochs take less


def training_configs(options: Options, examples: int, strings: bool = False,
                     builds_under_policy: bool = True) -> tuple[list[tuple], dict[str, str]]:
    """What is tried against plain fit: (row, mixed policy, compile options, batch, code, cost) each, and
    what is not tried and why (`strings`: the model takes string inputs, which XLA cannot;
    `builds_under_policy`: the user's code builds the model, rather than loading it from a file)."""
    data = options.data
    mixed = mixed_policy_here()  # float16 from compute capability 7.0, bfloat16 from 8.0 and on CPUs
    base = options.train_batch  # the user's own batch (Keras' default unless --train-batch says)
    configs = [(f"plain fit (batch {base})", None, {}, base, "", ""),
               ("steps_per_execution=16", None, {"steps_per_execution": 16}, base,
                "model.compile(..., steps_per_execution=16)",
                "callbacks and the progress bar see every 16th step"),
               ("jit_compile=True", None, {"jit_compile": True}, base,
                "model.compile(..., jit_compile=True)", "an XLA compile before the first epoch (first call below)"),
               (mixed, mixed, {}, base, mixed_code(mixed, builds_under_policy),
                "lower-precision activations: check accuracy; keep the last layer float32")][:4 if mixed else 3]
    skipped = {} if mixed else {"training: mixed precision": "these GPUs have no tensor cores (compute capability "
                                                                  "below 7.0): lower precision would gain nothing"}
    if strings:  # refused before compiling: see xla.NO_STRINGS
        configs = [c for c in configs if not c[2].get("jit_compile")]
        skipped["training: jit_compile=True"] = XLA_REFUSED + f"the model {NO_STRINGS}"
    if data is None:
        configs += [(f"batch {b}", None, {}, b, f"model.fit(x, y, batch_size={b})",
                     "fewer optimizer steps per epoch: retune the learning rate; more activation memory")
                    for b in sorted(set(options.batch_sizes)) if b > base and b <= examples]
    else:
        configs[0] = (f"plain fit (batch {data.batch})", *configs[0][1:3], data.batch, "", "")
        skipped["training: batch sizes"] = f"set by {data.source} (batch {data.batch}): batch it otherwise to compare"
    return configs, skipped


def started_trainers(subject: Subject, configs: Sequence[tuple], options: Options, x, y, loss_fn, examples: int,
                     skipped: dict[str, str], effects: list | None = None) -> list[tuple]:
    """A fresh model per configuration, compiled and its first epoch run (timed apart): (row, timer, its
    losses, code, cost) each. A configuration that fails is named in `skipped`; plain fit failing is an error.
    `effects` gets (what, effect.PolicyEffect) for each configuration under a mixed policy."""
    import keras

    from tfperf.measure import Timer
    from tfperf.train import StepMarker, fit_epochs

    data = options.data
    trainers = []
    for row, policy, compile_options, batch, code, cost in configs:
        try:
            model = subject.fresh(policy)
            model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss_fn, **compile_options)
            epoch, losses = fit_epochs(model, x, y, callbacks=[StepMarker()], shuffle=False,
                                       **({} if data is not None else {"batch_size": batch}))
            timer = Timer(epoch, name=row, items_per_call=examples)
            timer.start(warmup=0)
        except DoctorError:
            raise
        except Exception as exc:
            if row.startswith("plain"):
                if data is not None:
                    raise DoctorError(f"the model does not train on {data.source} with --loss {options.loss}: "
                                      f"{type(exc).__name__}: {first_line(exc)}") from None
                raise DoctorError(f"the model does not train with --loss {options.loss} on doctor's synthetic "
                                  f"targets ({type(exc).__name__}: {first_line(exc)}): pass targets as 'y' in "
                                  f"--sample FILE.npz") from None
            skipped[f"training: {row}"] = (XLA_REFUSED + xla_reason(exc) if compile_options.get(
                "jit_compile") else f"{type(exc).__name__}: {first_line(exc)}")
            continue
        trainers.append((row, timer, losses, code, cost))
        if policy and effects is not None:  # whether the policy took effect in the model rebuilt under it
            import tensorflow as tf

            try:
                effects.append((f"training row {row} (the model rebuilt under it)",
                                policy_effect(model, tf.nest.map_structure(lambda a: a[:2], x) if data is None
                                              else next(iter(data.dataset))[0])))
            except Exception as exc:  # the row is measured all the same
                skipped[f"training: whether {row} took effect"] = f"{type(exc).__name__}: {first_line(exc)}"
    return trainers


def training(subject: Subject, rec, options: Options, progress, facts: Mapping[str, Any] | None = None,
             profiler=None) -> tuple[list[Finding], dict, tuple[list, list]]:
    """Plain fit against steps_per_execution, jit_compile, mixed precision and larger batches, epoch for
    epoch from the same weights, on synthetic arrays or the user's pipeline (`options.data`); final losses
    checked finite and in agreement; whether the mixed policy took effect in its model (effect.PolicyEffect).
    `profiler` (a ProfilePass) then traces plain fit's epoch and the peak memory of each, and a mixed row that is
    not faster beside plain fit, kernel by kernel (kernels.KernelDiff)."""
    from tfperf.records.jsonl import race_table

    if subject.fresh is None:
        raise DoctorError("training experiments need the Keras model: give a .keras file or module:factory, "
                          "not a SavedModel")
    progress("training")
    data = options.data
    if data is not None:  # the user's pipeline: its batches, its batch size
        examples, x, y = data.examples, data.dataset, None
    else:
        examples = options.train_examples
        x, y = synthetic_rows(subject, options, examples)
    loss_fn = training_loss(options.loss, options.from_logits)
    configs, skipped = training_configs(options, examples, any(i.dtype == "string" for i in subject.inputs),
                                        subject.builds_under_policy)
    effects: list = []  # (what, effect.PolicyEffect) for each row under a mixed policy
    kernels: list = []  # kernels.KernelDiff for each mixed row that is not faster
    trainers = started_trainers(subject, configs, options, x, y, loss_fn, examples, skipped, effects)
    final_losses: dict[str, float] = {}

    def read_losses(_):
        for row, _, losses, _, _ in trainers:
            final_losses[row] = losses[-1]

    def loss_agrees(row: str) -> bool:
        return loss_check(row, final_losses[row], final_losses[trainers[0][0]])[0]

    raced = race_table(rec, "training", [t for _, t, _, _, _ in trainers], metrics=lambda m, _: {
        "samples_per_s": m.items_per_s, "first_epoch_s": m.first_call_s, "final_loss": final_losses[m.name],
        "loss_agrees": loss_agrees(m.name), **mfu(m.items_per_s, facts or {}, passes=3)},
        primary="samples_per_s", lower_is_better=False,
        rounds=options.rounds, samples=options.rounds, threshold=MIN_GAIN, max_extensions=options.max_extensions,
        warmup=0, seed=options.seed, on_first_rounds=read_losses)
    plain, plain_loss = trainers[0][0], final_losses[trainers[0][0]]
    findings = []
    for row, _, _, code, cost in trainers[1:]:
        agrees, note = loss_check(row, final_losses[row], plain_loss)
        findings.append(Finding("training", row, plain, raced.comparisons[row], code, cost, agrees, note))
    if profiler is not None:  # after the race: the traced epochs are never samples
        flops = facts.get("flops_per_example") if facts else None
        if data is None:  # on the user's pipeline, plain fit was traced by the input pipeline check
            profiler.trace(trainers[0][1], f"training: {plain}", "training", call_s=raced[plain].median_s, calls=1,
                           steps_per_call=math.ceil(examples / options.train_batch),
                           flops_per_call=3 * flops * examples if flops else None)
        for row, timer, _, _, _ in trainers[1:]:
            profiler.peak(timer, f"training: {row}", "training")
        kernels += slower_kernels(subject, trainers, raced, profiler, skipped,
                                  KERNELS_QUICK_S if options.quick else None)
    return findings, skipped, (effects, kernels)


def slower_kernels(subject: Subject, trainers: Sequence[tuple], raced, profiler, skipped: dict[str, str],
                   limit_s: float | None = None) -> list:
    """For a mixed-precision row that is not faster than plain fit: both traced in turns, the layers' operations
    that got slower or were added (kernels.KernelDiff); not when its traced epochs would take over `limit_s`."""
    import time

    from tfperf.doctor.kernels import ROUNDS, kernel_diff, precision_hint
    from tfperf.gpus import tensorflow_gpus
    from tfperf.measure.stats import FASTER

    plain = trainers[0][1]
    found = []
    for row, timer, _, _, _ in trainers[1:]:
        if not row.startswith("mixed") or raced.comparisons[row].verdict == FASTER:
            continue
        expected = ROUNDS * (raced[plain.name].median_s + raced[row].median_s)
        if limit_s is not None and expected > limit_s:
            skipped[f"training: {row}, kernel by kernel"] = (f"not traced: {ROUNDS} epochs of it and of plain fit "
                                                             f"would take about {expected:.0f} s; run without --quick")
            continue
        started = time.perf_counter()
        try:
            diff = kernel_diff(plain, timer, [layer.name for layer in all_layers(subject.model)],
                               profiler.root / "kernels", calls=1)
            hint = precision_hint(row, subject.model, [g.layer for g in diff.slower], tensorflow_gpus())
            found.append(dataclasses.replace(diff, hint=hint))
        except Exception as exc:  # a trace XProf cannot read: a gap in the report, not a failed run
            profiler.failed[f"kernels of training: {row}"] = f"{type(exc).__name__}: {first_line(exc)}"
        finally:
            profiler.took_s += time.perf_counter() - started
    return found


def prepare(subject: Subject, options: Options) -> Options:
    """A --loss Keras does not have is refused before anything is measured."""
    if options.loss:
        training_loss(options.loss, options.from_logits)
    return options


WAITS_FOR_DATA = ("not run: training waits for its data, so a faster step would wait longer; fix the input pipeline "
                  "first, then run the doctor again")


def run(ctx: Context) -> Section:
    """The training race as a section: whether each mixed row took effect, and kernel by kernel why one is not
    faster. Not run while an earlier section found training waiting for its data."""
    if any(getattr(s.found, "input_bound", False) for s in ctx.sections.values()):
        return Section(EXPERIMENT.name, skipped={"training": WAITS_FOR_DATA})
    findings, skipped, (effects, kernels) = training(ctx.subject, ctx.recorder, ctx.options, ctx.progress, ctx.facts,
                                                     ctx.profiler)
    detail = "" if not kernels else "\n".join(["", "## Why it is not faster, kernel by kernel", "",
                                                *[f"- {k.describe()}" for k in kernels], ""])
    return Section(EXPERIMENT.name, findings, skipped, kernels, detail=detail, precision=effects)


def _loss_without_training(args) -> str | None:
    if args.loss and not (args.train or args.keras_stacks or args.train_step or args.devices):
        return "--loss is for the training experiments: add --train (or --keras-stacks, --train-step, --devices N)"
    return None


EXPERIMENT = Experiment(
    name="training", question="Does steps_per_execution, XLA or mixed precision help my fit? Why did mixed "
                              "precision make it slower? Did it take effect?",
    run=run, budgeted=False, applies=lambda subject, options: options.races_one_switch, prepare=prepare,
    flags=(flag("--train", action="store_true", help="also run the training experiments (needs --loss)"),
           flag("--loss", help="Keras loss name for --train, e.g. sparse_categorical_crossentropy"),
           flag("--from-logits", action="store_true", help="the model outputs logits (for the --loss)"),
           flag("--train-batch", type=flags.positive_int, metavar="N",
                help="your fit()'s batch size: plain fit's, which every training row is raced against and the "
                     "search starts from (default 32, Keras' own)")),
    rules=(lambda args: "--train needs --loss (a Keras loss name such as sparse_categorical_crossentropy)"
           if args.train and not args.loss else None, _loss_without_training))
