"""Devices for multi-device recipes: the GPUs when there are enough, logical GPUs split from fewer, else
logical CPU devices (`gpus.plan_devices` decides; this applies it to TensorFlow)."""

from __future__ import annotations

import tensorflow as tf

from tfperf.gpus import DevicePlan, driver_gpus, plan_devices, tensorflow_gpus
from tfperf.records.environment import usable_cores

__all__ = ["compute_devices", "device_plan", "usable_cores"]


def device_plan(count: int) -> DevicePlan:
    """`count` devices to spread work over, configured in TensorFlow (see `gpus.plan_devices`).

    Must run before any op: TensorFlow fixes its devices when it first initialises them.
    """
    gpus = tf.config.list_physical_devices("GPU")
    plan = plan_devices(count, tensorflow_gpus(driver_gpus()) if gpus else [])
    try:
        if plan.kind == "cpu":
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
        elif plan.kind == "logical-gpu":
            for gpu in gpus:
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=plan.memory_limit_mb)] * plan.per_gpu)
    except RuntimeError:
        # Already initialised: fine if it already has enough logical devices (a second call in one process).
        if len(tf.config.list_logical_devices("CPU" if plan.kind == "cpu" else "GPU")) < count:
            raise RuntimeError("TensorFlow's devices were initialised before compute_devices() was called: "
                               "call it first thing, before any op runs") from None
    return plan


def compute_devices(count: int) -> list[str]:
    """The names of `count` devices to spread work over (see `device_plan`)."""
    return list(device_plan(count).names)
