"""What a figure depends on: versions, CPU and its load, cores, GPUs, threads, variables, the checkout."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from tfperf import __version__


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


def usable_cores() -> int | None:
    """The cores this process may run on (its CPU affinity: `taskset` and container limits narrow it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: a busy machine explains slow or noisy figures."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def cpu_times() -> tuple[int, int] | None:
    """(stolen, total) CPU time of the whole machine since boot, in clock ticks, from Linux's /proc/stat; None
    where it has none. Stolen time is what a hypervisor gave other guests while this one had work to run."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is counted in user already
    return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None


def stolen_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time stolen by its hypervisor between two `cpu_times` readings, or None.
    On a shared host a neighbour's burst slows every figure taken meanwhile, and no interval within a run sees it."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


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


def horovod_operations() -> dict[str, bool] | None:
    """The collective backends the loaded Horovod was built with (NCCL for GPU all-reduce, Gloo, MPI), or
    None when this process has not loaded it."""
    import sys

    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return None
    return {"nccl": bool(hvd.nccl_built()), "gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built())}


def package_version(name: str) -> str | None:
    """An installed package's version, read from its metadata (nothing is imported), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What a figure depends on: versions, CPU and its load, cores, GPUs, XLA, threads, variables, checkout.

    Versions come from the packages' metadata. TensorFlow's and Keras' runtime settings (GPUs, thread
    pools, XLA, the dtype policy) are read only in a process that has loaded them: one that never
    imported TensorFlow ran nothing on it, and importing it here would cost seconds and settle its
    devices for the caller."""
    import sys

    found = {
        "tfperf": __version__,
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "python": platform.python_version(),
        "tensorflow": package_version("tensorflow"),
        "keras": package_version("keras"),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "tf_xla_flags": os.environ.get("TF_XLA_FLAGS"),
        "load_average": load_average(),
        "cpu_frequency": cpu_frequency(),
        "variables": relevant_variables(),
    }
    if "tensorflow" in sys.modules:
        from tfperf import gpus

        tf = sys.modules["tensorflow"]
        driver = gpus.driver_gpus()
        tensorflow_gpus = gpus.tensorflow_gpus(driver)
        found.update({
            "tensorflow": tf.__version__,
            "gpus": [g.name for g in tensorflow_gpus],
            "gpu": gpus.diagnosis(driver, tensorflow_gpus, horovod_ops=horovod_operations(),
                                  memory_growth=os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH") == "true",
                                  tf32_enabled=bool(tf.config.experimental.tensor_float_32_execution_enabled())),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "xla_auto_jit": tf.config.optimizer.get_jit() or None,
        })
    if "keras" in sys.modules:
        keras = sys.modules["keras"]
        found.update({"keras": keras.__version__, "dtype_policy": keras.config.dtype_policy().name})
    return found
