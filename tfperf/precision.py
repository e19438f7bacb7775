"""Mixed precision: what the hardware supports, and a scoped Keras dtype policy."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import keras

from tfperf.gpus import tensorflow_gpus


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo), empty when they cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_bf16_support() -> str:
    """How this CPU computes bfloat16: native matmul units, or conversion around float32 arithmetic."""
    flags = cpu_flags()
    if "amx_bf16" in flags:
        return "AMX bf16 tiles (native bf16 matmul)"
    if "avx512_bf16" in flags:
        return "AVX-512 BF16 (native bf16 dot products)"
    return "none: bf16 is converted to float32 for the arithmetic"


def cpu_int8_support() -> str:
    """How this CPU computes int8 dot products (what quantized kernels such as XNNPACK's run on)."""
    flags = cpu_flags()
    if "amx_int8" in flags:
        return "AMX int8 tiles"
    if "avx512_vnni" in flags or "avx_vnni" in flags:
        return "VNNI (int8 dot products in one instruction)"
    if "avx2" in flags:
        return "no VNNI: int8 dot products take several AVX2 instructions"
    return "no int8 dot-product instructions"


def hardware_summary() -> str:
    """One line: what float16 and bfloat16 run on here."""
    caps = [g.compute_capability for g in tensorflow_gpus() if g.compute_capability]
    if caps:
        fp16 = ", ".join(f"GPU {i}: compute capability {a}.{b} ({'has' if a >= 7 else 'no'} float16 tensor cores)"
                         for i, (a, b) in enumerate(caps))
        return f"{fp16}; bfloat16 tensor cores need 8.0 or more"
    return f"no GPU; CPU bfloat16: {cpu_bf16_support()}; float16 on CPU is emulated"


@contextlib.contextmanager
def dtype_policy(name: str) -> Iterator[None]:
    """Use a Keras dtype policy ('float32', 'mixed_float16', 'mixed_bfloat16') for models built inside."""
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def under_policy(model: keras.Model, policy: str) -> keras.Model:
    """`model` rebuilt under a dtype policy ('mixed_bfloat16', 'mixed_float16') with the same weights: what
    `set_global_policy` cannot do to a model already built or loaded from a file, whose layers keep the dtypes they
    were saved with. Every layer that holds weights takes the policy, except those that give the model's outputs
    (float32, as Keras' mixed precision guide says); what holds none (an Input, the ops a functional model records,
    such as a residual `x + y`) is copied as it is."""
    outputs = {t._keras_history[0].name for t in getattr(model, "outputs", None) or []
               if hasattr(t, "_keras_history")}

    def rebuilt(layer):
        config = layer.get_config()
        if not isinstance(layer, keras.layers.InputLayer) and getattr(layer, "weights", None):
            config["dtype"] = "float32" if layer.name in outputs else policy
        return layer.__class__.from_config(config)

    with dtype_policy(policy):
        copy = keras.models.clone_model(model, clone_function=rebuilt)
    copy.set_weights(model.get_weights())
    return copy
