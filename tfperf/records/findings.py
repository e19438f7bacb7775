"""What each run taught, one line per recipe: a recipe's headline (saved beside its records), and the
findings table a report opens with, which says where a headline rests on an unstable row."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf import jsonio
from tfperf.measure import stats
from tfperf.records.jsonl import atomic_write_text


def headline_path(out: Path | str, recipe: str) -> Path:
    """Where a recipe leaves its headline for the report."""
    return Path(out) / f"{recipe}.headline.json"


def read_headline(path: Path | str) -> Headline | None:
    """The headline saved at `path`, or None when there is none or it is not one (a report still builds)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        found = jsonio.loads(path.read_bytes(), str(path))
        value = found.get("value")
        ci = found.get("ci95")
        return Headline(str(found["lesson"]), str(found["figure"]), str(found.get("verdict", "")),
                        tuple(str(row) for row in found.get("rests_on", ())),
                        float(value) if value is not None else None, str(found.get("unit", "")),
                        (float(ci[0]), float(ci[1])) if ci else None)
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def caution(headline: Headline, records: Sequence[Mapping[str, Any]]) -> str:
    """What weakens a headline: the unstable rows it rests on (a row of that name in any of the recipe's
    tables), or ''."""
    shaky = {r["row"] for r in records if (r.get("timing") or {}).get("warnings")}
    named = [row for row in headline.rests_on if row in shaky]
    if not named:
        return ""
    return f"rests on {'an unstable row' if len(named) == 1 else 'unstable rows'}: {', '.join(named)}"


def findings_table(found: Sequence[tuple[str, Headline | None, str, Sequence[str], tuple[float, float] | None]],
                   steadier: str) -> str:
    """The Markdown findings table: one line per (recipe, headline, caution, verdicts in repeated runs, rerun
    range), each recipe linking to its section; under it, what to do about a caution (`steadier`)."""
    repeated = any(again for _, _, _, again, _ in found)
    reran = any(rerun for *_, rerun in found)
    figure = "figure (95% CI within this run; rerun: where the next run lands)" if reran else \
        "figure (95% CI within this run)"
    header = ["recipe", "lesson", figure, "verdict", *(["verdicts over runs"] if repeated else []), "caution"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for recipe, headline, weak, again, rerun in found:
        cells = [f"[{recipe}](#{recipe})"]
        if headline is None:
            cells += ["(no headline: see its section)", "-", "-"]
        else:
            text = headline.figure + (f"; rerun {headline.range_text(*rerun)}" if rerun else "")
            cells += [headline.lesson, text, headline.verdict or "-"]
        if repeated:
            counts = {v: list(again).count(v) for v in dict.fromkeys(again)}
            cells.append(", ".join(f"{v} {c}/{len(again)}" for v, c in counts.items()) or "-")
        cells.append(weak or "-")
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    if any(weak for _, _, weak, _, _ in found):
        lines += ["", f"A verdict that rests on an unstable row (its samples spread widely) may not hold in the "
                      f"next run: {steadier}."]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Headline:
    """The one line a recipe's run taught: what it compared or measured, the figure with its interval, the
    verdict, and the rows the figure rests on (so the report can say when one was unstable)."""

    lesson: str
    figure: str
    verdict: str = ""
    rests_on: tuple[str, ...] = ()
    # The number the figure states, so that runs can be set side by side: positive (a ratio, a rate; an
    # error e is given as 1 + e), with its unit ("x" for a speedup, "error", or a unit such as "GFLOP/s")
    # and its 95% interval within this run, if it has one.
    value: float | None = None
    unit: str = ""
    ci95: tuple[float, float] | None = None

    @classmethod
    def compared(cls, lesson: str, comparison: Any, *, figure: str | None = None, verdict: str | None = None,
                 rests_on: tuple[str, ...] | None = None) -> Headline:
        """A headline from a `stats.Comparison` of two recorded rows (its value the speedup)."""
        return cls(lesson, comparison.describe() if figure is None else figure,
                   comparison.verdict if verdict is None else verdict,
                   (comparison.baseline, comparison.candidate) if rests_on is None else rests_on,
                   float(comparison.ratio), "x", tuple(map(float, comparison.ci95)))

    def value_text(self, value: float) -> str:
        """A value of this headline's figure in its own words: '2.31x' or '1.20x slower' (as the figure says
        a slowdown), '+14%' for an error, '213 GFLOP/s'."""
        if self.unit == "x":
            return f"{1 / value:.2f}x slower" if self.verdict == stats.SLOWER else f"{value:.2f}x"
        if self.unit == "error":
            return f"{value - 1:+.0%}"
        return f"{value:,.4g} {self.unit}".strip()

    def range_text(self, low: float, high: float) -> str:
        """A range of this headline's figure in its own words: '2.10-2.55x', '1.05-1.31x slower', '-9% to +38%'."""
        if self.unit == "x" and self.verdict == stats.SLOWER:
            return f"{1 / high:.2f}-{1 / low:.2f}x slower"
        if self.unit == "x":
            return f"{low:.2f}-{high:.2f}x"
        if self.unit == "error":
            return f"{low - 1:+.0%} to {high - 1:+.0%}"
        return f"{low:,.4g}-{high:,.4g} {self.unit}".strip()

    @classmethod
    def recorded(cls, lesson: str, record: Mapping[str, Any]) -> Headline:
        """A headline from a record judged against its `versus` row."""
        threshold = (record.get("compared") or {}).get("threshold") or 0.0
        return cls.compared(lesson, stats.Comparison(record["versus"], record["row"], float(record["ratio"]),
                                                     tuple(record["ratio_ci95"]), record["verdict"], paired=True,
                                                     threshold=threshold))

    def save(self, out: Path | str, recipe: str) -> Path:
        """Write it as JSON beside the recipe's records."""
        path = headline_path(out, recipe)
        atomic_write_text(path, json.dumps(dataclasses.asdict(self), indent=1) + "\n")
        return path
