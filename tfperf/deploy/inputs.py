"""Inputs for any model: real rows from a sample file, or synthetic ones that respect what the model declares."""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.formats import InputError, first_line
from tfperf.deploy.loader import Subject


def read_sample(path: Path | str) -> dict[str, np.ndarray]:
    """Arrays from a .npz: inputs by name (or one array for a one-input model), optionally `y` for training."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise InputError(f"no such sample file: {path}") from None
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"--sample {path} is not a NumPy .npz archive of arrays ({first_line(exc)})") from None


def sample_inputs(subject: Subject, sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The sample's arrays for each input, checked against the input's shape."""
    names = [i.name for i in subject.inputs]
    arrays = {k: v for k, v in sample.items() if k != "y"}
    if len(names) == 1 and names[0] not in arrays and len(arrays) == 1:
        arrays = {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(f"the sample lacks {', '.join(missing)}: it holds {', '.join(sorted(sample)) or 'nothing'}; "
                          f"name its arrays after the model's inputs ({', '.join(names)})")
    for spec in subject.inputs:
        a = arrays[spec.name]
        if a.ndim < 1 or tuple(a.shape[1:]) != spec.shape:
            raise InputError(f"sample array {spec.name!r} has shape {list(a.shape)}, the model takes "
                              f"[N, {', '.join(map(str, spec.shape))}]")
        if len(a) != len(arrays[names[0]]):
            raise InputError("the sample's input arrays must have the same number of rows")
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
            raise InputError(f"input {spec.name!r} takes strings, which doctor cannot invent: pass real inputs "
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
    """The model's outputs on these inputs; InputError saying what to do when it fails on them."""
    try:
        return flat_outputs(subject.call(subject.pack(to_tensors(flat))))
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"the model fails on doctor's synthetic inputs ({type(exc).__name__}: {first_line(exc)}): "
                          f"pass real inputs with --sample FILE.npz, or --input-shape if a size is wrong") from None


