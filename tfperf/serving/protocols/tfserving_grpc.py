"""TF Serving's gRPC API, both sides: TensorProto to and from arrays (tensor_content, or the typed value fields
tf.make_tensor_proto and other clients fill), PredictionService's Predict and GetModelMetadata and
ModelService's status on the server; the same messages built and read by the client (`tfperf load --url
grpc://HOST:PORT/NAME`). The messages are `tensorflow-serving-api`'s, made without TensorFlow (tfserving_messages)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from tfperf.serving.protocols.tensors import (RequestError, Tensor, check_shape, dtype_name, every_input,
                                              from_wire, metadata_dtype, metadata_shape, to_wire, wire_dtype)
from tfperf.serving.protocols.tfserving_messages import message

# TensorFlow's DataType enum values (tensorflow/core/framework/types.proto) and NumPy's names.
TF_ENUM = {"float32": 1, "float64": 2, "int32": 3, "uint8": 4, "int16": 5, "int8": 6, "string": 7, "int64": 9,
           "bool": 10, "uint16": 17, "float16": 19, "uint32": 22, "uint64": 23}
ENUM_TF = {v: k for k, v in TF_ENUM.items()}
# Which typed field of a TensorProto holds each dtype's values when tensor_content is empty.
_TF_FIELDS = {"float32": "float_val", "float64": "double_val", "int32": "int_val", "uint8": "int_val",
              "int16": "int_val", "int8": "int_val", "uint16": "int_val", "int64": "int64_val", "bool": "bool_val",
              "float16": "half_val", "uint32": "uint32_val", "uint64": "uint64_val", "string": "string_val"}


def from_tensor_proto(proto, where: str) -> np.ndarray:
    """A TensorProto as an array: its tensor_content, or its typed values (one value fills the whole shape,
    as TensorFlow reads it); a 400 for a dtype or a count that does not fit."""
    dtype = ENUM_TF.get(proto.dtype)
    if dtype is None:
        raise RequestError(400, f"{where}: dtype {proto.dtype} is not one tfperf serves")
    shape = [d.size for d in proto.tensor_shape.dim]
    if any(d < 0 for d in shape):
        raise RequestError(400, f"{where}: shape {shape} has an unknown size")
    count = math.prod(shape)
    if dtype == "string":
        values = np.asarray(list(proto.string_val), dtype=object)
    elif proto.tensor_content:
        if len(proto.tensor_content) != count * wire_dtype(dtype).itemsize:
            raise RequestError(400, f"{where}: {len(proto.tensor_content)} bytes of {dtype} for shape {shape}")
        return from_wire(proto.tensor_content, dtype, shape)
    elif dtype == "float16":
        values = np.asarray(proto.half_val, dtype=np.uint16).view(np.float16)
    else:
        values = np.asarray(getattr(proto, _TF_FIELDS[dtype]), dtype=dtype)
    if len(values) == count:
        return values.reshape(shape)
    if len(values) == 1:
        return np.full(shape, values[0], dtype=values.dtype)
    raise RequestError(400, f"{where}: {len(values)} values for shape {shape}")


def to_tensor_proto(array: np.ndarray):
    """An array as a TensorProto (tensor_content; strings as string_val), as TF Serving answers."""
    array = np.asarray(array)
    dtype = dtype_name(array)
    proto = message("tensorflow.TensorProto")(dtype=TF_ENUM[dtype])
    proto.tensor_shape.dim.extend(message("tensorflow.TensorShapeProto.Dim")(size=d) for d in array.shape)
    if dtype == "string":
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1))
    else:
        proto.tensor_content = to_wire(array)
    return proto


# The server ---------------------------------------------------------------------------------------

def predict_request(request, inputs: Sequence[Tensor], signature: str) -> dict[str, np.ndarray]:
    """A PredictRequest's inputs as arrays by name, checked against the model's."""
    asked = request.model_spec.signature_name
    if asked and asked != signature:
        raise RequestError(400, f"serving signature name {asked!r} not found: this model serves {signature!r}")
    by_name = {s.name: s for s in inputs}
    unknown = sorted(set(request.inputs) - set(by_name))
    missing = sorted(set(by_name) - set(request.inputs))
    if unknown or missing:
        raise RequestError(400, f"the request's inputs {sorted(request.inputs)} are not the model's {sorted(by_name)}")
    arrays = {}
    for name, spec in by_name.items():
        array = from_tensor_proto(request.inputs[name], f"input {name!r}")
        if spec.dtype != "string" and array.dtype != np.dtype(spec.dtype):
            if (spec.dtype == "string") != (array.dtype == object) or (
                    array.dtype.kind == "f" and np.dtype(spec.dtype).kind in "iub"):
                raise RequestError(400, f"input {name!r} is {array.dtype.name}; the model takes {spec.dtype}")
            array = array.astype(spec.dtype)
        elif spec.dtype == "string" and array.dtype != object:
            raise RequestError(400, f"input {name!r} is {array.dtype.name}; the model takes strings")
        check_shape(array, spec, f"input {name!r}")
        arrays[name] = array
    every_input(arrays, inputs)
    return arrays


def predict_response(name: str, version: int, signature: str, outputs: Mapping[str, np.ndarray],
                     output_filter: Sequence[str] = ()):
    """A PredictResponse holding the outputs (those of `output_filter`, when given)."""
    unknown = sorted(set(output_filter) - set(outputs))
    if unknown:
        raise RequestError(400, f"output_filter names {unknown[0]!r}: the model answers {sorted(outputs)}")
    response = message("tensorflow.serving.PredictResponse")()
    response.model_spec.name, response.model_spec.signature_name = name, signature
    response.model_spec.version.value = version
    for key in output_filter or outputs:
        response.outputs[key].CopyFrom(to_tensor_proto(outputs[key]))
    return response


def metadata_response(name: str, version: int, signature: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor]):
    """A GetModelMetadataResponse whose `signature_def` holds the served signature, as TF Serving's does."""
    def info(t: Tensor):
        tensor = message("tensorflow.TensorInfo")(name=t.name, dtype=TF_ENUM.get(t.dtype, 0))
        tensor.tensor_shape.dim.extend(message("tensorflow.TensorShapeProto.Dim")(size=-1 if d is None else d)
                                       for d in t.shape)
        return tensor

    signatures = message("tensorflow.serving.SignatureDefMap")()
    sig = signatures.signature_def[signature]
    sig.method_name = "tensorflow/serving/predict"
    for t in inputs:
        sig.inputs[t.name].CopyFrom(info(t))
    for t in outputs:
        sig.outputs[t.name].CopyFrom(info(t))
    response = message("tensorflow.serving.GetModelMetadataResponse")()
    response.model_spec.name = name
    response.model_spec.version.value = version
    response.metadata["signature_def"].Pack(signatures)
    return response


def status_response(versions: Mapping[int, str], errors: Mapping[int, str] | None = None):
    """A GetModelStatusResponse: each version's state, as ModelService answers."""
    states = message("tensorflow.serving.ModelVersionStatus").State
    response = message("tensorflow.serving.GetModelStatusResponse")()
    for version, state in sorted(versions.items(), reverse=True):
        status = response.model_version_status.add(version=version, state=states.Value(state))
        error = (errors or {}).get(version)
        status.status.error_code = 2 if error else 0  # UNKNOWN, OK
        status.status.error_message = error or ""
    return response


# The client ---------------------------------------------------------------------------------------

def metadata_request(model: str, version: int | None):
    """A GetModelMetadataRequest for the model's signatures."""
    request = message("tensorflow.serving.GetModelMetadataRequest")(metadata_field=["signature_def"])
    request.model_spec.name = model
    if version:
        request.model_spec.version.value = version
    return request


def metadata_tensors(answer) -> tuple[list[Tensor], list[Tensor]]:
    """The inputs and outputs of a GetModelMetadataResponse (serving_default, else its first signature)."""
    signatures = message("tensorflow.serving.SignatureDefMap")()
    answer.metadata["signature_def"].Unpack(signatures)
    signature = signatures.signature_def.get("serving_default") or next(iter(signatures.signature_def.values()))
    inputs, outputs = ([Tensor(name, metadata_dtype(ENUM_TF, info.dtype, name),
                               metadata_shape(d.size for d in info.tensor_shape.dim))
                        for name, info in sorted(getattr(signature, kind).items())] for kind in ("inputs", "outputs"))
    return inputs, outputs


def encode_request(model: str, version: int | None, arrays: Mapping[str, np.ndarray]):
    """A PredictRequest holding the arrays."""
    request = message("tensorflow.serving.PredictRequest")()
    request.model_spec.name = model
    if version:
        request.model_spec.version.value = version
    for name, value in arrays.items():
        request.inputs[name].CopyFrom(to_tensor_proto(np.asarray(value)))
    return request


def decode_response(answer) -> dict[str, np.ndarray]:
    """A PredictResponse's outputs as arrays by name."""
    return {k: from_tensor_proto(v, k) for k, v in answer.outputs.items()}
