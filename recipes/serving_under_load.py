"""Serving under load: dynamic batching, open-loop load with MLPerf LoadGen, and Little's law.

A server is judged by requests, not calls: how many per second it answers, and how long the slowest 1%
wait. Batching requests together raises throughput until the knee of the latency-throughput curve;
waiting for a batch to fill costs every request at low load unless an idle thread runs at once.

Run:   python recipes/serving_under_load.py --quick        (about two minutes on 2 CPU cores)
Needs: TensorFlow 2.21, Keras 3, mlcommons-loadgen; a CPU is enough.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import concurrent.futures
import dataclasses
import queue
import sys
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.measure.load import closed_loop
from tfperf.measure.measurement import Measurement, versus
from tfperf.models import default_input_shape, get_net
from tfperf.recipe import Conclusion, Headline, Recipe


# The technique: a dynamic batcher, plain threads and a queue --------------------------------------------
class MicroBatcher:
    """Requests wait in a queue; a batch thread runs up to `max_batch_size` of them in one call."""

    def __init__(self, predict, max_batch_size=32, batch_timeout_s=0.005, run_when_idle=False):
        self.predict, self.max_batch_size = predict, max_batch_size
        self.batch_timeout_s, self.run_when_idle = batch_timeout_s, run_when_idle
        self.requests = queue.Queue()
        threading.Thread(target=self._serve, daemon=True).start()

    def submit(self, rows):
        """Queue one request (a few rows); the Future answers with its own rows of the output."""
        done = concurrent.futures.Future()
        self.requests.put((rows, done))
        return done

    def _serve(self):
        while True:
            batch = [self.requests.get()]  # a batch starts with the first request that waits
            deadline = time.perf_counter() + self.batch_timeout_s
            while len(batch) < self.max_batch_size:
                try:
                    # Either take only what already waits (an idle thread runs at once), or wait for more
                    # until the timeout: at low load that wait is added to every request.
                    wait = None if self.run_when_idle else max(deadline - time.perf_counter(), 0.0)
                    batch.append(self.requests.get_nowait() if wait is None else self.requests.get(timeout=wait))
                except queue.Empty:
                    break
            try:
                # One call for the whole batch: one dispatch, one matmul per layer over every request's rows.
                outputs = self.predict(np.concatenate([rows for rows, _ in batch]))
            except Exception as exc:  # every waiting caller learns why
                for _, done in batch:
                    done.set_exception(exc)
                continue
            start = 0
            for rows, done in batch:  # each caller gets its own rows back, in order
                done.set_result(outputs[start:start + len(rows)])
                start += len(rows)


# The technique: open-loop load from MLPerf LoadGen (Poisson arrivals, latency from scheduled time) -------
def loadgen_server(submit, requests, rate, latency_s=0.010, seconds=2.0, min_queries=100, log_dir="."):
    """LoadGen's Server scenario at `rate` requests/s; its verdict lands in log_dir/mlperf_log_summary.txt."""
    import mlperf_loadgen as lg

    def issue(queries):  # LoadGen calls this at each scheduled arrival; answer through QuerySamplesComplete
        for q in queries:
            submit(requests[q.index]).add_done_callback(
                lambda _, qid=q.id: lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0)]))

    settings = lg.TestSettings()
    settings.scenario, settings.mode = lg.TestScenario.Server, lg.TestMode.PerformanceOnly
    settings.server_target_qps, settings.server_target_latency_ns = rate, int(latency_s * 1e9)
    settings.server_target_latency_percentile = 0.99
    settings.min_duration_ms, settings.min_query_count = int(seconds * 1000), min_queries
    log = lg.LogSettings()
    log.log_output.outdir, log.log_output.copy_summary_to_stdout = str(log_dir), False
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(len(requests), len(requests), lambda _: None, lambda _: None)
    lg.StartTestWithLogSettings(sut, qsl, settings, log)
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)


# The technique: Little's law. Requests in flight = throughput x time in the system. With N clients each
# waiting for its answer, N requests are always in flight: throughput = N / latency. More clients raise
# throughput only while the server has idle capacity; past the knee they only lengthen the queue.
def in_flight(requests_per_s, mean_latency_s):
    return requests_per_s * mean_latency_s


# Measuring -------------------------------------------------------------------------------------------------

CURVE, LOW_LOAD, OPEN = "latency-throughput curve (closed loop)", "one request at a time", "open loop at 1% of capacity"
POLICIES = {"unbatched": dict(max_batch_size=1), "batched, 5 ms timeout": dict(batch_timeout_s=0.005),
            "batched, run when idle": dict(run_when_idle=True)}


@dataclasses.dataclass(frozen=True)
class Found:
    curves: dict  # policy -> list of LoadLevel
    knees: dict  # policy -> the level past which throughput gained under 5% (None: no knee within the levels)
    low_load: dict  # policy -> Measurement of latencies one request at a time
    open_loop: dict  # policy -> LoadGen's p50 and p99 (ms) from scheduled time at 1% of capacity
    littles_law: float | None  # the largest |in flight / clients - 1| over the stable levels (None: none was)


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    p.add_argument("--concurrency", type=flags.positive_int, nargs="+", help="closed-loop client counts")
    p.add_argument("--window", type=flags.positive_float, help="seconds per measurement window")


def knee(levels):
    """The level past which throughput gained under 5%: the knee of the curve (None: still growing at the last)."""
    for before, after in zip(levels, levels[1:]):
        if after.throughput < before.throughput * 1.05:
            return before
    return None


def measure(args, rec) -> Found:
    from tfperf.serving.loadgen import read_detail

    tf.random.set_seed(args.seed)
    shape = default_input_shape(args.model)
    net = get_net(args.model)
    serve = tf.function(lambda x: tf.nn.softmax(net(x, training=False)), input_signature=[
        tf.TensorSpec([None, *shape], tf.float32)])
    predict = lambda rows: serve(rows).numpy()  # noqa: E731
    rng = np.random.default_rng(args.seed)
    requests = [rng.normal(size=(1, *shape)).astype(np.float32) for _ in range(64)]
    predict(requests[0])

    curves, knees, low_load, open_loop = {}, {}, {}, {}
    for policy, options in POLICIES.items():
        batcher = MicroBatcher(predict, **options)
        expected = predict(np.concatenate(requests[:8]))
        got = np.concatenate([batcher.submit(r).result() for r in requests[:8]])
        assert np.allclose(got, expected, atol=1e-6), f"{policy} answers differently from one call"
        send = lambda client, b=batcher: b.submit(requests[client % 64]).result()  # noqa: E731
        levels = []
        for n in args.concurrency:
            level = closed_loop(send, n, window_s=args.window, max_windows=6, warmup_s=args.window / 2,
                                label=f"{n} clients")
            levels.append(level)
            rec.add(CURVE, f"{policy}, {n} clients", {**level.metrics(), "clients": n, "policy": policy,
                    "in_flight": in_flight(level.throughput, float(np.mean(level.latencies_s)))},
                    primary="p50_ms", lower_is_better=True, versus_first=False,
                    measurement=Measurement(level.label, level.latencies_s))
        curves[policy], knees[policy] = levels, knee(levels)
        alone = Measurement(policy, levels[0].latencies_s)
        low_load[policy] = alone
        capacity = max(level.throughput for level in levels)
        with tempfile.TemporaryDirectory() as logs:
            loadgen_server(batcher.submit, requests, rate=max(capacity / 100, 5.0), seconds=args.window * 8,
                           min_queries=40, log_dir=logs)
            detail = read_detail(f"{logs}/mlperf_log_detail.txt")
        open_loop[policy] = {"p50_ms": detail["result_50.00_percentile_latency_ns"] / 1e6,
                             "p99_ms": detail["result_99.00_percentile_latency_ns"] / 1e6,
                             "rate": detail["result_scheduled_samples_per_sec"]}
        rec.add(OPEN, policy, open_loop[policy], primary="p50_ms", lower_is_better=True, versus_first=False)
    base = low_load["unbatched"]
    for policy, m in low_load.items():
        rec.add(LOW_LOAD, policy, {"p50_ms": m.median_s * 1e3, "p99_ms": m.p99_s * 1e3}, primary="p50_ms",
                lower_is_better=True, measurement=m, comparison=None if m is base else versus(base, m))
    # A level checks the law only once its windows agreed (stable): a pause of the host across a window's edge
    # leaves requests counted in one window and timed in another, which a few dozen requests do not average out.
    settled = [r["metrics"] for r in rec.table(CURVE) if r["metrics"]["stable"]]
    worst = max((abs(m["in_flight"] / m["clients"] - 1) for m in settled), default=None)
    return Found(curves, knees, low_load, open_loop, worst)


def littles_law(worst: float | None) -> str:
    if worst is None:
        return "Little's law not checked: no level's windows agreed (a busy host); rerun with a longer --window."
    return f"Little's law holds: the clients' requests in flight equal throughput x mean latency within " \
           f"{worst:.1%} at every stable level."


def conclude(args, rec, found: Found) -> Conclusion:
    def at_knee(policy):
        level = found.knees[policy] or found.curves[policy][-1]
        low, high = level.percentile_ci_s(99)
        where = f"{level.label}" if found.knees[policy] else f"no knee up to {level.label} (still gaining 5%)"
        return f"{level.throughput:.0f} requests/s at {where}, p99 {level.percentile_s(99) * 1e3:.2f} ms " \
               f"(95% CI {low * 1e3:.2f}-{high * 1e3:.2f})"

    base = found.low_load["unbatched"]
    cost = {p: versus(base, m) for p, m in found.low_load.items() if m is not base}
    timeout, idle = found.open_loop["batched, 5 ms timeout"], found.open_loop["batched, run when idle"]
    lines = [f"{policy}: {at_knee(policy)}" for policy in POLICIES]
    text = (
        f"On this machine the {args.model} served one request per call: {at_knee('unbatched')}; batched and run when idle, {at_knee('batched, run when idle')}; batched with a "
        f"5 ms timeout, {at_knee('batched, 5 ms timeout')}. One request at a time, the timeout policy against "
        f"unbatched: {cost['batched, 5 ms timeout'].describe()} in median latency (each lone request waits out the "
        f"timeout), and run-when-idle against unbatched: {cost['batched, run when idle'].describe()}. In open loop "
        f"at 1% of capacity (LoadGen, latency from scheduled time) the 5 ms timeout gives a median of "
        f"{timeout['p50_ms']:.2f} ms against {idle['p50_ms']:.2f} ms when an idle thread runs at once: at low "
        f"load a batching timeout is pure cost. {littles_law(found.littles_law)}")
    failure = "" if found.littles_law is None or found.littles_law < 0.15 else \
        "Little's law is off by more than 15% at a stable level: the clock or the counts are wrong"
    return Conclusion(text, lines, failure, Headline.compared(
        "a 5 ms batching timeout against no batching, one request at a time (median latency)",
        cost["batched, 5 ms timeout"]))


RECIPE = Recipe(name="serving_under_load", doc=__doc__, order=147, measure=measure, conclude=conclude,
                add_flags=add_flags, sizes={"concurrency": ([1, 2, 4, 8, 16, 32], [1, 4, 16]),
                                            "window": (0.5, 0.25)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
