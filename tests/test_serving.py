"""Export, reload in another process, inspect, and refuse bad input without changing anything on disk."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import BIN, run
from tfperf.models import get_net
from tfperf.serving import ExportError, export, next_version, serving_function


def listing(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    net = get_net("cnn")
    x = np.random.default_rng(0).random((5, 28, 28, 1), dtype=np.float32)
    path = export(net, root / "saved_models", name="cnn", metadata={"training": {"test_accuracy": 0.9}})
    np.save(root / "x.npy", x)
    return {"root": root, "path": path, "x": x, "probs": tf.nn.softmax(net(x)).numpy()}


def test_layout_metadata_and_signature(exported):
    path = exported["path"]
    assert path.name == "1" and path.parent.name == "cnn"
    assert (path / "saved_model.pb").exists() and (path / "variables").is_dir()
    meta = json.loads((path / "tfperf.json").read_text())
    assert meta["inputs"]["inputs"]["shape"] == [None, 28, 28, 1]
    assert meta["training"]["test_accuracy"] == 0.9 and meta["tensorflow"] == tf.__version__
    shown = run([BIN / "saved_model_cli", "show", "--dir", path, "--all"]).stdout
    assert "signature_def['serving_default']" in shown and "shape: (-1, 28, 28, 1)" in shown
    assert "outputs['probabilities']" in shown


def test_reload_in_a_fresh_process_matches_the_keras_model(exported):
    out = exported["root"] / "y.npy"
    run([sys.executable, "-m", "tfperf", "predict", exported["path"], "--input", exported["root"] / "x.npy",
         "--output", out])
    np.testing.assert_allclose(np.load(out), exported["probs"], rtol=1e-5, atol=1e-6)


def test_serving_function_does_not_retrace_across_batch_sizes():
    fn = tf.function(serving_function(get_net("mlp")),
                     input_signature=[tf.TensorSpec([None, 512], tf.float32)])
    for n in (1, 7, 64):
        fn(tf.zeros([n, 512]))
    assert fn.experimental_get_tracing_count() == 1


def test_versions_are_never_overwritten(exported, tmp_path):
    root = tmp_path / "saved_models"
    net = get_net("mlp")
    first = export(net, root, name="m")
    before = listing(root)
    with pytest.raises(ExportError, match="next free version is 2"):
        export(net, root, name="m", version=1)
    assert listing(root) == before
    assert export(net, root, name="m").name == "2" and next_version(root / "m") == 3
    assert first.exists()


def test_a_failed_export_leaves_nothing(tmp_path, monkeypatch):
    import keras

    def crash(self, *a, **k):
        raise OSError("disk full")

    # ExportArchive() dispatches to a backend's subclass: patch the class actually used.
    monkeypatch.setattr(type(keras.export.ExportArchive()), "write_out", crash)
    with pytest.raises(OSError):
        export(get_net("mlp"), tmp_path, name="m")
    assert list(tmp_path.iterdir()) == []  # no version, no staging folder, no empty name folder


@pytest.mark.parametrize("case", ["shape", "dtype", "pickle", "not-npy", "forged-header", "missing-input",
                                  "missing-model", "not-a-savedmodel", "corrupt"])
def test_predict_refuses_bad_input_in_one_line(exported, tmp_path, case):
    model, x = exported["path"], tmp_path / "x.npy"
    np.save(x, exported["x"])
    if case == "shape":
        np.save(x, exported["x"][:, :27])
    elif case == "dtype":
        np.save(x, np.array([["a"] * 28] * 28))
    elif case == "pickle":
        np.save(x, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif case == "not-npy":
        x.write_text("1,2,3\n")
    elif case == "forged-header":  # claims 191 GiB, holds 16 bytes: must be refused before allocating
        with x.open("wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 30, 48)})
            f.write(b"\x00" * 16)
    elif case == "missing-input":
        x = tmp_path / "nope.npy"
    elif case == "missing-model":
        model = tmp_path / "no-model"
    elif case == "not-a-savedmodel":
        model = exported["path"].parent  # the name folder, not a version
    elif case == "corrupt":
        model = tmp_path / "broken"
        model.mkdir()
        (model / "saved_model.pb").write_bytes(b"\x00garbage\xff" * 10)
    before = listing(exported["root"])
    proc = run([sys.executable, "-m", "tfperf", "predict", model, "--input", x], check=False)
    err = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and err.startswith("tfperf predict: error:")
    expected = {"shape": "float32[None, 28, 28, 1]", "dtype": "not numbers", "pickle": "holds Python objects",
                "not-npy": "cannot read", "forged-header": "(206,158,430,208 bytes), but the file holds 16 bytes",
                "missing-input": "no such input file", "missing-model": "no model at",
                "not-a-savedmodel": "holds versions [1]", "corrupt": "saved_model.pb is corrupt"}[case]
    assert expected in err
    assert listing(exported["root"]) == before


def test_predict_counts_inputs_that_are_not_finite(exported, tmp_path):
    x = exported["x"].copy()
    x[0, 0, 0, 0], x[-1, 3, 3, 0], x[-1, 4, 4, 0] = np.nan, np.inf, -np.inf
    np.save(tmp_path / "x.npy", x)
    proc = run([sys.executable, "-m", "tfperf", "predict", exported["path"], "--input", tmp_path / "x.npy"])
    assert f"warning: 3 of {x.size} input values are NaN or infinite" in proc.stderr
    assert "predicted classes:" in proc.stdout  # the run itself goes on: the warning says what to distrust
    np.save(tmp_path / "clean.npy", exported["x"])
    clean = run([sys.executable, "-m", "tfperf", "predict", exported["path"], "--input", tmp_path / "clean.npy"])
    assert "warning" not in clean.stderr


@pytest.mark.parametrize("argv, message", [
    (["export", "--model", "vgg"], "invalid choice: 'vgg'"),
    (["export", "--version", "0"], "must be a positive integer"),
    (["export", "--version", "-2"], "must be a positive integer"),
    (["export", "--weights", "missing-ckpt"], "no checkpoint at missing-ckpt"),
    (["train", "--dataset", "imagenet"], "invalid choice: 'imagenet'"),
    (["train", "--steps", "0"], "must be a positive integer"),
])
def test_cli_refuses_bad_arguments_in_one_line(tmp_path, argv, message):
    proc = run([sys.executable, "-m", "tfperf", *argv], check=False, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


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


def test_inspect_passes_every_export_the_cookbook_makes(exported, tmp_path):
    from tfperf.inspection import inspect_saved_model

    proc = run([sys.executable, "-m", "tfperf", "inspect", exported["path"]])
    assert "input  inputs: float32[None, 28, 28, 1]" in proc.stdout and "safe: every op" in proc.stdout
    assert "Conv2D" in proc.stdout
    for name in ("mlp", "lenet", "resnet18"):  # cnn above; the recipes and `tfperf train --export` use these
        report = inspect_saved_model(export(get_net(name), tmp_path, name=name))
        assert report.safe, (name, report.flagged)


@pytest.mark.parametrize("fmt", ["litert", "onnx"])
def test_inspect_passes_every_file_export_the_cookbook_makes(tmp_path, fmt):
    from tfperf.inspection import inspect_model

    for name in ("mlp", "cnn", "lenet", "resnet18"):
        report = inspect_model(export(get_net(name), tmp_path, name=name, format=fmt))
        assert report.safe and report.format == fmt and report.op_types, (name, report.flagged)


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_inspect_flags_every_op_off_the_allowlist(tmp_path, kind):
    from tfperf.inspection import NOT_REVIEWED, inspect_saved_model

    report = inspect_saved_model(hostile(kind, tmp_path))
    assert not report.safe and HOSTILE[kind] in report.flagged, report.flagged
    assert (report.flagged[HOSTILE[kind]] == NOT_REVIEWED) == (kind == "op not reviewed")


def test_inspect_and_predict_refuse_an_unsafe_model_unless_trusted(tmp_path):
    model = hostile("write file", tmp_path)
    proc = run([sys.executable, "-m", "tfperf", "inspect", model], check=False)
    assert proc.returncode == 1 and "NOT SAFE" in proc.stdout and "WriteFile: touches the file system" in proc.stdout
    np.save(tmp_path / "x.npy", np.ones(3, np.float32))
    proc = run([sys.executable, "-m", "tfperf", "predict", model, "--input", tmp_path / "x.npy"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "WriteFile" in proc.stderr.strip().splitlines()[-1] and "--trust" in proc.stderr
    assert not (tmp_path / "never.txt").exists()  # refused before anything ran


def test_the_allowlist_names_real_op_types():
    from tfperf.inspection import ALLOWED_OPS, RISKY_OPS

    real = set(dir(tf.raw_ops))
    assert ALLOWED_OPS <= real and set(RISKY_OPS) <= real and not ALLOWED_OPS & set(RISKY_OPS)


def test_an_export_cleans_the_staging_folders_killed_exports_left(tmp_path):
    import socket

    from tfperf.serving import STALE_AFTER_S

    root = tmp_path / "saved_models" / "m"
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
    path = export(get_net("mlp"), tmp_path / "saved_models", name="m")
    assert path.name == "1"
    assert sorted(p.name for p in root.iterdir()) == sorted(["1", running.name, elsewhere.name])
