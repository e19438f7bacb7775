"""get_net builds each model with float32 logits; flops() agrees with TensorFlow's own count."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.profiler import model_analyzer, option_builder

from tfperf.models import MODEL_NAMES, default_input_shape, flops, get_net


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_each_model_builds_uncompiled_with_its_output(name):
    net = get_net(name)
    shape = default_input_shape(name)
    y = net(np.zeros((3, *shape), np.float32))
    assert y.shape == (3, 2 if name == "mlp" else 10)
    assert not net.compiled  # uncompiled: callers compile inside their strategy scope


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as err:
        get_net("vgg")
    for name in MODEL_NAMES:
        assert name in str(err.value)


def test_shape_and_classes_are_checked():
    assert get_net("cnn", input_shape=(8, 8, 1), num_classes=3).output_shape == (None, 3)
    with pytest.raises(ValueError, match="images"):
        get_net("cnn", input_shape=(784,))
    with pytest.raises(ValueError, match="num_classes"):
        get_net("mlp", num_classes=0)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_logits_stay_float32_under_a_mixed_policy(policy):
    keras.config.set_dtype_policy(policy)
    try:
        net = get_net("cnn")
        y = net(np.zeros((2, 28, 28, 1), np.float32))
        assert y.dtype == "float32"
        assert net.layers[1].compute_dtype != "float32"  # the body really runs in half precision
    finally:
        keras.config.set_dtype_policy("float32")


def test_mlp_flops_by_hand():
    assert flops(get_net("mlp")) == 2 * (512 * 256 + 256 * 128 + 128 * 2)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_flops_agree_with_tensorflow_profiler(name):
    # The profiler also counts bias adds, activations and pooling, which flops() leaves out on purpose.
    net = get_net(name)
    spec = tf.TensorSpec((1, *default_input_shape(name)), tf.float32)
    graph = tf.function(net.__call__).get_concrete_function(spec).graph
    opts = option_builder.ProfileOptionBuilder.float_operation()
    opts["output"] = "none"
    counted = model_analyzer.profile(graph, options=opts).total_float_ops
    assert flops(net) <= counted <= 1.06 * flops(net)
