"""A watched run's report: the split of its time and what to change first, then each epoch, trace and call, folded."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any, Mapping

from tfperf.watch.analysis import Analysis
from tfperf.watch.findings import FitSplit, epoch_batches, epoch_examples, megabytes, seconds, share
from tfperf.records.units import number


def _parts(parts: Sequence[tuple[str, float]], whole: float) -> str:
    return ", ".join(f"{name} {seconds(s)} ({share(s, whole)})" for name, s in parts if s > 0)


def headline(analysis: Analysis, command: Sequence[str] | str, ending: str) -> str:
    """One sentence: how long the run took and where the time went."""
    a = analysis
    known = a.imports_s + a.fit.seconds + a.calls_s + a.functions_s
    parts = [("fit()", a.fit.seconds), ("importing TensorFlow and Keras", a.imports_s),
             ("evaluate() and predict() outside fit", a.calls_s),
             ("the program's own tf.functions (their tracing included)", a.functions_s),
             ("the rest (start-up and the program's own code)", max(0.0, a.wall_s - known))]
    name = command if isinstance(command, str) else shlex.join(command)  # a session's name is said as it is
    if a.process is None:
        return f"`{name}` ran {seconds(a.wall_s)} ({ending}); no Keras or TensorFlow work was seen in it."
    return f"`{name}` ran {seconds(a.wall_s)} ({ending}): {_parts(parts, a.wall_s)}."


def fit_sentence(split: FitSplit) -> str:
    """Of fit's time: steps, validation, callbacks (named), set-up, the rest."""
    if split.seconds <= 0:
        return ""
    named = sorted(split.callbacks.items(), key=lambda kv: -kv[1])
    callbacks = sum(split.callbacks.values())
    inner = "; ".join(f"{n} {seconds(s)}" for n, s in named[:3] if s >= 0.001)
    cb = f"callbacks {seconds(callbacks)} ({share(callbacks, split.seconds)}{': ' + inner if inner else ''})"
    if split.callbacks_async:
        cb += " in a thread beside the steps"
    parts = [("steps (input and compute)", split.steps), ("validation", split.validation),
             ("set-up before and after the epochs", split.set_up), ("the rest of the epochs", split.rest)]
    head, tail = _parts(parts[:2], split.seconds), _parts(parts[2:], split.seconds)
    return f"Of fit's {seconds(split.seconds)}: {head}, {cb}, {tail}."


def advice_lines(analysis: Analysis) -> list[str]:
    """The findings, most costly first, each with what to try; or why there is none."""
    if not analysis.findings:
        if analysis.process is None:
            return []
        return ["Nothing in this run crossed a finding's bar (a callback at 5% of fit, validation at 15%, a first "
                "epoch 1.5x the others, 3 traces of one function, a predict() loop, memory growing 50 MB, steps "
                "slowing 1.2x)."]
    lines = []
    for i, f in enumerate(analysis.findings, 1):
        cost = f" (cost {seconds(f.seconds)})" if f.seconds >= 0.001 else ""
        lines.append(f"{i}. **{f.key}**{cost}: {f.text}. Try: {f.fix}.")
    return lines


def _epoch_rows(fits: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = ["| fit | epoch | seconds | steps | batches | throughput | validation | callbacks | traces | RSS |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for n, fit in enumerate(fits, 1):
        for e in fit.get("epochs_run", []):
            batches, examples = epoch_batches(fit, e)[0], epoch_examples(fit, e)
            per_s = (examples if examples is not None else batches) / e["steps_s"] if e["steps_s"] > 0 else 0.0
            speed = f"{per_s:,.0f} examples/s" if examples is not None else f"{per_s:,.1f} batches/s"
            rss = megabytes(e["rss"]) if e.get("rss") else "-"
            traced = f" ({e['profiled_steps']} under the profiler)" if e.get("profiled_steps") else ""
            rows.append(f"| {n} | {e['epoch'] + 1}{traced} | {seconds(e['seconds'])} | {seconds(e['steps_s'])} | "
                        f"{batches:,} | {speed} | {seconds(e['validation_s'])} | "
                        f"{seconds(sum(e['callbacks'].values()))} | {e['traces']} | {rss} |")
    return rows


def _trace_rows(traces: Sequence[Mapping[str, Any]]) -> list[str]:
    grouped: dict[tuple[str, str], list[float]] = {}
    for t in traces:
        key = (str(t["name"]), str(t.get("site")))
        grouped.setdefault(key, []).append(t["seconds"])
    rows = ["| function | called from | traces | tracing |", "|---|---|---|---|"]
    for (name, site), times in sorted(grouped.items(), key=lambda kv: -sum(kv[1])):
        rows.append(f"| `{name}` | {site} | {len(times)} | {seconds(sum(times))} |")
    return rows


def _call_rows(calls: Mapping[str, Mapping[str, Any]]) -> list[str]:
    rows = ["| call | at | calls | batches | in all | a call |", "|---|---|---|---|---|---|"]
    for c in sorted(calls.values(), key=lambda c: -c["seconds"]):
        rows.append(f"| {c['kind']}() | {c['site']} | {c['calls']:,} | {c['batches']:,} | {seconds(c['seconds'])} | "
                    f"{seconds(c['seconds'] / c['calls'])} |")
    return rows


def _function_rows(functions: Mapping[str, Mapping[str, Any]]) -> list[str]:
    rows = ["| tf.function | defined at | first called from | calls | in all | median a call |",
            "|---|---|---|---|---|---|"]
    for fn in sorted(functions.values(), key=lambda fn: -fn["seconds"]):
        median = sorted(fn["sample"])[len(fn["sample"]) // 2] if fn["sample"] else 0.0
        rows.append(f"| `{fn['name']}` | {fn['defined_at']} | {fn['site']} | {fn['calls']:,} | "
                    f"{seconds(fn['seconds'])} | {seconds(median)} |")
    return rows


def doctor_lines(doctor: Mapping[str, Any] | None) -> list[str]:
    """What the doctor made of the first fit the watch kept: its command, and what it said once it ran."""
    if not doctor:
        return []
    lines = ["## The doctor on what the watch caught", ""]
    c = doctor.get("captured") or {}
    if c:
        lines += [f"Your first fit() ran at batch {c.get('batch_size')}, steps_per_execution "
                  f"{c.get('steps_per_execution')}, jit_compile {c.get('jit_compile')}, {c.get('dtype_policy')} "
                  f"({c.get('optimizer')}, learning rate {number(c.get('learning_rate') or 0, 3)}).", ""]
    if not doctor.get("command"):
        return lines + [f"Not searched: {doctor['why']}.", ""]
    cmd = shlex.join(doctor["command"])
    if "said" not in doctor:
        return lines + [f"To search the best configuration (steps_per_execution, XLA, mixed precision, the batch) "
                        f"{doctor['why']}:", "", "```bash", cmd, "```", ""]
    batch = c.get("batch_size") or 32
    return lines + [f"`{cmd}` searched {doctor['why']} (exit {doctor['exit_code']}); its figures are against plain "
                    f"fit at batch {batch} on those rows; its whole report is in {doctor['command'][-1]}:", "",
                    *training_answer(doctor["said"]), ""]


def training_answer(said: str) -> list[str]:
    """The doctor's answer about training, from what it printed: its best configuration, the code, the
    confirmation; up to its list of advice. The whole of it when that paragraph is not there (an error)."""
    text = said.strip().splitlines()
    start = next((i for i, line in enumerate(text) if line.startswith("**Best configuration for training**")), None)
    if start is None:
        return ["```text", *text[-20:], "```"]
    end = next((i for i in range(start, len(text)) if text[i].startswith("Advice, ")), len(text))
    return text[start:end]


def _fold(summary: str, rows: list[str]) -> list[str]:
    return ["<details><summary>" + summary + "</summary>", "", *rows, "", "</details>", ""]


def markdown(analysis: Analysis, command: Sequence[str] | str, ending: str, sections: Sequence[str] = ()) -> str:
    """report.md: the answer first, the detail folded."""
    p = analysis.process or {}
    lines = ["# tfperf watch", "", "**" + headline(analysis, command, ending) + "**", ""]
    if analysis.fit.seconds > 0:
        lines += [fit_sentence(analysis.fit), ""]
    if analysis.input_line:
        lines += [analysis.input_line, ""]
    advice = advice_lines(analysis)
    if advice:
        lines += ["## What to change first", "", *advice, ""]
    if analysis.memory_line:
        lines += [analysis.memory_line, ""]
    fits = p.get("fits", [])
    if fits:
        lines += _fold(f"Epochs ({sum(len(f.get('epochs_run', [])) for f in fits)} in {len(fits)} fit() "
                       f"call{'s' if len(fits) > 1 else ''})", _epoch_rows(fits))
    if p.get("traces"):
        lines += _fold(f"tf.function traces ({len(p['traces'])})", _trace_rows(p["traces"]))
    if p.get("functions"):
        lines += _fold("The program's own tf.functions, called outside fit", _function_rows(p["functions"]))
    if p.get("calls"):
        lines += _fold("evaluate(), predict() and *_on_batch() outside fit", _call_rows(p["calls"]))
    lines += list(sections)
    if analysis.processes > 1:
        which = (f"rank 0 of {analysis.ranks} ranks" if p.get("rank") == 0 else
                 "the one with the most Keras work")
        lines += [f"{analysis.processes} Python processes of this run were watched; this report reads {which} "
                  f"(pid {p.get('pid')}).", ""]
    elif p.get("rank") is not None:  # a session or a Watch in one rank of a launcher's run: it saw its rank alone
        lines += [f"This report reads the process of rank {p['rank']} alone (pid {p.get('pid')}); under a launcher "
                  f"each rank's tfperf.keras.Watch() or session writes its own report (rank 0's in the folder "
                  f"given, rank N's in its rankN folder).", ""]
    if analysis.not_measured:
        lines += ["## Not measured", "", *[f"- {n}" for n in analysis.not_measured], ""]
    return "\n".join(lines)


def summary(analysis: Analysis, command: Sequence[str], ending: str, report: str,
            sections: Sequence[str] = ()) -> str:
    """What the watch prints on stderr when the run ends: the headline and the findings, one line each."""
    lines = ["", "tfperf watch: " + headline(analysis, command, ending)]
    if analysis.fit.seconds > 0:
        lines.append("  " + fit_sentence(analysis.fit))
    if analysis.input_line:
        lines.append("  " + analysis.input_line)
    lines += ["  " + line.replace("**", "") for line in advice_lines(analysis)]
    if analysis.memory_line:
        lines.append("  " + analysis.memory_line)
    lines += ["  " + line.replace("**", "") for line in sections if line and not line.startswith(("```", "## "))]
    lines.append(f"  report: {report}")
    return "\n".join(lines)
