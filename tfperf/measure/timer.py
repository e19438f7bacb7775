"""Timing that can be trusted: a `Timer` configured apart from the `Measurement` it returns.

A Timer calls a function once apart (tracing, compiling), warms up, then takes samples: one call per
clock read (latency mode) or blocks of calls with one device sync each (throughput mode), and stops
the clock when the work is done without copying results to the host. This is the one module of
tfperf.measure that uses TensorFlow, and only once the process has loaded it: a process that never
imported TensorFlow has no TensorFlow work to wait for, so timing NumPy, JAX or Python code (a timer
served by a child process, a JAX backend) does not pay seconds to import it.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.measure.measurement import Clock, Elapsed, Measurement
from tfperf.gpus import rate_block_size

CALIBRATION_TRIES = 3  # samples per candidate block size when block_size="auto"


def _loaded_tf():
    """TensorFlow, if this process has imported it; else None (then no TensorFlow work can be pending)."""
    return sys.modules.get("tensorflow")


def gpus_present() -> bool:
    """True when TensorFlow is loaded and sees at least one GPU."""
    tf = _loaded_tf()
    return bool(tf and tf.config.list_logical_devices("GPU"))


def device_sync_needed() -> bool:
    """True when TensorFlow ops can return before they ran: a GPU is present or eager execution is asynchronous."""
    tf = _loaded_tf()
    return bool(tf) and (gpus_present() or not tf.config.experimental.get_synchronous_execution())


def _leaves(value: Any) -> Iterator[Any]:
    """The leaves of nested lists, tuples and dicts (what a function returns)."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    elif value is not None:
        yield value


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
    tf = _loaded_tf()
    # sync_devices exists only in eager mode; it costs ~50 us on a CPU host, so it runs only when needed.
    if devices and tf is not None and tf.executing_eagerly():
        tf.test.experimental.sync_devices()
    for leaf in _leaves(result):
        wait = getattr(leaf, "block_until_ready", None)
        if callable(wait):
            wait()


def profiler_framework() -> str:
    """Whose profiler traces this process's work: "jax" when its Keras runs on JAX or JAX alone is loaded, else
    "tensorflow". Keras 3 on JAX may load TensorFlow too (for tf.data, or to seed its random numbers), and
    TensorFlow's profiler would then see none of the JAX work."""
    keras = sys.modules.get("keras")
    if "jax" in sys.modules and keras is not None and getattr(keras, "backend", None) is not None:
        if keras.backend.backend() == "jax":
            return "jax"
    return "jax" if "jax" in sys.modules and _loaded_tf() is None else "tensorflow"


def profiled(profile_dir: str | None, name: str) -> contextlib.AbstractContextManager:
    """A profiler trace of the enclosed block in profile_dir/<name>, or nothing when profile_dir is None.

    TensorFlow's or JAX's profiler, by `profiler_framework`: both write the XSpace files that
    `tfperf.measure.profiles` reads, and each sees only its own framework's work."""
    if profile_dir is None:
        return contextlib.nullcontext()
    # One folder per trace: traces are named by the second they start, so two in one second would
    # overwrite each other; TensorBoard shows each folder as a run.
    folder = str(Path(profile_dir) / run_name(name))
    if profiler_framework() == "jax":
        import jax

        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0  # as TensorFlow's default: Python calls would bury the ops
        return jax.profiler.trace(folder, profiler_options=options)
    import tensorflow as tf

    return tf.profiler.experimental.Profile(folder)


def step_marker(step: int) -> contextlib.AbstractContextManager:
    """Marks one step for the profiler's step-time and input-pipeline analyses, in the profiler `profiled` uses."""
    if profiler_framework() == "jax":
        import jax

        return jax.profiler.StepTraceAnnotation("train", step_num=step)
    import tensorflow as tf

    return tf.profiler.experimental.Trace("train", step_num=step, _r=1)


def run_name(name: str) -> str:
    """The folder a trace named `name` is written to (TensorBoard shows it as a run)."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "run"


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

    def first_call(self) -> Any:
        """The first call, timed apart (it traces and compiles: `first_call_s`); returns what it computed,
        so that a caller can check the answer of the very call that warmed the function up."""
        sync(devices=self._devices)  # work queued before must not be billed to the first call
        t0 = self.clock()
        out = self.fn()
        if not self._custom_sync:  # the first call may have been what loaded TensorFlow: decide again
            self._devices = device_sync_needed()
        if isinstance(out, Elapsed):
            self.sync_fn(out.result)
            self.first_call_s = out.seconds
            return out.result
        self.sync_fn(out)
        self.first_call_s = self.clock() - t0
        return out

    def start(self, warmup: int = 1) -> float:
        """The first call, timed apart (unless `first_call` made it), then `warmup` untimed calls; returns its time."""
        if warmup < 0:
            raise ValueError(f"warmup must be 0 or more, got {warmup}")
        if self.first_call_s is None:
            self.first_call()
        for _ in range(warmup):
            self.sync_fn(self.fn())
        if self.block_size == "auto":
            self.block_size = self._calibrate_block()
        return self.first_call_s

    def _calibrate_block(self) -> int:
        """The smallest power of two of calls whose block takes 100x the sync overhead (at least 1 ms)."""
        overhead_s = self.overhead_s()
        target = 1e-3 if overhead_s is None else max(1e-3, 100 * overhead_s)
        calls = 1
        while calls < 1 << 16:
            # The fastest of three: a block that was preempted once (another process, a GC pause)
            # looks long enough and would stop the doubling too early.
            if min(self._sample(calls) for _ in range(CALIBRATION_TRIES)) >= target:
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

    def profile(self, profile_dir: str | Path | None, *, steps: int = 10, mark_steps: bool = False) -> Path | None:
        """A profiler trace (`profiled`) of `steps` more samples in profile_dir/<name>, which it returns; nothing
        when profile_dir is None. `mark_steps` marks each sample as a profiler step (`Trace("train", step_num=i)`),
        which the profiler's step-time and input-pipeline analyses need."""
        if profile_dir is None:
            return None
        with profiled(str(profile_dir), self.name):
            if self.first_call_s is None:
                self.start()
            for i in range(steps):
                with step_marker(i) if mark_steps else contextlib.nullcontext():
                    self._sample(self.block_size)
        return Path(profile_dir) / run_name(self.name)

    def _measurement(self, samples: Sequence[float], *, rounds: int) -> Measurement:
        return Measurement(name=self.name, samples_s=tuple(float(s) for s in samples), block_size=int(self.block_size),
                           items_per_call=self.items_per_call, rounds=rounds, first_call_s=self.first_call_s,
                           overhead_s=self.overhead_s())


@contextlib.contextmanager
def synchronous_execution(enabled: bool) -> Iterator[None]:
    """Temporarily switch eager execution between synchronous and asynchronous."""
    import tensorflow as tf

    before = tf.config.experimental.get_synchronous_execution()
    sync(devices=True)
    tf.config.experimental.set_synchronous_execution(enabled)
    try:
        yield
    finally:
        sync(devices=True)
        tf.config.experimental.set_synchronous_execution(before)


def _matmul(n: int, dtype: Any, steps: int | None) -> Measurement:
    """An n x n x n matmul in a tf.function, measured."""
    import tensorflow as tf

    dtype = tf.as_dtype(dtype)
    a = tf.cast(tf.random.normal([n, n], dtype=tf.float32, seed=1), dtype)
    b = tf.cast(tf.random.normal([n, n], dtype=tf.float32, seed=2), dtype)
    matmul = tf.function(tf.linalg.matmul)
    block = rate_block_size(bool(tf.config.list_physical_devices("GPU")))
    return Timer(lambda: matmul(a, b), name=f"matmul{n}", block_size=block).measure(steps, warmup=2, min_time_s=0.1,
                                                                                    min_samples=5)


def matmul_flops_per_s(n: int = 1024, *, dtype: Any = "float32", steps: int | None = None) -> float:
    """Measured FLOP/s of an n x n x n matmul in a tf.function (at the median sample): the compute roof for
    dense layers."""
    return 2.0 * n**3 / _matmul(n, dtype, steps).median_s


def peak_matmul_flops_per_s(sizes: tuple[int, ...] = (512, 1024, 2048), *, dtype: Any = "float32",
                            steps: int | None = None) -> float:
    """The best matmul FLOP/s over a few sizes, each at its fastest sample: one size can miss the shape the
    library likes best, and a peak is what the machine can do, which interference (a neighbour's burst on a
    shared host) only lowers. At the median, one run's figure here fell to 68 GFLOP/s against 102-127 in others,
    and every MFU of that run rose by half."""
    return max(2.0 * n**3 / float(np.min(_matmul(n, dtype, steps).per_call_s)) for n in sizes)
