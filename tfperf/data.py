"""Data sets as arrays and as tf.data pipelines; the default works offline."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tfperf.catalog import DATASET_NAMES
from tfperf.catalog import OFFLINE_DATASET as OFFLINE_DEFAULT

# The offline data sets, stored as uint8 arrays (tfperf/datasets/README.md says where they come from).
DATASETS = Path(__file__).parent / "datasets"

if TYPE_CHECKING:  # annotations only: the arrays load without TensorFlow
    import tensorflow as tf


class DatasetUnavailable(RuntimeError):
    """The data set cannot be had here (typically: it downloads and there is no network)."""


@dataclasses.dataclass(frozen=True)
class Arrays:
    """A train/test split as float32 inputs and int32 labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example, without the batch axis."""
        return tuple(self.x_train.shape[1:])


def split(
    x: np.ndarray, y: np.ndarray, *, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Shuffle, then cut off the last `test_fraction` as the test set."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = max(1, int(round(len(x) * test_fraction)))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def synthetic(
    n: int, shape: Sequence[int], *, num_classes: int = 10, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Random inputs with learnable labels (the argmax of a fixed random projection)."""
    if n < 1 or any(d < 1 for d in shape) or num_classes < 1:
        raise ValueError(f"synthetic data needs positive sizes, got n={n} shape={tuple(shape)}")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *shape), dtype=np.float32)
    projection = rng.standard_normal((int(np.prod(shape)), num_classes)).astype(np.float32)
    y = np.argmax(x.reshape(n, -1) @ projection, axis=1).astype(np.int32)
    return x, y


def _shipped(name: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """A data set shipped inside tfperf (tfperf/datasets/NAME.npz, uint8): images scaled to [0, 1], one channel."""
    with np.load(DATASETS / f"{name}.npz") as stored:
        images, labels = stored["images"], stored["labels"]
    return (images[..., None] / scale).astype(np.float32), labels.astype(np.int32)


def _keras_dataset(name: str) -> Arrays:
    import keras

    loader = getattr(keras.datasets, name).load_data
    try:
        (x_train, y_train), (x_test, y_test) = loader()  # cached under ~/.keras/datasets after one download
    except Exception as exc:  # urllib/HTTP/OS errors all mean the same thing to the user
        raise DatasetUnavailable(
            f"could not load {name!r} ({type(exc).__name__}: {exc}); it downloads on first use. "
            f"Offline, use --dataset {OFFLINE_DEFAULT} (5,000 real MNIST images shipped with tfperf)"
        ) from None

    def prep(x: np.ndarray) -> np.ndarray:
        return (x.reshape(-1, 28, 28, 1) / 255.0).astype(np.float32)

    return Arrays(name, prep(x_train), y_train.astype(np.int32), prep(x_test), y_test.astype(np.int32), 10)


def load_arrays(
    name: str = OFFLINE_DEFAULT,
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
    synthetic_size: int = 4096,
    synthetic_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
) -> Arrays:
    """Load a named data set as a shuffled train/test split of arrays."""
    if name in ("mnist", "fashion_mnist"):
        return _keras_dataset(name)  # these come with their own official test split
    if name == "mnist-5k":
        x, y = _shipped("mnist_5k", 255.0)
        classes = 10
    elif name == "digits":
        x, y = _shipped("digits", 16.0)
        classes = 10
    elif name == "synthetic":
        x, y = synthetic(synthetic_size, synthetic_shape, num_classes=num_classes, seed=seed)
        classes = num_classes
    else:
        raise ValueError(f"unknown dataset {name!r}: choose one of {', '.join(DATASET_NAMES)}")
    return Arrays(name, *split(x, y, test_fraction=test_fraction, seed=seed), classes)


def to_dataset(
    x: np.ndarray,
    y: np.ndarray,
    *,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    repeat: bool = False,
    drop_remainder: bool = False,
    shard: tuple[int, int] | None = None,
    cache: bool = False,
) -> tf.data.Dataset:
    """A batched, prefetched tf.data pipeline; `shard=(count, index)` keeps one worker's share; `cache` keeps the
    examples in memory after the first epoch, before the shuffle, so that every epoch still has its own order."""
    import tensorflow as tf

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if shard is not None:
        count, index = shard
        ds = ds.shard(count, index)  # before shuffling, so that workers' shares never overlap
    if cache:
        ds = ds.cache()  # before the shuffle: a cache after it would replay the first epoch's order for ever
    if shuffle:
        ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)
