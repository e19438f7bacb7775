"""TF Serving's gRPC messages, made without importing TensorFlow.

tensorflow-serving-api's generated modules import `tensorflow.core.framework...`, and importing any module of the
tensorflow package runs TensorFlow's own `__init__`: 5-6 s of CPU and hundreds of MB in every process that serves
an ONNX or LiteRT export, or only sends requests. The same descriptors are read here from those generated files
(parsed, not run) into a descriptor pool of their own, and the message classes made from it: the same messages on
the wire (field numbers, `Any` type URLs), whichever client or server is at the other end.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from pathlib import Path

# The services' full proto names, and the gRPC paths of the methods a client calls.
PREDICTION_SERVICE, MODEL_SERVICE = "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"
PREDICT, GET_MODEL_METADATA = f"/{PREDICTION_SERVICE}/Predict", f"/{PREDICTION_SERVICE}/GetModelMetadata"
# The generated modules whose messages tfperf sends and answers (their imports bring the rest).
MODULES = ("tensorflow_serving.apis.predict_pb2", "tensorflow_serving.apis.get_model_metadata_pb2",
           "tensorflow_serving.apis.get_model_status_pb2")


def _read(path: Path) -> tuple[bytes, list[str]]:
    """A generated _pb2 module's serialized FileDescriptorProto and the _pb2 modules it imports, read from its
    source without running it."""
    serialized, imported = None, []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported += [f"{node.module}.{a.name}" for a in node.names if a.name.endswith("_pb2")]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            serialized = ast.literal_eval(node.args[0])
    if not isinstance(serialized, bytes):
        raise LookupError(f"{path} holds no serialized descriptor")
    return serialized, imported


def _source(module: str) -> Path:
    """Where a generated module's file is, found without importing its package (which would start TensorFlow)."""
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {top!r}", name=top)
    return Path(list(spec.submodule_search_locations)[0]).parent.joinpath(*module.split(".")).with_suffix(".py")


@functools.cache
def _pool():
    """A descriptor pool holding TF Serving's messages and every file they import, in dependency order."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool, added = descriptor_pool.DescriptorPool(), set()

    def add(module: str) -> None:
        if module in added:
            return
        added.add(module)
        proto = descriptor_pb2.FileDescriptorProto()
        if module.startswith("google.protobuf."):  # protobuf's own well-known types: importing them is cheap
            importlib.import_module(module).DESCRIPTOR.CopyToProto(proto)
        else:
            serialized, imported = _read(_source(module))
            for dependency in imported:
                add(dependency)
            proto.MergeFromString(serialized)
        pool.Add(proto)

    try:
        for module in MODULES:
            add(module)
    except (LookupError, SyntaxError, OSError):  # generated in a form this does not read: the modules themselves
        for module in MODULES:
            importlib.import_module(module)
        return descriptor_pool.Default()
    return pool


@functools.cache
def message(name: str) -> type:
    """The class of a message by its full proto name, e.g. 'tensorflow.serving.PredictRequest'."""
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(name))


def client_method(channel, path: str, request: str, response: str):
    """A callable for one unary method on a gRPC channel (grpc or grpc.aio), sending and reading these messages."""
    return channel.unary_unary(path, request_serializer=message(request).SerializeToString,
                               response_deserializer=message(response).FromString)


def server_method(handler, request: str, response: str):
    """A gRPC server's handler for one unary method: `handler(request, context)` on these messages."""
    import grpc

    return grpc.unary_unary_rpc_method_handler(handler, request_deserializer=message(request).FromString,
                                               response_serializer=message(response).SerializeToString)
