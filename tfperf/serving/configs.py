"""Serving configurations: a runtime, its threads, instances, and batching, each made into a server.

A server takes one request (a row of every input, by name) and returns a Future of its outputs.
`ServingConfig.server(export)` puts the export's runtime behind the batcher (`tfperf.serving.batcher`):
unbatched, `instances` threads each run one request at a time; batched, `instances` batch threads.
A LiteRT interpreter is not thread-safe, so each thread owns its own (one per batch size it runs);
ONNX Runtime sessions and TensorFlow functions are shared. `batch_function_server` is the anchor a
TF Serving user has today: the SavedModel's signature under TensorFlow's own batching op
(`tf.nondifferentiable_batch_function`, the BatchFunction kernel TF Serving runs), called from a
thread per request as a server's request threads call it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tfperf.serving.batcher import Arrays, Batcher, BatchingOptions, unbatched
from tfperf.serving.runtimes import BATCH_FUNCTION, RUNTIMES
from tfperf.records.units import number

AGREEMENT = 1e-5  # a served answer equals the unbatched call within this, relative to the output's scale


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """One way to serve an export: its runtime, the runtime's threads per call, instances, and batching."""

    runtime: str  # one of RUNTIMES, or BATCH_FUNCTION
    threads: int | None = None  # intra-op threads of one call (LiteRT, ONNX Runtime); None: the runtime's own
    instances: int = 1  # threads serving requests (unbatched) or batch threads (batched)
    batching: BatchingOptions | None = None
    workers: int = 1  # server processes sharing the ports (`tfperf serve --workers`): measured through a socket only
    label: str | None = None  # what to call it instead ("endpoint": a running server measured by its URL)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        parts = [self.runtime]
        if self.threads is not None:
            parts.append(f"{self.threads} thread{'s' if self.threads > 1 else ''}")
        parts.append(f"{self.instances} instance{'s' if self.instances > 1 else ''}")
        if self.batching is None:
            parts.append("unbatched")
        else:
            b = self.batching
            wait = "run when idle" if b.idle_runs_now else f"timeout {b.batch_timeout_micros} us"
            parts.append(f"batch {b.max_batch_size}, {wait}")
            if b.length_buckets:
                parts.append(f"length buckets {','.join(map(str, b.length_buckets))}")
            elif b.pad_variable_length_inputs:
                parts.append("padded to the longest")
        if self.workers > 1:
            parts.append(f"{self.workers} worker processes")
        return ", ".join(parts)

    def to_json(self) -> dict[str, object]:
        """The configuration as serve.json holds it (`tfperf serve --config`)."""
        batching = None if self.batching is None else {**self.batching.settings(),
                                                       "idle_runs_now": self.batching.idle_runs_now}
        return {"runtime": self.runtime, "threads": self.threads, "instances": self.instances, "batching": batching,
                "workers": self.workers}

    @classmethod
    def from_json(cls, text: bytes, where: str) -> ServingConfig:
        """A configuration read back from serve.json; ValueError in one line when it is not one."""
        from tfperf import jsonio

        found = jsonio.loads(text, where)
        try:
            batching = found.get("batching")
            options = None if batching is None else BatchingOptions(
                max_batch_size=int(batching["max_batch_size"]), batch_timeout_micros=int(batching["batch_timeout_micros"]),
                num_batch_threads=int(batching.get("num_batch_threads", 1)),
                max_enqueued_batches=int(batching.get("max_enqueued_batches", 100)),
                allowed_batch_sizes=tuple(int(s) for s in batching.get("allowed_batch_sizes") or ()),
                idle_runs_now=bool(batching.get("idle_runs_now", False)),
                pad_variable_length_inputs=bool(batching.get("pad_variable_length_inputs", False)),
                length_buckets=tuple(int(s) for s in batching.get("length_buckets") or ()))
            threads = found.get("threads")
            config = cls(str(found["runtime"]), None if threads is None else int(threads),
                         int(found.get("instances", 1)), options, int(found.get("workers", 1)))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where} is not a serving configuration ({type(exc).__name__}: {exc})") from None
        if config.runtime not in RUNTIMES or min(config.instances, config.workers) < 1 or (
                config.threads is not None and config.threads < 1):
            raise ValueError(f"{where}: runtime must be savedmodel, litert or onnx, and threads, instances and "
                             f"workers at least 1")
        return config

    def settings(self) -> dict[str, object]:
        """The configuration as a record's figures."""
        found: dict[str, object] = {"runtime": self.runtime, "threads": self.threads, "instances": self.instances}
        if self.workers > 1:
            found["workers"] = self.workers
        if self.batching is not None:
            found.update(self.batching.settings(), idle_runs_now=self.batching.idle_runs_now)
        return found

    def server(self, export: Path | str, *, signature: str | None = None,
               on_batch: Callable[[int, list[float], float], None] | None = None) -> Batcher:
        """The export served this way (close it when done); `on_batch` is told of each batch it runs."""
        from tfperf.deploy.layout import load

        if self.runtime == BATCH_FUNCTION:
            raise ValueError(f"{BATCH_FUNCTION} is served by batch_function_server")
        shared = None if self.runtime == "litert" else load(export, threads=self.threads, signature=signature)
        lock = threading.Lock()  # TensorFlow's and LiteRT's loaders are not meant to run concurrently

        def make_call(batch_size: int) -> Callable[[Arrays], Arrays]:
            if shared is not None:
                return shared
            with lock:
                return load(export, threads=self.threads, signature=signature)  # this thread's own interpreter

        if self.batching is None:
            return unbatched(make_call, self.instances, on_batch)
        return Batcher(make_call, dataclasses.replace(self.batching, num_batch_threads=self.instances), on_batch)


class _ThreadPerRequest:
    """Calls a blocking function on a thread per request (as TF Serving's request threads do)."""

    def __init__(self, call: Callable[[Arrays], Arrays], threads: int):
        self._call = call
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="request")

    def submit(self, inputs: Arrays) -> Future:
        return self._pool.submit(self._call, inputs)

    def __call__(self, inputs: Arrays) -> Arrays:
        return self.submit(inputs).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def batch_function_server(export: Path | str, options: BatchingOptions, example: Arrays, request_threads: int = 64,
                          signature: str | None = None) -> _ThreadPerRequest:
    """A SavedModel's signature under `tf.nondifferentiable_batch_function` with `options`' settings, traced
    on `example` (one request) before it serves: concurrent first calls would race to trace it."""
    import tensorflow as tf

    from tfperf.deploy.layout import load

    runner = load(export, signature=signature)  # a SavedModelRunner: its concrete function and specs
    names = [spec.name for spec in runner.inputs]
    outputs = list(runner.outputs)

    @tf.nondifferentiable_batch_function(
        num_batch_threads=options.num_batch_threads, max_batch_size=options.max_batch_size,
        batch_timeout_micros=options.batch_timeout_micros,
        allowed_batch_sizes=list(options.allowed_batch_sizes) or None,
        max_enqueued_batches=options.max_enqueued_batches)
    def batched(*flat):
        answered = runner.function(**dict(zip(names, flat)))  # through the runner, which keeps the variables alive
        return [answered[k] for k in outputs]

    # Called eagerly, the decorator traces its body anew on every call (batch_ops.py builds a tf.function inside
    # `decorated`): 32 ms a call for the seed CNN instead of 0.75. Traced once inside a tf.function, as the op sits
    # in an exported graph, it is built once.
    traced = tf.function(batched, input_signature=[
        tf.TensorSpec((None, *spec.shape[1:]), tf.as_dtype(spec.dtype), name=spec.name) for spec in runner.inputs])

    def call(inputs: Arrays) -> Arrays:
        answered = traced(*[tf.constant(inputs[n]) for n in names])
        return {k: v.numpy() for k, v in zip(outputs, answered)}

    call(example)
    return _ThreadPerRequest(call, request_threads)


def answers_vary(reference: Callable[[Arrays], Arrays], requests: list[Arrays], count: int = 8) -> bool:
    """False when the reference answers every one of the first `count` requests alike: then a server that agrees
    with it has shown nothing (the model's outputs do not depend on its inputs)."""
    from tfperf.deploy.formats import constant

    answers = [reference(r) for r in requests[:count]]
    if len(answers) < 2:
        return True
    return not constant({k: np.concatenate([np.asarray(a[k]) for a in answers]) for k in answers[0]})


def check_agreement(server, reference: Callable[[Arrays], Arrays], requests: list[Arrays],
                    concurrent: int = 8) -> str | None:
    """None when `server` answers `concurrent` requests at once each exactly as `reference` answers it alone
    (within AGREEMENT of the output's scale, same shapes); otherwise what differs, in one line."""
    chosen = requests[:concurrent]
    try:
        futures = [server.submit(r) for r in chosen]
        got = [f.result(timeout=120) for f in futures]
    except Exception as exc:  # noqa: BLE001  (a runtime that fails under concurrency is named, not raised)
        return f"fails under {len(chosen)} concurrent requests ({type(exc).__name__}: {str(exc)[:150]})"
    for i, (request, answer) in enumerate(zip(chosen, got)):
        expected = reference(request)
        for name, want in expected.items():
            have = np.asarray(answer.get(name))
            want = np.asarray(want)
            if have.shape != want.shape:
                return f"request {i}: output {name!r} has shape {list(have.shape)}, the model's is {list(want.shape)}"
            scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
            diff = float(np.max(np.abs(have.astype(np.float64) - want))) if want.size else 0.0
            if diff > AGREEMENT * scale:
                return f"request {i}: output {name!r} differs by {number(diff, 3)} from the unbatched call (over " \
                       f"{AGREEMENT:g} of its scale)"
    return None


def one_row_requests(inputs: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Each row of the inputs as a request of its own (arrays of one row, by input name)."""
    rows = len(next(iter(inputs.values())))
    return [{k: v[i:i + 1] for k, v in inputs.items()} for i in range(rows)]
