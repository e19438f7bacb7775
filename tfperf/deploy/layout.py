"""Exports in the TF Serving layout (atomic, never overwriting) in any format, reload, and checked predict."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfperf import __version__
from tfperf.deploy.formats import (FORMATS, INPUT_NAME, OUTPUT_NAMES, SIGNATURE, ExportError, InputError, ModelError,
                                   Runner, TensorSpec, check_model_dir, check_options, format_of, serving_function,
                                   versions)

METADATA_FILE = "tfperf.json"
__all__ = ["ExportError", "InputError", "ModelError", "Runner", "SIGNATURE", "INPUT_NAME", "serving_function"]


# A staging folder's name says who writes it: .<version>.partial-<host>-<pid>-<random>.
STAGING = re.compile(r"^\.\d+\.partial-(?P<host>.+)-(?P<pid>\d+)-[A-Za-z0-9_]+$")
STALE_AFTER_S = 24 * 3600  # a staging folder of another host (shared storage) is left alone this long


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def clean_stale_staging(model_root: Path | str) -> list[Path]:
    """Remove staging folders that exports killed mid-write left behind; the removed folders.

    A folder is stale when its writer, named in its name, is no longer running on this host, or when
    it is older than a day (another host's, or named before writers were). A running export's folder
    is never touched.
    """
    root = Path(model_root)
    if not root.is_dir():
        return []
    removed = []
    for folder in root.iterdir():
        if not (folder.is_dir() and folder.name.startswith(".") and ".partial-" in folder.name):
            continue
        owner = STAGING.match(folder.name)
        if owner and owner["host"] == socket.gethostname():
            stale = not _process_alive(int(owner["pid"]))
        else:
            stale = time.time() - folder.stat().st_mtime > STALE_AFTER_S
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def next_version(model_root: Path | str) -> int:
    """The version an export takes when none is asked for: one past the highest."""
    existing = versions(model_root)
    return existing[-1] + 1 if existing else 1


def read_array(path: Path | str) -> np.ndarray:
    """A .npy file as an array, checked before anything is allocated; InputError says what is wrong.

    The header's shape and dtype must fit in the bytes the file holds (a 16-byte file claiming
    191 GiB is refused, not allocated), and pickled object arrays, which could run code, are refused.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no such input file: {path}")
    fix = "save inputs with numpy.save"
    try:
        with path.open("rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"cannot read {path} as a .npy array ({exc}); {fix}") from None
    if dtype.hasobject:
        raise InputError(f"{path} holds Python objects (pickled), which could run code when read; {fix} "
                         f"on a numeric array")
    needed = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    held = path.stat().st_size - offset
    if needed > held:
        raise InputError(f"{path}: its header claims shape {list(shape)} of {dtype} ({needed:,} bytes), but the "
                         f"file holds {held:,} bytes after the header; it is truncated or forged: {fix}")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"cannot read {path} as a .npy array ({exc}); {fix}") from None


def non_finite(x: np.ndarray) -> int:
    """How many values of a numeric array are NaN or infinite."""
    return int(x.size - np.count_nonzero(np.isfinite(x))) if x.dtype.kind in "fc" else 0


def export(
    model,
    root: Path | str = "saved_models",
    *,
    name: str | None = None,
    version: int | None = None,
    format: str = "savedmodel",
    quantize: str = "none",
    representative: np.ndarray | None = None,
    select_tf_ops: bool = False,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write root/<name>/<version>/ atomically in `format`; an existing version is an error naming a free one.

    Args:
      quantize: LiteRT only: none, dynamic (int8 weights) or int8 (weights and activations).
      representative: input rows that int8 quantization calibrates its ranges on.
      select_tf_ops: LiteRT only: run ops LiteRT lacks as TensorFlow ops (needs the Flex delegate).
    """
    import keras
    import tensorflow as tf

    check_options(format, quantize, select_tf_ops, representative)
    name = name or model.name
    if not name or name.startswith(".") or os.sep in name or (os.altsep and os.altsep in name):
        raise ExportError(f"invalid export name {name!r}: use a plain folder name such as 'mnist-cnn'")
    if version is not None and version < 1:
        raise ExportError(f"version must be a positive integer (TF Serving's layout), got {version}")
    model_root = Path(root) / name
    version = version or next_version(model_root)
    final = model_root / str(version)
    if final.exists():
        raise ExportError(f"{final} exists and is never overwritten; the next free version is "
                          f"{next_version(model_root)} (--version {next_version(model_root)}, or leave it out)")
    made_root = not Path(root).exists()
    model_root.mkdir(parents=True, exist_ok=True)
    clean_stale_staging(model_root)
    input_shape = tuple(model.input_shape[1:])
    options = {"quantize": quantize, "representative": representative}
    if select_tf_ops:
        options["select_tf_ops"] = True
    # Written beside the target, then renamed: readers and TF Serving see a whole version or none.
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.partial-{socket.gethostname()}-{os.getpid()}-",
                                    dir=model_root))
    try:
        written = FORMATS[format].write(model, staging, **options)
        meta = {
            "name": name,
            "version": version,
            "model": model.name,
            "format": format,
            "signature": SIGNATURE,
            "inputs": {INPUT_NAME: {"dtype": "float32", "shape": [None, *input_shape]}},
            "outputs": {k: {"dtype": "float32", "shape": [None, int(model.output_shape[-1])]} for k in OUTPUT_NAMES},
            "tfperf": __version__,
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            **written,
            **dict(metadata or {}),
        }
        (staging / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        try:
            os.rename(staging, final)  # fails if a concurrent export took this version meanwhile
        except OSError:
            raise ExportError(f"{final} appeared while exporting; the next free version is "
                              f"{next_version(model_root)}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
        # A first export that failed leaves no empty folders behind.
        if not any(model_root.iterdir()):
            model_root.rmdir()
            if made_root and not any(Path(root).iterdir()):
                Path(root).rmdir()
    return final


def load(path: Path | str, threads: int | None = None) -> Runner:
    """An export loaded in its format's runtime (no tfperf model code needed); ModelError if unusable.

    Args:
      threads: the runtime's threads for one call (LiteRT, ONNX Runtime); None leaves its default.
    """
    path = check_model_dir(path)
    return format_of(path).load(path, threads=threads)


def check_input(x: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """`x` converted to the spec's dtype (any int or float is accepted), or an InputError naming the spec."""
    expected = f"the signature {SIGNATURE!r} takes {spec.name}: {spec}"
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "fiu":
        kind = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise InputError(f"input has dtype {kind}, not numbers; {expected}")
    want = spec.shape
    if len(x.shape) != len(want) or any(w is not None and w != d for w, d in zip(want, x.shape)):
        raise InputError(f"input has shape {list(x.shape)}; {expected}")
    if x.shape[0] == 0:
        raise InputError(f"input has no rows (shape {list(x.shape)}); {expected}")
    return np.ascontiguousarray(x, dtype=spec.dtype)


def predict(runner: Runner, x: np.ndarray) -> dict[str, np.ndarray]:
    """Run a loaded export on checked input; outputs as NumPy arrays by name."""
    return runner(check_input(x, runner.input))


def read_metadata(path: Path | str) -> dict[str, Any]:
    """The metadata tfperf wrote beside an export ({} for SavedModels made elsewhere)."""
    meta = Path(path) / METADATA_FILE
    return json.loads(meta.read_text()) if meta.is_file() else {}
