"""KServe's Open Inference Protocol (v2) over gRPC, both sides: ModelInfer's request read (raw contents, as
tritonclient sends them, or typed contents) and answered with raw contents, as Triton answers; the same
messages built and read by the client (`tfperf load --url grpc+v2://HOST:PORT/NAME`). The messages come
from tritonclient's definitions; datatypes and the raw encoding are `kserve_v2`'s."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from tfperf.serving.protocols.kserve_v2 import (NUMPY_TO_V2, V2_TYPES, InferRequest, from_bytes, input_tensor,
                                                to_bytes)
from tfperf.serving.protocols.tensors import (RequestError, Tensor, dtype_name, every_input, metadata_dtype,
                                              metadata_shape)

_V2_FIELDS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
              "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
              "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
              "FP64": "fp64_contents", "BYTES": "bytes_contents"}


# The server ---------------------------------------------------------------------------------------

def infer_request(request, inputs: Sequence[Tensor]) -> InferRequest:
    """A ModelInferRequest as a decoded v2 request: raw_input_contents in input order (tritonclient's way), or
    each input's typed contents."""
    by_name = {s.name: s for s in inputs}
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise RequestError(400, f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    arrays = {}
    for i, item in enumerate(request.inputs):
        name, datatype, shape = item.name, item.datatype, list(item.shape)
        if name not in by_name:
            raise RequestError(400, f"unknown input {name!r}: the model takes {sorted(by_name)}")
        if datatype not in V2_TYPES:
            raise RequestError(400, f"input {name!r}: datatype {datatype!r} is not one of {sorted(V2_TYPES)}")
        if any(d < 0 for d in shape):
            raise RequestError(400, f"input {name!r}: shape {shape} has a negative size")
        spec = by_name[name]
        if raw:
            array = from_bytes(raw[i], datatype, shape, f"input {name!r}")
        elif datatype in _V2_FIELDS:
            values = list(getattr(item.contents, _V2_FIELDS[datatype]))
            if len(values) != math.prod(shape):
                raise RequestError(400, f"input {name!r}: {len(values)} values for shape {shape}")
            array = np.asarray(values, dtype=object if datatype == "BYTES" else V2_TYPES[datatype]).reshape(shape)
        else:
            raise RequestError(400, f"input {name!r}: {datatype} comes only in raw_input_contents")
        arrays[name] = input_tensor(array, datatype, spec)
    every_input(arrays, inputs)
    return InferRequest(request.id or None, arrays, {o.name: True for o in request.outputs}, True)


def infer_response(name: str, version: int, request: InferRequest, outputs: Mapping[str, np.ndarray]):
    """A ModelInferResponse with raw_output_contents, as Triton answers tritonclient."""
    from tritonclient.grpc import service_pb2

    unknown = sorted(set(request.outputs) - set(outputs))
    if unknown:
        raise RequestError(400, f"unknown output {unknown[0]!r}: the model answers {sorted(outputs)}")
    response = service_pb2.ModelInferResponse(model_name=name, model_version=str(version), id=request.id or "")
    for out in request.outputs or sorted(outputs):
        array = np.asarray(outputs[out])
        dtype = dtype_name(array)
        response.outputs.add(name=out, datatype=NUMPY_TO_V2.get(dtype, "BYTES"), shape=list(array.shape))
        response.raw_output_contents.append(to_bytes(array))
    return response


# The client ---------------------------------------------------------------------------------------

def metadata_request(model: str, version: int | None):
    """A ModelMetadataRequest."""
    from tritonclient.grpc import service_pb2

    return service_pb2.ModelMetadataRequest(name=model, version=str(version or ""))


def metadata_tensors(answer) -> tuple[list[Tensor], list[Tensor]]:
    """The inputs and outputs of a ModelMetadataResponse."""
    inputs, outputs = ([Tensor(t.name, metadata_dtype(V2_TYPES, t.datatype, t.name), metadata_shape(t.shape))
                        for t in getattr(answer, kind)] for kind in ("inputs", "outputs"))
    return inputs, outputs


def encode_request(model: str, version: int | None, arrays: Mapping[str, np.ndarray]):
    """A ModelInferRequest with raw_input_contents, as tritonclient sends."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, model_version=str(version or ""))
    for name, value in arrays.items():
        array = np.asarray(value)
        request.inputs.add(name=name, datatype=NUMPY_TO_V2[dtype_name(array)], shape=list(array.shape))
        request.raw_input_contents.append(to_bytes(array))
    return request


def decode_response(answer) -> dict[str, np.ndarray]:
    """A ModelInferResponse's raw outputs as arrays by name."""
    return {t.name: from_bytes(raw, t.datatype, list(t.shape), t.name)
            for t, raw in zip(answer.outputs, answer.raw_output_contents)}
