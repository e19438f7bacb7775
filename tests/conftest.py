"""Helpers for tests that run the recipes and the CLI as users do: as separate processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(args, *, timeout=600, cwd=REPO, check=True, **kwargs):
    """Run a command with this interpreter's environment first on PATH (horovodrun starts `python`)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "TF_CPP_MIN_LOG_LEVEL": "2",
           **kwargs.pop("env", {})}
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                             f"\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(autouse=True, scope="session")
def eager_soft_placement():
    """TensorFlow sets soft placement once, when its context first starts, to whether it is executing eagerly:
    a worker whose first op ran inside a graph (a conversion, a trace) had it off for good, and the tests that
    fake a GPU then failed by the order the tests ran in. Eager TensorFlow's default, said before any test."""
    import tensorflow as tf

    tf.config.set_soft_device_placement(True)


def varying_outputs(model, x):
    """`model` with each BatchNormalization's moving statistics taken from the batch `x`, as training leaves
    them: a Keras Applications model built with weights=None (MobileNetV2) otherwise answers the same for
    every input, so that agreement with it proves nothing and every export of it is checked a second time
    on a probe model (tfperf.deploy.layout.probe_check). Returns the model."""
    import keras

    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0  # the moving statistics become this batch's own
    model(x, training=True)
    for layer, momentum in zip(norms, momenta):
        layer.momentum = momentum
    return model


def recipe(name):
    """The path of a recipe script."""
    return REPO / "recipes" / f"{name}.py"


@pytest.fixture
def tfperf_cli():
    """Run `python -m tfperf ...`."""
    return lambda *args, **kw: run([sys.executable, "-m", "tfperf", *args], **kw)


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session's pages (`make test` installs Debian's chromium-headless-shell;
    without it the page tests are skipped on a developer's machine and fail in CI)."""
    from browser import Browser, executable

    exe = executable()
    if exe is None:
        message = "no headless Chromium on PATH: `make test` installs it (scripts/install_browser.sh)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    opened = Browser(exe)
    yield opened
    opened.close()
