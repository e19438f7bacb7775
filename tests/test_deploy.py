"""Deployment of models nobody here wrote: a Keras Applications model, a Keras `model.export()` archive, a
SavedModel with two inputs and two outputs. Every export is checked against the model before it lands;
`predict` serves any export; bad input is one line with exit 2 and nothing on disk. The commands run
in-process through `tfperf.cli.main`; test_cli_smoke runs each once as a user does, in its own process."""

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run, varying_outputs
from tfperf.cli import main

# On one xdist worker (`make test` runs two): its module fixtures export once.
pytestmark = pytest.mark.xdist_group("deploy")

FORMATS = [("savedmodel", "none"), ("litert", "none"), ("litert", "int8"), ("onnx", "none")]


def test_under_loadgroup_this_modules_tests_are_one_work_unit(request):
    """pytest 9.2 with pytest-xdist 3.8 dropped every xdist_group silently: each worker then built this module's
    exports again (130 s each) and the suite's shared-resource groups ran side by side."""
    if not getattr(request.config.option, "loadgroup", False):  # set by xdist for --dist loadgroup, else absent
        pytest.skip("only `make test`'s --dist loadgroup groups tests")
    assert request.node.nodeid.endswith("@deploy"), "install the pytest that requirements.txt pins"


def tfperf(*args) -> tuple[int, str, str]:
    """`tfperf ARGS` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's own refusals (flags.ArgumentParser: one line, exit 2)
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def refused(*args) -> str:
    """The one line a refused command prints (exit 2, no traceback)."""
    code, _, err = tfperf(*args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]


def listing(root: Path) -> list:
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory):
    """MobileNetV2 from Keras Applications (weights=None: nothing is downloaded), its normalisation's statistics
    from the sample so that its outputs vary (agreement with it is then evidence), saved as .keras; the sample."""
    root = tmp_path_factory.mktemp("mobilenet")
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).random((24, 32, 32, 3), dtype=np.float32)
    model = varying_outputs(keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None,
                                                           classes=10), x)
    model.save(root / "mobilenet.keras")
    np.savez(root / "sample.npz", images=x)  # one input: any name will do
    np.save(root / "x.npy", x)
    return {"root": root, "file": root / "mobilenet.keras", "x": x, "probs": model(x).numpy()}


@pytest.fixture(scope="module")
def exports(mobilenet):
    """The model exported in every format and quantization by the command, next free version each time."""
    paths = {}
    for fmt, quantize in FORMATS:
        code, out, err = tfperf("export", mobilenet["file"], "--root", mobilenet["root"] / "saved_models",
                                "--format", fmt, "--quantize", quantize, "--sample", mobilenet["root"] / "sample.npz")
        assert code == 0, err
        paths[fmt, quantize] = Path(out.splitlines()[0])
        assert "checked against the model on 16 rows of the sample" in out
    return paths


def test_every_format_is_checked_against_the_model_and_lands_versioned(exports):
    assert [p.name for p in exports.values()] == ["1", "2", "3", "4"]
    for (fmt, quantize), path in exports.items():
        meta = json.loads((path / "tfperf.json").read_text())
        assert meta["format"] == fmt and meta["version"] == int(path.name) and meta["classifier"] == "output_0"
        assert meta["outputs"] == ["output_0"] and list(meta["inputs"].values())[0]["shape"] == [None, 32, 32, 3]
        check = meta["agreement"]
        assert check["on"] == "16 rows of the sample" and "top_class_agreement" in check
        if quantize == "none":
            assert check["outputs"]["output_0"]["relative"] <= 1e-4 and check["top_class_agreement"] == 1.0
        else:  # int8 arithmetic on an untrained MobileNetV2: measured and said, far from exact, above chance
            assert meta["quantization"] == quantize and check["outputs"]["output_0"]["max_abs_diff"] > 1e-3
            assert check["top_class_agreement"] > 0.25
        if quantize == "int8":
            assert meta["calibrated_on"] == "24 rows of the sample"
    assert not [p for p, _ in listing(next(iter(exports.values())).parent) if ".partial-" in p]


@pytest.mark.parametrize("fmt, quantize", FORMATS)
def test_predict_serves_every_format(mobilenet, exports, tmp_path, fmt, quantize):
    code, out, _ = tfperf("predict", exports[fmt, quantize], "--input", mobilenet["root"] / "x.npy",
                          "--output", tmp_path / "y.npy")
    got = np.load(tmp_path / "y.npy")
    assert code == 0 and "predicted classes: " in out and "output_0: float32[24, 10]" in out
    if quantize == "none":
        np.testing.assert_allclose(got, mobilenet["probs"], atol=1e-4)
    else:  # int8 arithmetic: probabilities still, whose top class is the float model's well above chance (10%)
        np.testing.assert_allclose(got.sum(axis=1), 1, atol=0.05)
        assert (got.argmax(axis=1) == mobilenet["probs"].argmax(axis=1)).mean() > 0.25


def test_a_model_holding_a_lookup_table_exports_and_answers_as_the_model(tmp_path):
    """A SavedModel export holds the variables its function reads, not the model's object graph (2.5x faster to
    write on MobileNetV2); a StringLookup's table is no variable, and is kept by tracking the whole model."""
    text = keras.Input((1,), dtype="string", name="text")
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c"])(text)
    model = keras.Model(text, keras.layers.Embedding(4, 3)(ids))
    model.save(tmp_path / "lookup.keras")
    words = np.array([["a"], ["c"], ["zz"], ["b"]])
    np.savez(tmp_path / "words.npz", text=words)
    code, out, err = tfperf("export", tmp_path / "lookup.keras", "--root", tmp_path / "out", "--sample",
                            tmp_path / "words.npz")
    assert code == 0 and "largest difference 0 " in out, err
    code, _, err = tfperf("predict", tmp_path / "out" / "lookup" / "1", "--input", tmp_path / "words.npz",
                          "--output", tmp_path / "y.npy")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), model(tf.constant(words)).numpy())


def test_predict_a_keras_model_export_archive(tmp_path):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(inputs)))
    model.export(str(tmp_path / "archive"), verbose=False)  # what Keras users ship to TF Serving
    x = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = tfperf("predict", tmp_path / "archive", "--input", tmp_path / "x.npy", "--output",
                            tmp_path / "y.npz")
    assert code == 0, err
    assert "output_0: float32[5, 3]" in out and "predicted classes" not in out  # not said to be a classifier
    np.testing.assert_allclose(np.load(tmp_path / "y.npz")["output_0"], model(x).numpy(), atol=1e-5)


class TwoByTwo(tf.Module):
    """A model without Keras: two inputs (floats and integer ids) and two outputs, under two signatures."""

    def __init__(self):
        self.w = tf.Variable(tf.random.normal([3, 2], seed=2))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="dense"),
                                  tf.TensorSpec([None, 4], tf.int32, name="ids")])
    def serve(self, dense, ids):
        return {"score": tf.matmul(dense, self.w), "count": tf.reduce_sum(ids, axis=1)}


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    module = TwoByTwo()
    tf.saved_model.save(module, str(root / "model"), signatures={"scores": module.serve})  # no serving_default
    rng = np.random.default_rng(0)
    x = {"dense": rng.normal(size=(7, 3)).astype(np.float32), "ids": rng.integers(0, 9, (7, 4)).astype(np.int32)}
    np.savez(root / "x.npz", **x)
    return {"root": root, "model": root / "model", "x": x, "score": x["dense"] @ module.w.numpy()}


def test_predict_a_two_input_two_output_savedmodel(two_by_two, tmp_path):
    code, out, err = tfperf("predict", two_by_two["model"], "--input", two_by_two["root"] / "x.npz",
                            "--output", tmp_path / "y.npz")
    assert code == 0, err
    with np.load(tmp_path / "y.npz") as y:
        np.testing.assert_allclose(y["score"], two_by_two["score"], atol=1e-5)
        assert (y["count"] == two_by_two["x"]["ids"].sum(1)).all()
    assert "count: int32[7]" in out and "score: float32[7, 2]" in out
    assert "--output FILE.npz" in refused("predict", two_by_two["model"], "--input", two_by_two["root"] / "x.npz",
                                          "--output", tmp_path / "y.npy")  # two outputs, no classifier: which one?


def test_export_a_two_input_savedmodel_to_onnx_and_litert(two_by_two):
    root = two_by_two["root"] / "saved_models"
    for fmt in ("onnx", "litert"):
        code, out, err = tfperf("export", two_by_two["model"], "--root", root, "--name", "two", "--format", fmt,
                                "--sample", two_by_two["root"] / "x.npz")
        assert code == 0, err
        meta = json.loads((Path(out.splitlines()[0]) / "tfperf.json").read_text())
        assert sorted(meta["outputs"]) == ["count", "score"] and meta["source_signature"] == "scores"
        assert all(a["relative"] <= 1e-4 for a in meta["agreement"]["outputs"].values())
        code, out, err = tfperf("predict", out.splitlines()[0], "--input", two_by_two["root"] / "x.npz")
        assert code == 0 and "score: float32[7, 2]" in out, err


def unsafe_keras_file(tmp_path) -> Path:
    inputs = keras.Input((4,))
    outputs = keras.layers.Lambda(lambda x: x * 2.0, output_shape=(4,), name="doubler")(inputs)
    path = tmp_path / "unsafe.keras"
    keras.Model(inputs, outputs).save(path)
    return path


def test_an_unsafe_keras_file_is_refused_before_loading_unless_trusted(tmp_path):
    path = unsafe_keras_file(tmp_path)
    root = tmp_path / "saved_models"
    line = refused("export", path, "--root", root)
    assert "safe mode" in line and "'doubler'" in line and "module:factory" in line and "--trust" in line
    assert not root.exists()
    code, out, err = tfperf("export", path, "--root", root, "--trust")
    assert code == 0 and "largest difference 0" in out, err


def test_an_export_that_disagrees_with_the_model_is_refused_and_leaves_nothing(mobilenet, tmp_path, monkeypatch):
    from tfperf.deploy import formats

    real = formats.OnnxRunner.__call__
    monkeypatch.setattr(formats.OnnxRunner, "__call__", lambda self, inputs: {
        k: v + 1e-2 for k, v in real(self, inputs).items()})  # a converter that got the model slightly wrong
    line = refused("export", mobilenet["file"], "--root", tmp_path / "saved_models", "--format", "onnx")
    assert "disagrees with the model: output 'output_0' differs by up to 0.01" in line
    assert listing(tmp_path) == []


@pytest.mark.parametrize("case", ["signature", "sample-shape", "sample-missing", "not-a-model", "int8-onnx",
                                  "select-tf-ops", "weights", "num-classes", "missing-checkpoint", "version"])
def test_export_refuses_bad_input_in_one_line(mobilenet, two_by_two, tmp_path, case):
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.zeros((3, 16, 16, 3), np.float32))
    argv, expected = {
        "signature": ([two_by_two["model"], "--signature", "nope"], "has no signature 'nope': it has scores"),
        "sample-shape": ([mobilenet["file"], "--sample", bad], "' has shape [3, 16, 16, 3]"),  # Keras numbers the name
        "sample-missing": ([two_by_two["model"], "--sample", mobilenet["root"] / "sample.npz"], "lacks dense, ids"),
        "not-a-model": ([bad], "is not a model"),
        "int8-onnx": ([mobilenet["file"], "--format", "onnx", "--quantize", "int8"], "is for --format litert"),
        "select-tf-ops": ([mobilenet["file"], "--select-tf-ops"], "--select-tf-ops is for --format litert"),
        "weights": ([mobilenet["file"], "--weights", "ckpt"], "--weights is for the cookbook nets"),
        "num-classes": ([mobilenet["file"], "--num-classes", "3"], "--num-classes is for the cookbook nets"),
        "missing-checkpoint": (["cnn", "--weights", tmp_path / "none"], "no checkpoint at"),
        "version": (["cnn", "--version", "0"], "must be a positive integer"),
    }[case]
    before = listing(tmp_path)
    assert expected in refused("export", *argv, "--root", tmp_path / "saved_models")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("case", ["shape", "dtype", "pickle", "not-npy", "forged-header", "forged-npz", "missing-input",
                                  "missing-model", "not-an-export", "corrupt", "corrupt-litert", "corrupt-onnx",
                                  "wrong-name", "floats-for-ids"])
def test_predict_refuses_bad_input_in_one_line(exports, two_by_two, tmp_path, case):
    model, x = exports["savedmodel", "none"], tmp_path / "x.npy"
    np.save(x, np.zeros((2, 32, 32, 3), np.float32))
    forged = {"descr": "<f4", "fortran_order": False, "shape": (1 << 30, 48)}  # 191 GiB claimed, 16 bytes held
    if case == "shape":
        np.save(x, np.zeros((2, 31, 32, 3), np.float32))
    elif case == "dtype":
        np.save(x, np.full((2, 32, 32, 3), "a"))
    elif case == "pickle":
        np.save(x, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif case == "not-npy":
        x.write_text("1,2,3\n")
    elif case in ("forged-header", "forged-npz"):
        with (tmp_path / "forged.npy").open("wb") as f:
            np.lib.format.write_array_header_1_0(f, forged)
            f.write(b"\x00" * 16)
        x = tmp_path / "forged.npy"
        if case == "forged-npz":
            import zipfile

            with zipfile.ZipFile(tmp_path / "forged.npz", "w") as z:
                z.write(x, "images.npy")
            x = tmp_path / "forged.npz"
    elif case == "missing-input":
        x = tmp_path / "nope.npy"
    elif case == "missing-model":
        model = tmp_path / "no-model"
    elif case == "not-an-export":
        model = model.parent  # the name folder, not a version
    elif case.startswith("corrupt"):
        model = tmp_path / "broken"
        model.mkdir()
        marker = {"corrupt": "saved_model.pb", "corrupt-litert": "model.tflite", "corrupt-onnx": "model.onnx"}[case]
        (model / marker).write_bytes(b"\x00garbage\xff" * 10)
    elif case == "wrong-name":
        model, x = two_by_two["model"], tmp_path / "x.npz"
        np.savez(x, dense=two_by_two["x"]["dense"], token_ids=two_by_two["x"]["ids"])
    elif case == "floats-for-ids":
        model, x = two_by_two["model"], tmp_path / "x.npz"
        np.savez(x, dense=two_by_two["x"]["dense"], ids=two_by_two["x"]["ids"].astype(np.float32))
    expected = {"shape": "has shape [2, 31, 32, 3]", "dtype": "holds <U1", "pickle": "holds Python objects",
                "not-npy": "cannot read", "forged-header": "(206,158,430,208 bytes), but the file holds 16 bytes",
                "forged-npz": "images.npy: its header claims", "missing-input": "no such input file",
                "missing-model": "no model at", "not-an-export": "holds versions [1, 2, 3, 4]",
                "corrupt": "saved_model.pb is corrupt", "corrupt-litert": "model.tflite is corrupt",
                "corrupt-onnx": "model.onnx is corrupt", "wrong-name": "lacks ids (it holds dense, token_ids)",
                "floats-for-ids": "holds floats where the model takes int32"}[case]
    before = listing(tmp_path)
    line = refused("predict", model, "--input", x)
    assert line.startswith("tfperf predict: error:") and expected in line
    assert listing(tmp_path) == before


def test_predict_counts_inputs_that_are_not_finite(mobilenet, exports, tmp_path):
    x = mobilenet["x"].copy()
    x[0, 0, 0, 0], x[-1, 3, 3, 0], x[-1, 4, 4, 0] = np.nan, np.inf, -np.inf
    np.save(tmp_path / "x.npy", x)
    code, out, err = tfperf("predict", exports["onnx", "none"], "--input", tmp_path / "x.npy")
    assert code == 0 and f"warning: 3 of {x.size} input values are NaN or infinite" in err
    assert "predicted classes:" in out  # the run goes on: the warning says what to distrust


def test_versions_are_never_overwritten_and_a_concurrent_export_moves_to_the_next_free_one(tmp_path, monkeypatch):
    from tfperf.deploy.layout import export_subject, next_version
    from tfperf.deploy.loader import cookbook_subject

    root, mlp = tmp_path / "saved_models", cookbook_subject("mlp")
    assert export_subject(mlp, root).path.name == "1"
    before = listing(root)
    line = refused("export", "mlp", "--root", root, "--version", "1")
    assert "exists and is never overwritten; the next free version is 2" in line and listing(root) == before
    # Another export takes version 2 while this one writes it: this one lands as version 3, nothing is lost.
    rename = os.rename

    def raced(src, dst):
        if Path(dst).name == "2" and not Path(dst).exists():
            (Path(dst) / "variables").mkdir(parents=True)  # the other export, renamed into place first
        return rename(src, dst)

    monkeypatch.setattr(os, "rename", raced)
    done = export_subject(mlp, root)
    assert done.path.name == "3" and done.metadata["version"] == 3 and next_version(root / "mlp") == 4
    assert json.loads((done.path / "tfperf.json").read_text())["version"] == 3


def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(mobilenet, tmp_path, monkeypatch):
    import dataclasses

    from tfperf.deploy import layout

    def full(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "saved_model.pb; No space left on device")

    monkeypatch.setattr(layout, "FORMATS", {**layout.FORMATS, "savedmodel": dataclasses.replace(
        layout.FORMATS["savedmodel"], write=full)})
    line = refused("export", mobilenet["file"], "--root", tmp_path / "saved_models")
    assert "no space left on the device while writing" in line and listing(tmp_path) == []


def test_an_export_cleans_the_staging_folders_killed_exports_left(tmp_path):
    from tfperf.deploy.layout import STALE_AFTER_S, export_subject
    from tfperf.deploy.loader import cookbook_subject

    root = tmp_path / "saved_models" / "mlp"
    root.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    killed = root / f".1.partial-{host}-{int(gone.stdout)}-abc123"  # its writer has exited
    running = root / f".1.partial-{host}-{os.getpid()}-def456"  # its writer (this test) is alive
    elsewhere = root / ".1.partial-other-host-12345-ghi789"  # another host's: judged by age
    old = root / ".1.partial-x7y8z9"  # named before writers were recorded, two days old
    for folder in (killed, running, elsewhere, old):
        (folder / "variables").mkdir(parents=True)
    os.utime(old, (time.time() - 2 * STALE_AFTER_S,) * 2)
    assert export_subject(cookbook_subject("mlp"), tmp_path / "saved_models").path.name == "1"
    assert sorted(p.name for p in root.iterdir()) == sorted(["1", running.name, elsewhere.name])


def test_an_op_a_converter_lacks_is_named_and_nothing_is_left(tmp_path):
    from tfperf.deploy.errors import ExportError
    from tfperf.deploy.layout import export_subject
    from tfperf.deploy.loader import keras_subject

    class Inverse(keras.layers.Layer):
        def call(self, x):
            return tf.reshape(tf.linalg.inv(tf.reshape(x, [-1, 2, 2]) + 2 * tf.eye(2)), [-1, 4])

    inputs = keras.Input((4,))
    subject = keras_subject(keras.Model(inputs, Inverse()(inputs), name="inverse"), "inverse", factory=None)
    for fmt, message in (("litert", "LiteRT has no kernel for MatrixInverse: export --format litert --select-tf-ops"),
                         ("onnx", "has no conversion for MatrixInverse: use --format savedmodel")):
        with pytest.raises(ExportError) as caught:
            export_subject(subject, tmp_path, format=fmt)
        assert message in str(caught.value) and "\n" not in str(caught.value)
        assert listing(tmp_path) == []
    # With Select TF ops it is written for a runtime that links the Flex delegate; the installed one does not,
    # so the export cannot be checked (said so) and predict says why it cannot load it.
    from tfperf.deploy.errors import ModelError
    from tfperf.deploy.inspection import inspect_model
    from tfperf.deploy.layout import load

    exported = export_subject(subject, tmp_path, format="litert", select_tf_ops=True)
    assert exported.metadata["flex_ops"] == ["MatrixInverse"] and "not_checked" in exported.metadata["agreement"]
    report = inspect_model(exported.path)
    assert "FlexMatrixInverse" in report.op_types and report.safe  # MatrixInverse is on the allowlist
    with pytest.raises(ModelError, match="MatrixInverse through the Flex delegate, which the installed LiteRT"):
        load(exported.path)


def test_exact_gelu_converts_to_onnx_and_agrees_with_keras(tmp_path):
    """Keras' exact GELU computes erfc, which tf2onnx lacks: converted as 1 - erf, checked like any export."""
    from tfperf.deploy.layout import export_subject, load, predict
    from tfperf.deploy.loader import keras_subject

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(16, activation="gelu")(inputs)))
    exported = export_subject(keras_subject(model, "gelu", factory=None), tmp_path, format="onnx")
    x = np.linspace(-6, 6, 8 * 5, dtype=np.float32).reshape(5, 8)  # erfc's range where 1 - erf loses digits
    got = predict(load(exported.path), {"x": x})["output_0"]
    assert np.abs(got - model(x).numpy()).max() <= 1e-4 * np.abs(model(x).numpy()).max()


def encoder():
    """A keras-io style Transformer encoder: token ids and a padding mask of any length, exact GELU."""
    from keras import layers, ops

    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    x = layers.Embedding(50, 16)(tokens)
    x = layers.LayerNormalization()(x + layers.MultiHeadAttention(2, 8)(
        x, x, attention_mask=ops.expand_dims(ops.cast(mask, "bool"), 1)))
    x = layers.LayerNormalization()(x + layers.Dense(16)(layers.Dense(32, activation="gelu")(x)))
    weights = ops.expand_dims(ops.cast(mask, "float32"), -1)
    pooled = ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
    return keras.Model([tokens, mask], layers.Dense(3)(pooled), name="encoder")


def test_a_free_sequence_axis_stays_free_in_every_format_and_answers_at_any_length(tmp_path):
    """No --input-shape: each export keeps the length free (ONNX names it), is checked at two lengths, and
    answers requests of 5 and 40 tokens as Keras does (LiteRT, if its converter fixes the length, says so)."""
    import onnx

    from tfperf.deploy.layout import export_subject, load, predict
    from tfperf.deploy.loader import keras_subject

    keras.utils.set_random_seed(1)
    model = encoder()
    subject = keras_subject(model, "encoder", factory=None)
    assert subject.free and str(subject.inputs[0]) == "token_ids: int32[batch, 32 (free)]"
    rng = np.random.default_rng(0)
    for fmt in ("savedmodel", "onnx", "litert"):
        exported = export_subject(subject, tmp_path, format=fmt)
        assert "17 long where the model leaves sizes free" in exported.metadata["agreement"]["on"] or \
            exported.metadata.get("fixed_sizes"), fmt
        runner = load(exported.path)
        lengths = (5, 40) if not exported.metadata.get("fixed_sizes") else (32,)
        for length in lengths:
            ids = rng.integers(1, 50, size=(3, length)).astype(np.int32)
            mask = (np.arange(length)[None, :] < [[length], [length // 2], [1]]).astype(np.int32)
            want = model([ids, mask]).numpy()
            got = predict(runner, {"token_ids": ids, "padding_mask": mask})["output_0"]
            assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), (fmt, length)
        if fmt == "onnx":
            dims = onnx.load(exported.path / "model.onnx").graph.input[0].type.tensor_type.shape.dim
            assert len(dims) == 2 and all(d.dim_param and not d.dim_value for d in dims)


def test_the_cookbook_nets_keep_their_contract(tmp_path, monkeypatch):
    from tfperf.deploy.layout import export_subject, load, predict
    from tfperf.deploy.loader import cookbook_subject, load_subject

    # A folder named like a net that holds no SavedModel (`tfperf doctor cnn --out cnn`, which the doctor's own
    # processes then loaded as that folder) does not hide the net; one that holds a SavedModel is that model.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlp").mkdir()
    assert load_subject("mlp").source == "mlp" and load_subject("mlp").model is not None
    # The doctor's own processes build it the same way, at the size of the rows handed to them (they tried the
    # folder, then an import of module '' for the name).
    import keras

    from tfperf.doctor.handover import build

    np.savez(tmp_path / "data.npz", **{"x/inputs": np.zeros((2, 32, 32, 1), np.float32)}, y=np.zeros(2))
    assert build("mlp", keras, tmp_path).input_shape[1:] == (32, 32, 1)

    exported = export_subject(cookbook_subject("cnn"), tmp_path)
    runner = load(exported.path)
    assert [s.name for s in runner.inputs] == ["inputs"] and runner.outputs == ("logits", "probabilities")
    assert exported.metadata["classifier"] == "probabilities"
    y = predict(runner, {"": np.zeros((3, 28, 28, 1), np.float32)})
    np.testing.assert_allclose(y["probabilities"].sum(-1), 1.0, rtol=1e-5)
    # Dynamic-range quantization (int8 weights, float activations): checked, and it still answers.
    dynamic = export_subject(cookbook_subject("mlp"), tmp_path, format="litert", quantize="dynamic")
    assert dynamic.metadata["quantization"] == "dynamic" and dynamic.metadata["agreement"]["top_class_agreement"] > 0.5
    assert predict(load(dynamic.path), {"inputs": np.ones((2, 512), np.float32)})["probabilities"].shape == (2, 2)


def test_cli_smoke(tmp_path):
    """Each deployment command once as a user runs it: a process of its own, from a fresh interpreter."""
    tfperf_ = [sys.executable, "-m", "tfperf"]
    exported = run([*tfperf_, "export", "mlp", "--root", tmp_path / "saved_models", "--format", "onnx"]).stdout
    path = exported.splitlines()[0]
    assert path.endswith("saved_models/mlp/1") and "checked against the model on 16 rows of synthetic" in exported
    np.save(tmp_path / "x.npy", np.ones((2, 512), np.float32))
    assert "predicted classes:" in run([*tfperf_, "predict", path, "--input", tmp_path / "x.npy"]).stdout
    assert "safe: the runtime's standard operators" in run([*tfperf_, "inspect", path]).stdout


def test_a_legacy_h5_file_exports_and_predicts(tmp_path):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.save(tmp_path / "legacy.h5")  # Keras 2's format, still what many models ship in
    x = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = tfperf("export", tmp_path / "legacy.h5", "--root", tmp_path / "saved_models", "--format", "onnx",
                            "--sample", tmp_path / "x.npy")
    assert code == 0 and "top class the same as the model's on 100% of rows" in out, err
    code, out, err = tfperf("predict", out.splitlines()[0], "--input", tmp_path / "x.npy")
    assert code == 0 and "predicted classes: " + " ".join(map(str, model(x).numpy().argmax(-1))) in out, err


def test_the_varying_layer_probe_takes_a_name_the_model_does_not_hold():
    """EfficientNetB0 (weights=None) has a layer named "rescaling", the name Keras gives a new Rescaling: the probe
    of a model whose outputs do not vary scaled its layer under that name, and `tfperf serve` on the model died in
    a traceback ("The name "rescaling" is used 2 times")."""
    from tfperf.deploy.layout import varying_layer

    x = keras.Input((4,), name="x")
    h = keras.layers.Dense(6, name="hidden")(keras.layers.Rescaling(0.5, name="rescaling")(x))
    flat = keras.layers.Dense(3, kernel_initializer="zeros", bias_initializer="ones", name="flat")(h)
    model = keras.Model(x, flat)
    found = varying_layer(model, {"x": np.random.default_rng(0).normal(size=(8, 4)).astype("float32")})
    assert found is not None and found[0] == "hidden"
    assert "rescaling" in [layer.name for layer in found[1].layers] and found[1].layers[-1].name != "rescaling"


def test_a_check_on_constant_outputs_says_so_and_a_broken_export_is_caught_where_the_model_still_varies(
        tmp_path, monkeypatch):
    """MobileNetV2 with weights=None answers 0.1 for every class on every input, so agreeing with it proves
    nothing: the check says so and compares, instead, the last layer whose output varies. An ONNX writer that
    changes one weight after converting passes the outputs' check and fails that one."""
    import dataclasses

    import onnx
    from onnx import numpy_helper

    from tfperf.deploy import formats
    from tfperf.deploy.errors import ExportError
    from tfperf.deploy.layout import describe_check, export_subject
    from tfperf.deploy.loader import keras_subject

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)
    subject = keras_subject(model, "mobilenet", factory=None)
    exported = export_subject(subject, tmp_path / "good", format="onnx")
    lines = describe_check(exported.metadata)
    assert any("the model's outputs do not depend on these inputs; agreement is not evidence" in line
               for line in lines)
    assert any("checked instead up to layer" in line for line in lines)
    assert exported.metadata["agreement"]["outputs"]["output_0"]["varies"] < 1e-6

    def one_weight_changed(servable, folder, **options):
        written = formats.write_onnx(servable, folder, **options)
        proto = onnx.load(folder / "model.onnx")
        stem = next(n for n in proto.graph.node if n.op_type == "Conv").input[1]  # the first convolution's kernel
        weights = next(t for t in proto.graph.initializer if t.name == stem)
        values = numpy_helper.to_array(weights).copy()
        values.flat[0] += 1.0
        weights.CopyFrom(numpy_helper.from_array(values, weights.name))
        onnx.save(proto, folder / "model.onnx")
        return written

    monkeypatch.setitem(formats.FORMATS, "onnx", dataclasses.replace(formats.FORMATS["onnx"], write=one_weight_changed))
    with pytest.raises(ExportError, match="up to layer .* the onnx export disagrees with the model"):
        export_subject(subject, tmp_path / "broken", format="onnx")
    assert listing(tmp_path / "broken") == []
