"""Where the time went: a profiler trace read through XProf's own conversions, without TensorBoard.

A trace is what `tf.profiler.experimental.start/stop` (or `timer.profiled`) writes: `*.xplane.pb` files
under `<logdir>/plugins/profile/<run>/`. XProf (`xprof` on PyPI, the TensorFlow and JAX profiler's tools)
converts them into the tables TensorBoard's Profile tab shows: `framework_op_stats` (every op's self
time, host or device), `input_pipeline_analyzer` (step time split into waiting for input and
compute, with the profiler's own verdict; it needs steps marked with
`tf.profiler.experimental.Trace("train", step_num=..., _r=1)`) and `memory_profile` (each allocator's
peak). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

INPUT_BOUND_SHARE = 0.20  # XProf calls a program HIGHLY input-bound from this share of the step waiting for input


class TraceError(ValueError):
    """A folder without a trace, or a trace XProf cannot convert."""


def trace_files(logdir: Path | str) -> list[str]:
    """The XSpace files (one per host) of the newest trace under `logdir`."""
    found = sorted(Path(logdir).glob("**/*.xplane.pb"), key=lambda p: (p.parent.name, str(p)))
    if not found:
        raise TraceError(f"no profiler trace (*.xplane.pb) under {logdir}")
    newest = found[-1].parent.name  # a trace's folder is named by the time it started
    return [str(p) for p in found if p.parent.name == newest]


def traces_by_run(profile_dir: Path | str) -> dict[str, list[str]]:
    """The newest trace of each run (each folder under `profile_dir` that holds one), by run name."""
    runs = {}
    for folder in sorted(Path(profile_dir).iterdir()) if Path(profile_dir).is_dir() else []:
        if folder.is_dir() and any(folder.glob("**/*.xplane.pb")):
            runs[folder.name] = trace_files(folder)
    return runs


def tool(paths: Sequence[str], name: str) -> Any:
    """An XProf tool's data for these XSpace files, as parsed JSON."""
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data(list(paths), name, {})
    if not data:
        raise TraceError(f"XProf could not convert the trace to {name}")
    return json.loads(data.decode() if isinstance(data, bytes) else data)


def _rows(table: dict) -> list[dict]:
    """A Google DataTable's rows as dicts by column id."""
    ids = [c["id"] for c in table["cols"]]
    return [{k: cell.get("v") if cell else None for k, cell in zip(ids, row["c"])} for row in table["rows"]]


@dataclasses.dataclass(frozen=True)
class OpTime:
    """One operation's self time in a trace."""

    place: str  # "Host" or "Device"
    type: str  # the op type (Conv2D, MatMul, a tf.data iterator, EagerPyFunc, ...)
    name: str  # the op's name in the graph
    occurrences: int
    self_s: float
    share: float  # of all ops' self time (idle time left out)


# The operations where a model's arithmetic is (matmuls, convolutions and their gradients): what MFU counts.
ARITHMETIC = frozenset({
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2D", "Conv3D", "Conv1D",
    "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3DBackpropInputV2",
    "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
    "_FusedMatMul", "_FusedConv2D", "_MklMatMul", "_MklFusedMatMul", "_MklConv2D", "_MklFusedConv2D",
    "_FusedDepthwiseConv2dNative", "SparseMatMul"})
# Keras names the graph scope of an optimizer's update after the optimizer ("adam", "adam_1", ...).
_OPTIMIZER_SCOPE = re.compile(r"(^|/)(adam|adamw|adamax|nadam|sgd|rmsprop|adagrad|adadelta|adafactor|ftrl|lamb|lion|"
                              r"loss_scale_optimizer)(_\d+)?/", re.IGNORECASE)
KINDS = ("matmuls and convolutions", "optimizer update", "input pipeline",
         "the rest (element-wise, pooling, reductions, copies: bound by memory, not arithmetic)")


def kind(op: OpTime) -> str:
    """Which of KINDS an operation's time counts as: arithmetic, the optimizer's update, tf.data, or the rest."""
    if op.type in ARITHMETIC:
        return KINDS[0]
    if _OPTIMIZER_SCOPE.search(op.name):
        return KINDS[1]
    if op.type in ("Dataset", "IteratorGetNext", "IteratorGetNextSync") or op.name.startswith("Iterator::"):
        return KINDS[2]
    return KINDS[3]


def time_by_kind(ops: Sequence[OpTime]) -> dict[str, float]:
    """Each of KINDS' share of the ops' self time (idle time left out): what a low MFU is spent on."""
    shares = dict.fromkeys(KINDS, 0.0)
    for op in ops:
        shares[kind(op)] += op.share
    return shares


def op_times(paths: Sequence[str]) -> list[OpTime]:
    """Every operation of the trace by self time, largest first, as XProf's framework_op_stats ranks them;
    idle time is left out of the shares."""
    rows = [r for r in _rows(tool(paths, "framework_op_stats")[0]) if r["type"] != "IDLE"]
    total = sum(r["total_self_time"] for r in rows) or 1.0
    return [OpTime(r["host_or_device"], r["type"], r["operation"], int(r["occurrences"]), r["total_self_time"] / 1e6,
                   r["total_self_time"] / total) for r in sorted(rows, key=lambda r: -r["total_self_time"])]


def by_type(ops: Sequence[OpTime]) -> list[tuple[str, float, float]]:
    """Self time grouped by op type: (type, seconds, share), largest first."""
    grouped: dict[str, list[float]] = {}
    for op in ops:
        seconds, share = grouped.setdefault(op.type, [0.0, 0.0])
        grouped[op.type] = [seconds + op.self_s, share + op.share]
    return sorted(((t, s, f) for t, (s, f) in grouped.items()), key=lambda row: -row[1])


def ops_table(ops: Sequence[OpTime], limit: int = 10) -> str:
    """The top operations as a Markdown table."""
    if not ops:
        return "(no TensorFlow operation in this trace)"
    # "occurrences" is XProf's count of the op's events: an op split across threads counts more than once.
    lines = ["| op type | operation | host/device | occurrences | self time | share |", "|---|---|---|---|---|---|"]
    for op in ops[:limit]:
        name = op.name if len(op.name) <= 60 else "..." + op.name[-57:]
        lines.append(f"| {op.type} | {name} | {op.place} | {op.occurrences:,} | {op.self_s * 1e3:.2f} ms | "
                     f"{op.share:.1%} |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class InputAnalysis:
    """The profiler's step-time breakdown and its own verdict on the input pipeline."""

    step_ms: float  # average step time
    input_ms: float  # of which waiting for input
    host_compute_ms: float
    other_ms: float
    conclusion: str  # XProf's sentence, e.g. "Your program is HIGHLY input-bound because ..."
    slowest_stage: str | None  # the input op with the most self time, and its share of input time
    steps: int
    step_input_shares: tuple[float, ...] = ()  # each marked step's share spent waiting for input
    step_busy_ms: tuple[float, ...] = ()  # each marked step's time not waiting for input (the profiler's own included)

    @property
    def median_input_share(self) -> float:
        """The median step's share waiting for input: a few slow steps move the average, not this."""
        return float(np.median(self.step_input_shares)) if self.step_input_shares else self.input_share

    @property
    def median_busy_ms(self) -> float:
        """The median step's time not spent waiting for input: the step as the profiler, tracing it, slowed it."""
        return float(np.median(self.step_busy_ms)) if self.step_busy_ms else self.step_ms - self.input_ms

    @property
    def input_share(self) -> float:
        return self.input_ms / self.step_ms if self.step_ms else 0.0

    @property
    def input_bound(self) -> bool:
        """The median step 20% or more waiting for input (XProf's HIGHLY input-bound bar): XProf's own average
        counts an epoch's first step, which waits while the pipeline starts, whatever prefetch and cache do."""
        return self.median_input_share >= INPUT_BOUND_SHARE


def input_analysis(paths: Sequence[str]) -> InputAnalysis | None:
    """The input pipeline analysis of a trace whose steps were marked; None when no step was marked."""
    tables = tool(paths, "input_pipeline_analyzer")
    summary = next((t for t in tables if "input_conclusion" in t.get("p", {})), None)
    if summary is None or not summary["rows"]:
        return None
    p = summary["p"]
    stages = next((t for t in tables if any(c["id"] == "selfTimeInPercent" for c in t.get("cols", []))), None)
    slowest = None
    if stages and stages["rows"]:
        top = max(_rows(stages), key=lambda r: r["selfTimeInMs"] or 0)
        slowest = f"{top['opName']} ({top['selfTimeInPercent']:.0%} of the input time)"
    steps = [r for r in _rows(summary) if r.get("stepTimeMs")]
    return InputAnalysis(float(p["steptime_ms_average"]), float(p["infeed_time_ms_avg"]),
                         float(p["host_compute_time_ms_avg"]), float(p["other_time_ms_avg"]), p["input_conclusion"],
                         slowest, len(summary["rows"]), tuple(r["infeedTimeMs"] / r["stepTimeMs"] for r in steps),
                         tuple(r["stepTimeMs"] - r["infeedTimeMs"] for r in steps))


def peak_memory(paths: Sequence[str]) -> dict[str, int]:
    """Each allocator's peak bytes in use while the trace ran (TensorFlow's: the host's `mklcpu` or `cpu`,
    each GPU's `GPU_0_bfc`...): tensors, weights included, not what other runtimes allocate."""
    found = {}
    for path in paths:  # the memory profile reads one host at a time
        profile = tool([path], "memory_profile")
        for allocator, data in (profile.get("memoryProfilePerAllocator") or {}).items():
            # peakStats: the peak within the trace; peakBytesUsageLifetime would be the process's so far.
            peak = int(data.get("profileSummary", {}).get("peakStats", {}).get("peakBytesInUse", 0))
            found[allocator] = max(found.get(allocator, 0), peak)
    return found
