"""MirroredStrategy: the same ResNet-18 training on one device and on several, with two lines changed.

`tf.distribute.MirroredStrategy` does what multi_device_scratch.py does by hand: a copy of the model
per device, the global batch split between them, gradients all-reduced before every update.

Run:   python recipes/mirrored_resnet.py --quick        (about two minutes on 2 CPU cores)
Needs: TensorFlow 2.21 and Keras 3. Uses the GPUs when there are enough (--devices), otherwise splits
       this CPU into logical devices. mnist-5k (Fashion-MNIST's shape) works offline;
       `--dataset fashion_mnist` downloads the real thing once.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import sys

import keras
import tensorflow as tf

from tfperf import flags
from tfperf.measure import Timer, interleave, peak_matmul_flops_per_s, versus
from tfperf.data import load_arrays, to_dataset
from tfperf.devices import device_plan, usable_cores
from tfperf.models import flops, get_net
from tfperf.recipe import Conclusion, Headline, Recipe, RecipeError
from tfperf.measure.stats import FASTER, SLOWER, Comparison
from tfperf.train import fit_epochs

# The technique: build and compile inside strategy.scope(); fit does the rest ------------------------


def mirrored(devices: list[str], model_name: str, data, per_device_batch: int, lr: float):
    """The model compiled for MirroredStrategy over `devices`, with its global batch and learning rate."""
    # MirroredStrategy: a copy of the model per device, gradients all-reduced before every update.
    strategy = tf.distribute.MirroredStrategy(devices)
    # Each device keeps its batch, so the global batch grows with the devices, and the learning rate with it.
    global_batch = per_device_batch * strategy.num_replicas_in_sync
    lr = lr * strategy.num_replicas_in_sync
    # Variables created inside the scope are mirrored on every device.
    with strategy.scope():
        model = get_net(model_name, input_shape=data.input_shape, num_classes=data.num_classes)
        model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model, global_batch, lr


# Measuring --------------------------------------------------------------------------------------------
# The seed's concise multi-GPU section trains d2l's ResNet-18 on Fashion-MNIST on 1 and 2 GPUs and
# reports time per epoch and test accuracy. Two things change with the device count: the global batch
# (each device keeps its per-device batch, so the global batch grows with the devices) and therefore
# the learning rate, which scales with the global batch (the linear scaling rule). Building the model
# and optimizer inside `strategy.scope()` is the only other change: `fit` does the rest.

TABLE = "ResNet-18, MirroredStrategy by device count"
# Mirroring counts as faster or slower only when its speedup's 95% CI clears 10% either way: two runs of the
# same code on this 2-core machine gave 1.05x and 1.12x slower, "no difference" then "slower" with no bar.
MIN_DIFFERENCE = 0.10


@dataclasses.dataclass(frozen=True)
class Found:
    devices: list[str]
    n_train: int
    model_gflop: float  # training GFLOP per example
    peak: float  # matmul GFLOP/s on the first device
    speed: Comparison | None  # all devices against one
    device_note: str  # what the devices are (gpus.DevicePlan.note)
    logical_gpus: bool  # GPUs split into logical ones: they share one GPU's compute


def add_flags(p) -> None:
    flags.add_model_flag(p, "resnet18")
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--devices", type=flags.positive_int, default=2, help="the most devices to mirror over")
    p.add_argument("--epochs", type=flags.positive_int,
                   help="passes over the training examples, at least 2: the first (compiling) is timed apart")
    p.add_argument("--train-size", type=flags.positive_int, help="training examples used (default: all)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate for one device's batch")
    p.add_argument("--max-steps", type=flags.positive_int, help="at most this many steps per epoch (tests)")


def measure(args, rec) -> Found:
    # Devices first, before any op fixes them.
    if args.epochs < 2:
        raise RecipeError(f"--epochs {args.epochs}: at least 2 are needed, the first compiles and is timed apart")
    try:
        plan = device_plan(args.devices)
    except ValueError as exc:
        raise RecipeError(exc) from None
    devices = list(plan.names)
    print(f"devices: {plan.note}", flush=True)
    data = load_arrays(args.dataset, seed=args.seed)
    n_train = min(args.train_size, len(data.x_train))
    n_test = min(len(data.x_test), max(n_train // 4, 256))
    print(f"{n_train} training and {n_test} test examples of {args.dataset}; devices {', '.join(devices)}")

    # Baseline: one device; then all of them. The same code, the strategy is the only difference ---
    runs = {}
    for n in sorted({1, args.devices}):
        keras.utils.set_random_seed(args.seed)
        model, global_batch, lr = mirrored(devices[:n], args.model, data, args.batch_size, args.lr)
        train = to_dataset(data.x_train[:n_train], data.y_train[:n_train], batch_size=global_batch, seed=args.seed)
        train = train.take(args.max_steps) if args.max_steps else train
        epoch, losses = fit_epochs(model, train, shuffle=False)
        examples = min(n_train, (args.max_steps or n_train) * global_batch)
        row = f"{n} device{'s' * (n > 1)}"
        runs[row] = (Timer(epoch, name=row, items_per_call=examples), model, losses, global_batch, lr)

    # Epochs of the two in turn, so that a slow phase of the machine falls on both; the first epoch of
    # each (tracing, compiling) is timed apart; --profile traces one more epoch of each.
    timed = interleave([t for t, *_ in runs.values()], rounds=args.epochs - 1, samples=args.epochs - 1, warmup=0,
                       seed=args.seed, profile_dir=args.profile, profile_steps=1)
    baseline = timed[0]
    for m, (timer, model, losses, global_batch, lr) in zip(timed, runs.values()):
        test = to_dataset(data.x_test[:n_test], data.y_test[:n_test], batch_size=global_batch, shuffle=False)
        _, test_accuracy = model.evaluate(test, verbose=0)
        rec.add(TABLE, m.name, {
            "s_per_epoch": m.median_s, "first_epoch_s": m.first_call_s, "samples_per_s": m.items_per_s,
            "global_batch": global_batch, "lr": lr, "final_loss": losses[-1], "test_accuracy": test_accuracy},
            primary="s_per_epoch", lower_is_better=True, measurement=m,
            comparison=versus(baseline, m, threshold=MIN_DIFFERENCE) if m is not baseline else None)

    model_gflop = 3 * flops(model) / 1e9  # forward + backward is about 3x the forward pass
    with tf.device(devices[0]):
        peak = peak_matmul_flops_per_s() / 1e9
    speed = versus(timed[0], timed[-1], threshold=MIN_DIFFERENCE) if len(timed) > 1 else None
    return Found(devices, n_train, model_gflop, peak, speed, plan.note, plan.kind == "logical-gpu")


def conclude(args, rec, found: Found) -> Conclusion:
    devices, n_train, model_gflop, peak = found.devices, found.n_train, found.model_gflop, found.peak
    rows = {r["row"]: r["metrics"] for r in rec.table(TABLE)}
    one, many = rows["1 device"], rows[f"{args.devices} devices"] if args.devices > 1 else rows["1 device"]
    speed = found.speed
    verdict = speed.describe() if speed else "one device only"
    used = model_gflop * one["samples_per_s"]
    line = (f"{args.devices} devices vs 1, per example: {verdict}; training costs about {model_gflop:.1f} GFLOP per "
          f"example: one device ran {used:.0f} GFLOP/s, {used / peak:.0%} of the {peak:.0f} GFLOP/s matmul peak "
          f"measured now")

    on_cpu = devices[0].startswith("/CPU")
    if found.logical_gpus:
        why = f"The devices here are {found.device_note}."
    elif not on_cpu:
        why = "Each device is a GPU with its own compute: the speedup is what is left after the all-reduce."
    elif speed is None:
        why = "With one device there is nothing to compare: pass --devices 2 or more."
    elif speed.verdict == FASTER:
        why = (f"The {args.devices} devices here are logical devices on the same {usable_cores()} CPU cores, so "
               f"the gain is not new compute: one replica at a batch of {args.batch_size} used {used / peak:.0%} of "
               f"the matmul peak measured in this run, and a second replica's ops run in the idle time. A "
               f"larger per-device batch closes that gap.")
    elif speed.verdict == SLOWER:
        why = (f"The {args.devices} devices here are logical devices on the same {usable_cores()} CPU cores: one "
               f"device already keeps them busy with ResNet-18's convolutions ({used / peak:.0%} of the matmul "
               f"peak), so mirroring adds the all-reduce and the batch split without adding compute.")
    else:
        why = (f"The {args.devices} devices here are logical devices on the same {usable_cores()} CPU cores: what "
               f"a second replica overlapped, the all-reduce and the batch split took back.")
    short = (" Accuracy after so few examples says little: run without --quick for the seed's comparison."
             if n_train < 2048 else "")
    return Conclusion((
        f"Mirroring ResNet-18 over {args.devices} devices against one device, per example: {verdict} "
        f"({many['s_per_epoch']:.2f} s against {one['s_per_epoch']:.2f} s per epoch of {n_train} examples), with the "
        f"global batch {many['global_batch']} and the rate scaled to {many['lr']:g}. {why} Test accuracy "
        f"{one['test_accuracy']:.3f} on one device and {many['test_accuracy']:.3f} on {args.devices}.{short}"), [line],
        headline=(Headline.compared(f"MirroredStrategy, ResNet-18 on {args.devices} devices against 1, per example",
                                    speed) if speed else None))


RECIPE = Recipe(name="mirrored_resnet", doc=__doc__, order=90, measure=measure, conclude=conclude,
                add_flags=add_flags, uses=("batch_size",),
                sizes={"epochs": (7, 7), "batch_size": (128, 32), "train_size": (10**9, 64)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
