"""What the doctor trains with where the user gave only a loss's name: the Keras loss, targets it accepts for the
model's outputs (or the sample's 'y'), and Keras' default batch size."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tfperf.deploy.inputs import make_inputs
from tfperf.deploy.loader import Subject
from tfperf.doctor.options import DoctorError, Options

PLAIN_BATCH = 32  # Keras' default batch size: what model.fit(x, y) uses


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


def synthetic_targets(subject: Subject, options: Options, examples: int):
    """Targets for `examples` synthetic rows: the sample's 'y' repeated, or labels the loss accepts."""
    if options.sample is not None and "y" in options.sample:
        y_sample = options.sample["y"]
        return y_sample[np.resize(np.arange(len(y_sample)), examples)]
    import tensorflow as tf

    # The Keras model's own outputs (not the subject's, which may add named heads such as probabilities).
    outputs = subject.model(subject.pack(make_inputs(subject, 2, seed=options.seed, sample=options.sample)),
                            training=False)
    labels = training_labels(subject, options.loss, [np.asarray(o) for o in tf.nest.flatten(outputs)], examples,
                             np.random.default_rng(options.seed + 1))
    return labels[0] if len(labels) == 1 else tf.nest.pack_sequence_as(outputs, labels)
