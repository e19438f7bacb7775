"""Device selection and dtype policies, in this (already initialised) process."""

import keras
import pytest
import tensorflow as tf

from tfperf.devices import compute_devices, usable_cores
from tfperf.precision import cpu_bf16_support, dtype_policy, hardware_summary


def test_devices_after_initialisation_say_what_to_do():
    tf.constant(1.0)  # TensorFlow is initialised from here on
    assert usable_cores() >= 1
    assert compute_devices(1) in (["/CPU:0"], ["/GPU:0"])
    with pytest.raises(ValueError, match="at least one device"):
        compute_devices(0)
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(RuntimeError, match="before any op runs"):
            compute_devices(64)


def test_dtype_policy_is_scoped_and_summary_names_the_hardware():
    before = keras.config.dtype_policy().name
    with dtype_policy("mixed_bfloat16"):
        layer = keras.layers.Dense(2)
        layer.build((None, 3))
        assert (layer.compute_dtype, layer.variable_dtype) == ("bfloat16", "float32")
    assert keras.config.dtype_policy().name == before
    assert "bfloat16" in hardware_summary() and cpu_bf16_support()


def test_a_loaded_model_with_a_residual_add_is_rebuilt_under_a_policy_with_its_weights(tmp_path):
    """Issue 71: a functional model's `x + y` is an op without weights; the rebuild copies it as it is, puts every
    layer with weights but the output under the policy, and keeps the answers (set_global_policy before loading
    changes none of a saved model's layers)."""
    import numpy as np

    from tfperf.precision import under_policy

    keras.utils.set_random_seed(0)
    x = keras.Input((8,))
    h = keras.layers.Dense(8, activation="relu")(x)
    out = keras.layers.Dense(2, name="out")(keras.layers.LayerNormalization()(x + h))
    keras.Model(x, out).save(tmp_path / "residual.keras")
    with dtype_policy("mixed_bfloat16"):
        loaded = keras.saving.load_model(tmp_path / "residual.keras")
    assert {layer.dtype_policy.name for layer in loaded.layers if layer.weights} == {"float32"}
    rebuilt = under_policy(loaded, "mixed_bfloat16")
    policies = {layer.name: layer.dtype_policy.name for layer in rebuilt.layers if layer.weights}
    assert policies.pop("out") == "float32" and set(policies.values()) == {"mixed_bfloat16"}
    rows = np.random.default_rng(0).normal(size=(4, 8)).astype("float32")
    np.testing.assert_allclose(np.asarray(rebuilt(rows), "float32"), np.asarray(loaded(rows)), atol=0.05)
    assert keras.config.dtype_policy().name == "float32"  # the policy was scoped to the rebuild
