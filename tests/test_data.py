"""Data: the offline sets load, splits are shuffled and disjoint, downloads fail clearly offline."""

import urllib.error

import keras
import numpy as np
import pytest

from tfperf.data import DatasetUnavailable, load_arrays, synthetic, to_dataset


def test_mnist_5k_is_real_shuffled_and_split():
    d = load_arrays("mnist-5k", test_fraction=0.2, seed=0)
    assert d.x_train.shape == (4000, 28, 28, 1) and d.x_test.shape == (1000, 28, 28, 1)
    assert d.x_train.dtype == np.float32 and d.y_train.dtype == np.int32
    assert 0.0 <= d.x_train.min() and d.x_train.max() <= 1.0
    # It is stored sorted by label: an unshuffled split would put only 8s and 9s in the test set.
    assert set(np.unique(d.y_test)) == set(range(10))
    assert np.mean(np.diff(d.y_train) != 0) > 0.5
    train = {row.tobytes() for row in d.x_train}
    assert not any(row.tobytes() in train for row in d.x_test)


def test_splits_are_reproducible_by_seed():
    a, b = load_arrays("mnist-5k", seed=3), load_arrays("mnist-5k", seed=3)
    c = load_arrays("mnist-5k", seed=4)
    assert np.array_equal(a.y_train, b.y_train)
    assert not np.array_equal(a.y_train, c.y_train)


def test_digits_and_synthetic_shapes():
    assert load_arrays("digits").input_shape == (8, 8, 1)
    s = load_arrays("synthetic", synthetic_size=100, synthetic_shape=(512,), num_classes=2)
    assert s.input_shape == (512,) and s.num_classes == 2
    assert set(np.unique(s.y_train)) <= {0, 1}


def test_synthetic_labels_are_a_function_of_the_inputs():
    x, y = synthetic(500, (16,), num_classes=4, seed=1)
    x2, y2 = synthetic(500, (16,), num_classes=4, seed=1)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert len(np.unique(y)) == 4


def test_unknown_dataset_names_the_choices():
    with pytest.raises(ValueError, match="mnist-5k"):
        load_arrays("imagenet")


def test_download_failure_points_to_the_offline_set(monkeypatch):
    def offline():
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(keras.datasets.mnist, "load_data", offline)
    with pytest.raises(DatasetUnavailable, match="mnist-5k"):
        load_arrays("mnist")


def test_dataset_batches_and_shards_without_overlap():
    x = np.arange(20, dtype=np.float32).reshape(20, 1)
    y = np.arange(20, dtype=np.int32)
    batches = list(to_dataset(x, y, batch_size=6, seed=0))
    assert [len(b[1]) for b in batches] == [6, 6, 6, 2]
    shards = [np.concatenate([b[1].numpy() for b in to_dataset(x, y, batch_size=4, shard=(2, i))])
              for i in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(np.concatenate(shards)) == list(range(20))
    with pytest.raises(ValueError, match="batch_size"):
        to_dataset(x, y, batch_size=0)
