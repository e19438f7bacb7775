"""The diagnosis: findings turned into advice ranked by measured gain, and the report that says it."""

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

    @property
    def wins(self) -> list[Finding]:
        """Significant gains that keep the model's answers, largest first."""
        from tfperf.measure.stats import FASTER

        found = [f for f in self.findings if f.comparison.verdict == FASTER and f.agrees]
        return sorted(found, key=lambda f: f.comparison.ratio, reverse=True)

    @property
    def advice(self) -> list[tuple[Finding, list[Finding]]]:
        """Per question (a table, or a cause of retracing), the largest significant gain and the other
        significant ones; questions ranked by their largest gain."""
        grouped: dict[str, list[Finding]] = {}
        for f in self.wins:
            grouped.setdefault(f.section, []).append(f)
        return [(found[0], found[1:]) for found in grouped.values()]

    @property
    def no_gain(self) -> list[Finding]:
        """What was measured and is not advised: no significant gain, or answers that differ."""
        wins = self.wins
        return [f for f in self.findings if f not in wins]



def summary(d: Diagnosis, *, goal_s: float | None = None) -> str:
    """The diagnosis in Markdown: the model, the advice ranked by gain, what showed no gain, what was left out."""
    f = d.facts
    lines = [f"Model `{d.subject.source}` ({f['kind']}): "
             + (f"{f['parameters']:,} parameters, " if f.get("parameters") else "")
             + (f"{f['weight_bytes'] / 1e6:.2f} MB of weights; " if f.get("weight_bytes") else "")
             + f"inputs {'; '.join(f['inputs'])}; outputs {'; '.join(f['outputs'])}.",
             ""]
    if f.get("flops_per_example"):
        lines += [f"Forward pass: {f['flops_per_example'] / 1e6:.3g} MFLOP per example (Dense and Conv2D layers); "
                  f"at the {f['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s matmul rate measured now, the compute limit "
                  f"is {f['compute_limit_examples_per_s']:,.0f} examples/s.", ""]
    else:
        lines += [f"FLOPs per example not computed (tfperf counts Keras Dense and Conv2D layers; this model computes "
                  f"in others too); matmul rate "
                  f"measured now: {f['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s.", ""]
    advice = d.advice
    if advice:
        lines += ["Advice, largest measured gain first (each a 95% interval from interleaved rounds that clears "
                  f"{MIN_GAIN:.0%}):", ""]
        for k, (a, also) in enumerate(advice, start=1):
            lines += [f"{k}. **{a.row}** instead of {a.baseline} ({a.section}): {a.comparison.describe()}. "
                      f"Apply: `{a.code}`. Costs: {a.cost}." + (f" {a.note}." if a.note else "")
                      + ("" if not also else " Also faster than " + a.baseline + ": " + "; ".join(
                          f"{o.row} {o.comparison.describe()}" for o in also) + ".")]
    else:
        lines += ["No change measured here is significantly faster than what the model does now."]
    lines += ["", "Measured without a gain that counts (not advised):", ""]
    for n in d.no_gain:
        why = n.comparison.describe() + ("" if n.agrees else f"; and {n.note}")
        lines.append(f"- {n.row} against {n.baseline} ({n.section}): {why}")
    if d.skipped:
        lines += ["", "Not measured:", ""] + [f"- {k}: {v}" for k, v in d.skipped.items()]
    took = f"Doctor took {d.elapsed_s:.0f} s"
    if goal_s is not None:
        took += f" (goal for --quick: under {goal_s:.0f} s: {'met' if d.elapsed_s <= goal_s else 'NOT met'})"
    lines += ["", took + "."]
    return "\n".join(lines)


def write_report(d: Diagnosis, out: Path, *, goal_s: float | None = None) -> Path:
    """out/doctor.jsonl (the cookbook's record format), out/report.md with tables and figures."""
    from tfperf.records.report import build_report, write_conclusion

    d.recorder.save(out)
    write_conclusion(out, RECIPE, summary(d, goal_s=goal_s))
    return build_report(out, order=[RECIPE], title=f"tfperf doctor: {d.subject.name}")
