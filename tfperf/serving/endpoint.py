"""Any running endpoint as a server to measure (`tfperf load --url`): its URL read as one of the protocols
`tfperf serve`, TF Serving, Triton and KServe speak, its inputs read from its own metadata, and a client that
sends requests from an asyncio event loop of its own thread (HTTP/1.1 keep-alive through `tfperf.serving.http1`,
each request written once as the bytes that go on the wire; gRPC's own asyncio stubs), so that the sending side
costs as little as Python allows. `RemoteServer.submit(arrays)` returns a Future, as the in-process servers' does,
so the closed loop and LoadGen measure it unchanged; requests submitted from another thread (LoadGen's) reach the
loop a group at a time, one wake-up for all that arrived meanwhile. What goes over the wire is each protocol's
module's (`tfperf.serving.protocols`); the connections, the event loop and the metadata calls are here.

  http://HOST:PORT/v1/models/NAME[/versions/N]   TF Serving REST (row format; columnar with `columnar=True`)
  grpc://HOST:PORT/NAME[/versions/N]             TF Serving gRPC (PredictionService)
  http://HOST:PORT/v2/models/NAME[/versions/N]   KServe v2 / Triton over HTTP (binary tensors; JSON with `json=True`)
  grpc+v2://HOST:PORT/NAME[/versions/N]          KServe v2 / Triton over gRPC
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import re
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from tfperf.serving import http1
from tfperf.serving.protocols import kserve_v2, kserve_v2_grpc, tfserving_grpc, tfserving_rest
from tfperf.serving.protocols.tfserving_messages import GET_MODEL_METADATA, PREDICT, client_method
from tfperf.serving.protocols.tensors import EndpointError, Tensor

# Each protocol's module: encodes requests, decodes answers and reads the model's metadata.
CODECS = {"rest": tfserving_rest, "grpc": tfserving_grpc, "v2": kserve_v2, "grpc+v2": kserve_v2_grpc}

PROTOCOLS = {"rest": "TF Serving REST", "grpc": "TF Serving gRPC", "v2": "KServe v2 over HTTP",
             "grpc+v2": "KServe v2 over gRPC"}
_URL = re.compile(r"^(?P<scheme>https?|grpc|grpc\+v2)://(?P<host>\[[^\]]+\]|[^/:]+):(?P<port>\d+)(?P<path>/.*)?$")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A served model: protocol, where, which model and version, and how requests are encoded."""

    protocol: str  # rest, grpc, v2, grpc+v2
    host: str
    port: int
    model: str
    version: int | None = None
    columnar: bool = False  # TF Serving REST: {"inputs": ...} rather than {"instances": [...]}
    json: bool = False  # v2 over HTTP: JSON tensors rather than binary ones

    @property
    def name(self) -> str:
        style = " (columnar)" if self.columnar else " (JSON tensors)" if self.json else \
            " (binary tensors)" if self.protocol == "v2" else " (row format)" if self.protocol == "rest" else ""
        return f"{PROTOCOLS[self.protocol]}{style}"

    def path(self, verb: str = "") -> str:
        """The HTTP path of a v1 or v2 call on this model (`verb`: ':predict', '/metadata', '/infer', ...)."""
        version = f"/versions/{self.version}" if self.version else ""
        api = "v1" if self.protocol == "rest" else "v2"
        return f"/{api}/models/{self.model}{version}{verb}"

    def url(self, verb: str = "") -> str:
        """The HTTP URL of a v1 or v2 call on this model."""
        return f"http://{self.host}:{self.port}{self.path(verb)}"

    @property
    def metadata_verb(self) -> str:
        """The verb of an HTTP protocol's metadata call."""
        return "/metadata" if self.protocol == "rest" else ""

    @property
    def infer_verb(self) -> str:
        """The verb of an HTTP protocol's inference call."""
        return ":predict" if self.protocol == "rest" else "/infer"

    @property
    def metadata_url(self) -> str:
        """Where an HTTP protocol answers the model's metadata."""
        return self.url(self.metadata_verb)

    @property
    def infer_url(self) -> str:
        """Where an HTTP protocol answers inference requests."""
        return self.url(self.infer_verb)


def parse_url(url: str, *, columnar: bool = False, json: bool = False) -> Endpoint:
    """The endpoint a URL names; EndpointError in one line, with the four forms, when it names none."""
    forms = ("http://HOST:PORT/v1/models/NAME (TF Serving REST), grpc://HOST:PORT/NAME (TF Serving gRPC), "
             "http://HOST:PORT/v2/models/NAME (KServe v2, Triton), grpc+v2://HOST:PORT/NAME")
    match = _URL.match(url.strip())
    if match is None:
        raise EndpointError(f"{url[:120]!r} is not an endpoint URL: give {forms}")
    scheme, host, port, path = match["scheme"], match["host"].strip("[]"), int(match["port"]), match["path"] or ""
    if scheme == "https":
        raise EndpointError("https is not measured: measure the server behind its TLS proxy, over http")
    if scheme.startswith("grpc"):
        found = re.fullmatch(r"/(?P<name>[^/]+)(?:/versions/(?P<version>\d+))?/?", path)
        protocol = scheme
    else:
        found = re.fullmatch(r"/(?P<api>v1|v2)/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?/?", path)
        protocol = "rest" if found and found["api"] == "v1" else "v2"
    if found is None:
        raise EndpointError(f"{url[:120]!r} names no model: give {forms}")
    if columnar and protocol != "rest":
        raise EndpointError("--columnar is TF Serving REST's format: the URL is not /v1/models/NAME")
    if json and protocol != "v2":
        raise EndpointError("--json-tensors is for KServe v2 over HTTP: the URL is not /v2/models/NAME")
    return Endpoint(protocol, host, port, found["name"], int(found["version"]) if found["version"] else None,
                    columnar, json)


async def read_metadata(endpoint: Endpoint, pool: http1.Pool | None = None,
                        channel=None) -> tuple[list[Tensor], list[Tensor]]:
    """The model's inputs and outputs, as its own metadata API gives them (over HTTP through `pool`)."""
    codec = CODECS[endpoint.protocol]
    if pool is not None:
        url = endpoint.metadata_url
        answer = await pool.request(http1.wire("GET", endpoint.host, endpoint.port,
                                               endpoint.path(endpoint.metadata_verb)))
        try:
            found = json.loads(answer.body)
        except ValueError:
            raise EndpointError(f"{url} answered {answer.status}, not JSON: {answer.body[:120]!r}") from None
        if answer.status != 200:
            said = found.get("error", found) if isinstance(found, dict) else found
            raise EndpointError(f"{url} answered {answer.status}: {said}")
        return codec.metadata_tensors(found)
    request = codec.metadata_request(endpoint.model, endpoint.version)
    if endpoint.protocol == "grpc":
        ask = client_method(channel, GET_MODEL_METADATA, "tensorflow.serving.GetModelMetadataRequest",
                            "tensorflow.serving.GetModelMetadataResponse")
    else:
        from tritonclient.grpc import service_pb2_grpc

        ask = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelMetadata
    return codec.metadata_tensors(await ask(request, timeout=30))

def encode(endpoint: Endpoint, arrays: Mapping[str, np.ndarray]) -> Any:
    """One request as the protocol sends it: (body bytes, headers) over HTTP, a request message over gRPC."""
    if endpoint.protocol == "rest":
        return tfserving_rest.encode_request(arrays, endpoint.columnar), {}
    if endpoint.protocol == "v2":
        return kserve_v2.encode_request(arrays, binary=not endpoint.json)
    return CODECS[endpoint.protocol].encode_request(endpoint.model, endpoint.version, arrays)

class RemoteServer:
    """An endpoint as a server to measure: `submit(arrays)` sends one request from the client's event loop and
    returns a Future that completes when the answer has been read (its body is not decoded: a load test
    measures the server, `check` reads answers). Close it when done."""

    def __init__(self, endpoint: Endpoint, connections: int = http1.MOST_CONNECTIONS, timeout_s: float = 60.0,
                 loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop):
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self.loop = loop_factory()
        self._thread = threading.Thread(target=self.loop.run_forever, name="client", daemon=True)
        self._thread.start()
        self._encoded: dict[int, Any] = {}  # id(request arrays) -> encoded request (requests are reused)
        self._wire: dict[int, bytes] = {}  # id(request arrays) -> the HTTP request's bytes
        self._keep: list[Any] = []  # the arrays whose ids key _encoded, kept alive
        self._arrived: collections.deque = collections.deque()  # submitted from other threads, not yet sent
        self._woken = False  # a wake-up of the loop for _arrived is pending
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        try:
            self._call(self._open(connections))
        except BaseException:
            self.close()
            raise

    def sender_cpu_s(self) -> float:
        """CPU seconds the client's event loop thread (which encodes, sends and reads every request) used so far."""
        import time

        return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))

    def _call(self, coroutine, timeout_s: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s or self.timeout_s + 30)

    pool: http1.Pool | None = None
    channel = _send = None
    cpu_s = None  # a callable: the endpoint's CPU seconds so far, when it is a process of this machine (set by its owner)

    async def _open(self, connections: int) -> None:
        if self.endpoint.protocol in ("rest", "v2"):
            self.pool = http1.Pool(self.loop, self.endpoint.host, self.endpoint.port, most=connections,
                                   timeout_s=self.timeout_s)
        else:
            import grpc

            self.channel = grpc.aio.insecure_channel(f"{self.endpoint.host}:{self.endpoint.port}", options=[
                ("grpc.max_receive_message_length", 256 * 2**20), ("grpc.max_send_message_length", 256 * 2**20)])
            if self.endpoint.protocol == "grpc":
                self._send = client_method(self.channel, PREDICT, "tensorflow.serving.PredictRequest",
                                           "tensorflow.serving.PredictResponse")
            else:
                from tritonclient.grpc import service_pb2_grpc

                self._send = service_pb2_grpc.GRPCInferenceServiceStub(self.channel).ModelInfer
        try:
            self.inputs, self.outputs = await read_metadata(self.endpoint, self.pool, self.channel)
        except EndpointError:
            raise
        except Exception as exc:  # noqa: BLE001  (no server, or not this protocol: said in one line)
            raise EndpointError(f"{self.endpoint.name} at {self.endpoint.host}:{self.endpoint.port} did not answer "
                                f"its metadata for model {self.endpoint.model!r} ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:150] if str(exc) else ''})") from None

    def encoded(self, arrays: Mapping[str, np.ndarray]) -> Any:
        """One request as this endpoint's protocol sends it (`encode`), encoded once per arrays object."""
        return self._encode(arrays)

    def _encode(self, arrays: Mapping[str, np.ndarray]) -> Any:
        key = id(arrays)
        if key not in self._encoded:
            self._encoded[key] = encoded = encode(self.endpoint, arrays)
            if self.pool is not None:
                body, headers = encoded
                self._wire[key] = http1.wire("POST", self.endpoint.host, self.endpoint.port,
                                             self.endpoint.path(self.endpoint.infer_verb), body, headers)
            self._keep.append(arrays)
        return self._encoded[key]

    def _wire_of(self, arrays: Mapping[str, np.ndarray]) -> bytes:
        key = id(arrays)
        if key not in self._wire:
            self._encode(arrays)
        return self._wire[key]

    async def http(self, method: str, verb: str, body: bytes = b"",
                   headers: Mapping[str, str] | None = None) -> http1.Answer:
        """One HTTP call on this model (`verb` as `Endpoint.path` takes it), its answer whatever the status."""
        return await self.pool.request(http1.wire(method, self.endpoint.host, self.endpoint.port,
                                                  self.endpoint.path(verb), body, headers))

    async def _request(self, arrays: Mapping[str, np.ndarray], decode: bool = False) -> Any:
        if self.pool is not None:
            answer = await self.pool.request(self._wire_of(arrays))
            if answer.status != 200:
                raise refused(answer)
            return (answer.body, answer.headers) if decode else None
        answer = await self._call_grpc(self._encode(arrays))
        return answer if decode else None

    def submit(self, arrays: Mapping[str, np.ndarray]) -> Future:
        """Send one request (arrays by input name); the Future completes with None when it is answered."""
        future: Future = Future()
        # Encoded in the caller's thread; handed to the loop with whatever else arrived before it woke.
        self._arrived.append((self._wire_of(arrays) if self.pool is not None else self._encode(arrays), future))
        if not self._woken:
            self._woken = True
            self.loop.call_soon_threadsafe(self._send_arrived)
        return future

    def _send_arrived(self) -> None:
        self._woken = False
        while self._arrived:
            sending, future = self._arrived.popleft()
            try:
                if self.pool is not None:
                    self.pool.send(sending, lambda answer, f=future: _settle(f, answer))
                else:
                    task = self.loop.create_task(self._call_grpc(sending))
                    task.add_done_callback(lambda t, f=future: _settle(
                        f, asyncio.CancelledError() if t.cancelled() else t.exception() or OK))
            except Exception as exc:  # noqa: BLE001  (whoever waits on the Future learns why)
                future.set_exception(exc)

    async def _call_grpc(self, message: Any) -> Any:
        return await self._send(message, timeout=self.timeout_s)

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> None:
        return self.submit(arrays).result()

    async def send(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Send one request from a coroutine on this client's own loop (`self.loop`); returns once answered."""
        await self._request(arrays)

    def answer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request's outputs, decoded (to check what the endpoint answers)."""
        return self._decode(self._call(self._request(arrays, decode=True)))

    def decoding(self) -> _Decoding:
        """This endpoint as a server whose Futures complete with the decoded outputs (to check its answers as
        `configs.check_agreement` checks any server's)."""
        return _Decoding(self)

    def _decode(self, found: Any) -> dict[str, np.ndarray]:
        if self.endpoint.protocol == "rest":
            return tfserving_rest.decode_response(found[0], self.outputs)
        if self.endpoint.protocol == "v2":
            return kserve_v2.decode_response(*found)
        return CODECS[self.endpoint.protocol].decode_response(found)

    def close(self) -> None:
        async def shut() -> None:
            if self.pool is not None:
                self.pool.close()
            if self.channel is not None:
                await self.channel.close()

        try:
            self._call(shut(), 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


OK = http1.Answer(200, {}, b"")  # what a gRPC call that returned is settled with


def refused(answer: http1.Answer) -> EndpointError:
    """An answer other than 200, in one line: its status and the start of what the endpoint said."""
    return EndpointError(f"HTTP {answer.status}: {answer.body[:200].decode(errors='replace')}")


def _settle(future: Future, answer: http1.Answer | BaseException) -> None:
    """A submitted request's Future, settled by its answer: None when it is 200, else why not."""
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    elif answer.status != 200:
        future.set_exception(refused(answer))
    else:
        future.set_result(None)


class _Decoding:
    """A RemoteServer whose `submit` Futures complete with the decoded outputs."""

    def __init__(self, remote: RemoteServer):
        self.remote = remote

    def submit(self, arrays: Mapping[str, np.ndarray]) -> Future:
        decoded: Future = Future()
        sent = asyncio.run_coroutine_threadsafe(self.remote._request(arrays, decode=True), self.remote.loop)

        def done(answered: Future) -> None:
            try:
                decoded.set_result(self.remote._decode(answered.result()))
            except BaseException as exc:  # noqa: BLE001  (handed to whoever waits on the Future)
                decoded.set_exception(exc)

        sent.add_done_callback(done)
        return decoded
