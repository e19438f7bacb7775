"""Keras stacks: "why is my model slower on Keras 3?", measured on the user's model.

The model is built under Keras 2 (tf_keras), Keras 3 on TensorFlow and Keras 3 on JAX, each in a process of its own
(the stack is fixed when Keras is imported; `tfperf.stacks`), from the same weights, and trained on the same
batches with the same loss: the first epoch (tracing and compiling, one reading per process), fit throughput,
predict() and model(x) at batch 1, and one training step split into its parts, each timed on its own: the forward
pass, the loss on fixed predictions, the gradient (forward, loss and backward together, since backward needs the
forward's tape) and the optimizer's update on fixed gradients. The processes take turns round after round, every
figure judged against Keras 2's (Keras 3 on TensorFlow's where Keras 2 cannot build the model), so that the part
that got slower is named. A model given as a file is loaded by
each stack's own loader, a module:factory model built by the user's function with `import keras` meaning that
stack's Keras; a stack that cannot build it is one line, and the others still run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tfperf.deploy.loader import Subject
from tfperf.doctor.experiment import Context, Experiment, Section, child_command, flag, needs_loss
from tfperf.doctor.options import MIN_GAIN, Finding, Options
from tfperf.doctor.handover import (batch_rows, build, error_reply, first_rows, hand_over, loss_function,
                                     pack, take_over)
from tfperf.stacks import STACKS, backend_device, install_hint, keras_module, stack_env

PARTS = ("forward", "loss", "gradient (forward, loss, backward)", "optimizer update")
TIMED = ("fit epoch", "predict(), batch 1", "model(x), batch 1", *PARTS)


def step_parts(k, model, loss_fn, optimizer, x, y) -> dict[str, Any]:
    """The four parts of a training step as callables, each compiled as the stack compiles (tf.function on
    TensorFlow, jax.jit on JAX) and each timed on its own."""
    if k.backend.backend() == "jax":
        import jax

        # Copies: fit() donates the variables' buffers to its own steps, which would delete these under the parts.
        copy = lambda variables: [jax.numpy.array(v.value, copy=True) for v in variables]  # noqa: E731
        trainable, frozen = copy(model.trainable_variables), copy(model.non_trainable_variables)
        optimizer.build(model.trainable_variables)
        opt_state = copy(optimizer.variables)

        def forward(tv, ntv, x):
            return model.stateless_call(tv, ntv, x, training=True)[0]

        def loss_of(tv, ntv, x, y):
            return jax.numpy.mean(loss_fn(y, forward(tv, ntv, x)))

        forward_jit = jax.jit(forward)
        predictions = forward_jit(trainable, frozen, x)
        loss_jit = jax.jit(lambda y, p: jax.numpy.mean(loss_fn(y, p)))
        grad_jit = jax.jit(jax.grad(loss_of))
        grads = grad_jit(trainable, frozen, x, y)
        update_jit = jax.jit(lambda opt, g, tv: optimizer.stateless_apply(opt, g, tv))
        done = jax.block_until_ready  # JAX returns before it computes: each part waits for its whole answer
        return {"forward": lambda: done(forward_jit(trainable, frozen, x)),
                "loss": lambda: done(loss_jit(y, predictions)),
                "gradient (forward, loss, backward)": lambda: done(grad_jit(trainable, frozen, x, y)),
                # Applied to the same state each call (stateless): the weights the other parts read stay put.
                "optimizer update": lambda: done(update_jit(opt_state, grads, trainable))}
    import tensorflow as tf

    forward = tf.function(lambda: model(x, training=True))
    predictions = forward()
    loss = tf.function(lambda: tf.reduce_mean(loss_fn(y, predictions)))

    @tf.function
    def gradient():
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        return tape.gradient(value, model.trainable_variables)

    grads = [tf.zeros_like(v) for v in model.trainable_variables]  # zero gradients: Adam moves nothing much
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # builds its slots outside the timed call
    update = tf.function(lambda: optimizer.apply_gradients(zip(grads, model.trainable_variables)))
    return {"forward": forward, "loss": loss, "gradient (forward, loss, backward)": gradient,
            "optimizer update": update}


def serve_stack(stack: str, source: str, work: Path, loss: str, from_logits: bool, batch: int, seed: int) -> None:
    """A stack's process: builds the model with the shared weights, serves its timers; a model this stack
    cannot build is replied as one line instead."""
    from tfperf.measure import Timer, serve_timers
    from tfperf.measure.processes import reply
    from tfperf.train import fit_epochs

    try:
        k = keras_module(stack)  # a stack not installed here is said in the same one line
        model = build(source, k, work)
        x, y = take_over(work, model)
    except Exception as exc:  # noqa: BLE001  (a stack that cannot build the model is a finding)
        print(error_reply(exc), flush=True)
        return
    k.utils.set_random_seed(seed)
    loss_fn = loss_function(k, loss, from_logits)
    model.compile(optimizer=k.optimizers.Adam(1e-3), loss=loss_fn)
    epoch, _ = fit_epochs(model, x, y, keras_module=k, batch_size=batch, shuffle=False)
    timers = [Timer(epoch, name="fit epoch", items_per_call=len(y))]
    one = pack({n[2:]: rows for n, rows in first_rows(work).items()})
    timers += [Timer(lambda: model.predict(one, verbose=0), name="predict(), batch 1"),
               Timer(lambda: model(one), name="model(x), batch 1")]
    xb, yb = batch_rows(x, batch), y[:batch]
    parts = step_parts(k, model, loss_fn, k.optimizers.Adam(1e-3), xb, yb)
    timers += [Timer(parts[p], name=p, items_per_call=batch) for p in PARTS]
    first_epoch = timers[0].start(warmup=0)  # the first epoch traces and compiles: timed apart
    print(reply({"first_epoch_s": first_epoch, "device": backend_device(k),
                 "jit_compile": bool(getattr(model, "jit_compile", False))}), flush=True)
    serve_timers(timers, warmup=1)


@dataclasses.dataclass(frozen=True)
class StacksFound:
    """What each stack measured, for the report's paragraph."""

    stacks: tuple[str, ...]  # those that built the model, in STACKS' order: the first is the baseline
    comparisons: dict[tuple[str, str], Any]  # (what, stack) -> Comparison against the baseline
    facts: dict[str, dict[str, Any]]  # stack -> first epoch, device, jit_compile
    failed: dict[str, str]  # stack -> why it could not build or run the model

    def verdict(self, stack: str) -> str:
        """Which part of training got slower under `stack`: the step's part that slowed most, or fit's own loop
        when the fit is slower and no part of the step is."""
        from tfperf.measure.stats import SLOWER

        slower = sorted((c.ratio, what) for what in PARTS if (c := self.comparisons.get((what, stack))) is not None
                        and c.verdict == SLOWER)
        fit = self.comparisons.get(("fit epoch", stack))
        if slower:
            return f"Slower most in the step: {slower[0][1]} ({1 / slower[0][0]:.2f}x the time)."
        if fit is not None and fit.verdict == SLOWER:
            return ("No part of the training step is measurably slower: what fit() does around the step (its data "
                    "adapter, callbacks, the loop that dispatches each step) is where the time went.")
        return "No part of the training step is measurably slower."

    @property
    def baseline(self) -> str:
        """What the others are judged against: Keras 2 where it built the model, else Keras 3 on TensorFlow."""
        return self.stacks[0]

    def describe(self) -> str:
        lines = [f"The same model, weights and batches under each Keras, each in its own process, taking turns; each "
                 f"figure against {self.baseline}'s from the same rounds:", ""]
        for stack in self.stacks[1:]:
            f = self.facts[stack]
            parts = "; ".join(f"{what} {self.comparisons[(what, stack)].describe()}" for what in TIMED
                              if (what, stack) in self.comparisons)
            lines.append(f"- {stack} ({f['device']}, jit_compile {f['jit_compile']}, first epoch "
                         f"{f['first_epoch_s']:.2f} s against {self.facts[self.baseline]['first_epoch_s']:.2f} s): {parts}."
                         f" {self.verdict(stack)}")
        lines += [f"- {stack}: not measured: {why}" for stack, why in self.failed.items()]
        return "\n".join(lines)


def keras_stacks(subject: Subject, rec, options: Options, workdir: Path, progress) -> tuple[list[Finding], dict,
                                                                                            StacksFound | None]:
    """Start a process per stack, race their timers, record every figure against Keras 2's, and name the part
    of the training step that got slower under each Keras 3 backend."""
    from tfperf.measure import TimerServer
    from tfperf.measure.processes import ChildError
    from tfperf.records.jsonl import race_table

    progress("keras stacks")
    if subject.kind != "keras":
        return [], {"keras stacks": "not run: a SavedModel has no Keras model to build under each stack"}, None
    work, batch = workdir / "stacks", 32
    hand_over(subject, options, work, options.train_examples)
    servers, failed, facts = {}, {}, {}
    try:
        for stack in STACKS:  # started side by side; each says when it is ready
            argv = child_command("keras_stacks", stack, subject.source, str(work), options.loss,
                                 str(int(options.from_logits)), str(batch), str(options.seed))
            servers[stack] = TimerServer(argv, env={**stack_env(stack), "TF_CPP_MIN_LOG_LEVEL": "3"},
                                         name=f"the {stack} process")
        for stack, server in list(servers.items()):
            try:
                said = server.next_reply()
            except ChildError as exc:
                said = {"error": str(exc)}
            if "error" in said:
                why = said["error"]
                failed[stack] = why + (f" (install it with {install_hint(stack)})" if "ModuleNotFound" in why else "")
                server.close()
                del servers[stack]
                continue
            facts[stack] = said
        if len(servers) < 2:
            return [], {**{f"keras stacks: {s}": w for s, w in failed.items()},
                        "keras stacks": "fewer than two stacks built the model: nothing to compare"}, None
        comparisons = {}
        for what in TIMED:
            try:
                timers = [server.timer(what, name=stack) for stack, server in servers.items()]
                raced = race_table(rec, f"keras stacks: {what}", timers, metrics=lambda m, _: {
                    "ms": m.median_s * 1e3, **({"samples_per_s": m.items_per_s} if what == "fit epoch" else {})},
                    primary="ms", lower_is_better=True, rounds=options.rounds, threshold=MIN_GAIN,
                    max_extensions=options.max_extensions, min_time_s=options.min_time_s, seed=options.seed)
            except ChildError as exc:  # a stack's process failed on this part: said, and nothing after it is raced
                failed[f"{what} and after"] = str(exc)
                break
            comparisons.update({(what, stack): c for stack, c in raced.comparisons.items()})
        if not any(what == "fit epoch" for what, _ in comparisons):  # the first race failed: nothing to report
            return [], {f"keras stacks: {s}": w for s, w in failed.items()}, None
        # The rounds are taken; the readiness replies already carried what each process knows of itself.
        found = StacksFound(tuple(servers), comparisons, facts, failed)
        return _findings(found), {f"keras stacks: {s}": w for s, w in failed.items()}, found
    finally:
        for server in servers.values():
            server.close()


def _findings(found: StacksFound) -> list[Finding]:
    """Per Keras 3 backend, its fit against Keras 2's, with the part of the step that got slower most named."""
    findings = []
    for stack in found.stacks[1:]:
        findings.append(Finding(
            "keras stacks: fit epoch", stack, found.baseline, found.comparisons[("fit epoch", stack)],
            f"{' '.join(f'{k}={v}' for k, v in STACKS[stack].items())} python train.py  # the stack is chosen before "
            f"Keras is imported", f"the model's code under that stack; {found.verdict(stack)}",
            note=f"first epoch {found.facts[stack]['first_epoch_s']:.2f} s against "
                 f"{found.facts[found.baseline]['first_epoch_s']:.2f} s"))
    return findings


def child(argv: list[str]) -> int:
    """A stack's process: `STACK MODEL WORK LOSS FROM_LOGITS BATCH SEED`, started with the stack's environment."""
    stack, source, work, loss, logits, batch, seed = argv[:7]
    serve_stack(stack, source, Path(work), loss, logits == "1", int(batch), int(seed))
    return 0


def run(ctx: Context) -> Section:
    """The stacks raced, as a section of the report."""
    findings, skipped, found = keras_stacks(ctx.subject, ctx.recorder, ctx.options, ctx.workdir, ctx.progress)
    return Section(EXPERIMENT.name, findings, skipped, found,
                   detail=f"## Keras stacks\n\n{found.describe()}\n" if found is not None else "")


EXPERIMENT = Experiment(
    name="keras stacks", question="Why is my model slower on Keras 3? Which part got slower?",
    run=run, budgeted=False, applies=lambda subject, options: options.keras_stacks,
    flags=(flag("--keras-stacks", action="store_true",
                help="why is my model slower on Keras 3: the model under Keras 2 (tf_keras), Keras 3 on TensorFlow "
                     "and Keras 3 on JAX, each in its own process from the same weights (needs --loss): first epoch, "
                     "fit throughput, predict() and model(x), and one training step split into forward, loss, "
                     "gradient and optimizer update, each timed on its own"),),
    rules=(needs_loss("--keras-stacks", "trains the model under each Keras"),))
