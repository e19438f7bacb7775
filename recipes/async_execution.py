"""Asynchronous execution: the front end enqueues, the back end executes, and the clock must wait for both.

With asynchronous eager execution, Python returns from an op as soon as it is queued; the work happens
later. That hides Python's overhead behind the computation, and it makes naive timing wrong.

Run:   python recipes/async_execution.py --quick        (under a minute on 2 CPU cores)
Needs: TensorFlow 2.21; a CPU is enough (on a GPU, kernels are asynchronous even in synchronous mode).

Introduction
------------
The seed's asynchronous-computation section compares NumPy, which computes before it returns, with
a framework whose front end (Python) hands ops to a back end (the runtime) through a queue. In
TensorFlow that queue is opt-in for eager ops on a CPU, `tf.config.experimental.set_synchronous_execution(False)`,
and always there for GPU kernels. Below: NumPy vs TensorFlow, the loop's return time against the time
its results are ready, the wrong way to time next to the right way, what makes the front end wait
anyway, and what letting the queue run ahead costs in memory.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys
import threading
import time

import numpy as np
import psutil
import tensorflow as tf

from tfperf import flags
from tfperf.bench import profiled, sync, synchronous_execution
from tfperf.recipe import Conclusion, Recipe

QUEUE, MEMORY = "front end vs back end (loop of ops)", "memory while the queue runs ahead"


def loop_times(body, iters: int) -> tuple[float, float]:
    """Seconds until the Python loop returns, and until its last result is ready."""
    sync()
    t0 = time.perf_counter()
    for i in range(iters):
        y = body(i)
    returned = time.perf_counter() - t0
    sync(y)  # async: wait for the back end; the right way to stop a clock
    return returned, time.perf_counter() - t0


def peak_rss_growth(body, iters: int, sync_every_step: bool) -> float:
    """MiB by which this process's resident memory peaks above its start while the loop runs."""
    proc, peak, running = psutil.Process(), [0], True
    start = proc.memory_info().rss

    def sample():
        while running:
            peak[0] = max(peak[0], proc.memory_info().rss - start)
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for i in range(iters):
        y = body(i)
        if sync_every_step:
            sync(y)  # bound the queue: one minibatch in flight at a time
    sync(y)
    running = False
    sampler.join()
    return peak[0] / 2**20


def add_flags(p) -> None:
    p.add_argument("--size", type=flags.positive_int, help="matrix size of the seed's matmul benchmark")


def measure(args, rec) -> dict:
    # Setup ------------------------------------------------------------------------------------
    n = args.size
    a = np.random.default_rng(args.seed).normal(size=(n, n)).astype(np.float32)
    x = tf.constant(a)
    chain = tf.function(lambda x: tf.matmul(tf.matmul(x, x), x) / n)  # a step of known work: 2 matmuls
    chain(x)

    def add(row, returned, ready, note):
        rec.add(QUEUE, row, {"loop_returns_ms": returned * 1e3, "results_ready_ms": ready * 1e3,
                             "front_end_ahead": 1 - returned / ready, "note": note},
                primary="results_ready_ms", lower_is_better=True)

    # Baseline: NumPy computes before it returns -----------------------------------------------------
    add("NumPy matmul chain", *loop_times(lambda i: (a @ a) @ a / n, args.steps), "computes, then returns")

    # TensorFlow, synchronous (the CPU default) and asynchronous -------------------------------------
    with profiled(args.profile, "synchronous"):
        add("tf.function, synchronous", *loop_times(lambda i: chain(x), args.steps), "each call waits for its work")
    with synchronous_execution(False), profiled(args.profile, "asynchronous"):  # async: calls only enqueue
        returned, ready = loop_times(lambda i: chain(x), args.steps)
        add("tf.function, asynchronous", returned, ready, "calls enqueue; the loop returns early")
        # What makes the front end wait even in asynchronous mode: creating a tensor from host data.
        add("async, new tf.constant each step", *loop_times(lambda i: chain(tf.constant(a)), args.steps),
            "creating a tensor from NumPy waits for the queue")
        add("async, eager tf.matmul", *loop_times(lambda i: tf.matmul(tf.matmul(x, x), x), args.steps),
            "Python op wrappers read the pending result's shape")
    wrong, right = returned, ready  # the same loop, clock stopped before and after the sync

    # Memory: how far ahead the queue may run, and what bounds it ------------------------------------
    grows = lambda i: chain(x)  # each step's output is a fresh n x n buffer
    with synchronous_execution(False):
        peak_rss_growth(grows, args.steps, sync_every_step=False)  # let the allocator reach its steady state
        ahead = peak_rss_growth(grows, args.steps, sync_every_step=False)
        bounded = peak_rss_growth(grows, args.steps, sync_every_step=True)
    for row, mib in (("async, free-running", ahead), ("async, sync every minibatch", bounded)):
        rec.add(MEMORY, row, {"peak_rss_growth_mib": mib, "buffer_mib": n * n * 4 / 2**20},
                primary="peak_rss_growth_mib", lower_is_better=True, versus_first=False)

    return {"wrong": wrong, "right": right, "ahead": ahead, "bounded": bounded}


def conclude(args, rec, found) -> Conclusion:
    wrong, right, ahead, bounded = found["wrong"], found["right"], found["ahead"], found["bounded"]
    n = args.size
    line = (f"timing without a sync says {wrong * 1e3:.1f} ms, with one {right * 1e3:.1f} ms: "
            f"{right / wrong:.1f}x too optimistic")

    # Conclusion, from this run's numbers ------------------------------------------------------
    m = {r["row"]: r["metrics"] for r in rec.table(QUEUE)}
    buffer_mib = n * n * 4 / 2**20
    if ahead > bounded + 2 * buffer_mib:
        memory = (f"Running ahead cost memory: peak growth {ahead:.0f} MiB free-running against {bounded:.0f} MiB "
                  f"when syncing every minibatch ({buffer_mib:.0f} MiB per output), so bound the queue by reading "
                  f"the loss each step.")
    else:
        memory = (f"Running ahead did not cost memory beyond allocator noise: peak growth {ahead:.0f} MiB "
                  f"free-running against {bounded:.0f} MiB syncing every minibatch ({buffer_mib:.0f} MiB per "
                  f"output). TensorFlow's queue holds op handles and allocates each output when its op runs, and "
                  f"new inputs from the host wait for the queue (above), so the pile-up of inputs the seed warns "
                  f"about cannot form; reading the loss each step still bounds the queue, at no cost here.")
    return Conclusion((
        f"NumPy and synchronous TensorFlow return only when the work is done (the loop of {args.steps} matmul "
        f"chains took {m['NumPy matmul chain']['results_ready_ms']:.0f} and "
        f"{m['tf.function, synchronous']['results_ready_ms']:.0f} ms). Asynchronous, the loop returned after "
        f"{wrong * 1e3:.1f} ms while its results were ready after {right * 1e3:.0f} ms: a clock stopped without "
        f"a sync is {right / wrong:.0f}x too optimistic, which is why tfperf's Timer waits for the "
        f"devices (never copying the result to the host) before it reads the clock. The front end still waits when it creates a tensor from NumPy or "
        f"calls an eager op whose Python wrapper needs the pending result's shape "
        f"({m['async, new tf.constant each step']['front_end_ahead']:.0%} and "
        f"{m['async, eager tf.matmul']['front_end_ahead']:.0%} ahead), so in TensorFlow only graph calls and raw "
        f"ops really run ahead. {memory}"), [line])


# --steps here is the length of the loop of calls whose clock is read before and after the sync.
RECIPE = Recipe(name="async_execution", doc=__doc__, order=50, measure=measure, conclude=conclude,
                add_flags=add_flags, uses=("steps",), sizes={"steps": (100, 30), "size": (1000, 1000)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
