"""Whether a mixed-precision policy took effect, read from the model and its graph rather than from the policy's name.

Keras gives each layer the dtype policy in force when the layer is made: `set_global_policy('mixed_float16')` after
the model was built changes nothing in it, and a layer that casts its inputs to float32 (or was made with
`dtype="float32"`) computes in float32 under any policy. So the check reads each layer's compute dtype, then traces
the model's call and counts the operations that carry its arithmetic (matmuls, convolutions, einsums) by the dtype
they run in, and the casts the policy added, naming the layers whose heavy operations stayed in float32.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tfperf.measure.profiles import ARITHMETIC

LOW = ("float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class HeavyOp:
    """One arithmetic-heavy operation in the traced call, the layer it belongs to and its dtype."""

    type: str
    layer: str
    dtype: str


@dataclasses.dataclass(frozen=True)
class PolicyEffect:
    """What a model computes in: the policy in force, each layer's compute dtype, the heavy ops' dtypes, the casts."""

    policy: str  # the global policy in force now
    layers: tuple[tuple[str, str, str], ...]  # (name, class, compute dtype), layers with weights
    ops: tuple[HeavyOp, ...]
    casts: int  # Cast operations in the traced call
    outputs: tuple[str, ...] = ()  # the layers that give the model's outputs in float32 (as the guide advises)

    @property
    def low_layers(self) -> list[str]:
        return [name for name, _, dtype in self.layers if dtype in LOW]

    @property
    def low_ops(self) -> list[HeavyOp]:
        return [op for op in self.ops if op.dtype in LOW]

    @property
    def float32_layers(self) -> list[str]:
        """Layers that compute in float32 though the model computes in lower precision elsewhere (outputs aside)."""
        return [name for name, _, dtype in self.layers if dtype == "float32" and name not in self.outputs]

    @property
    def took_effect(self) -> bool | None:
        """False when the policy in force is mixed and the model computes nothing in lower precision; None when no
        mixed policy is in force or set on any layer (nothing to take effect)."""
        mixed = self.policy.startswith("mixed") or bool(self.low_layers)
        if not mixed:
            return None
        return bool(self.low_layers) and (bool(self.low_ops) or not self.ops)

    def describe(self) -> str:
        by_dtype = Counter(op.dtype for op in self.ops)
        ops = ", ".join(f"{n} in {dtype}" for dtype, n in sorted(by_dtype.items())) or "none"
        seen = (f"{len(self.low_layers)} of {len(self.layers)} layers with weights compute in lower precision; the "
                f"traced call's {len(self.ops)} matmul and convolution operations: {ops}; {self.casts} casts")
        if self.took_effect is None:
            return f"No mixed policy is in force (global policy {self.policy}) or set on any layer: {seen}."
        if not self.took_effect:
            low = self.policy.removeprefix("mixed_")
            if not self.low_layers:
                return (f"The global dtype policy is {self.policy}, but it **did not take effect**: {seen}. A layer "
                        f"takes the policy in force when it is made, so the policy was set after the model was built. "
                        f"Apply: `keras.mixed_precision.set_global_policy({self.policy!r})` before the model's first "
                        f"layer is made, then build the model; a model loaded from a file keeps the dtypes it saved: "
                        f"`model = tfperf.precision.under_policy(model, {self.policy!r})` rebuilds it under the "
                        f"policy.")
            return (f"The layers compute in {low}, but the arithmetic **did not take effect**: {seen}. The layers cast "
                    f"their inputs back to float32 before their matmuls.")
        stayed = sorted({op.layer for op in self.ops if op.dtype == "float32" and op.layer not in self.outputs})
        words = [f"Mixed precision took effect ({self.policy if self.policy.startswith('mixed') else 'set per layer'})"
                 f": {seen}."]
        if stayed:
            words.append(f"Still float32 there: {', '.join(f'`{n}`' for n in stayed[:8])}"
                         + (f" and {len(stayed) - 8} more" if len(stayed) > 8 else "")
                         + " (their heavy operations run in float32: a layer made with dtype='float32', or one that "
                           "casts its inputs).")
        if self.outputs:
            words.append(f"The output layers ({', '.join(f'`{n}`' for n in self.outputs)}) stay float32, as Keras' "
                         f"mixed precision guide advises.")
        return " ".join(words)


def layer_of(op_name: str, layers: set[str]) -> str:
    """The layer an operation belongs to, by the innermost name scope in its name that is a layer's (TensorFlow adds
    `_1`, `_2` to a scope it meets again; JAX wraps a scope in its transforms, `transpose(jvp(conv1))`); else the
    scope above the op, without such counters or wrappers."""
    import re

    scopes = op_name.split("/")[:-1]
    for scope in reversed(scopes):
        for name in reversed(re.findall(r"[^()]+", scope)):
            while True:
                if name in layers:
                    return name
                shorter = re.sub(r"_\d+$", "", name)
                if shorter == name:
                    break
                name = shorter
    if not scopes:
        return op_name
    innermost = (re.findall(r"[^()]+", scopes[-1]) or [scopes[-1]])[-1]
    return re.sub(r"(_\d+)+$", "", innermost)


def heavy_ops(graph_def, layers: Sequence[str]) -> tuple[list[HeavyOp], int]:
    """The heavy operations in a traced graph (its function library included), each with the layer it belongs to,
    and the number of casts."""
    import tensorflow as tf

    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    known = set(layers)
    found, casts = [], 0
    for node in nodes:
        if node.op == "Cast":
            casts += 1
        attr = next((a for a in ("T", "Ta") if a in node.attr), None)
        if node.op in ARITHMETIC and attr is not None:
            found.append(HeavyOp(node.op, layer_of(node.name, known), tf.dtypes.as_dtype(node.attr[attr].type).name))
    return found, casts


def policy_effect(model, inputs: Any) -> PolicyEffect:
    """Whether the model computes in lower precision: each layer's compute dtype, and its call traced on `inputs`
    (the model's structure) with the heavy operations' dtypes."""
    import keras
    import tensorflow as tf

    from tfperf.deploy.loader import all_layers

    layers = [layer for layer in all_layers(model) if layer.weights and not isinstance(layer, keras.Model)]
    described = tuple((layer.name, type(layer).__name__, str(getattr(layer, "compute_dtype", "float32")))
                      for layer in layers)
    dtypes = {name: dtype for name, _, dtype in described}
    outputs = tuple(dict.fromkeys(name for t in getattr(model, "outputs", None) or [] if hasattr(t, "_keras_history")
                                  if dtypes.get(name := t._keras_history[0].name) == "float32"))
    traced = tf.function(lambda x: model(x, training=False)).get_concrete_function(inputs)
    ops, casts = heavy_ops(traced.graph.as_graph_def(), [layer.name for layer in layers])
    return PolicyEffect(keras.config.dtype_policy().name, described, tuple(ops), casts, outputs)
