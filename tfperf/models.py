"""The cookbook's models, built uncompiled (so callers can build them in a strategy scope), and their FLOPs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import keras
import numpy as np

from tfperf.catalog import MODEL_NAMES

Shape = tuple[int, ...]


def _head(x, num_classes: int, k):
    # float32 logits under any mixed policy: softmax/loss in half precision loses accuracy.
    return k.layers.Dense(num_classes, dtype="float32", name="logits")(x)


def _mlp(input_shape: Shape, num_classes: int, k, width: int = 1) -> keras.Model:
    """The seed's hybridize MLP: 512 -> 256 -> 128 -> 2, ReLU (hidden layers `width` times wider)."""
    inputs = k.Input(input_shape)
    x = k.layers.Flatten()(inputs) if len(input_shape) > 1 else inputs
    x = k.layers.Dense(256 * width, activation="relu")(x)
    x = k.layers.Dense(128 * width, activation="relu")(x)
    return k.Model(inputs, _head(x, num_classes, k), name="mlp")


def _cnn(input_shape: Shape, num_classes: int, k, width: int = 1) -> keras.Model:
    """The mixed-precision seed's MNIST network: Conv 32 3x3, MaxPool 2, Dense 64, Dense 10 (`width` times wider)."""
    inputs = k.Input(input_shape)
    x = k.layers.Conv2D(32 * width, 3, activation="relu")(inputs)
    x = k.layers.MaxPooling2D(2)(x)
    x = k.layers.Flatten()(x)
    x = k.layers.Dense(64 * width, activation="relu")(x)
    return k.Model(inputs, _head(x, num_classes, k), name="cnn")


def _lenet(input_shape: Shape, num_classes: int, k, width: int = 1) -> keras.Model:
    """d2l's LeNet-5 (6-16-120-84, times `width`), with ReLU instead of sigmoid so that it trains in a few steps."""
    inputs = k.Input(input_shape)
    x = k.layers.Conv2D(6 * width, 5, padding="same", activation="relu")(inputs)
    x = k.layers.AveragePooling2D(2)(x)
    x = k.layers.Conv2D(16 * width, 5, activation="relu")(x)
    x = k.layers.AveragePooling2D(2)(x)
    x = k.layers.Flatten()(x)
    x = k.layers.Dense(120 * width, activation="relu")(x)
    x = k.layers.Dense(84 * width, activation="relu")(x)
    return k.Model(inputs, _head(x, num_classes, k), name="lenet")


def _residual(x, channels: int, strides: int, k):
    shortcut = x
    y = k.layers.Conv2D(channels, 3, strides=strides, padding="same")(x)
    y = k.layers.BatchNormalization()(y)
    y = k.layers.ReLU()(y)
    y = k.layers.Conv2D(channels, 3, padding="same")(y)
    y = k.layers.BatchNormalization()(y)
    if strides != 1 or shortcut.shape[-1] != channels:
        shortcut = k.layers.Conv2D(channels, 1, strides=strides)(shortcut)
    return k.layers.ReLU()(k.layers.Add()([y, shortcut]))


def _resnet18(input_shape: Shape, num_classes: int, k, width: int = 1) -> keras.Model:
    """d2l's ResNet-18 for 28x28 inputs: 3x3 stem, no max-pool, stages 64-128-256-512 (times `width`) of 2 blocks."""
    inputs = k.Input(input_shape)
    x = k.layers.Conv2D(64 * width, 3, padding="same")(inputs)
    x = k.layers.BatchNormalization()(x)
    x = k.layers.ReLU()(x)
    for stage, channels in enumerate((64, 128, 256, 512)):
        for block in range(2):
            x = _residual(x, channels * width, 2 if stage > 0 and block == 0 else 1, k)
    x = k.layers.GlobalAveragePooling2D()(x)
    return k.Model(inputs, _head(x, num_classes, k), name="resnet18")


_BUILDERS: dict[str, tuple[Callable[..., keras.Model], Shape, int]] = {
    "mlp": (_mlp, (512,), 2),
    "cnn": (_cnn, (28, 28, 1), 10),
    "lenet": (_lenet, (28, 28, 1), 10),
    "resnet18": (_resnet18, (28, 28, 1), 10),
}
assert tuple(_BUILDERS) == MODEL_NAMES, "tfperf.catalog.MODEL_NAMES must list the builders"


def default_input_shape(name: str) -> Shape:
    """The input shape (no batch axis) that `get_net(name)` uses by default."""
    return _builder(name)[1]


def _builder(name: str):
    try:
        return _BUILDERS[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}"
        ) from None


def get_net(
    name: str, *, input_shape: Sequence[int] | None = None, num_classes: int | None = None,
    keras_module: ModuleType | None = None, width: int = 1,
) -> keras.Model:
    """Build the named model, uncompiled, with float32 logits whatever the dtype policy.

    Args:
      keras_module: the Keras to build it with: `keras` (Keras 3, the default) or `tf_keras` (Keras 2),
        whose layer and model APIs these builders share.
      width: every hidden layer's units or channels times this (1: the model as its docstring gives it).
    """
    build, default_shape, default_classes = _builder(name)
    shape = tuple(int(d) for d in (input_shape if input_shape is not None else default_shape))
    classes = int(num_classes if num_classes is not None else default_classes)
    if not shape or any(d < 1 for d in shape):
        raise ValueError(f"input_shape must be positive sizes without the batch axis, got {shape}")
    if classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {classes}")
    if width < 1:
        raise ValueError(f"width must be a positive multiplier of the layers' sizes, got {width}")
    if name != "mlp" and len(shape) != 3:
        raise ValueError(f"model {name!r} takes images (height, width, channels), got input_shape {shape}")
    return build(shape, classes, keras_module or keras, width)


def einsum_flops(equation: str, shapes: list[tuple[int, ...]]) -> int:
    """The multiply-adds of a two-operand einsum, counted 2 each (TensorFlow's profiler has no count for Einsum,
    which Keras' attention and EinsumDense layers emit): 2 x the product of every index's size. An ellipsis
    stands for the leading axes it covers; a one-operand einsum (a transpose, a sum) moves data: 0."""
    inputs = equation.replace(" ", "").split("->")[0].split(",")
    if len(inputs) != 2 or len(shapes) != 2:
        return 0
    sizes: dict[str, int] = {}
    for term, shape in zip(inputs, shapes):
        if "..." in term:
            head, tail = term.split("...")
            covered = len(shape) - len(head) - len(tail)
            term = head + "".join(chr(0x100 + i) for i in range(covered)) + tail  # ellipsis axes, one letter each
        for letter, size in zip(term, shape):
            sizes[letter] = max(sizes.get(letter, 1), int(size))
    return 2 * int(np.prod(list(sizes.values()), dtype=np.int64))


def function_flops(concrete_function) -> int | None:
    """Float operations of one call of a concrete function whose shapes are all known, as TensorFlow's graph
    profiler counts them (the way the keras-flops package does): a multiply-add counts 2 in matmuls and
    convolutions (depthwise included), and the element-wise ops TensorFlow has a cost for (bias adds,
    additions, normalisation arithmetic) count theirs; Einsum, which it does not count, counted here (the
    projections and the QK^T and attention-weighted V of Keras' attention); None when the graph cannot be
    frozen and counted."""
    import logging

    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2_as_graph

    log = tf.get_logger()
    level = log.level
    log.setLevel(logging.ERROR)  # the v1 profiler announces its own deprecation on every call
    try:
        _, graph_def = convert_variables_to_constants_v2_as_graph(concrete_function)
        with tf.Graph().as_default() as graph:
            tf.graph_util.import_graph_def(graph_def, name="")
            options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
            options["output"] = "none"
            found = tf.compat.v1.profiler.profile(graph=graph, run_meta=tf.compat.v1.RunMetadata(), cmd="op",
                                                  options=options)
            einsums = sum(einsum_flops(op.get_attr("equation").decode(), [tuple(i.shape.as_list()) for i in op.inputs])
                          for op in graph.get_operations() if op.type == "Einsum")
    except Exception:  # a graph the freezer or the profiler cannot take: say "not computed", not fail
        return None
    finally:
        log.setLevel(level)
    return int(found.total_float_ops) + int(einsums) or None


def flops(model: keras.Model) -> int:
    """Forward FLOPs per example of a Keras model with one input, counted by TensorFlow (`function_flops`).

    Matmuls and convolutions dominate the count; this is the work the matmul FLOP/s roof applies to.
    Training costs about three times this (forward, and two matmuls per layer backward).
    """
    import tensorflow as tf

    spec = tf.TensorSpec((1, *model.input_shape[1:]), model.inputs[0].dtype)
    counted = function_flops(tf.function(lambda x: model(x, training=False)).get_concrete_function(spec))
    if counted is None:
        raise ValueError(f"TensorFlow cannot count the FLOPs of {model.name}")
    return counted


def layer_flops(layer: keras.layers.Layer) -> int | None:
    """Forward FLOPs of one call of a built layer of a functional or Sequential model at batch 1 (`function_flops`;
    0 for a layer TensorFlow counts nothing in); None when its inputs' shapes are not known (a shared layer, a
    subclassed model's)."""
    import tensorflow as tf

    try:
        inputs = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
        specs = [tf.TensorSpec((1, *x.shape[1:]), x.dtype) for x in inputs]
    except (AttributeError, ValueError):
        return None
    if any(d is None for spec in specs for d in spec.shape):
        return None
    call = tf.function(lambda *xs: layer(xs[0] if len(xs) == 1 else list(xs), training=False))
    try:
        return function_flops(call.get_concrete_function(*specs)) or 0
    except Exception:  # noqa: BLE001  (a layer that cannot be traced alone: the readiness is not known)
        return None


def gradient_readiness(model: keras.Model) -> list[tuple[float, int]] | None:
    """For each layer with trainable weights, in the order backpropagation reaches them (last layer first): the
    share of the backward pass done when its gradients exist, and their float32 bytes. Backward time is taken
    as proportional to each layer's forward FLOPs. None when a layer's FLOPs cannot be counted."""
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    counted = [layer_flops(layer) for layer in layers]
    total = sum(f for f in counted if f)
    if not layers or any(f is None for f in counted) or not total:
        return None
    found, done = [], 0
    for layer, f in zip(reversed(layers), reversed(counted)):
        done += f
        size = 4 * sum(int(np.prod(w.shape)) for w in layer.trainable_weights)
        if size:
            found.append((done / total, size))
    return found


def activation_bytes(model: keras.Model, batch: int) -> int:
    """Bytes of every layer's output for one batch, in the dtype each layer computes in (what backprop keeps)."""
    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        total += batch * int(np.prod(layer.output.shape[1:])) * np.dtype(layer.compute_dtype).itemsize
    return total
