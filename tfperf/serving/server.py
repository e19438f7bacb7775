"""A model served on real sockets in the protocols existing clients speak: TF Serving's REST API and KServe's v2
over HTTP (aiohttp), TF Serving's PredictionService and ModelService and v2's GRPCInferenceService over gRPC
(grpcio's asyncio server), both on one event loop, in front of a `Repository` (versions, checked and
swapped) whose batcher runs the model on threads of its own; Prometheus metrics at TF Serving's path.

A request is decoded on the event loop (by its protocol's module, `tfperf.serving.protocols`), handed to the
served version's batcher, and awaited; a full queue answers 503 (gRPC: RESOURCE_EXHAUSTED) at once, a request
whose gRPC deadline passes while it waits is dropped before it runs, a body over the size limit is refused
before it is read whole, and on `stop()` the server stops accepting, answers what it has accepted (within the drain timeout) and ends.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tfperf import __version__
from tfperf.serving.batcher import Overloaded
from tfperf.serving.deploy_files import triton_config
from tfperf.serving import handoff
from tfperf.serving.grpc_services import add_services
from tfperf.serving.repository import AVAILABLE, NotServed, Repository, Version
from tfperf.serving.scrape import METRICS_PATH
from tfperf.serving.protocols import kserve_v2, tfserving_rest
from tfperf.serving.protocols.tensors import RequestError, dump_json, http_status

CLIENT_CLOSED = 499  # nginx's status for a client that hung up before its answer: counted under it in the metrics
V1 = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
                r"(?P<verb>:predict|:classify|:regress|/metadata)?$")
V2 = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>\d+))?(?P<verb>/infer|/ready|/config)?$")


def metrics(registry) -> dict[str, Any]:
    """The server's Prometheus metrics in `registry`: requests by protocol and code, latency, batch sizes,
    time in the queue and in the model, and the rows waiting now."""
    from prometheus_client import Counter, Gauge, Histogram

    latency = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
    return {
        "requests": Counter("tfperf_requests", "Requests answered, by model, protocol and status code",
                            ["model", "protocol", "code"], registry=registry),
        "latency": Histogram("tfperf_request_latency_seconds", "Time from a request read to its answer written",
                             ["model", "protocol"], buckets=latency, registry=registry),
        "queue": Histogram("tfperf_queue_latency_seconds", "Time a request waited for its batch to start",
                           ["model"], buckets=latency, registry=registry),
        "compute": Histogram("tfperf_compute_latency_seconds", "Time the model took for a batch",
                             ["model"], buckets=latency, registry=registry),
        "batch": Histogram("tfperf_batch_size", "Rows in each batch the model ran", ["model"],
                           buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=registry),
        # Set as rows arrive and as batches end (a callback would read only the scraped worker's queue); summed over
        # the live worker processes when they share a metrics folder.
        "depth": Gauge("tfperf_queue_depth", "Rows waiting for a batch now", ["model"], registry=registry,
                       multiprocess_mode="livesum"),
    }


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The server's event loop: uvloop's where it is installed (tfperf's [serve] extra brings it), asyncio's
    otherwise. HTTP parsing, the sockets and the hand-back from the batch thread all run on it: one server process
    (seed CNN, ONNX, batch 16) under wrk at 16 connections answered 6,728 requests/s at 158 us of CPU a request
    on uvloop, 5,691 at 185 us on asyncio's loop (5 rounds each, interleaved)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """Where and how the server listens."""

    host: str = "127.0.0.1"
    port: int = 8501  # TF Serving's REST port
    grpc_port: int = 8500  # TF Serving's gRPC port
    max_request_bytes: int = 64 * 2**20
    drain_timeout_s: float = 30.0
    reuse_port: bool = False  # worker processes share the gRPC port (SO_REUSEPORT)
    handoff: Any = None  # a worker's channel from the process that accepts on the REST port (handoff.py), if any
    metrics_dir: str | None = None  # where the workers of one server keep their metrics (prometheus_client's
    # multiprocess mode, set up before it was imported): a scrape of any worker then counts every worker


class Handback:
    """The batcher's answers, handed back to the event loop a group at a time: one wake-up of the loop for every
    future that finishes before the loop runs, where `asyncio.wrap_future` wakes it once per future (a write to its
    self-pipe from the batch thread: 14% of the event loop's samples at 5,500 requests/s). Cancelling what `wrap`
    returned cancels the batcher's future, so that a request whose deadline passed is dropped before it runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._finished: collections.deque[tuple[concurrent.futures.Future, asyncio.Future]] = collections.deque()
        self._lock = threading.Lock()
        self._woken = False  # a delivery is scheduled on the loop and has not yet taken the deque

    def wrap(self, future: concurrent.futures.Future) -> asyncio.Future:
        """An asyncio future, on this loop, that ends as `future` (from another thread) ends."""
        waiter = self.loop.create_future()
        waiter.add_done_callback(lambda w: future.cancel() if w.cancelled() else None)
        future.add_done_callback(lambda done: self._finish(done, waiter))
        return waiter

    def _finish(self, future: concurrent.futures.Future, waiter: asyncio.Future) -> None:
        with self._lock:
            self._finished.append((future, waiter))
            if self._woken:
                return
            self._woken = True
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            finished, self._finished = self._finished, collections.deque()
            self._woken = False
        for future, waiter in finished:
            if waiter.done():  # cancelled: its deadline passed
                continue
            if future.cancelled():
                waiter.cancel()
            elif (error := future.exception()) is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(future.result())


class Server:
    """One repository served over HTTP and gRPC on the running event loop: `await start()`, `await stop()`."""

    def __init__(self, repository: Repository, options: ServerOptions, log: Callable[[str], None] = print):
        from prometheus_client import CollectorRegistry

        self.repository, self.options, self.log = repository, options, log
        self.registry = CollectorRegistry()  # the server's own: nothing process-wide
        self.metrics = metrics(self.registry)
        self._children: dict[tuple[str, ...], Any] = {}  # labelled metrics, by metric and labels
        self.ports: tuple[int, int] | None = None
        self._runner = None
        self._grpc = None
        self._handback: Handback | None = None  # made on the loop that serves, at its first request

    def record_batch(self, rows: int, waits: list[float], compute_s: float) -> None:
        """The batcher's report of one batch (called on its thread): rows, each request's wait, the call's time."""
        name = self.repository.name
        self._metric("batch", name).observe(rows)
        self._metric("compute", name).observe(compute_s)
        queue = self._metric("queue", name)
        for wait in waits:
            queue.observe(wait)
        self._count_waiting()

    def _metric(self, metric: str, *labels: str):
        """A metric's child for these labels, made once: `labels()` takes a lock and builds its key at every call
        (a request's metrics in multiprocess mode: 12 us through labels(), 5 us through the children kept)."""
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, self.metrics[metric].labels(*labels))
        return child

    def _count_waiting(self) -> None:
        current = self.repository.current
        self._metric("depth", self.repository.name).set(current.server.waiting_rows if current else 0)

    async def start(self) -> tuple[int, int]:
        """Listen on both ports (0: any free one); the (REST, gRPC) ports bound."""
        import grpc
        from aiohttp import web

        app = web.Application(client_max_size=self.options.max_request_bytes)
        app.router.add_route("*", "/v1/{tail:.*}", self._v1)
        app.router.add_route("*", "/v2{tail:.*}", self._v2)
        app.router.add_get(METRICS_PATH, self._metrics)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=self.options.drain_timeout_s)
        await self._runner.setup()
        if self.options.handoff is None:
            site = web.TCPSite(self._runner, self.options.host, self.options.port)
            await site.start()
            rest_port = site._server.sockets[0].getsockname()[1]
        else:  # the REST port's connections arrive from the process that accepts them
            self._serve_handed(self.options.handoff)
            rest_port = self.options.port
        limit = self.options.max_request_bytes
        self._grpc = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                              ("grpc.so_reuseport", int(self.options.reuse_port))])
        add_services(self._grpc, self)
        grpc_port = self._grpc.add_insecure_port(f"{self.options.host}:{self.options.grpc_port}")
        if grpc_port == 0:
            raise OSError(f"cannot listen for gRPC on {self.options.host}:{self.options.grpc_port}")
        await self._grpc.start()
        self.ports = (rest_port, grpc_port)
        if self.options.handoff is not None:
            handoff.say_ready(self.options.handoff)
        return self.ports

    def _serve_handed(self, channel) -> None:
        """Serve each connection the accepting process hands over on `channel`, as if accepted here."""
        loop = asyncio.get_running_loop()
        adopting: set[asyncio.Task] = set()  # held until done: the loop keeps only weak references to tasks

        def arrived() -> None:
            connections = handoff.receive(channel)
            if connections is None:  # the accepting process is gone: nothing more will come
                loop.remove_reader(channel.fileno())
                return
            for connection in connections:
                task = loop.create_task(loop.connect_accepted_socket(self._runner.server, connection))
                adopting.add(task)
                task.add_done_callback(adopting.discard)

        channel.setblocking(False)
        loop.add_reader(channel.fileno(), arrived)

    async def stop(self) -> None:
        """Stop accepting, answer the requests already accepted (within the drain timeout), then close."""
        if self.options.handoff is not None:
            asyncio.get_running_loop().remove_reader(self.options.handoff.fileno())
        grace = self.options.drain_timeout_s
        await asyncio.gather(self._runner.cleanup(), self._grpc.stop(grace))

    # The model, from any protocol -----------------------------------------------------------------

    async def infer(self, version: Version, arrays: dict[str, np.ndarray], *,
                    deadline_s: float | None = None) -> dict[str, np.ndarray]:
        """The served version's outputs for a request (arrays by input name); RequestError for a full queue
        (503), a request larger than a batch (400), a deadline that passed (504), a model that fails (400)."""
        try:
            future = version.server.submit(arrays)
        except Overloaded as exc:
            raise RequestError(503, f"the server's queue is full ({exc}): retry later, or add capacity") from None
        except ValueError as exc:
            raise RequestError(400, str(exc)) from None
        except RuntimeError:  # the version closed under us: the server is stopping
            raise RequestError(503, "the server is shutting down") from None
        self._count_waiting()
        if self._handback is None:
            self._handback = Handback(asyncio.get_running_loop())
        try:
            return await asyncio.wait_for(self._handback.wrap(future), deadline_s)
        except asyncio.TimeoutError:
            raise RequestError(504, "the deadline passed before the model answered") from None
        except Exception as exc:  # noqa: BLE001  (the model's own errors: said in one line)
            from tfperf.deploy.errors import first_line

            raise RequestError(400, f"the model failed on the input ({type(exc).__name__}: "
                                    f"{first_line(exc)})") from None

    def count(self, protocol: str, code: str, started: float) -> None:
        name = self.repository.name
        self._metric("requests", name, protocol, code).inc()
        self._metric("latency", name, protocol).observe(time.perf_counter() - started)

    def model(self, name: str) -> Repository:
        if name != self.repository.name:
            raise RequestError(404, f"no model {name!r}: this server serves {self.repository.name!r}")
        return self.repository

    # HTTP --------------------------------------------------------------------------------------

    async def _body(self, request) -> bytes:
        from aiohttp import web

        limit = self.options.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(413, f"the body is {request.content_length:,} bytes, more than the {limit:,} "
                                    f"allowed (--max-request-size)")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(413, f"the body is more than the {limit:,} bytes allowed (--max-request-size)") from None
        except ConnectionResetError:  # the client hung up mid-body (a load run stopped): counted, no traceback
            raise RequestError(CLIENT_CLOSED, "the client closed the connection before its body arrived") from None

    def _answer(self, protocol: str, started: float, status: int, body: bytes,
                headers: dict[str, str] | None = None, content_type: str = "application/json"):
        from aiohttp import web

        self.count(protocol, str(status), started)
        return web.Response(status=status, body=body, content_type=content_type, headers=headers)

    async def _v1(self, request):
        """TF Serving's REST API."""
        started = time.perf_counter()
        try:
            match = V1.match(request.path)
            if match is None:
                raise RequestError(404, f"no such API: {request.method} {request.path[:100]} (TF Serving's are "
                                        f"/v1/models/NAME[/versions/N][:predict|/metadata])")
            if match["label"]:
                raise RequestError(404, "version labels are not served: ask for /versions/N")
            repository = self.model(match["name"])
            version_asked = int(match["version"]) if match["version"] else None
            verb = match["verb"]
            if verb in (":classify", ":regress"):
                raise RequestError(501, f"{verb[1:]} is not served: use :predict")
            if request.method == "GET" and verb is None:
                states = {v: s for v, s in repository.states.items() if version_asked in (None, v)}
                if not states:
                    raise RequestError(404, f"model {repository.name!r} has no version {version_asked}")
                return self._answer("rest", started, 200, dump_json(tfserving_rest.status(states, repository.errors)))
            if request.method == "GET" and verb == "/metadata":
                v = repository.get(version_asked)
                return self._answer("rest", started, 200, dump_json(tfserving_rest.metadata(
                    repository.name, v.number, v.signature, v.inputs, v.outputs)))
            if request.method != "POST" or verb != ":predict":
                raise RequestError(405 if verb else 404, f"{request.method} {request.path[:100]}: use POST "
                                                         f"...:predict, GET .../metadata or GET the model")
            body = await self._body(request)
            v = repository.acquire(version_asked)
            try:
                arrays, columnar = tfserving_rest.predict_request(body, v.inputs, v.signature)
                outputs = await self.infer(v, arrays)
            finally:
                repository.release(v)
            return self._answer("rest", started, 200, tfserving_rest.predict_response(outputs, columnar))
        except (RequestError, NotServed) as exc:
            return self._answer("rest", started, http_status(exc), dump_json({"error": str(exc)}))

    async def _v2(self, request):
        """KServe's Open Inference Protocol (v2) over HTTP, with tritonclient's binary tensor extension."""
        started = time.perf_counter()
        path = request.path
        try:
            if path in ("/v2/health/live", "/v2/health/ready"):
                ready = path.endswith("live") or self.repository.current is not None
                return self._answer("v2", started, 200 if ready else 503, dump_json(
                    {"live" if path.endswith("live") else "ready": ready}))
            if path == "/v2":
                return self._answer("v2", started, 200, dump_json(
                    {"name": "tfperf", "version": __version__, "extensions": ["binary_tensor_data"]}))
            if path == "/v2/repository/index":
                r = self.repository
                return self._answer("v2", started, 200, dump_json([
                    {"name": r.name, "version": str(v), "state": "READY" if s == AVAILABLE else "UNAVAILABLE"}
                    for v, s in sorted(r.states.items())]))
            match = V2.match(path)
            if match is None:
                raise RequestError(404, f"no such API: {request.method} {path[:100]} (v2's are /v2/models/NAME"
                                        f"[/versions/N][/infer|/ready])")
            repository = self.model(match["name"])
            version_asked = int(match["version"]) if match["version"] else None
            verb = match["verb"]
            if request.method == "GET" and verb == "/ready":
                repository.get(version_asked)
                return self._answer("v2", started, 200, b"")
            if request.method == "GET" and verb is None:
                v = repository.get(version_asked)
                return self._answer("v2", started, 200, dump_json(kserve_v2.metadata(
                    repository.name, [v.number], v.platform, v.inputs, v.outputs)))
            if request.method == "GET" and verb == "/config":
                v = repository.get(version_asked)
                return self._answer("v2", started, 200, dump_json(triton_config(repository, v)))
            if request.method != "POST" or verb != "/infer":
                raise RequestError(404, f"{request.method} {path[:100]}: use POST .../infer, GET the model, "
                                        f"GET .../ready")
            body = await self._body(request)
            header = request.headers.get("Inference-Header-Content-Length")
            try:
                header_length = int(header) if header is not None else None
            except ValueError:
                raise RequestError(400, f"Inference-Header-Content-Length {header[:40]!r} is not a number") from None
            v = repository.acquire(version_asked)
            try:
                decoded = kserve_v2.infer_request(body, header_length, v.inputs)
                outputs = await self.infer(v, decoded.arrays)
            finally:
                repository.release(v)
            answer, length = kserve_v2.infer_response(repository.name, v.number, decoded, outputs)
            if length is None:
                return self._answer("v2", started, 200, answer)
            return self._answer("v2", started, 200, answer, {"Inference-Header-Content-Length": str(length)},
                                "application/octet-stream")
        except (RequestError, NotServed) as exc:
            return self._answer("v2", started, http_status(exc), dump_json({"error": str(exc)}))

    async def _metrics(self, request):
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        registry = self.registry
        if self.options.metrics_dir:  # every worker's metrics, from the files they share
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.options.metrics_dir)
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})


class ServerThread:
    """A Server on an event loop of its own thread, for a process that does other things meanwhile (a recipe
    that measures it, a test): `with ServerThread(repository) as running: running.ports`."""

    def __init__(self, repository: Repository, options: ServerOptions | None = None,
                 log: Callable[[str], None] = lambda line: None):
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="server", daemon=True)
        self._thread.start()
        self.server = Server(repository, options or ServerOptions(port=0, grpc_port=0), log)
        repository.on_batch = self.server.record_batch
        try:
            self.ports = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(60)
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise

    def close(self) -> None:
        """Drain and stop the server, then its loop."""
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(
                self.server.options.drain_timeout_s + 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
