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
