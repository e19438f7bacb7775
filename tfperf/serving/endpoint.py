"""Any running endpoint as a server to measure (`tfperf load --url`): its URL read as one of the protocols
`tfperf serve`, TF Serving, Triton and KServe speak, its inputs read from its own metadata, and a client that
sends requests from an asyncio event loop of its own thread (HTTP/1.1 keep-alive through aiohttp, gRPC's own
asyncio stubs), each request's body encoded once, so that the sending side costs as little as Python allows.
`RemoteServer.submit(arrays)` returns a Future, as the in-process servers' does, so the closed loop and LoadGen
measure it unchanged.

  http://HOST:PORT/v1/models/NAME[/versions/N]   TF Serving REST (row format; columnar with `columnar=True`)
  grpc://HOST:PORT/NAME[/versions/N]             TF Serving gRPC (PredictionService)
  http://HOST:PORT/v2/models/NAME[/versions/N]   KServe v2 / Triton over HTTP (binary tensors; JSON with `json=True`)
  grpc+v2://HOST:PORT/NAME[/versions/N]          KServe v2 / Triton over gRPC
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from tfperf.serving.wire import (NUMPY_TO_V2, TF_NAMES, V2_TYPES, Tensor, dtype_name, dump_json, from_json_values,
                                 json_values, to_v2_bytes, v2_json_bytes, v2_json_strings)

PROTOCOLS = {"rest": "TF Serving REST", "grpc": "TF Serving gRPC", "v2": "KServe v2 over HTTP",
             "grpc+v2": "KServe v2 over gRPC"}
_URL = re.compile(r"^(?P<scheme>https?|grpc|grpc\+v2)://(?P<host>\[[^\]]+\]|[^/:]+):(?P<port>\d+)(?P<path>/.*)?$")


class EndpointError(ValueError):
    """A URL that names no endpoint tfperf can load, or an endpoint that does not answer as its protocol does."""


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

    def url(self, verb: str = "") -> str:
        """The HTTP URL of a v1 or v2 call on this model (`verb`: ':predict', '/metadata', '/infer', ...)."""
        version = f"/versions/{self.version}" if self.version else ""
        api = "v1" if self.protocol == "rest" else "v2"
        return f"http://{self.host}:{self.port}/{api}/models/{self.model}{version}{verb}"


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


def _shape(dims: Sequence[Any]) -> tuple[int | None, ...]:
    return tuple(None if int(d) < 0 else int(d) for d in dims)


def _dtype(names: Mapping[Any, str], code: Any, tensor: str) -> str:
    """NumPy's name for a tensor's type in a metadata answer; EndpointError for a type no request can carry (a
    guess would send the server arrays of the wrong type)."""
    if code not in names:
        raise EndpointError(f"the model's tensor {tensor!r} has type {code}, which tfperf cannot send or read: "
                            f"measure a signature whose tensors are {', '.join(sorted(set(names.values())))}")
    return names[code]


def rest_tensors(found: Mapping[str, Any]) -> tuple[list[Tensor], list[Tensor]]:
    """The inputs and outputs of TF Serving's REST metadata answer (GetModelMetadataResponse as JSON)."""
    signatures = found["metadata"]["signature_def"]["signature_def"]
    signature = signatures.get("serving_default") or next(iter(signatures.values()))
    inputs, outputs = ([Tensor(name, _dtype(TF_NAMES, info["dtype"], name),
                               _shape(d["size"] for d in info["tensor_shape"]["dim"]))
                        for name, info in sorted(signature[kind].items())] for kind in ("inputs", "outputs"))
    return inputs, outputs


async def read_metadata(endpoint: Endpoint, session=None, channel=None) -> tuple[list[Tensor], list[Tensor]]:
    """The model's inputs and outputs, as its own metadata API gives them."""
    from tfperf.serving.grpc_wire import ENUM_TF

    if endpoint.protocol == "rest":
        async with session.get(endpoint.url("/metadata")) as answer:
            found = json.loads(await answer.read())
            if answer.status != 200:
                raise EndpointError(f"{endpoint.url('/metadata')} answered {answer.status}: {found.get('error', found)}")
        return rest_tensors(found)
    if endpoint.protocol == "v2":
        async with session.get(endpoint.url()) as answer:
            found = json.loads(await answer.read())
            if answer.status != 200:
                raise EndpointError(f"{endpoint.url()} answered {answer.status}: {found.get('error', found)}")
        return ([Tensor(t["name"], _dtype(V2_TYPES, t["datatype"], t["name"]), _shape(t["shape"]))
                 for t in found[kind]] for kind in ("inputs", "outputs"))
    if endpoint.protocol == "grpc":
        from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = endpoint.model
        if endpoint.version:
            request.model_spec.version.value = endpoint.version
        answer = await prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, timeout=30)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        answer.metadata["signature_def"].Unpack(signatures)
        signature = signatures.signature_def.get("serving_default") or next(iter(signatures.signature_def.values()))
        return ([Tensor(name, _dtype(ENUM_TF, info.dtype, name), _shape(d.size for d in info.tensor_shape.dim))
                 for name, info in sorted(getattr(signature, kind).items())] for kind in ("inputs", "outputs"))
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    answer = await service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
        service_pb2.ModelMetadataRequest(name=endpoint.model, version=str(endpoint.version or "")), timeout=30)
    return ([Tensor(t.name, _dtype(V2_TYPES, t.datatype, t.name), _shape(t.shape)) for t in getattr(answer, kind)]
            for kind in ("inputs", "outputs"))


def encode(endpoint: Endpoint, arrays: Mapping[str, np.ndarray]) -> Any:
    """One request as the protocol sends it: (body bytes, headers) over HTTP, a request message over gRPC."""
    if endpoint.protocol == "rest":
        if endpoint.columnar:
            return dump_json({"inputs": {k: json_values(np.asarray(v)) for k, v in arrays.items()}}), {}
        rows = len(next(iter(arrays.values())))
        return dump_json({"instances": [{k: json_values(np.asarray(v)[i]) for k, v in arrays.items()}
                                        for i in range(rows)]}), {}
    if endpoint.protocol == "v2":
        tensors, raw = [], []
        for name, value in arrays.items():
            array = np.asarray(value)
            entry = {"name": name, "shape": list(array.shape), "datatype": NUMPY_TO_V2[dtype_name(array)]}
            if endpoint.json:  # BYTES as JSON strings, as KServe v2 writes them
                entry["data"] = (v2_json_strings(array) if dtype_name(array) == "string"
                                 else array.reshape(-1).tolist())
            else:
                data = to_v2_bytes(array)
                entry["parameters"] = {"binary_data_size": len(data)}
                raw.append(data)
            tensors.append(entry)
        header = dump_json({"inputs": tensors, "parameters": {"binary_data_output": not endpoint.json}})
        if endpoint.json:
            return header, {"Content-Type": "application/json"}
        return header + b"".join(raw), {"Inference-Header-Content-Length": str(len(header)),
                                        "Content-Type": "application/octet-stream"}
    if endpoint.protocol == "grpc":
        from tensorflow_serving.apis import predict_pb2

        from tfperf.serving.grpc_wire import to_tensor_proto

        request = predict_pb2.PredictRequest()
        request.model_spec.name = endpoint.model
        if endpoint.version:
            request.model_spec.version.value = endpoint.version
        for name, value in arrays.items():
            request.inputs[name].CopyFrom(to_tensor_proto(np.asarray(value)))
        return request
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=endpoint.model, model_version=str(endpoint.version or ""))
    for name, value in arrays.items():
        array = np.asarray(value)
        request.inputs.add(name=name, datatype=NUMPY_TO_V2[dtype_name(array)], shape=list(array.shape))
        request.raw_input_contents.append(to_v2_bytes(array))
    return request


class RemoteServer:
    """An endpoint as a server to measure: `submit(arrays)` sends one request from the client's event loop and
    returns a Future that completes when the answer has been read (its body is not decoded: a load test
    measures the server, `check` reads answers). Close it when done."""

    def __init__(self, endpoint: Endpoint, connections: int = 64, timeout_s: float = 60.0):
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="client", daemon=True)
        self._thread.start()
        self._encoded: dict[int, Any] = {}  # id(request arrays) -> encoded request (requests are reused)
        self._keep: list[Any] = []  # the arrays whose ids key _encoded, kept alive
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

    session = channel = _send = None
    cpu_s = None  # a callable: the endpoint's CPU seconds so far, when it is a process of this machine (set by its owner)

    async def _open(self, connections: int) -> None:
        import aiohttp

        if self.endpoint.protocol in ("rest", "v2"):
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=connections, limit_per_host=connections, ttl_dns_cache=None),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        else:
            import grpc

            self.channel = grpc.aio.insecure_channel(f"{self.endpoint.host}:{self.endpoint.port}", options=[
                ("grpc.max_receive_message_length", 256 * 2**20), ("grpc.max_send_message_length", 256 * 2**20)])
            if self.endpoint.protocol == "grpc":
                from tensorflow_serving.apis import prediction_service_pb2_grpc

                self._send = prediction_service_pb2_grpc.PredictionServiceStub(self.channel).Predict
            else:
                from tritonclient.grpc import service_pb2_grpc

                self._send = service_pb2_grpc.GRPCInferenceServiceStub(self.channel).ModelInfer
        try:
            self.inputs, self.outputs = await read_metadata(self.endpoint, self.session, self.channel)
        except EndpointError:
            raise
        except Exception as exc:  # noqa: BLE001  (no server, or not this protocol: said in one line)
            raise EndpointError(f"{self.endpoint.name} at {self.endpoint.host}:{self.endpoint.port} did not answer "
                                f"its metadata for model {self.endpoint.model!r} ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:150] if str(exc) else ''})") from None

    def _encode(self, arrays: Mapping[str, np.ndarray]) -> Any:
        key = id(arrays)
        if key not in self._encoded:
            self._encoded[key] = encode(self.endpoint, arrays)
            self._keep.append(arrays)
        return self._encoded[key]

    async def _request(self, encoded: Any, decode: bool = False) -> Any:
        if self.session is not None:
            body, headers = encoded
            verb = ":predict" if self.endpoint.protocol == "rest" else "/infer"
            async with self.session.post(self.endpoint.url(verb), data=body, headers=headers) as answer:
                data = await answer.read()
                if answer.status != 200:
                    raise EndpointError(f"HTTP {answer.status}: {data[:200].decode(errors='replace')}")
                return (data, answer.headers) if decode else None
        answer = await self._send(encoded, timeout=self.timeout_s)
        return answer if decode else None

    def submit(self, arrays: Mapping[str, np.ndarray]) -> Future:
        """Send one request (arrays by input name); the Future completes with None when it is answered."""
        encoded = self._encode(arrays)
        return asyncio.run_coroutine_threadsafe(self._request(encoded), self.loop)

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> None:
        return self.submit(arrays).result()

    def answer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request's outputs, decoded (to check what the endpoint answers)."""
        return self._decode(self._call(self._request(self._encode(arrays), decode=True)))

    def decoding(self) -> _Decoding:
        """This endpoint as a server whose Futures complete with the decoded outputs (to check its answers as
        `configs.check_agreement` checks any server's)."""
        return _Decoding(self)

    def _decode(self, found: Any) -> dict[str, np.ndarray]:
        from tfperf.serving.grpc_wire import from_tensor_proto
        from tfperf.serving.wire import from_v2_bytes

        if self.endpoint.protocol == "rest":  # JSON values as the metadata's dtypes (bytes from {"b64": ...})
            dtypes = {t.name: t.dtype for t in self.outputs}
            typed = lambda name, values: (np.asarray(from_json_values(values), dtype=object)  # noqa: E731
                                          if dtypes.get(name) == "string" else np.asarray(values, dtypes.get(name)))
            data = json.loads(found[0])
            if "outputs" in data:
                return {k: typed(k, v) for k, v in (data["outputs"].items() if isinstance(data["outputs"], dict)
                                                    else [(self.outputs[0].name, data["outputs"])])}
            rows = data["predictions"]
            if rows and isinstance(rows[0], dict):
                return {k: typed(k, [r[k] for r in rows]) for k in rows[0]}
            return {self.outputs[0].name: typed(self.outputs[0].name, rows)}
        if self.endpoint.protocol == "v2":
            body, headers = found
            length = int(headers.get("Inference-Header-Content-Length", len(body)))
            header, at, outputs = json.loads(body[:length]), length, {}
            for t in header["outputs"]:
                if "data" in t:  # BYTES as JSON strings
                    outputs[t["name"]] = (v2_json_bytes(t["data"]) if t["datatype"] == "BYTES" else
                                          np.asarray(t["data"], dtype=V2_TYPES[t["datatype"]])).reshape(t["shape"])
                else:
                    size = t["parameters"]["binary_data_size"]
                    outputs[t["name"]] = from_v2_bytes(body[at:at + size], t["datatype"], t["shape"], t["name"])
                    at += size
            return outputs
        if self.endpoint.protocol == "grpc":
            return {k: from_tensor_proto(v, k) for k, v in found.outputs.items()}
        return {t.name: from_v2_bytes(raw, t.datatype, list(t.shape), t.name)
                for t, raw in zip(found.outputs, found.raw_output_contents)}

    def close(self) -> None:
        async def shut() -> None:
            if self.session is not None:
                await self.session.close()
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


class _Decoding:
    """A RemoteServer whose `submit` Futures complete with the decoded outputs."""

    def __init__(self, remote: RemoteServer):
        self.remote = remote

    def submit(self, arrays: Mapping[str, np.ndarray]) -> Future:
        decoded: Future = Future()
        sent = asyncio.run_coroutine_threadsafe(self.remote._request(self.remote._encode(arrays), decode=True),
                                                self.remote.loop)

        def done(answered: Future) -> None:
            try:
                decoded.set_result(self.remote._decode(answered.result()))
            except BaseException as exc:  # noqa: BLE001  (handed to whoever waits on the Future)
                decoded.set_exception(exc)

        sent.add_done_callback(done)
        return decoded
