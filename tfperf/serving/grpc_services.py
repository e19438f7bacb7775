"""The gRPC services of `tfperf serve`, from the services' own definitions: TF Serving's PredictionService and
ModelService (`tensorflow-serving-api`'s messages, made without TensorFlow) and the v2 protocol's
GRPCInferenceService (tritonclient's), each an asyncio servicer on the server's event loop, answering through
`Server.infer` as the HTTP APIs do."""

from __future__ import annotations

import time
from typing import Any

from tfperf import __version__
from tfperf.serving.deploy_files import triton_config
from tfperf.serving.protocols import kserve_v2_grpc, tfserving_grpc
from tfperf.serving.protocols.kserve_v2 import NUMPY_TO_V2
from tfperf.serving.protocols.tensors import RequestError, http_status
from tfperf.serving.protocols.tfserving_messages import MODEL_SERVICE, PREDICTION_SERVICE, server_method
from tfperf.serving.repository import AVAILABLE, NotServed

# gRPC status codes by the HTTP status a RequestError carries (503: the queue is full): the edge's mapping.
GRPC_CODES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 413: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
              501: "UNIMPLEMENTED", 503: "RESOURCE_EXHAUSTED", 504: "DEADLINE_EXCEEDED"}


async def _refuse(server, context, protocol: str, started: float, exc: Exception) -> None:
    import grpc

    code = GRPC_CODES.get(http_status(exc), "UNKNOWN")
    server.count(protocol, code, started)
    await context.abort(getattr(grpc.StatusCode, code), str(exc))


def _version(spec) -> int | None:
    """The version a TF Serving ModelSpec asks for (None: the served one); labels are not served."""
    if spec.WhichOneof("version_choice") == "version_label":
        raise RequestError(404, "version labels are not served: ask for a version number")
    return spec.version.value if spec.HasField("version") else None


def add_services(grpc_server, server) -> None:
    """Register TF Serving's two services and v2's on `grpc_server`, answering for `server` (a Server)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    def answered(protocol: str):
        """A handler counted in the server's metrics, a RequestError turned into the gRPC status it maps to."""
        def wrap(method):
            async def handle(self, request, context):
                started = time.perf_counter()
                try:
                    response = await method(self, request, context)
                except (RequestError, NotServed) as exc:
                    await _refuse(server, context, protocol, started, exc)
                server.count(protocol, "OK", started)
                return response
            return handle
        return wrap

    class PredictionService:
        @answered("grpc")
        async def Predict(self, request, context):
            repository = server.model(request.model_spec.name)
            v = repository.acquire(_version(request.model_spec))
            try:
                arrays = tfserving_grpc.predict_request(request, v.inputs, v.signature)
                outputs = await server.infer(v, arrays, deadline_s=context.time_remaining())
            finally:
                repository.release(v)
            return tfserving_grpc.predict_response(repository.name, v.number, v.signature, outputs, list(request.output_filter))

        @answered("grpc")
        async def GetModelMetadata(self, request, context):
            repository = server.model(request.model_spec.name)
            unknown = [f for f in request.metadata_field if f != "signature_def"]
            if unknown or not request.metadata_field:
                raise RequestError(400, f"metadata_field must be ['signature_def'], got "
                                        f"{list(request.metadata_field)[:5]}")
            v = repository.get(_version(request.model_spec))
            return tfserving_grpc.metadata_response(repository.name, v.number, v.signature, v.inputs, v.outputs)

    class ModelService:
        @answered("grpc")
        async def GetModelStatus(self, request, context):
            repository = server.model(request.model_spec.name)
            asked = _version(request.model_spec)
            states = {v: s for v, s in repository.states.items() if asked in (None, v)}
            if not states:
                raise RequestError(404, f"model {repository.name!r} has no version {asked}")
            return tfserving_grpc.status_response(states, repository.errors)

    def tensors(items) -> list[Any]:
        return [service_pb2.ModelMetadataResponse.TensorMetadata(
            name=t.name, datatype=NUMPY_TO_V2.get(t.dtype, "BYTES"), shape=[-1 if d is None else d for d in t.shape])
            for t in items]

    def asked(version: str) -> int | None:
        if not version:
            return None
        if not version.isdigit():
            raise RequestError(400, f"version {version[:20]!r} is not a number")
        return int(version)

    class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
        async def ServerLive(self, request, context):
            return service_pb2.ServerLiveResponse(live=True)

        async def ServerReady(self, request, context):
            return service_pb2.ServerReadyResponse(ready=server.repository.current is not None)

        async def ModelReady(self, request, context):
            try:
                server.model(request.name).get(asked(request.version))
                return service_pb2.ModelReadyResponse(ready=True)
            except (RequestError, NotServed):
                return service_pb2.ModelReadyResponse(ready=False)

        async def ServerMetadata(self, request, context):
            return service_pb2.ServerMetadataResponse(name="tfperf", version=__version__,
                                                      extensions=["binary_tensor_data"])

        @answered("v2-grpc")
        async def ModelMetadata(self, request, context):
            repository = server.model(request.name)
            v = repository.get(asked(request.version))
            return service_pb2.ModelMetadataResponse(name=repository.name, versions=[str(v.number)],
                                                     platform=v.platform, inputs=tensors(v.inputs),
                                                     outputs=tensors(v.outputs))

        @answered("v2-grpc")
        async def ModelConfig(self, request, context):
            from google.protobuf import json_format
            from tritonclient.grpc import model_config_pb2

            repository = server.model(request.name)
            v = repository.get(asked(request.version))
            config = json_format.ParseDict(triton_config(repository, v), model_config_pb2.ModelConfig())
            return service_pb2.ModelConfigResponse(config=config)

        @answered("v2-grpc")
        async def ModelInfer(self, request, context):
            repository = server.model(request.model_name)
            v = repository.acquire(asked(request.model_version))
            try:
                decoded = kserve_v2_grpc.infer_request(request, v.inputs)
                outputs = await server.infer(v, decoded.arrays, deadline_s=context.time_remaining())
            finally:
                repository.release(v)
            return kserve_v2_grpc.infer_response(repository.name, v.number, decoded, outputs)

        async def RepositoryIndex(self, request, context):
            r = server.repository
            return service_pb2.RepositoryIndexResponse(models=[
                service_pb2.RepositoryIndexResponse.ModelIndex(
                    name=r.name, version=str(v), state="READY" if s == AVAILABLE else "UNAVAILABLE")
                for v, s in sorted(r.states.items())])

    # TF Serving's methods by name (one not served here, such as Classify, answers UNIMPLEMENTED).
    predictions, models = PredictionService(), ModelService()
    grpc_server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler(PREDICTION_SERVICE, {
            "Predict": server_method(predictions.Predict, "tensorflow.serving.PredictRequest",
                                     "tensorflow.serving.PredictResponse"),
            "GetModelMetadata": server_method(predictions.GetModelMetadata,
                                              "tensorflow.serving.GetModelMetadataRequest",
                                              "tensorflow.serving.GetModelMetadataResponse")}),
        grpc.method_handlers_generic_handler(MODEL_SERVICE, {
            "GetModelStatus": server_method(models.GetModelStatus, "tensorflow.serving.GetModelStatusRequest",
                                            "tensorflow.serving.GetModelStatusResponse")})))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(), grpc_server)
