"""Benchmark: warm-up excluded, first call apart, true percentiles, and sync before the clock."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tfperf.bench import Benchmark, BenchmarkResult, synchronous_execution, timing_ms


class FakeClock:
    """A clock that moves only when the code under test says work happened."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_first_call_and_warmup_are_not_in_the_samples():
    clock = FakeClock()
    costs = iter([5.0, 3.0, 3.0] + [float(i) for i in range(1, 11)])  # first, 2 warm-up, 10 timed

    def fn():
        clock.now += next(costs)

    r = Benchmark.run(fn, steps=10, warmup=2, clock=clock, sync_fn=lambda _: None, name="fake")
    assert r.first_call_s == 5.0
    assert r.samples_s == tuple(float(i) for i in range(1, 11))
    assert r.steps == 10
    assert r.median_s == 5.5
    assert r.min_s == 1.0 and r.max_s == 10.0
    assert r.mean_s == pytest.approx(5.5)


def test_percentiles_are_true_percentiles_and_ordered():
    rng = np.random.default_rng(0)
    samples = rng.lognormal(size=1000)
    r = BenchmarkResult.from_samples("x", samples, items_per_step=4)
    assert r.median_s == pytest.approx(np.percentile(samples, 50))
    assert r.p90_s == pytest.approx(np.percentile(samples, 90))
    assert r.p99_s == pytest.approx(np.percentile(samples, 99))
    assert r.min_s <= r.median_s <= r.p90_s <= r.p99_s <= r.max_s
    assert r.items_per_s == pytest.approx(4 / r.median_s)
    # A trimmed mean would not land on the max for a heavy tail; the p99 must see the outliers.
    spiky = BenchmarkResult.from_samples("spiky", [1.0] * 97 + [100.0] * 3)
    assert spiky.p99_s == 100.0 and spiky.median_s == 1.0


def test_result_is_immutable_and_serialisable():
    r = BenchmarkResult.from_samples("x", [1.0, 2.0])
    with pytest.raises(AttributeError):
        r.median_s = 0.0
    d = r.to_dict()
    assert d["name"] == "x" and "samples_s" not in d
    assert r.to_dict(with_samples=True)["samples_s"] == (1.0, 2.0)
    assert timing_ms(r)["median_ms"] == pytest.approx(1500.0)


class PendingWork:
    """What an asynchronous op returns: the value is ready only after the work finishes."""

    def __init__(self, seconds):
        self.done = threading.Event()
        threading.Thread(target=lambda: (time.sleep(seconds), self.done.set()), daemon=True).start()

    def numpy(self):
        self.done.wait()
        return 0


def test_the_clock_stops_only_after_the_work_is_done():
    # fn returns at once but its work takes 50 ms: a benchmark that did not sync would see ~0.
    r = Benchmark.run(lambda: PendingWork(0.05), steps=3, warmup=0)
    assert r.min_s >= 0.045
    unsynced = []
    for _ in range(3):
        t0 = time.perf_counter()
        PendingWork(0.05)
        unsynced.append(time.perf_counter() - t0)
    assert max(unsynced) < 0.01  # the same work timed without sync looks free: the trap the sync avoids


def test_async_tensorflow_is_timed_to_completion():
    a = tf.random.normal([512, 512]) / 512**0.5  # scaled so that repeated products stay finite

    @tf.function  # one enqueued call; eager tf.matmul reads its input's shape and so would wait
    def chain():
        y = a
        for _ in range(20):
            y = tf.matmul(y, a)
        return y

    with synchronous_execution(False):
        chain().numpy()
        t0 = time.perf_counter()
        chain()  # enqueued only
        enqueue_s = time.perf_counter() - t0
        tf.test.experimental.sync_devices()
        r = Benchmark.run(chain, steps=3, warmup=1)
    assert r.median_s > 3 * enqueue_s


def test_context_manager_times_the_block():
    clock = FakeClock()
    with Benchmark("block", items=100, clock=clock) as b:
        clock.now += 2.0
    assert b.result.median_s == 2.0
    assert b.result.items_per_s == 50.0
    assert b.result.first_call_s is None


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"steps": 1, "warmup": -1}])
def test_bad_sizes_are_refused(kwargs):
    with pytest.raises(ValueError, match="steps|warmup"):
        Benchmark.run(lambda: None, **kwargs)


def test_no_samples_is_an_error():
    with pytest.raises(ValueError, match="no samples"):
        BenchmarkResult.from_samples("x", [])


def test_profile_traces_each_measurement_apart(tmp_path):
    x = tf.random.normal([64, 64])
    for name in ("first run", "second run"):
        Benchmark.run(lambda: tf.matmul(x, x), steps=2, warmup=0, name=name, profile_dir=str(tmp_path))
    traces = sorted(p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*.xplane.pb"))
    assert traces == ["first-run", "second-run"]
