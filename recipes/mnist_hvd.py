"""Horovod: data-parallel training of the MNIST CNN over several processes.

Each process (rank) trains the same model on its own shard of the data; Horovod averages the gradients
with an all-reduce after every step, so all ranks apply the same update and stay identical.

Run:   horovodrun -np 4 python recipes/mnist_hvd.py          (4 ranks on this host)
       python recipes/mnist_hvd.py --quick                  (one rank, no launcher needed)
Needs: Horovod 0.28.1 built with TensorFlow and Gloo (`make install` builds it); mnist-5k works offline,
       `--dataset mnist` downloads full MNIST once.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
from horovod.common.exceptions import HorovodInternalError
import keras
import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf import hvd as thvd
from tfperf.measure import Measurement, Timer, profiled
from tfperf.data import load_arrays, to_dataset
from tfperf.devices import usable_cores
from tfperf.models import get_net
from tfperf.recipe import Conclusion, Headline, Recipe, RecipeError
from tfperf.train import accuracy

# The technique: data parallelism in a handful of Horovod calls -----------------------------------------
# Horovod's recipe for data parallelism fits in a handful of lines, tagged `# Horovod:` below. Keras 3
# broke `horovod.tensorflow.keras` (horovod issue 4290), so this script uses `horovod.tensorflow` in a
# custom training loop; `tfperf.hvd` hands Horovod the `tf.Variable` under each Keras variable. The global
# batch is `size` times the per-rank batch, so the learning rate scales with `size`, after a warm-up. At
# the end every rank checks that it holds exactly rank 0's weights.


def input_batches(data, batch_size: int, seed: int, rank: int, size: int):
    """This rank's endless stream of batches."""
    # Horovod: each rank reads its own shard (dataset.shard(size, rank)), so an epoch is split across ranks
    return iter(to_dataset(data.x_train, data.y_train, batch_size=batch_size, seed=seed + rank,
                           repeat=True, drop_remainder=True, shard=(size, rank)))


def make_optimizer(lr: float, size: int, warmup_steps: int):
    """Adam whose learning rate ramps up to lr x size."""
    # Horovod: the global batch is size x larger, so the rate is scaled by size after a linear warm-up
    schedule = thvd.WarmupScaledLearningRate(lr, size, warmup_steps)
    return keras.optimizers.Adam(schedule)


def make_train_step(model, optimizer, loss_fn):
    """One training step, its gradients averaged over the ranks."""

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        # Horovod: gradient() returns the average over ranks
        tape = hvd.DistributedGradientTape(tape)
        grads = thvd.gradients(tape, loss, model.trainable_variables)  # Keras 3: via the tf.Variables
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


# Measuring -------------------------------------------------------------------------------------------

TARGET_ACCURACY = {"mnist-5k": 0.95, "mnist": 0.98}  # after a full-size run (10 epochs)
THROUGHPUT, RESULT = "throughput per rank and in total", "training result"


@dataclasses.dataclass(frozen=True)
class Found:
    size: int  # ranks
    per_rank: list[float]  # samples/s of each rank
    test_accuracy: float
    seen: int  # test images scored, over all ranks
    checkpoint: str | None
    drift: float  # the largest weight difference from rank 0 after training (must be 0)
    epochs: int


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--epochs", type=flags.positive_int, help="passes over the training set")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate for one rank")
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="epochs to ramp the rate up to lr x size")
    p.add_argument("--checkpoint-dir", default="checkpoints/mnist_hvd", help="each run writes a new folder here")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue from the latest checkpoint in a run folder")
    p.add_argument("--max-steps", type=flags.positive_int, help="at most this many steps per epoch (tests)")


def measure(args, rec) -> Found:
    hvd.init()  # Horovod: start the ranks' communication; rank and size come from horovodrun
    devices = thvd.pin_to_local_gpu()  # Horovod: one GPU per rank, or a share of the CPU cores
    rank, size = hvd.rank(), hvd.size()
    chief = rank == 0  # Horovod: rank 0 alone prints, writes records and checkpoints
    peers = thvd.peer_processes()  # Horovod: who runs where, so that a rank that dies can be named

    # Setup ------------------------------------------------------------------------------------
    rec.args["np"] = size
    data = load_arrays(args.dataset, seed=args.seed)
    model = get_net(args.model, input_shape=data.input_shape, num_classes=data.num_classes)
    # Horovod: every rank sees the same number of steps, or the last all-reduce would wait forever
    steps_per_epoch = len(data.x_train) // (args.batch_size * size)
    if args.max_steps:
        steps_per_epoch = min(steps_per_epoch, args.max_steps)
    if steps_per_epoch < 1:
        raise RecipeError(f"{len(data.x_train)} training examples cannot fill one batch of "
                          f"{args.batch_size} on each of {size} ranks: use a smaller --batch-size")
    batches = input_batches(data, args.batch_size, args.seed, rank, size)
    warmup_steps = round(args.warmup_epochs * steps_per_epoch)
    optimizer = make_optimizer(args.lr, size, warmup_steps)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    run_dir = Path(args.checkpoint_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    if args.resume and chief:  # Horovod: rank 0 restores; the broadcast below hands its state to the others
        latest = tf.train.latest_checkpoint(args.resume)
        if latest is None:
            raise RecipeError(f"no checkpoint in {args.resume}: pass a run folder under "
                              f"{args.checkpoint_dir} that holds ckpt-* files")
        ckpt.restore(latest).assert_existing_objects_matched()
        run_dir = Path(args.resume)
    # Horovod: start every rank from rank 0's weights and optimizer state (random init differs per rank)
    thvd.broadcast(model.variables + optimizer.variables + [epoch], root_rank=0)
    manager = tf.train.CheckpointManager(ckpt, str(run_dir), max_to_keep=1) if chief else None
    if chief:
        print(f"{size} rank(s), {devices} each; {steps_per_epoch} steps/epoch of {args.batch_size} per rank "
              f"(global batch {args.batch_size * size}); lr {args.lr} -> {args.lr * size} over "
              f"{warmup_steps} steps", flush=True)
    train_step = make_train_step(model, optimizer, loss_fn)

    # Training ---------------------------------------------------------------------------------
    losses = []

    def step():
        losses.append(train_step(*next(batches)))
        return losses[-1]

    # Each step is a sample; the very first (it traces) is timed apart, as one of the first epoch's steps.
    clock = Timer(step, name=f"rank {rank} steps, np={size}", items_per_call=args.batch_size)
    step_times, started, traced, finished = [], time.perf_counter(), 0, 0
    try:
        while int(epoch.numpy()) < args.epochs:
            finished += len(losses)
            losses.clear()
            todo = steps_per_epoch
            if clock.first_call_s is None:
                clock.start(warmup=0)
                todo -= 1
            # --profile traces rank 0's last epoch, whose steps are then left out of the samples.
            trace = bool(args.profile) and chief and int(epoch.numpy()) == args.epochs - 1 and args.epochs > 1
            traced = todo if trace else traced
            with profiled(args.profile if trace else None, f"rank0-np{size}"):
                step_times.extend(clock.take(todo))
            # Horovod: metrics over all ranks
            mean_loss = thvd.average({"loss": float(np.mean([float(loss) for loss in losses]))})["loss"]
            epoch.assign_add(1)
            if chief:
                manager.save(checkpoint_number=int(epoch.numpy()))  # Horovod: one writer, no clobbering
                print(f"epoch {int(epoch.numpy())}/{args.epochs}: loss {mean_loss:.4f} "
                      f"({time.perf_counter() - started:.1f} s)", flush=True)
    except (tf.errors.OpError, HorovodInternalError) as exc:
        # Gloo ends a collective with an error when a peer goes away; say so instead of a bare traceback.
        time.sleep(0.5)  # let the departed process finish exiting, so that its status can be read
        print(f"mnist_hvd: error: rank {rank} of {size} lost its peers at epoch {int(epoch.numpy()) + 1}, step "
              f"{finished + len(losses) + 1}: {thvd.describe_failure(peers)} ({type(exc).__name__})",
              file=sys.stderr, flush=True)
        raise SystemExit(1)

    # Results: every rank measures itself, rank 0 prints all -----------------------------------
    recorded = step_times[:len(step_times) - traced]
    timed = np.array(recorded[args.warmup:] or recorded)  # the first steps still settle (allocations, caches)
    mine = args.batch_size / float(np.median(timed))
    per_rank = hvd.allgather(tf.constant([mine], tf.float64)).numpy()  # Horovod: collect every rank's rate
    # Horovod: test accuracy over the whole test set, each rank scoring its own shard
    test_x, test_y = data.x_test[rank::size], data.y_test[rank::size]
    correct = round(accuracy(model, test_x, test_y) * len(test_y))
    counts = thvd.total({"correct": correct, "seen": len(test_y)})
    test_accuracy = counts["correct"] / counts["seen"]
    drift = thvd.max_weight_difference(model.variables)  # Horovod: must be exactly 0 on every rank
    if not chief:
        raise SystemExit(0 if drift == 0.0 else 1)  # Horovod: the other ranks neither record nor print
    for r, rate in enumerate(per_rank):
        rec.add(THROUGHPUT, f"rank {r}", {"samples_per_s": rate, "ms_per_step": args.batch_size / rate * 1e3},
                primary="samples_per_s", lower_is_better=False)
    # Rank 0's steps stand for the spread of all: the total's interval is theirs, scaled.
    steps = Measurement(clock.name, tuple(float(t) for t in timed), items_per_call=args.batch_size,
                        first_call_s=clock.first_call_s)
    rec.add(THROUGHPUT, f"total, np={size}", {"samples_per_s": float(per_rank.sum()),
                                               "ms_per_step": float(np.median(timed)) * 1e3},
            primary="samples_per_s", lower_is_better=False, measurement=steps)
    rec.add(RESULT, f"np={size}", {
        "test_accuracy": test_accuracy, "final_loss": mean_loss, "weight_drift": drift, "epochs": int(epoch.numpy()),
        "global_batch": args.batch_size * size, "updates": finished + len(losses), "wall_s": time.perf_counter() - started},
        primary="test_accuracy", lower_is_better=False)
    return Found(size, per_rank.tolist(), test_accuracy, int(counts["seen"]), manager.latest_checkpoint, drift,
                 int(epoch.numpy()))


def conclude(args, rec, found: Found) -> Conclusion:
    size, test_accuracy, drift = found.size, found.test_accuracy, found.drift
    per_rank = np.asarray(found.per_rank)
    lines = [f"samples/s per rank: {per_rank.mean():.0f} (median step), total on {size} rank(s): {per_rank.sum():.0f}",
             f"test accuracy {test_accuracy:.4f} on {found.seen:.0f} images; checkpoint {found.checkpoint}",
             f"weights identical on all ranks: {drift == 0.0} (largest difference from rank 0: {drift:g})"]

    target = TARGET_ACCURACY.get(args.dataset)
    full_run = args.epochs >= 10 and not args.max_steps
    reached = ("no target is stated for this data set" if target is None else
               f"the full-size target is {target:.2f}: {'reached' if test_accuracy >= target else 'NOT reached'}"
               if full_run else f"a short run; the target of {target:.2f} applies to 10 full epochs")
    cores = usable_cores()
    return Conclusion((
        f"{size} rank(s) trained {args.model} on {args.dataset} for {found.epochs} epoch(s) to test "
        f"accuracy {test_accuracy:.3f} ({reached}). Each rank ran {per_rank.mean():.0f} samples/s, "
        f"{per_rank.sum():.0f} in total. On this host's {cores} CPU core(s) the ranks split the same cores, "
        f"so the total cannot grow past one process using all of them; Horovod's gain is on machines with a "
        f"GPU (or a whole host) per rank, where each rank adds its own compute and only the all-reduce is "
        f"shared (see scaling_model). The weights were identical on all ranks after training "
        f"(largest difference {drift:g})."), lines, "" if drift == 0.0 else "ranks ended with different weights",
        Headline(f"Horovod data parallelism on {size} rank(s) of this host",
                 f"{per_rank.sum():.0f} samples/s in total, test accuracy {test_accuracy:.3f}",
                 "weights identical on all ranks" if drift == 0.0 else "ranks DIFFER"))


# Horovod's ranks are separate processes that its launcher starts. The main job runs two: enough for a real
# all-reduce, and no more than the 2 cores CI has (scaling_model runs 1, 2 and 4).
RECIPE = Recipe(name="mnist_hvd", doc=__doc__, order=120, measure=measure, conclude=conclude, add_flags=add_flags,
                launcher=("horovodrun", "-np", "2"), uses=("warmup", "batch_size"),
                sizes={"epochs": (10, 2), "warmup": (5, 5), "batch_size": (64, 64)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
