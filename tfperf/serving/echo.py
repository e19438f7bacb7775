"""A server that does no work: it answers every request at once with the answer an endpoint gave to the same
request, in the same protocol, from a process of its own. Measured with the same client, load and rules as
the endpoint, it is the client's ceiling on this machine: what `tfperf load --url` could see of a server
infinitely fast, the figure every endpoint's result is read against (perf_analyzer warns when its client is
the limit; this measures where that limit is)."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import signal
from typing import Any

# The gRPC methods an echo answers, by protocol: (service, predict method, metadata method).
GRPC_METHODS = {"grpc": ("tensorflow.serving.PredictionService", "Predict", "GetModelMetadata"),
                "grpc+v2": ("inference.GRPCInferenceService", "ModelInfer", "ModelMetadata")}


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What an endpoint answered: to the metadata request and to an inference request (bytes, as sent)."""

    protocol: str
    metadata: bytes
    answer: bytes
    headers: tuple[tuple[str, str], ...] = ()  # HTTP headers the answer needs (the v2 binary header's length)


async def record(remote) -> Recorded:
    """The answers of a `RemoteServer`'s endpoint to its metadata and to its first encoded request."""
    endpoint, encoded = remote.endpoint, next(iter(remote._encoded.values()))
    if endpoint.protocol in ("rest", "v2"):
        metadata = (await remote.http("GET", endpoint.metadata_verb)).body
        body, headers = encoded
        got = await remote.http("POST", endpoint.infer_verb, body, headers)
        kept = tuple((k, v) for k, v in got.headers.items() if k == "inference-header-content-length")
        return Recorded(endpoint.protocol, metadata, got.body, kept)
    from tfperf.serving.endpoint import CODECS

    service, _, meta_method = GRPC_METHODS[endpoint.protocol]
    request = CODECS[endpoint.protocol].metadata_request(endpoint.model, endpoint.version)
    raw = remote.channel.unary_unary(f"/{service}/{meta_method}", request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=lambda b: b)
    metadata = await raw(request, timeout=30)
    predict = remote.channel.unary_unary(f"/{service}/{GRPC_METHODS[endpoint.protocol][1]}",
                                         request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=lambda b: b)
    return Recorded(endpoint.protocol, metadata, await predict(encoded, timeout=30))


async def _serve(recorded: Recorded, ports, stop: asyncio.Event) -> None:
    if recorded.protocol in ("rest", "v2"):
        from aiohttp import web

        kind = "application/json" if not recorded.headers else "application/octet-stream"

        async def post(request):
            try:
                await request.read()
            except ConnectionResetError:  # a closed loop's client that stops mid-request (h2load at its end)
                return web.Response(status=499)
            return web.Response(body=recorded.answer, content_type=kind, headers=dict(recorded.headers))

        async def get(request):
            return web.Response(body=recorded.metadata, content_type="application/json")

        app = web.Application(client_max_size=2**30)
        app.router.add_route("POST", "/{tail:.*}", post)
        app.router.add_route("GET", "/{tail:.*}", get)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.put(site._server.sockets[0].getsockname()[1])
        await stop.wait()
        await runner.cleanup()
        return
    import grpc

    service, predict, metadata = GRPC_METHODS[recorded.protocol]

    async def answer(request, context):
        return recorded.answer

    async def describe(request, context):
        return recorded.metadata

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {
        predict: grpc.unary_unary_rpc_method_handler(answer), metadata: grpc.unary_unary_rpc_method_handler(describe)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ports.put(port)
    await stop.wait()
    await server.stop(1)


def _main(recorded: Recorded, ports) -> None:
    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await _serve(recorded, ports, stop)

    asyncio.run(run())


class EchoProcess:
    """An echo of `recorded` on a free port of 127.0.0.1 in a process of its own; `port`; close it when done."""

    def __init__(self, recorded: Recorded):
        context = multiprocessing.get_context("spawn")
        ports: Any = context.Queue()
        self.process = context.Process(target=_main, args=(recorded, ports), daemon=True)
        self.process.start()
        try:
            self.port = int(ports.get(timeout=60))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()

    def __enter__(self) -> EchoProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
