"""Automatic parallelism: independent work runs concurrently, and copies overlap with computation.

TensorFlow's executor runs any ops whose inputs are ready, on any device, at the same time: whether
running two jobs together beats running them one after the other depends on what each leaves idle.

Run:   python recipes/auto_parallelism.py --quick        (under a minute on 2 CPU cores)
Needs: TensorFlow 2.21. Two GPUs are used when present; otherwise two logical CPU devices.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import sys

import tensorflow as tf

from tfperf import flags
from tfperf.devices import compute_devices, usable_cores
from tfperf.measure import Timer, one_after_another
from tfperf.measure.stats import FASTER, Comparison
from tfperf.recipe import Conclusion, Headline, Recipe
from tfperf.records.jsonl import race_table

# The technique: put independent work in one graph, and nothing has to order it ---------------------


def job(device: str, x: tf.Tensor, w: tf.Tensor, ops: int) -> tf.Tensor:
    """`ops` dependent steps on one device: each needs the previous one's result."""
    with tf.device(device):
        for _ in range(ops):
            x = tf.tanh(tf.matmul(x, w))
    return x


def together(d0: str, d1: str, a: tuple, b: tuple, ops: int):
    """Two independent jobs in one graph, one per device: nothing orders them, so they run concurrently."""
    return tf.function(lambda: (job(d0, *a, ops), job(d1, *b, ops)))


def pipeline(x, w, d0: str, d1: str, steps: int, *, overlap: bool):
    """Compute y[i] on d1 and copy it to d0 each step; with overlap, y[i-1] is copied while y[i] is computed."""
    y, copies = x, []
    for _ in range(steps):
        # Without overlap, the next compute waits for the previous copy (a control dependency).
        with tf.control_dependencies([] if overlap or not copies else [copies[-1]]):
            y = job(d1, y, w, 1)
        with tf.device(d0):
            copies.append(tf.raw_ops.DeepCopy(x=y))  # a real copy to the other device's memory
    return copies


# Measuring -------------------------------------------------------------------------------------------
# The seed runs a job on GPU 1, another on GPU 2, then both, and finds "both" close to the longer one,
# not the sum; then it computes y[i] while y[i-1] is copied to the host. Here the same experiments run
# on two logical devices of this CPU (or two GPUs), with two kinds of job: large matmuls, which use
# every core by themselves, and a chain of small dependent ops, which cannot. "Together" is judged
# against the two alone one after the other: their samples added, round by round.

TOGETHER, OVERLAP = "two independent jobs: alone vs together", "compute y[i] while y[i-1] is copied"
KINDS = {"large matmuls (1024, 4 ops)": (1024, 4), "small chain (64, 400 ops)": (64, 400)}


@dataclasses.dataclass(frozen=True)
class Found:
    d0: str
    together: dict[str, dict[str, Comparison]]  # per kind: "both" (two devices) and "same" (one device)
    vs_sum: dict[str, float]  # per kind: together on two devices over the sum of the two alone
    overlap: Comparison


def measure(args, rec) -> Found:
    d0, d1 = compute_devices(2)  # devices first, before any op fixes them
    race = dict(rounds=args.rounds, samples=args.steps, warmup=args.warmup, seed=args.seed, profile_dir=args.profile)
    ms = lambda m, _: {"ms": m.median_s * 1e3, "p90_ms": m.p90_s * 1e3}  # noqa: E731
    found_together, vs_sum = {}, {}
    for kind, (n, ops) in KINDS.items():
        with tf.device(d0):
            a = tf.random.normal([n, n]), tf.random.normal([n, n], stddev=n ** -0.5)
        with tf.device(d1):
            b = tf.random.normal([n, n]), tf.random.normal([n, n], stddev=n ** -0.5)
        alone0, alone1 = f"{kind}: job on {d0} alone", f"{kind}: job on {d1} alone"
        both, same = f"{kind}: both, one on each device", f"{kind}: both on {d0}"
        summed = lambda found, a0=alone0, a1=alone1: one_after_another([found[a0], found[a1]],  # noqa: E731
                                                                       name="sum of the two alone")
        raced = race_table(rec, TOGETHER, [
            Timer(tf.function(lambda: job(d0, *a, ops)), name=alone0),
            Timer(tf.function(lambda: job(d1, *b, ops)), name=alone1),
            Timer(together(d0, d1, a, b, ops), name=both), Timer(together(d0, d0, a, b, ops), name=same)],
            against={both: summed, same: summed}, metrics=ms, primary="ms", lower_is_better=True, **race)
        alone_ms = (raced[alone0].median_s + raced[alone1].median_s) * 1e3
        vs_sum[kind] = raced[both].median_s * 1e3 / alone_ms
        for r in rec.table(TOGETHER)[-2:]:
            r["metrics"]["vs_sum_of_alone"] = r["metrics"]["ms"] / alone_ms
        found_together[kind] = {"both": raced.comparisons[both], "same": raced.comparisons[same]}
        print(f"{kind}: alone {raced[alone0].median_s * 1e3:.1f} + {raced[alone1].median_s * 1e3:.1f} ms, together "
              f"{raced[both].median_s * 1e3:.1f} ms (two devices), {raced[same].median_s * 1e3:.1f} ms (one device)",
              flush=True)

    n, steps = 1024, 8
    with tf.device(d1):
        x, w = tf.random.normal([n, n]), tf.random.normal([n, n], stddev=n ** -0.5)
    serial, overlapped = "compute, then copy, each step", "copy y[i-1] while computing y[i]"
    raced = race_table(rec, OVERLAP, [
        Timer(tf.function(lambda: pipeline(x, w, d0, d1, steps, overlap=False)), name=serial),
        Timer(tf.function(lambda: pipeline(x, w, d0, d1, steps, overlap=True)), name=overlapped)],
        metrics=ms, primary="ms", lower_is_better=True, **race)
    return Found(d0, found_together, vs_sum, raced.comparisons[overlapped])


def conclude(args, rec, found: Found) -> Conclusion:
    (large, small), together, overlap = list(KINDS), found.together, found.overlap
    cores = usable_cores()
    same_small, split_small = together[small]["same"], together[small]["both"]
    if not found.d0.startswith("/CPU"):
        devices_text = "Each GPU has its own compute, so independent jobs on two GPUs overlap. "
    else:
        devices_text = (
            f"This machine has {cores} cores. One large matmul already spreads over all of them, so two at once "
            f"share them and take about the sum. A chain of small dependent ops keeps one core busy at a time: "
            f"two such chains in one graph on the same device, against the two one after the other: "
            f"{same_small.describe()}, " + ("the second filling the idle core; " if same_small.verdict == FASTER
                                            else "no gain; ")
            + f"split over two logical devices: {split_small.describe()}. "
            + ("Where two chains did not overlap, TensorFlow's executor ran cheap ops inline on the thread that "
               "produced their input, which can put both chains on one thread: for cheap ops, concurrency is up "
               "to the scheduler. Logical CPU devices share the same cores and thread pools; they are for "
               "testing placement code, not a source of cores. "
               if FASTER not in (same_small.verdict, split_small.verdict) else
               "Logical CPU devices share the same cores: the gain is the idle core, not the device label. "))
    copy_text = (f"Copying each result while the next is computed, against compute then copy: {overlap.describe()}"
                 + (": the copy hid behind the compute." if overlap.verdict == FASTER else
                    ": no gain here, because on a CPU the copy is a memcpy on the same cores and memory bus as "
                    "the compute; a GPU's copy engines move data next to its compute units, which is where this "
                    "overlap pays."))
    return Conclusion(f"Two independent jobs in one graph, one per device, took {found.vs_sum[large]:.2f}x the sum of "
                      f"their times alone for large matmuls (against one after the other: "
                      f"{together[large]['both'].describe()}) and {found.vs_sum[small]:.2f}x for the chain of small "
                      f"ops. {devices_text}{copy_text}",
                      headline=Headline.compared("two chains of small ops in one graph against one after the other",
                                                 same_small))


def add_flags(p) -> None:
    p.add_argument("--rounds", type=flags.positive_int, help="interleaved rounds: every row takes its turn in each")


RECIPE = Recipe(name="auto_parallelism", doc=__doc__, order=60, measure=measure, conclude=conclude,
                add_flags=add_flags, uses=("steps", "warmup"),
                sizes={"steps": (30, 10), "warmup": (3, 2), "rounds": (10, 10)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
