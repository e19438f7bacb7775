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

Requests whose sequence axis (the first after the rows) differs in length, as a Transformer's token ids do,
cannot be concatenated as they come: with `pad_variable_length_inputs` (TF Serving's name) a batch's
requests are padded to its longest; with `length_buckets` requests wait in a queue per bucket (the smallest
bucket at least as long) and are padded to it, so that short requests are not padded to long ones. The
padding is zeros (a padding mask's "masked", a tokenizer's pad id), where TF Serving pads with each tensor's
first element; outputs are cut back to each request's own length, and the batcher counts the tokens it
computed against those that were asked for (`padding`).

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
    pad_variable_length_inputs: bool = False  # pad a batch's requests to its longest (with zeros)
    length_buckets: tuple[int, ...] = ()  # or batch requests by length bucket, each padded to its bucket

    def __post_init__(self):
        if self.max_batch_size < 1 or self.num_batch_threads < 1 or self.max_enqueued_batches < 1:
            raise ValueError("max_batch_size, num_batch_threads and max_enqueued_batches must be at least 1")
        if self.batch_timeout_micros < 0:
            raise ValueError("batch_timeout_micros must be at least 0")
        sizes = self.allowed_batch_sizes
        if sizes and (list(sizes) != sorted(set(sizes)) or sizes[-1] != self.max_batch_size or sizes[0] < 1):
            raise ValueError("allowed_batch_sizes must rise and end at max_batch_size (TF Serving's rule)")
        buckets = self.length_buckets
        if buckets and (list(buckets) != sorted(set(buckets)) or buckets[0] < 1):
            raise ValueError("length_buckets must rise, each at least 1")

    def bucket(self, length: int | None) -> int | None:
        """The length a request of `length` is padded to in its own queue (None: one queue, no buckets)."""
        if not self.length_buckets or length is None:
            return None
        found = next((b for b in self.length_buckets if b >= length), None)
        if found is None:
            raise ValueError(f"a request of length {length} is longer than the longest bucket, "
                             f"{self.length_buckets[-1]}")
        return found

    def padded(self, rows: int) -> int:
        """The batch size a batch of `rows` rows runs at: the next allowed size, or `rows` itself."""
        return next((s for s in self.allowed_batch_sizes if s >= rows), rows)

    def settings(self) -> dict[str, object]:
        """The options under TF Serving's names, as a batching_parameters.txt would set them."""
        found = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("idle_runs_now", "length_buckets")}
        found["allowed_batch_sizes"] = list(self.allowed_batch_sizes)
        if self.length_buckets:
            found["length_buckets"] = list(self.length_buckets)
        return found


@dataclasses.dataclass
class _Request:
    inputs: Arrays
    rows: int
    arrived: float
    future: Future
    length: int | None = None  # its sequence axis (the first after the rows), where it has one


def sequence_length(inputs: Arrays) -> int | None:
    """A request's length: the longest first axis after the rows of its inputs (None when none has one)."""
    return max((a.shape[1] for a in inputs.values() if np.ndim(a) >= 2), default=None)


def to_length(array: np.ndarray, length: int | None) -> np.ndarray:
    """An input padded with zeros along its sequence axis to `length` (unchanged without one)."""
    if length is None or np.ndim(array) < 2 or array.shape[1] >= length:
        return array
    widths = [(0, 0)] * array.ndim
    widths[1] = (0, length - array.shape[1])
    return np.pad(array, widths)


def cut_to(output: np.ndarray, own: int | None, padded: int | None) -> np.ndarray:
    """An output cut back to its request's length where its sequence axis was padded (per-token outputs)."""
    if own is None or padded is None or own == padded or np.ndim(output) < 2 or output.shape[1] != padded:
        return output
    return output[:, :own]


def _rows(inputs: Arrays) -> int:
    counts = {len(a) for a in inputs.values()}
    if len(counts) != 1:
        raise ValueError(f"every input of a request needs the same number of rows, got {sorted(counts)}")
    return counts.pop()


class Batcher:
    """Requests of a few rows each, run in batches on `num_batch_threads` threads; `submit` returns a Future."""

    def __init__(self, make_call: Callable[[int], Callable[[Arrays], Arrays]], options: BatchingOptions,
                 on_batch: Callable[[int, list[float], float], None] | None = None, *, whole_requests: bool = False):
        self.options = options
        # Unbatched: each call runs one request as it came, however many rows it has; the queue is bounded in
        # requests (max_enqueued_batches of them) instead of rows.
        self.whole_requests = whole_requests
        self._make_call = make_call
        # Told of each batch run: its rows, how long each of its requests waited in the queue, and the call's time.
        self._on_batch = on_batch
        self._queues: dict[int | None, collections.deque[_Request]] = {}  # by length bucket (None: no buckets)
        self._waiting: dict[int | None, int] = {}  # rows waiting in each queue
        self._waiting_rows = 0
        self.tokens = [0, 0]  # asked for, computed: padding's cost
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
        if rows > self.options.max_batch_size and not self.whole_requests:
            raise ValueError(f"a request of {rows} rows is larger than max_batch_size {self.options.max_batch_size}")
        length = sequence_length(inputs)
        key = self.options.bucket(length)
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            waiting = sum(len(q) for q in self._queues.values())
            full = (waiting >= self.options.max_enqueued_batches if self.whole_requests else
                    self._waiting_rows + rows > self.options.max_enqueued_batches * self.options.max_batch_size)
            if full:
                raise Overloaded(f"{waiting} requests ({self._waiting_rows} rows) already wait "
                                 f"(max_enqueued_batches {self.options.max_enqueued_batches})")
            self._queues.setdefault(key, collections.deque()).append(
                _Request(inputs, rows, time.perf_counter(), future, length))
            self._waiting[key] = self._waiting.get(key, 0) + rows
            self._waiting_rows += rows
            self._cond.notify()
        return future

    @property
    def padding(self) -> float | None:
        """Tokens asked for over tokens computed so far (1: no padding; None before any request had a length)."""
        asked, computed = self.tokens
        return asked / computed if computed else None

    @property
    def waiting_rows(self) -> int:
        """Rows waiting for a batch now (the queue's depth)."""
        return self._waiting_rows

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

    def _take_batch(self) -> tuple[list[_Request], int | None] | None:
        """The next batch by the options' rules, from the queue whose oldest request waited longest, and its
        bucket; None when closed and drained."""
        limit, timeout_s = self.options.max_batch_size, self.options.batch_timeout_micros / 1e6
        with self._cond:
            while not any(self._queues.values()):
                if self._closed:
                    return None
                self._cond.wait()
            key = min((k for k, q in self._queues.items() if q), key=lambda k: self._queues[k][0].arrived)
            queue = self._queues[key]
            deadline = queue[0].arrived + timeout_s
            while (not self.options.idle_runs_now and self._waiting[key] < limit and not self._closed
                   and time.perf_counter() < deadline):
                self._cond.wait(max(deadline - time.perf_counter(), 0.0))
            batch, rows, taken = [], 0, 0
            while queue and (taken + queue[0].rows <= limit or self.whole_requests and not taken):
                request = queue.popleft()
                taken += request.rows
                if request.future.set_running_or_notify_cancel():  # a cancelled request (its deadline passed) is dropped
                    batch.append(request)
                    rows += request.rows
            self._waiting[key] -= taken
            self._waiting_rows -= taken
            if any(self._queues.values()):  # another thread may start on the rest
                self._cond.notify()
            return batch, key

    def _serve(self) -> None:
        calls: dict[int, Callable[[Arrays], Arrays]] = {}  # this thread's own, per padded batch size
        while (taken := self._take_batch()) is not None:
            batch, bucket = taken
            if not batch:
                continue
            rows = sum(r.rows for r in batch)
            size = self.options.padded(rows)
            lengths = [r.length for r in batch if r.length is not None]
            target = bucket if bucket is not None else (max(lengths) if lengths and (
                self.options.pad_variable_length_inputs and not self.whole_requests) else None)
            started = time.perf_counter()
            try:
                call = calls.get(size) or calls.setdefault(size, self._make_call(size))
                merged = {name: _pad(np.concatenate([to_length(r.inputs[name], target) for r in batch]), size)
                          for name in batch[0].inputs}
                outputs = call(merged)
                self.batches.append(rows)
                if lengths:
                    self.tokens[0] += sum(r.rows * r.length for r in batch if r.length is not None)
                    self.tokens[1] += size * (target or max(lengths))
                if self._on_batch is not None:
                    self._on_batch(rows, [started - r.arrived for r in batch], time.perf_counter() - started)
                start = 0
                for request in batch:
                    request.future.set_result({k: cut_to(np.asarray(v)[start:start + request.rows], request.length,
                                                         target) for k, v in outputs.items()})
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


def unbatched(make_call: Callable[[int], Callable[[Arrays], Arrays]], instances: int,
              on_batch: Callable[[int, list[float], float], None] | None = None,
              max_enqueued: int = 10_000) -> Batcher:
    """`instances` threads, each with its own instance, each running one request at a time as it comes."""
    return Batcher(make_call, BatchingOptions(max_batch_size=1, batch_timeout_micros=0, num_batch_threads=instances,
                                              max_enqueued_batches=max_enqueued, idle_runs_now=True), on_batch,
                   whole_requests=True)
