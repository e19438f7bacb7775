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
from typing import TYPE_CHECKING, Any

from tfperf import __version__

if TYPE_CHECKING:  # both are imported only for annotations: records load without TensorFlow
    from tfperf.bench import Measurement
    from tfperf.stats import Comparison

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


def git_dirty(path: Path | None = None) -> bool | None:
    """True when the checkout holding `path` has uncommitted changes to tracked files; None outside git."""
    where = path or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: a busy machine explains slow or noisy figures."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def cpu_frequency() -> dict[str, Any]:
    """Current and maximum frequency (MHz) and the scaling governor of CPU 0, where Linux exposes them."""
    base = Path("/sys/devices/system/cpu/cpu0/cpufreq")
    found: dict[str, Any] = {}
    for key, name, scale in (("cur_mhz", "scaling_cur_freq", 1e-3), ("max_mhz", "cpuinfo_max_freq", 1e-3),
                             ("governor", "scaling_governor", None)):
        try:
            text = (base / name).read_text().strip()
        except OSError:
            continue
        found[key] = text if scale is None else round(int(text) * scale)
    if "cur_mhz" not in found:  # virtual machines often have no cpufreq: /proc/cpuinfo still says
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("cpu MHz"):
                    found["cur_mhz"] = round(float(line.split(":", 1)[1]))
                    break
        except (OSError, ValueError):
            pass
    return found


# Variables that change what TensorFlow runs: its own, oneDNN's, and the OpenMP/MKL thread settings.
ENV_PREFIXES = ("TF_", "ONEDNN_", "DNNL_", "OMP_", "KMP_", "MKL_", "XLA_", "KERAS_", "CUDA_VISIBLE")


def relevant_variables() -> dict[str, str]:
    """The environment variables that change TensorFlow's behaviour or speed, as set for this process."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def environment() -> dict[str, Any]:
    """What a figure depends on: versions, CPU and its load, cores, GPUs, XLA, threads, variables, checkout."""
    import keras
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return {
        "tfperf": __version__,
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
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
        "load_average": load_average(),
        "cpu_frequency": cpu_frequency(),
        "variables": relevant_variables(),
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
    measurement: Measurement | None = None,
    comparison: Comparison | None = None,
) -> dict[str, Any]:
    """One row of a recipe's table; `primary` names the metric that speedups and plots use.

    `versus_first=False` marks a table whose rows are not alternatives to its first row (a projection,
    a sweep of independent cases): the report then gives it no speedup column.
    A timed row passes its `measurement`: the record keeps the raw samples (`samples_s`), `n` and
    `ci95`, the primary metric's 95% interval. The primary metric must be proportional to the time
    per call (lower is better: ms per call, us per row) or to its inverse (higher is better: rows per
    second), so that the interval of the median time maps onto it. A row judged against another
    passes the `comparison` (bench.versus): `versus` names that row; `ratio` (how many times better
    this row is), `ratio_ci95` and `verdict` come with it.
    """
    if primary not in metrics:
        raise ValueError(f"primary metric {primary!r} is not among the metrics {sorted(metrics)}")
    record = {
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
    if measurement is not None:
        record.update(measured_fields(measurement, float(metrics[primary]), lower_is_better))
    if comparison is not None:
        record.update(compared_fields(comparison))
    return record


def measured_fields(m: Measurement, primary_value: float, lower_is_better: bool) -> dict[str, Any]:
    """A timed row's raw samples, their summary, and the primary metric's 95% interval."""
    low, high = m.ci95_s
    median = m.median_s
    if lower_is_better:  # the metric is proportional to the time
        ci = [primary_value * low / median, primary_value * high / median]
    else:  # to its inverse: the slow end of the time is the low end of the rate
        ci = [primary_value * median / high, primary_value * median / low]
    return {"samples_s": list(m.samples_s), "n": m.n, "ci95": ci, "timing": m.summary()}


def compared_fields(c: Comparison) -> dict[str, Any]:
    """A row judged against another: which, by how much, how sure, the verdict, and the evidence: the
    times per item both sides were judged on (the baseline re-measured beside this row, not its own
    row's samples) and the rounds that paired them, so that `stats.compare_times` can re-judge it."""
    fields = {"versus": c.baseline, "ratio": c.ratio, "ratio_ci95": list(c.ci95), "verdict": c.verdict}
    if c.samples is not None:
        fields["compared"] = {"baseline_per_item_s": list(c.samples[0]), "candidate_per_item_s": list(c.samples[1]),
                              "rounds": c.units if c.paired else None, "threshold": c.threshold}
    return fields


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
            lower_is_better: bool, versus_first: bool = True, measurement: Measurement | None = None,
            comparison: Comparison | None = None) -> dict[str, Any]:
        """Record one row of `table` (see make_record for `measurement` and `comparison`)."""
        record = make_record(self.recipe, table, row, metrics, primary=primary, lower_is_better=lower_is_better,
                             args=self.args, env=self.env, versus_first=versus_first,
                             measurement=measurement, comparison=comparison)
        self.records.append(record)
        return record

    def table(self, table: str) -> list[dict[str, Any]]:
        """The rows of one table, in the order added."""
        return [r for r in self.records if r["table"] == table]

    def save(self, out: Path | str) -> Path:
        """Replace out/<recipe>.jsonl with this run's records."""
        return write_records(Path(out) / f"{self.recipe}.jsonl", self.records)
