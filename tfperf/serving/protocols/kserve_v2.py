"""KServe's Open Inference Protocol (v2) over HTTP, both sides: JSON tensors and the binary tensor extension
tritonclient sends. The server reads an /infer body and answers it, and its model metadata; the client
(`tfperf load --url http://HOST:PORT/v2/models/NAME`) reads that metadata, encodes requests and decodes
answers. The datatype table and the binary encoding are shared with v2 over gRPC (`kserve_v2_grpc`)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfperf.serving.protocols.tensors import (RequestError, Tensor, check_shape, dtype_name, dump_json, every_input,
                                              from_wire, json_values, metadata_dtype, metadata_shape, numbers,
                                              parse_json, shape_text, to_wire, wire_dtype)

# KServe v2 datatypes and NumPy's (BYTES: length-prefixed strings in the binary extension).
V2_TYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
            "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
            "FP32": "float32", "FP64": "float64", "BYTES": "string"}
NUMPY_TO_V2 = {v: k for k, v in V2_TYPES.items()}


@dataclasses.dataclass(frozen=True)
class InferRequest:
    """A decoded v2 inference request: its id, arrays by input name, and the outputs asked for (name ->
    binary or not; empty: every output, as JSON unless `binary_outputs`)."""

    id: str | None
    arrays: dict[str, np.ndarray]
    outputs: dict[str, bool]
    binary_outputs: bool


def from_bytes(raw: bytes, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    """A tensor of the binary extension: raw little-endian values, or BYTES as 4-byte length-prefixed items."""
    count = math.prod(shape)
    if datatype == "BYTES":
        items, at = [], 0
        while at < len(raw):
            if at + 4 > len(raw):
                raise RequestError(400, f"{where}: a BYTES item's length is cut short")
            size = int.from_bytes(raw[at:at + 4], "little")
            items.append(raw[at + 4:at + 4 + size])
            at += 4 + size
        if len(items) != count or at != len(raw):
            raise RequestError(400, f"{where}: {len(items)} BYTES items for shape {list(shape)}")
        return np.asarray(items, dtype=object).reshape(shape)
    itemsize = wire_dtype(V2_TYPES[datatype]).itemsize
    if len(raw) != count * itemsize:
        raise RequestError(400, f"{where}: {len(raw)} bytes of {datatype} for shape {list(shape)} "
                                f"({count * itemsize} needed)")
    return from_wire(raw, V2_TYPES[datatype], shape)


def to_bytes(array: np.ndarray) -> bytes:
    """A tensor for the binary extension (see from_bytes)."""
    if array.dtype == object or array.dtype.kind in "SU":
        parts = []
        for v in array.reshape(-1):
            b = v if isinstance(v, bytes) else str(v).encode()
            parts += [len(b).to_bytes(4, "little"), b]
        return b"".join(parts)
    return to_wire(array)


def json_strings(array: np.ndarray) -> list[str]:
    """A BYTES tensor's items as KServe v2's JSON writes them: strings (bytes that are not UTF-8 replaced)."""
    return [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]


def json_bytes(data: Any) -> np.ndarray:
    """KServe v2 JSON "data" of a BYTES tensor as a flat array of bytes."""
    return np.asarray([v.encode() if isinstance(v, str) else v for v in np.ravel(data)], dtype=object)


def input_tensor(array: np.ndarray, datatype: str, spec: Tensor) -> np.ndarray:
    """A decoded v2 tensor as its input takes it: strings for BYTES only, no fractions for integers, cast to
    the input's dtype and checked against its shape; a 400 that says what it should be."""
    if (spec.dtype == "string") != (datatype == "BYTES") or (
            array.dtype.kind == "f" and spec.dtype != "string" and np.dtype(spec.dtype).kind in "iub"):
        raise RequestError(400, f"input {spec.name!r} is {datatype}; the model takes {shape_text(spec)}")
    if spec.dtype != "string":
        # No copy where the type already matches: NumPy's cast of a few thousand values lets go of the GIL, and
        # taking it back from the batch thread cost the server's loop 10% of its samples under load.
        array = array.astype(spec.dtype, copy=False)
    check_shape(array, spec, f"input {spec.name!r}")
    return array


# The server ---------------------------------------------------------------------------------------

def metadata(name: str, versions: Sequence[int], platform: str, inputs: Sequence[Tensor],
                outputs: Sequence[Tensor]) -> dict[str, Any]:
    """The model metadata response of the v2 protocol (-1 where any size goes)."""

    def spec(t: Tensor) -> dict[str, Any]:
        return {"name": t.name, "datatype": NUMPY_TO_V2.get(t.dtype, "BYTES"),
                "shape": [-1 if d is None else d for d in t.shape]}

    return {"name": name, "versions": [str(v) for v in versions], "platform": platform,
            "inputs": [spec(t) for t in inputs], "outputs": [spec(t) for t in outputs]}


def infer_request(body: bytes, header_length: int | None, inputs: Sequence[Tensor]) -> InferRequest:
    """A v2 /infer body: JSON, or (with the Inference-Header-Content-Length header) a JSON header followed by
    the binary tensors its inputs' `binary_data_size` parameters give, in order."""
    if header_length is not None and not 0 < header_length <= len(body):
        raise RequestError(400, f"Inference-Header-Content-Length {header_length} does not fit a body of "
                                f"{len(body)} bytes")
    header = body if header_length is None else body[:header_length]
    binary, at = (b"" if header_length is None else body[header_length:]), 0
    found = parse_json(header)
    if not isinstance(found, dict) or not isinstance(found.get("inputs"), list):
        raise RequestError(400, "the request must be a JSON object with an \"inputs\" list")
    by_name = {s.name: s for s in inputs}
    arrays: dict[str, np.ndarray] = {}
    for item in found["inputs"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(400, "each of \"inputs\" must be an object with a \"name\"")
        name, datatype, shape = item["name"], item.get("datatype"), item.get("shape")
        if name not in by_name:
            raise RequestError(400, f"unknown input {name!r}: the model takes {sorted(by_name)}")
        if datatype not in V2_TYPES:
            raise RequestError(400, f"input {name!r}: datatype {datatype!r} is not one of {sorted(V2_TYPES)}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise RequestError(400, f"input {name!r}: \"shape\" must be a list of sizes")
        spec = by_name[name]
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or at + size > len(binary):
                raise RequestError(400, f"input {name!r}: binary_data_size {size} runs past the body")
            array, at = from_bytes(binary[at:at + size], datatype, shape, f"input {name!r}"), at + size
        elif "data" in item:
            data = (json_bytes(item["data"]) if datatype == "BYTES" else
                    numbers(item["data"], V2_TYPES[datatype], f"input {name!r}", shape_text(spec)))
            if data.size != math.prod(shape):
                raise RequestError(400, f"input {name!r}: {data.size} values for shape {shape}")
            array = data.reshape(shape)
        else:
            raise RequestError(400, f"input {name!r} has neither \"data\" nor a binary_data_size parameter")
        arrays[name] = input_tensor(array, datatype, spec)
    every_input(arrays, inputs)
    params = found.get("parameters") or {}
    asked = {}
    for item in found.get("outputs") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(400, "each of \"outputs\" must be an object with a \"name\"")
        asked[item["name"]] = bool((item.get("parameters") or {}).get("binary_data",
                                                                       params.get("binary_data_output", False)))
    request_id = found.get("id")
    return InferRequest(str(request_id) if request_id is not None else None, arrays, asked,
                     bool(params.get("binary_data_output", False)))


def infer_response(name: str, version: int, request: InferRequest,
                      outputs: Mapping[str, np.ndarray]) -> tuple[bytes, int | None]:
    """The /infer answer: JSON, or a JSON header and the binary outputs asked for (and the header's length,
    for the Inference-Header-Content-Length header; None when all is JSON)."""
    unknown = sorted(set(request.outputs) - set(outputs))
    if unknown:
        raise RequestError(400, f"unknown output {unknown[0]!r}: the model answers {sorted(outputs)}")
    chosen = request.outputs or {n: request.binary_outputs for n in sorted(outputs)}
    described, raw = [], []
    for out, binary in chosen.items():
        array = np.asarray(outputs[out])
        dtype = dtype_name(array)
        entry: dict[str, Any] = {"name": out, "datatype": NUMPY_TO_V2.get(dtype, "BYTES"), "shape": list(array.shape)}
        if binary:
            data = to_bytes(array)
            entry["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            entry["data"] = json_values(array.reshape(-1)) if dtype != "string" else json_strings(array)
        described.append(entry)
    answer: dict[str, Any] = {"model_name": name, "model_version": str(version), "outputs": described}
    if request.id is not None:
        answer["id"] = request.id
    header = dump_json(answer)
    if not raw:
        return header, None
    return header + b"".join(raw), len(header)


# The client ---------------------------------------------------------------------------------------

def metadata_tensors(found: Mapping[str, Any]) -> tuple[list[Tensor], list[Tensor]]:
    """The inputs and outputs of a v2 model metadata answer."""
    inputs, outputs = ([Tensor(t["name"], metadata_dtype(V2_TYPES, t["datatype"], t["name"]),
                               metadata_shape(t["shape"])) for t in found[kind]] for kind in ("inputs", "outputs"))
    return inputs, outputs


def encode_request(arrays: Mapping[str, np.ndarray], binary: bool) -> tuple[bytes, dict[str, str]]:
    """An /infer body and its headers: a JSON header followed by binary tensors (outputs asked for in binary
    too), or JSON tensors (BYTES as JSON strings, as KServe v2 writes them)."""
    tensors, raw = [], []
    for name, value in arrays.items():
        array = np.asarray(value)
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": NUMPY_TO_V2[dtype_name(array)]}
        if binary:
            data = to_bytes(array)
            entry["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            entry["data"] = json_strings(array) if dtype_name(array) == "string" else array.reshape(-1).tolist()
        tensors.append(entry)
    header = dump_json({"inputs": tensors, "parameters": {"binary_data_output": binary}})
    if not binary:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(raw), {"Inference-Header-Content-Length": str(len(header)),
                                    "Content-Type": "application/octet-stream"}


def decode_response(body: bytes, headers: Mapping[str, str]) -> dict[str, np.ndarray]:
    """An /infer answer as arrays by output name: JSON tensors, or binary ones after the JSON header."""
    given = next((v for k, v in headers.items() if k.lower() == "inference-header-content-length"), None)
    length = int(given) if given is not None else len(body)
    header, at, outputs = json.loads(body[:length]), length, {}
    for t in header["outputs"]:
        if "data" in t:
            outputs[t["name"]] = (json_bytes(t["data"]) if t["datatype"] == "BYTES" else
                                  np.asarray(t["data"], dtype=V2_TYPES[t["datatype"]])).reshape(t["shape"])
        else:
            size = t["parameters"]["binary_data_size"]
            outputs[t["name"]] = from_bytes(body[at:at + size], t["datatype"], t["shape"], t["name"])
            at += size
    return outputs
