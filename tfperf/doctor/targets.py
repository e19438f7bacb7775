"""What the doctor trains with where the user gave only a loss's name: the Keras loss, targets it accepts for the
model's outputs (or the sample's 'y'), Keras' default batch size; and how the user puts their model under a mixed
policy."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tfperf.deploy.inputs import make_inputs
from tfperf.deploy.loader import Subject
from tfperf.doctor.options import LOSS_TOLERANCE, DoctorError, Options
from tfperf.records.units import number

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


def mixed_code(policy: str, builds_under_policy: bool) -> str:
    """How the user puts their model under a mixed policy: before building it where their code builds it; a model
    loaded from a file keeps the dtypes it saved, so set_global_policy alone changes none of its layers."""
    if builds_under_policy:
        return f"keras.mixed_precision.set_global_policy({policy!r})  # before building the model"
    return (f"model = tfperf.precision.under_policy(model, {policy!r})  # after loading it: a loaded model keeps "
            f"its saved dtypes, and set_global_policy alone changes none of its layers")


def loss_check(row: str, loss: float, plain_loss: float, against: str = "plain fit") -> tuple[bool, str]:
    """Whether a row's final loss agrees with plain fit's after the same examples (within LOSS_TOLERANCE), and the
    note that says why not. A larger batch is held to the same bar: it takes fewer, larger steps over those
    examples, which changes the optimisation, not only its speed."""
    if not math.isfinite(loss):
        return False, f"final loss {number(loss, 4)} against {number(plain_loss, 4)}: not finite"
    if abs(loss - plain_loss) <= LOSS_TOLERANCE * max(abs(plain_loss), 1e-6):
        return True, ""
    note = f"final loss {number(loss, 4)} against {against}'s {number(plain_loss, 4)}"
    if row.startswith("batch "):
        note += (" after the same examples: fewer, larger steps change the optimisation; scale the learning rate "
                 "with the batch (linear, or square root) and measure again")
    return False, note


def random_in_training(model: Any) -> list[str]:
    """The kinds of layer that draw at random in training, each with its count ("Dropout x8"): a layer that holds a
    `keras.random.SeedGenerator` (Dropout at a rate above 0, GaussianNoise, a VAE's sampling layer); empty where
    training is deterministic, or there is no Keras model. Two runs of such a model from the same weights end at
    different losses: on KerasHub's BERT from config the climb's runs ended at 0.095-0.28 after the same examples."""
    import collections

    if model is None or not hasattr(model, "_flatten_layers"):
        return []
    import keras

    # Keras' own walk over every nested layer (what its saving walks).
    drawing = collections.Counter(type(layer).__name__ for layer in model._flatten_layers(include_self=False)
                                  if any(isinstance(v, keras.random.SeedGenerator) for v in vars(layer).values()))
    return [f"{name} x{count}" if count > 1 else name for name, count in sorted(drawing.items())]


def synthetic_rows(subject: Subject, options: Options, examples: int) -> tuple:
    """`examples` rows of inputs, packed as the model takes them, and their targets (`synthetic_targets`)."""
    x = subject.pack(make_inputs(subject, examples, seed=options.seed, sample=options.sample))
    return x, synthetic_targets(subject, options, examples)
