"""Horovod: data-parallel training of the MNIST CNN over several processes.

Each process (rank) trains the same model on its own shard of the data; Horovod averages the gradients
with an all-reduce after every step, so all ranks apply the same update and stay identical.

Run:   horovodrun -np 4 python recipes/mnist_hvd.py          (4 ranks on this host)
       python recipes/mnist_hvd.py --quick                  (one rank, no launcher needed)
       horovodrun -np 2 --timeline-filename t.json python recipes/mnist_hvd.py --quick   (and where the
       collectives' time went: negotiation, all-reduce, waits, read from Horovod's timeline)
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
from tfperf.measure.horovod_timeline import TimelineError, TimelineSplit, read_split
from tfperf.data import load_arrays, to_dataset
from tfperf.devices import usable_cores
from tfperf.models import get_net
from tfperf.recipe import Conclusion, Headline, Recipe, RecipeError
from tfperf.train import accuracy

# Keras 3 broke `horovod.tensorflow.keras` (horovod issue 4290), so this script uses `horovod.tensorflow` in
# a custom training loop; `tfperf.hvd` hands Horovod the `tf.Variable` under each Keras variable. Each line
# of Horovod's recipe is tagged `# Horovod:`.


def train(args, stopwatch) -> "Trained":
    """Train on this rank's shard of the data. horovodrun starts one process per rank; each runs this.
    `stopwatch(step, steps, epoch, epochs)` runs an epoch's steps and returns their times (the measuring)."""
    # Horovod: initialize Horovod (rank and size come from horovodrun).
    hvd.init()
    # Horovod: pin one GPU to each process; on a CPU host each gets its share of the cores.
    devices = thvd.pin_to_local_gpu()
    rank, size = hvd.rank(), hvd.size()

    data = load_arrays(args.dataset, seed=args.seed)
    model = get_net(args.model, input_shape=data.input_shape, num_classes=data.num_classes)
    # Horovod: each rank reads its own shard, and all ranks take the same number of steps (a rank that
    # finished early would leave the others waiting in their next all-reduce forever).
    batches = input_batches(data, args.batch_size, args.seed, rank, size)
    steps_per_epoch = steps_every_rank_takes(len(data.x_train), args.batch_size, size, args.max_steps)
    # Horovod: scale the learning rate by the number of ranks (the global batch is size times larger).
    optimizer = make_optimizer(args.lr, size, warmup_steps=round(args.warmup_epochs * steps_per_epoch))
    optimizer.build(model.trainable_variables)
    # Horovod: wrap the gradient tape, so that each step applies the gradients averaged over all ranks.
    train_step = make_train_step(model, optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    run_dir = resume(checkpoint, args) if rank == 0 else None  # with --resume, rank 0 restores
    # Horovod: broadcast rank 0's weights and optimizer state (and what it restored), so that all ranks
    # start alike.
    thvd.broadcast(model.variables + optimizer.variables + [epoch], root_rank=0)
    manager = tf.train.CheckpointManager(checkpoint, str(run_dir), max_to_keep=1) if rank == 0 else None
    if rank == 0:
        print(f"{size} rank(s), {devices} each; {steps_per_epoch} steps/epoch of {args.batch_size} per rank "
              f"(global batch {args.batch_size * size}); lr {args.lr} -> {args.lr * size}", flush=True)

    losses, step_times, mean_loss = [], [], float("nan")
    first, started = int(epoch.numpy()), time.perf_counter()
    step = lambda: losses.append(train_step(*next(batches)))  # noqa: E731
    while int(epoch.numpy()) < args.epochs:
        losses.clear()
        # An epoch: the stopwatch takes `step` steps_per_epoch times, timing each one.
        step_times += stopwatch(step, steps_per_epoch, int(epoch.numpy()) + 1, args.epochs)
        # Horovod: average the metrics over all ranks.
        mean_loss = thvd.average({"loss": float(np.mean([float(loss) for loss in losses]))})["loss"]
        epoch.assign_add(1)
        if rank == 0:
            # Horovod: rank 0 alone writes checkpoints, so that ranks do not overwrite each other's.
            manager.save(checkpoint_number=int(epoch.numpy()))
            print(f"epoch {int(epoch.numpy())}/{args.epochs}: loss {mean_loss:.4f} "
                  f"({time.perf_counter() - started:.1f} s)", flush=True)
    epochs = int(epoch.numpy())
    return Trained(model, data, step_times, mean_loss, epochs, steps_per_epoch * (epochs - first),
                   time.perf_counter() - started, manager.latest_checkpoint if manager else None)


def input_batches(data, batch_size: int, seed: int, rank: int, size: int):
    """This rank's endless stream of batches: its shard of the training set (dataset.shard(size, rank))."""
    return iter(to_dataset(data.x_train, data.y_train, batch_size=batch_size, seed=seed + rank,
                           repeat=True, drop_remainder=True, shard=(size, rank)))


def make_optimizer(lr: float, size: int, warmup_steps: int):
    """Adam whose learning rate ramps up linearly to lr x size over warmup_steps (Goyal et al. 2017)."""
    return keras.optimizers.Adam(thvd.WarmupScaledLearningRate(lr, size, warmup_steps))


def make_train_step(model, optimizer, loss_fn):
    """One training step, its gradients averaged over the ranks."""

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)  # gradient() now returns the average over ranks
        grads = thvd.gradients(tape, loss, model.trainable_variables)  # Keras 3: via the tf.Variables
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def steps_every_rank_takes(examples: int, batch_size: int, size: int, max_steps: int | None) -> int:
    """Steps per epoch, the same on every rank: full batches of the rank's shard (at most max_steps)."""
    steps = examples // (batch_size * size)
    if steps < 1:
        raise RecipeError(f"{examples} training examples cannot fill one batch of {batch_size} on each of "
                          f"{size} ranks: use a smaller --batch-size")
    return min(steps, max_steps) if max_steps else steps


def resume(checkpoint: tf.train.Checkpoint, args) -> Path:
    """The run folder checkpoints go to: --resume's, after restoring its latest, or a new one."""
    if not args.resume:
        return Path(args.checkpoint_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    latest = tf.train.latest_checkpoint(args.resume)
    if latest is None:
        raise RecipeError(f"no checkpoint in {args.resume}: pass a run folder under {args.checkpoint_dir} "
                          f"that holds ckpt-* files")
    checkpoint.restore(latest).assert_existing_objects_matched()
    return Path(args.resume)


# Measuring -------------------------------------------------------------------------------------------

TARGET_ACCURACY = {"mnist-5k": 0.95, "mnist": 0.98}  # after a full-size run (10 epochs)
THROUGHPUT, RESULT = "throughput per rank and in total", "training result"
TIMELINE = "Horovod's timeline: where the collectives' time went"


@dataclasses.dataclass(frozen=True)
class Trained:
    """What a rank's training left: the model, its data, each step's time, and the run's figures."""

    model: keras.Model
    data: object
    step_times: list[float]
    final_loss: float
    epochs: int
    updates: int
    wall_s: float
    checkpoint: str | None


@dataclasses.dataclass(frozen=True)
class Found:
    size: int  # ranks
    per_rank: list[float]  # samples/s of each rank
    test_accuracy: float
    seen: int  # test images scored, over all ranks
    checkpoint: str | None
    drift: float  # the largest weight difference from rank 0 after training (must be 0)
    epochs: int
    timeline: TimelineSplit | None = None  # read from Horovod's timeline, when the launcher wrote one


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--epochs", type=flags.positive_int, help="passes over the training set")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate for one rank")
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="epochs to ramp the rate up to lr x size")
    p.add_argument("--checkpoint-dir", default="checkpoints/mnist_hvd", help="each run writes a new folder here")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue from the latest checkpoint in a run folder")
    p.add_argument("--max-steps", type=flags.positive_int, help="at most this many steps per epoch (tests)")


class Stopwatch:
    """Times each training step as a sample (the first, which traces, apart); --profile traces rank 0's last
    epoch, whose steps are then left out of the samples. Counts steps and learns who runs where, to say
    where a failure struck and which rank left."""

    def __init__(self, args):
        self.args, self.rank, self.size, self.peers = args, hvd.rank(), hvd.size(), None
        self.clock, self.traced, self.epoch, self.steps = None, 0, 1, 0

    def __call__(self, step, steps: int, epoch: int, epochs: int) -> list[float]:
        self.epoch = epoch
        if self.clock is None:
            self.peers = thvd.peer_processes()  # now that train() pinned the devices: this starts TensorFlow
            self.clock = Timer(self._counted(step), name=f"rank {self.rank} steps, np={self.size}",
                               items_per_call=self.args.batch_size)
            self.clock.start(warmup=0)  # the first step: one of this epoch's, timed apart
            steps -= 1
        trace = bool(self.args.profile) and self.rank == 0 and epoch == epochs > 1
        self.traced = steps if trace else self.traced
        with profiled(self.args.profile if trace else None, f"rank0-np{self.size}"):
            return self.clock.take(steps)

    def _counted(self, step):
        def counted():
            self.steps += 1
            return step()
        return counted


def timeline_path() -> str | None:
    """Where horovodrun's --timeline-filename (HOROVOD_TIMELINE) has rank 0 write Horovod's timeline, checked
    before training: Horovod writes nothing, and says nothing, where the folder does not exist."""
    path = os.environ.get("HOROVOD_TIMELINE")
    if not path or path == "DYNAMIC":
        return None
    if not Path(path).parent.is_dir():
        raise RecipeError(f"--timeline-filename {path}: its folder does not exist, so Horovod would write no "
                          f"timeline: create the folder first")
    return path


def timeline_split(path: str | None, steps: int) -> TimelineSplit | None:
    """This run's Horovod timeline read into negotiation, all-reduce and waits; None without one."""
    if path is None:
        return None
    # Horovod: stop the timeline, which writes out its queued events and closes the file.
    hvd.stop_timeline()
    try:
        return read_split(path, steps)
    except TimelineError as exc:
        raise RecipeError(str(exc)) from None


def record_timeline(rec, found: TimelineSplit) -> None:
    """The split as rows: seconds over the run, milliseconds a step and the share of the run."""
    rows = {"collectives under way": found.collectives_s, "negotiation": found.negotiation_s,
            "negotiation: waiting for the last rank": found.waiting_for_last_rank_s, "operations": found.operation_s,
            **{f"operations: {name}": s for name, s in found.activities.items()},
            "waiting for the framework's data": found.waits_s}
    for row, seconds in rows.items():
        rec.add(TIMELINE, row, {"ms_per_step": found.per_step_ms(seconds), "s": seconds,
                                "share_of_run": seconds / found.span_s if found.span_s else None},
                primary="ms_per_step", lower_is_better=True, versus_first=False)


def measure(args, rec) -> Found:
    hvd.init()  # train() starts Horovod too (a second call does nothing): here for rank and size
    rank, size = hvd.rank(), hvd.size()
    stopwatch = Stopwatch(args)
    rec.args["np"] = size
    timeline = timeline_path()
    try:
        run = train(args, stopwatch)
    except (tf.errors.OpError, HorovodInternalError) as exc:
        # Gloo ends a collective with an error when a peer goes away; say so instead of a bare traceback.
        time.sleep(0.5)  # let the departed process finish exiting, so that its status can be read
        print(f"mnist_hvd: error: rank {rank} of {size} lost its peers at epoch {stopwatch.epoch}, step "
              f"{stopwatch.steps}: {thvd.describe_failure(stopwatch.peers or [])} ({type(exc).__name__})",
              file=sys.stderr, flush=True)
        raise SystemExit(1)

    # Results: every rank measures itself, rank 0 records all -----------------------------------
    recorded = run.step_times[:len(run.step_times) - stopwatch.traced]
    timed = np.array(recorded[args.warmup:] or recorded)  # the first steps still settle (allocations, caches)
    mine = args.batch_size / float(np.median(timed))
    per_rank = hvd.allgather(tf.constant([mine], tf.float64)).numpy()  # every rank's rate
    # Test accuracy over the whole test set, each rank scoring its own shard.
    test_x, test_y = run.data.x_test[rank::size], run.data.y_test[rank::size]
    correct = round(accuracy(run.model, test_x, test_y) * len(test_y))
    counts = thvd.total({"correct": correct, "seen": len(test_y)})
    test_accuracy = counts["correct"] / counts["seen"]
    drift = thvd.max_weight_difference(run.model.variables)  # must be exactly 0 on every rank
    timeline = timeline_split(timeline, stopwatch.steps) if rank == 0 else None  # after the last collective
    if rank != 0:
        raise SystemExit(0 if drift == 0.0 else 1)  # the other ranks neither record nor print
    for r, rate in enumerate(per_rank):
        rec.add(THROUGHPUT, f"rank {r}", {"samples_per_s": rate, "ms_per_step": args.batch_size / rate * 1e3},
                primary="samples_per_s", lower_is_better=False)
    # Rank 0's steps stand for the spread of all: the total's interval is theirs, scaled.
    steps = Measurement(stopwatch.clock.name, tuple(float(t) for t in timed), items_per_call=args.batch_size,
                        first_call_s=stopwatch.clock.first_call_s)
    rec.add(THROUGHPUT, f"total, np={size}", {"samples_per_s": float(per_rank.sum()),
                                               "ms_per_step": float(np.median(timed)) * 1e3},
            primary="samples_per_s", lower_is_better=False, measurement=steps)
    rec.add(RESULT, f"np={size}", {
        "test_accuracy": test_accuracy, "final_loss": run.final_loss, "weight_drift": drift, "epochs": run.epochs,
        "global_batch": args.batch_size * size, "updates": run.updates, "wall_s": run.wall_s},
        primary="test_accuracy", lower_is_better=False)
    if timeline:
        record_timeline(rec, timeline)
    return Found(size, per_rank.tolist(), test_accuracy, int(counts["seen"]), run.checkpoint, drift, run.epochs,
                 timeline)


def conclude(args, rec, found: Found) -> Conclusion:
    size, test_accuracy, drift = found.size, found.test_accuracy, found.drift
    per_rank = np.asarray(found.per_rank)
    lines = [f"samples/s per rank: {per_rank.mean():.0f} (median step), total on {size} rank(s): {per_rank.sum():.0f}",
             f"test accuracy {test_accuracy:.4f} on {found.seen:.0f} images; checkpoint {found.checkpoint}",
             f"weights identical on all ranks: {drift == 0.0} (largest difference from rank 0: {drift:g})"]
    timeline = found.timeline.describe() if found.timeline else []
    lines += [f"Horovod's timeline: {line}" for line in timeline]

    target = TARGET_ACCURACY.get(args.dataset)
    full_run = args.epochs >= 10 and not args.max_steps
    reached = ("no target is stated for this data set" if target is None else
               f"the full-size target is {target:.2f}: {'reached' if test_accuracy >= target else 'NOT reached'}"
               if full_run else f"a short run; the target of {target:.2f} applies to 10 full epochs")
    cores = usable_cores()
    told = f" Horovod's timeline of the run: {timeline[0]}. {timeline[-1]}" if timeline else ""
    return Conclusion((
        f"{size} rank(s) trained {args.model} on {args.dataset} for {found.epochs} epoch(s) to test "
        f"accuracy {test_accuracy:.3f} ({reached}). Each rank ran {per_rank.mean():.0f} samples/s, "
        f"{per_rank.sum():.0f} in total. On this host's {cores} CPU core(s) the ranks split the same cores, "
        f"so the total cannot grow past one process using all of them; Horovod's gain is on machines with a "
        f"GPU (or a whole host) per rank, where each rank adds its own compute and only the all-reduce is "
        f"shared (see scaling_model). The weights were identical on all ranks after training "
        f"(largest difference {drift:g}).{told}"), lines,
        "" if drift == 0.0 else "ranks ended with different weights",
        Headline(f"Horovod data parallelism on {size} rank(s) of this host",
                 f"{per_rank.sum():.0f} samples/s in total, test accuracy {test_accuracy:.3f}",
                 "weights identical on all ranks" if drift == 0.0 else "ranks DIFFER",
                 value=float(per_rank.sum()), unit="samples/s"))


# Horovod's ranks are separate processes that its launcher starts. The main job runs two: enough for a real
# all-reduce, and no more than the 2 cores CI has (scaling_model runs 1, 2 and 4).
RECIPE = Recipe(name="mnist_hvd", doc=__doc__, order=120, measure=measure, conclude=conclude, add_flags=add_flags,
                launcher=("horovodrun", "-np", "2"), uses=("warmup", "batch_size"),
                sizes={"epochs": (10, 2), "warmup": (5, 5), "batch_size": (64, 64)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
