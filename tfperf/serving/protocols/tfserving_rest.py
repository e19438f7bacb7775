"""TF Serving's REST API, both sides: the server reads a :predict body (row format `instances`, or columnar
`inputs`) and answers `predictions` or `outputs`, its model status and metadata; the client (`tfperf load
--url http://HOST:PORT/v1/models/NAME`) reads that metadata, encodes requests and decodes answers. No sockets
here: `tfperf.serving.server` and `tfperf.serving.endpoint` do the I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfperf.serving.protocols.tensors import (RequestError, Tensor, dump_json, every_input, from_json_values,
                                              json_values, metadata_dtype, metadata_shape, parse_json, to_array)

# TensorFlow's DataType names, for TF Serving's metadata (tensorflow/core/framework/types.proto).
TF_TYPES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "int32": "DT_INT32", "uint8": "DT_UINT8",
            "int16": "DT_INT16", "int8": "DT_INT8", "string": "DT_STRING", "int64": "DT_INT64", "bool": "DT_BOOL",
            "uint16": "DT_UINT16", "float16": "DT_HALF", "uint32": "DT_UINT32", "uint64": "DT_UINT64"}
TF_NAMES = {v: k for k, v in TF_TYPES.items()}  # and back: a metadata answer's dtype to NumPy's name


# The server ---------------------------------------------------------------------------------------

def predict_request(body: bytes, inputs: Sequence[Tensor], signature: str) -> tuple[dict[str, np.ndarray], bool]:
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


def predict_response(outputs: Mapping[str, np.ndarray], columnar: bool) -> bytes:
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


def status(versions: Mapping[int, str], errors: Mapping[int, str] | None = None) -> dict[str, Any]:
    """GetModelStatusResponse as JSON: each version's state (START, LOADING, AVAILABLE, UNLOADING, END)."""
    errors = errors or {}
    return {"model_version_status": [
        {"version": str(v), "state": state,
         "status": {"error_code": "UNKNOWN" if errors.get(v) else "OK", "error_message": errors.get(v, "")}}
        for v, state in sorted(versions.items(), reverse=True)]}


def metadata(name: str, version: int, signature: str, inputs: Sequence[Tensor],
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


# The client ---------------------------------------------------------------------------------------

def metadata_tensors(found: Mapping[str, Any]) -> tuple[list[Tensor], list[Tensor]]:
    """The inputs and outputs of TF Serving's REST metadata answer (GetModelMetadataResponse as JSON)."""
    signatures = found["metadata"]["signature_def"]["signature_def"]
    signature = signatures.get("serving_default") or next(iter(signatures.values()))
    inputs, outputs = ([Tensor(name, metadata_dtype(TF_NAMES, info["dtype"], name),
                               metadata_shape(d["size"] for d in info["tensor_shape"]["dim"]))
                        for name, info in sorted(signature[kind].items())] for kind in ("inputs", "outputs"))
    return inputs, outputs


def encode_request(arrays: Mapping[str, np.ndarray], columnar: bool) -> bytes:
    """A :predict body: one object per row (`instances`), or the columns (`inputs`)."""
    if columnar:
        return dump_json({"inputs": {k: json_values(np.asarray(v)) for k, v in arrays.items()}})
    rows = len(next(iter(arrays.values())))
    return dump_json({"instances": [{k: json_values(np.asarray(v)[i]) for k, v in arrays.items()}
                                    for i in range(rows)]})


def decode_response(body: bytes, outputs: Sequence[Tensor]) -> dict[str, np.ndarray]:
    """A :predict answer as arrays by output name, of the metadata's dtypes (bytes from {"b64": ...})."""
    dtypes = {t.name: t.dtype for t in outputs}

    def typed(name: str, values: Any) -> np.ndarray:
        if dtypes.get(name) == "string":
            return np.asarray(from_json_values(values), dtype=object)
        return np.asarray(values, dtypes.get(name))

    data = json.loads(body)
    if "outputs" in data:
        return {k: typed(k, v) for k, v in (data["outputs"].items() if isinstance(data["outputs"], dict)
                                            else [(outputs[0].name, data["outputs"])])}
    rows = data["predictions"]
    if rows and isinstance(rows[0], dict):
        return {k: typed(k, [r[k] for r in rows]) for k in rows[0]}
    return {outputs[0].name: typed(outputs[0].name, rows)}
