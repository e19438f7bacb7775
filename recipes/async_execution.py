"""Asynchronous execution: the front end enqueues, the back end executes, and the clock must wait for both.

With asynchronous eager execution, Python returns from an op as soon as it is queued; the work happens
later. That hides Python's overhead behind the computation, and it makes naive timing wrong.

Run:   python recipes/async_execution.py --quick        (under a minute on 2 CPU cores)
Needs: TensorFlow 2.21; a CPU is enough. On a GPU, kernels are asynchronous even in synchronous mode, and the
memory the queue holds is GPU memory: its rows read the GPU's allocator.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import contextlib
import dataclasses
import sys
import threading
import time

import numpy as np
import psutil
import tensorflow as tf

from tfperf import flags
from tfperf.gpus import device_memory, reset_peak_memory
from tfperf.measure import Elapsed, Timer, interleave, sync, versus
from tfperf.measure.timer import synchronous_execution
from tfperf.recipe import Conclusion, Headline, Recipe
from tfperf.measure.stats import FASTER

# The technique: a front end that enqueues, and a clock that waits for the back end -----------------
# NumPy computes before it returns. TensorFlow's front end (Python) hands ops to its back end (the
# runtime) through a queue: always for GPU kernels, and for eager ops on a CPU after one switch,
#     tf.config.experimental.set_synchronous_execution(False)
# A call then returns as soon as its ops are queued, which hides Python's overhead behind the work, and
# a clock read right after it is wrong: wait for the devices first, without copying anything back,
#     tf.test.experimental.sync_devices()


def variants(a, x, chain) -> dict:
    """The loop bodies compared: (a step, whether it runs in synchronous mode)."""
    return {
        # Baseline: NumPy computes before it returns; so does TensorFlow in synchronous mode.
        "NumPy matmul chain": (lambda i: (a @ a) @ a / len(a), True),
        "tf.function, synchronous": (lambda i: chain(x), True),
        # Asynchronous: a graph call only enqueues; the loop returns before its results exist.
        "tf.function, asynchronous": (lambda i: chain(x), False),
        # What makes the front end wait even so: a tensor made from host data, and eager op wrappers that
        # read a pending result's shape.
        "async, new tf.constant each step": (lambda i: chain(tf.constant(a)), False),
        "async, eager tf.matmul": (lambda i: tf.matmul(tf.matmul(x, x), x), False),
    }


def loop(body, iters: int, synchronous: bool):
    """Call body(i) iters times in the given execution mode: the steps of a training loop whose results
    nobody reads; the last result."""
    with synchronous_execution(True) if synchronous else contextlib.nullcontext():
        for i in range(iters):
            y = body(i)
    return y


def loop_timers(row: str, body, iters: int, synchronous: bool) -> tuple[Timer, Timer]:
    """Two clocks on the same loop: one read when Python returns (the wrong way), one after a sync.

    The first returns an Elapsed: the Timer waits for the queue after reading the clock, so the next
    sample does not inherit this one's work. Made in asynchronous mode, both wait for the devices.
    """
    def returns():
        t0 = time.perf_counter()
        y = loop(body, iters, synchronous)
        return Elapsed(time.perf_counter() - t0, y)

    return (Timer(returns, name=f"{row}: loop returns", items_per_call=iters),
            Timer(lambda: loop(body, iters, synchronous), name=row, items_per_call=iters))


def peak_memory_growth(body, iters: int, sync_every_step: bool, device: str) -> float:
    """MiB by which memory peaks above its start while the loop runs: on a GPU its allocator's count (the
    outputs live there), on a CPU this process's resident memory."""
    if device_memory(device) is not None:
        reset_peak_memory(device)
        start = device_memory(device)["current"]
        run_loop(body, iters, sync_every_step)
        return (device_memory(device)["peak"] - start) / 2**20
    proc, peak, running = psutil.Process(), [0], True
    start = proc.memory_info().rss

    def sample():
        while running:
            peak[0] = max(peak[0], proc.memory_info().rss - start)
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    run_loop(body, iters, sync_every_step)
    running = False
    sampler.join()
    return peak[0] / 2**20


def run_loop(body, iters: int, sync_every_step: bool) -> None:
    """The loop whose memory is watched, waited for at its end."""
    for i in range(iters):
        y = body(i)
        if sync_every_step:
            sync(y)  # bound the queue: one minibatch in flight at a time
    sync(y)


# Measuring -------------------------------------------------------------------------------------------
# Each loop is timed by two clocks: one read when Python returns (the wrong way), one after a sync. Every
# row runs in the same interleaved rounds, so that comparisons between them are paired.

QUEUE, MEMORY = "front end vs back end (loop of ops)", "memory while the queue runs ahead"


@dataclasses.dataclass(frozen=True)
class Found:
    optimistic: dict  # per row: how many times too fast a clock without a sync says the loop is
    ahead: float  # peak memory growth (MiB) with the queue free-running
    bounded: float  # and with a sync every minibatch
    device: str  # where the chains ran, and whose memory was watched: "GPU:0" or "CPU:0"


def add_flags(p) -> None:
    p.add_argument("--size", type=flags.positive_int, help="matrix size of the seed's matmul benchmark")
    p.add_argument("--rounds", type=flags.positive_int,
                   help="interleaved rounds: one timed loop of each row per round")


def measure(args, rec) -> Found:
    n = args.size
    a = np.random.default_rng(args.seed).normal(size=(n, n)).astype(np.float32)
    x = tf.constant(a)
    chain = tf.function(lambda x: tf.matmul(tf.matmul(x, x), x) / n)  # a step of known work: 2 matmuls
    chain(x)
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"

    # The process runs asynchronously; the synchronous rows switch back for their loop (the CPU default).
    rows = variants(a, x, chain)
    with synchronous_execution(False):
        timers = [t for row, (body, synchronous) in rows.items()
                  for t in loop_timers(row, body, args.steps, synchronous)]
        found = interleave(timers, rounds=args.rounds, samples=args.rounds, warmup=1, seed=args.seed,
                           profile_dir=args.profile, profile_steps=1)
    timed = {row: (found[2 * i], found[2 * i + 1]) for i, row in enumerate(rows)}

    notes = {"NumPy matmul chain": "computes, then returns",
             "tf.function, synchronous": "each call waits for its work",
             "tf.function, asynchronous": "calls enqueue; the loop returns early",
             "async, new tf.constant each step": "creating a tensor from NumPy waits for the queue",
             "async, eager tf.matmul": "Python op wrappers read the pending result's shape"}
    optimistic = {}
    for row, (returns, ready) in timed.items():
        # How many times too fast a clock read without a sync says the loop is (paired by round).
        optimistic[row] = versus(ready, returns, threshold=0.05)
        # Async or not, the results arrive no sooner than in synchronous mode: the same work, queued.
        queued = row.startswith(("tf.function, a", "async"))
        against = versus(timed["tf.function, synchronous"][1], ready) if queued else None
        rec.add(QUEUE, row, {"loop_returns_ms": returns.median_s * 1e3, "results_ready_ms": ready.median_s * 1e3,
                             "front_end_ahead": 1 - returns.median_s / ready.median_s,
                             "no_sync_looks_x": optimistic[row].ratio,
                             "no_sync_looks_ci95": [round(v, 3) for v in optimistic[row].ci95],
                             "note": notes[row]},
                primary="results_ready_ms", lower_is_better=True, measurement=ready, comparison=against)

    # Memory: how far ahead the queue may run, and what bounds it ------------------------------------
    grows = lambda i: chain(x)  # each step's output is a fresh n x n buffer
    with synchronous_execution(False):
        peak_memory_growth(grows, args.steps, False, device)  # let the allocator reach its steady state
        ahead = peak_memory_growth(grows, args.steps, False, device)
        bounded = peak_memory_growth(grows, args.steps, True, device)
    metric = "peak_gpu_growth_mib" if device.startswith("GPU") else "peak_rss_growth_mib"
    for row, mib in (("async, free-running", ahead), ("async, sync every minibatch", bounded)):
        rec.add(MEMORY, row, {metric: mib, "buffer_mib": n * n * 4 / 2**20, "device": device},
                primary=metric, lower_is_better=True, versus_first=False)

    return Found(optimistic, ahead, bounded, device)


def conclude(args, rec, found: Found) -> Conclusion:
    optimistic, ahead, bounded = found.optimistic, found.ahead, found.bounded
    n = args.size
    wrong = optimistic["tf.function, asynchronous"]
    m = {r["row"]: r for r in rec.table(QUEUE)}
    right_ms = m["tf.function, asynchronous"]["metrics"]["results_ready_ms"]
    line = (f"async loop of {args.steps} graph calls: a clock read without a sync says "
            f"{m['tf.function, asynchronous']['metrics']['loop_returns_ms']:.1f} ms, with one {right_ms:.1f} ms: "
            f"{wrong.describe().replace('faster', 'too fast')}")

    gpu = found.device.startswith("GPU")
    watched = f"{found.device}'s allocator" if gpu else "the process's resident memory"
    buffer_mib = n * n * 4 / 2**20
    if ahead > bounded + 2 * buffer_mib:
        memory = (f"Running ahead cost memory ({watched}): peak growth {ahead:.0f} MiB free-running against {bounded:.0f} MiB "
                  f"when syncing every minibatch ({buffer_mib:.0f} MiB per output), so bound the queue by reading "
                  f"the loss each step.")
    else:
        memory = (f"Running ahead did not cost memory beyond allocator noise ({watched}): peak growth {ahead:.0f} MiB "
                  f"free-running against {bounded:.0f} MiB syncing every minibatch ({buffer_mib:.0f} MiB per "
                  f"output). TensorFlow's queue holds op handles and allocates each output when its op runs, and "
                  f"new inputs from the host wait for the queue (above), so the pile-up of inputs the seed warns "
                  f"about cannot form; reading the loss each step still bounds the queue, at no cost here.")
    waits = [row for row in ("async, new tf.constant each step", "async, eager tf.matmul")
             if optimistic[row].verdict != FASTER]
    runs_ahead = [row for row in ("async, new tf.constant each step", "async, eager tf.matmul")
                  if row not in waits]
    queued = m["tf.function, asynchronous"]
    same_work = (f"The queued loop's results were ready no sooner than the synchronous loop's "
                 f"({queued['verdict']} against it, {queued['ratio']:.2f}x): on {found.device} the queue hides Python's "
                 f"dispatch, not the arithmetic." if queued.get("verdict") != FASTER else
                 f"Queued, the loop's results were ready {queued['ratio']:.2f}x as fast as in synchronous mode "
                 f"(95% CI {queued['ratio_ci95'][0]:.2f}-{queued['ratio_ci95'][1]:.2f}x): Python's dispatch of "
                 f"one call overlapped the previous call's work.")
    wait_text = (f"The front end still waited in {' and '.join(repr(r) for r in waits)}: a clock without a sync "
                 f"read {'; '.join(optimistic[r].describe().replace('faster', 'too fast') for r in waits)}. Creating "
                 f"a tensor from NumPy, or an eager op whose Python wrapper needs the pending result's shape, waits "
                 f"for the queue." if waits else
                 "In this run even host-made tensors and eager ops ran ahead of their results.")
    if runs_ahead:
        wait_text += f" {' and '.join(repr(r) for r in runs_ahead)} still ran ahead of their results."
    synchronous = optimistic["tf.function, synchronous"]
    took = (f"the loop of {args.steps} matmul chains took {m['NumPy matmul chain']['metrics']['results_ready_ms']:.0f} "
            f"and {m['tf.function, synchronous']['metrics']['results_ready_ms']:.0f} ms; a clock without a sync read "
            f"{synchronous.describe().replace('faster', 'too fast')} there")
    opening = (f"NumPy and synchronous TensorFlow return only when the work is done ({took})."
               if synchronous.verdict != FASTER else
               f"NumPy returns only when the work is done; here synchronous TensorFlow did not ({took})"
               + (f": on {found.device} kernels are queued even in synchronous mode, which only makes ops on the "
                  f"CPU wait." if gpu else "."))
    return Conclusion((
        f"{opening} Asynchronous, "
        f"the loop returned after {queued['metrics']['loop_returns_ms']:.1f} ms while its results were ready after "
        f"{right_ms:.0f} ms: a clock stopped without a sync reads {wrong.describe().replace('faster', 'too fast')}, "
        f"which is why tfperf's Timer waits for the devices (never copying the result to the host) before it "
        f"reads the clock. {same_work} {wait_text} So in TensorFlow only graph calls and raw ops really run "
        f"ahead. {memory}"), [line],
        headline=Headline.compared("a clock read without a sync after queued graph calls", wrong,
                                   figure=wrong.describe().replace("faster", "too fast"),
                                   verdict="too fast" if wrong.verdict == FASTER else wrong.verdict,
                                   rests_on=("tf.function, asynchronous",)))


# --steps here is the length of the loop of calls whose clock is read before and after the sync.
RECIPE = Recipe(name="async_execution", doc=__doc__, order=50, measure=measure, conclude=conclude,
                add_flags=add_flags, uses=("steps",),
                sizes={"steps": (100, 20), "size": (1000, 1000), "rounds": (10, 6)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
