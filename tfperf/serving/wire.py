"""What clients written for TF Serving, Triton and KServe send and expect over HTTP, to and from arrays by name:
TF Serving's REST API (row format `instances` and columnar `inputs`, answered as `predictions` or `outputs`,
its model status and metadata) and KServe's Open Inference Protocol v2 (JSON tensors, and the binary tensor
extension tritonclient sends). No sockets here: `tfperf.serving.server` serves these; gRPC's messages are in
`tfperf.serving.grpc_wire`. Anything a request gets wrong is a `RequestError` whose one line says what."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfperf import jsonio

# A request's JSON may nest as deep as a tensor's rank and a little more (a dict of inputs, an instance).
MAX_JSON_DEPTH = 40
# KServe v2 datatypes and NumPy's (BYTES: length-prefixed strings in the binary extension).
V2_TYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
            "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
            "FP32": "float32", "FP64": "float64", "BYTES": "string"}
NUMPY_TO_V2 = {v: k for k, v in V2_TYPES.items()}
# TensorFlow's DataType names, for TF Serving's metadata (tensorflow/core/framework/types.proto).
TF_TYPES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "int32": "DT_INT32", "uint8": "DT_UINT8",
            "int16": "DT_INT16", "int8": "DT_INT8", "string": "DT_STRING", "int64": "DT_INT64", "bool": "DT_BOOL",
            "uint16": "DT_UINT16", "float16": "DT_HALF", "uint32": "DT_UINT32", "uint64": "DT_UINT64"}
TF_NAMES = {v: k for k, v in TF_TYPES.items()}  # and back: a metadata answer's dtype to NumPy's name


# gRPC status codes by the HTTP status a RequestError carries (503: the queue is full).
GRPC_CODES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 413: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
              501: "UNIMPLEMENTED", 503: "RESOURCE_EXHAUSTED", 504: "DEADLINE_EXCEEDED"}


class RequestError(ValueError):
    """A request the server refuses: an HTTP status (gRPC's code is mapped from it) and one line that says what
    was wrong."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A served model's input or output: name, NumPy dtype name ("string" for bytes), shape with the batch axis
    first (None where any size goes)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]


def parse_json(body: bytes, where: str = "the request") -> Any:
    """A request body as JSON, bounded in nesting; 400 in one line when it is not JSON."""
    try:
        return jsonio.loads(body, where, max_depth=MAX_JSON_DEPTH)
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None


def dump_json(found: Any) -> bytes:
    """JSON as TF Serving writes it: NaN and Infinity as such (its rapidjson writer does), compact."""
    return json.dumps(found, separators=(",", ":")).encode()


def to_array(value: Any, spec: Tensor, where: str) -> np.ndarray:
    """A JSON value (nested lists, one row or many) as an array of the input's dtype and rank, or a 400 that
    says what it should be."""
    if spec.dtype == "string":
        try:
            array = np.asarray(from_json_values(value), dtype=object)
        except (ValueError, TypeError) as exc:
            raise RequestError(400, f"{where}: {spec.name!r} is not a tensor of strings ({exc})") from None
    else:
        array = _numbers(value, spec.dtype, f"{where}: {spec.name!r}", _shape_text(spec))
    check_shape(array, spec, where)
    return array


def _numbers(value: Any, dtype: str, what: str, want: str) -> np.ndarray:
    """JSON numbers as an array of `dtype`; a 400 for ragged rows, strings, or fractions for integers."""
    try:
        array = np.asarray(value)
    except ValueError:
        raise RequestError(400, f"{what} is ragged (rows of different lengths); the model takes {want}") from None
    if array.dtype == object and np.dtype(dtype).kind in "iu" and all(isinstance(v, int) for v in array.ravel()):
        return _exact_integers(value, dtype, what, want)  # whole numbers past 64 bits: NumPy kept them as objects
    if array.dtype.kind in "USO":
        raise RequestError(400, f"{what} holds strings where the model takes {want}")
    if array.dtype.kind == "f" and np.dtype(dtype).kind in "iub":
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise RequestError(400, f"{what} holds fractions where the model takes {want}")
        if array.size and np.abs(array).max() >= 2 ** 53:  # whole numbers NumPy read as float64 (one past int64's
            return _exact_integers(value, dtype, what, want)  # range), which rounds them: read them again exactly
    return array.astype(dtype, casting="unsafe")


def _exact_integers(value: Any, dtype: str, what: str, want: str) -> np.ndarray:
    """JSON whole numbers straight into an integer dtype (2**64 - 1 as itself); a 400 for one out of its range."""
    try:
        return np.asarray(value, dtype=dtype)
    except (OverflowError, ValueError, TypeError):
        raise RequestError(400, f"{what} holds a number out of the range of {want}") from None


def check_shape(array: np.ndarray, spec: Tensor, where: str) -> None:
    """A 400 unless the array has the input's rank and its fixed sizes, and at least one row."""
    shape = spec.shape
    if array.ndim != len(shape) or any(d is not None and d != a for d, a in zip(shape[1:], array.shape[1:])):
        raise RequestError(400, f"{where}: {spec.name!r} has shape {list(array.shape)}; the model takes "
                                f"{_shape_text(spec)}")
    if array.shape[0] == 0:
        raise RequestError(400, f"{where}: {spec.name!r} has no rows")


def _shape_text(spec: Tensor) -> str:
    dims = ", ".join("N" if i == 0 else "?" if d is None else str(d) for i, d in enumerate(spec.shape))
    return f"{spec.dtype}[{dims}]"


def dtype_name(array: np.ndarray) -> str:
    """NumPy's name of an array's dtype as the wire tables use it: "string" for bytes and str (object, S, U)."""
    return "string" if array.dtype == object or array.dtype.kind in "SU" else array.dtype.name


def from_json_values(value: Any) -> Any:
    """TF Serving's {"b64": "..."} objects as the bytes they hold, anywhere in nested lists."""
    if isinstance(value, dict):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise ValueError("an object in a tensor must be {\"b64\": \"<base64>\"}")
        return base64.b64decode(value["b64"], validate=True)
    if isinstance(value, list):
        return [from_json_values(v) for v in value]
    return value.encode() if isinstance(value, str) else value


def v2_json_strings(array: np.ndarray) -> list[str]:
    """A BYTES tensor's items as KServe v2's JSON writes them: strings (bytes that are not UTF-8 replaced)."""
    return [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]


def v2_json_bytes(data: Any) -> np.ndarray:
    """KServe v2 JSON "data" of a BYTES tensor as a flat array of bytes."""
    return np.asarray([v.encode() if isinstance(v, str) else v for v in np.ravel(data)], dtype=object)


def json_values(value: np.ndarray) -> Any:
    """An array as JSON values: bytes as TF Serving's {"b64": ...}, NumPy scalars as Python's."""
    if dtype_name(value) == "string":
        flat = [{"b64": base64.b64encode(v if isinstance(v, bytes) else str(v).encode()).decode()}
                for v in value.reshape(-1)]
        return np.asarray(flat, dtype=object).reshape(value.shape).tolist() if value.ndim else flat[0]
    return value.tolist()


# TF Serving's REST API --------------------------------------------------------------------------

def tfserving_predict_request(body: bytes, inputs: Sequence[Tensor], signature: str) -> tuple[dict[str, np.ndarray], bool]:
    """A TF Serving :predict body as arrays by input name, and whether it was columnar (`inputs`: answered as
    `outputs`) rather than row format (`instances`: answered as `predictions`)."""
    found = parse_json(body)
    if not isinstance(found, dict):
        raise RequestError(400, "the request must be a JSON object with \"instances\" or \"inputs\"")
    asked = found.get("signature_name", signature)
    if not isinstance(asked, str):
        raise RequestError(400, "'signature_name' must be a string")
    if asked and asked != signature:
        raise RequestError(400, f"serving signature name {asked!r} not found: this model serves {signature!r}")
    names = [s.name for s in inputs]
    by_name = {s.name: s for s in inputs}
    if ("instances" in found) == ("inputs" in found):
        raise RequestError(400, "give exactly one of \"instances\" (row format) and \"inputs\" (columnar)")
    if "instances" in found:
        rows = found["instances"]
        if not isinstance(rows, list) or not rows:
            raise RequestError(400, "\"instances\" must be a non-empty list, one element per row")
        if all(isinstance(r, dict) and "b64" not in r for r in rows):
            missing = [n for n in names if any(n not in r for r in rows)]
            extra = sorted({k for r in rows for k in r} - set(names))
            if missing or extra:
                raise RequestError(400, f"each instance must name the inputs {names}"
                                        + (f"; missing {missing}" if missing else "")
                                        + (f"; unknown {extra[:5]}" if extra else ""))
            return {n: to_array([r[n] for r in rows], by_name[n], "instances") for n in names}, False
        if len(names) != 1:
            raise RequestError(400, f"instances is a plain list, but the model takes {len(names)} named inputs "
                                    f"{names}: give each instance as an object")
        return {names[0]: to_array(rows, inputs[0], "instances")}, False
    columns = found["inputs"]
    if isinstance(columns, dict) and "b64" not in columns:
        missing, extra = [n for n in names if n not in columns], sorted(set(columns) - set(names))
        if missing or extra:
            raise RequestError(400, f"\"inputs\" must name the inputs {names}" + (f"; missing {missing}" if missing
                                    else "") + (f"; unknown {extra[:5]}" if extra else ""))
        arrays = {n: to_array(columns[n], by_name[n], "inputs") for n in names}
    elif len(names) == 1:
        arrays = {names[0]: to_array(columns, inputs[0], "inputs")}
    else:
        raise RequestError(400, f"the model takes {len(names)} named inputs {names}: give \"inputs\" as an object")
    every_input(arrays, inputs)
    return arrays, True


def tfserving_predict_response(outputs: Mapping[str, np.ndarray], columnar: bool) -> bytes:
    """Outputs as TF Serving answers them: {"predictions": [row, ...]} (an object per row when there are several
    outputs) or {"outputs": value} (an object of values when there are several)."""
    names = sorted(outputs)
    if columnar:
        if len(names) == 1:
            return dump_json({"outputs": json_values(np.asarray(outputs[names[0]]))})
        return dump_json({"outputs": {n: json_values(np.asarray(outputs[n])) for n in names}})
    if len(names) == 1:
        return dump_json({"predictions": json_values(np.asarray(outputs[names[0]]))})
    columns = {n: json_values(np.asarray(outputs[n])) for n in names}
    rows = len(next(iter(columns.values())))
    return dump_json({"predictions": [{n: columns[n][i] for n in names} for i in range(rows)]})


def tfserving_status(versions: Mapping[int, str], errors: Mapping[int, str] | None = None) -> dict[str, Any]:
    """GetModelStatusResponse as JSON: each version's state (START, LOADING, AVAILABLE, UNLOADING, END)."""
    errors = errors or {}
    return {"model_version_status": [
        {"version": str(v), "state": state,
         "status": {"error_code": "UNKNOWN" if errors.get(v) else "OK", "error_message": errors.get(v, "")}}
        for v, state in sorted(versions.items(), reverse=True)]}


def tfserving_metadata(name: str, version: int, signature: str, inputs: Sequence[Tensor],
                       outputs: Sequence[Tensor]) -> dict[str, Any]:
    """GetModelMetadataResponse as JSON: the model spec and its signature_def map (TF Serving's shape)."""

    def info(t: Tensor) -> dict[str, Any]:
        return {"dtype": TF_TYPES.get(t.dtype, "DT_INVALID"), "name": t.name,
                "tensor_shape": {"dim": [{"size": str(-1 if d is None else d), "name": ""} for d in t.shape],
                                 "unknown_rank": False}}

    return {"model_spec": {"name": name, "signature_name": "", "version": str(version)},
            "metadata": {"signature_def": {"signature_def": {signature: {
                "inputs": {t.name: info(t) for t in inputs}, "outputs": {t.name: info(t) for t in outputs},
                "method_name": "tensorflow/serving/predict", "defaults": {}}}}}}


# KServe's Open Inference Protocol (v2), JSON and binary --------------------------------------------

def v2_metadata(name: str, versions: Sequence[int], platform: str, inputs: Sequence[Tensor],
                outputs: Sequence[Tensor]) -> dict[str, Any]:
    """The model metadata response of the v2 protocol (-1 where any size goes)."""

    def spec(t: Tensor) -> dict[str, Any]:
        return {"name": t.name, "datatype": NUMPY_TO_V2.get(t.dtype, "BYTES"),
                "shape": [-1 if d is None else d for d in t.shape]}

    return {"name": name, "versions": [str(v) for v in versions], "platform": platform,
            "inputs": [spec(t) for t in inputs], "outputs": [spec(t) for t in outputs]}


@dataclasses.dataclass(frozen=True)
class V2Request:
    """A decoded v2 inference request: its id, arrays by input name, and the outputs asked for (name ->
    binary or not; empty: every output, as JSON unless `binary_outputs`)."""

    id: str | None
    arrays: dict[str, np.ndarray]
    outputs: dict[str, bool]
    binary_outputs: bool


def from_v2_bytes(raw: bytes, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
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
    dtype = np.dtype(V2_TYPES[datatype]).newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise RequestError(400, f"{where}: {len(raw)} bytes of {datatype} for shape {list(shape)} "
                                f"({count * dtype.itemsize} needed)")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def to_v2_bytes(array: np.ndarray) -> bytes:
    """A tensor for the binary extension (see from_v2_bytes)."""
    if array.dtype == object or array.dtype.kind in "SU":
        parts = []
        for v in array.reshape(-1):
            b = v if isinstance(v, bytes) else str(v).encode()
            parts += [len(b).to_bytes(4, "little"), b]
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def v2_tensor(array: np.ndarray, datatype: str, spec: Tensor) -> np.ndarray:
    """A decoded v2 tensor as its input takes it: strings for BYTES only, no fractions for integers, cast to
    the input's dtype and checked against its shape; a 400 that says what it should be."""
    if (spec.dtype == "string") != (datatype == "BYTES") or (
            array.dtype.kind == "f" and spec.dtype != "string" and np.dtype(spec.dtype).kind in "iub"):
        raise RequestError(400, f"input {spec.name!r} is {datatype}; the model takes {_shape_text(spec)}")
    if spec.dtype != "string":
        array = array.astype(spec.dtype)
    check_shape(array, spec, f"input {spec.name!r}")
    return array


def every_input(arrays: Mapping[str, np.ndarray], inputs: Sequence[Tensor]) -> None:
    """A 400 unless the request gave every input, each with the same number of rows."""
    missing = sorted({s.name for s in inputs} - set(arrays))
    if missing:
        raise RequestError(400, f"the request lacks inputs {missing}")
    if len({len(a) for a in arrays.values()}) > 1:
        raise RequestError(400, "the inputs have different numbers of rows: " +
                           ", ".join(f"{n}: {len(a)}" for n, a in arrays.items())[:200])


def v2_infer_request(body: bytes, header_length: int | None, inputs: Sequence[Tensor]) -> V2Request:
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
            array, at = from_v2_bytes(binary[at:at + size], datatype, shape, f"input {name!r}"), at + size
        elif "data" in item:
            data = (v2_json_bytes(item["data"]) if datatype == "BYTES" else
                    _numbers(item["data"], V2_TYPES[datatype], f"input {name!r}", _shape_text(spec)))
            if data.size != math.prod(shape):
                raise RequestError(400, f"input {name!r}: {data.size} values for shape {shape}")
            array = data.reshape(shape)
        else:
            raise RequestError(400, f"input {name!r} has neither \"data\" nor a binary_data_size parameter")
        arrays[name] = v2_tensor(array, datatype, spec)
    every_input(arrays, inputs)
    params = found.get("parameters") or {}
    asked = {}
    for item in found.get("outputs") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(400, "each of \"outputs\" must be an object with a \"name\"")
        asked[item["name"]] = bool((item.get("parameters") or {}).get("binary_data",
                                                                       params.get("binary_data_output", False)))
    request_id = found.get("id")
    return V2Request(str(request_id) if request_id is not None else None, arrays, asked,
                     bool(params.get("binary_data_output", False)))


def v2_infer_response(name: str, version: int, request: V2Request,
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
            data = to_v2_bytes(array)
            entry["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            entry["data"] = json_values(array.reshape(-1)) if dtype != "string" else v2_json_strings(array)
        described.append(entry)
    answer: dict[str, Any] = {"model_name": name, "model_version": str(version), "outputs": described}
    if request.id is not None:
        answer["id"] = request.id
    header = dump_json(answer)
    if not raw:
        return header, None
    return header + b"".join(raw), len(header)


_READY = re.compile(r"^serving .* on http://[^ ]+:(?P<rest>\d+) .* and grpc://[^ ]+:(?P<grpc>\d+)")


def ready_line(name: str, version: int, describe: str, host: str, ports: tuple[int, int], worker: str = "") -> str:
    """The line `tfperf serve` prints once it listens (one per worker process), read back by `ready_ports`."""
    return (f"serving {name} version {version} ({describe}) on http://{host}:{ports[0]} (TF Serving REST "
            f"/v1/models/{name}, KServe v2 /v2/models/{name}) and grpc://{host}:{ports[1]}"
            f"{' ' + worker if worker else ''}\n")


def ready_ports(line: str) -> tuple[int, int] | None:
    """The REST and gRPC ports a `ready_line` names, or None for any other line."""
    match = _READY.match(line)
    return (int(match["rest"]), int(match["grpc"])) if match else None

