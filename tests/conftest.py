"""Helpers for tests that run the recipes and the CLI as users do: as separate processes."""

import gc
import os
import subprocess
import sys
import time
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


# `make test` is one pytest run on two workers, and the tests marked whole_machine (they assert on what the cores do,
# which another worker's load would change) run in it alone, last: they form one xdist group, which the scheduler
# hands out after every other unit of work, and their first test waits until the other workers have finished.
# (A second pytest run for them collected the suite again: 8 s of importing TensorFlow.)
ALONE = "whole_machine"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns xdist_group marks into scheduling units
def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "loadgroup", False):  # set by xdist in its workers for --dist loadgroup
        for item in items:
            if item.get_closest_marker(ALONE):
                item.add_marker(pytest.mark.xdist_group(ALONE))
        # The tests of no group that are marked slow are handed out before the quick ones (the scheduler keeps the
        # collection's order, groups first): the run then ends on quick tests, and the worker that runs out of work
        # first waits less for the other before the whole_machine tests (it waited 29 s for a 20 s test).
        items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None
                   and item.get_closest_marker("slow") is None)


@pytest.hookimpl(hookwrapper=True, specname="pytest_collection_modifyitems")  # after xdist's, which names units
def pytest_whole_machine_as_one_unit(config, items):  # pytest reads only names that begin "pytest_"
    """A whole_machine test in a module of its own group (test_hostile's "hostile") joins the one whole_machine
    group: xdist names an item's unit by all its groups ("@hostile_whole_machine"), and two units that each wait for
    the other workers to finish, handed to two workers, waited an hour each in CI."""
    yield
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if item.get_closest_marker(ALONE):
                item._nodeid = f"{item.nodeid.partition('@')[0]}@{ALONE}"  # xdist's own way of naming the unit


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """The objects collecting made (TensorFlow's and Keras' modules: 400,000) leave the garbage collector's view:
    each full collection in a worker walked them all again (9.0 of 184 CPU-s in three modules' tests; 5.2 without)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup, with the whole_machine group handed out last."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class AloneLast(LoadGroupScheduling):
        def _assign_work_unit(self, node):
            if ALONE in self.workqueue and len(self.workqueue) > 1:
                self.workqueue.move_to_end(ALONE)
            super()._assign_work_unit(node)

    return AloneLast(config, log)


def finished_folder(config) -> Path:
    """Where this run's workers say they have finished: the run's temporary folder, which holds each worker's own
    (xdist gives each worker basetemp/popen-gwN) and which pytest removes with its older runs'."""
    return Path(config.option.basetemp).parent


@pytest.hookimpl(trylast=True)  # after pytest's own, which tears down the session's fixtures (Chromium, servers)
def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        (finished_folder(session.config) / f"{session.config.workerinput['workerid']}.finished").touch()


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up: a module's fixtures may measure too
def pytest_runtest_setup(item):
    """A whole_machine test on a worker starts once the run's other workers have finished their tests."""
    config = item.config
    if not hasattr(config, "workerinput") or item.get_closest_marker(ALONE) is None:
        return
    me, count = config.workerinput["workerid"], config.workerinput["workercount"]
    others = [f"gw{i}" for i in range(count) if f"gw{i}" != me]
    deadline = time.monotonic() + 3600
    while not all((finished_folder(config) / f"{other}.finished").exists() for other in others):
        if time.monotonic() > deadline:
            pytest.fail(f"the other workers ({', '.join(others)}) did not finish within an hour")
        time.sleep(0.5)


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
