"""The optional parts of tfperf: which are installed, and the one line that names the extra bringing a missing one.

`pip install tfperf` brings what `doctor`, `export`, `predict`, `inspect`, `compare` and `train` need; the rest
comes as extras named for what they enable (pyproject.toml lists them): `tfperf[onnx]`, `tfperf[serve]`, ...
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from importlib import metadata

from tfperf.flags import UserError

# The top-level module an extra brings -> (the extra, what the module is to a reader).
EXTRAS: dict[str, tuple[str, str]] = {
    "tf2onnx": ("onnx", "tf2onnx"),
    "onnx": ("onnx", "ONNX"),
    "onnxruntime": ("onnx", "ONNX Runtime"),
    "ai_edge_litert": ("litert", "the LiteRT interpreter (ai-edge-litert)"),
    "xprof": ("profile", "XProf"),
    "matplotlib": ("report", "matplotlib"),
    "markdown": ("report", "Python-Markdown"),
    "mlperf_loadgen": ("loadgen", "MLPerf LoadGen"),
    "aiohttp": ("serve", "aiohttp"),
    "grpc": ("serve", "gRPC"),
    "prometheus_client": ("serve", "the Prometheus client"),
    "tensorflow_serving": ("serve", "TF Serving's API"),
    "tritonclient": ("serve", "tritonclient"),
    "jax": ("jax", "JAX"),
    "tf_keras": ("keras2", "Keras 2 (tf_keras)"),
}
# The modules each extra must bring for its commands to run.
NEEDS: dict[str, tuple[str, ...]] = {
    extra: tuple(m for m, (e, _) in EXTRAS.items() if e == extra) for extra, _ in EXTRAS.values()}

# Horovod is no extra: 0.28.1 does not build against recent TensorFlow as published.
HOROVOD = ("Horovod is not installed: it is built from source against your TensorFlow by scripts/install_horovod.sh "
           "in tfperf's repository (docs: Horovod)")


# Packages released with each TensorFlow minor, each requiring that TensorFlow.
FOLLOW_TENSORFLOW = ("tensorflow-serving-api", "tf-keras")


class MissingExtra(UserError):
    """An optional part that is not installed: one line naming the extra to install (exit 2 in the CLI)."""


def _version(distribution: str) -> str | None:
    """An installed distribution's version, or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def installed(module: str) -> bool:
    """Whether a top-level module can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(extra: str) -> list[str]:
    """The modules of `extra` that are not installed here."""
    return [m for m in NEEDS[extra] if not installed(m)]


def install_line(extra: str) -> str:
    """The command that installs an extra's packages into the environment tfperf runs in, read from the installed
    distribution's own metadata (tfperf is installed from a clone or a wheel, so `tfperf[extra]` names no index)."""
    declared = (metadata.requires("tfperf") or []) if _version("tfperf") else []  # None: a source tree
    specs = [r.split(";")[0].strip() for r in declared if re.search(rf"extra\s*==\s*['\"]{extra}['\"]", r)]
    if not specs:
        return f"pip install 'tfperf[{extra}]'"
    # These release with TensorFlow and require their own version of it: the newest would upgrade the user's TF.
    tf = _version("tensorflow")
    if tf:
        minor = ".".join(tf.split(".")[:2])
        specs = [f"{name}=={minor}.*" if (name := re.split(r"[<>=\[]", s)[0]) in FOLLOW_TENSORFLOW else s
                 for s in specs]
    return f"pip install {' '.join(shlex.quote(s) for s in specs)} (tfperf's [{extra}] extra)"


def message(module: str, needed_for: str | None = None) -> str | None:
    """The one line for a missing module of an extra ("ONNX export needs ONNX Runtime, not installed here: pip
    install 'tfperf[onnx]'"), or None when the module belongs to no extra."""
    top = module.split(".")[0]
    if top == "horovod":
        return HOROVOD
    if top not in EXTRAS:
        return None
    extra, what = EXTRAS[top]
    return f"{needed_for or 'this'} needs {what}, which is not installed here: {install_line(extra)}"


def explain(exc: BaseException, needed_for: str | None = None) -> str | None:
    """The one line for an ImportError raised because an extra is missing, or None for any other error."""
    if isinstance(exc, MissingExtra):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return message(exc.name, needed_for)
    return None


def require(extra: str, needed_for: str) -> None:
    """Raise MissingExtra, before any work starts, when a module of `extra` is not installed."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(message(absent[0], needed_for))
