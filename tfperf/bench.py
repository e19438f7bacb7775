"""Timing that can be trusted: a `Timer` configured apart from the `Measurement` it returns.

A Timer calls a function once apart (tracing, compiling), warms up, then takes samples: one call per
clock read (latency mode) or blocks of calls with one device sync each (throughput mode). A
Measurement keeps the raw samples and knows its median, IQR, percentiles, the confidence interval of
its median and whether it is stable. `interleave` measures alternatives in shuffled rounds in one
process, so that a drift of the machine hits them all alike, and `versus` turns two Measurements into
a speedup with a bootstrap confidence interval and a verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from tfperf import stats

Clock = Callable[[], float]
LATENCY, THROUGHPUT = "latency", "throughput"


def gpus_present() -> bool:
    """True when TensorFlow sees at least one GPU."""
    return bool(tf.config.list_logical_devices("GPU"))


def device_sync_needed() -> bool:
    """True when ops can return before they ran: a GPU is present or eager execution is asynchronous."""
    return gpus_present() or not tf.config.experimental.get_synchronous_execution()


def sync(result: Any = None, *, devices: bool | None = None) -> None:
    """Block until the work behind `result` has finished, without copying it to the host.

    On a CPU with synchronous eager execution (TensorFlow's default) an op or a tf.function returns
    only once its outputs are computed, so there is nothing to wait for. Where ops can return early
    (GPUs, asynchronous eager) `sync_devices` waits for every queued kernel. Results that know how to
    wait for themselves (JAX arrays' `block_until_ready`) are waited on. Nothing is read back: a
    host copy of the output would be timed as if it were the work.
    """
    if devices is None:
        devices = device_sync_needed()
    # sync_devices exists only in eager mode; it costs ~50 us on a CPU host, so it runs only when needed.
    if devices and tf.executing_eagerly():
        tf.test.experimental.sync_devices()
    for leaf in tf.nest.flatten(result):
        wait = getattr(leaf, "block_until_ready", None)
        if callable(wait):
            wait()


@dataclasses.dataclass(frozen=True)
class Elapsed:
    """What a timed function returns when only part of its call is the work: `fit` for one epoch
    returns the epoch's own time (from a callback), without the data adapter and callbacks it sets up."""

    seconds: float
    result: Any = None


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Raw samples of one timed function and what they say; times are seconds per call unless named per item.

    `samples_s` holds one clock reading per sample: one call in latency mode, `block_size` calls in
    throughput mode. With `rounds` > 1 the samples were taken in that many interleaved rounds, an
    equal number in each, in order.
    """

    name: str
    samples_s: tuple[float, ...]
    block_size: int = 1
    items_per_call: int = 1
    rounds: int = 1
    first_call_s: float | None = None
    overhead_s: float | None = None  # the sync and the clock read, per sample, timed on a null function

    def __post_init__(self):
        if len(self.samples_s) == 0:
            raise ValueError(f"measurement {self.name!r} has no samples: steps must be at least 1")
        if self.block_size < 1 or self.items_per_call < 1:
            raise ValueError(f"block_size and items_per_call must be at least 1, got "
                             f"{self.block_size} and {self.items_per_call}")
        if self.rounds < 1 or len(self.samples_s) % self.rounds:
            raise ValueError(f"{len(self.samples_s)} samples do not split into {self.rounds} equal rounds")

    @property
    def mode(self) -> str:
        """'latency' (one call per clock read) or 'throughput' (blocks of calls)."""
        return LATENCY if self.block_size == 1 else THROUGHPUT

    @property
    def n(self) -> int:
        """Number of samples."""
        return len(self.samples_s)

    @property
    def per_call_s(self) -> np.ndarray:
        """Each sample as seconds per call."""
        return np.asarray(self.samples_s, dtype=np.float64) / self.block_size

    @property
    def per_item_s(self) -> np.ndarray:
        """Each sample as seconds per item (a row, an example)."""
        return self.per_call_s / self.items_per_call

    def percentile_s(self, q: float) -> float:
        """A true percentile of the per-call times (np.percentile, nothing trimmed)."""
        return float(np.percentile(self.per_call_s, q))

    @property
    def median_s(self) -> float:
        return self.percentile_s(50)

    @property
    def p90_s(self) -> float:
        return self.percentile_s(90)

    @property
    def p99_s(self) -> float:
        return self.percentile_s(99)

    @property
    def min_s(self) -> float:
        return float(self.per_call_s.min())

    @property
    def max_s(self) -> float:
        return float(self.per_call_s.max())

    @property
    def mean_s(self) -> float:
        return float(self.per_call_s.mean())

    @property
    def iqr_s(self) -> float:
        """Interquartile range of the per-call times."""
        q1, q3 = np.percentile(self.per_call_s, [25, 75])
        return float(q3 - q1)

    @property
    def ci95_s(self) -> tuple[float, float]:
        """95% confidence interval of the median time per call (order statistics, distribution-free)."""
        return stats.median_ci(self.per_call_s)

    @property
    def median_per_item_s(self) -> float:
        """Median time per call divided by the items in a call."""
        return self.median_s / self.items_per_call

    @property
    def items_per_s(self) -> float:
        """Items per second at the median time."""
        return self.items_per_call / self.median_s if self.median_s > 0 else float("inf")

    @property
    def relative_iqr(self) -> float:
        """IQR over median: the spread that makes a measurement untrustworthy when large."""
        return self.iqr_s / self.median_s if self.median_s > 0 else float("inf")

    @property
    def warnings(self) -> tuple[str, ...]:
        """Reasons not to trust this measurement, in words (empty when there are none)."""
        found = []
        if self.n >= 4 and self.relative_iqr > stats.UNSTABLE_IQR:
            found.append(f"unstable: IQR is {self.relative_iqr:.0%} of the median (over "
                         f"{stats.UNSTABLE_IQR:.0%}): more samples, or a quieter machine")
        if self.n < 6:
            found.append(f"only {self.n} samples: the 95% CI of the median is the whole range")
        if self.overhead_s is not None and self.overhead_s > 0.1 * self.median_s * self.block_size:
            found.append(f"sync and clock overhead ({self.overhead_s * 1e6:.1f} us) is over 10% of a sample: "
                         f"time blocks of calls (throughput mode)")
        return tuple(found)

    def summary(self) -> dict[str, Any]:
        """The figures a record keeps beside the raw samples."""
        return {"n": self.n, "block_size": self.block_size, "rounds": self.rounds, "mode": self.mode,
                "first_call_s": self.first_call_s, "overhead_s": self.overhead_s,
                "median_s": self.median_s, "iqr_s": self.iqr_s, "p90_s": self.p90_s, "p99_s": self.p99_s,
                "ci95_s": list(self.ci95_s), "warnings": list(self.warnings)}

    def __str__(self) -> str:
        low, high = self.ci95_s
        return (f"{self.name}: median {_time(self.median_s)} (95% CI {_time(low)}-{_time(high)}), "
                f"IQR {_time(self.iqr_s)}, n={self.n}{' x ' + str(self.block_size) if self.block_size > 1 else ''}"
                + "".join(f"\n  WARNING: {w}" for w in self.warnings))


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def versus(baseline: Measurement, candidate: Measurement, *, threshold: float = 0.0,
           seed: int = 0) -> stats.Comparison:
    """How many times faster `candidate` is than `baseline` per item, with a bootstrap 95% CI and a verdict.

    Measurements taken by the same `interleave` (the same rounds) are compared round by round.
    """
    paired = baseline.rounds > 1 and baseline.rounds == candidate.rounds
    return stats.compare_times(baseline.per_item_s, candidate.per_item_s, names=(baseline.name, candidate.name),
                               rounds=baseline.rounds if paired else None, threshold=threshold, seed=seed)


def profiled(profile_dir: str | None, name: str) -> contextlib.AbstractContextManager:
    """A TensorBoard profiler trace of the enclosed block in profile_dir/<name>, or nothing when profile_dir is None."""
    if profile_dir is None:
        return contextlib.nullcontext()
    # One folder per trace: traces are named by the second they start, so two in one second would
    # overwrite each other; TensorBoard shows each folder as a run.
    run = re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "run"
    return tf.profiler.experimental.Profile(str(Path(profile_dir) / run))


_OVERHEAD: dict[tuple[bool, int], float] = {}


def sync_overhead_s(devices: bool, block_size: int = 1) -> float:
    """What a sample costs when the function does nothing: two clock reads and the sync (cached per process)."""
    key = (devices, block_size)
    if key not in _OVERHEAD:
        noop = lambda: None  # noqa: E731
        samples = []
        for _ in range(200):
            t0 = time.perf_counter()
            for _ in range(block_size):
                noop()
            sync(None, devices=devices)
            samples.append(time.perf_counter() - t0)
        _OVERHEAD[key] = float(np.median(samples))
    return _OVERHEAD[key]


class Timer:
    """Times `fn`, which should return what it computed so that the clock can wait for it.

    Args:
        items_per_call: examples (rows, samples) one call processes, for per-item figures.
        block_size: calls per clock read. 1 is latency mode (sync after every call); K > 1 is
            throughput mode (K calls queued back to back, one sync): per-call overhead that a
            pipeline would hide is then hidden here too. "auto" picks K so that a block takes at
            least 100 times the sync overhead.
        sync_fn: how to wait for a result; default `sync` without a host copy.
    """

    def __init__(self, fn: Callable[[], Any], *, name: str | None = None, items_per_call: int = 1,
                 block_size: int | str = 1, sync_fn: Callable[[Any], None] | None = None,
                 clock: Clock = time.perf_counter):
        if items_per_call < 1:
            raise ValueError(f"items_per_call must be at least 1, got {items_per_call}")
        if block_size != "auto" and (not isinstance(block_size, int) or block_size < 1):
            raise ValueError(f"block_size must be a positive integer or 'auto', got {block_size!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "fn")
        self.items_per_call = items_per_call
        self.block_size = block_size
        self.clock = clock
        self._custom_sync = sync_fn is not None
        self._devices = device_sync_needed()  # decided once: the check itself costs microseconds
        self.sync_fn = sync_fn or (lambda result: sync(result, devices=self._devices))
        self.first_call_s: float | None = None

    def _sample(self, calls: int) -> float:
        t0 = self.clock()
        out = None
        for _ in range(calls):
            out = self.fn()
        if isinstance(out, Elapsed):
            if calls != 1:
                raise ValueError(f"{self.name}: a function that times itself (Elapsed) needs block_size 1")
            self.sync_fn(out.result)
            return out.seconds
        self.sync_fn(out)
        return self.clock() - t0

    def start(self, warmup: int = 1) -> float:
        """The first call, timed apart (it traces and compiles), then `warmup` untimed calls; returns its time."""
        if warmup < 0:
            raise ValueError(f"warmup must be 0 or more, got {warmup}")
        if self.first_call_s is None:
            sync(devices=self._devices)  # work queued before must not be billed to the first call
            self.first_call_s = self._sample(1)
        for _ in range(warmup):
            self.sync_fn(self.fn())
        if self.block_size == "auto":
            self.block_size = self._calibrate_block()
        return self.first_call_s

    def _calibrate_block(self) -> int:
        """The smallest power of two of calls whose block takes 100x the sync overhead (at least 1 ms)."""
        target = max(1e-3, 100 * self.overhead_s())
        calls = 1
        while calls < 1 << 16:
            if self._sample(calls) >= target:
                break
            calls *= 2
        return calls

    def overhead_s(self) -> float | None:
        """The sync and clock cost per sample, or None when a custom sync or clock makes it unknowable."""
        if self._custom_sync or self.clock is not time.perf_counter:
            return None
        return sync_overhead_s(self._devices, 1)

    def take(self, samples: int) -> list[float]:
        """`samples` clock readings of `block_size` calls each (after `start`)."""
        if self.first_call_s is None:
            self.start()
        return [self._sample(self.block_size) for _ in range(samples)]

    def measure(self, steps: int | None = None, *, warmup: int = 1, min_time_s: float = 0.2,
                min_samples: int = 10, max_samples: int = 100_000, profile_dir: str | None = None,
                profile_steps: int = 10) -> Measurement:
        """The first call, warm-up, then `steps` samples; with steps=None, samples until `min_time_s` has passed.

        `profile_dir` traces a separate pass after the samples are taken: a profiler slows what it
        watches, so its steps are never the recorded ones.
        """
        if steps is not None and steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        self.start(warmup)
        if steps is not None:
            samples = self.take(steps)
        else:
            samples, spent = [], 0.0
            while len(samples) < max_samples and (spent < min_time_s or len(samples) < min_samples):
                samples.append(self._sample(self.block_size))
                spent += samples[-1]
        self.profile(profile_dir, steps=profile_steps)
        return self._measurement(samples, rounds=1)

    def profile(self, profile_dir: str | None, *, steps: int = 10) -> None:
        """A TensorBoard trace of `steps` more samples in profile_dir/<name>; nothing when profile_dir is None."""
        if profile_dir is None:
            return
        with profiled(profile_dir, self.name):
            self.take(steps)

    def _measurement(self, samples: Sequence[float], *, rounds: int) -> Measurement:
        return Measurement(name=self.name, samples_s=tuple(float(s) for s in samples), block_size=int(self.block_size),
                           items_per_call=self.items_per_call, rounds=rounds, first_call_s=self.first_call_s,
                           overhead_s=self.overhead_s())


def interleave(timers: Sequence[Timer], *, rounds: int = 10, samples: int | None = None,
               warmup: int = 1, min_time_s: float = 0.5, seed: int = 0,
               profile_dir: str | None = None, profile_steps: int = 10,
               after: Sequence[Measurement] = ()) -> list[Measurement]:
    """Measure alternatives in `rounds` rounds; each round takes a share of every timer's samples, the
    timers in a shuffled order, so that slow phases of the machine fall on all of them alike.

    `samples` is each timer's total (rounded up to whole rounds); with None, each timer takes as many
    as fill about `min_time_s`, estimated from three calls after its warm-up. Compare the results with
    `versus`, which pairs them round by round. `after` continues earlier measurements of the same
    timers (from interleave, in the same order; with `samples` None, at the same share per round):
    their rounds come first in what is returned.
    """
    if not timers:
        raise ValueError("interleave needs at least one timer")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if samples is not None and samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    names = [t.name for t in timers]
    if len(set(names)) != len(names):
        raise ValueError(f"timers need distinct names, got {names}")
    if after and [m.name for m in after] != names:
        raise ValueError(f"`after` must hold the same timers' measurements in order, got {[m.name for m in after]}")
    for t in timers:
        t.start(warmup)
    if samples is not None:
        per_round = [-(-samples // rounds)] * len(timers)
    elif after:  # the same share per round as before, so that every round weighs the same
        per_round = [m.n // m.rounds for m in after]
    else:
        per_round = [max(1, round(min_time_s / rounds / max(float(np.median(t.take(3))), 1e-9))) for t in timers]
    rng = np.random.default_rng(seed)
    taken: list[list[float]] = [[] for _ in timers]
    for _ in range(rounds):
        for i in rng.permutation(len(timers)):
            taken[i].extend(timers[i].take(per_round[i]))
    for t in timers:
        t.profile(profile_dir, steps=profile_steps)
    if after:
        return [t._measurement([*m.samples_s, *s], rounds=m.rounds + rounds) for t, m, s in zip(timers, after, taken)]
    return [t._measurement(s, rounds=rounds) for t, s in zip(timers, taken)]


def race(timers: Sequence[Timer], *, rounds: int, samples: int | None = None, threshold: float = 0.0,
         max_extensions: int = 2, seed: int = 0, warmup: int = 1, min_time_s: float = 0.5,
         profile_dir: str | None = None, profile_steps: int = 10,
         on_first_rounds: Callable[[list[Measurement]], None] | None = None,
         ) -> tuple[list[Measurement], list[stats.Comparison]]:
    """Interleave the timers and compare each with the first (`versus`); while a comparison's CI
    straddles a verdict's bar (not `decided`), run `rounds` more rounds of all, at most
    `max_extensions` times: a gain near the bar is then settled by more data, not by which side one
    run's noise fell on. `on_first_rounds` sees the measurements before any extension (a training
    race reads its losses there, after the same epochs for everyone). Returns the measurements and
    the comparisons of timers[1:] against timers[0]."""
    ms = interleave(timers, rounds=rounds, samples=samples, warmup=warmup, min_time_s=min_time_s, seed=seed,
                    profile_dir=profile_dir, profile_steps=profile_steps)
    if on_first_rounds is not None:
        on_first_rounds(ms)
    compare = lambda found: [versus(found[0], m, threshold=threshold) for m in found[1:]]  # noqa: E731
    comparisons = compare(ms)
    for extension in range(1, max_extensions + 1):
        if all(c.decided for c in comparisons):
            break
        ms = interleave(timers, rounds=rounds, samples=samples, warmup=0, min_time_s=min_time_s,
                        seed=seed + extension, after=ms)
        comparisons = compare(ms)
    return ms, comparisons


def one_after_another(measurements: Sequence[Measurement], *, name: str) -> Measurement:
    """What running the measured calls one after another costs: their per-call samples summed sample by
    sample. They must come from the same `interleave` (equal counts, the same rounds), so that each sum
    adds times taken in the same phase of the machine."""
    counts = {(m.n, m.rounds) for m in measurements}
    if len(counts) != 1:
        raise ValueError(f"cannot add samples of different counts or rounds: {sorted(counts)}")
    total = np.sum([m.per_call_s for m in measurements], axis=0)
    return Measurement(name=name, samples_s=tuple(float(t) for t in total), rounds=measurements[0].rounds)


def fresh_processes(argv: Sequence[str], runs: int, *, timeout: float = 600) -> dict[str, Measurement]:
    """Run `argv` `runs` times, each in a fresh process, one after another (pyperf's way of timing what
    happens once per process: imports, loading, a first call). Each run prints a JSON object of named
    times in seconds as its last line; the result holds one Measurement per name.
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    taken: dict[str, list[float]] = {}
    for _ in range(runs):
        done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"{Path(str(argv[0])).name} exited with {done.returncode}: {tail or 'no output'}")
        try:
            times = json.loads(lines[-1])
        except json.JSONDecodeError:
            raise RuntimeError(f"the last line of a fresh run is not JSON: {lines[-1][:200]!r}") from None
        for name, seconds in times.items():
            taken.setdefault(name, []).append(float(seconds))
    return {name: Measurement(name=name, samples_s=tuple(samples)) for name, samples in taken.items()}


# Timers in other processes ----------------------------------------------------------------------
# What is fixed when a process starts (thread pools, a Keras backend) can only be compared across
# processes. Each such process keeps its timers ready and takes samples when asked, one process at a
# time, so `interleave` runs them in shuffled rounds like timers of one process: a slow phase of the
# machine falls on all of them, and the comparison is paired by rounds.

_PROTOCOL = "TIMER "  # prefix of the lines a timer process answers with (a model may print too)
_ENDED = object()  # what the reader of a timer process's answers puts last, when its output ends


def serve_timers(timers: Sequence[Timer], *, warmup: int = 1, lines=None, reply=None) -> None:
    """The timer process's side: start each timer, say so, then answer `take NAME N` with N samples of
    NAME until `quit` or the end of input. `lines` and `reply` default to stdin and stdout."""
    import sys

    lines = lines if lines is not None else sys.stdin
    reply = reply or (lambda text: print(text, flush=True))
    by_name = {t.name: t for t in timers}
    for t in timers:
        t.start(warmup)
    reply(_PROTOCOL + json.dumps({t.name: {"first_call_s": t.first_call_s, "overhead_s": t.overhead_s(),
                                           "block_size": int(t.block_size), "items_per_call": t.items_per_call}
                                  for t in timers}))
    for line in lines:
        words = line.split()
        if not words or words[0] == "quit":
            return
        name, count = " ".join(words[1:-1]), int(words[-1])
        reply(_PROTOCOL + json.dumps(by_name[name].take(count)))


class TimerProcess:
    """A process started with `argv` that serves timers (`serve_timers`); `timer` gives their stand-ins
    here, for `interleave`. Use it as a context manager: the process ends with it.

    Args:
        timeout: seconds to wait for any one answer (and for the process to end after `quit`).
        name: what messages call it (default: the script it runs).
    """

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600,
                 name: str | None = None):
        self.argv = [str(a) for a in argv]
        self.timeout = timeout
        self.name = name or next((Path(a).name for a in self.argv if a.endswith(".py")), Path(self.argv[0]).name)
        # stderr to a file: a pipe nobody reads while the process logs would fill and stall it.
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errors, text=True, env=env)
        # Answers are read by a thread, so that waiting for one can give up at a deadline, or when
        # another process it depends on (a worker of the same cluster) has failed.
        self._answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_answers, daemon=True).start()
        self._ready: dict[str, dict] | None = None

    def timer(self, remote: str, name: str | None = None, *, peers: Sequence[TimerProcess] = ()) -> ProcessTimer:
        """A stand-in here for the process's timer `remote`, named `name` (default the same), waiting
        for the process to be ready. Start several processes before asking: they start side by side."""
        if self._ready is None:
            self._ready = self._answer(peers)
        if remote not in self._ready:
            raise ValueError(f"the timer process has no timer {remote!r}; it has {sorted(self._ready)}")
        return ProcessTimer(self, remote, name=name or remote, **self._ready[remote])

    def _read_answers(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(_PROTOCOL):
                self._answers.put(json.loads(line[len(_PROTOCOL):]))
        self._answers.put(_ENDED)

    def _answer(self, peers: Sequence[TimerProcess] = ()) -> Any:
        """The next answer; RuntimeError when this process or one of `peers` ends without it, or when
        none comes within `timeout`."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                answer = self._answers.get(timeout=0.2)
            except queue.Empty:
                for p in peers:
                    if p is not self and p.proc.poll() not in (None, 0):
                        p._fail()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} gave no answer within {self.timeout:.0f} s") from None
                continue
            if answer is _ENDED:
                self._fail()
            return answer

    def _fail(self) -> None:
        """Raise what ended the process: its exit code and the last lines of its stderr."""
        self.proc.wait(timeout=self.timeout)
        self.errors.seek(0)
        tail = " | ".join(self.errors.read().strip().splitlines()[-3:])
        raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {tail or 'no output'}")

    def take(self, name: str, samples: int) -> list[float]:
        """`samples` samples of the timer `name`, taken in the process while this one waits."""
        self.ask(name, samples)
        return self.samples()

    def ask(self, name: str, samples: int) -> None:
        """Ask for `samples` samples of the timer `name` without waiting for them (see `samples`)."""
        try:
            self.proc.stdin.write(f"take {name} {samples}\n")
            self.proc.stdin.flush()
        except OSError:  # it has ended: `samples` says how, from its stderr
            pass

    def samples(self, peers: Sequence[TimerProcess] = ()) -> list[float]:
        """The samples last asked for, once the process has taken them (see `_answer` for `peers`)."""
        return [float(s) for s in self._answer(peers)]

    def close(self) -> None:
        """Ask the process to end, and make sure it does: it may finish work of its own after `quit`
        (a cluster's last collectives), for up to `timeout` seconds."""
        self.quit()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.errors.close()

    def quit(self) -> None:
        """Say `quit` (the end of input) without waiting for the process to end."""
        if not self.proc.stdin.closed:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except OSError:  # it has already ended
                pass

    def __enter__(self) -> TimerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TimerCluster:
    """Timer processes that take every sample together, as the workers of one cluster must (each step
    is a collective): all are asked at once, and the first one's samples (the chief's) count."""

    def __init__(self, processes: Sequence[TimerProcess]):
        if not processes:
            raise ValueError("a timer cluster needs at least one process")
        self.processes = list(processes)

    def timer(self, remote: str, name: str | None = None) -> ProcessTimer:
        """A stand-in here for the timer `remote` that every process serves, once all are ready."""
        stand_ins = [p.timer(remote, name, peers=self.processes) for p in self.processes]
        return ProcessTimer(self, remote, name=stand_ins[0].name, first_call_s=stand_ins[0].first_call_s,
                            overhead_s=stand_ins[0].overhead_s(), block_size=stand_ins[0].block_size,
                            items_per_call=stand_ins[0].items_per_call)

    def take(self, name: str, samples: int) -> list[float]:
        for p in self.processes:
            p.ask(name, samples)
        taken = [p.samples(peers=self.processes) for p in self.processes]
        return taken[0]

    def close(self) -> None:
        """Ask every process to end (all at once: a cluster's last collectives need them all), and wait."""
        for p in self.processes:
            p.quit()
        for p in self.processes:
            p.close()

    def __enter__(self) -> TimerCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProcessTimer:
    """A Timer served by a TimerProcess: what `interleave` needs of a Timer (start, take, profile)."""

    def __init__(self, process: TimerProcess | TimerCluster, remote: str, *, name: str, first_call_s: float | None,
                 overhead_s: float | None, block_size: int, items_per_call: int):
        self.process, self.remote, self.name = process, remote, name
        self.first_call_s, self._overhead_s = first_call_s, overhead_s
        self.block_size, self.items_per_call = block_size, items_per_call

    def start(self, warmup: int = 1) -> float | None:
        """Nothing to do: the process started and warmed its timers before it said it was ready."""
        return self.first_call_s

    def take(self, samples: int) -> list[float]:
        return self.process.take(self.remote, samples)

    def overhead_s(self) -> float | None:
        return self._overhead_s

    def profile(self, profile_dir: str | None, *, steps: int = 10) -> None:
        if profile_dir is not None:
            raise ValueError(f"{self.name}: a timer in another process cannot be profiled from here")

    def _measurement(self, samples: Sequence[float], *, rounds: int) -> Measurement:
        return Measurement(name=self.name, samples_s=tuple(float(s) for s in samples), block_size=self.block_size,
                           items_per_call=self.items_per_call, rounds=rounds, first_call_s=self.first_call_s,
                           overhead_s=self._overhead_s)


@contextlib.contextmanager
def synchronous_execution(enabled: bool) -> Iterator[None]:
    """Temporarily switch eager execution between synchronous and asynchronous."""
    before = tf.config.experimental.get_synchronous_execution()
    sync(devices=True)
    tf.config.experimental.set_synchronous_execution(enabled)
    try:
        yield
    finally:
        sync(devices=True)
        tf.config.experimental.set_synchronous_execution(before)


def matmul_flops_per_s(n: int = 1024, *, dtype: tf.DType = tf.float32, steps: int | None = None) -> float:
    """Measured FLOP/s of an n x n x n matmul in a tf.function: the compute roof for dense layers."""
    a = tf.cast(tf.random.normal([n, n], dtype=tf.float32, seed=1), dtype)
    b = tf.cast(tf.random.normal([n, n], dtype=tf.float32, seed=2), dtype)
    matmul = tf.function(tf.linalg.matmul)
    m = Timer(lambda: matmul(a, b), name=f"matmul{n}").measure(steps, warmup=2, min_time_s=0.1, min_samples=5)
    return 2.0 * n**3 / m.median_s


def peak_matmul_flops_per_s(sizes: tuple[int, ...] = (512, 1024, 2048), *, dtype: tf.DType = tf.float32,
                            steps: int | None = None) -> float:
    """The best matmul FLOP/s over a few sizes: one size can miss the shape the library likes best."""
    return max(matmul_flops_per_s(n, dtype=dtype, steps=steps) for n in sizes)


def timing_ms(m: Measurement) -> dict[str, float | None]:
    """The usual columns of a timing table, in milliseconds per call."""
    return {
        "first_call_ms": None if m.first_call_s is None else m.first_call_s * 1e3,
        "median_ms": m.median_s * 1e3,
        "p90_ms": m.p90_s * 1e3,
        "p99_ms": m.p99_s * 1e3,
    }
