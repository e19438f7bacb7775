"""Timing that can be trusted: warm-up, first call apart, device sync, per-step samples."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

Clock = Callable[[], float]


def gpus_present() -> bool:
    """True when TensorFlow sees at least one GPU."""
    return bool(tf.config.list_logical_devices("GPU"))


def device_sync_needed() -> bool:
    """True when ops can return before they ran: a GPU is present or eager execution is asynchronous."""
    return gpus_present() or not tf.config.experimental.get_synchronous_execution()


def sync(result: Any = None, *, devices: bool | None = None) -> None:
    """Block until the work behind `result` (and, when needed, all queued device work) has finished."""
    # sync_devices costs ~50 us on a CPU host, more than some steps we time, so it runs
    # only where ops can still be pending (GPUs, asynchronous eager); it exists only in eager mode.
    if devices is None:
        devices = device_sync_needed()
    if devices and tf.executing_eagerly():
        tf.test.experimental.sync_devices()
    # Reading the value back is the last word: nothing can be pending once it is on the host.
    for leaf in tf.nest.flatten(result):
        if hasattr(leaf, "numpy"):
            leaf.numpy()


@dataclasses.dataclass(frozen=True)
class BenchmarkResult:
    """One measured function: the first call, and the steady-state per-step samples (seconds)."""

    name: str
    steps: int
    items_per_step: int
    first_call_s: float | None
    mean_s: float
    std_s: float
    min_s: float
    median_s: float
    p90_s: float
    p99_s: float
    max_s: float
    items_per_s: float
    samples_s: tuple[float, ...] = dataclasses.field(repr=False)

    @classmethod
    def from_samples(
        cls,
        name: str,
        samples_s: Sequence[float],
        *,
        items_per_step: int = 1,
        first_call_s: float | None = None,
    ) -> BenchmarkResult:
        """Summarise per-step samples with true percentiles (np.percentile, no trimming)."""
        if len(samples_s) == 0:
            raise ValueError(f"benchmark {name!r} has no samples: steps must be at least 1")
        if items_per_step < 1:
            raise ValueError(f"items_per_step must be at least 1, got {items_per_step}")
        s = np.asarray(samples_s, dtype=np.float64)
        p50, p90, p99 = np.percentile(s, [50, 90, 99])
        mean = float(s.mean())
        return cls(
            name=name,
            steps=len(s),
            items_per_step=items_per_step,
            first_call_s=first_call_s,
            mean_s=mean,
            std_s=float(s.std()),
            min_s=float(s.min()),
            median_s=float(p50),
            p90_s=float(p90),
            p99_s=float(p99),
            max_s=float(s.max()),
            # The median resists the shared machine's noise better than the mean.
            items_per_s=items_per_step / float(p50) if p50 > 0 else float("inf"),
            samples_s=tuple(float(v) for v in s),
        )

    @property
    def median_per_item_s(self) -> float:
        """Median step time divided by the items in a step."""
        return self.median_s / self.items_per_step

    def to_dict(self, *, with_samples: bool = False) -> dict[str, Any]:
        """The summary as a plain dict (samples only when asked: they can be long)."""
        d = dataclasses.asdict(self)
        if not with_samples:
            d.pop("samples_s")
        return d


def profiled(profile_dir: str | None, name: str) -> contextlib.AbstractContextManager:
    """A TensorBoard profiler trace of the enclosed block in profile_dir/<name>, or nothing when profile_dir is None."""
    if profile_dir is None:
        return contextlib.nullcontext()
    # One folder per measurement: traces are named by the second they start, so two in one
    # second would overwrite each other; TensorBoard shows each folder as a run.
    run = re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-") or "run"
    return tf.profiler.experimental.Profile(str(Path(profile_dir) / run))


class Benchmark:
    """Times code: `Benchmark.run(fn, ...)` for per-step samples, `with Benchmark(name):` for a block."""

    def __init__(self, name: str = "block", *, items: int = 1, clock: Clock = time.perf_counter):
        if items < 1:
            raise ValueError(f"items must be at least 1, got {items}")
        self.name = name
        self.items = items
        self._clock = clock
        self._start: float | None = None
        self.result: BenchmarkResult | None = None

    def __enter__(self) -> Benchmark:
        sync()  # work queued before the block must not be billed to it
        self._start = self._clock()
        return self

    def __exit__(self, *exc: object) -> None:
        sync()
        elapsed = self._clock() - self._start
        self.result = BenchmarkResult.from_samples(self.name, [elapsed], items_per_step=self.items)

    @staticmethod
    def run(
        fn: Callable[[], Any],
        *,
        steps: int,
        warmup: int = 1,
        name: str | None = None,
        items_per_step: int = 1,
        clock: Clock = time.perf_counter,
        sync_fn: Callable[[Any], None] | None = None,
        profile_dir: str | None = None,
    ) -> BenchmarkResult:
        """Call `fn` once (timed apart: tracing, compiling), `warmup` times untimed, then `steps` times timed.

        `fn` should return what it computed, so that the clock stops only when that is ready.
        """
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        if warmup < 0:
            raise ValueError(f"warmup must be 0 or more, got {warmup}")
        name = name or getattr(fn, "__name__", "fn")
        if sync_fn is None:
            devices = device_sync_needed()  # decided once: the check itself costs microseconds

            def sync_fn(result: Any) -> None:
                sync(result, devices=devices)

        sync(devices=True)
        t0 = clock()
        sync_fn(fn())
        first_call_s = clock() - t0
        for _ in range(warmup):
            sync_fn(fn())
        samples = []
        with profiled(profile_dir, name):
            for _ in range(steps):
                t0 = clock()
                out = fn()
                sync_fn(out)
                samples.append(clock() - t0)
        return BenchmarkResult.from_samples(
            name, samples, items_per_step=items_per_step, first_call_s=first_call_s
        )


@contextlib.contextmanager
def synchronous_execution(enabled: bool) -> Iterator[None]:
    """Temporarily switch eager execution between synchronous and asynchronous."""
    before = tf.config.experimental.get_synchronous_execution()
    sync()
    tf.config.experimental.set_synchronous_execution(enabled)
    try:
        yield
    finally:
        sync()
        tf.config.experimental.set_synchronous_execution(before)


def matmul_flops_per_s(
    n: int = 1024, *, dtype: tf.DType = tf.float32, steps: int = 10, warmup: int = 2
) -> float:
    """Measured FLOP/s of an n x n x n matmul in a tf.function: the compute roof for dense layers."""
    a = tf.random.normal([n, n], dtype=tf.float32, seed=1)
    a = tf.cast(a, dtype)
    b = tf.cast(tf.random.normal([n, n], dtype=tf.float32, seed=2), dtype)
    matmul = tf.function(tf.linalg.matmul)
    r = Benchmark.run(lambda: matmul(a, b), steps=steps, warmup=warmup, name=f"matmul{n}")
    return 2.0 * n**3 / r.median_s


def peak_matmul_flops_per_s(sizes: tuple[int, ...] = (512, 1024, 2048), *, dtype: tf.DType = tf.float32,
                            steps: int = 10) -> float:
    """The best matmul FLOP/s over a few sizes: one size can miss the shape the library likes best."""
    return max(matmul_flops_per_s(n, dtype=dtype, steps=steps) for n in sizes)


def timing_ms(result: BenchmarkResult) -> dict[str, float | None]:
    """The usual columns of a timing table, in milliseconds per step."""
    return {
        "first_call_ms": None if result.first_call_s is None else result.first_call_s * 1e3,
        "median_ms": result.median_s * 1e3,
        "p90_ms": result.p90_s * 1e3,
        "p99_ms": result.p99_s * 1e3,
    }
