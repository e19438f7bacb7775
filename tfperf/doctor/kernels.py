"""Why a variant is slower, kernel by kernel: the plain call and the variant traced in turns, their operations'
self time grouped by the layer and op type they belong to, and each group's ratio with its interval.

A switch that makes the whole call slower (mixed precision on a CPU without bfloat16 arithmetic, a float16
convolution whose channels do not suit tensor cores) is slower somewhere: in a layer's convolution, in the casts the
policy added, in an optimizer update. Traces of one call each would give one number per group; here each variant is
traced `rounds` times, interleaved, so that every group has a sample per round and the ratio a 95% interval
(`tfperf.measure.stats`), as the doctor's other verdicts do. Traces are read through XProf (`tfperf.measure.profiles`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from tfperf.doctor.effect import layer_of
from tfperf.measure.stats import SLOWER, Comparison, compare_times
from tfperf.records.units import number

ROUNDS = 6  # a sample per round for each group: what a verdict needs (stats.MIN_UNITS)
SHOWN = 4  # the groups a report names


def ms(seconds: float) -> str:
    """Milliseconds to three figures, without an exponent."""
    v = seconds * 1e3
    return f"{v:,.0f}" if v >= 100 else f"{number(v, 3)}"


@dataclasses.dataclass(frozen=True)
class Group:
    """The self time of one layer's ops of one type, per call, in both variants."""

    layer: str
    type: str
    plain_s: float  # median per call, 0 when the plain call has none
    variant_s: float
    comparison: Comparison | None  # None when one side has no such ops (added or removed)

    @property
    def added_s(self) -> float:
        return self.variant_s - self.plain_s


@dataclasses.dataclass(frozen=True)
class KernelDiff:
    """Where a variant spends more than the plain call, by layer and op type."""

    variant: str
    plain: str
    groups: tuple[Group, ...]  # by time added, largest first
    hint: str = ""  # what the machine does with the variant's arithmetic, when that explains it
    rounds: int = ROUNDS  # traces of each variant, taken in turns

    @property
    def gone(self) -> list[Group]:
        """Fused kernels the plain call ran that the variant no longer has (it runs their parts apart)."""
        return [g for g in self.groups if g.variant_s == 0 and g.plain_s > 0 and g.type.startswith(("_Fused", "_Mkl"))]

    @property
    def slower(self) -> list[Group]:
        """Groups measurably slower, or added by the variant, that cost time."""
        return [g for g in self.groups if g.added_s > 0 and (
            g.comparison is None and g.plain_s == 0 or g.comparison is not None and g.comparison.verdict == SLOWER)]

    def describe(self) -> str:
        shown = self.slower[:SHOWN]
        if not self.groups:
            return (f"Traced in turns, neither {self.variant} nor {self.plain} left an operation's time in its trace: "
                    f"the profiler records none here (JAX on a CPU, say), so the difference cannot be placed.")
        if not shown:
            return (f"Traced in turns against {self.plain}, no layer's operations of {self.variant} are measurably "
                    f"slower or added: the difference lies outside the framework's operations (dispatch, Python).")
        parts = []
        for g in shown:
            where = f"`{g.type}` in `{g.layer}`" if g.layer else f"XLA's `{g.type}` (in no layer)"
            if g.comparison is None:
                parts.append(f"{where} is added ({ms(g.variant_s)} ms per call)")
            else:
                c = g.comparison
                parts.append(f"{where} takes {1 / c.ratio:.2f}x as long ({ms(g.plain_s)} to {ms(g.variant_s)} ms per "
                             f"call; 95% CI {1 / c.ci95[1]:.2f}-{1 / c.ci95[0]:.2f}x)")
        added = sum(g.added_s for g in self.slower)
        gone = sorted(self.gone, key=lambda g: -g.plain_s)[:SHOWN]
        return (f"Under {self.variant}, against {self.plain} (each traced {self.rounds} times in turns, operations' self "
                f"time by layer and type): " + "; ".join(parts) + f". Together {ms(added)} ms more per call."
                + ("" if not gone else " Fused kernels the plain call ran and this one does not: " + ", ".join(
                    f"`{g.type}` in `{g.layer}` ({ms(g.plain_s)} ms)" for g in gone) + " (their parts run apart).")
                + (f" {self.hint}" if self.hint else ""))


def group_of(op, layers: set[str], on_device: bool) -> tuple[str, str]:
    """The (layer, kind) an operation's time is counted under. JAX names the backward pass's ops as their forward
    ones inside `transpose(...)`: they are kept apart as the type's gradient. On a trace with device rows, host ops
    are kept apart from the kernels. An op XProf types `Unknown` is XLA's own (a layout transpose, a copy), in no
    layer: it is counted by its name without the counter XLA numbers it with."""
    if op.type == "Unknown":
        return "", re.sub(r"\.\d+$", "", op.name)
    kind = op.type
    if any(scope.startswith("transpose(") for scope in op.name.split("/")[:-1]):
        kind += " (gradient)"
    if on_device and op.place == "Host":
        kind += " (host)"
    return layer_of(op.name, layers), kind


def grouped(ops, layers: Sequence[str], calls: int) -> dict[tuple[str, str], float]:
    """Self time per call by (layer, kind), from one trace's operations (`group_of`)."""
    known = set(layers)
    on_device = any(op.place == "Device" for op in ops)
    found: dict[tuple[str, str], float] = {}
    for op in ops:
        key = group_of(op, known, on_device)
        found[key] = found.get(key, 0.0) + op.self_s / calls
    return found


def diff_of_traces(plain: str, variant: str, traces: dict[str, list[list[str]]], layers: Sequence[str], *,
                   calls: int, hint: str = "") -> KernelDiff:
    """Compare two variants' traces, taken in turns (`traces[name]`: each round's XSpace files), by layer and kind."""
    import numpy as np

    from tfperf.measure.profiles import op_times

    samples = {name: [grouped(op_times(paths), layers, calls) for paths in traces[name]] for name in (plain, variant)}
    rounds = min(len(samples[plain]), len(samples[variant]))
    keys = {k for found_rounds in samples.values() for found in found_rounds for k in found}
    groups = []
    for key in keys:
        a = [found.get(key, 0.0) for found in samples[plain]]
        b = [found.get(key, 0.0) for found in samples[variant]]
        both = min(a) > 0 and min(b) > 0
        comparison = compare_times(a, b, names=(plain, variant), rounds=rounds) if both else None
        groups.append(Group(key[0], key[1], float(np.median(a)), float(np.median(b)), comparison))
    groups.sort(key=lambda g: -g.added_s)
    return KernelDiff(variant, plain, tuple(groups), hint, rounds)


def kernel_diff(plain, variant, layers: Sequence[str], root: Path, *, calls: int, rounds: int = ROUNDS,
                hint: str = "") -> KernelDiff:
    """Trace two measured timers in turns, `calls` calls a trace, and compare their operations by layer and kind."""
    from tfperf.measure.profiles import trace_files

    traces: dict[str, list[list[str]]] = {plain.name: [], variant.name: []}
    for r in range(rounds):
        for timer in (plain, variant):
            traces[timer.name].append(trace_files(timer.profile(Path(root) / f"round-{r}", steps=calls)))
    return diff_of_traces(plain.name, variant.name, traces, layers, calls=calls, hint=hint)


def precision_hint(policy: str, model, layers: Sequence[str], gpus: Sequence = ()) -> str:
    """Why lower precision may be slow here: on a GPU, the named layers whose channels or units are not multiples of 8
    (tensor cores take float16 in multiples of 8); on a CPU, how it computes bfloat16 or float16."""
    from tfperf.precision import cpu_bf16_support

    low = policy.removeprefix("mixed_")
    if not gpus:
        if low == "bfloat16":
            return f"This CPU's bfloat16 arithmetic: {cpu_bf16_support()}."
        return "float16 on a CPU is emulated: mixed_float16 is for GPUs."
    odd, odd_inputs = [], []
    for name in layers:
        try:
            layer = model.get_layer(name)
            outgoing = layer.get_config().get("filters") or layer.get_config().get("units")
            incoming = layer.input.shape[-1]
        except (ValueError, AttributeError):
            continue
        if outgoing and incoming and outgoing % 8:
            odd.append(f"`{name}` ({incoming} in, {outgoing} out)")
        elif outgoing and incoming and incoming % 8:
            odd_inputs.append((name, incoming))
    if not odd and not odd_inputs:
        return ""
    # Seen on an H100 (benchmarks/mixed_precision_on_gpu.py): at 60 channels bfloat16's forward convolutions took
    # 1.7x float32's, at 64 half; a first convolution over 3 image channels was 1.2-1.3x slower in 16 bits.
    said = [f"Tensor cores take {low} in multiples of 8 channels."]
    if odd:
        said.append("Not so for " + ", ".join(odd) + ": pad their filters or units to multiples of 8.")
    if odd_inputs:
        fed = ", ".join(f"`{n}` ({c} in)" for n, c in odd_inputs)
        small = any(c < 8 for _, c in odd_inputs)
        said.append(f"Fed a number of channels that is not: {fed}; " + (
            "an input of fewer than 8 channels (an image's 3) can be padded with zero channels to 8, or its first "
            "layer left in float32 (`dtype=\"float32\"`)." if small else "pad the layer that feeds it."))
    return " ".join(said)
