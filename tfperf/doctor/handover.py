"""The user's model and its data handed to a training process of its own (Keras stacks, devices): the parent writes
the weights and the rows with their targets, the child builds the model again under its own Keras and takes them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.loader import Subject, names_cookbook_net
from tfperf.doctor.options import Options


def build(source: str, k, work: Path | None = None) -> Any:
    """The user's model under the Keras `k`: its file through that Keras' loader, a cookbook net built by that
    Keras at the size of the rows handed over in `work`, or its module:factory with `import keras` resolving to `k`
    (so that Keras 2 builds it as Keras 2 would)."""
    path = Path(source)
    if names_cookbook_net(source):
        from tfperf.models import get_net

        shape = None
        if work is not None and (work / "data.npz").is_file():
            with np.load(work / "data.npz") as data:
                shape = next(data[n].shape[1:] for n in data.files if n.startswith("x/"))
        return get_net(source, input_shape=shape, keras_module=k)
    if path.exists():
        return k.models.load_model(str(path), compile=False)
    import importlib

    module_name, _, function = source.rpartition(":")
    sys.modules["keras"] = k  # the user's `import keras` (and `from keras import layers`) gets this stack's Keras
    sys.path.insert(0, ".")
    return getattr(importlib.import_module(module_name), function)()


def pack(arrays: Mapping[str, np.ndarray]) -> Any:
    """Arrays by input name in what the model takes: the array alone for one input, else a dict by name."""
    return next(iter(arrays.values())) if len(arrays) == 1 else dict(arrays)


def hand_over(subject: Subject, options: Options, work: Path, examples: int) -> None:
    """Write what a child process trains from: the model's weights and `examples` rows with their targets."""
    from tfperf.deploy.inputs import make_inputs
    from tfperf.doctor.targets import synthetic_targets

    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "weights.npz", **{f"w{i}": w for i, w in enumerate(subject.model.get_weights())})
    flat = make_inputs(subject, examples, seed=options.seed, sample=options.sample)
    np.savez(work / "data.npz", y=np.asarray(synthetic_targets(subject, options, examples)),
             **{f"x/{name}": array for name, array in flat.items()})


def take_over(work: Path, model) -> tuple[Any, np.ndarray]:
    """In the child: the weights `hand_over` wrote set into `model`, and its rows (packed) and targets."""
    weights = np.load(work / "weights.npz")
    model.set_weights([weights[f"w{i}"] for i in range(len(weights.files))])
    with np.load(work / "data.npz") as data:
        return pack({n[2:]: data[n] for n in data.files if n.startswith("x/")}), data["y"]


def loss_function(k, loss: str, from_logits: bool):
    """The Keras loss `loss` of Keras `k`, per example, taking logits when `from_logits`."""
    base = k.losses.get(loss)
    return (lambda y_true, y_pred: base(y_true, y_pred, from_logits=True)) if from_logits else base


def error_reply(exc: BaseException) -> str:
    """The one line a child replies instead of its timers when it cannot build or train the model."""
    from tfperf.deploy.errors import first_line
    from tfperf.measure.processes import reply

    return reply({"error": f"{type(exc).__name__}: {first_line(exc)}"})


def first_rows(work: Path) -> dict[str, np.ndarray]:
    """The first row of each input `hand_over` wrote, by its name in the file."""
    with np.load(work / "data.npz") as data:
        return {n: data[n][:1] for n in data.files if n.startswith("x/")}


def batch_rows(x: Any, rows: int) -> Any:
    """The first `rows` rows of packed inputs."""
    return {k: v[:rows] for k, v in x.items()} if isinstance(x, dict) else x[:rows]
