"""Devices for multi-device recipes: the GPUs when there are some, else logical CPU devices."""

from __future__ import annotations

import os

import tensorflow as tf


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    return len(os.sched_getaffinity(0))


def compute_devices(count: int) -> list[str]:
    """`count` device names to spread work over: real GPUs if present, else `count` logical CPUs.

    Must run before any op: TensorFlow fixes its devices when it first initialises them.
    """
    if count < 1:
        raise ValueError(f"need at least one device, got {count}")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < count:
            raise ValueError(f"asked for {count} devices but this machine has {len(gpus)} GPU(s): use --devices "
                             f"{len(gpus)} or fewer")
        return [f"/GPU:{i}" for i in range(count)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        # Already initialised: fine if it already has enough logical CPUs (a second call in one process).
        if len(tf.config.list_logical_devices("CPU")) < count:
            raise RuntimeError("TensorFlow's devices were initialised before compute_devices() was called: "
                               "call it first thing, before any op runs") from None
    return [f"/CPU:{i}" for i in range(count)]
