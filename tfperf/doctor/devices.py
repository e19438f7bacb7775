"""`--devices N`: "why do two devices not give 2x?", measured on the user's model.

The model is trained under `tf.distribute.MirroredStrategy` on one device and on N (the GPUs where there are N;
else GPUs split into logical ones, or N logical CPU devices carved from the host, as `tfperf.devices` plans them),
each in a process of its own because TensorFlow fixes its devices when it first runs an op. Both start from the same
weights and train on the same examples; each device keeps the per-device batch, so the global batch grows with the
devices and the learning rate with it (the linear scaling rule, said in the report). The processes take turns,
round after round: fit()'s steps (timed from an epoch's first step to its end: each epoch's start, where
fit() makes the distributed iterator, is a cost per epoch, not per step), then one step split into its parts, each
a tf.function timed on its own on a batch already on the devices:

- the step: forward, loss, backward, the gradients' all-reduce and the update, as TensorFlow's custom-loop guide
  writes it (`strategy.run`, the optimizer all-reducing in the replica context);
- the compute: forward, loss and backward on every replica at once, no all-reduce;
- the all-reduce alone: the replica context's sum of those gradients, the very call the optimizer makes;
- the step with its batch taken from the distributed dataset each call: beyond the step, the input wait.

What the step spends beyond its compute is the all-reduce and update left exposed; the compute on N devices against
one device's says whether the devices have compute of their own (GPUs) or share it (logical devices on one CPU).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.loader import Subject
from tfperf import flags
from tfperf.doctor.experiment import Context, Experiment, Section, child_command, flag
from tfperf.doctor.options import Finding, Options
from tfperf.records.units import number

PER_DEVICE_BATCH = 32
BATCHES = 4  # global batches of the largest count in the examples both processes train on (repeated)
FIT_STEPS = 16
FIT = f"fit(), {FIT_STEPS} steps"
PARTS = ("step", "compute", "all-reduce", "step, batch from the dataset")
TIMED = (FIT, *PARTS)
# Scaling counts as faster or slower only when its interval clears 10% (mirrored_resnet.py: two runs of the same
# code on a 2-core machine gave 1.05x and 1.12x slower).
MIN_DIFFERENCE = 0.10


def fit_steps(model, dataset, keras) -> Callable[[], Any]:
    """A call that trains `model` FIT_STEPS more steps in fit(), returning their time as an Elapsed: from the
    epoch's first step to its end, so that the epoch's start (the distributed iterator made) stays out."""
    from tfperf.measure import Elapsed

    marks: list[float] = []
    clock = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: marks.clear(),
        on_train_batch_begin=lambda batch, logs: marks.append(time.perf_counter()) if batch == 0 else None,
        on_epoch_end=lambda epoch, logs: marks.append(time.perf_counter()))  # Keras reads the epoch's logs first

    def epoch() -> Elapsed:
        model.fit(dataset, epochs=1, steps_per_epoch=FIT_STEPS, verbose=0, callbacks=[clock])
        first, end = marks
        return Elapsed(end - first)

    return epoch


def serve_devices(count: int, source: str, work: Path, loss: str, from_logits: bool, seed: int) -> None:
    """A device count's process: devices first, then the model under the strategy; serves its timers. A model
    that cannot be built or trained so is replied as one line instead."""
    from tfperf.devices import device_plan  # sets TensorFlow's devices: before any op runs

    plan = device_plan(count)
    import keras
    import tensorflow as tf

    from tfperf.doctor.handover import build, error_reply, loss_function, take_over
    from tfperf.measure import Timer, serve_timers
    from tfperf.measure.processes import reply

    keras.utils.set_random_seed(seed)
    strategy = tf.distribute.MirroredStrategy(list(plan.names))
    replicas = strategy.num_replicas_in_sync
    global_batch = PER_DEVICE_BATCH * replicas
    per_example = loss_function(keras, loss, from_logits)
    try:
        # Variables made inside the scope are mirrored on every device; the learning rate grows with the batch.
        with strategy.scope():
            model = build(source, keras, work)
            x, y = take_over(work, model)
            model.compile(optimizer=keras.optimizers.Adam(1e-3 * replicas), loss=per_example)
            optimizer = keras.optimizers.Adam(1e-3 * replicas)
            optimizer.build(model.trainable_variables)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True).repeat()
        epoch = fit_steps(model, dataset, keras)

        def replica_gradients(xb, yb):
            with tf.GradientTape() as tape:
                value = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                                   global_batch_size=global_batch)
            return tape.gradient(value, model.trainable_variables)

        def replica_step(xb, yb):
            grads = replica_gradients(xb, yb)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces, then updates

        distributed = strategy.experimental_distribute_dataset(dataset)
        batch = next(iter(distributed))  # on the devices already: the parts below wait for no input
        step = tf.function(lambda: strategy.run(replica_step, args=batch))
        gradients = tf.function(lambda: strategy.run(replica_gradients, args=batch))()
        # The gradients read once into a scalar, as the update reads them, rather than handed out of the function.
        compute = tf.function(lambda: strategy.run(
            lambda xb, yb: tf.add_n([tf.reduce_sum(g) for g in replica_gradients(xb, yb)]), args=batch))
        all_reduce = tf.function(lambda: strategy.run(
            lambda g: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, g),
            args=(gradients,)))
        batches = iter(distributed)
        from_data = tf.function(lambda it: strategy.run(replica_step, args=next(it)))
        parts = {"step": step, "compute": lambda: strategy.experimental_local_results(compute()),
                 "all-reduce": lambda: strategy.experimental_local_results(all_reduce()),
                 "step, batch from the dataset": lambda: from_data(batches)}
        timers = [Timer(epoch, name=FIT, items_per_call=FIT_STEPS * global_batch)]
        timers += [Timer(parts[p], name=p, items_per_call=global_batch) for p in PARTS]
        first_epoch = timers[0].start(warmup=0)  # the first epoch traces: timed apart
        gradient_bytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in model.trainable_variables)
    except Exception as exc:  # noqa: BLE001  (a model MirroredStrategy cannot train is a finding, said in one line)
        print(error_reply(exc), flush=True)
        return
    print(reply({"devices": list(plan.names), "kind": plan.kind, "note": plan.note, "global_batch": global_batch,
                 "learning_rate": 1e-3 * replicas, "first_epoch_s": first_epoch, "gradient_bytes": gradient_bytes}),
          flush=True)
    serve_timers(timers, warmup=1)


@dataclasses.dataclass(frozen=True)
class DevicesFound:
    """Each device count's figures, the speedup, and the step split, for the report's paragraph."""

    counts: tuple[str, ...]  # the rows: "1 device", "N devices"
    medians_s: dict[tuple[str, str], float]  # (what, row) -> median seconds per call
    comparisons: dict[str, Any]  # what -> Comparison of N devices against one
    facts: dict[str, dict[str, Any]]  # row -> devices, kind, global batch, learning rate, first epoch
    cores: int  # the host's usable cores

    @property
    def many(self) -> str:
        return self.counts[-1]

    def split_ms(self, row: str) -> dict[str, float]:
        """A step's parts in milliseconds: compute, what the step spends beyond it (the all-reduce and update left
        exposed), the input wait, and what fit() spends around each step beyond the step with its data."""
        m = {what: self.medians_s[(what, row)] * 1e3 for what in TIMED}
        fit_step = m[FIT] / FIT_STEPS
        return {"step": m["step"], "compute": m["compute"], "all-reduce alone": m["all-reduce"],
                "exposed beyond the compute": max(0.0, m["step"] - m["compute"]),
                "input wait": max(0.0, m["step, batch from the dataset"] - m["step"]),
                "fit() per step": fit_step,
                "fit() around the step": max(0.0, fit_step - m["step, batch from the dataset"])}

    def speedup(self) -> float:
        """Samples per second in fit() on N devices over one device's (the comparison is per example)."""
        return self.comparisons[FIT].ratio

    def why(self) -> str:
        """What keeps N devices from Nx: each device has its own batch, so ideally a step on N devices takes what
        one device's takes; of the time it takes beyond that, the part that grew most."""
        n = len(self.facts[self.many]["devices"])
        one, many = self.split_ms(self.counts[0]), self.split_ms(self.many)
        kind = self.facts[self.many]["kind"]
        grew = {part: many[part] - one[part] for part in
                ("compute", "exposed beyond the compute", "input wait", "fit() around the step")}
        largest = max(grew, key=grew.get)
        excess = many["fit() per step"] - one["fit() per step"]
        head = (f"A step of fit() takes {number(many['fit() per step'], 3)} ms on {n} devices against "
                f"{number(one['fit() per step'], 3)} ms on one (ideally the same: each device has its own batch); ")
        if excess <= 0:
            return head + f"nothing grew: the speedup is what {n} devices give this model here."
        if largest == "compute" and kind != "gpu":
            return head + (f"most of the growth is compute, and the devices share it: "
                           f"{'logical CPU devices' if kind == 'cpu' else 'logical GPUs'} ran each replica's forward "
                           f"and backward in {number(many['compute'], 3)} ms together against "
                           f"{number(one['compute'], 3)} ms for one,"
                           f" on {self.cores} core(s). Devices of this kind add no compute; {n} GPUs (or hosts) give "
                           f"each replica its own.")
        if largest == "compute":
            return head + (f"most of the growth is compute ({number(one['compute'], 3)} -> "
                           f"{number(many['compute'], 3)} ms): the "
                           f"devices are not independent (a shared host feeding them, or kernels launched from one "
                           f"thread).")
        if largest == "exposed beyond the compute":
            return head + (f"most of the growth is the all-reduce left exposed: the step spends "
                           f"{number(many['exposed beyond the compute'], 3)} ms beyond its compute (the "
                           f"all-reduce alone takes "
                           f"{number(many['all-reduce alone'], 3)} ms for "
                           f"{self.facts[self.many]['gradient_bytes'] / 2**20:.1f}"
                           f" MB of gradients). A larger per-device batch spreads it over more examples.")
        if largest == "input wait":
            return head + (f"most of the growth is the wait for the batch from the distributed dataset "
                           f"({number(many['input wait'], 3)} ms): `dataset.prefetch(tf.data.AUTOTUNE)` and "
                           f"a faster input "
                           f"pipeline (--data) come first.")
        return head + (f"most of the growth is fit()'s own loop around each step "
                       f"({number(one['fit() around the step'], 3)}"
                       f" -> {number(many['fit() around the step'], 3)} ms: the distributed iterator and "
                       f"the dispatch of "
                       f"each step to the replicas): `model.compile(..., steps_per_execution=8)` runs several steps "
                       f"per dispatch.")

    def describe(self) -> str:
        one, many = self.counts[0], self.many
        facts = self.facts[many]
        n = len(facts["devices"])
        fit = self.comparisons[FIT]
        lines = [f"The model under MirroredStrategy on 1 device and on {n} ({facts['note'] or ', '.join(facts['devices'])}),"
                 f" each in its own process from the same weights, taking turns. Each device keeps a batch of "
                 f"{PER_DEVICE_BATCH}: the global batch is {self.facts[one]['global_batch']} on one device and "
                 f"{facts['global_batch']} on {n}, and the learning rate is scaled with it ("
                 f"{number(self.facts[one]['learning_rate'], 6)} -> {number(facts['learning_rate'], 6)}, "
                 f"the linear scaling rule).", "",
                 f"- fit(), samples per second on {n} devices against one: "
                 f"{self.speedup():.2f}x (ideal {n}x): "
                 f"{fit.describe()}."]
        for row in (one, many):
            s = self.split_ms(row)
            lines.append(f"- {row}, a step of fit() at global batch {self.facts[row]['global_batch']}: "
                         f"{number(s['fit() per step'], 3)} ms: compute {number(s['compute'], 3)} ms; "
                         f"beyond it in the step (the "
                         f"all-reduce and update left exposed) {number(s['exposed beyond the compute'], 3)} ms, the "
                         f"all-reduce alone taking {number(s['all-reduce alone'], 3)} ms; input wait "
                         f"{number(s['input wait'], 3)} ms;"
                         f" fit()'s loop around the step {number(s['fit() around the step'], 3)} ms.")
        lines += ["", self.why()]
        return "\n".join(lines)


def devices(subject: Subject, rec, options: Options, workdir: Path, progress) -> tuple[list[Finding], dict,
                                                                                     DevicesFound | None]:
    """Start a process per device count, race their timers, and split each one's step."""
    from tfperf.devices import usable_cores
    from tfperf.doctor.handover import hand_over
    from tfperf.measure import TimerServer
    from tfperf.measure.processes import ChildError
    from tfperf.records.jsonl import race_table

    progress("devices")
    if subject.kind != "keras":
        return [], {"devices": "not run: a SavedModel has no Keras model to train under MirroredStrategy"}, None
    count = options.devices
    work = workdir / "devices"
    hand_over(subject, options, work, PER_DEVICE_BATCH * count * BATCHES)
    rows = {1: "1 device", count: f"{count} devices"}
    servers, facts = {}, {}
    try:
        for n, row in rows.items():  # started side by side; each says when it is ready
            argv = child_command("devices", str(n), subject.source, str(work), options.loss,
                                 str(int(options.from_logits)), str(options.seed))
            servers[row] = TimerServer(argv, env={"TF_CPP_MIN_LOG_LEVEL": "3"}, name=f"the {row} process")
        for row, server in servers.items():
            try:
                said = server.next_reply()
            except ChildError as exc:
                said = {"error": str(exc)}
            if "error" in said:
                return [], {"devices": f"not run: on {row}: {said['error']}"}, None
            facts[row] = said
        medians, comparisons = {}, {}
        for what in TIMED:
            timers = [server.timer(what, name=row) for row, server in servers.items()]
            raced = race_table(rec, f"devices: {what}", timers, metrics=lambda m, _: {
                "ms": m.median_s * 1e3, "samples_per_s": m.items_per_s}, primary="ms", lower_is_better=True,
                rounds=options.rounds, threshold=MIN_DIFFERENCE, max_extensions=options.max_extensions,
                min_time_s=options.min_time_s, seed=options.seed)
            medians.update({(what, row): m.median_s for row, m in raced.measurements.items()})
            comparisons.update({what: c for c in raced.comparisons.values()})
    except ChildError as exc:  # a process failed mid-race: said, not raised
        return [], {"devices": f"not finished: {exc}"}, None
    finally:
        for server in servers.values():
            server.close()
    found = DevicesFound(tuple(rows.values()), medians, comparisons, facts, usable_cores())
    many = rows[count]
    finding = Finding(f"devices: {FIT}", many, rows[1], comparisons[FIT],
                      "strategy = tf.distribute.MirroredStrategy()  # build and compile inside strategy.scope()",
                      f"{count} devices; global batch {facts[many]['global_batch']}, learning rate "
                      f"{number(facts[many]['learning_rate'], 6)}", note=found.why())
    return [finding], {}, found


def child(argv: list[str]) -> int:
    """A device count's process: `COUNT MODEL WORK LOSS FROM_LOGITS SEED`."""
    count, source, work, loss, logits, seed = argv[:6]
    serve_devices(int(count), source, Path(work), loss, logits == "1", int(seed))
    return 0


def run(ctx: Context) -> Section:
    """One device against N, as a section of the report."""
    findings, skipped, found = devices(ctx.subject, ctx.recorder, ctx.options, ctx.workdir, ctx.progress)
    return Section(EXPERIMENT.name, findings, skipped, found,
                   detail=f"## More devices\n\n{found.describe()}\n" if found is not None else "")


def _count_rule(args) -> str | None:
    if args.devices and not args.loss:
        return (f"--devices {args.devices} trains the model under MirroredStrategy: give --loss (a Keras loss name "
                f"such as sparse_categorical_crossentropy)")
    return "--devices 1 has nothing to compare with one device: give 2 or more" if args.devices == 1 else None


EXPERIMENT = Experiment(
    name="devices", question="Why do two devices not give 2x?",
    run=run, budgeted=False, applies=lambda subject, options: bool(options.devices),
    flags=(flag("--devices", type=flags.positive_int, metavar="N",
                help="why do N devices not give Nx: the model trained under MirroredStrategy on 1 and N devices (GPUs "
                     "where there are N, else logical CPU devices), each in its own process from the same weights "
                     "(needs --loss): fit throughput, and one step split into compute, the all-reduce left exposed "
                     "and the input wait, with the global batch and learning rate scaling said"),),
    rules=(_count_rule,))
