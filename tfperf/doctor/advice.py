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
from tfperf.doctor.experiment import Section
from tfperf.doctor.options import MIN_GAIN, RECIPE, Finding
from tfperf.records.units import number


@dataclasses.dataclass
class Diagnosis:
    """What a doctor run found: the records' recorder, the model's facts, each experiment's Section in the order
    they ran, what the run itself left out, and the time it took."""

    subject: Subject
    recorder: Any
    facts: dict[str, Any]
    sections: dict[str, Section] = dataclasses.field(default_factory=dict)
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)  # by the run, not by one experiment
    elapsed_s: float = 0.0
    took_s: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per experiment, in order
    profiler: Any = None  # profile.ProfilePass: the traces of measured variants (None when it did not run)
    partial: str | None = None  # why the run stopped before its last experiment ('stopped by SIGTERM during ...')
    exit_code: int = 0  # the command's exit code: 143 after SIGTERM, 130 after Ctrl-C

    @property
    def findings(self) -> list[Finding]:
        """Every experiment's findings, in the order they ran."""
        return [f for section in self.sections.values() for f in section.findings]

    @property
    def skipped(self) -> dict[str, str]:
        """What was not measured and why: the run's, each experiment's, then the profile pass's."""
        found = dict(self.left_out)
        for section in self.sections.values():
            found.update(section.skipped)
        return {**found, **(self.profiler.failed if self.profiler else {})}

    @property
    def precision(self) -> list[tuple[str, Any]]:
        """(what, effect.PolicyEffect): whether a mixed policy took effect, in each model an experiment checked."""
        return [p for section in self.sections.values() for p in section.precision]

    @property
    def profiles(self) -> list[Any]:
        """profile.Profiled, one per variant the profile pass traced."""
        return self.profiler.found if self.profiler else []

    @property
    def peaks(self) -> dict[str, Any]:
        """Each traced variant's peak bytes by allocator."""
        return self.profiler.peaks if self.profiler else {}

    @property
    def profile_s(self) -> float:
        """What the profile pass took, within the experiments' times."""
        return self.profiler.took_s if self.profiler else 0.0

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
    def leading(self) -> set[str]:
        """The questions (tables) whose findings answer what the run was asked (Section.leads)."""
        return {f.section for s in self.sections.values() if s.leads for f in s.findings}

    @property
    def advice(self) -> list[tuple[Finding, list[Finding]]]:
        """Per question (a table), the largest significant gain on the model as it is used and the other
        significant ones; the questions the run was asked first, then ranked by their largest gain."""
        leading = self.leading
        return sorted(self._by_question([f for f in self.wins if not f.pitfall]),
                      key=lambda question: question[0].section not in leading)

    @property
    def pitfalls(self) -> list[tuple[Finding, list[Finding]]]:
        """Per cause of retracing, what avoiding it saves, measured on the model (not ranked as advice)."""
        return self._by_question([f for f in self.wins if f.pitfall])

    @property
    def no_gain(self) -> list[Finding]:
        """What was measured and is not advised: no significant gain, or answers that differ."""
        wins = self.wins
        return [f for f in self.findings if f not in wins]


def sentence(text: str) -> str:
    """`text` as a sentence of its own: its first word capitalised where it is a plain word ("the model's own
    predict()"), not where it is code ("tf.function ...")."""
    word = text.split(" ", 1)[0]
    return text[0].upper() + text[1:] if word.isalpha() and word.islower() else text


def _item(k: int, a: Finding, also: list[Finding]) -> str:
    return (f"{k}. **{a.row}** instead of {a.baseline} ({a.section}): {a.comparison.describe()}. "
            f"Apply: `{a.code}`. Costs: {a.cost}." + (f" {sentence(a.note)}." if a.note else "")
            + ("" if not also else " Also faster than " + a.baseline + ": " + "; ".join(
                f"{o.row} {o.comparison.describe()}" for o in also) + "."))


def _model_lines(d: Diagnosis) -> list[str]:
    f = d.facts
    lines = [f"Model `{d.subject.source}` ({f['kind']}): "
             + (f"{f['parameters']:,} parameters, " if f.get("parameters") else "")
             + (f"{f['weight_bytes'] / 1e6:.2f} MB of weights; " if f.get("weight_bytes") else "")
             + f"inputs {'; '.join(f['inputs'])}; outputs {'; '.join(f['outputs'])}. TensorFlow's rows ran on "
             + f"{f.get('device', 'CPU')}" + ("; LiteRT and ONNX Runtime on the CPU: their rows compare devices as "
                                              "much as runtimes." if f.get("device", "CPU") != "CPU" else "."),
             ""]
    if f.get("flops_per_example"):
        lines += [f"Forward pass: {number(f['flops_per_example'] / 1e6, 3)} MFLOP per example (counted by TensorFlow's "
                  f"graph profiler); at the {f['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s matmul rate measured now, "
                  f"the compute limit is {f['compute_limit_examples_per_s']:,.0f} examples/s. The tables give each "
                  f"row's MFU: its FLOP/s over that rate.", ""]
    else:
        lines += [f"FLOPs per example not computed (TensorFlow's profiler could not count this model's graph); "
                  f"matmul rate measured now: {f['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s.", ""]
    return lines


def _advice_lines(d: Diagnosis) -> list[str]:
    # The answers to what the run was asked first (--train's best configuration before the best way to call).
    lines = [s.lead for s in sorted(d.sections.values(), key=lambda s: not s.leads) if s.lead]
    advice = d.advice
    if advice:
        asked_first = advice[0][0].section in d.leading
        order = "what this run was asked first, then by measured gain" if asked_first else "largest measured gain first"
        lines += [f"Advice, {order} (each a 95% interval from interleaved rounds that clears {MIN_GAIN:.0%}):", ""]
        lines += [_item(k, a, also) for k, (a, also) in enumerate(advice, start=1)]
    else:
        lines += ["No change measured here is significantly faster than what the model does now."]
    lines += [s.answer for s in d.sections.values() if s.answer]
    if d.pitfalls:
        lines += ["", "Pitfalls, measured on your model (what calling a tf.function of it one way or another costs; "
                      "your model's own call does not fall into them, so they are not ranked as advice):", ""]
        lines += [_item(k, a, also) for k, (a, also) in enumerate(d.pitfalls, start=1)]
    return lines


def _profile_lines(d: Diagnosis) -> list[str]:
    lines = []
    if d.profiles:
        lines += ["", "## Where the time goes", "",
                  "From the profile pass: traces of variants the tables time, taken after their timed rounds and "
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
    mixed = [(what, e) for what, e in d.precision if e.took_effect is not None]
    if mixed:  # said only where a mixed policy is in force or set: whether it took effect, from the graph
        lines += ["", "## Did mixed precision take effect", "", *[f"- {what}: {e.describe()}" for what, e in mixed], ""]
    return lines


# The time a run was to take, and whose goal it is ("--quick", "--budget 420").
Goal = tuple[float, str]


def _closing_lines(d: Diagnosis, goal: Goal | None) -> list[str]:
    lines = ["", "Measured without a gain that counts (not advised):", ""]
    for n in d.no_gain:
        why = n.comparison.describe() + ("" if n.agrees else f"; and {n.note or 'its answers or loss disagree'}")
        lines.append(f"- {n.row} against {n.baseline} ({n.section}): {why}")
    skipped = d.skipped
    if skipped:
        lines += ["", "Not measured:", ""] + [f"- {k}: {v}" for k, v in skipped.items()]
    took = f"Doctor took {d.elapsed_s:.0f} s"
    if goal is not None:
        seconds, whose = goal
        took += f" (goal for {whose}: under {seconds:.0f} s: {'met' if d.elapsed_s <= seconds else 'NOT met'})"
    if d.took_s:
        took += ": " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in d.took_s.items())
    if d.profiles or d.peaks:
        took += f"; the profile pass within them {d.profile_s:.1f} s ({d.profile_s / d.elapsed_s:.0%} of the run)"
    return [*lines, "", took + "."]


def summary(d: Diagnosis, *, goal: Goal | None = None) -> str:
    """The diagnosis in Markdown: the advice ranked by gain (the answers asked for first), the model, each
    experiment's own part, what showed no gain, what was left out."""
    details = [s.detail for s in d.sections.values() if s.detail]
    partial = [f"**PARTIAL: {d.partial}.** What follows is what was measured before it stopped; the experiments it "
               f"did not reach are listed under what was not measured.", ""] if d.partial else []
    # The answer first (the run's question, the recommendation and its code, the other gains), then the model.
    return "\n".join([*partial, *_advice_lines(d), "", *_model_lines(d), *_profile_lines(d), *details,
                      *_closing_lines(d, goal)])


def write_report(d: Diagnosis, out: Path, *, goal: Goal | None = None) -> Path:
    """out/doctor.jsonl (the cookbook's record format), out/report.md with tables and figures."""
    from tfperf.records.findings import Headline
    from tfperf.records.report import build_report, write_conclusion

    d.recorder.save(out)
    write_conclusion(out, RECIPE, summary(d, goal=goal))
    if d.advice:
        top, _ = d.advice[0]
        said = "what this run was asked" if top.section in d.leading else "the largest gain"
        # The question first (the table it answers), then the answer: "what this run was asked: X" read as if X
        # were the question.
        headline = Headline.compared(f"{said} ({top.section}): {top.row} instead of {top.baseline}", top.comparison)
    else:
        headline = Headline("changes measured on this model", "none measurably faster with the same answers",
                            "no advice")
    if d.partial:  # the report's first screen says the run did not finish
        headline = dataclasses.replace(headline, lesson=f"PARTIAL ({d.partial}): {headline.lesson}")
    headline.save(out, RECIPE)
    return build_report(out, order=[RECIPE], title=f"tfperf doctor: {d.subject.name}",
                        steadier="rerun the doctor without --quick (more rounds), or on a quieter machine")
