"""Automatic parallelism: independent work runs concurrently, and copies overlap with computation.

TensorFlow's executor runs any ops whose inputs are ready, on any device, at the same time. Two jobs
that share nothing need no threads or streams from us; whether running them together is faster
depends on whether each alone leaves the hardware idle.

Run:   python recipes/auto_parallelism.py --quick        (under a minute on 2 CPU cores)
Needs: TensorFlow 2.21. Two GPUs are used when present; otherwise two logical CPU devices.

Introduction
------------
The seed runs a job on GPU 1, another on GPU 2, then both, and finds "both" close to the longer one,
not the sum; then it computes y[i] while y[i-1] is copied to the host. Here the same experiments run
on two logical devices of this CPU (or two GPUs), with two kinds of job: large matmuls, which use
every core by themselves, and a chain of small dependent ops, which cannot. The explanation is the
machine's core count, printed next to the numbers.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys

import tensorflow as tf

from tfperf.measure import Timer, interleave, one_after_another, versus
from tfperf.devices import compute_devices, usable_cores
from tfperf.recipe import Conclusion, Recipe
from tfperf.measure.stats import FASTER

TOGETHER, OVERLAP = "two independent jobs: alone vs together", "compute y[i] while y[i-1] is copied"


def job(device: str, x: tf.Tensor, w: tf.Tensor, ops: int) -> tf.Tensor:
    """`ops` dependent steps on one device: each needs the previous one's result."""
    with tf.device(device):
        for _ in range(ops):
            x = tf.tanh(tf.matmul(x, w))
    return x


def measure(args, rec) -> dict:
    # Setup: devices first, before any op fixes them -------------------------------------------
    devices = compute_devices(2)
    d0, d1 = devices
    kinds = {"large matmuls (1024, 4 ops)": (1024, 4), "small chain (64, 400 ops)": (64, 400)}

    def race(table, timers, against):
        """Interleave the timers; record each, judged against the Measurement `against` maps its name to."""
        found = dict(zip([t.name for t in timers], interleave(
            timers, samples=args.steps, warmup=args.warmup, seed=args.seed, profile_dir=args.profile)))
        verdicts = {}
        for row, m in found.items():
            c = verdicts[row] = versus(against(found)[row], m) if row in against(found) else None
            rec.add(table, row, {"ms": m.median_s * 1e3, "p90_ms": m.p90_s * 1e3}, primary="ms",
                    lower_is_better=True, measurement=m, comparison=c)
        return found, verdicts

    # Each job alone, then both in one graph: the executor starts whatever is ready ------------------
    together = {}
    for kind, (n, ops) in kinds.items():
        with tf.device(d0):
            x0, w0 = tf.random.normal([n, n]), tf.random.normal([n, n], stddev=n ** -0.5)
        with tf.device(d1):
            x1, w1 = tf.random.normal([n, n]), tf.random.normal([n, n], stddev=n ** -0.5)
        alone0, alone1 = f"{kind}: job on {d0} alone", f"{kind}: job on {d1} alone"
        both, same = f"{kind}: both, one on each device", f"{kind}: both on {d0}"
        timers = [Timer(tf.function(lambda: job(d0, x0, w0, ops)), name=alone0),
                  Timer(tf.function(lambda: job(d1, x1, w1, ops)), name=alone1),
                  # Parallelism: two independent jobs in one graph; nothing orders them, so they run concurrently
                  Timer(tf.function(lambda: (job(d0, x0, w0, ops), job(d1, x1, w1, ops))), name=both),
                  Timer(tf.function(lambda: (job(d0, x0, w0, ops), job(d0, x1, w1, ops))), name=same)]

        def in_sequence(found, alone0=alone0, alone1=alone1, both=both, same=same):
            # Together is judged against the two alone one after the other, sample by sample in the same rounds.
            summed = one_after_another([found[alone0], found[alone1]], name="sum of the two alone")
            return {both: summed, same: summed}

        found, verdicts = race(TOGETHER, timers, in_sequence)
        summed_s = found[alone0].median_s + found[alone1].median_s
        for r in rec.table(TOGETHER)[-2:]:
            r["metrics"]["vs_sum_of_alone"] = r["metrics"]["ms"] / (summed_s * 1e3)
        together[kind] = {"both": verdicts[both], "same": verdicts[same]}
        print(f"{kind}: alone {found[alone0].median_s * 1e3:.1f} + {found[alone1].median_s * 1e3:.1f} ms, together "
              f"{found[both].median_s * 1e3:.1f} ms (two devices), {found[same].median_s * 1e3:.1f} ms (one device)",
              flush=True)

    # Overlap: copy each result while the next one is computed -----------------------------------------
    n, steps = 1024, 8
    with tf.device(d1):
        x, w = tf.random.normal([n, n]), tf.random.normal([n, n], stddev=n ** -0.5)

    def pipeline(overlap: bool):
        y, copies = x, []
        for _ in range(steps):
            deps = [] if overlap or not copies else [copies[-1]]
            with tf.control_dependencies(deps):  # without overlap: compute waits for the previous copy
                y = job(d1, y, w, 1)
            with tf.device(d0):
                copies.append(tf.raw_ops.DeepCopy(x=y))  # a real copy to the other device's memory
        return copies

    serial, overlapped = "compute, then copy, each step", "copy y[i-1] while computing y[i]"
    found, verdicts = race(OVERLAP, [Timer(tf.function(lambda: pipeline(False)), name=serial),
                                     Timer(tf.function(lambda: pipeline(True)), name=overlapped)],
                           lambda found: {overlapped: found[serial]})
    return {"d0": d0, "kinds": list(kinds), "together": together, "overlap": verdicts[overlapped]}


def conclude(args, rec, found) -> Conclusion:
    m = {r["row"]: r["metrics"] for r in rec.table(TOGETHER)}
    d0, (large, small), together, overlap = found["d0"], found["kinds"], found["together"], found["overlap"]
    ratio = {k: m[f"{k}: both, one on each device"]["vs_sum_of_alone"] for k in (large, small)}

    # Conclusion, from this run's numbers ------------------------------------------------------
    cores = usable_cores()
    on_cpu = d0.startswith("/CPU")
    same_small, split_small = together[small]["same"], together[small]["both"]
    if not on_cpu:
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
               "testing placement code, not a source of cores. " if FASTER not in (same_small.verdict, split_small.verdict)
               else "Logical CPU devices share the same cores: the gain is the idle core, not the device label. "))
    copy_text = (f"Copying each result while the next is computed, against compute then copy: {overlap.describe()}"
                 + (": the copy hid behind the compute." if overlap.verdict == FASTER else
                    ": no gain here, because on a CPU the copy is a memcpy on the same cores and memory bus as "
                    "the compute; a GPU's copy engines move data next to its compute units, which is where this "
                    "overlap pays."))
    return Conclusion(f"Two independent jobs in one graph, one per device, took {ratio[large]:.2f}x the sum of their times "
            f"alone for large matmuls (against one after the other: {together[large]['both'].describe()}) and "
            f"{ratio[small]:.2f}x for the chain of small ops. {devices_text}{copy_text}")


RECIPE = Recipe(name="auto_parallelism", doc=__doc__, order=60, measure=measure, conclude=conclude,
                uses=("steps", "warmup"), sizes={"steps": (30, 10), "warmup": (3, 2)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
