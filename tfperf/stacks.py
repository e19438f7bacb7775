"""The Keras stacks a model can run under: Keras 2 (tf_keras), Keras 3 on TensorFlow, Keras 3 on JAX.

The stack is fixed when Keras is imported, so each runs in a process of its own, started with the environment
`stack_env` gives; `keras_module` is the Keras that process builds with, and `backend_device` says where its
ops run (a comparison across devices is not a comparison of backends).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType

STACKS: dict[str, dict[str, str]] = {
    "Keras 2 (tf_keras)": {"TF_USE_LEGACY_KERAS": "1", "KERAS_BACKEND": "tensorflow"},
    "Keras 3, TensorFlow": {"KERAS_BACKEND": "tensorflow"},
    "Keras 3, JAX": {"KERAS_BACKEND": "jax"},
}
# The tfperf extra that brings each stack (Keras 3 on TensorFlow comes with tfperf itself).
EXTRA = {"Keras 2 (tf_keras)": "keras2", "Keras 3, JAX": "jax"}


def install_hint(stack: str) -> str:
    """How to install a stack that is missing, matched to the TensorFlow installed (tf-keras follows it)."""
    from tfperf.extras import install_line

    return install_line(EXTRA[stack]) if stack in EXTRA else "pip install 'tensorflow>=2.16' 'keras>=3.6'"


def stack_env(stack: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that runs under `stack` (from `base`, default this process's)."""
    env = {**(os.environ if base is None else base), **STACKS[stack]}
    if "TF_USE_LEGACY_KERAS" not in STACKS[stack]:
        env.pop("TF_USE_LEGACY_KERAS", None)
    return env


def keras_module(stack: str) -> ModuleType:
    """The Keras this process builds with under `stack` (its environment chose the backend)."""
    if STACKS[stack].get("TF_USE_LEGACY_KERAS"):
        import tf_keras

        return tf_keras
    import keras

    return keras


def backend_device(k: ModuleType) -> str:
    """Where this Keras' backend runs its ops by default: "gpu" or "cpu"."""
    if getattr(k, "backend", None) is not None and hasattr(k.backend, "backend") and k.backend.backend() == "jax":
        import jax

        return jax.default_backend()
    import tensorflow as tf

    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
