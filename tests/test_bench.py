"""Timer and Measurement: first call apart, warm-up excluded, raw samples kept, sync without a host copy,
blocks, autorange, interleaving, and a profiler that never traces the recorded samples."""

import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tfperf.measure import stats
import tfperf
from tfperf.measure import (Benchmark, Elapsed, Measurement, Timer, TimerCluster, TimerServer, fresh_processes,
                            interleave, one_after_another, race, timing_ms, versus)
from tfperf.measure.timer import synchronous_execution


class FakeClock:
    """A clock that moves only when the code under test says work happened."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_timer(costs, **kwargs):
    clock = FakeClock()
    costs = iter(costs)

    def fn():
        clock.now += next(costs)

    return Timer(fn, clock=clock, sync_fn=lambda _: None, **kwargs)


def test_first_call_returns_what_it_computed_and_is_not_repeated():
    calls = []
    timer = Timer(lambda: calls.append(1) or len(calls), name="counted")
    assert timer.first_call() == 1 and timer.first_call_s is not None
    m = timer.measure(3, warmup=0)
    assert len(calls) == 1 + 3 and m.first_call_s == timer.first_call_s  # start() did not call it again


def test_first_call_and_warmup_are_not_in_the_samples():
    m = fake_timer([5.0, 3.0, 3.0] + [float(i) for i in range(1, 11)], name="fake").measure(10, warmup=2)
    assert m.first_call_s == 5.0
    assert m.samples_s == tuple(float(i) for i in range(1, 11))
    assert m.n == 10 and m.median_s == 5.5 and m.min_s == 1.0 and m.max_s == 10.0
    assert m.iqr_s == pytest.approx(np.percentile(range(1, 11), 75) - np.percentile(range(1, 11), 25))
    assert m.ci95_s == stats.median_ci(range(1, 11))
    assert m.overhead_s is None  # unknowable with a custom clock and sync


def test_percentiles_are_true_percentiles_and_the_summary_keeps_them():
    samples = np.random.default_rng(0).lognormal(size=1000)
    m = Measurement("x", tuple(samples), items_per_call=4)
    assert m.median_s == pytest.approx(np.percentile(samples, 50))
    assert m.p99_s == pytest.approx(np.percentile(samples, 99))
    assert m.items_per_s == pytest.approx(4 / m.median_s)
    assert m.median_per_item_s == pytest.approx(m.median_s / 4)
    summary = m.summary()
    assert summary["n"] == 1000 and summary["mode"] == "latency" and summary["ci95_s"][0] < m.median_s
    spiky = Measurement("spiky", (1.0,) * 97 + (100.0,) * 3)
    assert spiky.p99_s == 100.0 and spiky.median_s == 1.0


def test_an_unstable_measurement_says_so():
    steady = Measurement("steady", tuple(1.0 + 0.001 * i for i in range(20)))
    noisy = Measurement("noisy", tuple([1.0, 1.5] * 10))
    assert steady.warnings == ()
    assert any(w.startswith("unstable") for w in noisy.warnings) and "WARNING: unstable" in str(noisy)
    assert any("whole range" in w for w in Measurement("few", (1.0, 2.0)).warnings)


def test_throughput_mode_times_blocks_and_reports_per_call():
    timer = fake_timer([1.0] + [0.5] * 40, block_size=4)
    m = timer.measure(5, warmup=0)
    assert m.mode == "throughput" and m.block_size == 4
    assert m.samples_s == (2.0,) * 5 and m.median_s == 0.5


def test_autorange_samples_until_the_minimum_time():
    m = fake_timer([1.0] + [0.01] * 1000).measure(warmup=0, min_time_s=0.5, min_samples=10)
    assert m.n == 50  # 50 samples of 10 ms reach 0.5 s
    m = fake_timer([1.0] + [1.0] * 100).measure(warmup=0, min_time_s=0.5, min_samples=10)
    assert m.n == 10  # slow calls: the minimum count wins


def test_auto_block_size_is_calibrated_to_the_overhead():
    x = tf.constant(1.0)
    timer = Timer(lambda: x + 1.0, block_size="auto")
    m = timer.measure(5, warmup=1)
    assert m.block_size > 1 and m.block_size & (m.block_size - 1) == 0  # a power of two
    assert m.median_s * m.block_size >= 1e-3 * 0.5  # a block lasts about a millisecond or more


def test_auto_block_size_is_not_cut_short_by_one_preempted_sample():
    # 0.1 ms calls; the first calibration sample was preempted for 10 ms and alone would pass for a full block.
    m = fake_timer([1.0, 0.01] + [1e-4] * 10_000, block_size="auto").measure(3, warmup=0)
    assert m.block_size == 16 and m.median_s == pytest.approx(1e-4)  # 16 x 0.1 ms is the first block of 1 ms


class PendingWork:
    """What an asynchronous result looks like: ready only when its work finishes (as JAX arrays are)."""

    def __init__(self, seconds):
        self.done = threading.Event()
        self.copied = False
        threading.Thread(target=lambda: (time.sleep(seconds), self.done.set()), daemon=True).start()

    def block_until_ready(self):
        self.done.wait()
        return self

    def numpy(self):
        self.copied = True
        return 0


def test_the_clock_stops_only_after_the_work_is_done_and_copies_nothing():
    results = []
    m = Timer(lambda: results.append(PendingWork(0.05)) or results[-1]).measure(3, warmup=0)
    assert m.min_s >= 0.045
    assert not any(r.copied for r in results)  # waited for, never read back to the host
    t0 = time.perf_counter()
    PendingWork(0.05)
    assert time.perf_counter() - t0 < 0.01  # the same work unsynced looks free: the trap the sync avoids


def test_async_tensorflow_is_timed_to_completion():
    a = tf.random.normal([512, 512]) / 512**0.5  # scaled so that repeated products stay finite

    @tf.function  # one enqueued call; eager tf.matmul reads its input's shape and so would wait
    def chain():
        y = a
        for _ in range(20):
            y = tf.matmul(y, a)
        return y

    with synchronous_execution(False):
        chain()
        tf.test.experimental.sync_devices()
        t0 = time.perf_counter()
        chain()  # enqueued only
        enqueue_s = time.perf_counter() - t0
        tf.test.experimental.sync_devices()
        m = Timer(chain).measure(3, warmup=1)
    assert m.median_s > 3 * enqueue_s


def test_sync_overhead_is_measured_and_reported():
    m = Timer(lambda: None).measure(20, warmup=0)
    assert m.overhead_s is not None and 0 < m.overhead_s < 1e-3


def test_interleave_alternates_shuffled_rounds_and_versus_pairs_them():
    order = []
    timers = [fake_timer([1.0] + [t] * 100, name=name) for name, t in (("slow", 0.2), ("fast", 0.1))]
    for t in timers:
        inner = t.fn
        t.fn = (lambda inner, name: lambda: (order.append(name), inner()))(inner, t.name)
    slow, fast = interleave(timers, rounds=6, samples=12, warmup=0)
    assert slow.rounds == fast.rounds == 6 and slow.n == fast.n == 12
    timed = order[2:]  # after each first call
    assert set(timed[:4]) == {"slow", "fast"}  # both ran within the first round
    assert timed != ["slow"] * 12 + ["fast"] * 12  # interleaved, not one after the other
    c = versus(slow, fast)
    assert c.paired and c.ratio == pytest.approx(2.0) and c.verdict == stats.FASTER
    assert versus(fast, slow).verdict == stats.SLOWER
    with pytest.raises(ValueError, match="distinct names"):
        interleave([fake_timer([1.0]), fake_timer([1.0])], rounds=1, samples=1)


def test_interleave_continues_earlier_rounds_of_the_same_timers():
    timers = [fake_timer([1.0] + [t] * 100, name=name) for name, t in (("a", 0.3), ("b", 0.1))]
    first = interleave(timers, rounds=3, samples=3, warmup=0)
    more = interleave(timers, rounds=4, samples=4, warmup=0, seed=1, after=first)
    assert [m.rounds for m in more] == [7, 7] and [m.n for m in more] == [7, 7]
    assert more[0].samples_s[:3] == first[0].samples_s and timers[0].first_call_s == 1.0  # no second first call
    assert versus(*more).paired and versus(*more).ratio == pytest.approx(3.0)
    with pytest.raises(ValueError, match="same timers"):
        interleave(timers[::-1], rounds=1, samples=1, after=first)


@pytest.mark.whole_machine
def test_identical_alternatives_show_no_measurable_difference():
    x = tf.random.normal([256, 256])
    f = tf.function(lambda: tf.matmul(x, x))
    a, b = interleave([Timer(f, name="a"), Timer(f, name="b")], rounds=8, samples=40)
    # A 95% CI misses the true ratio (1) in one run of twenty by design; a 10% threshold asks only
    # that interleaving gives neither side a systematic advantage. On the machine alone: beside the other
    # worker's processes, whose load changes within a round, a fresh-clone run once found b 'slower'.
    assert versus(a, b, threshold=0.10).verdict == stats.NO_DIFFERENCE


def test_interleave_without_samples_gives_each_timer_an_equal_share_of_time():
    slow = fake_timer([1.0] + [0.1] * 1000, name="slow")
    fast = fake_timer([1.0] + [0.01] * 1000, name="fast")
    s, f = interleave([slow, fast], rounds=5, min_time_s=1.0, warmup=0)
    assert (s.n, f.n) == (10, 100)  # 1 s each: 2 and 20 samples a round
    assert versus(s, f).paired and versus(s, f).ratio == pytest.approx(10.0)


def test_per_item_comparison_uses_items_per_call():
    big = Measurement("batch 4", (4.0,) * 10, items_per_call=4)
    small = Measurement("batch 1", (2.0,) * 10)
    assert versus(small, big).ratio == pytest.approx(2.0)  # 1 s per item against 2 s per item


def test_a_function_may_time_its_own_inner_part():
    m = Timer(lambda: Elapsed(0.25, result=tf.constant(1.0))).measure(3, warmup=0)
    assert m.samples_s == (0.25,) * 3 and m.first_call_s == 0.25
    with pytest.raises(ValueError, match="block_size 1"):
        Timer(lambda: Elapsed(0.1), block_size=2).measure(1)


def test_timing_ms_columns():
    m = Measurement("x", (1.0, 2.0), first_call_s=3.0)
    assert timing_ms(m) == {"first_call_ms": 3000.0, "median_ms": 1500.0, "p90_ms": pytest.approx(1900.0),
                            "p99_ms": pytest.approx(1990.0)}


@pytest.mark.parametrize("call", [lambda t: t.measure(0), lambda t: t.measure(1, warmup=-1)])
def test_bad_sizes_are_refused(call):
    with pytest.raises(ValueError, match="steps|warmup"):
        call(Timer(lambda: None))


def test_bad_measurements_are_refused():
    with pytest.raises(ValueError, match="no samples"):
        Measurement("x", ())
    with pytest.raises(ValueError, match="equal rounds"):
        Measurement("x", (1.0, 2.0, 3.0), rounds=2)
    with pytest.raises(ValueError, match="block_size"):
        Timer(lambda: None, block_size=0)


def test_profile_traces_a_separate_pass_per_measurement(tmp_path):
    x = tf.random.normal([64, 64])
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        return tf.matmul(x, x)

    for name in ("first run", "second run"):
        m = Timer(fn, name=name).measure(4, warmup=0, profile_dir=str(tmp_path))
        assert m.n == 4
    traces = sorted(p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*.xplane.pb"))
    assert traces == ["first-run", "second-run"]
    assert calls["n"] == 2 * (1 + 4 + 10)  # first call, 4 recorded, then 10 more under the profiler


def test_fresh_processes_collects_each_named_time_per_run():
    script = ("import os; from tfperf.measure.processes import reply; print('noise'); "
              "print(reply({'load_s': 0.5, 'pid_s': os.getpid()})); print('more noise')")
    found = fresh_processes([sys.executable, "-c", script], 3)
    assert set(found) == {"load_s", "pid_s"}
    assert found["load_s"].samples_s == (0.5, 0.5, 0.5)
    assert len(set(found["pid_s"].samples_s)) == 3  # three processes, not one


def test_fresh_processes_says_why_a_run_failed():
    with pytest.raises(RuntimeError, match="exited with 3: .*broken"):
        fresh_processes([sys.executable, "-c", "import sys; print('broken', file=sys.stderr); sys.exit(3)"], 2)


def test_race_runs_more_rounds_only_while_a_comparison_is_undecided():
    # b is 10% faster with noise that 6 rounds cannot settle against a 9% bar; more rounds do.
    rng = np.random.default_rng(0)
    noisy = lambda mean: [1.0] + list(mean * (1 + 0.2 * rng.standard_normal(1000)))  # noqa: E731
    timers = [fake_timer(noisy(1.0), name="a"), fake_timer(noisy(0.9), name="b")]
    seen = []
    ms, (c,) = race(timers, rounds=6, samples=6, threshold=0.09, max_extensions=2, warmup=0,
                    on_first_rounds=lambda found: seen.append([m.rounds for m in found]))
    assert seen == [[6, 6]]  # the hook saw the first rounds only
    assert ms[0].rounds in (6, 12, 18) and c.ratio == pytest.approx(versus(*ms, threshold=0.09).ratio)
    clear = [fake_timer([1.0] + [0.2] * 100, name="slow"), fake_timer([1.0] + [0.1] * 100, name="fast")]
    ms, (c,) = race(clear, rounds=6, samples=6, warmup=0)
    assert ms[0].rounds == 6 and c.verdict == stats.FASTER  # decided at once: no extension


def test_race_extends_only_the_comparisons_still_undecided():
    # c is near a 9% bar (undecided after 6 rounds); b is clearly faster from the start: only a and c run on.
    rng = np.random.default_rng(1)
    noisy = lambda mean: [1.0] + list(mean * (1 + 0.2 * rng.standard_normal(1000)))  # noqa: E731
    timers = [fake_timer(noisy(1.0), name="a"), fake_timer([1.0] + [0.2] * 1000, name="b"),
              fake_timer(noisy(0.9), name="c")]
    ms, (b, c) = race(timers, rounds=6, samples=6, threshold=0.09, max_extensions=2, warmup=0)
    assert ms[1].rounds == 6 and b.verdict == stats.FASTER and b.units == 6  # decided at once, not re-run
    assert ms[0].rounds == ms[2].rounds > 6 and c.units == ms[2].rounds  # the open one got more rounds
    # A baseline that is a function of the measurements involves every timer.
    summed = lambda found: one_after_another([found["a"], found["b"]], name="a then b")  # noqa: E731
    slow = [fake_timer([1.0] + [0.1] * 100, name="a"), fake_timer([1.0] + [0.1] * 100, name="b"),
            fake_timer([1.0] + [0.1] * 100, name="both")]
    ms, (both,) = race(slow, rounds=6, samples=6, warmup=0, against={"both": summed})
    assert both.verdict == stats.FASTER and both.ratio == pytest.approx(2.0)


def test_interleave_continues_an_autoranged_race_at_the_same_share_per_round():
    slow = fake_timer([1.0] + [0.1] * 1000, name="slow")
    fast = fake_timer([1.0] + [0.01] * 1000, name="fast")
    first = interleave([slow, fast], rounds=5, min_time_s=1.0, warmup=0)
    more = interleave([slow, fast], rounds=5, min_time_s=1.0, warmup=0, after=first)
    assert (more[0].n, more[1].n) == (20, 200) and more[0].rounds == 10


def test_timers_in_other_processes_take_turns_in_interleaved_rounds(tmp_path):
    script = tmp_path / "timers.py"
    script.write_text("import time\nfrom tfperf.measure import Timer, serve_timers\n"
                      "serve_timers([Timer(lambda: time.sleep(0.004), name='4 ms'),\n"
                      "              Timer(lambda: time.sleep(0.002), name='2 ms')], warmup=0)\n")
    with TimerServer([sys.executable, script]) as one, TimerServer([sys.executable, script]) as two:
        timers = [one.timer("4 ms", name="first process"), two.timer("2 ms", name="second process")]
        # 10 rounds: the median's interval over 6 spans every round, so one round in which the other worker's
        # load delayed the 2 ms process (a ratio of 0.73 in a fresh clone's run) made the verdict "no measurable
        # difference"; over 10 it rests on the 2nd to the 9th (0.1 s more)
        slow, fast = interleave(timers, rounds=10, samples=20)
        with pytest.raises(ValueError, match="no timer 'nope'"):
            one.timer("nope")
    assert slow.rounds == 10 and slow.n == 20 and slow.first_call_s is not None
    assert min(slow.samples_s) >= 0.004 and min(fast.samples_s) >= 0.002
    c = versus(slow, fast)
    assert c.paired and c.verdict == stats.FASTER and 1.3 < c.ratio < 2.5
    broken = tmp_path / "broken.py"
    broken.write_text("import sys\nsys.exit('no model here')\n")
    with pytest.raises(RuntimeError, match="no model here"):
        TimerServer([sys.executable, broken]).timer("any")


def test_a_timer_cluster_asks_all_its_processes_for_every_sample_and_lets_them_finish(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text("import sys, time, pathlib\nfrom tfperf.measure import Timer, serve_timers\n"
                      "rank = int(sys.argv[1]); calls = []\n"
                      "step = lambda: calls.append(time.sleep(0.001 if rank == 0 else 0.02))\n"
                      "serve_timers([Timer(step, name='step')], warmup=0)\n"
                      "time.sleep(0.3)  # work of its own after quit, like a cluster's last collectives\n"
                      f"pathlib.Path({str(tmp_path)!r}, f'rank{{rank}}').write_text(str(len(calls)))\n")
    with TimerCluster([TimerServer([sys.executable, script, rank]) for rank in (0, 1)]) as cluster:
        (m,) = interleave([cluster.timer("step", name="cluster")], rounds=6, samples=12)
    # Every process took every sample (and its first call); the chief's times are the ones returned.
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["13", "13"]
    assert m.n == 12 and m.median_s < 0.015
    broken = tmp_path / "broken.py"
    broken.write_text("import sys\nsys.exit('worker 1 lost')\n")
    with pytest.raises(RuntimeError, match="worker 1 lost"):
        with TimerCluster([TimerServer([sys.executable, script, 0]), TimerServer([sys.executable, broken])]) as c:
            c.timer("step")


def test_a_timer_cluster_whose_worker_dies_mid_step_fails_at_once_and_a_silent_one_at_its_deadline(tmp_path):
    # The chief's step hangs after its first call (as a collective does when a peer is gone); worker 1 dies.
    script = tmp_path / "worker.py"
    script.write_text("import sys, time\nfrom tfperf.measure import Timer, serve_timers\n"
                      "rank, calls = int(sys.argv[1]), []\n"
                      "def step():\n"
                      "    calls.append(1)\n"
                      "    if len(calls) > 1:\n"
                      "        time.sleep(60) if rank == 0 else sys.exit('worker 1: connection reset')\n"
                      "serve_timers([Timer(step, name='step')], warmup=0)\n")
    with TimerCluster([TimerServer([sys.executable, script, r], name=f"worker {r}", timeout=60)
                       for r in (0, 1)]) as cluster:
        step = cluster.timer("step")
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="worker 1 exited with 1: .*connection reset"):
            step.take(1)
        assert time.monotonic() - started < 10  # at once, not at the chief's 60 s deadline
        for p in cluster.processes:
            p.timeout = 1  # and let the hung chief go at close
    with TimerServer([sys.executable, script, 0], name="worker 0", timeout=60) as alone:
        step = alone.timer("step")
        alone.timeout = 1  # a deadline for the step alone (starting TensorFlow takes longer)
        with pytest.raises(RuntimeError, match="worker 0 gave no answer within 1 s"):
            step.take(1)


def test_benchmark_times_a_block_synced_and_prints_it_as_d2l_does(monkeypatch, capsys):
    synced = []
    monkeypatch.setattr("tfperf.measure.benchmark.sync", lambda devices=None: synced.append(devices))
    with tfperf.Benchmark("eager") as b:  # the d2l shape, from the package's face
        time.sleep(0.01)
    out = capsys.readouterr().out
    assert b.seconds >= 0.01 and out == f"eager: {b.seconds:.4f} sec\n"
    assert len(synced) == 2  # queued work is finished before the clock starts and before it stops
    assert b.measurement.samples_s == (b.seconds,) and b.measurement.name == "eager"
    kept = []
    with Benchmark("quiet", show=kept.append):
        pass
    assert capsys.readouterr().out == "" and kept[0].startswith("quiet: ")
    with pytest.raises(ValueError, match="not been timed"):
        Benchmark("never").measurement


def test_benchmark_run_returns_a_measurement_with_first_call_and_warmup_apart():
    calls = []
    m = Benchmark.run(lambda: calls.append(1), steps=7, warmup=3, name="graph")
    assert isinstance(m, Measurement) and m.name == "graph" and m.n == 7 and len(calls) == 1 + 3 + 7
    assert m.first_call_s is not None and m.ci95_s[0] <= m.median_s <= m.ci95_s[1] and m.p90_s <= m.p99_s

