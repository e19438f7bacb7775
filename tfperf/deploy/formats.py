"""The export formats in one place: how each is written, loaded and run.

What is exported is a `Servable`: a traced function of named inputs that returns named outputs, and
what holds its variables (a Keras model, or a loaded SavedModel or tf.Module). A format is a
`Format`: the file that marks a folder as one of its exports, a writer that turns a Servable into that
file, and a loader that returns a `Runner`, which takes inputs by name and returns outputs by name.
`FORMATS` lists them; `tfperf.deploy.layout` puts any of them in the versioned, atomic layout, and
`tfperf.deploy.inspection` reads each without running it. A new format is one `Format` added here.
It sits on `errors` and `converters` (the converters' own calls) and nothing else of tfperf.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfperf import extras
from tfperf.deploy.converters import (ONNX_OPSET, SIGNATURE, litert_flex_ops, litert_from_saved_model,
                                      onnx_from_function)
from tfperf.deploy.errors import ExportError, ModelError, first_line, listed

# Keras' own model.export() names its endpoint `serve` (and aliases it serving_default); other tools name
# theirs as they like. A runner takes, in this order: the signature asked for, serving_default, serve, the only one.
PREFERRED_SIGNATURES = (SIGNATURE, "serve")
QUANTIZATIONS = ("none", "dynamic", "int8")
FLOAT_TOLERANCE = 1e-4  # a float32 export answers as the model does within this, relative to the output's scale
# An output that moves less than this across its rows (relative to its scale) does not depend on its input: an
# export that agrees with it has shown nothing (Keras Applications' MobileNetV2 with weights=None answers 0.1 for
# every class on every input).
CONSTANT = 1e-6
NOT_EVIDENCE = "the model's outputs do not depend on these inputs; agreement is not evidence"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A named tensor's dtype (NumPy's name) and shape (None where any size goes)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def __str__(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


@dataclasses.dataclass(frozen=True)
class Servable:
    """What an export is made of.

    Args:
        function: a tf.function with an input_signature (one TensorSpec per input, named after it, batch
            axis None) that returns a dict of named output tensors.
        keras_model: the Keras model the function calls, tracked through Keras' ExportArchive (which
            hands converters the Keras variables to freeze); None for models without Keras.
        trackable: otherwise, what holds the variables the function reads (a loaded SavedModel, a tf.Module).
    """

    function: Any
    keras_model: Any = None
    trackable: Any = None

    @property
    def input_signature(self) -> list:
        return list(self.function.input_signature)


class Runner:
    """A loaded export: its signature, input specs, output names, and a call on NumPy inputs by name."""

    format: str
    signature: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on inputs already checked against `self.inputs`; outputs by name."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Format:
    """How one export format is written and loaded."""

    name: str
    marker: str  # the file inside an export folder that says it is this format
    write: Callable[..., dict[str, Any]]  # (servable, folder, quantize=, representative=) -> metadata
    load: Callable[..., Runner]  # (folder, threads=None, signature=None) -> Runner
    describe: str  # one line for --help
    extra: str | None = None  # the tfperf extra that brings its converter and runtime

    def require(self) -> None:
        """MissingExtra (one line naming the extra) when this format's converter or runtime is not installed."""
        if self.extra is not None:
            extras.require(self.extra, f"the {self.name} format")


def choose_signature(available: list[str], asked: str | None, where: str) -> str:
    """The signature a runner serves: `asked`, else serving_default, else serve, else the only one."""
    if asked is not None:
        if asked not in available:
            raise ModelError(f"{where} has no signature {asked!r}: it has {listed(sorted(available)) or 'none'}")
        return asked
    for key in PREFERRED_SIGNATURES:
        if key in available:
            return key
    if len(available) == 1:
        return available[0]
    raise ModelError(f"{where} has signatures {listed(sorted(available)) or 'none'} and none is "
                     f"{SIGNATURE!r}: choose one with --signature")


def variation(reference: np.ndarray) -> float | None:
    """How much an output moves across its rows: the largest range over rows of any of its values, relative to
    its scale (as agreement's differences are); None with fewer than two rows."""
    ref = np.asarray(reference, np.float64)
    if ref.ndim == 0 or len(ref) < 2 or not ref.size:
        return None
    scale = max(float(np.max(np.abs(ref))), 1.0)
    return float(np.max(np.ptp(ref, axis=0))) / scale


def constant(reference: Mapping[str, np.ndarray]) -> bool:
    """True when every output moves less than CONSTANT across the rows (two or more): agreement on them proves
    nothing."""
    moves = [variation(r) for r in reference.values() if np.asarray(r).dtype.kind == "f"]
    return bool(moves) and all(m is not None and m < CONSTANT for m in moves)


def agreement(reference: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per output, the largest absolute difference from the reference and that difference relative to the
    output's scale (its largest magnitude, at least 1, so that outputs near zero are judged absolutely), and
    how much the reference itself moves across the rows (`varies`, on the same scale)."""
    found = {}
    for name, ref in reference.items():
        ref, out = np.asarray(ref, np.float64), np.asarray(got[name], np.float64)
        diff = float(np.max(np.abs(out - ref))) if ref.size else 0.0
        scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1.0)
        found[name] = {"max_abs_diff": diff, "relative": diff / scale, "varies": variation(ref)}
    return found


def check_options(fmt: str, quantize: str = "none", select_tf_ops: bool = False, representative=None) -> None:
    """An ExportError unless the options fit the format (checked before anything is written)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}: choose from {', '.join(FORMATS)}")
    FORMATS[fmt].require()
    if quantize not in QUANTIZATIONS:
        raise ExportError(f"unknown quantization {quantize!r}: choose from {', '.join(QUANTIZATIONS)}")
    if quantize != "none" and fmt != "litert":
        raise ExportError(f"--quantize {quantize} is for --format litert; {fmt} exports are float32")
    if select_tf_ops and fmt != "litert":
        raise ExportError("--select-tf-ops is for --format litert")
    if quantize == "int8" and not representative:
        raise ExportError("--quantize int8 needs real inputs to calibrate on: pass --sample FILE.npz")


def _numpy_dtype(dtype) -> str:
    return "string" if dtype.name == "string" else np.dtype(dtype.as_numpy_dtype).name


# SavedModel ------------------------------------------------------------------------------------


def write_savedmodel(servable: Servable, folder: Path, *, quantize: str = "none",
                     representative=None) -> dict[str, Any]:
    """A SavedModel whose `serving_default` signature is the servable's function."""
    import tensorflow as tf

    check_options("savedmodel", quantize)
    if servable.keras_model is not None:
        try:
            _write_archive(servable, folder, track_model=False)
        except AssertionError as exc:  # the function reads a resource other than a variable (a lookup table)
            if "untracked" not in str(exc):
                raise
            shutil.rmtree(folder, ignore_errors=True)
            _write_archive(servable, folder, track_model=True)
    else:
        module = tf.Module()
        module.tracked = servable.trackable  # so that the SavedModel holds the variables the function reads
        tf.saved_model.save(module, str(folder), signatures={SIGNATURE: servable.function.get_concrete_function()})
    return {"signature": SIGNATURE}


def _write_archive(servable: Servable, folder: Path, *, track_model: bool) -> None:
    """The servable's function as a Keras ExportArchive endpoint. Untracked, the archive holds the variables the
    function reads, all that serving needs; tracking the model adds every layer's object graph (MobileNetV2:
    9.6 s to write where the variables alone took 3.8 s), needed only for what only the model holds."""
    import keras

    archive = keras.export.ExportArchive()
    if track_model:
        archive.track(servable.keras_model)
    archive.add_endpoint(name=SIGNATURE, fn=servable.function)
    archive.write_out(str(folder), verbose=False)


class SavedModelRunner(Runner):
    """A reloaded SavedModel's signature (TensorFlow's runtime, no tfperf or Keras code)."""

    format = "savedmodel"

    def __init__(self, loaded, signature: str):
        self.loaded, self.signature = loaded, signature
        self.function = loaded.signatures[signature]
        args, specs = self.function.structured_input_signature
        self.inputs = tuple(TensorSpec(name, _numpy_dtype(spec.dtype), tuple(spec.shape.as_list()))
                            for name, spec in sorted(specs.items()))
        self.outputs = tuple(sorted(self.function.structured_outputs))

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tensorflow as tf

        return {k: v.numpy() for k, v in self.function(**{n: tf.constant(x) for n, x in inputs.items()}).items()}


def load_savedmodel(folder: Path, threads: int | None = None, signature: str | None = None) -> SavedModelRunner:
    """Load a SavedModel's signature; ModelError if unusable. `threads` is TensorFlow's, set by the caller
    before TensorFlow starts (tf.config.threading), so it is not taken here."""
    import tensorflow as tf

    if threads is not None:
        raise ModelError("a SavedModel runs on TensorFlow's thread pools, fixed when TensorFlow starts: "
                         "set them with tf.config.threading before loading")
    try:
        loaded = tf.saved_model.load(str(folder))
    except Exception as exc:  # protobuf, checkpoint and op errors all mean: this folder is broken
        raise ModelError(f"{folder} is not a loadable SavedModel ({type(exc).__name__}: {first_line(exc)})") from None
    key = choose_signature(list(loaded.signatures), signature, str(folder))
    if loaded.signatures[key].structured_input_signature[0]:
        raise ModelError(f"{folder}: signature {key!r} takes positional inputs; a served signature takes named ones")
    return SavedModelRunner(loaded, key)


# LiteRT ----------------------------------------------------------------------------------------

def write_litert(servable: Servable, folder: Path, *, quantize: str = "none",
                 representative: Mapping[str, np.ndarray] | None = None, select_tf_ops: bool = False) -> dict[str, Any]:
    """model.tflite from the servable; `quantize` dynamic (int8 weights) or int8 (weights and activations,
    calibrated on `representative` rows by input name; inputs and outputs kept float32)."""
    import tensorflow as tf

    check_options("litert", quantize, select_tf_ops, representative)
    # From a SavedModel, not from the traced function: given a Keras 3 model's function directly, the
    # converter does not freeze its variables (a 5 KB file that answers NaN).
    saved = folder / ".savedmodel"
    write_savedmodel(servable, saved)
    try:
        flat = litert_from_saved_model(saved, quantize=quantize, representative=representative,
                                       select_tf_ops=select_tf_ops)
    finally:
        shutil.rmtree(saved, ignore_errors=True)
    (folder / "model.tflite").write_bytes(flat)
    flex = litert_flex_ops(folder / "model.tflite")
    return {"file": "model.tflite", "quantization": quantize, "flex_ops": flex,
            "converter": {"tensorflow": tf.__version__}}


class LiteRTRunner(Runner):
    """A .tflite model in the LiteRT interpreter (ai-edge-litert), through one of its signatures."""

    format = "litert"

    def __init__(self, interpreter, signature: str):
        self.interpreter, self.signature = interpreter, signature
        self.runner = interpreter.get_signature_runner(signature)
        self.inputs = tuple(TensorSpec(name, np.dtype(info["dtype"]).name,
                                       tuple(None if d < 0 else int(d) for d in info["shape_signature"]))
                            for name, info in sorted(self.runner.get_input_details().items()))
        self.outputs = tuple(sorted(self.runner.get_output_details()))

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner(**inputs)


def load_litert(folder: Path, threads: int | None = None, signature: str | None = None) -> LiteRTRunner:
    """model.tflite in a LiteRT interpreter with `threads` threads (default: LiteRT's choice)."""
    from ai_edge_litert.interpreter import Interpreter

    path = folder / "model.tflite"
    try:
        flex = litert_flex_ops(path)
    except Exception:  # a flatbuffer that does not parse raises whatever its reader hits
        raise ModelError(f"{path} is corrupt: it does not parse as a LiteRT model") from None
    try:
        interpreter = Interpreter(model_path=str(path), num_threads=threads)
        interpreter.allocate_tensors()  # prepares every op: a missing kernel (Flex) fails here, not at the first call
        key = choose_signature(list(interpreter.get_signature_list()), signature, str(path))
        runner = LiteRTRunner(interpreter, key)
    except (ValueError, RuntimeError) as exc:
        if isinstance(exc, ModelError):
            raise
        if flex and "Flex" in str(exc):
            raise ModelError(f"{path} runs TensorFlow ops {', '.join(flex)} through the Flex delegate, which the "
                             f"installed LiteRT interpreter does not link; run it where the Flex delegate is "
                             f"linked, or export --format onnx or savedmodel") from None
        raise ModelError(f"{path} does not load in LiteRT ({first_line(exc)})") from None
    return runner


# ONNX ------------------------------------------------------------------------------------------

def write_onnx(servable: Servable, folder: Path, *, quantize: str = "none", representative=None) -> dict[str, Any]:
    """model.onnx from the servable's function (tf2onnx), its outputs named as the function's."""
    import onnx
    import tf2onnx

    check_options("onnx", quantize)
    proto = onnx_from_function(servable.function, servable.input_signature)
    (folder / "model.onnx").write_bytes(proto.SerializeToString())
    return {"file": "model.onnx", "quantization": "none",
            "converter": {"tf2onnx": tf2onnx.__version__, "onnx": onnx.__version__, "opset": ONNX_OPSET}}


_ONNX_TYPES = {"float": "float32", "double": "float64", "float16": "float16", "int64": "int64", "int32": "int32",
               "int8": "int8", "uint8": "uint8", "bool": "bool", "string": "string"}


class OnnxRunner(Runner):
    """A .onnx model in ONNX Runtime's CPU execution provider."""

    format = "onnx"
    signature = "model"

    def __init__(self, session):
        self.session = session
        self.inputs = tuple(TensorSpec(i.name, _ONNX_TYPES.get(re.sub(r"tensor\((\w+)\)", r"\1", i.type), i.type),
                                       tuple(d if isinstance(d, int) else None for d in i.shape))
                            for i in sorted(session.get_inputs(), key=lambda i: i.name))
        self.outputs = tuple(o.name for o in session.get_outputs())

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(self.outputs, dict(inputs))))


def load_onnx(folder: Path, threads: int | None = None, signature: str | None = None) -> OnnxRunner:
    """model.onnx in an ONNX Runtime session with `threads` intra-op threads (default: its choice)."""
    import onnxruntime as ort

    if signature not in (None, OnnxRunner.signature):
        raise ModelError(f"an ONNX model has one graph and no signatures: leave out --signature {signature}")
    path = folder / "model.onnx"
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
        raise ModelError(f"{path} does not load in ONNX Runtime ({first_line(exc)})") from None
    return OnnxRunner(session)


FORMATS: Mapping[str, Format] = {f.name: f for f in (
    Format("savedmodel", "saved_model.pb", write_savedmodel, load_savedmodel,
           "SavedModel for TensorFlow and TF Serving (the default)"),
    Format("litert", "model.tflite", write_litert, load_litert,
           "LiteRT flatbuffer (.tflite) for the LiteRT interpreter; --quantize dynamic or int8", "litert"),
    Format("onnx", "model.onnx", write_onnx, load_onnx,
           "ONNX (opset 17) for ONNX Runtime", "onnx"),
)}


METADATA_FILE = "tfperf.json"
_METADATA_TYPES = {"classifier": str, "name": str, "format": str, "signature": str, "outputs": list, "inputs": dict,
                   "version": int, "quantization": str, "agreement": dict}


def read_metadata(path: Path | str) -> dict[str, Any]:
    """The metadata tfperf wrote beside an export; {} for exports made elsewhere and for metadata that is not
    what tfperf writes (not JSON, not an object, a field of the wrong type): it is input too, and the model
    itself is then read instead."""
    from tfperf import jsonio

    meta = Path(path) / METADATA_FILE
    try:
        found = jsonio.loads(meta.read_bytes(), str(meta)) if meta.is_file() else {}
    except (ValueError, OSError):
        return {}
    if not isinstance(found, dict):
        return {}
    for key, kind in _METADATA_TYPES.items():
        if key in found and found[key] is not None and not isinstance(found[key], kind):
            return {}
    return found


def format_of(folder: Path | str) -> Format | None:
    """The format whose marker file the folder holds, or None."""
    folder = Path(folder)
    for fmt in FORMATS.values():
        if (folder / fmt.marker).is_file():
            return fmt
    return None


def versions(model_root: Path | str) -> list[int]:
    """The numbered versions under saved_models/<name>/, ascending."""
    root = Path(model_root)
    if not root.is_dir():
        return []
    # ASCII digits only: "²" and "١" are digits to str.isdigit, and int() fails on the first
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit())


def check_model_dir(path: Path | str) -> Path:
    """The folder if it holds an export of a known format, else a ModelError that says what is wrong."""
    path = Path(path)
    expected = "expected an export folder such as saved_models/<name>/<version>"
    if not path.exists():
        raise ModelError(f"no model at {path}: {expected}")
    if not path.is_dir():
        raise ModelError(f"{path} is a file: {expected}")
    if format_of(path) is None:
        hint = ""
        if versions(path):
            hint = f"; it holds versions {versions(path)}: pass {path / str(versions(path)[-1])}"
        markers = ", ".join(f.marker for f in FORMATS.values())
        raise ModelError(f"{path} holds none of {markers}, so it is not an export{hint}")
    return path
