"""Data parallelism from scratch: split the minibatch over devices, all-reduce the gradients, update.

Every device holds a copy of the parameters and computes gradients on its slice of the minibatch;
the gradients are summed across devices and every copy takes the same step.

Run:   python recipes/multi_device_scratch.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21 and Keras 3. Uses the GPUs when there are enough (--devices), otherwise
       splits this CPU into logical devices; mnist-5k works offline (--dataset fashion_mnist downloads).

Introduction
------------
The seed's "multi-GPU training" section, written with today's TensorFlow: LeNet trained by SGD, where
the model is a Keras model called statelessly (`model.stateless_call(params, ...)`) so that each device
can run it on its own copy of the parameters. Four pieces do the work: copy the parameters to each
device, split the batch, all-reduce the gradients (sum on the first device, copy back, as the seed
does), and update every copy. With the same global batch, this must train exactly like one device:
the mean of the per-device gradients of equal slices is the gradient of the whole batch. The recipe
checks that, then times both.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.bench import profiled
from tfperf.data import DatasetUnavailable, load_arrays, to_dataset
from tfperf.devices import compute_devices, usable_cores
from tfperf.models import get_net
from tfperf.report import markdown_table, write_conclusion
from tfperf.results import Recorder

SPEED, AGREEMENT = "training by hand, same global batch", "agreement with one device"
AGREEMENT_STEPS, TOLERANCE = 10, 1e-4


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


def main(argv=None) -> int:
    # Setup: devices first, before any op fixes them -------------------------------------------
    p = flags.parser(__doc__)
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--devices", type=flags.positive_int, default=2, help="devices to split each batch over")
    p.add_argument("--epochs", type=flags.positive_int, help="passes over the training set")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    p.set_defaults(steps=0)  # --steps caps the steps per epoch (tests); 0 means a full pass
    args = flags.parse(p, argv, sizes={"epochs": (10, 3), "batch_size": (256, 256)})
    try:
        devices = compute_devices(args.devices)
        data = load_arrays(args.dataset, seed=args.seed)
    except (DatasetUnavailable, ValueError) as exc:
        sys.exit(f"multi_device_scratch: error: {exc}")
    if args.batch_size % args.devices:
        sys.exit(f"multi_device_scratch: error: --batch-size {args.batch_size} does not split evenly over "
                 f"{args.devices} devices: use a multiple of {args.devices}")
    keras.utils.set_random_seed(args.seed)
    model = get_net("lenet", input_shape=data.input_shape, num_classes=data.num_classes)
    initial = [v.numpy() for v in model.trainable_variables]
    rec = Recorder("multi_device_scratch", vars(args))
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
    steps_per_epoch = min(steps_per_epoch, args.steps) if args.steps else steps_per_epoch
    for n in sorted({1, args.devices}):
        replicas = replicate(initial, devices[:n])
        step = make_train_step(model, devices[:n], replicas, args.lr)
        ds = to_dataset(data.x_train, data.y_train, batch_size=args.batch_size, seed=args.seed, repeat=True,
                        drop_remainder=True)
        it, epoch_s, loss = iter(ds), [], float("nan")
        for epoch in range(args.epochs):
            with profiled(args.profile if epoch > 0 else None, f"{n}-devices-epoch{epoch}"):  # measured epochs
                t0 = time.perf_counter()
                for _ in range(steps_per_epoch):
                    loss = step(*next(it))
                loss = float(loss)  # waits for the last step: the epoch's clock stops when the work is done
                epoch_s.append(time.perf_counter() - t0)
        timed = epoch_s[1:] or epoch_s  # the first epoch includes tracing
        rec.add(SPEED, f"{n} device{'s' * (n > 1)}", {
            "s_per_epoch": float(np.median(timed)), "first_epoch_s": epoch_s[0],
            "samples_per_s": steps_per_epoch * args.batch_size / float(np.median(timed)),
            "final_loss": loss, "test_accuracy": accuracy(model, replicas[0], data.x_test, data.y_test)},
            primary="s_per_epoch", lower_is_better=True)
        print(f"{n} device(s): {args.epochs} epochs, loss {loss:.4f}", flush=True)

    # Results ----------------------------------------------------------------------------------
    rec.save(args.out)
    for table in (AGREEMENT, SPEED):
        print(f"\n## {table}\n\n{markdown_table(rec.table(table))}")
    speed = {r["row"]: r["metrics"] for r in rec.table(SPEED)}
    ratio = speed["1 device"]["s_per_epoch"] / speed[f"{args.devices} devices"]["s_per_epoch"]
    agrees = weight_diff <= TOLERANCE and replica_diff == 0.0
    print(f"\n{args.devices} devices vs 1: {ratio:.2f}x the speed; same training as one device: {agrees} "
          f"(max weight difference {weight_diff:.2g}, tolerance {TOLERANCE:g})")

    # Conclusion, from this run's numbers ------------------------------------------------------
    cpu_note = (f"Here the {args.devices} devices are logical devices carved out of {usable_cores()} CPU cores: "
                f"they share the same cores and memory, so splitting the batch adds copies and a reduction "
                f"without adding compute. " if devices[0].startswith("/CPU") else "")
    write_conclusion(args.out, "multi_device_scratch", (
        f"Splitting each batch of {args.batch_size} over {args.devices} devices trained the same model as one "
        f"device: after {len(batches)} steps the weights differ by at most {weight_diff:.2g} (float32 rounding "
        f"of a sum taken in a different order) and the replicas by {replica_diff:g}. It ran {ratio:.2f}x the "
        f"speed of one device. {cpu_note}Data parallelism pays when each device brings its own compute and "
        f"the per-device slice is large enough that the all-reduce (here through the first device, a "
        f"bottleneck that ring all-reduce removes) is small next to the step."))
    if not agrees:
        print("multi_device_scratch: error: data-parallel training diverged from one device", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
