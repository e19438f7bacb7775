"""One model loader for every command: a cookbook net name, a Keras file, a SavedModel folder, or `module:factory`.

`load_subject` returns a `Subject`: the model, what it takes (each input's name, dtype and shape,
in lists or dicts), how to call it, and what is known of it (parameters, weights, FLOPs, the
vocabulary integer inputs must stay under). A SavedModel is inspected before it is loaded
(`tfperf.deploy.inspection`) and refused when it reaches ops off the allowlist, unless trusted.
Anything unusable is a `ModelError` whose one line says what to do instead.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.formats import ModelError, first_line

KERAS_SUFFIXES = (".keras", ".h5")


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
            raise ModelError(f"--input-shape {text!r}: give NAME=D,D,... (sizes without the batch axis, each at "
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
            raise ModelError(f"--input-shape for {name!r} is {list(override)}, but the model declares "
                              f"[{model_shape}] (without the batch axis): give sizes only where it has '?'")
        shape = override
    if any(d is None for d in shape):
        model_shape = ", ".join("?" if d is None else str(d) for d in shape)
        raise ModelError(f"input {name!r} has sizes the model leaves unknown: [{model_shape}] after the batch "
                          f"axis; give them with --input-shape {name}=" + ",".join(
                              "N" if d is None else str(d) for d in shape))
    return InputSpec(name, dtype, tuple(int(d) for d in shape))


def load_subject(source: str, *, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 trust: bool = False) -> Subject:
    """The model at `source`: a Keras file, a SavedModel folder, or `module:factory`; ModelError if unusable.

    A SavedModel is inspected before it is loaded (tfperf.inspection) and refused when it reaches ops
    off the allowlist, unless `trust`.
    """
    given = dict(input_shapes or {})
    path = Path(source)
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise ModelError(f"{source} is a folder without saved_model.pb: give a SavedModel folder, a .keras "
                              f"file, or module:factory")
        return _saved_model_subject(path, given, trust)
    if path.suffix in KERAS_SUFFIXES or path.is_file():
        if not path.is_file():
            raise ModelError(f"no such file: {source}")
        if path.suffix not in KERAS_SUFFIXES:
            raise ModelError(f"{source} is not a model: give a .keras file, a SavedModel folder, or "
                              f"module:factory (a Python function that returns a Keras model)")
        model = _load_keras_file(path)
        return _keras_subject(model, source, given, factory=lambda: _load_keras_file(path))
    if ":" in source and not path.exists():
        model, factory = _load_factory(source)
        return _keras_subject(model, source, given, factory=factory, builds_under_policy=True)
    raise ModelError(f"no such model: {source}: give a .keras file, a SavedModel folder, or module:factory")


def _load_keras_file(path: Path):
    import keras

    if path.suffix == ".keras" and not zipfile.is_zipfile(path):
        raise ModelError(f"{path} is not a Keras file (a .keras file is a zip archive): it is corrupt or "
                          f"something else renamed")
    try:
        return keras.saving.load_model(str(path), compile=False)
    except (TypeError, ValueError) as exc:
        text = str(exc)
        if "deserializ" in text or "Could not locate" in text or "Unknown layer" in text:
            raise ModelError(f"{path} needs classes this process does not have (custom layers or models): give "
                              f"module:factory instead, a Python function that builds the model (and loads its "
                              f"weights)") from None
        raise ModelError(f"{path} cannot be loaded: {first_line(exc)}") from None
    except Exception as exc:  # a damaged archive or weights file
        raise ModelError(f"{path} cannot be loaded ({type(exc).__name__}: {first_line(exc)})") from None


def _load_factory(source: str):
    import keras

    module_name, _, attr = source.partition(":")
    if not module_name or not attr:
        raise ModelError(f"{source!r}: give module:factory, e.g. mypackage.models:build")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a module beside the user, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"cannot import {module_name!r} for {source}: {first_line(exc)} (run from the folder "
                          f"that holds it, or install it)") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelError(f"{module_name} has no function {attr!r} (for {source})")

    def build():
        try:
            model = factory()
        except Exception as exc:
            raise ModelError(f"{source}() failed: {type(exc).__name__}: {first_line(exc)}") from None
        if not isinstance(model, keras.Model):
            raise ModelError(f"{source}() returned a {type(model).__name__}, not a Keras model")
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
            raise ModelError(f"{source} does not say what it takes (a subclassed model not yet called): give "
                              f"--input-shape D,D,... for its one float32 input")
        shape = next(iter(given.values()))
        try:
            model(np.zeros((1, *shape), np.float32))
        except Exception as exc:
            raise ModelError(f"{source} fails on a float32 input of shape [1, {', '.join(map(str, shape))}]: "
                              f"{first_line(exc)}") from None
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
        raise ModelError(f"--input-shape names {', '.join(sorted(unknown))}, but the model's inputs are "
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

    from tfperf.deploy import inspection
    from tfperf.deploy.formats import ModelError

    try:
        report = inspection.inspect_model(path) if trust else inspection.check_safe(path)
    except ModelError as exc:
        raise ModelError(str(exc)) from None
    except Exception as exc:  # an unreadable saved_model.pb
        raise ModelError(f"{path} is not a readable SavedModel ({type(exc).__name__}: {first_line(exc)})") from None
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        raise ModelError(f"{path} is not a loadable SavedModel ({type(exc).__name__}: {first_line(exc)})") from None
    signatures = dict(loaded.signatures)
    if not signatures:
        raise ModelError(f"{path} has no signature to call: save it with signatures= (or a tf.function with an "
                          f"input_signature), or give the Keras model")
    key = "serving_default" if "serving_default" in signatures else sorted(signatures)[0]
    signature = signatures[key]
    specs = signature.structured_input_signature[1]
    if not specs or signature.structured_input_signature[0]:
        raise ModelError(f"{path}: signature {key!r} takes no named inputs")
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


