"""GPU decisions, each a function of what the machine reports (the GPUs TensorFlow lists, what the NVIDIA
driver sees, their compute capability and memory), so that each is tested on fake device lists: no GPU
is available where tfperf is developed (`pytest -k gpu`). Reading the machine is kept apart, in the
few functions that call TensorFlow or nvidia-smi.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence

# What TensorFlow's GPU guide gives a logical GPU when it splits one; used when the memory is unknown.
DEFAULT_LOGICAL_MB = 1024
LOGICAL_SHARE = 0.9  # of a GPU's memory handed to its logical GPUs: the rest is CUDA's own and cuDNN's
# TF32 rounds a matmul's inputs to 10 bits of mantissa (a relative error of 2**-11, about 5e-4, each); summed
# in float32 through a network's layers, outputs drift by about 1e-3 of their scale. Ten times that is a bug.
TF32_TOLERANCE = 1e-2


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as the driver or TensorFlow reports it."""

    name: str
    compute_capability: tuple[int, int] | None = None
    memory_mb: int | None = None


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """The devices a multi-device recipe spreads its work over, and how they were made."""

    kind: str  # "gpu": physical GPUs; "logical-gpu": GPUs split into logical ones; "cpu": logical CPUs
    names: tuple[str, ...]
    per_gpu: int = 1  # logical devices made from each physical GPU
    memory_limit_mb: int | None = None  # of each logical GPU
    note: str = ""


def plan_devices(count: int, gpus: Sequence[Gpu]) -> DevicePlan:
    """`count` devices: the GPUs when there are enough; fewer GPUs are each split into logical GPUs (sharing
    their compute, which shows the code path, not scaling); no GPU: `count` logical CPUs."""
    if count < 1:
        raise ValueError(f"need at least one device, got {count}")
    names = tuple(f"/{'GPU' if gpus else 'CPU'}:{i}" for i in range(count))
    if not gpus:
        return DevicePlan("cpu", names, note=f"{count} logical CPU device(s) sharing the host's cores")
    if len(gpus) >= count:
        return DevicePlan("gpu", names, note=f"{count} of the {len(gpus)} GPU(s)")
    per_gpu = math.ceil(count / len(gpus))
    memory = [g.memory_mb for g in gpus]
    limit = (int(min(memory) * LOGICAL_SHARE / per_gpu) if all(memory) else DEFAULT_LOGICAL_MB)
    return DevicePlan("logical-gpu", names, per_gpu, limit,
                      note=f"{count} logical GPUs split from {len(gpus)} GPU(s), {per_gpu} on each with {limit:,} MB: "
                           f"logical GPUs on one GPU share its compute, so this shows the code path, not scaling")


def rate_block_size(gpu: bool) -> int | str:
    """How to time a kernel for its rate: on a GPU, blocks of calls per clock read ("auto": as many as take
    100x the sync cost), or a microsecond matmul measures dispatch and sync, not the GPU; on a CPU one call
    per sample, as before."""
    return "auto" if gpu else 1


def missing_gpus(driver: Sequence[Gpu] | None, tensorflow: Sequence[Gpu]) -> str | None:
    """The one-line diagnosis when the NVIDIA driver sees GPUs that TensorFlow does not register (None when
    they agree, or when there is no driver): every op would quietly run on the CPU."""
    if not driver or tensorflow:
        return None
    names = ", ".join(sorted({g.name for g in driver}))
    return (f"nvidia-smi sees {len(driver)} GPU(s) ({names}) but TensorFlow registers none, so everything would "
            f"run on the CPU: install TensorFlow with its CUDA libraries, pip install 'tensorflow[and-cuda]==2.21.*' "
            f"(make install does this where nvidia-smi is found), then check `tfperf env`")


def mixed_policy(gpus: Sequence[Gpu]) -> str | None:
    """The Keras mixed policy the GPUs' tensor cores run: mixed_bfloat16 from compute capability 8.0 (no loss
    scaling needed), mixed_float16 from 7.0, None below (no tensor cores: mixed precision gains nothing)."""
    caps = [g.compute_capability for g in gpus]
    if not caps or any(c is None for c in caps):
        return None
    lowest = min(caps)
    if lowest >= (8, 0):
        return "mixed_bfloat16"
    return "mixed_float16" if lowest >= (7, 0) else None


def tf32_default(gpus: Sequence[Gpu]) -> bool:
    """Whether TensorFlow runs float32 matmuls and convolutions on TF32 tensor cores by default: on Ampere
    (compute capability 8.0) and newer."""
    return any(g.compute_capability is not None and g.compute_capability >= (8, 0) for g in gpus)


def tf32_in_effect(enabled: bool, gpus: Sequence[Gpu]) -> bool:
    """Whether float32 matmuls run on TF32 tensor cores: TensorFlow's setting is on (its default) and a GPU
    has them."""
    return enabled and tf32_default(gpus)


def float32_tolerance(exact: float, tf32: bool) -> tuple[float, str]:
    """How closely a TensorFlow float32 row must answer as a float32 reference does, and why: `exact` (the
    exports' bar) unless TF32 is in effect, which alone differs by more (TF32_TOLERANCE)."""
    if tf32:
        return TF32_TOLERANCE, (f"TF32 is on (TensorFlow's default on this GPU): its float32 matmuls keep 10 bits "
                                f"of mantissa, so its rows are held to {TF32_TOLERANCE:g} of the outputs' scale, "
                                f"exports to {exact:g}")
    return exact, ""


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """TensorFlow's float32 matmuls and convolutions in float32 inside the block, TF32 as it was after it:
    agreement checks hold exports to 1e-4 of the model, and TF32 (10 bits of mantissa, on by default on
    Ampere and newer) alone differs by more. Changes nothing on CPUs, which have no TF32."""
    import tensorflow as tf

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


def in_exact_float32(fn: Callable[..., object]) -> Callable[..., object]:
    """`fn`, each call made with TF32 off (see `exact_float32`): a float32 row as float32 really computes."""

    def call(*args, **kwargs):
        with exact_float32():
            return fn(*args, **kwargs)

    return call


def child_gpu_env(gpu_indices: Sequence[int] | None) -> dict[str, str]:
    """Environment for a TensorFlow process started beside others: the GPUs it may see (none: an empty
    CUDA_VISIBLE_DEVICES, for parameter servers and CPU-only sweeps) and memory growth, so that it does
    not map nearly all memory of every GPU and starve the next process."""
    visible = "" if not gpu_indices else ",".join(str(i) for i in gpu_indices)
    return {"CUDA_VISIBLE_DEVICES": visible, "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def worker_gpus(worker: int, gpu_count: int) -> list[int]:
    """The GPU of worker process `worker` on a host with `gpu_count`: one each, round-robin when workers
    outnumber GPUs; none without a GPU. One replica per worker, so that the workers' batches are the
    slices of one global batch the recipes compute (a worker with several GPUs would split its own)."""
    return [worker % gpu_count] if gpu_count else []


def ranks_per_gpu_warning(local_size: int, gpu_count: int) -> str | None:
    """A warning when more Horovod ranks than GPUs share a host: ranks then share a GPU's memory and compute."""
    if gpu_count and local_size > gpu_count:
        return (f"{local_size} ranks on this host share {gpu_count} GPU(s): each GPU serves several ranks, which "
                f"share its memory and compute; start at most {gpu_count} ranks per host "
                f"(horovodrun -H host:{gpu_count})")
    return None


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """GPUs from `nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits`."""
    found = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        name, memory = parts[0], parts[1]
        cap = None
        if len(parts) > 2 and "." in parts[2]:
            major, minor = parts[2].split(".", 1)
            cap = (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None
        found.append(Gpu(name, cap, int(float(memory)) if memory.replace(".", "").isdigit() else None))
    return found


def driver_gpus(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[Gpu] | None:
    """The GPUs the NVIDIA driver sees, by nvidia-smi; None when there is no nvidia-smi (no NVIDIA driver)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = run(["nvidia-smi", "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
                   capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []


def host_gpu_count() -> int:
    """The GPUs the driver sees on this host (0 without one), read without initialising TensorFlow."""
    return len(driver_gpus() or [])


def tensorflow_gpus(driver: Sequence[Gpu] | None = None) -> list[Gpu]:
    """The GPUs TensorFlow registers, with compute capability; memory from the driver's list when given."""
    import tensorflow as tf

    found = []
    for i, device in enumerate(tf.config.list_physical_devices("GPU")):
        details = tf.config.experimental.get_device_details(device)
        cap = details.get("compute_capability")
        memory = driver[i].memory_mb if driver and i < len(driver) else None
        found.append(Gpu(details.get("device_name", device.name), tuple(cap) if cap else None, memory))
    return found


def tf32_here() -> bool:
    """Whether TF32 is in effect in this process (see `tf32_in_effect`)."""
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return False
    return tf32_in_effect(tf.config.experimental.tensor_float_32_execution_enabled(), tensorflow_gpus())


def device_memory(device: str) -> dict[str, int] | None:
    """The bytes TensorFlow's allocator holds on a GPU now and at its peak since the last reset, e.g.
    {"current": ..., "peak": ...}; None for CPUs, whose allocator TensorFlow does not count."""
    import tensorflow as tf

    if "GPU" not in device.upper():
        return None
    try:
        return {k: int(v) for k, v in tf.config.experimental.get_memory_info(device.lstrip("/")).items()}
    except (ValueError, tf.errors.InvalidArgumentError):
        return None


def reset_peak_memory(device: str) -> None:
    """Start a GPU's peak count (see `device_memory`) from what it holds now; nothing on CPUs."""
    import tensorflow as tf

    if "GPU" in device.upper():
        tf.config.experimental.reset_memory_stats(device.lstrip("/"))


def mixed_policy_here() -> str | None:
    """The mixed policy for this machine: the GPUs' (see `mixed_policy`), or mixed_bfloat16 on a CPU."""
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return "mixed_bfloat16"
    return mixed_policy(tensorflow_gpus())


def diagnosis(driver: Sequence[Gpu] | None, tensorflow: Sequence[Gpu], *, horovod_ops: Mapping[str, bool] | None = None,
              memory_growth: bool | None = None, tf32_enabled: bool | None = None) -> dict:
    """What `tfperf env` prints and records carry about GPUs."""
    return {
        "driver_gpus": None if driver is None else [g.name for g in driver],
        "tensorflow_gpus": [g.name for g in tensorflow],
        "compute_capability": [".".join(map(str, g.compute_capability)) if g.compute_capability else None
                               for g in tensorflow],
        "tf32_by_default": tf32_default(tensorflow),
        "tf32_enabled": tf32_enabled,
        "mixed_policy": mixed_policy(tensorflow),
        "memory_growth": memory_growth,
        "horovod_gpu_operations": dict(horovod_ops) if horovod_ops is not None else None,
        "problem": missing_gpus(driver, tensorflow),
    }
