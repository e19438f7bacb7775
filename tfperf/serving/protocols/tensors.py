"""What every protocol's two sides share: a served model's tensors (`Tensor`), the one-line errors of a server
(`RequestError`, with the HTTP status gRPC's code is mapped from at its edge) and of a client (`EndpointError`),
JSON bounded in depth and written as TF Serving writes it, and the rules that turn JSON values into arrays of
an input's dtype and back (TF Serving's {"b64": ...} strings, whole numbers past float64's precision)."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfperf import jsonio

# A request's JSON may nest as deep as a tensor's rank and a little more (a dict of inputs, an instance).
MAX_JSON_DEPTH = 40


class RequestError(ValueError):
    """A request the server refuses: an HTTP status (gRPC's code is mapped from it) and one line that says what
    was wrong."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def http_status(exc: Exception) -> int:
    """The HTTP status a refused request is answered with: a RequestError's own, 404 for what is not served."""
    return exc.status if isinstance(exc, RequestError) else 404


class EndpointError(ValueError):
    """A URL that names no endpoint tfperf can load, or an endpoint that does not answer as its protocol does."""


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
        array = numbers(value, spec.dtype, f"{where}: {spec.name!r}", shape_text(spec))
    check_shape(array, spec, where)
    return array


def numbers(value: Any, dtype: str, what: str, want: str) -> np.ndarray:
    """JSON numbers as an array of `dtype`; a 400 for ragged rows, strings, or fractions for integers."""
    try:
        array = np.asarray(value)
    except ValueError:
        raise RequestError(400, f"{what} is ragged (rows of different lengths); the model takes {want}") from None
    if array.dtype == object and np.dtype(dtype).kind in "iu" and all(isinstance(v, int) for v in array.ravel()):
        return exact_integers(value, dtype, what, want)  # whole numbers past 64 bits: NumPy kept them as objects
    if array.dtype.kind in "USO":
        raise RequestError(400, f"{what} holds strings where the model takes {want}")
    if array.dtype.kind == "f" and np.dtype(dtype).kind in "iub":
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise RequestError(400, f"{what} holds fractions where the model takes {want}")
        if array.size and np.abs(array).max() >= 2 ** 53:  # whole numbers NumPy read as float64 (one past int64's
            return exact_integers(value, dtype, what, want)  # range), which rounds them: read them again exactly
    return array.astype(dtype, casting="unsafe")


def exact_integers(value: Any, dtype: str, what: str, want: str) -> np.ndarray:
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
                                f"{shape_text(spec)}")
    if array.shape[0] == 0:
        raise RequestError(400, f"{where}: {spec.name!r} has no rows")


def shape_text(spec: Tensor) -> str:
    dims = ", ".join("N" if i == 0 else "?" if d is None else str(d) for i, d in enumerate(spec.shape))
    return f"{spec.dtype}[{dims}]"


def dtype_name(array: np.ndarray) -> str:
    """NumPy's name of an array's dtype as the wire tables use it: "string" for bytes and str (object, S, U)."""
    return _name_of(array.dtype)


# Both are asked once or twice for every tensor a server reads or writes; NumPy computes a dtype's name in Python
# (3-4% of a server process's time under load was `dtype.name`), and `newbyteorder` builds a new dtype each time.
@functools.lru_cache(maxsize=256)
def _name_of(dtype: np.dtype) -> str:
    return "string" if dtype == object or dtype.kind in "SU" else dtype.name


@functools.lru_cache(maxsize=256)
def wire_dtype(dtype: Any) -> np.dtype:
    """A numeric dtype as the wire carries it: little-endian (v2's binary tensors, TF Serving's tensor_content)."""
    return np.dtype(dtype).newbyteorder("<")


def from_wire(raw: bytes, dtype: Any, shape: Sequence[int]) -> np.ndarray:
    """Little-endian values as an array of `dtype` in this machine's order (a view of `raw` where that is the
    same order: read-only, no copy)."""
    wire = wire_dtype(dtype)
    array = np.frombuffer(raw, dtype=wire).reshape(shape)
    return array if wire.isnative else array.astype(np.dtype(dtype))


def to_wire(array: np.ndarray) -> bytes:
    """A numeric array's values as little-endian bytes (see from_wire)."""
    return np.ascontiguousarray(array, dtype=wire_dtype(array.dtype)).tobytes()


def from_json_values(value: Any) -> Any:
    """TF Serving's {"b64": "..."} objects as the bytes they hold, anywhere in nested lists."""
    if isinstance(value, dict):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise ValueError("an object in a tensor must be {\"b64\": \"<base64>\"}")
        return base64.b64decode(value["b64"], validate=True)
    if isinstance(value, list):
        return [from_json_values(v) for v in value]
    return value.encode() if isinstance(value, str) else value


def json_values(value: np.ndarray) -> Any:
    """An array as JSON values: bytes as TF Serving's {"b64": ...}, NumPy scalars as Python's."""
    if dtype_name(value) == "string":
        flat = [{"b64": base64.b64encode(v if isinstance(v, bytes) else str(v).encode()).decode()}
                for v in value.reshape(-1)]
        return np.asarray(flat, dtype=object).reshape(value.shape).tolist() if value.ndim else flat[0]
    return value.tolist()


def every_input(arrays: Mapping[str, np.ndarray], inputs: Sequence[Tensor]) -> None:
    """A 400 unless the request gave every input, each with the same number of rows."""
    missing = sorted({s.name for s in inputs} - set(arrays))
    if missing:
        raise RequestError(400, f"the request lacks inputs {missing}")
    if len({len(a) for a in arrays.values()}) > 1:
        raise RequestError(400, "the inputs have different numbers of rows: " +
                           ", ".join(f"{n}: {len(a)}" for n, a in arrays.items())[:200])


def metadata_shape(dims: Sequence[Any]) -> tuple[int | None, ...]:
    """A shape from a metadata answer: -1 (any size) as None."""
    return tuple(None if int(d) < 0 else int(d) for d in dims)


def metadata_dtype(names: Mapping[Any, str], code: Any, tensor: str) -> str:
    """NumPy's name for a tensor's type in a metadata answer; EndpointError for a type no request can carry (a
    guess would send the server arrays of the wrong type)."""
    if code not in names:
        raise EndpointError(f"the model's tensor {tensor!r} has type {code}, which tfperf cannot send or read: "
                            f"measure a signature whose tensors are {', '.join(sorted(set(names.values())))}")
    return names[code]
