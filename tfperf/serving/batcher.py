"""Dynamic batching in front of any runtime, with TF Serving's knob names.

Requests (a few rows each) wait in one queue; each of `num_batch_threads` threads takes the first
waiting request, then more until the batch holds `max_batch_size` rows or `batch_timeout_micros` have
passed since that first request arrived, runs one call on the concatenated rows (padded up to the
next of `allowed_batch_sizes`, as TF Serving pads) and hands each caller its own rows. With
`idle_runs_now=True` a thread runs whatever is waiting as soon as it is free instead of waiting out
the timeout: under load batches still fill, because requests pile up while every thread computes,
and at low load no request pays the timeout. A call that fails reaches every caller of its batch.
More than `max_enqueued_batches` full batches waiting is an overload: `submit` refuses at once
(TF Serving answers UNAVAILABLE), so that latency does not grow without bound.

Each batch thread owns what `make_call(batch_size)` returns for each batch size it runs (a LiteRT
interpreter is not thread-safe, and resizing one per call costs more than the call); runtimes that
may be shared (ONNX Runtime sessions, TensorFlow functions) return the same callable every time.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future

import numpy as np

Arrays = Mapping[str, np.ndarray]


class Overloaded(RuntimeError):
    """More requests are waiting than `max_enqueued_batches` full batches: the request is refused."""


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """TF Serving's batching parameters (batching_parameters.txt), and when an idle thread runs a batch."""

    max_batch_size: int = 32
    batch_timeout_micros: int = 1000
    num_batch_threads: int = 1
    max_enqueued_batches: int = 100
    allowed_batch_sizes: tuple[int, ...] = ()
    idle_runs_now: bool = False

    def __post_init__(self):
        if self.max_batch_size < 1 or self.num_batch_threads < 1 or self.max_enqueued_batches < 1:
            raise ValueError("max_batch_size, num_batch_threads and max_enqueued_batches must be at least 1")
        if self.batch_timeout_micros < 0:
            raise ValueError("batch_timeout_micros must be at least 0")
        sizes = self.allowed_batch_sizes
        if sizes and (list(sizes) != sorted(set(sizes)) or sizes[-1] != self.max_batch_size or sizes[0] < 1):
            raise ValueError("allowed_batch_sizes must rise and end at max_batch_size (TF Serving's rule)")

    def padded(self, rows: int) -> int:
        """The batch size a batch of `rows` rows runs at: the next allowed size, or `rows` itself."""
        return next((s for s in self.allowed_batch_sizes if s >= rows), rows)

    def settings(self) -> dict[str, object]:
        """The options under TF Serving's names, as a batching_parameters.txt would set them."""
        found = {k: v for k, v in dataclasses.asdict(self).items() if k != "idle_runs_now"}
        found["allowed_batch_sizes"] = list(self.allowed_batch_sizes)
        return found


@dataclasses.dataclass
class _Request:
    inputs: Arrays
    rows: int
    arrived: float
    future: Future


def _rows(inputs: Arrays) -> int:
    counts = {len(a) for a in inputs.values()}
    if len(counts) != 1:
        raise ValueError(f"every input of a request needs the same number of rows, got {sorted(counts)}")
    return counts.pop()


class Batcher:
    """Requests of a few rows each, run in batches on `num_batch_threads` threads; `submit` returns a Future."""

    def __init__(self, make_call: Callable[[int], Callable[[Arrays], Arrays]], options: BatchingOptions):
        self.options = options
        self._make_call = make_call
        self._queue: collections.deque[_Request] = collections.deque()
        self._waiting_rows = 0
        self._cond = threading.Condition()
        self._closed = False
        self.batches: list[int] = []  # rows of each batch run, for what the batcher did under load
        self._threads = [threading.Thread(target=self._serve, name=f"batch-{i}", daemon=True)
                         for i in range(options.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, inputs: Arrays) -> Future:
        """Queue a request (arrays by name, rows on the first axis); its Future answers its own output rows."""
        rows = _rows(inputs)
        if rows > self.options.max_batch_size:
            raise ValueError(f"a request of {rows} rows is larger than max_batch_size {self.options.max_batch_size}")
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            if self._waiting_rows + rows > self.options.max_enqueued_batches * self.options.max_batch_size:
                raise Overloaded(f"{self._waiting_rows} rows already wait (max_enqueued_batches "
                                 f"{self.options.max_enqueued_batches})")
            self._queue.append(_Request(inputs, rows, time.perf_counter(), future))
            self._waiting_rows += rows
            self._cond.notify()
        return future

    def __call__(self, inputs: Arrays) -> Arrays:
        """One request, waited for."""
        return self.submit(inputs).result()

    def close(self) -> None:
        """Stop the batch threads once the queue is empty."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _take_batch(self) -> list[_Request] | None:
        """The next batch, by the options' rules; None when closed and drained."""
        limit, timeout_s = self.options.max_batch_size, self.options.batch_timeout_micros / 1e6
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            deadline = self._queue[0].arrived + timeout_s
            while (not self.options.idle_runs_now and self._waiting_rows < limit and not self._closed
                   and time.perf_counter() < deadline):
                self._cond.wait(max(deadline - time.perf_counter(), 0.0))
            batch, rows = [], 0
            while self._queue and rows + self._queue[0].rows <= limit:
                request = self._queue.popleft()
                batch.append(request)
                rows += request.rows
            self._waiting_rows -= rows
            if self._queue:  # another thread may start on the rest
                self._cond.notify()
            return batch

    def _serve(self) -> None:
        calls: dict[int, Callable[[Arrays], Arrays]] = {}  # this thread's own, per padded batch size
        while (batch := self._take_batch()) is not None:
            rows = sum(r.rows for r in batch)
            size = self.options.padded(rows)
            try:
                call = calls.get(size) or calls.setdefault(size, self._make_call(size))
                merged = {name: _pad(np.concatenate([r.inputs[name] for r in batch]), size)
                          for name in batch[0].inputs}
                outputs = call(merged)
                self.batches.append(rows)
                start = 0
                for request in batch:
                    request.future.set_result({k: np.asarray(v)[start:start + request.rows]
                                               for k, v in outputs.items()})
                    start += request.rows
            except BaseException as exc:  # every caller of the batch learns why, none waits for ever
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)


def _pad(array: np.ndarray, size: int) -> np.ndarray:
    """Rows repeated from the first up to `size` (TF Serving pads a batch with its first row)."""
    if len(array) >= size:
        return array
    return np.concatenate([array, np.repeat(array[:1], size - len(array), axis=0)])


def unbatched(make_call: Callable[[int], Callable[[Arrays], Arrays]], instances: int) -> Batcher:
    """`instances` threads, each with its own instance, each running one request at a time as it comes."""
    return Batcher(make_call, BatchingOptions(max_batch_size=1, batch_timeout_micros=0, num_batch_threads=instances,
                                              max_enqueued_batches=10_000, idle_runs_now=True))
