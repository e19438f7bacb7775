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
    assert list((tmp_path / "m").iterdir()) == []  # no version, no staging folder


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
                "not-npy": "cannot read", "forged-header": "(206,158,430,208 bytes), but the file holds 16 bytes", "missing-input": "no such input file", "missing-model": "no model at",
                "not-a-savedmodel": "holds versions [1]", "corrupt": "not a loadable SavedModel"}[case]
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


class WritesFiles(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def serve(self, x):
        tf.io.write_file("/tmp/tfperf-should-never-exist.txt", tf.strings.as_string(tf.reduce_sum(x)))
        return {"y": x * 2.0}


class RunsPython(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def serve(self, x):
        return {"y": tf.py_function(lambda t: t * 2.0, [x], tf.float32)}


def test_inspect_passes_a_clean_export(exported):
    proc = run([sys.executable, "-m", "tfperf", "inspect", exported["path"]])
    assert "input  inputs: float32[None, 28, 28, 1]" in proc.stdout and "no risky ops" in proc.stdout
    assert "Conv2D" in proc.stdout


@pytest.mark.parametrize("module, op", [(WritesFiles, "WriteFile"), (RunsPython, "EagerPyFunc")])
def test_inspect_flags_ops_that_act_outside_the_computation(tmp_path, module, op):
    m = module()
    tf.saved_model.save(m, str(tmp_path / "m"), signatures={"serving_default": m.serve})
    proc = run([sys.executable, "-m", "tfperf", "inspect", tmp_path / "m"], check=False)
    assert proc.returncode == 1
    assert "RISKY" in proc.stdout and op in proc.stdout


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
