"""Data parallelism from scratch: split the minibatch over devices, all-reduce the gradients, update.

Every device holds a copy of the parameters and computes gradients on its slice of the minibatch;
the gradients are summed across devices and every copy takes the same step.

Run:   python recipes/multi_device_scratch.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21 and Keras 3. Uses the GPUs when there are enough (--devices), otherwise
       splits this CPU into logical devices; mnist-5k works offline (--dataset fashion_mnist downloads).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import sys

import keras
import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.measure import Timer, interleave, versus
from tfperf.data import load_arrays, to_dataset
from tfperf.devices import device_plan, usable_cores
from tfperf.models import get_net
from tfperf.measure.stats import FASTER, Comparison
from tfperf.recipe import Conclusion, Headline, Recipe, RecipeError



# The technique: copy the parameters, split the batch, all-reduce the gradients, update ----------------
# The seed's "multi-GPU training" section, written with today's TensorFlow: LeNet trained by SGD, where
# the model is a Keras model called statelessly (`model.stateless_call(params, ...)`) so that each device
# can run it on its own copy of the parameters. Four pieces do the work: copy the parameters to each
# device, split the batch, all-reduce the gradients (sum on the first device, copy back, as the seed
# does), and update every copy. With the same global batch, this must train exactly like one device:
# the mean of the per-device gradients of equal slices is the gradient of the whole batch. The recipe
# checks that, then times both.


def replicate(values, devices):
    """Data parallelism: one copy of every parameter on every device."""
    copies = []
    for device in devices:
        with tf.device(device):
            copies.append([tf.Variable(tf.identity(v), name=f"replica_{i}") for i, v in enumerate(values)])
    return copies


def split_batch(x, y, count):
    """Data parallelism: equal slices of the minibatch, one per device."""
    return tf.split(x, count), tf.split(y, count)


def allreduce(grads_per_device, devices):
    """Data parallelism: add the gradients on the first device, then copy the sum back to every device."""
    with tf.device(devices[0]):
        summed = [tf.add_n(list(gs)) for gs in zip(*grads_per_device)]
    copies = []
    for device in devices:
        with tf.device(device):
            copies.append([tf.identity(g) for g in summed])
    return copies


def make_train_step(model, devices, replicas, lr):
    """One SGD step over all devices; the loss is the mean over the global batch."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    @tf.function
    def train_step(x, y):
        xs, ys = split_batch(x, y, len(devices))
        grads, losses = [], []
        for device, params, xi, yi in zip(devices, replicas, xs, ys):
            with tf.device(device):  # each device computes on its own slice with its own copy
                with tf.GradientTape() as tape:
                    logits, _ = model.stateless_call(params, [], xi, training=True)
                    # Sum here and divide by the global batch below: the slices' gradients then add up
                    # to the gradient of the mean loss over the whole batch.
                    loss = loss_fn(yi, logits) / tf.cast(tf.shape(x)[0], tf.float32)
                grads.append(tape.gradient(loss, params))
                losses.append(loss)
        for device, params, g in zip(devices, replicas, allreduce(grads, devices)):
            with tf.device(device):  # every copy takes the same step, so they stay identical
                for p, gi in zip(params, g):
                    p.assign_sub(lr * gi)
        return tf.add_n(losses)

    return train_step


def accuracy(model, params, x, y):
    """Test accuracy of one replica's parameters."""
    logits, _ = model.stateless_call(params, [], tf.constant(x), training=False)
    return float(np.mean(np.argmax(logits, -1) == y))


# Measuring -------------------------------------------------------------------------------------------
# With the same global batch, data parallelism must train exactly like one device: the mean of the
# per-device gradients of equal slices is the gradient of the whole batch. That is checked first; then
# epochs on one device and on all of them are timed in turn.

SPEED, AGREEMENT = "training by hand, same global batch", "agreement with one device"
AGREEMENT_STEPS, TOLERANCE = 10, 1e-4


@dataclasses.dataclass(frozen=True)
class Found:
    devices: list[str]
    weight_diff: float  # the largest difference from one device's weights after the agreement steps
    replica_diff: float  # and between the replicas
    batches: int  # agreement steps taken
    comparison: Comparison | None  # all devices against one
    device_note: str  # what the devices are (gpus.DevicePlan.note)


def add_flags(p) -> None:
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--devices", type=flags.positive_int, default=2, help="devices to split each batch over")
    p.add_argument("--epochs", type=flags.positive_int, help="passes over the training set (the first untimed)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    p.add_argument("--max-steps", type=flags.positive_int, help="at most this many steps per epoch (tests)")


def measure(args, rec) -> Found:
    # Setup: devices first, before any op fixes them -------------------------------------------
    try:
        plan = device_plan(args.devices)
    except ValueError as exc:
        raise RecipeError(exc) from None
    devices = list(plan.names)
    print(f"devices: {plan.note}", flush=True)
    data = load_arrays(args.dataset, seed=args.seed)
    if args.batch_size % args.devices:
        raise RecipeError(f"--batch-size {args.batch_size} does not split evenly over {args.devices} devices: "
                          f"use a multiple of {args.devices}")
    keras.utils.set_random_seed(args.seed)
    model = get_net("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    initial = [v.numpy() for v in model.trainable_variables]
    print(f"devices: {', '.join(devices)}; global batch {args.batch_size}")

    # Agreement: the same batches through one device and through all of them ----------------------
    batches = list(to_dataset(data.x_train, data.y_train, batch_size=args.batch_size, seed=args.seed,
                              drop_remainder=True).take(AGREEMENT_STEPS))
    trained = {}
    for n in (1, args.devices):
        replicas = replicate(initial, devices[:n])
        step = make_train_step(model, devices[:n], replicas, args.lr)
        losses = [float(step(x, y)) for x, y in batches]
        trained[n] = ([v.numpy() for v in replicas[0]], [[v.numpy() for v in r] for r in replicas], losses)
    one, many = trained[1], trained[args.devices]
    weight_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(one[0], many[0]))
    replica_diff = max(float(np.max(np.abs(a - b))) for r in many[1] for a, b in zip(many[1][0], r))
    loss_diff = max(abs(a - b) for a, b in zip(one[2], many[2]))
    rec.add(AGREEMENT, f"{args.devices} devices vs 1, after {len(batches)} steps", {
        "max_weight_diff": weight_diff, "max_loss_diff": loss_diff, "max_diff_between_replicas": replica_diff,
        "tolerance": TOLERANCE}, primary="max_weight_diff", lower_is_better=True)

    # Baseline (one device) and data parallel (all devices): time per epoch, test accuracy -----------
    steps_per_epoch = len(data.x_train) // args.batch_size
    steps_per_epoch = min(steps_per_epoch, args.max_steps) if args.max_steps else steps_per_epoch
    trainers = {}
    for n in sorted({1, args.devices}):
        replicas = replicate(initial, devices[:n])
        step = make_train_step(model, devices[:n], replicas, args.lr)
        it = iter(to_dataset(data.x_train, data.y_train, batch_size=args.batch_size, seed=args.seed,
                             repeat=True, drop_remainder=True))
        losses = []

        def epoch(step=step, it=it, losses=losses):
            for _ in range(steps_per_epoch):
                loss = step(*next(it))
            losses.append(float(loss))  # waits for the last step: the epoch's clock stops when the work is done

        trainers[n] = (Timer(epoch, name=f"{n} device{'s' * (n > 1)}", items_per_call=steps_per_epoch * args.batch_size),
                       replicas, losses)
    # An epoch of each in turn (the first, which traces, timed apart), so that drift falls on both alike.
    timed = interleave([t for t, _, _ in trainers.values()], rounds=max(1, args.epochs - 1),
                       samples=max(1, args.epochs - 1), warmup=0, seed=args.seed, profile_dir=args.profile,
                       profile_steps=1)
    found = dict(zip(trainers, timed))
    comparison = versus(found[1], found[args.devices]) if args.devices > 1 else None
    for n, m in found.items():
        _, replicas, losses = trainers[n]
        rec.add(SPEED, m.name, {
            "s_per_epoch": m.median_s, "first_epoch_s": m.first_call_s, "samples_per_s": m.items_per_s,
            "final_loss": losses[-1], "test_accuracy": accuracy(model, replicas[0], data.x_test, data.y_test)},
            primary="s_per_epoch", lower_is_better=True, measurement=m, comparison=comparison if n > 1 else None)
        print(f"{n} device(s): {args.epochs} epochs, loss {losses[-1]:.4f}", flush=True)
    return Found(devices, weight_diff, replica_diff, len(batches), comparison, plan.note)


def conclude(args, rec, found: Found) -> Conclusion:
    weight_diff, replica_diff, comparison = found.weight_diff, found.replica_diff, found.comparison
    speed = comparison.describe() if comparison else "the same as one device (one device asked for)"
    agrees = weight_diff <= TOLERANCE and replica_diff == 0.0
    line = (f"{args.devices} devices vs 1: {speed}; same training as one device: {agrees} "
            f"(max weight difference {weight_diff:.2g}, tolerance {TOLERANCE:g})")

    cpu_note = f"Here the devices are {found.device_note}. " if "logical GPUs" in found.device_note else ""
    if found.devices[0].startswith("/CPU"):
        cpu_note = (f"Here the {args.devices} devices are logical devices carved out of {usable_cores()} CPU cores: "
                    f"they share the same cores and memory, so splitting the batch adds copies and a reduction "
                    f"without adding compute")
        cpu_note += (": that it was faster anyway says one device's ops left cores idle at this batch size, which "
                     "replicas running side by side filled. "
                     if comparison is not None and comparison.verdict == FASTER else ". ")
    text = (
        f"Splitting each batch of {args.batch_size} over {args.devices} devices trained the same model as one "
        f"device: after {found.batches} steps the weights differ by at most {weight_diff:.2g} (float32 rounding "
        f"of a sum taken in a different order) and the replicas by {replica_diff:g}. Against one device, an "
        f"epoch on {args.devices} devices: {speed}. {cpu_note}Data parallelism pays when each device brings its own compute and "
        f"the per-device slice is large enough that the all-reduce (here through the first device, a "
        f"bottleneck that ring all-reduce removes) is small next to the step.")
    headline = Headline.compared(f"data parallelism from scratch, {args.devices} devices against 1, per epoch",
                                 comparison) if comparison else None
    return Conclusion(text, [line], "" if agrees else "data-parallel training diverged from one device", headline)


RECIPE = Recipe(name="multi_device_scratch", doc=__doc__, order=80, measure=measure, conclude=conclude,
                add_flags=add_flags, uses=("batch_size",), sizes={"epochs": (10, 7), "batch_size": (256, 256)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
