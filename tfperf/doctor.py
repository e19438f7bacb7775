"""tfperf doctor: the cookbook's experiments run on the user's own model, and advice ranked by measured gain.

A model is loaded from a Keras file, a SavedModel folder or `module:factory` (`load_subject`); its
inputs are read from it (unknown sizes from --input-shape, real values from --sample), and synthetic
inputs respect what it declares: dtypes, integer tokens within the embeddings' vocabulary, padding
where an embedding masks zeros, several inputs in lists or dicts. Then, each through tfperf.bench
(interleaved rounds, verdicts from confidence intervals): inference (predict(), model(x),
tf.function, XLA, LiteRT, ONNX Runtime) at batch 1 and over a batch sweep with outputs checked
against the model's; retracing; TensorFlow's thread pools, in processes of their own; and, given a
loss, training (steps_per_execution, jit_compile, mixed precision, batch sizes). `advise` turns the
gains whose interval clears the bar into advice ranked by the measured ratio; the rest is listed as
"no measurable gain" and not recommended.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import shutil
import sys
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

RECIPE = "doctor"  # the name its records carry, so that `tfperf compare` matches two doctor runs
MIN_GAIN = 0.02  # a speedup must be shown to exceed 2% before it is advised
LOSS_TOLERANCE = 0.10  # relative final-loss difference from plain fit beyond which a change "disagrees"
TRACE_BATCHES = (1, 2, 3, 5, 8, 13, 21, 34)  # batch sizes an application might send, each new to the function
KERAS_SUFFIXES = (".keras", ".h5")


class DoctorError(ValueError):
    """Input doctor cannot use; the message says what to do instead."""


# The model under examination ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input: its name, dtype (NumPy's name) and shape without the batch axis."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[batch, {', '.join(map(str, self.shape))}]".replace(", ]", "]")


@dataclasses.dataclass
class Subject:
    """A loaded model and what doctor knows about it.

    Args:
        structure: the model's input structure with each input replaced by its name (a name, a list
            or a dict), so that flat arrays by name can be packed the way the model takes them.
        call: the model on packed inputs (TensorFlow tensors), training off; returns its outputs.
        fresh: a new copy of the Keras model with the same weights, built under a dtype policy name
            (None: the model's own); None when there is no Keras model to copy.
    """

    name: str
    source: str
    kind: str  # "keras" or "savedmodel"
    inputs: tuple[InputSpec, ...]
    structure: Any
    call: Callable[[Any], Any]
    model: Any = None
    trackable: Any = None  # what holds the variables (the Keras model or the loaded SavedModel)
    fresh: Callable[[str | None], Any] | None = None
    vocabulary: int | None = None  # the smallest Embedding input_dim: integer inputs stay below it
    mask_zero: bool = False  # an Embedding masks token 0: synthetic rows end in padding
    fixed_batch: int | None = None  # a SavedModel signature that takes only this batch size
    parameters: int | None = None
    weight_bytes: int | None = None
    flops: int | None = None  # forward FLOPs per example of Dense and Conv2D layers (Keras models)

    def pack(self, flat: Mapping[str, Any]) -> Any:
        """Arrays or tensors by input name, in the structure the model takes."""
        return _map_structure(lambda name: flat[name], self.structure)


def _map_structure(fn: Callable[[Any], Any], structure: Any) -> Any:
    if isinstance(structure, dict):
        return {k: _map_structure(fn, v) for k, v in structure.items()}
    if isinstance(structure, (list, tuple)):
        return type(structure)(_map_structure(fn, v) for v in structure)
    return fn(structure)


def parse_input_shapes(texts: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """--input-shape values, `NAME=D,D,...` or `D,D,...` (for a model with one input; key ''), sizes without
    the batch axis."""
    shapes = {}
    for text in texts:
        name, _, dims = text.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        except ValueError:
            shape = ()
        if not shape or any(d < 1 for d in shape):
            raise DoctorError(f"--input-shape {text!r}: give NAME=D,D,... (sizes without the batch axis, each at "
                              f"least 1), or D,D,... for a model with one input")
        shapes[name.strip()] = shape
    return shapes


def _resolve_shape(name: str, dtype: str, shape: Sequence[int | None], given: Mapping[str, tuple[int, ...]],
                   single: bool) -> InputSpec:
    """An input's shape with the sizes the model leaves unknown filled from --input-shape."""
    shape = tuple(shape)
    override = given.get(name, given.get("") if single else None)
    if override is not None:
        if len(override) != len(shape) or any(d is not None and d != o for d, o in zip(shape, override)):
            model_shape = ", ".join("?" if d is None else str(d) for d in shape)
            raise DoctorError(f"--input-shape for {name!r} is {list(override)}, but the model declares "
                              f"[{model_shape}] (without the batch axis): give sizes only where it has '?'")
        shape = override
    if any(d is None for d in shape):
        model_shape = ", ".join("?" if d is None else str(d) for d in shape)
        raise DoctorError(f"input {name!r} has sizes the model leaves unknown: [{model_shape}] after the batch "
                          f"axis; give them with --input-shape {name}=" + ",".join(
                              "N" if d is None else str(d) for d in shape))
    return InputSpec(name, dtype, tuple(int(d) for d in shape))


def load_subject(source: str, *, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 trust: bool = False) -> Subject:
    """The model at `source`: a Keras file, a SavedModel folder, or `module:factory`; DoctorError if unusable.

    A SavedModel is inspected before it is loaded (tfperf.inspection) and refused when it reaches ops
    off the allowlist, unless `trust`.
    """
    given = dict(input_shapes or {})
    path = Path(source)
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise DoctorError(f"{source} is a folder without saved_model.pb: give a SavedModel folder, a .keras "
                              f"file, or module:factory")
        return _saved_model_subject(path, given, trust)
    if path.suffix in KERAS_SUFFIXES or path.is_file():
        if not path.is_file():
            raise DoctorError(f"no such file: {source}")
        if path.suffix not in KERAS_SUFFIXES:
            raise DoctorError(f"{source} is not a model: give a .keras file, a SavedModel folder, or "
                              f"module:factory (a Python function that returns a Keras model)")
        model = _load_keras_file(path)
        return _keras_subject(model, source, given, factory=lambda: _load_keras_file(path))
    if ":" in source and not path.exists():
        model, factory = _load_factory(source)
        return _keras_subject(model, source, given, factory=factory, builds_under_policy=True)
    raise DoctorError(f"no such model: {source}: give a .keras file, a SavedModel folder, or module:factory")


def _load_keras_file(path: Path):
    import keras

    if path.suffix == ".keras" and not zipfile.is_zipfile(path):
        raise DoctorError(f"{path} is not a Keras file (a .keras file is a zip archive): it is corrupt or "
                          f"something else renamed")
    try:
        return keras.saving.load_model(str(path), compile=False)
    except (TypeError, ValueError) as exc:
        text = str(exc)
        if "deserializ" in text or "Could not locate" in text or "Unknown layer" in text:
            raise DoctorError(f"{path} needs classes this process does not have (custom layers or models): give "
                              f"module:factory instead, a Python function that builds the model (and loads its "
                              f"weights)") from None
        raise DoctorError(f"{path} cannot be loaded: {_first_line(exc)}") from None
    except Exception as exc:  # a damaged archive or weights file
        raise DoctorError(f"{path} cannot be loaded ({type(exc).__name__}: {_first_line(exc)})") from None


def _load_factory(source: str):
    import keras

    module_name, _, attr = source.partition(":")
    if not module_name or not attr:
        raise DoctorError(f"{source!r}: give module:factory, e.g. mypackage.models:build")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a module beside the user, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DoctorError(f"cannot import {module_name!r} for {source}: {_first_line(exc)} (run from the folder "
                          f"that holds it, or install it)") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise DoctorError(f"{module_name} has no function {attr!r} (for {source})")

    def build():
        try:
            model = factory()
        except Exception as exc:
            raise DoctorError(f"{source}() failed: {type(exc).__name__}: {_first_line(exc)}") from None
        if not isinstance(model, keras.Model):
            raise DoctorError(f"{source}() returned a {type(model).__name__}, not a Keras model")
        return model

    return build(), build


def _keras_subject(model, source: str, given: Mapping[str, tuple[int, ...]], *, factory,
                   builds_under_policy: bool = False) -> Subject:
    """Args:
        factory: builds the model again with its weights (the user's function, or a reload of the file).
        builds_under_policy: the factory builds layers anew, so a dtype policy set around it takes effect
            (a reloaded file keeps the dtypes it saved, so it is cloned layer by layer instead).
    """
    import keras

    try:
        structure = model.input  # a functional model's own structure: one input, a list or a dict
    except (AttributeError, ValueError):
        # A Sequential model has only `inputs`; a subclassed model not yet called has neither.
        found = getattr(model, "inputs", None) or []
        structure = found[0] if len(found) == 1 else (list(found) or None)
    if structure is None:
        if len(given) != 1:
            raise DoctorError(f"{source} does not say what it takes (a subclassed model not yet called): give "
                              f"--input-shape D,D,... for its one float32 input")
        shape = next(iter(given.values()))
        try:
            model(np.zeros((1, *shape), np.float32))
        except Exception as exc:
            raise DoctorError(f"{source} fails on a float32 input of shape [1, {', '.join(map(str, shape))}]: "
                              f"{_first_line(exc)}") from None
        structure = "input"
        inputs = (InputSpec("input", "float32", shape),)
    else:
        leaves = keras.tree.flatten(structure)
        single = len(leaves) == 1
        inputs = tuple(_resolve_shape(t.name, np.dtype(t.dtype).name if t.dtype != "string" else "string",
                                      t.shape[1:], given, single) for t in leaves)
        structure = _map_structure(lambda t: t.name, structure)
    unknown = set(given) - {i.name for i in inputs} - ({""} if len(inputs) == 1 else set())
    if unknown:
        raise DoctorError(f"--input-shape names {', '.join(sorted(unknown))}, but the model's inputs are "
                          f"{', '.join(i.name for i in inputs)}")
    embeddings = [layer for layer in _all_layers(model) if isinstance(layer, keras.layers.Embedding)]
    weights = model.get_weights()

    def fresh(policy: str | None = None):
        from tfperf.precision import dtype_policy

        if policy is None:
            copy = factory()
        elif builds_under_policy:
            with dtype_policy(policy):
                copy = factory()
        else:
            # Mixed precision: rebuild every layer under the policy; the same weights, cast where used.
            # Layers that take no dtype policy (the ops a functional model records) are copied as they are.
            def under_policy(layer):
                config = layer.get_config()
                if not isinstance(layer, keras.layers.InputLayer) and layer.weights:
                    config["dtype"] = policy
                return layer.__class__.from_config(config)

            with dtype_policy(policy):
                copy = keras.models.clone_model(model, clone_function=under_policy)
        copy.set_weights(weights)
        return copy

    from tfperf.models import flops

    counted = (keras.layers.Dense, keras.layers.Conv2D)
    free = (keras.layers.Embedding, keras.layers.BatchNormalization, keras.layers.LayerNormalization)
    uncounted = [layer for layer in _all_layers(model) if layer.weights and not isinstance(layer, counted + free)
                 and not hasattr(layer, "layers")]
    try:
        # Only when every layer with weights is one flops() counts: a partial count would flatter the limit.
        model_flops = (flops(model) or None) if not uncounted else None
    except Exception:  # a layer whose shapes flops() cannot read: say "not computed", not fail
        model_flops = None
    return Subject(
        name=_model_name(source, model.name), source=source, kind="keras", inputs=inputs, structure=structure,
        call=lambda packed: model(packed, training=False), model=model, trackable=model, fresh=fresh,
        vocabulary=min((layer.input_dim for layer in embeddings), default=None),
        mask_zero=any(layer.mask_zero for layer in embeddings), parameters=int(model.count_params()),
        weight_bytes=int(sum(w.nbytes for w in weights)), flops=model_flops)


def _all_layers(model) -> list:
    """Every layer inside the model, nested ones included."""
    found, stack = [], list(getattr(model, "layers", []))
    while stack:
        layer = stack.pop()
        found.append(layer)
        stack.extend(getattr(layer, "layers", []) or [])
        stack.extend(getattr(layer, "_layers", []) or [])
    return found


def _saved_model_subject(path: Path, given: Mapping[str, tuple[int, ...]], trust: bool) -> Subject:
    import tensorflow as tf

    from tfperf import inspection
    from tfperf.formats import ModelError

    try:
        report = inspection.inspect_model(path) if trust else inspection.check_safe(path)
    except ModelError as exc:
        raise DoctorError(str(exc)) from None
    except Exception as exc:  # an unreadable saved_model.pb
        raise DoctorError(f"{path} is not a readable SavedModel ({type(exc).__name__}: {_first_line(exc)})") from None
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        raise DoctorError(f"{path} is not a loadable SavedModel ({type(exc).__name__}: {_first_line(exc)})") from None
    signatures = dict(loaded.signatures)
    if not signatures:
        raise DoctorError(f"{path} has no signature to call: save it with signatures= (or a tf.function with an "
                          f"input_signature), or give the Keras model")
    key = "serving_default" if "serving_default" in signatures else sorted(signatures)[0]
    signature = signatures[key]
    specs = signature.structured_input_signature[1]
    if not specs or signature.structured_input_signature[0]:
        raise DoctorError(f"{path}: signature {key!r} takes no named inputs")
    batches = {spec.shape[0] for spec in specs.values() if spec.shape.rank}
    fixed = next(iter(batches)) if len(batches) == 1 and None not in batches else None
    single = len(specs) == 1
    inputs = tuple(_resolve_shape(name, "string" if spec.dtype == tf.string else spec.dtype.as_numpy_dtype.__name__,
                                  spec.shape.as_list()[1:], given, single) for name, spec in sorted(specs.items()))
    return Subject(
        name=_model_name(str(path), None), source=str(path), kind="savedmodel", inputs=inputs,
        structure={i.name: i.name for i in inputs}, call=lambda packed: signature(**packed), trackable=loaded,
        fixed_batch=fixed,
        parameters=report.variable_bytes // 4 if report.variable_bytes else None,
        weight_bytes=report.variable_bytes)


def _model_name(source: str, declared: str | None) -> str:
    """A folder-safe name for the model: its file or folder name, or the factory's."""
    path = Path(source)
    if path.exists():
        name = path.stem if path.is_file() else (path.name if not path.name.isdigit() else path.parent.name)
    else:
        name = source.rpartition(":")[2]
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in (name or declared or "model"))


def _first_line(exc: BaseException) -> str:
    from tfperf.formats import first_line

    return first_line(exc)


# Inputs ---------------------------------------------------------------------------------------------


def read_sample(path: Path | str) -> dict[str, np.ndarray]:
    """Arrays from a .npz: inputs by name (or one array for a one-input model), optionally `y` for training."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise DoctorError(f"no such sample file: {path}") from None
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise DoctorError(f"--sample {path} is not a NumPy .npz archive of arrays ({_first_line(exc)})") from None


def sample_inputs(subject: Subject, sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The sample's arrays for each input, checked against the input's shape."""
    names = [i.name for i in subject.inputs]
    arrays = {k: v for k, v in sample.items() if k != "y"}
    if len(names) == 1 and names[0] not in arrays and len(arrays) == 1:
        arrays = {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise DoctorError(f"the sample lacks {', '.join(missing)}: it holds {', '.join(sorted(sample)) or 'nothing'}; "
                          f"name its arrays after the model's inputs ({', '.join(names)})")
    for spec in subject.inputs:
        a = arrays[spec.name]
        if a.ndim < 1 or tuple(a.shape[1:]) != spec.shape:
            raise DoctorError(f"sample array {spec.name!r} has shape {list(a.shape)}, the model takes "
                              f"[N, {', '.join(map(str, spec.shape))}]")
        if len(a) != len(arrays[names[0]]):
            raise DoctorError("the sample's input arrays must have the same number of rows")
    return {n: arrays[n] for n in names}


def make_inputs(subject: Subject, batch: int, *, seed: int = 0,
                sample: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """`batch` rows for every input, by name: rows of the sample repeated, or synthetic values that respect
    the model's dtypes, vocabulary and masking."""
    if sample is not None:
        arrays = sample_inputs(subject, sample)
        rows = np.resize(np.arange(len(next(iter(arrays.values())))), batch)
        return {n: a[rows] for n, a in arrays.items()}
    rng = np.random.default_rng(seed)
    found = {}
    for spec in subject.inputs:
        shape = (batch, *spec.shape)
        kind = np.dtype(spec.dtype).kind if spec.dtype != "string" else "U"
        if kind in "US":
            raise DoctorError(f"input {spec.name!r} takes strings, which doctor cannot invent: pass real inputs "
                              f"with --sample FILE.npz (an array named {spec.name!r})")
        if kind == "b":
            found[spec.name] = rng.random(shape) < 0.5
        elif kind in "iu":
            # Token ids: below the smallest vocabulary; when an embedding masks 0, rows end in padding.
            high = subject.vocabulary or 2
            low = 1 if subject.mask_zero and high > 1 else 0
            tokens = rng.integers(low, high, size=shape)
            if subject.mask_zero and len(spec.shape) >= 1 and spec.shape[0] > 1:
                lengths = rng.integers(1, spec.shape[0] + 1, size=batch)
                tokens[np.arange(spec.shape[0])[None, :] >= lengths[:, None]] = 0
            found[spec.name] = tokens.astype(spec.dtype)
        else:
            found[spec.name] = rng.normal(size=shape).astype(spec.dtype)
    return found


def to_tensors(flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The arrays as TensorFlow constants (what a served model receives)."""
    import tensorflow as tf

    return {k: tf.constant(v) for k, v in flat.items()}


def flat_outputs(outputs: Any) -> list[np.ndarray]:
    """A model's outputs as a list of arrays, in tf.nest order (dicts by sorted key)."""
    import tensorflow as tf

    return [np.asarray(o) for o in tf.nest.flatten(outputs)]


def check_runs(subject: Subject, flat: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs on these inputs; DoctorError saying what to do when it fails on them."""
    try:
        return flat_outputs(subject.call(subject.pack(to_tensors(flat))))
    except DoctorError:
        raise
    except Exception as exc:
        raise DoctorError(f"the model fails on doctor's synthetic inputs ({type(exc).__name__}: {_first_line(exc)}): "
                          f"pass real inputs with --sample FILE.npz, or --input-shape if a size is wrong") from None


# Serving functions and exported runtimes -------------------------------------------------------------


def serving_function(subject: Subject):
    """The model as a tf.function of its inputs, flat and named, with any batch size, returning
    {'output_0': ..., ...}: what LiteRT and ONNX conversions take."""
    import tensorflow as tf

    names = [i.name for i in subject.inputs]
    signature = [tf.TensorSpec((subject.fixed_batch, *i.shape), tf.as_dtype(i.dtype), name=i.name)
                 for i in subject.inputs]

    def serve(*flat):
        outputs = tf.nest.flatten(subject.call(subject.pack(dict(zip(names, flat)))))
        return {f"output_{k}": t for k, t in enumerate(outputs)}

    return tf.function(serve, input_signature=signature)


def _ordered(outputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(outputs[k]) for k in sorted(outputs, key=lambda k: int(k.rpartition("_")[2]))]


def litert_runner(subject: Subject, workdir: Path, threads: int | None) -> Callable[[Mapping[str, np.ndarray]], list]:
    """The model converted to LiteRT (float32, builtin ops), in an interpreter: a call on inputs by name."""
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    from tfperf.formats import litert_from_saved_model

    staged = workdir / "litert-savedmodel"
    function = serving_function(subject)
    if subject.kind == "keras":
        # Through Keras' ExportArchive, which hands the converter the Keras variables to freeze (a plain
        # tf.Module holding a Keras 3 model converts to a model that answers garbage).
        import keras

        archive = keras.export.ExportArchive()
        archive.track(subject.model)
        archive.add_endpoint(name="serving_default", fn=function)
        archive.write_out(str(staged), verbose=False)
    else:
        module = tf.Module()
        module.tracked = subject.trackable  # so that the SavedModel holds the variables the function reads
        tf.saved_model.save(module, str(staged), signatures={"serving_default": function.get_concrete_function()})
    flat = litert_from_saved_model(staged)
    shutil.rmtree(staged, ignore_errors=True)
    interpreter = Interpreter(model_content=flat, num_threads=threads)
    runner = interpreter.get_signature_runner("serving_default")
    return lambda inputs: _ordered(runner(**inputs))


def onnx_runner(subject: Subject, threads: int | None) -> Callable[[Mapping[str, np.ndarray]], list]:
    """The model converted by tf2onnx, in an ONNX Runtime session: a call on inputs by name."""
    import onnxruntime as ort

    from tfperf.formats import onnx_from_function

    function = serving_function(subject)
    proto = onnx_from_function(function, function.input_signature)
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda inputs: _ordered(dict(zip(names, session.run(names, dict(inputs)))))


# Measurements -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Finding:
    """One alternative measured against a baseline: what to advise if it wins."""

    section: str
    row: str
    baseline: str
    comparison: Any  # stats.Comparison
    code: str
    cost: str
    agrees: bool = True
    note: str = ""


@dataclasses.dataclass
class Options:
    """What a doctor run measures and how long it may take."""

    batch_sizes: tuple[int, ...] = (1, 32, 256)
    rounds: int = 6
    min_time_s: float = 0.5  # per alternative and batch size, spread over the rounds
    train: bool = False
    loss: str | None = None
    from_logits: bool = False
    train_examples: int = 1024
    threads: bool = True
    exported: bool = True
    budget_s: float | None = None
    quick: bool = False
    seed: int = 0
    sample: Mapping[str, np.ndarray] | None = None
    sample_path: str | None = None  # where `sample` came from, for the thread-sweep processes
    trust: bool = False
    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Diagnosis:
    """What a doctor run found: the records' recorder, the findings, the advice, and what was left out."""

    subject: Subject
    recorder: Any
    findings: list[Finding]
    skipped: dict[str, str]
    facts: dict[str, Any]
    elapsed_s: float = 0.0

    @property
    def wins(self) -> list[Finding]:
        """Significant gains that keep the model's answers, largest first."""
        from tfperf.stats import FASTER

        found = [f for f in self.findings if f.comparison.verdict == FASTER and f.agrees]
        return sorted(found, key=lambda f: f.comparison.ratio, reverse=True)

    @property
    def advice(self) -> list[tuple[Finding, list[Finding]]]:
        """Per question (a table, or a cause of retracing), the largest significant gain and the other
        significant ones; questions ranked by their largest gain."""
        grouped: dict[str, list[Finding]] = {}
        for f in self.wins:
            grouped.setdefault(f.section, []).append(f)
        return [(found[0], found[1:]) for found in grouped.values()]

    @property
    def no_gain(self) -> list[Finding]:
        """What was measured and is not advised: no significant gain, or answers that differ."""
        wins = self.wins
        return [f for f in self.findings if f not in wins]


def model_facts(subject: Subject, *, quick: bool, sample: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Parameters, FLOPs per example, inputs and outputs, and the compute limit at the matmul rate measured now;
    DoctorError when the model fails on the inputs doctor will give it."""
    from tfperf.bench import peak_matmul_flops_per_s

    outputs = check_runs(subject, make_inputs(subject, 2, seed=0, sample=sample))
    rate = peak_matmul_flops_per_s((512,) if quick else (512, 1024, 2048))
    facts = {"kind": subject.kind, "parameters": subject.parameters, "weight_bytes": subject.weight_bytes,
             "inputs": [str(i) for i in subject.inputs],
             "outputs": [f"output_{k}: {o.dtype.name}[batch, {', '.join(map(str, o.shape[1:]))}]".replace(", ]", "]")
                         for k, o in enumerate(outputs)],
             "flops_per_example": subject.flops, "matmul_flops_per_s": rate}
    if subject.flops:
        facts["compute_limit_examples_per_s"] = rate / subject.flops
    return facts


def _timer_rows(rec, table: str, measurements, comparisons, extra: Mapping[str, dict], *, batch: int) -> None:
    """Record one race: the baseline row, then each alternative with its comparison."""
    for i, m in enumerate(measurements):
        metrics = {"ms_per_call": m.median_s * 1e3, "p99_ms": m.p99_s * 1e3, "rows_per_s": m.items_per_s,
                   "first_call_s": m.first_call_s, "batch": batch, **extra.get(m.name, {})}
        primary = "ms_per_call" if batch == 1 else "rows_per_s"
        rec.add(table, m.name, metrics, primary=primary, lower_is_better=batch == 1, measurement=m,
                comparison=None if i == 0 else comparisons[i - 1])


def inference(subject: Subject, rec, options: Options, workdir: Path, progress) -> tuple[list[Finding], dict]:
    """predict() / model(x) / tf.function / XLA / LiteRT / ONNX Runtime, at each batch size."""
    import tensorflow as tf

    from tfperf.bench import Timer, race, versus

    findings, skipped = [], {}
    threads = os.cpu_count()
    exported: dict[str, Callable] = {}
    if options.exported:
        for name, build in (("LiteRT interpreter", lambda: litert_runner(subject, workdir, threads)),
                            ("ONNX Runtime", lambda: onnx_runner(subject, threads))):
            try:
                exported[name] = build()
            except Exception as exc:  # a converter that cannot take this model: a finding, not a failure
                skipped[name] = f"conversion failed: {type(exc).__name__}: {_first_line(exc)}"
    batches = [b for b in options.batch_sizes if subject.fixed_batch in (None, b)]
    if not batches:
        skipped["batch sweep"] = f"the signature takes only batch {subject.fixed_batch}"
        batches = [subject.fixed_batch]
    graph = tf.function(subject.call)
    xla = tf.function(subject.call, jit_compile=True)
    for batch in batches:
        progress(f"inference at batch {batch}")
        flat = make_inputs(subject, batch, seed=options.seed, sample=options.sample)
        tensors = subject.pack(to_tensors(flat))
        reference = check_runs(subject, flat)
        calls: dict[str, tuple[Callable[[], Any], str, str]] = {}
        if subject.kind == "keras":
            packed = subject.pack(flat)
            model = subject.model
            calls["predict()"] = (lambda: model.predict(packed, batch_size=batch, verbose=0), "", "")
            calls["model(x)"] = (lambda: model(tensors, training=False),
                                 "y = model(x, training=False)   # instead of model.predict(x) for small batches",
                                 "none: the same model in eager mode")
        else:
            calls["signature"] = (lambda: subject.call(tensors), "", "")
        calls["tf.function"] = (
            lambda: graph(tensors),
            "serve = tf.function(lambda x: model(x, training=False), input_signature=[...])  # None batch axis",
            "one trace per input signature (see retracing)")
        calls["tf.function, jit_compile=True"] = (
            lambda: xla(tensors),
            "serve = tf.function(lambda x: model(x, training=False), jit_compile=True, input_signature=[...])",
            "an XLA compile for every new input shape (first call below)")
        for name, run in exported.items():
            calls[name] = ((lambda run=run: run(flat)),
                           "tf.lite.TFLiteConverter.from_saved_model(...); ai_edge_litert Interpreter" if "LiteRT" in name
                           else "tf2onnx.convert.from_keras(model) (or from_function); onnxruntime.InferenceSession",
                           "a converted copy to ship and keep in step with the model; float32, outputs checked below")
        diffs, broken = {}, {}
        for name, (fn, _, _) in list(calls.items()):
            try:
                got = flat_outputs(fn())
                diffs[name] = max((float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64))))
                                   for g, r in zip(got, reference) if g.size), default=0.0)
            except Exception as exc:
                broken[name] = f"{type(exc).__name__}: {_first_line(exc)}"
                del calls[name]
        for name, why in broken.items():
            skipped[f"{name} at batch {batch}"] = why
        timers = [Timer(fn, name=name, items_per_call=batch) for name, (fn, _, _) in calls.items()]
        ms, comparisons = race(timers, rounds=options.rounds, threshold=MIN_GAIN, min_time_s=options.min_time_s,
                               seed=options.seed)
        scale = max((float(np.max(np.abs(r))) for r in reference if r.size), default=1.0)
        tolerance = 1e-4 * max(1.0, scale)
        table = "batch 1 latency" if batch == 1 else f"throughput at batch {batch}"
        _timer_rows(rec, table, ms, comparisons, {n: {"max_abs_diff": d} for n, d in diffs.items()}, batch=batch)
        baseline = ms[0].name
        for m, c in zip(ms[1:], comparisons):
            _, code, cost = calls[m.name]
            agrees = diffs[m.name] <= tolerance
            note = "" if agrees else f"outputs differ from the model's by up to {diffs[m.name]:.2g}"
            findings.append(Finding(table, m.name, baseline, c, code, cost, agrees, note))
        # XLA: the question users ask is whether to turn it on for a function they already trace.
        by_name = {m.name: m for m in ms}
        if "tf.function" in by_name and "tf.function, jit_compile=True" in by_name:
            _, code, cost = calls["tf.function, jit_compile=True"]
            findings.append(Finding(f"XLA at batch {batch}", "jit_compile=True", "tf.function",
                                    versus(by_name["tf.function"], by_name["tf.function, jit_compile=True"],
                                           threshold=MIN_GAIN), code, cost,
                                    diffs["tf.function, jit_compile=True"] <= tolerance))
    return findings, skipped


def count_traces(function, calls: Sequence[tuple]) -> int:
    """How many times a tf.function traced while making these calls (argument tuples)."""
    before = function.experimental_get_tracing_count()
    for args in calls:
        function(*args)
    return function.experimental_get_tracing_count() - before


def retraces(function, calls: Sequence[tuple]) -> bool:
    """True when the calls made the function trace more than once: each trace rebuilds its graph."""
    return count_traces(function, calls) > 1


def retracing(subject: Subject, rec, options: Options) -> tuple[list[Finding], dict]:
    """Call the model through tf.function the way applications do: new batch sizes, a Python number."""
    import tensorflow as tf

    from tfperf.bench import Measurement, Timer, versus

    batches = [b for b in TRACE_BATCHES if subject.fixed_batch in (None, b)]
    if len(batches) < 2:
        return [], {"retracing": f"the signature takes only batch {subject.fixed_batch}: nothing can retrace"}
    inputs = {b: subject.pack(to_tensors(make_inputs(subject, b, seed=options.seed, sample=options.sample)))
              for b in batches}
    specs = tf.nest.map_structure(lambda t: tf.TensorSpec((None, *t.shape[1:]), t.dtype), inputs[batches[0]])

    def per_call(function, arguments: Sequence[tuple], name: str) -> tuple[int, Measurement]:
        """Traces, and the time of each call after the first, making these calls in turn."""
        before = function.experimental_get_tracing_count()
        order = iter(arguments)
        timer = Timer(lambda: function(*next(order)), name=name)
        timer.start(warmup=0)
        m = timer._measurement(timer.take(len(arguments) - 1), rounds=1)
        return function.experimental_get_tracing_count() - before, m

    by_batch = [(inputs[b],) for b in batches]
    x1 = inputs[batches[0]]
    values = [0.5 + k / 10 for k in range(len(batches))]
    # A Python number as an argument is part of the trace's key: every new value traces again.
    scaled = lambda x, scale: tf.nest.map_structure(lambda o: o * scale, subject.call(x))  # noqa: E731
    rows = [("tf.function, a new batch size each call", tf.function(subject.call), by_batch),
            ("input_signature with a None batch axis", tf.function(subject.call, input_signature=[specs]), by_batch),
            ("reduce_retracing=True", tf.function(subject.call, reduce_retracing=True), by_batch),
            ("a Python float argument, a new value each call", tf.function(scaled), [(x1, v) for v in values]),
            ("the same values as tf.constant", tf.function(scaled), [(x1, tf.constant(v)) for v in values])]
    found = {}
    for i, (row, function, arguments) in enumerate(rows):
        traces, m = per_call(function, arguments, row)
        found[row] = (traces, m)
        baseline = rows[0][0] if i < 3 else rows[3][0]
        c = None if i in (0, 3) else versus(found[baseline][1], m, threshold=MIN_GAIN)
        rec.add("retracing", row, {"calls": len(arguments), "traces": traces, "ms_per_call": m.median_s * 1e3,
                                   "first_call_s": m.first_call_s}, primary="ms_per_call", lower_is_better=True,
                measurement=m, comparison=c, versus_first=False)
    findings = []
    (plain_traces, plain), (signed_traces, signed) = found[rows[0][0]], found[rows[1][0]]
    relaxed_traces, relaxed = found[rows[2][0]]
    if plain_traces > 1:
        findings.append(Finding(
            "retracing: new batch sizes", rows[1][0], rows[0][0], versus(plain, signed, threshold=MIN_GAIN),
            "@tf.function(input_signature=[tf.TensorSpec([None, ...], dtype)])  # a None batch axis",
            f"none at run time; {plain_traces} traces in {len(batches)} calls became {signed_traces}"))
        findings.append(Finding(
            "retracing: new batch sizes", rows[2][0], rows[0][0], versus(plain, relaxed, threshold=MIN_GAIN),
            "@tf.function(reduce_retracing=True)",
            f"{plain_traces} traces in {len(batches)} calls became {relaxed_traces}; the relaxed graph may be "
            f"less specialised"))
    (number_traces, number), (constant_traces, constant) = found[rows[3][0]], found[rows[4][0]]
    if number_traces > 1:
        findings.append(Finding(
            "retracing: Python numbers", "numbers passed as tf.constant", rows[3][0],
            versus(number, constant, threshold=MIN_GAIN),
            "f(x, tf.constant(scale))   # not f(x, scale): a Python number is part of the trace key",
            f"none; {number_traces} traces in {len(values)} calls became {constant_traces}"))
    return findings, {}


def thread_configs(cores: int) -> list[tuple[str, int | None, int | None]]:
    """(row, intra-op threads, inter-op threads): TensorFlow's default first, then one pool of 1 and of all
    cores, and a split pool where there are cores to split."""
    configs = [("default threads", None, None), ("intra 1, inter 1", 1, 1)]
    if cores > 1:
        configs.append((f"intra {cores}, inter 1", cores, 1))
    if cores >= 4:
        configs.append((f"intra {cores // 2}, inter 2", cores // 2, 2))
    return configs


def thread_batches(subject: Subject, options: Options) -> list[int]:
    """The sweep's smallest and largest batch sizes (latency and throughput), those the model takes."""
    return sorted({b for b in (min(options.batch_sizes), max(options.batch_sizes)) if subject.fixed_batch in (None, b)})


def threads(subject: Subject, rec, options: Options, progress) -> tuple[list[Finding], dict]:
    """Thread pools swept in processes of their own (they are fixed when TensorFlow starts), interleaved."""
    from tfperf.bench import TimerProcess, race

    configs = thread_configs(os.cpu_count() or 1)
    batches = thread_batches(subject, options)
    processes = []
    try:
        for row, intra, inter in configs:  # started side by side; each says when it is ready
            argv = [sys.executable, "-m", "tfperf", "doctor", subject.source, "--role", "threads",
                    "--batch-sizes", ",".join(map(str, batches)), "--seed", str(options.seed), "--trust",
                    *[a for name, shape in options.input_shapes.items()
                      for a in ("--input-shape", (f"{name}=" if name else "") + ",".join(map(str, shape)))]]
            if options.sample_path:
                argv += ["--sample", options.sample_path]
            if intra is not None:
                argv += ["--intra", str(intra), "--inter", str(inter)]
            processes.append(TimerProcess(argv, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}))
        findings = []
        for batch in batches:
            progress(f"threads at batch {batch}")
            timers = [process.timer(f"batch {batch}", name=row) for (row, _, _), process in zip(configs, processes)]
            ms, comparisons = race(timers, rounds=options.rounds, threshold=MIN_GAIN,
                                   min_time_s=options.min_time_s, seed=options.seed)
            table = f"threads at batch {batch}"
            _timer_rows(rec, table, ms, comparisons, {}, batch=batch)
            for (row, intra, inter), m, c in zip(configs[1:], ms[1:], comparisons):
                findings.append(Finding(
                    table, row, ms[0].name, c,
                    f"tf.config.threading.set_intra_op_parallelism_threads({intra}); "
                    f"tf.config.threading.set_inter_op_parallelism_threads({inter})  # before TensorFlow runs an op",
                    "process-wide; a server running several models side by side divides the cores between them"))
        return findings, {}
    finally:
        for process in processes:
            process.close()


def serve_thread_timers(args) -> int:
    """A thread-sweep process: its thread pools set before TensorFlow runs anything, it times the model."""
    import tensorflow as tf

    from tfperf.bench import Timer, serve_timers

    if args.intra is not None:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra)
        tf.config.threading.set_inter_op_parallelism_threads(args.inter)
    subject = load_subject(args.model, input_shapes=parse_input_shapes(args.input_shape or []), trust=True)
    sample = read_sample(args.sample) if args.sample else None
    graph = tf.function(subject.call)
    timers = []
    for batch in args.batch_sizes:
        tensors = subject.pack(to_tensors(make_inputs(subject, batch, seed=args.seed, sample=sample)))
        timers.append(Timer(lambda t=tensors: graph(t), name=f"batch {batch}", items_per_call=batch))
    serve_timers(timers)
    return 0


def training_labels(subject: Subject, loss: str, outputs: Sequence[np.ndarray], examples: int,
                    rng: np.random.Generator) -> list[np.ndarray]:
    """Targets for each output that the loss accepts: class ids, one-hot rows, 0/1, or real values."""
    labels = []
    for out in outputs:
        shape = (examples, *out.shape[1:])
        classes = out.shape[-1] if out.ndim > 1 else 1
        if "sparse" in loss:
            labels.append(rng.integers(0, max(classes, 2), size=shape[:-1]).astype(np.int32))
        elif "categorical" in loss or loss == "kl_divergence":
            labels.append(np.eye(classes, dtype=np.float32)[rng.integers(0, classes, size=shape[:-1])])
        elif "binary" in loss or "hinge" in loss:
            labels.append((rng.random(shape) < 0.5).astype(np.float32))
        else:
            labels.append(rng.normal(size=shape).astype(np.float32))
    return labels


def training_loss(name: str | None, from_logits: bool) -> Callable:
    """The Keras loss called `name`, on logits when `from_logits`; DoctorError for a name Keras lacks."""
    import keras

    try:
        base = keras.losses.get(name)
    except (ValueError, TypeError):
        base = None
    if not callable(base):
        raise DoctorError(f"unknown --loss {name!r}: give a Keras loss name such as sparse_categorical_crossentropy, "
                          f"categorical_crossentropy, binary_crossentropy or mean_squared_error")
    if not from_logits:
        return base

    def on_logits(y_true, y_pred):
        return base(y_true, y_pred, from_logits=True)

    on_logits.__name__ = f"{name}_from_logits"
    return on_logits


def training(subject: Subject, rec, options: Options, progress) -> tuple[list[Finding], dict]:
    """Plain fit against steps_per_execution, jit_compile, mixed precision and larger batches, epoch for
    epoch from the same weights; final losses checked finite and in agreement."""
    import keras
    import tensorflow as tf

    from tfperf.bench import Timer, race
    from tfperf.train import fit_epochs

    if subject.fresh is None:
        raise DoctorError("training experiments need the Keras model: give a .keras file or module:factory, "
                          "not a SavedModel")
    progress("training")
    examples = options.train_examples
    flat = make_inputs(subject, examples, seed=options.seed, sample=options.sample)
    x = subject.pack(flat)
    rng = np.random.default_rng(options.seed + 1)
    outputs = check_runs(subject, make_inputs(subject, 2, seed=options.seed, sample=options.sample))
    if options.sample is not None and "y" in options.sample:
        y_sample = options.sample["y"]
        y = y_sample[np.resize(np.arange(len(y_sample)), examples)]
    else:
        labels = training_labels(subject, options.loss, outputs, examples, rng)
        y = labels[0] if len(labels) == 1 else labels
    loss_fn = training_loss(options.loss, options.from_logits)
    plain_batch = 32  # Keras' default batch size: what model.fit(x, y) uses
    gpu = bool(tf.config.list_physical_devices("GPU"))
    mixed = "mixed_float16" if gpu else "mixed_bfloat16"
    configs = [("plain fit (batch 32)", None, {}, plain_batch, "", ""),
               ("steps_per_execution=16", None, {"steps_per_execution": 16}, plain_batch,
                "model.compile(..., steps_per_execution=16)",
                "callbacks and the progress bar see every 16th step"),
               ("jit_compile=True", None, {"jit_compile": True}, plain_batch,
                "model.compile(..., jit_compile=True)", "an XLA compile before the first epoch (first call below)"),
               (mixed, mixed, {}, plain_batch, f"keras.mixed_precision.set_global_policy({mixed!r})  # before building",
                "lower-precision activations: check accuracy; keep the last layer float32")]
    configs += [(f"batch {b}", None, {}, b, f"model.fit(x, y, batch_size={b})",
                 "fewer optimizer steps per epoch: retune the learning rate; more activation memory")
                for b in sorted(set(options.batch_sizes)) if b > plain_batch and b <= examples]
    trainers, skipped = [], {}
    for row, policy, compile_options, batch, code, cost in configs:
        try:
            model = subject.fresh(policy)
            model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss_fn, **compile_options)
            epoch, losses = fit_epochs(model, x, y, batch_size=batch, shuffle=False)
            timer = Timer(epoch, name=row, items_per_call=examples)
            timer.start(warmup=0)
        except DoctorError:
            raise
        except Exception as exc:
            if row.startswith("plain"):
                raise DoctorError(f"the model does not train with --loss {options.loss} on doctor's synthetic "
                                  f"targets ({type(exc).__name__}: {_first_line(exc)}): pass targets as 'y' in "
                                  f"--sample FILE.npz") from None
            skipped[f"training: {row}"] = f"{type(exc).__name__}: {_first_line(exc)}"
            continue
        trainers.append((row, timer, losses, code, cost))
    final_losses: dict[str, float] = {}

    def read_losses(_):
        for row, _, losses, _, _ in trainers:
            final_losses[row] = losses[-1]

    ms, comparisons = race([t for _, t, _, _, _ in trainers], rounds=options.rounds, samples=options.rounds,
                           threshold=MIN_GAIN, warmup=0, seed=options.seed, on_first_rounds=read_losses)
    plain_loss = final_losses[trainers[0][0]]
    findings = []
    for i, (m, (row, _, _, code, cost)) in enumerate(zip(ms, trainers)):
        loss = final_losses[row]
        same_steps = not row.startswith("batch ")  # a larger batch takes fewer steps: its loss is not comparable
        agrees = math.isfinite(loss) and (not same_steps or abs(loss - plain_loss) <= LOSS_TOLERANCE * max(
            abs(plain_loss), 1e-6))
        rec.add("training", row, {"samples_per_s": m.items_per_s, "first_epoch_s": m.first_call_s,
                                  "final_loss": loss, "loss_agrees": agrees},
                primary="samples_per_s", lower_is_better=False, measurement=m,
                comparison=None if i == 0 else comparisons[i - 1])
        if i:
            note = "" if agrees else (f"final loss {loss:.4g} against {plain_loss:.4g}: not finite" if not
                                      math.isfinite(loss) else f"final loss {loss:.4g} against plain fit's {plain_loss:.4g}")
            findings.append(Finding("training", row, trainers[0][0], comparisons[i - 1], code, cost, agrees, note))
    return findings, skipped


# The whole run ------------------------------------------------------------------------------------------


def plan(subject: Subject, options: Options) -> list[str]:
    """The steps a run takes, in order (for a progress bar)."""
    batches = [b for b in options.batch_sizes if subject.fixed_batch in (None, b)] or [subject.fixed_batch]
    steps = ["the model", *[f"inference at batch {b}" for b in batches], "retracing"]
    if options.threads:
        steps += [f"threads at batch {b}" for b in thread_batches(subject, options)]
    if options.train:
        steps.append("training")
    return steps


def diagnose(subject: Subject, options: Options, workdir: Path, *,
             progress: Callable[[str], None] = lambda step: None) -> Diagnosis:
    """Every experiment in turn, each skipped (and said so) once the budget is spent."""
    from tfperf.results import Recorder

    started = time.perf_counter()
    args = {"model": subject.source, "batch_sizes": list(options.batch_sizes), "rounds": options.rounds,
            "train": options.train, "loss": options.loss, "seed": options.seed}
    rec = Recorder(RECIPE, args)
    progress("the model")
    facts = model_facts(subject, quick=options.quick, sample=options.sample)
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    sections: list[tuple[str, Callable[[], tuple[list[Finding], dict]]]] = [
        ("inference", lambda: inference(subject, rec, options, workdir, progress)),
        ("retracing", lambda: (progress("retracing"), retracing(subject, rec, options))[1])]
    if options.threads:
        sections.append(("threads", lambda: threads(subject, rec, options, progress)))
    if options.train:
        sections.append(("training", lambda: training(subject, rec, options, progress)))
    for name, run in sections:
        spent = time.perf_counter() - started
        if options.budget_s is not None and spent > options.budget_s:
            skipped[name] = f"not run: the --budget of {options.budget_s:.0f} s was spent ({spent:.0f} s)"
            continue
        found, left_out = run()
        findings += found
        skipped.update(left_out)
    return Diagnosis(subject, rec, findings, skipped, facts, time.perf_counter() - started)


def summary(d: Diagnosis, *, goal_s: float | None = None) -> str:
    """The diagnosis in Markdown: the model, the advice ranked by gain, what showed no gain, what was left out."""
    f = d.facts
    lines = [f"Model `{d.subject.source}` ({f['kind']}): "
             + (f"{f['parameters']:,} parameters, " if f.get("parameters") else "")
             + (f"{f['weight_bytes'] / 1e6:.2f} MB of weights; " if f.get("weight_bytes") else "")
             + f"inputs {'; '.join(f['inputs'])}; outputs {'; '.join(f['outputs'])}.",
             ""]
    if f.get("flops_per_example"):
        lines += [f"Forward pass: {f['flops_per_example'] / 1e6:.3g} MFLOP per example (Dense and Conv2D layers); "
                  f"at the {f['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s matmul rate measured now, the compute limit "
                  f"is {f['compute_limit_examples_per_s']:,.0f} examples/s.", ""]
    else:
        lines += [f"FLOPs per example not computed (tfperf counts Keras Dense and Conv2D layers; this model computes "
                  f"in others too); matmul rate "
                  f"measured now: {f['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s.", ""]
    advice = d.advice
    if advice:
        lines += ["Advice, largest measured gain first (each a 95% interval from interleaved rounds that clears "
                  f"{MIN_GAIN:.0%}):", ""]
        for k, (a, also) in enumerate(advice, start=1):
            lines += [f"{k}. **{a.row}** instead of {a.baseline} ({a.section}): {a.comparison.describe()}. "
                      f"Apply: `{a.code}`. Costs: {a.cost}." + (f" {a.note}." if a.note else "")
                      + ("" if not also else " Also faster than " + a.baseline + ": " + "; ".join(
                          f"{o.row} {o.comparison.describe()}" for o in also) + ".")]
    else:
        lines += ["No change measured here is significantly faster than what the model does now."]
    lines += ["", "Measured without a gain that counts (not advised):", ""]
    for n in d.no_gain:
        why = n.comparison.describe() + ("" if n.agrees else f"; and {n.note}")
        lines.append(f"- {n.row} against {n.baseline} ({n.section}): {why}")
    if d.skipped:
        lines += ["", "Not measured:", ""] + [f"- {k}: {v}" for k, v in d.skipped.items()]
    took = f"Doctor took {d.elapsed_s:.0f} s"
    if goal_s is not None:
        took += f" (goal for --quick: under {goal_s:.0f} s: {'met' if d.elapsed_s <= goal_s else 'NOT met'})"
    lines += ["", took + "."]
    return "\n".join(lines)


def write_report(d: Diagnosis, out: Path, *, goal_s: float | None = None) -> Path:
    """out/doctor.jsonl (the cookbook's record format), out/report.md with tables and figures."""
    from tfperf.report import build_report, write_conclusion

    d.recorder.save(out)
    write_conclusion(out, RECIPE, summary(d, goal_s=goal_s))
    return build_report(out, order=[RECIPE], title=f"tfperf doctor: {d.subject.name}")
