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

from tfperf import flags
from tfperf.bench import Timer
from tfperf.devices import compute_devices, usable_cores
from tfperf.report import markdown_table, write_conclusion
from tfperf.results import Recorder

TOGETHER, OVERLAP = "two independent jobs: alone vs together", "compute y[i] while y[i-1] is copied"


def job(device: str, x: tf.Tensor, w: tf.Tensor, ops: int) -> tf.Tensor:
    """`ops` dependent steps on one device: each needs the previous one's result."""
    with tf.device(device):
        for _ in range(ops):
            x = tf.tanh(tf.matmul(x, w))
    return x


def main(argv=None) -> int:
    # Setup: devices first, before any op fixes them -------------------------------------------
    p = flags.parser(__doc__)
    args = flags.parse(p, argv, sizes={"steps": (30, 10), "warmup": (3, 2)})
    devices = compute_devices(2)
    d0, d1 = devices
    rec = Recorder("auto_parallelism", vars(args))
    kinds = {"large matmuls (1024, 4 ops)": (1024, 4), "small chain (64, 400 ops)": (64, 400)}

    def measure(table, row, fn, **extra):
        r = Timer(fn, name=row).measure(args.steps, warmup=args.warmup, profile_dir=args.profile)
        rec.add(table, row, {"ms": r.median_s * 1e3, "p90_ms": r.p90_s * 1e3, **extra}, primary="ms",
                lower_is_better=True, measurement=r)
        return r.median_s

    # Each job alone, then both in one graph: the executor starts whatever is ready ------------------
    for kind, (n, ops) in kinds.items():
        with tf.device(d0):
            x0, w0 = tf.random.normal([n, n]), tf.random.normal([n, n], stddev=n ** -0.5)
        with tf.device(d1):
            x1, w1 = tf.random.normal([n, n]), tf.random.normal([n, n], stddev=n ** -0.5)
        alone0 = measure(TOGETHER, f"{kind}: job on {d0} alone", tf.function(lambda: job(d0, x0, w0, ops)))
        alone1 = measure(TOGETHER, f"{kind}: job on {d1} alone", tf.function(lambda: job(d1, x1, w1, ops)))
        # Parallelism: two independent jobs in one graph; nothing orders them, so they run concurrently
        both = measure(TOGETHER, f"{kind}: both, one on each device",
                       tf.function(lambda: (job(d0, x0, w0, ops), job(d1, x1, w1, ops))))
        same = measure(TOGETHER, f"{kind}: both on {d0}", tf.function(lambda: (job(d0, x0, w0, ops),
                                                                              job(d0, x1, w1, ops))))
        for r in rec.table(TOGETHER)[-2:]:
            r["metrics"]["vs_sum_of_alone"] = r["metrics"]["ms"] / ((alone0 + alone1) * 1e3)
        print(f"{kind}: alone {alone0 * 1e3:.1f} + {alone1 * 1e3:.1f} ms, together {both * 1e3:.1f} ms "
              f"(two devices), {same * 1e3:.1f} ms (one device)", flush=True)

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

    serial = measure(OVERLAP, "compute, then copy, each step", tf.function(lambda: pipeline(False)))
    overlapped = measure(OVERLAP, "copy y[i-1] while computing y[i]", tf.function(lambda: pipeline(True)))

    # Results ----------------------------------------------------------------------------------
    rec.save(args.out)
    for table in (TOGETHER, OVERLAP):
        print(f"\n## {table}\n\n{markdown_table(rec.table(table))}")
    m = {r["row"]: r["metrics"] for r in rec.table(TOGETHER)}
    large, small = list(kinds)
    ratio = {k: m[f"{k}: both, one on each device"]["vs_sum_of_alone"] for k in kinds}

    # Conclusion, from this run's numbers ------------------------------------------------------
    cores = usable_cores()
    on_cpu = d0.startswith("/CPU")
    same_small = m[f"{small}: both on {d0}"]["vs_sum_of_alone"]
    if not on_cpu:
        devices_text = "Each GPU has its own compute, so independent jobs on two GPUs overlap. "
    else:
        devices_text = (
            f"This machine has {cores} cores. One large matmul already spreads over all of them, so two at once "
            f"share them and take about the sum. A chain of small dependent ops keeps one core busy at a time: "
            f"two such chains in one graph on the same device took {same_small:.2f}x the sum, "
            + ("the second filling the idle core, " if same_small < 0.8 else "no better, ")
            + f"and split over two logical devices {ratio[small]:.2f}x. "
            + ("Where two chains did not overlap, TensorFlow's executor ran cheap ops inline on the thread that "
               "produced their input, which can put both chains on one thread: for cheap ops, concurrency is up "
               "to the scheduler. Logical CPU devices share the same cores and thread pools; they are for "
               "testing placement code, not a source of cores. " if max(same_small, ratio[small]) > 0.8 else
               "Logical CPU devices share the same cores: the gain is the idle core, not the device label. "))
    copy = overlapped / serial
    copy_text = (f"Copying each result while the next is computed took {copy:.2f}x the time of compute then copy "
                 f"({overlapped * 1e3:.1f} against {serial * 1e3:.1f} ms)"
                 + (": the copy hid behind the compute." if copy < 0.9 else
                    ": no gain here, because on a CPU the copy is a memcpy on the same cores and memory bus as "
                    "the compute; a GPU's copy engines move data next to its compute units, which is where this "
                    "overlap pays."))
    write_conclusion(args.out, "auto_parallelism", (
        f"Two independent jobs in one graph, one per device, took {ratio[large]:.2f}x the sum of their times "
        f"alone for large matmuls and {ratio[small]:.2f}x for the chain of small ops. {devices_text}{copy_text}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
