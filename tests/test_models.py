"""get_net builds each model with float32 logits; flops() agrees with TensorFlow's own count."""

import keras
import numpy as np
import pytest

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


def test_width_widens_every_hidden_layer_and_nothing_else():
    plain, wide = get_net("cnn"), get_net("cnn", width=2)
    shapes = [(3, 3, 1, 64), (64,), (5408 * 2, 128), (128,), (128, 10), (10,)]
    assert [w.shape for w in wide.trainable_weights] == shapes
    assert [w.shape for w in plain.trainable_weights][0] == (3, 3, 1, 32) and wide.output_shape == plain.output_shape
    with pytest.raises(ValueError, match="width"):
        get_net("mlp", width=0)


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


def hand_count(model) -> int:
    """Multiply-adds (x2) of the Dense, Conv2D and DepthwiseConv2D layers: the work flops() must at least count."""
    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.DepthwiseConv2D):
            kh, kw, cin, mult = layer.kernel.shape
            total += 2 * np.prod(layer.output.shape[1:3]) * kh * kw * cin * mult
        elif isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            total += 2 * np.prod(layer.output.shape[1:3]) * kh * kw * (cin // layer.groups) * cout
        elif isinstance(layer, keras.layers.Dense):
            total += 2 * np.prod(layer.output.shape[1:-1]) * np.prod(layer.kernel.shape)
    return int(total)


def test_mlp_flops_by_hand():
    # The matmuls, and the bias adds TensorFlow counts one per output element.
    assert flops(get_net("mlp")) == 2 * (512 * 256 + 256 * 128 + 128 * 2) + (256 + 128 + 2)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_flops_are_tensorflows_count_and_hold_the_matmuls_by_hand(name):
    # TensorFlow also counts bias adds, pooling and normalisation arithmetic: a few percent on top.
    net = get_net(name)
    assert hand_count(net) <= flops(net) <= 1.06 * hand_count(net)


def test_flops_of_depthwise_and_normalised_layers():
    inputs = keras.Input((16, 16, 8))
    x = keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Conv2D(4, 1)(keras.layers.ReLU()(x))
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x)))
    assert hand_count(model) <= flops(model) <= 1.15 * hand_count(model)
