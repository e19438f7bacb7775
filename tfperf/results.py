"""Measurement records: one JSON object a line, each carrying the environment it was measured in."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tfperf import __version__

REQUIRED_KEYS = ("recipe", "table", "row", "primary", "lower_is_better", "metrics", "args", "env")


def cpu_model() -> str:
    """The CPU's marketing name, from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(path: Path | None = None) -> str | None:
    """The commit of the checkout holding `path` (this package by default), or None."""
    where = path or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment() -> dict[str, Any]:
    """What a figure depends on: versions, CPU, cores, GPUs, XLA and thread settings."""
    import keras
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return {
        "tfperf": __version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpus": [tf.config.experimental.get_device_details(g).get("device_name", g.name) for g in gpus],
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "xla_auto_jit": tf.config.optimizer.get_jit() or None,
        "tf_xla_flags": os.environ.get("TF_XLA_FLAGS"),
        "dtype_policy": keras.config.dtype_policy().name,
    }


def make_record(
    recipe: str,
    table: str,
    row: str,
    metrics: Mapping[str, Any],
    *,
    primary: str,
    lower_is_better: bool,
    args: Mapping[str, Any] | None = None,
    env: Mapping[str, Any] | None = None,
    versus_first: bool = True,
) -> dict[str, Any]:
    """One row of a recipe's table; `primary` names the metric that speedups and plots use.

    `versus_first=False` marks a table whose rows are not alternatives to its first row (a projection,
    a sweep of independent cases): the report then gives it no speedup column.
    """
    if primary not in metrics:
        raise ValueError(f"primary metric {primary!r} is not among the metrics {sorted(metrics)}")
    return {
        "recipe": recipe,
        "table": table,
        "row": row,
        "primary": primary,
        "lower_is_better": lower_is_better,
        "versus_first": versus_first,
        "metrics": dict(metrics),
        "args": dict(args or {}),
        "env": dict(env) if env is not None else environment(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def atomic_write_text(path: Path | str, text: str) -> None:
    """Write a text file so that readers see the old content or the new, never half of it."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write a file so that readers see the old content or the new, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_records(path: Path | str, records: Iterable[Mapping[str, Any]]) -> Path:
    """Replace `path` with these records, one JSON object a line."""
    lines = [json.dumps(r, sort_keys=True, default=_jsonable) for r in records]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return Path(path)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, Path) or hasattr(value, "as_numpy_dtype"):  # paths, tf.DType
        return str(value)
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"cannot record a {type(value).__name__} as JSON")


def read_records(path: Path | str) -> list[dict[str, Any]]:
    """Read records back, with a clear error naming the file and line if one is malformed."""
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not a JSON record ({exc.msg})") from None
        missing = [k for k in REQUIRED_KEYS if k not in record]
        if missing:
            raise ValueError(f"{path}:{number}: record lacks {', '.join(missing)}")
        records.append(record)
    return records


class Recorder:
    """Collects one recipe's records, with the environment read once, and saves them together."""

    def __init__(self, recipe: str, args: Mapping[str, Any]):
        self.recipe = recipe
        self.args = {k: v for k, v in args.items()}
        self.env = environment()
        self.records: list[dict[str, Any]] = []

    def add(self, table: str, row: str, metrics: Mapping[str, Any], *, primary: str,
            lower_is_better: bool, versus_first: bool = True) -> dict[str, Any]:
        """Record one row of `table`."""
        record = make_record(self.recipe, table, row, metrics, primary=primary, lower_is_better=lower_is_better,
                             args=self.args, env=self.env, versus_first=versus_first)
        self.records.append(record)
        return record

    def table(self, table: str) -> list[dict[str, Any]]:
        """The rows of one table, in the order added."""
        return [r for r in self.records if r["table"] == table]

    def save(self, out: Path | str) -> Path:
        """Replace out/<recipe>.jsonl with this run's records."""
        return write_records(Path(out) / f"{self.recipe}.jsonl", self.records)
