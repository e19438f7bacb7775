"""One model loader for every command: a cookbook net, a Keras file, a SavedModel folder, or `module:factory`.

`load_subject` returns a `Subject`: the model, what it takes (each input's name, dtype and shape, in
lists or dicts), how to call it, its outputs by name, and what is known of it (parameters, weights,
the vocabulary integer inputs must stay under, whether it is a classifier). `Subject.servable()` is
what every export format writes. A SavedModel is inspected before it is loaded
(`tfperf.deploy.inspection`) and a Keras file read before Keras runs it (`keras_files`); what would
run code is refused unless trusted. Anything unusable is a `ModelError` whose one line says what to do.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.catalog import MODEL_NAMES
from tfperf.deploy.formats import Servable, read_metadata
from tfperf.deploy.errors import ModelError, first_line
from tfperf.deploy.keras_files import KERAS_SUFFIXES, load_keras_file

COOKBOOK_INPUT = "inputs"  # the cookbook nets' exports take `inputs` and answer `logits` and `probabilities`
# The size synthetic inputs take on an axis the model leaves free (a sequence's length), unless --input-shape
# gives one; exports keep such an axis free whatever size it was checked at.
FREE_SIZE = 32


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input: its name, dtype (NumPy's name), the sizes inputs are made and timed at (without the
    batch axis), and the shape the model declares (None on an axis it leaves free; default: `shape`)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    declared: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.declared is None:
            object.__setattr__(self, "declared", tuple(self.shape))

    @property
    def free(self) -> bool:
        """True when the model leaves a size of this input free (any length)."""
        return None in self.declared

    def at(self, size: int) -> InputSpec:
        """The same input made at `size` on every axis the model leaves free."""
        return dataclasses.replace(self, shape=tuple(size if d is None else s for s, d in zip(self.shape, self.declared)))

    def __str__(self) -> str:
        dims = ", ".join(str(s) if d is not None else f"{s} (free)" for s, d in zip(self.shape, self.declared))
        return f"{self.name}: {self.dtype}[batch, {dims}]".replace(", ]", "]")


def name_outputs(outputs: Any) -> dict[str, Any]:
    """A model's outputs by name: a dict's own keys, else `output_0`, `output_1`, ... in order (Keras'
    own `model.export()` names them so)."""
    import tensorflow as tf

    if isinstance(outputs, Mapping):
        return dict(outputs)
    return {f"output_{k}": t for k, t in enumerate(tf.nest.flatten(outputs))}


def classifier_head(logits: Any) -> dict[str, Any]:
    """The cookbook nets' outputs: their logits and the class probabilities."""
    import tensorflow as tf

    return {"logits": logits, "probabilities": tf.nn.softmax(logits)}


@dataclasses.dataclass
class Subject:
    """A loaded model and what is known about it.

    Args:
        structure: the model's input structure with each input replaced by its name (a name, a list
            or a dict), so that flat arrays by name can be packed the way the model takes them.
        call: the model on packed inputs (TensorFlow tensors), training off; returns its outputs.
        head: names the outputs `call` returns (a dict by name).
        fresh: a new copy of the Keras model with the same weights, built under a dtype policy name
            (None: the model's own); None when there is no Keras model to copy.
        classifier: the output that holds class scores, when the model says it is a classifier.
    """

    name: str
    source: str
    kind: str  # "keras" or "savedmodel"
    inputs: tuple[InputSpec, ...]
    structure: Any
    call: Callable[[Any], Any]
    head: Callable[[Any], dict[str, Any]] = name_outputs
    model: Any = None
    trackable: Any = None  # what holds the variables (the Keras model or the loaded SavedModel)
    fresh: Callable[[str | None], Any] | None = None
    vocabulary: int | None = None  # the smallest Embedding input_dim: integer inputs stay below it
    vocabularies: tuple[int, ...] = ()  # every Embedding's input_dim (a token vocabulary beside segment ones)
    mask_zero: bool = False  # an Embedding masks token 0: synthetic rows end in padding
    fixed_batch: int | None = None  # a SavedModel signature that takes only this batch size
    parameters: int | None = None
    weight_bytes: int | None = None
    classifier: str | None = None
    signature: str | None = None  # the SavedModel signature `call` runs
    builds_under_policy: bool = False  # its factory builds layers anew: a global dtype policy set first takes effect

    def pack(self, flat: Mapping[str, Any]) -> Any:
        """Arrays or tensors by input name, in the structure the model takes."""
        return _map_structure(lambda name: flat[name], self.structure)

    def named(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        """The model's outputs by name, on inputs by name."""
        return self.head(self.call(self.pack(flat)))

    def input_signature(self, batch: int | None = None) -> list:
        """One tf.TensorSpec per input, named after it, with `batch` rows (None: any; a fixed signature's own)
        and the model's own shape: an axis it leaves free stays free in every export."""
        import tensorflow as tf

        rows = self.fixed_batch if self.fixed_batch is not None else batch
        return [tf.TensorSpec((rows, *i.declared), tf.as_dtype(i.dtype), name=i.name) for i in self.inputs]

    def at(self, size: int) -> Subject:
        """The same model with inputs made at `size` on every axis it leaves free (another sequence length)."""
        return dataclasses.replace(self, inputs=tuple(i.at(size) for i in self.inputs))

    def fixed(self) -> Subject:
        """The same model with every free size fixed at the size its inputs are made at (for a converter that
        cannot leave them free)."""
        return dataclasses.replace(self, inputs=tuple(dataclasses.replace(i, declared=i.shape) for i in self.inputs))

    @property
    def free(self) -> bool:
        """True when the model leaves a size of some input free."""
        return any(i.free for i in self.inputs)

    @property
    def free_axes(self) -> str | None:
        """What the free sizes are to a reader: an image's "height and width" (inputs of rank 3 with free
        axes), else a "sequence length"; None when every size is fixed."""
        ranks = {len(i.declared) for i in self.inputs if i.free}
        return None if not ranks else "height and width" if ranks == {3} else "sequence length"

    def function(self, batch: int | None = None):
        """The model as a tf.function of its inputs, flat and named, returning its outputs by name."""
        import tensorflow as tf

        names = [i.name for i in self.inputs]
        return tf.function(lambda *flat: self.named(dict(zip(names, flat))), input_signature=self.input_signature(batch))

    def servable(self) -> Servable:
        """What the export formats write: the function for any batch size, and what holds its variables."""
        return Servable(self.function(), keras_model=self.model, trackable=self.trackable)


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
    """An input as the model declares it, made at the sizes --input-shape gives where it leaves them free
    (else FREE_SIZE); the free axes stay free in what is exported."""
    declared = tuple(None if d is None else int(d) for d in shape)
    override = given.get(name, given.get("") if single else None)
    if override is not None:
        if len(override) != len(declared) or any(d is not None and d != o for d, o in zip(declared, override)):
            model_shape = ", ".join("?" if d is None else str(d) for d in declared)
            raise ModelError(f"--input-shape for {name!r} is {list(override)}, but the model declares "
                             f"[{model_shape}] (without the batch axis): give sizes only where it has '?'")
        return InputSpec(name, dtype, tuple(override), declared)
    return InputSpec(name, dtype, tuple(FREE_SIZE if d is None else d for d in declared), declared)


def names_cookbook_net(source: str) -> bool:
    """Whether `source` is a cookbook net's name: it is unless it names a model on disk. A folder of that name that
    holds no SavedModel (`tfperf doctor cnn --out cnn`, read again by the doctor's own processes) does not hide it."""
    path = Path(source)
    return source in MODEL_NAMES and not path.is_file() and not (path / "saved_model.pb").is_file()


def load_subject(source: str, *, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 trust: bool = False, signature: str | None = None, weights: str | None = None) -> Subject:
    """The model `source` names: a cookbook net (`cnn`, with `weights` from `tfperf train`), a .keras or .h5
    file, a SavedModel folder (its `signature`, default serving_default, serve, or the only one), or
    `module:factory`; ModelError if unusable. What could run code is refused unless `trust`."""
    given = dict(input_shapes or {})
    path = Path(source)
    if weights is not None and source not in MODEL_NAMES:
        raise ModelError(f"--weights is for the cookbook nets ({', '.join(MODEL_NAMES)}): a model file carries "
                         f"its own weights")
    if signature is not None and not path.is_dir():
        raise ModelError("--signature is for SavedModel folders: a Keras model has one call")
    if names_cookbook_net(source):
        return cookbook_subject(source, weights=weights, input_shape=given.pop("", None) or given.pop(
            COOKBOOK_INPUT, None))
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise ModelError(f"{source} is a folder without saved_model.pb: give a SavedModel folder, a .keras "
                             f"or .h5 file, a cookbook net ({', '.join(MODEL_NAMES)}), or module:factory")
        return _saved_model_subject(path, given, trust, signature)
    if path.suffix in KERAS_SUFFIXES or path.is_file():
        if not path.is_file():
            raise ModelError(f"no such file: {source}")
        if path.suffix not in KERAS_SUFFIXES:
            raise ModelError(f"{source} is not a model: give a .keras or .h5 file, a SavedModel folder, or "
                             f"module:factory (a Python function that returns a Keras model)")
        model = load_keras_file(path, trust=trust)
        return keras_subject(model, source, given, factory=lambda: load_keras_file(path, trust=trust))
    if ":" in source and not path.exists():
        model, factory = _load_factory(source)
        return keras_subject(model, source, given, factory=factory, builds_under_policy=True)
    raise ModelError(f"no such model: {source}: give a .keras or .h5 file, a SavedModel folder, a cookbook net "
                     f"({', '.join(MODEL_NAMES)}), or module:factory")


def cookbook_subject(name: str, *, weights: str | None = None, input_shape: tuple[int, ...] | None = None,
                     num_classes: int | None = None, model=None) -> Subject:
    """A cookbook net (fresh weights, `weights` from a `tfperf train` checkpoint, or the trained `model`):
    input `inputs`, outputs `logits` and `probabilities`."""
    from tfperf.models import get_net

    if model is None:
        try:
            model = get_net(name, input_shape=input_shape, num_classes=num_classes)
        except ValueError as exc:
            raise ModelError(str(exc)) from None
        if weights is not None:
            from tfperf.train import restore_weights

            try:
                restore_weights(model, weights)
            except FileNotFoundError as exc:
                raise ModelError(str(exc)) from None
    shape = tuple(int(d) for d in model.input_shape[1:])
    classes = int(model.output_shape[-1])
    # get_net builds under the dtype policy in force, with float32 logits: the factory for `fresh`.
    subject = keras_subject(model, name, {}, factory=lambda: get_net(name, input_shape=shape, num_classes=classes),
                            builds_under_policy=True)
    return dataclasses.replace(subject, inputs=(InputSpec(COOKBOOK_INPUT, "float32", shape),),
                               structure=COOKBOOK_INPUT, head=classifier_head, classifier="probabilities")


def import_callable(source: str, what: str = "factory"):
    """The function `module:function` names, imported from the working folder or installed packages."""
    module_name, _, attr = source.partition(":")
    if not module_name or not attr:
        raise ModelError(f"{source!r}: give module:{what}, e.g. mypackage.models:build")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a module beside the user, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"cannot import {module_name!r} for {source}: {first_line(exc)} (run from the folder "
                         f"that holds it, or install it)") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ModelError(f"{module_name} has no function {attr!r} (for {source})")
    return function


def _load_factory(source: str):
    import keras

    factory = import_callable(source)

    def build():
        try:
            model = factory()
        except Exception as exc:
            raise ModelError(f"{source}() failed: {type(exc).__name__}: {first_line(exc)}") from None
        if not isinstance(model, keras.Model):
            raise ModelError(f"{source}() returned a {type(model).__name__}, not a Keras model")
        return model

    return build(), build


def _keras_inputs(model, source: str, given: Mapping[str, tuple[int, ...]]) -> tuple[Any, tuple[InputSpec, ...]]:
    """The model's input structure (by name) and its inputs, sizes filled from --input-shape."""
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
        return "input", (InputSpec("input", "float32", shape),)
    leaves = keras.tree.flatten(structure)
    inputs = tuple(_resolve_shape(t.name, np.dtype(t.dtype).name if t.dtype != "string" else "string",
                                  t.shape[1:], given, len(leaves) == 1) for t in leaves)
    unknown = set(given) - {i.name for i in inputs} - ({""} if len(inputs) == 1 else set())
    if unknown:
        raise ModelError(f"--input-shape names {', '.join(sorted(unknown))}, but the model's inputs are "
                         f"{', '.join(i.name for i in inputs)}")
    return _map_structure(lambda t: t.name, structure), inputs


def keras_subject(model, source: str, given: Mapping[str, tuple[int, ...]] | None = None, *,
                  factory: Callable[[], Any] | None, builds_under_policy: bool = False) -> Subject:
    """A Keras model as a Subject.

    Args:
        factory: builds the model again with its weights (the user's function, or a reload of the file);
            None when it cannot be rebuilt (then there is no `fresh`).
        builds_under_policy: the factory builds layers anew, so a dtype policy set around it takes effect
            (a reloaded file keeps the dtypes it saved, so it is cloned layer by layer instead).
    """
    import keras

    structure, inputs = _keras_inputs(model, source, given or {})
    embeddings = [layer for layer in all_layers(model) if isinstance(layer, keras.layers.Embedding)]
    weights = model.get_weights()

    def fresh(policy: str | None = None):
        from tfperf.precision import dtype_policy, under_policy

        if policy is None:
            copy = factory()
        elif builds_under_policy:
            with dtype_policy(policy):
                copy = factory()
        else:  # a reloaded file keeps the dtypes it saved: every layer rebuilt under the policy
            copy = under_policy(model, policy)
        copy.set_weights(weights)
        return copy

    return Subject(
        name=_model_name(source, model.name), source=source, kind="keras", inputs=inputs, structure=structure,
        call=lambda packed: model(packed, training=False), model=model, trackable=model,
        fresh=fresh if factory is not None else None, builds_under_policy=builds_under_policy,
        vocabulary=min((layer.input_dim for layer in embeddings), default=None),
        vocabularies=tuple(sorted({int(layer.input_dim) for layer in embeddings})),
        mask_zero=any(layer.mask_zero for layer in embeddings), parameters=int(model.count_params()),
        weight_bytes=int(sum(w.nbytes for w in weights)),
        classifier="output_0" if _ends_in_softmax(model) else None)


def _ends_in_softmax(model) -> bool:
    """True when the model has one output and its last layer is a softmax: it answers class probabilities."""
    import keras

    if len(getattr(model, "outputs", None) or []) != 1 or not getattr(model, "layers", None):
        return False
    last = model.layers[-1]
    activation = getattr(last, "activation", None)
    return isinstance(last, keras.layers.Softmax) or activation is keras.activations.softmax or getattr(
        activation, "__name__", "") == "softmax"


def all_layers(model) -> list:
    """Every layer inside the model, nested ones included."""
    found, stack = [], list(getattr(model, "layers", []))
    while stack:
        layer = stack.pop()
        found.append(layer)
        stack.extend(getattr(layer, "layers", []) or [])
        stack.extend(getattr(layer, "_layers", []) or [])
    return found


def _saved_model_subject(path: Path, given: Mapping[str, tuple[int, ...]], trust: bool,
                         signature: str | None) -> Subject:
    import tensorflow as tf

    from tfperf.deploy import inspection
    from tfperf.deploy.formats import choose_signature

    try:
        report = inspection.check_safe(path, trust=trust)
    except ModelError:
        raise
    except Exception as exc:  # an unreadable saved_model.pb
        raise ModelError(f"{path} is not a readable SavedModel ({type(exc).__name__}: {first_line(exc)})") from None
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        raise ModelError(f"{path} is not a loadable SavedModel ({type(exc).__name__}: {first_line(exc)})") from None
    if not loaded.signatures:
        raise ModelError(f"{path} has no signature to call: save it with signatures= (or a tf.function with an "
                         f"input_signature), or give the Keras model")
    key = choose_signature(list(loaded.signatures), signature, str(path))
    function = loaded.signatures[key]
    specs = function.structured_input_signature[1]
    if not specs or function.structured_input_signature[0]:
        raise ModelError(f"{path}: signature {key!r} takes no named inputs")
    batches = {spec.shape[0] for spec in specs.values() if spec.shape.rank}
    fixed = next(iter(batches)) if len(batches) == 1 and None not in batches else None
    single = len(specs) == 1
    inputs = tuple(_resolve_shape(name, "string" if spec.dtype == tf.string else spec.dtype.as_numpy_dtype.__name__,
                                  spec.shape.as_list()[1:], given, single) for name, spec in sorted(specs.items()))
    classifier = read_metadata(path).get("classifier")  # an export of tfperf's says which output holds class scores
    return Subject(
        name=_model_name(str(path), None), source=str(path), kind="savedmodel", inputs=inputs,
        structure={i.name: i.name for i in inputs}, call=lambda packed: function(**packed), trackable=loaded,
        fixed_batch=fixed, parameters=report.variable_bytes // 4 if report.variable_bytes else None,
        weight_bytes=report.variable_bytes, classifier=classifier, signature=key)


def _model_name(source: str, declared: str | None) -> str:
    """A folder-safe name for the model: its file or folder name, or the factory's."""
    path = Path(source)
    if path.exists():
        name = path.stem if path.is_file() else (path.name if not (path.name.isascii() and path.name.isdigit())
                                                 else path.parent.name)
    else:
        name = source.rpartition(":")[2]
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in (name or declared or "model"))
