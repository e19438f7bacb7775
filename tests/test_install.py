"""tfperf as a user installs it: the wheel, built once, in fresh virtual environments that share nothing with
.venv, beside the highest TensorFlow supported (the one requirements.txt pins) and the lowest (every core
dependency at its lower bound); the console script runs there on a model that a user's script saved outside the
repository. uv's cache holds the wheels after the first run, so an environment costs a few seconds to make."""

import json
import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

# The lower bounds pyproject.toml declares, installed together: the oldest environment tfperf promises to run in.
LOWEST = ["tensorflow==2.16.2", "keras==3.6.0", "numpy==1.26.4", "scipy==1.11.4", "psutil==5.9.8"]
HIGHEST = [re.search(r"^tensorflow==\S+", (REPO / "requirements.txt").read_text(), re.M)[0]]

USER_SCRIPT = '''
"""A user's script: a small CNN saved as a .keras file, and a few inputs for it."""
import keras
import numpy as np

inputs = keras.Input((28, 28, 1), name="image")
x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
x = keras.layers.MaxPooling2D()(x)
x = keras.layers.Flatten()(x)
keras.Model(inputs, keras.layers.Dense(10, name="logits")(x)).save("small.keras")
np.savez("rows.npz", image=np.random.default_rng(0).normal(size=(3, 28, 28, 1)).astype("float32"))
'''


# Several commands through the console script's own entry point (tfperf.cli:main) in one interpreter: each
# command line is a JSON list in argv; what each printed comes back, split by NUL. A second each saved.
IN_ONE_INTERPRETER = """
import contextlib, io, json, sys
from tfperf.cli import main
texts = []
for argv in map(json.loads, sys.argv[1:]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as done:
            code = done.code
    assert code in (0, None), (argv, code, out.getvalue()[-2000:])
    texts.append(out.getvalue())
print("\\0".join(texts), end="")
"""

# On one xdist worker (`make test` runs two): its module fixtures build the wheel and the fresh environments once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("install")]


def packages_in(root: Path, package: str) -> set[str]:
    """The Python packages of `package` under `root`, dotted (tfperf, tfperf.deploy, ...)."""
    return {".".join(p.parent.relative_to(root).parts) for p in (root / package).rglob("__init__.py")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    import shutil

    out = tmp_path_factory.mktemp("dist")
    # Built from a copy of the sources: setuptools writes build/ and tfperf.egg-info where it builds, and in the
    # checkout those are shared with the other worker's processes (the editable install reads that egg-info).
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "tfperf", source / "tfperf", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(out), str(source)], capture_output=True, text=True, cwd=out)
    assert built.returncode == 0, built.stderr[-3000:]
    return next(out.glob("tfperf-*.whl"))


class Env:
    """A fresh virtual environment (no system site-packages, nothing of .venv) with the wheel installed: by uv,
    which lays TensorFlow out from its cache in a second or two where pip unpacks it anew (40 s on a quiet
    machine), and the extras a user adds later the same way ([onnx,report]: 1.4 s, where pip took 11 s): the
    same requirements, resolved from the wheel's metadata as `pip install 'tfperf[onnx]'` resolves them."""

    def __init__(self, folder: Path, wheel: Path, pins: list[str]):
        self.folder, self.wheel = folder, wheel
        venv.create(folder)  # no pip of its own: uv installs (ensurepip took 6 s of CPU per environment)
        self.python = folder / "bin" / "python"
        self.pip(str(wheel), *pins)

    def pip(self, *args: str) -> None:
        """`pip install ARGS` into this environment, through uv."""
        proc = subprocess.run([str(Path(sys.executable).parent / "uv"), "pip", "install", "-q", "--python",
                               str(self.python), *args], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]

    def user_environment(self) -> dict[str, str]:
        """The variables a user's shell would have with this environment active (PATH: that env only)."""
        # Nothing of the suite's own: no PYTHONPATH or VIRTUAL_ENV, and no PYTHONDONTWRITEBYTECODE (set in some
        # container images, this machine's): pip compiles a user's packages to bytecode as it installs them and uv
        # does not, so without it every interpreter here compiled TensorFlow's sources again (12 s of CPU a start
        # against 5.5 s; this file's tests 124 CPU-s against 81)
        suites_own = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
        env = {k: v for k, v in os.environ.items() if k not in suites_own}
        env.update(PATH=f"{self.folder / 'bin'}{os.pathsep}/usr/bin:/bin", TF_CPP_MIN_LOG_LEVEL="2")
        return env

    def run(self, *args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
        """`tfperf ARGS` through the environment's console script, as a user types it."""
        proc = subprocess.run([str(a) for a in args], cwd=cwd, env=self.user_environment(), capture_output=True,
                              text=True, timeout=600, stdin=subprocess.DEVNULL)
        if check:
            assert proc.returncode == 0, f"{args} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        return proc


def in_one_interpreter(env: Env, argvs: list[list[str]], cwd: Path) -> list[str]:
    """What each of these tfperf command lines printed, run in turn by one interpreter of `env`."""
    texts = env.run(env.python, "-c", IN_ONE_INTERPRETER, *map(json.dumps, argvs), cwd=cwd).stdout.split("\0")
    assert len(texts) == len(argvs), texts
    return texts


@pytest.fixture(scope="module")
def envs(wheel, tmp_path_factory) -> dict[str, Env]:
    """Both environments, made side by side (unpacking TensorFlow is most of it), by the name of their pins."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        made = {name: pool.submit(Env, tmp_path_factory.mktemp(f"env-{name}"), wheel, pins)
                for name, pins in (("highest", HIGHEST), ("lowest", LOWEST))}
        return {name: future.result() for name, future in made.items()}


def install_lines(text: str) -> list[str]:
    """The `pip install` lines of a page's bash blocks that name a clone (./tfperf, '.'), comments cut."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if re.match(r"pip install ('?\./tfperf|\.$)", line)]


def test_the_install_lines_of_the_readme_and_the_install_page_work_as_written_beside_and_inside_a_clone(tmp_path):
    """Issue 73: the README's `pip install ./tfperf  # a clone` failed inside a clone ("Directory './tfperf' is not
    installable"). Each line runs as written, from where its comment says (beside the clone, or inside it), into a
    fresh environment through uv (the suite's installer: pip's own would fetch its build backend from the network);
    '[all]' is resolved (--dry-run), not laid out."""
    import shlex
    import shutil

    lines = {line for page in ("README.md", "docs/install.md") for line in install_lines((REPO / page).read_text())}
    assert lines == {"pip install ./tfperf", "pip install .", "pip install './tfperf[all]'"}, lines
    clone = tmp_path / "tfperf"  # what `git clone URL tfperf` makes: the files a build reads
    clone.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, clone / name)
    shutil.copytree(REPO / "tfperf", clone / "tfperf", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = tmp_path / "env"
    venv.create(env)
    uv = [str(Path(sys.executable).parent / "uv"), "pip", "install", "-q", "--python", str(env / "bin" / "python")]
    for line in sorted(lines):
        where = clone if line == "pip install ." else tmp_path
        words = shlex.split(line)[2:]
        proc = subprocess.run([*uv, *(["--dry-run"] if "[all]" in line else []), *words], cwd=where,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (line, proc.stderr[-3000:])
    shown = subprocess.run([str(env / "bin" / "tfperf"), "--version"], capture_output=True, text=True, timeout=300,
                           env={"PATH": f"{env / 'bin'}{os.pathsep}/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert shown.returncode == 0 and shown.stdout.startswith("tfperf "), shown.stderr[-2000:]
    beside = subprocess.run([*uv, "./tfperf"], cwd=clone, capture_output=True, text=True, timeout=300)
    assert beside.returncode != 0  # what the README said before: ./tfperf from inside the clone is not a project


def test_the_wheel_holds_every_subpackage_and_declares_its_dependencies(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    held = {".".join(Path(n).parent.parts) for n in names if n.endswith("/__init__.py")}
    assert held == packages_in(REPO, "tfperf") and "tfperf.deploy" in held
    assert {"tfperf/datasets/mnist_5k.npz", "tfperf/datasets/digits.npz"} <= set(names)  # offline data, no extra
    assert "tfperf/watch/boot/sitecustomize.py" in names  # what `tfperf watch` puts on a program's path
    required = re.findall(r"^Requires-Dist: ([\w-]+)[^;\n]*$", metadata, re.M)
    assert {"tensorflow", "keras", "numpy", "scipy", "psutil"} == set(required)
    assert {"onnx", "litert", "serve", "report", "loadgen", "profile", "jax", "all"} <= set(
        re.findall(r"^Provides-Extra: (\S+)", metadata, re.M))


def test_a_missing_extra_is_named_with_packages_that_keep_the_users_tensorflow():
    import tensorflow as tf

    from tfperf import extras

    line = extras.install_line("serve")  # the newest TF Serving API requires the newest TensorFlow: never that
    minor = ".".join(tf.__version__.split(".")[:2])
    assert line.startswith("pip install ") and f"'tensorflow-serving-api=={minor}.*'" in line and "aiohttp" in line
    assert extras.message("onnxruntime.capi", "tfperf predict").startswith("tfperf predict needs ONNX Runtime, ")
    assert extras.message("numpy") is None and "install_horovod.sh" in extras.message("horovod.tensorflow")
    error = ModuleNotFoundError("No module named 'xprof'", name="xprof")
    assert "(tfperf's [profile] extra)" in extras.explain(error, "the profile pass")


@pytest.mark.parametrize("name", ["highest", "lowest"])
def test_the_console_script_on_a_users_model_in_a_fresh_environment(name, envs, tmp_path):
    env, pins = envs[name], {"highest": HIGHEST, "lowest": LOWEST}[name]
    user = tmp_path / "user"  # the user's folder: nothing of the repository on the path
    user.mkdir()
    subprocess.run([str(env.python), "-c", USER_SCRIPT], cwd=user, check=True, capture_output=True,
                   env=env.user_environment())
    tfperf = env.folder / "bin" / "tfperf"

    version = env.run(tfperf, "--version", cwd=user).stdout
    tf_version = pins[0].split("==")[1].rstrip("*").rstrip(".")
    assert version.startswith("tfperf ") and f"TensorFlow {tf_version}" in version and "Python 3." in version
    commands = re.search(r"\{([\w,-]+)\}", env.run(tfperf, "--help", cwd=user).stdout)[1].split(",")
    assert {"doctor", "export", "predict", "inspect", "load", "serve"} <= set(commands)
    helps = in_one_interpreter(env, [[command, "--help"] for command in commands], user)
    assert len(helps) == len(commands) and all(h.startswith("usage: tfperf ") for h in helps), helps

    # A command that needs an extra not installed: one line naming it, exit 2, nothing written.
    for argv, extra in ((["serve", "small.keras"], "serve"), (["load", "small.keras", "--quick"], "serve"),
                        (["export", "small.keras", "--format", "onnx", "--root", "exports"], "onnx")):
        refused = env.run(tfperf, *argv, cwd=user, check=False)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert f"(tfperf's [{extra}] extra)" in refused.stderr and "Traceback" not in refused.stderr
        ours = [line for line in refused.stderr.splitlines() if line.startswith("tfperf")]  # not TF's own logs
        assert len(ours) == 1 and ours[0].startswith(f"tfperf {argv[0]}: error: "), refused.stderr
    assert not (user / "exports").exists() and not (user / "load").exists()

    # Without the thread sweep's processes (25 of the doctor's 40 s here): the suite runs them in .venv.
    doctor = env.run(tfperf, "doctor", "small.keras", "--quick", "--no-threads", cwd=user)
    assert "Advice" in doctor.stdout or "none measurably faster" in doctor.stdout
    report = (user / "doctor" / "small" / "report.md").read_text()
    # The optional parts it could not use are listed with the extra that brings them, not silently left out.
    for extra in ("onnx", "litert", "profile", "report"):
        assert f"(tfperf's [{extra}] extra)" in report, extra
    # The best way to call, its code block run in a fresh process of the installed package (python -m).
    assert "**Best way to call for latency**" in report and "Not confirmed in a fresh process:" not in report

    # With the extras a user adds (on the highest TensorFlow), what was refused runs too: an ONNX export, and the
    # report's charts and HTML; in the same interpreter as the rest (a TensorFlow start saved).
    extra_commands = [["export", "small.keras", "--format", "onnx", "--root", "exports"], ["report", "doctor/small"]]
    if pins is HIGHEST:
        env.pip(f"{env.wheel}[onnx,report]")
    exported, predicted, inspected, *_ = in_one_interpreter(env, [
        ["export", "small.keras", "--root", "exports"],
        ["predict", "exports/small/1", "--input", "rows.npz", "--output", "out.npz"],
        ["inspect", "exports/small/1"], *(extra_commands if pins is HIGHEST else [])], user)
    assert "exports/small/1\n" in exported and "output_0: float32[3, 10]" in predicted
    assert "signature 'serving_default'" in inspected and (user / "out.npz").exists()
    if pins is HIGHEST:
        assert (user / "exports" / "small" / "2" / "model.onnx").exists()
        assert (user / "doctor" / "small" / "report.html").exists()
