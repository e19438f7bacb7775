"""`Benchmark`: the friendly face of `Timer`, in the shape the d2l book gave it.

    with Benchmark("eager"):           # times the block, waits for the devices, prints "eager: 0.0123 sec"
        for _ in range(100):
            y = net(x)

    m = Benchmark.run(lambda: graph(x), steps=100, warmup=10)   # a Measurement: median, p90, p99, CI
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tfperf.measure.measurement import Measurement
from tfperf.measure.timer import Timer, device_sync_needed, sync


class Benchmark:
    """Times a `with` block, synced: work queued on a GPU (or by asynchronous eager) is finished before
    the clock stops. The block's time is kept in `seconds` and as a one-sample `measurement`, and
    printed as `description: 0.1234 sec` through `show` (None prints nothing).

    `Benchmark.run(fn, steps=..., warmup=...)` times a function properly (first call apart, warm-up,
    many samples) and returns the Measurement.
    """

    def __init__(self, description: str = "Done", *, show: Callable[[str], Any] | None = print):
        self.description = description
        self.show = show
        self.seconds: float | None = None
        self._started: float | None = None

    def __enter__(self) -> Benchmark:
        self._devices = device_sync_needed()
        sync(devices=self._devices)  # work queued before the block is not the block's
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        sync(devices=self._devices)
        self.seconds = time.perf_counter() - self._started
        if self.show is not None and exc[0] is None:
            self.show(f"{self.description}: {self.seconds:.4f} sec")

    @property
    def measurement(self) -> Measurement:
        """The block's time as a Measurement of one sample (its CI is the sample itself)."""
        if self.seconds is None:
            raise ValueError(f"{self.description!r} has not been timed yet: use it as `with Benchmark(...):`")
        return Measurement(name=self.description, samples_s=(self.seconds,))

    @classmethod
    def run(cls, fn: Callable[[], Any], *, steps: int | None = None, warmup: int = 1, name: str | None = None,
            items_per_call: int = 1, block_size: int | str = 1) -> Measurement:
        """`fn` timed by a Timer: the first call apart, `warmup` calls, then `steps` samples (None:
        as many as fill 0.2 s). Return what `fn` computed, so that the clock can wait for it."""
        timer = Timer(fn, name=name, items_per_call=items_per_call, block_size=block_size)
        return timer.measure(steps, warmup=warmup)
