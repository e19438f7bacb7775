"""Inspection, the gate before an untrusted model is loaded: every export the cookbook makes passes; every op off
the allowlist, a Flex op that touches files, an ONNX operator from another domain, and ONNX weights read from
outside the model's folder are named, and `predict` refuses them unless trusted."""

import numpy as np
import pytest
import tensorflow as tf

from test_deploy import refused, tfperf
from tfperf.deploy.allowlist import ALLOWED_OPS, NOT_REVIEWED, RISKY_OPS
from tfperf.deploy.inspection import inspect_model, inspect_saved_model
from tfperf.deploy.layout import export_subject
from tfperf.deploy.loader import cookbook_subject


def hostile(kind: str, tmp_path):
    """A SavedModel whose serving signature (or a restored function) reaches outside the computation."""
    spec = [tf.TensorSpec([None], tf.float32)]
    files = tmp_path / "files"
    files.mkdir(exist_ok=True)
    (files / "vocab.txt").write_text("a\nb\n")
    (files / "lines.txt").write_text("1\n2\n")
    m = tf.Module()
    if kind == "lookup table from a text file":
        m.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
            str(files / "vocab.txt"), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
            tf.lookup.TextFileIndex.LINE_NUMBER), -1)
    if kind == "restored function reads a file":  # no signature reaches it; loaded.read() would
        m.read = tf.function(lambda: tf.io.read_file(str(files / "lines.txt")), input_signature=[])
        m.read.get_concrete_function()
    bodies = {
        # Stateful ops run in a tf.function whether or not their result is used (automatic control deps).
        "write file": lambda x: (tf.io.write_file(str(tmp_path / "never.txt"), tf.strings.as_string(x[0])), x)[1],
        "read file": lambda x: x + tf.cast(tf.strings.length(tf.io.read_file(str(files / "lines.txt"))), tf.float32),
        "matching files": lambda x: x + tf.cast(tf.size(tf.io.matching_files(str(files / "*"))), tf.float32),
        "text line dataset": lambda x: x + tf.cast(tf.data.TextLineDataset(str(files / "lines.txt")).cardinality(),
                                                   tf.float32),
        "tfrecord dataset": lambda x: x + tf.cast(tf.data.TFRecordDataset(str(files / "r.tfrecord")).cardinality(),
                                                  tf.float32),
        "lookup table from a text file": lambda x: x + tf.cast(m.table.lookup(tf.constant(["a"]))[0], tf.float32),
        "summary writer": lambda x: summarize(x, tmp_path / "logs"),
        "py_function": lambda x: tf.py_function(lambda t: t * 2.0, [x], tf.float32),
        "numpy_function": lambda x: tf.numpy_function(lambda t: t * 2.0, [x], tf.float32),
        "print": lambda x: (tf.print(x), x)[1],
        "op not reviewed": lambda x: x + tf.cast(tf.strings.length(tf.io.encode_base64(tf.constant("ab"))), tf.float32),
        "restored function reads a file": lambda x: x * 2.0,
    }
    m.serve = tf.function(lambda x: {"y": bodies[kind](x)}, input_signature=spec)
    tf.saved_model.save(m, str(tmp_path / "m"), signatures={"serving_default": m.serve})
    return tmp_path / "m"


def summarize(x, logdir):
    # The writer is made inside the function (a captured one would be an untracked resource on save).
    writer = tf.raw_ops.SummaryWriter(shared_name="hostile")
    tf.raw_ops.CreateSummaryFileWriter(writer=writer, logdir=str(logdir), max_queue=1, flush_millis=0,
                                       filename_suffix=".v2")
    tf.raw_ops.WriteScalarSummary(writer=writer, step=tf.constant(0, tf.int64), tag="sum", value=tf.reduce_sum(x))
    return x


HOSTILE = {"write file": "WriteFile", "read file": "ReadFile", "matching files": "MatchingFiles",
           "text line dataset": "TextLineDataset", "tfrecord dataset": "TFRecordDataset",
           "lookup table from a text file": "InitializeTableFromTextFileV2", "summary writer": "CreateSummaryFileWriter",
           "py_function": "EagerPyFunc", "numpy_function": "PyFunc", "print": "PrintV2",
           "op not reviewed": "EncodeBase64", "restored function reads a file": "ReadFile"}


@pytest.mark.parametrize("fmt", ["savedmodel", "litert", "onnx"])
def test_every_export_the_cookbook_makes_passes(tmp_path, fmt):
    for name in ("mlp", "cnn", "lenet", "resnet18"):  # what the recipes and `tfperf train --export` write
        report = inspect_model(export_subject(cookbook_subject(name), tmp_path, format=fmt).path)
        assert report.safe and report.format == fmt and report.op_types, (name, report.flagged)
    code, out, _ = tfperf("inspect", tmp_path / "cnn" / "1")
    assert code == 0 and "input  inputs: float32[None, 28, 28, 1]" in out and "bytes on disk" in out
    assert {"savedmodel": "Conv2D", "litert": "CONV_2D", "onnx": "Conv"}[fmt] in out and "safe" in out


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_inspect_flags_every_op_off_the_allowlist(tmp_path, kind):
    report = inspect_saved_model(hostile(kind, tmp_path))
    assert not report.safe and HOSTILE[kind] in report.flagged, report.flagged
    assert (report.flagged[HOSTILE[kind]] == NOT_REVIEWED) == (kind == "op not reviewed")


def test_inspect_and_predict_refuse_an_unsafe_model_unless_trusted(tmp_path):
    model = hostile("write file", tmp_path)
    code, out, _ = tfperf("inspect", model)
    assert code == 1 and "NOT SAFE" in out and "WriteFile: touches the file system" in out
    np.save(tmp_path / "x.npy", np.ones(3, np.float32))
    line = refused("predict", model, "--input", tmp_path / "x.npy")
    assert "WriteFile" in line and "--trust" in line
    assert not (tmp_path / "never.txt").exists()  # refused before anything ran


def test_the_allowlist_names_real_op_types():
    real = set(dir(tf.raw_ops))
    assert ALLOWED_OPS <= real and set(RISKY_OPS) <= real and not ALLOWED_OPS & set(RISKY_OPS)


def test_inspect_flags_a_flex_op_off_the_allowlist_and_a_custom_onnx_domain(tmp_path):
    import onnx
    from onnx import TensorProto, helper

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
    np.save(tmp_path / "x.npy", np.ones((2, 1), np.float32))
    line = refused("predict", tmp_path / "onnx", "--input", tmp_path / "x.npy")
    assert "evil.ops.Exfiltrate" in line and "--trust" in line


def onnx_with_external_weights(folder, location: str):
    """An ONNX model whose weights live in another file, named by `location` relative to the model."""
    import onnx
    from onnx import TensorProto, helper

    weights = helper.make_tensor("w", TensorProto.FLOAT, [1], [2.0])
    weights.data_location = TensorProto.EXTERNAL
    del weights.float_data[:]
    for key, value in (("location", location), ("offset", "0"), ("length", "4")):
        weights.external_data.add(key=key, value=value)
    node = helper.make_node("Mul", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])], [weights])
    folder.mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # ONNX Runtime 1.31 reads IR <= 13
    onnx.save(model, str(folder / "model.onnx"))
    return folder


def test_onnx_weights_read_from_outside_the_folder_are_named(tmp_path):
    (tmp_path / "secret.bin").write_bytes(np.float32([3.0]).tobytes())
    outside = onnx_with_external_weights(tmp_path / "outside", "../secret.bin")
    code, out, _ = tfperf("inspect", outside)
    assert code == 1 and "external data of w: reads ../secret.bin, outside the model's folder" in out
    np.save(tmp_path / "x.npy", np.ones((2, 1), np.float32))
    assert "../secret.bin" in refused("predict", outside, "--input", tmp_path / "x.npy")
    inside = onnx_with_external_weights(tmp_path / "inside", "weights.bin")  # large models do this: fine
    (inside / "weights.bin").write_bytes(np.float32([2.0]).tobytes())
    assert inspect_model(inside).safe
    code, out, _ = tfperf("predict", inside, "--input", tmp_path / "x.npy")
    assert code == 0 and "y: float32[2, 1], values 2 to 2" in out
