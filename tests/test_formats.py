"""LiteRT and ONNX exports: written like SavedModels (versioned, atomic), predicted and inspected by the CLI."""

import json
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import run
from tfperf.models import get_net

FORMATS = [("savedmodel", "none"), ("litert", "none"), ("litert", "dynamic"), ("litert", "int8"), ("onnx", "none")]


def tfperf(*args, **kw):
    return run([sys.executable, "-m", "tfperf", *args], **kw)


def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """One set of trained weights exported by the CLI in every format, and a batch of real digits."""
    from tfperf.data import load_arrays
    from tfperf.train import train

    root = tmp_path_factory.mktemp("formats")
    data = load_arrays("mnist-5k")
    net = get_net("cnn")
    train(net, data, steps=60, batch_size=64)  # trained a little: quantized answers are compared by class
    weights = tf.train.Checkpoint(model=net).write(str(root / "ckpt" / "weights"))
    x = data.x_test[:16]
    np.save(root / "x.npy", x)
    paths = {}
    for fmt, quantize in FORMATS:
        out = tfperf("export", "--weights", weights, "--name", "cnn", "--root", root / "saved_models",
                     "--format", fmt, "--quantize", quantize).stdout.strip().splitlines()[-1]
        paths[fmt, quantize] = out
    return {"root": root, "paths": paths, "x": x, "keras": tf.nn.softmax(net(x)).numpy()}


def test_every_format_lands_in_the_versioned_layout_with_its_metadata(exports):
    paths = exports["paths"]
    assert [p.rsplit("/", 1)[1] for p in paths.values()] == ["1", "2", "3", "4", "5"]  # next free version each time
    for (fmt, quantize), path in paths.items():
        meta = json.loads(open(f"{path}/tfperf.json").read())
        assert meta["format"] == fmt and meta["inputs"]["inputs"]["shape"] == [None, 28, 28, 1]
        assert meta["version"] == int(path.rsplit("/", 1)[1])
        if fmt != "savedmodel":
            assert meta["file"] == f"model.{'tflite' if fmt == 'litert' else 'onnx'}"
            assert meta["quantization"] == quantize and meta["converter"]
    assert not [p for p in listing(exports["root"] / "saved_models") if ".partial-" in p]  # no staging left


@pytest.mark.parametrize("fmt, quantize", FORMATS)
def test_predict_runs_every_format_and_float32_matches_the_savedmodel(exports, fmt, quantize):
    root = exports["root"]
    out = root / f"{fmt}-{quantize}.npy"
    tfperf("predict", exports["paths"][fmt, quantize], "--input", root / "x.npy", "--output", out)
    got, want = np.load(out), exports["keras"]
    if quantize == "none":
        np.testing.assert_allclose(got, want, atol=1e-4)  # the goal: float32 exports agree within 1e-4
    else:  # quantized: close, and the same answer on nearly every digit
        assert np.abs(got - want).max() < 0.2
        assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.9


@pytest.mark.parametrize("fmt, quantize", [("litert", "none"), ("onnx", "none")])
def test_inspect_describes_a_file_export_without_running_it(exports, fmt, quantize):
    proc = tfperf("inspect", exports["paths"][fmt, quantize])
    assert "input  inputs: float32[None, 28, 28, 1]" in proc.stdout
    assert "output probabilities: float32[None, 10]" in proc.stdout
    assert ("CONV_2D" if fmt == "litert" else "Conv") in proc.stdout and "bytes on disk" in proc.stdout
    assert "safe:" in proc.stdout


@pytest.mark.parametrize("fmt", ["litert", "onnx"])
def test_predict_checks_input_against_a_file_exports_spec(exports, tmp_path, fmt):
    np.save(tmp_path / "bad.npy", exports["x"][:, :27])
    proc = tfperf("predict", exports["paths"][fmt, "none"], "--input", tmp_path / "bad.npy", check=False)
    err = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "input has shape [16, 27, 28, 1]" in err and "float32[None, 28, 28, 1]" in err


@pytest.mark.parametrize("fmt, marker", [("litert", "model.tflite"), ("onnx", "model.onnx")])
def test_a_corrupt_file_export_is_refused_in_one_line(tmp_path, fmt, marker):
    (tmp_path / marker).write_bytes(b"\x00garbage\xff" * 10)
    np.save(tmp_path / "x.npy", np.zeros((1, 28, 28, 1), np.float32))
    for argv in (["inspect", tmp_path], ["predict", tmp_path, "--input", tmp_path / "x.npy"]):
        proc = tfperf(*argv, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "corrupt" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, message", [
    (["export", "--format", "onnx", "--quantize", "int8"], "--quantize int8 is for --format litert"),
    (["export", "--format", "savedmodel", "--select-tf-ops"], "--select-tf-ops is for --format litert"),
    (["export", "--format", "litert", "--quantize", "int8", "--model", "mlp"], "calibrate on the data"),
    (["export", "--format", "tflite"], "invalid choice: 'tflite'"),
])
def test_export_refuses_bad_format_options_in_one_line(tmp_path, argv, message):
    proc = tfperf(*argv, check=False, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def inverse_model():
    """A model with an op (MatrixInverse) that neither LiteRT's builtins nor tf2onnx convert."""
    import keras

    class Inverse(keras.layers.Layer):
        def call(self, x):
            return tf.reshape(tf.linalg.inv(tf.reshape(x, [-1, 2, 2]) + 2 * tf.eye(2)), [-1, 4])

    inputs = keras.Input((4,))
    return keras.Model(inputs, Inverse()(inputs), name="inverse")


@pytest.mark.parametrize("fmt, message", [
    ("litert", "LiteRT has no kernel for MatrixInverse: export --format litert --select-tf-ops"),
    ("onnx", "has no conversion for MatrixInverse: use --format savedmodel"),
])
def test_an_op_a_converter_lacks_is_named_and_nothing_is_left(tmp_path, fmt, message):
    from tfperf.serving import ExportError, export

    with pytest.raises(ExportError) as caught:
        export(inverse_model(), tmp_path, format=fmt)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert listing(tmp_path) == []


def test_select_tf_ops_exports_and_predict_says_the_runtime_lacks_flex(tmp_path):
    from tfperf.inspection import inspect_model
    from tfperf.serving import ModelError, export, load

    path = export(inverse_model(), tmp_path, format="litert", select_tf_ops=True)
    assert json.loads((path / "tfperf.json").read_text())["flex_ops"] == ["MatrixInverse"]
    report = inspect_model(path)
    assert "FlexMatrixInverse" in report.op_types and report.safe  # MatrixInverse is on the allowlist
    with pytest.raises(ModelError, match="MatrixInverse through the Flex delegate, which the installed LiteRT"):
        load(path)


def test_inspect_flags_a_flex_op_off_the_allowlist_and_a_custom_onnx_domain(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from tfperf.inspection import inspect_model

    # LiteRT: a Flex op runs a TensorFlow op, judged by the same allowlist (WriteFile touches the file system).
    module = tf.Module()
    module.serve = tf.function(lambda x: (tf.io.write_file(str(tmp_path / "never.txt"), tf.strings.as_string(x[0])),
                                          {"y": x * 2.0})[1], input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.serve})
    converter = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "sm"))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    (tmp_path / "litert").mkdir()
    (tmp_path / "litert" / "model.tflite").write_bytes(converter.convert())
    report = inspect_model(tmp_path / "litert")
    assert not report.safe and "touches the file system" in report.flagged["FlexWriteFile"]

    # ONNX: an operator from a domain the runtime does not ship is code from elsewhere.
    node = helper.make_node("Exfiltrate", ["x"], ["y"], domain="evil.ops")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("evil.ops", 1)])
    (tmp_path / "onnx").mkdir()
    onnx.save(model, str(tmp_path / "onnx" / "model.onnx"))
    report = inspect_model(tmp_path / "onnx")
    assert not report.safe and "custom domain 'evil.ops'" in report.flagged["evil.ops.Exfiltrate"]
    np.save(tmp_path / "x.npy", np.ones(3, np.float32))
    proc = tfperf("predict", tmp_path / "onnx", "--input", tmp_path / "x.npy", check=False)
    assert proc.returncode == 2 and "evil.ops.Exfiltrate" in proc.stderr and "--trust" in proc.stderr


@pytest.mark.parametrize("fmt", ["litert", "onnx"])
def test_no_format_overwrites_an_existing_version(exports, fmt):
    root = exports["root"] / "saved_models"
    before = [(p, p.stat().st_size) for p in sorted(root.rglob("*"))]
    proc = tfperf("export", "--name", "cnn", "--root", root, "--format", fmt, "--version", "1", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "exists and is never overwritten; the next free version is 6" in proc.stderr.strip().splitlines()[-1]
    assert [(p, p.stat().st_size) for p in sorted(root.rglob("*"))] == before
