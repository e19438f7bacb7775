"""Records into Markdown tables and PNG charts, and a whole results folder into one report."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf import extras
from tfperf.records import units
from tfperf.measure import stats
from tfperf.records.jsonl import atomic_write_text, read_records
from tfperf.records.noise import Noise, measure_noise, rerun_range
from tfperf.records.runs import read_runs, repeat_dirs

Record = Mapping[str, Any]
# The report's first section: one line per recipe (its headline).
FINDINGS = "What this run found"
# What a reader can do about a verdict that rests on an unstable row.
# Below this many runs, a report says how much Student's t widens the rerun ranges their spread gives.
FEW_RUNS = 5
STEADIER = "rerun with `tfperf run --repeat 3`, or on a quieter machine"


def fmt(value: Any, metric: str | None = None) -> str:
    """A number in the unit `metric`'s name says it holds (ms, MiB, %), about four significant digits, no
    exponents; anything else as text."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, (int, float)):
        return units.write(value, metric)
    return str(value)


def speedup(record: Record, baseline: Record) -> float:
    """How many times better `record` is than `baseline` on the primary metric."""
    key = record["primary"]
    a, b = float(baseline["metrics"][key]), float(record["metrics"][key])
    if a == 0 or b == 0:
        return float("nan")
    return a / b if record["lower_is_better"] else b / a


def group_tables(records: Iterable[Record]) -> dict[tuple[str, str], list[Record]]:
    """Records grouped by (recipe, table), each in the order measured."""
    tables: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        tables.setdefault((r["recipe"], r["table"]), []).append(r)
    return tables


def row_ratio(record: Record, baseline: Record) -> tuple[float, tuple[float, float] | None, str | None]:
    """`record` against `baseline`: (speedup on the primary metric, its 95% CI, verdict).

    A row that carries its own comparison (measured interleaved with its `versus` row) uses it;
    otherwise, when both rows kept their samples, the CI is bootstrapped from them as independent
    sets; rows without samples get no CI and no verdict.
    """
    point = speedup(record, baseline)
    if record.get("verdict") and record.get("versus") == baseline["row"]:
        return float(record["ratio"]), tuple(record["ratio_ci95"]), record["verdict"]
    if record is baseline or not (record.get("samples_s") and baseline.get("samples_s")) or not math.isfinite(point):
        return point, None, None
    per_call = stats.compare_times(per_call_samples(baseline), per_call_samples(record))
    # The primary metric is proportional to the time per call (or its inverse), so its ratio is the
    # per-call ratio times a constant: scale the interval by the same constant. The verdict is the same.
    scale = point / per_call.ratio
    return point, (per_call.ci95[0] * scale, per_call.ci95[1] * scale), per_call.verdict


def per_call_samples(record: Record) -> list[float]:
    """A timed record's samples as seconds per call (blocks divided by their size)."""
    block = (record.get("timing") or {}).get("block_size", 1)
    return [s / block for s in record["samples_s"]]


def markdown_table(records: Sequence[Record], columns: Sequence[str] | None = None, *,
                   reruns: Sequence[Sequence[Record]] = (), noise: Noise | None = None, fold: bool = False,
                   steadier: str = STEADIER) -> str:
    """A Markdown table of one recipe table: metrics, the primary metric's 95% CI, and each row against
    the row it was compared with (or the first row) with the ratio's CI and verdict.

    Args:
        reruns: the same table from other runs in fresh processes (`tfperf run --repeat`): a column then
            shows each row's primary metric across all runs and how often each verdict came out.
        noise: a calibration of run-to-run noise: a column then shows where each row's primary metric lands
            in a rerun on this machine (95%).
        fold: put each unstable row's warnings in an HTML <details> under the table's one-line summary
            (a report); otherwise list them (a terminal).
        steadier: what to do when a verdict rests on an unstable row.
    """
    if not records:
        raise ValueError("no records to tabulate")
    if columns is None:
        columns = list(dict.fromkeys(k for r in records for k in r["metrics"]))
    ratios = len(records) > 1 and records[0].get("versus_first", True)
    with_ci = any(r.get("ci95") for r in records)
    compared = any(r.get("verdict") for r in records)
    rerun = {r["row"]: rerun_cell(r, noise) for r in records} if noise is not None else {}
    with_rerun = any(rerun.values())
    header = ["", *columns, *([f"{records[0]['primary']} 95% CI (this run)"] if with_ci else []),
              *([f"{records[0]['primary']} rerun (95%)"] if with_rerun else []),
              *([f"speedup vs {records[0]['row']}"] if ratios and not compared else []),
              *(["speedup (95% CI): verdict"] if compared else []),
              *([f"{records[0]['primary']} across {len(reruns) + 1} runs"] if reruns else [])]
    by_row = {r["row"]: r for r in records}
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in records:
        name = r["row"] + (" (!)" if (r.get("timing") or {}).get("warnings") else "")
        cells = [name, *(fmt(r["metrics"].get(c), c) for c in columns)]
        if with_ci:
            cells.append(units.span(*r["ci95"], r["primary"]) if r.get("ci95") else "-")
        if with_rerun:
            cells.append(rerun[r["row"]] or "-")
        if compared:
            base = by_row.get(r.get("versus")) if r.get("versus") else None
            cells.append(_ratio_cell(r, base, name_baseline=True) if base is not None else "-")
        elif ratios:
            cells.append(_ratio_cell(r, records[0], name_baseline=False))
        if reruns:
            cells.append(run_to_run(r, [x for run in reruns for x in run if x["row"] == r["row"]]))
        lines.append("| " + " | ".join(cells) + " |")
    summary, per_row = instability(records, steadier)
    if not summary:
        return "\n".join(lines)
    if fold:
        per_row = ["<details><summary>the unstable rows</summary>", "", *per_row, "", "</details>"]
    return "\n".join([*lines, "", summary, "", *per_row])


def instability(records: Sequence[Record], steadier: str = STEADIER) -> tuple[str, list[str]]:
    """A table's unstable rows said once: ('(!) 3 of 7 rows unstable; the verdicts of a, b rest on one: ...',
    ['- a: IQR is ...', ...]), or ('', []) when every row was steady."""
    warned = {r["row"]: r["timing"]["warnings"] for r in records if (r.get("timing") or {}).get("warnings")}
    if not warned:
        return "", []
    by_row = {r["row"]: r for r in records}
    # A verdict rests on a row when the row is judged, or is the baseline another row is judged against.
    judged = [r["row"] for r in records if r.get("verdict")]
    if not judged and len(records) > 1 and records[0].get("versus_first", True) and any(r.get("samples_s") for r in records):
        judged = [r["row"] for r in records[1:]]
    weak = [row for row in judged if row in warned or
            (by_row[row].get("versus") or records[0]["row"]) in warned]
    summary = f"(!) {len(warned)} of {len(records)} rows unstable (marked (!))"
    summary += (f"; the verdicts of {', '.join(weak)} rest on one: {steadier}."
                if weak else "; no verdict rests on them.")
    return summary, [f"- {row}: {'; '.join(w)}" for row, w in warned.items()]


def rerun_cell(record: Record, noise: Noise) -> str:
    """'5.2-6.9': where the row's primary metric lands in a rerun on this machine (95%), or ''."""
    spread = noise.spread((record["recipe"], record["table"], record["row"], "primary"))
    value = record["metrics"].get(record["primary"])
    if not isinstance(value, (int, float)) or not value > 0:
        return ""
    low, high = rerun_range(float(value), spread, record.get("ci95"))
    return units.span(low, high, record["primary"])


def run_to_run(record: Record, others: Sequence[Record]) -> str:
    """'5.9-6.1 (spread 3%); faster 3/3': the primary metric's range over the runs, its spread (range over
    median) and the verdicts they reached, when they judged the row."""
    runs = [record, *others]
    values = [float(r["metrics"][record["primary"]]) for r in runs if r["metrics"].get(record["primary"]) is not None]
    if not values:
        return "-"
    mid = sorted(values)[len(values) // 2]
    spread = (max(values) - min(values)) / abs(mid) if mid else float("nan")
    text = f"{units.span(min(values), max(values), record['primary'])} (spread {spread:.0%})"
    verdicts = [r["verdict"] for r in runs if r.get("verdict")]
    if verdicts:
        counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
        text += "; " + ", ".join(f"{v} {c}/{len(runs)}" for v, c in counts.items())
    if len(values) < len(runs):
        text += f"; missing in {len(runs) - len(values)} run(s)"
    return text


def _ratio_cell(record: Record, baseline: Record, *, name_baseline: bool) -> str:
    point, ci, word = row_ratio(record, baseline)
    if ci is None:
        return f"{point:.2f}x"
    than = f" than {baseline['row']}" if name_baseline and word != stats.NO_DIFFERENCE else ""
    return f"{point:.2f}x ({ci[0]:.2f}-{ci[1]:.2f}): {word}{than}"


def slug(text: str) -> str:
    """A file-name-safe version of a table's name."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "table"


def save_figure(fig, path: Path | str) -> Path:
    """Write a matplotlib figure as a PNG (folders made as needed) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bar_chart(records: Sequence[Record], path: Path | str, *, title: str | None = None) -> Path:
    """A horizontal bar chart of the primary metric, log-scaled when it spans two decades."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt

    key = records[0]["primary"]
    records = [r for r in records if r["metrics"].get(key) is not None]  # a row that could not measure it
    names = [r["row"] for r in records]
    values = [float(r["metrics"][key]) for r in records]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(records) + 1.4))
    ax.barh(names[::-1], values[::-1], color="#4C72B0")
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 100:
        ax.set_xscale("log")
    better = "lower is better" if records[0]["lower_is_better"] else "higher is better"
    ax.set_xlabel(f"{key} ({better})")
    ax.set_title(title or f"{records[0]['recipe']}: {records[0]['table']}")
    for y, v in enumerate(values[::-1]):
        ax.annotate(fmt(v, key), (v, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    return save_figure(fig, path)


def timeline_chart(
    lanes: Mapping[str, Sequence[tuple[float, float, str]]],
    path: Path | str,
    *,
    title: str,
    colors: Mapping[str, str] | None = None,
) -> Path:
    """A Gantt chart: one lane per worker, each interval (start_s, end_s, kind) a bar colored by kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    palette = dict(colors or {})
    default = iter(["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"])
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(lanes) + 1.5))
    for y, (lane, intervals) in enumerate(reversed(list(lanes.items()))):
        for start, end, kind in intervals:
            if kind not in palette:
                palette[kind] = next(default)
            ax.barh(y, (end - start) * 1e3, left=start * 1e3, color=palette[kind], height=0.6)
    ax.set_yticks(range(len(lanes)), list(reversed(list(lanes))))
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in palette.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.18), ncol=len(palette), fontsize=8, frameon=False)
    return save_figure(fig, path)


def environment_summary(env: Mapping[str, Any]) -> str:
    """One line naming the machine and software a run was measured on."""
    gpus = ", ".join(env.get("gpus") or []) or "no GPU"
    stolen = env.get("cpu_steal")
    return (
        f"{env.get('cpu')} ({env.get('cores')} cores), {gpus}; Python {env.get('python')}, "
        f"TensorFlow {env.get('tensorflow')}, Keras {env.get('keras')}; "
        f"tfperf {env.get('tfperf')} @ {env.get('git_commit') or 'no git'}"
        + (f"; the hypervisor took {stolen:.1%} of the machine's CPU time meanwhile" if stolen else "")
    )


def conclusion_path(out: Path | str, recipe: str) -> Path:
    """Where a recipe leaves its conclusion (computed from its own run) for the report."""
    return Path(out) / f"{recipe}.conclusion.md"


def write_conclusion(out: Path | str, recipe: str, text: str) -> Path:
    """Save a recipe's conclusion next to its records."""
    path = conclusion_path(out, recipe)
    atomic_write_text(path, text.strip() + "\n")
    return path


def run_noise(results_dir: Path, calibration: Noise | None) -> Noise | None:
    """The noise a report's rerun ranges come from: the folder's own runs when it holds repeats (saved beside
    them as noise.json, a calibration for later runs), else the calibration given, else None."""
    if repeat_dirs(results_dir):
        runs = read_runs(results_dir)
        if len(runs) >= 2:
            noise = measure_noise(runs, str(results_dir))
            noise.save(results_dir)
            return noise
    return calibration


def intervals_note(noise: Noise | None, results_dir: Path) -> str:
    """What the report's intervals are: within one run, and where a rerun lands, measured from what."""
    within = ("\"95% CI\" is the interval within this run: the spread of samples inside its processes, which "
              "does not see what changes from one process to the next.")
    if noise is None:
        return (f"{within} No rerun ranges: no calibration of run-to-run noise on this machine was given "
                f"(`tfperf run --repeat 3` measures one; `tfperf run --calibration DIR` uses it).")
    own = Path(noise.where) == results_dir
    source = f"this folder's own {noise.runs} runs" if own else f"the calibration {noise.describe()}"
    return (f"{within} \"rerun\" is where the same figure lands in another run on this machine (95%), from "
            f"the spread between runs of the same code in fresh processes ({source}).{few_runs_note(noise.runs)}")


def few_runs_note(runs: int) -> str:
    """What resting on few runs does to the rerun ranges (Student's t on a spread learnt from them), in words;
    nothing from FEW_RUNS runs on."""
    if runs >= FEW_RUNS:
        return ""
    wider = stats.t_quantile(0.975, runs - 1) / stats.t_quantile(0.975, math.inf)
    return (f" Learnt from {runs} runs, a figure's own spread has {runs - 1} degree{'s' if runs > 2 else ''} of "
            f"freedom, and Student's t makes its range up to {wider:.1f}x as wide (on a log scale) as the same spread measured over "
            f"many runs (its recipe's other figures, pooled in, narrow that): `tfperf run --repeat {FEW_RUNS}` or "
            f"more gives ranges to lean on.")


def build_report(results_dir: Path | str, *, order: Sequence[str] = (), title: str = "tfperf report",
                 steadier: str = STEADIER, calibration: Noise | None = None) -> Path:
    """Write results_dir/report.md and report.html: the findings table (each recipe's headline), then per
    recipe its conclusion, tables, charts and extra figures. `steadier`: what to do about unstable rows;
    `calibration`: run-to-run noise for the rerun ranges of a folder that holds one run."""
    from tfperf.records.findings import caution, findings_table, headline_path, read_headline
    from tfperf.records.html import write_html

    results_dir = Path(results_dir)
    files = sorted(results_dir.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no *.jsonl records in {results_dir}: run a recipe with --out {results_dir}")
    rank = {name: i for i, name in enumerate(order)}
    files.sort(key=lambda f: (rank.get(f.stem, len(rank)), f.stem))
    figures = results_dir / "figures"
    reruns = repeat_dirs(results_dir)
    noise = run_noise(results_dir, calibration)
    sections, found = [], []
    drawn, html = extras.installed("matplotlib"), extras.installed("markdown")
    for f in files:
        records = read_records(f)
        recipe = records[0]["recipe"] if records else f.stem
        headline = read_headline(headline_path(results_dir, recipe))
        again = [h.verdict for h in (read_headline(headline_path(d, recipe)) for d in reruns) if h is not None]
        found.append((recipe, headline, caution(headline, records) if headline else "",
                      [headline.verdict, *again] if headline and again else [],
                      noise.headline_rerun(recipe, headline) if headline and noise else None))
        sections += [f"## {recipe}", ""]
        if records:  # nothing measured (every step skipped, say): what it concluded still belongs here
            sections += [f"Measured on {environment_summary(records[0]['env'])}.", ""]
        conclusion = conclusion_path(results_dir, recipe)
        if conclusion.exists():  # what it concluded first, the tables it rests on after (its headings under ours)
            text = re.sub(r"^(#{2,5}) ", r"#\1 ", conclusion.read_text().strip(), flags=re.MULTILINE)
            sections += ["**Conclusion.** " + text, ""]
        tables = group_tables(records)
        others = [group_tables(read_records(d / f.name)) for d in reruns if (d / f.name).exists()]
        for (_, table), rows in tables.items():
            again_rows = [o.get((recipe, table), []) for o in others]
            sections += [f"### {table}", "", markdown_table(rows, reruns=again_rows, noise=noise, fold=True,
                                                            steadier=steadier), ""]
            if len(rows) > 1 and drawn:  # one bar compares nothing
                chart = bar_chart(rows, figures / f"{recipe}-{slug(table)}.png")
                sections += [f"![{table}](figures/{chart.name})", ""]
        table_charts = {f"{recipe}-{slug(t)}.png" for (_, t) in tables}
        for extra in sorted(figures.glob(f"{recipe}-*.png")):
            if extra.name not in table_charts:  # a recipe's own figures, such as a timeline
                sections += [f"![{extra.stem}](figures/{extra.name})", ""]
    parts = [f"# {title}", ""]
    if reruns:
        parts += [f"Each recipe ran {len(reruns) + 1} times in fresh processes: the tables show the first run, "
                  f"and a column the spread over all runs and the verdicts each reached.", ""]
    parts += [f"## {FINDINGS}", "", findings_table(found, steadier), "", intervals_note(noise, results_dir), ""]
    if not (drawn and html):
        parts += [f"No charts and no report.html: they need matplotlib and Markdown, which are not installed here "
                  f"({extras.install_line('report')}).", ""]
    report = results_dir / "report.md"
    atomic_write_text(report, "\n".join(parts + sections))
    if html:
        write_html(report)
    return report
