"""The diagnosis: findings turned into advice ranked by measured gain, and the report that says it.

The advice holds changes measured on the model as it is used (a runtime, XLA, a batch size, threads,
training settings). Pitfalls (how a function might be called: new batch sizes, Python numbers) are
reported apart with their measured cost, unless the model's own call falls into them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tfperf.deploy.loader import Subject
from tfperf.doctor.options import MIN_GAIN, RECIPE, Finding


@dataclasses.dataclass
class Diagnosis:
    """What a doctor run found: the records' recorder, the findings, the advice, and what was left out."""

    subject: Subject
    recorder: Any
    findings: list[Finding]
    skipped: dict[str, str]
    facts: dict[str, Any]
    elapsed_s: float = 0.0
    took_s: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per experiment, in order
    profiles: list[Any] = dataclasses.field(default_factory=list)  # profile.Profiled, one per variant traced
    peaks: dict[str, Any] = dataclasses.field(default_factory=dict)  # each variant's peak bytes by allocator
    profile_s: float = 0.0  # what the profile pass took, within the experiments' times
    input_check: Any = None  # pipeline.InputCheck, with --data
    batch_fit: Any = None  # profile.BatchFit, with --memory-budget
    lengths: Any = None  # lengths.LengthSweep, for a model whose sequence axis is free
    shapes: Any = None  # shapes.ShapesFound, with --shapes
    load_times: Any = None  # loading.LoadTimes, with --load-time
    stacks: Any = None  # keras_stacks.StacksFound, with --keras-stacks
    devices: Any = None  # devices.DevicesFound, with --devices
    xla: Any = None  # xla.XlaFailure, where jit_compile=True fails on the model
    precision: list[tuple[str, Any]] = dataclasses.field(default_factory=list)  # (what, effect.PolicyEffect)
    kernels: list[Any] = dataclasses.field(default_factory=list)  # kernels.KernelDiff: why a variant is not faster
    overflow: Any = None  # custom_step.Overflow: the user's step under mixed_float16, with --train-step
    serving: str | None = None  # the serving answer within a latency budget, with --serve
    scaling: str | None = None  # the predicted speedup on hosts, with --hosts

    @property
    def wins(self) -> list[Finding]:
        """Significant gains that keep the model's answers, largest first (pitfalls included)."""
        from tfperf.measure.stats import FASTER

        found = [f for f in self.findings if f.comparison.verdict == FASTER and f.agrees]
        return sorted(found, key=lambda f: f.comparison.ratio, reverse=True)

    @staticmethod
    def _by_question(found: list[Finding]) -> list[tuple[Finding, list[Finding]]]:
        grouped: dict[str, list[Finding]] = {}
        for f in found:
            grouped.setdefault(f.section, []).append(f)
        return [(first[0], first[1:]) for first in grouped.values()]

    @property
    def advice(self) -> list[tuple[Finding, list[Finding]]]:
        """Per question (a table), the largest significant gain on the model as it is used and the other
        significant ones; questions ranked by their largest gain."""
        return self._by_question([f for f in self.wins if not f.pitfall])

    @property
    def pitfalls(self) -> list[tuple[Finding, list[Finding]]]:
        """Per cause of retracing, what avoiding it saves, measured on the model (not ranked as advice)."""
        return self._by_question([f for f in self.wins if f.pitfall])

    @property
    def no_gain(self) -> list[Finding]:
        """What was measured and is not advised: no significant gain, or answers that differ."""
        wins = self.wins
        return [f for f in self.findings if f not in wins]


def _item(k: int, a: Finding, also: list[Finding]) -> str:
    return (f"{k}. **{a.row}** instead of {a.baseline} ({a.section}): {a.comparison.describe()}. "
            f"Apply: `{a.code}`. Costs: {a.cost}." + (f" {a.note}." if a.note else "")
            + ("" if not also else " Also faster than " + a.baseline + ": " + "; ".join(
                f"{o.row} {o.comparison.describe()}" for o in also) + "."))


def summary(d: Diagnosis, *, goal_s: float | None = None) -> str:
    """The diagnosis in Markdown: the model, the advice ranked by gain, what showed no gain, what was left out."""
    f = d.facts
    lines = [f"Model `{d.subject.source}` ({f['kind']}): "
             + (f"{f['parameters']:,} parameters, " if f.get("parameters") else "")
             + (f"{f['weight_bytes'] / 1e6:.2f} MB of weights; " if f.get("weight_bytes") else "")
             + f"inputs {'; '.join(f['inputs'])}; outputs {'; '.join(f['outputs'])}. TensorFlow's rows ran on "
             + f"{f.get('device', 'CPU')}" + ("; LiteRT and ONNX Runtime on the CPU: their rows compare devices as "
                                              "much as runtimes." if f.get("device", "CPU") != "CPU" else "."),
             ""]
    if f.get("flops_per_example"):
        lines += [f"Forward pass: {f['flops_per_example'] / 1e6:.3g} MFLOP per example (counted by TensorFlow's "
                  f"graph profiler); at the {f['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s matmul rate measured now, "
                  f"the compute limit is {f['compute_limit_examples_per_s']:,.0f} examples/s. The tables give each "
                  f"row's MFU: its FLOP/s over that rate.", ""]
    else:
        lines += [f"FLOPs per example not computed (TensorFlow's profiler could not count this model's graph); "
                  f"matmul rate measured now: {f['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s.", ""]
    if d.input_check is not None:
        lines += [d.input_check.describe(), ""]
    advice = d.advice
    if advice:
        lines += ["Advice, largest measured gain first (each a 95% interval from interleaved rounds that clears "
                  f"{MIN_GAIN:.0%}):", ""]
        lines += [_item(k, a, also) for k, (a, also) in enumerate(advice, start=1)]
    else:
        lines += ["No change measured here is significantly faster than what the model does now."]
    if d.serving:
        lines += ["", "## Serving under load", "", d.serving]
    if d.scaling:
        lines += ["", "## Across hosts", "", d.scaling]
    if d.pitfalls:
        lines += ["", "Pitfalls, measured on your model (what calling a tf.function of it one way or another costs; "
                      "your model's own call does not fall into them, so they are not ranked as advice):", ""]
        lines += [_item(k, a, also) for k, (a, also) in enumerate(d.pitfalls, start=1)]
    if d.profiles:
        lines += ["", "## Where the time goes", "",
                  "From the profile pass: traces of variants measured above, taken after their timed rounds and "
                  "read with XProf (top operations by self time, from its framework_op_stats).", ""]
        for found in d.profiles:
            lines += [found.describe(), ""]
    if d.peaks:
        from tfperf.doctor.profile import host_and_device, megabytes

        lines += ["Peak memory of TensorFlow's allocators during one traced call of each variant (LiteRT and ONNX "
                  "Runtime allocate outside TensorFlow's view):", ""]
        for label, peaks in d.peaks.items():
            host, device = host_and_device(peaks)
            lines.append(f"- {label}: {megabytes(host)}" + (f" host, {megabytes(device)} GPU" if device else ""))
        lines.append("")
    if d.xla is not None:
        lines += ["", "## When XLA fails", "", d.xla.describe(), ""]
    mixed = [(what, e) for what, e in d.precision if e.took_effect is not None]
    if mixed:  # said only where a mixed policy is in force or set: whether it took effect, from the graph
        lines += ["", "## Did mixed precision take effect", "", *[f"- {what}: {e.describe()}" for what, e in mixed], ""]
    if d.overflow is not None:
        lines += ["", "## Your training step under mixed_float16", "", d.overflow.describe(), ""]
    if d.kernels:
        lines += ["", "## Why it is not faster, kernel by kernel", "", *[f"- {k.describe()}" for k in d.kernels], ""]
    if d.batch_fit is not None:
        lines += [d.batch_fit.describe(), ""]
    if d.lengths is not None:
        lines += ["## Sequence length", "", d.lengths.advice(), ""]
    if d.shapes is not None:
        lines += ["## New shapes", "", d.shapes.describe(), ""]
    if d.load_times is not None:
        lines += ["## Load time", "", d.load_times.describe(), ""]
    if d.stacks is not None:
        lines += ["## Keras stacks", "", d.stacks.describe(), ""]
    if d.devices is not None:
        lines += ["## More devices", "", d.devices.describe(), ""]
    lines += ["", "Measured without a gain that counts (not advised):", ""]
    for n in d.no_gain:
        why = n.comparison.describe() + ("" if n.agrees else f"; and {n.note}")
        lines.append(f"- {n.row} against {n.baseline} ({n.section}): {why}")
    if d.skipped:
        lines += ["", "Not measured:", ""] + [f"- {k}: {v}" for k, v in d.skipped.items()]
    took = f"Doctor took {d.elapsed_s:.0f} s"
    if goal_s is not None:
        took += f" (goal for --quick: under {goal_s:.0f} s: {'met' if d.elapsed_s <= goal_s else 'NOT met'})"
    if d.took_s:
        took += ": " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in d.took_s.items())
    if d.profiles or d.peaks:
        took += f"; the profile pass within them {d.profile_s:.1f} s ({d.profile_s / d.elapsed_s:.0%} of the run)"
    lines += ["", took + "."]
    return "\n".join(lines)


def write_report(d: Diagnosis, out: Path, *, goal_s: float | None = None) -> Path:
    """out/doctor.jsonl (the cookbook's record format), out/report.md with tables and figures."""
    from tfperf.records.findings import Headline
    from tfperf.records.report import build_report, write_conclusion

    d.recorder.save(out)
    write_conclusion(out, RECIPE, summary(d, goal_s=goal_s))
    if d.advice:
        top, _ = d.advice[0]
        headline = Headline.compared(f"the largest gain: {top.row} instead of {top.baseline} ({top.section})",
                                     top.comparison)
    else:
        headline = Headline("changes measured on this model", "none measurably faster with the same answers",
                            "no advice")
    headline.save(out, RECIPE)
    return build_report(out, order=[RECIPE], title=f"tfperf doctor: {d.subject.name}",
                        steadier="rerun the doctor without --quick (more rounds), or on a quieter machine")
