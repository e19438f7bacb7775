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
        return Headline(str(found["lesson"]), str(found["figure"]), str(found.get("verdict", "")),
                        tuple(str(row) for row in found.get("rests_on", ())))
    except (ValueError, KeyError, TypeError):
        return None


def caution(headline: Headline, records: Sequence[Mapping[str, Any]]) -> str:
    """What weakens a headline: the unstable rows it rests on (a row of that name in any of the recipe's
    tables), or ''."""
    shaky = {r["row"] for r in records if (r.get("timing") or {}).get("warnings")}
    named = [row for row in headline.rests_on if row in shaky]
    if not named:
        return ""
    return f"rests on {'an unstable row' if len(named) == 1 else 'unstable rows'}: {', '.join(named)}"


def findings_table(found: Sequence[tuple[str, Headline | None, str, Sequence[str]]], steadier: str) -> str:
    """The Markdown findings table: one line per (recipe, headline, caution, verdicts in repeated runs),
    each recipe linking to its section; under it, what to do about a caution (`steadier`)."""
    repeated = any(again for *_, again in found)
    header = ["recipe", "lesson", "figure (95% CI)", "verdict", *(["verdicts over runs"] if repeated else []),
              "caution"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for recipe, headline, weak, again in found:
        cells = [f"[{recipe}](#{recipe})"]
        if headline is None:
            cells += ["(no headline: see its section)", "-", "-"]
        else:
            cells += [headline.lesson, headline.figure, headline.verdict or "-"]
        if repeated:
            counts = {v: list(again).count(v) for v in dict.fromkeys(again)}
            cells.append(", ".join(f"{v} {c}/{len(again)}" for v, c in counts.items()) or "-")
        cells.append(weak or "-")
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    if any(weak for _, _, weak, _ in found):
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

    @classmethod
    def compared(cls, lesson: str, comparison: Any) -> Headline:
        """A headline from a `stats.Comparison` of two recorded rows."""
        return cls(lesson, comparison.describe(), comparison.verdict, (comparison.baseline, comparison.candidate))

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
