"""`tfperf watch --apply DIR`: the doctor's best configuration (from an earlier `watch --doctor` into DIR) put on the
program's own first fit() (and the later fit() calls of its model), and judged against that earlier run's, epoch for
epoch."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf.flags import UserError
from tfperf.watch.findings import epoch_batches, epoch_examples, primary, seconds
from tfperf.records.units import number

HEADLINE_TABLE = "best configuration against plain fit"  # the doctor's race of its best against plain fit


def best_configuration(folder: Path) -> dict[str, Any]:
    """The knobs of the doctor's best training configuration and its claim, from FOLDER/doctor/doctor.jsonl."""
    records = folder / "doctor" / "doctor.jsonl"
    if not records.is_file():
        raise UserError(f"--apply {folder}: no doctor's records there (doctor/doctor.jsonl): run `tfperf watch "
                        f"--doctor --out {folder} -- COMMAND` first")
    rows = [r for r in map(json.loads, records.read_text().splitlines()) if r.get("table") == HEADLINE_TABLE]
    if not rows or "steps_per_execution" not in rows[-1]["metrics"]:
        raise UserError(f"--apply {folder}: the doctor's records there hold no best configuration for training "
                        f"(made by a doctor without the search, or an older one): run `tfperf watch --doctor` again")
    # The row the report recommends; a doctor before "recommended" was recorded: the one raced last (plain fit first,
    # then the best at your batch, the best).
    best = next((r for r in rows if r["metrics"].get("recommended")), rows[-1])
    m = best["metrics"]
    return {"label": best["row"], "claim": best.get("ratio"), "steps_per_execution": m["steps_per_execution"],
            "jit_compile": m["jit_compile"], "policy": m["policy"], "batch": m["batch"]}


def earlier_run(folder: Path) -> Mapping[str, Any]:
    """The first fit() of the run watched into FOLDER (its watch.json): what the change is judged against."""
    try:
        record = json.loads((folder / "watch.json").read_text())
    except (OSError, ValueError):
        raise UserError(f"--apply {folder}: no watch.json there: give the --out folder of `tfperf watch --doctor`")
    fit = first_fit(record.get("processes", []))
    if fit is None:
        raise UserError(f"--apply {folder}: the run watched there ran no fit() to the end of an epoch")
    return fit


def first_fit(processes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first fit() that ran an epoch, with the epochs of every later fit() of the same model after its own (a
    script calling fit(epochs=1) in a loop is judged over the loop)."""
    main = primary(processes)
    fits = [f for f in (main or {}).get("fits", []) if f.get("epochs_run")]
    if not fits:
        return None
    same = [f for f in fits if f.get("model_id") is not None and f.get("model_id") == fits[0].get("model_id")]
    return {**fits[0], "epochs_run": [e for f in (same or fits[:1]) for e in f["epochs_run"]], "fits": len(same) or 1}


@dataclasses.dataclass(frozen=True)
class Side:
    """One run's first fit over the epochs compared: whole-epoch throughput, steps alone, the loss it ended on."""

    examples_per_s: float
    per_example_steps: list[float]  # each step's seconds per example (epochs after the first)
    loss: float | None
    settings: str


def side(fit: Mapping[str, Any], epochs: int) -> Side:
    """Epochs 2..`epochs` (the first pays tracing once), or the only one."""
    run = fit["epochs_run"][:epochs]
    timed = run[1:] or run
    batch = fit.get("batch_size") or fit.get("batch_size_arg") or 32
    spe = fit.get("steps_per_execution") or 1
    sized = {**fit, "batch_size": batch}
    examples = sum(epoch_examples(sized, e) or 0 for e in timed)
    per_example = [s / (n * batch) for e in timed
                   for s, n in zip(e["step_sample"], epoch_batches(sized, e)[1]) if n > 0]
    settings = (f"batch {batch}, steps_per_execution {spe}, jit_compile {fit.get('jit_compile')}, "
                f"{fit.get('dtype_policy')}")
    return Side(examples / max(sum(e["seconds"] for e in timed), 1e-9), per_example, run[-1].get("loss"), settings)


def confirmation_lines(before: Mapping[str, Any], processes: Sequence[Mapping[str, Any]], best: Mapping[str, Any],
                       folder: Path) -> list[str]:
    """The report's section: the change as it took, the earlier run against this one, epoch for epoch."""
    from tfperf.measure.stats import ratio_ci

    lines = ["## The doctor's best configuration, confirmed in your run", ""]
    main = primary(processes) or {}
    applied, after = main.get("applied"), first_fit(processes)
    if applied is None or after is None:
        return lines + ["Not confirmed: this run ran no fit() to the end of an epoch.", ""]
    epochs = min(len(before["epochs_run"]), len(after["epochs_run"]))
    a, b = side(before, epochs), side(after, epochs)
    calls = f" ({after['fits']} fit() calls of its model)" if after.get("fits", 1) > 1 else ""
    rate = f"; learning rate scaled to {number(applied['learning_rate'], 3)}" if applied.get("learning_rate") else ""
    lines.append(f"Applied to the first fit(){calls}: {best['label']} (the doctor claimed {best['claim'] or 0:.2f}x "
                 f"against plain fit); it ran at {b.settings}{rate}.")
    lines += [f"Not applied: {n}." for n in applied.get("not_applied", [])]
    which = f"epochs 2-{epochs}" if epochs > 2 else "epoch 2" if epochs == 2 else "its one epoch (first-call costs in)"
    lines.append(f"Your run as configured ({folder}/watch.json, {a.settings}): {a.examples_per_s:,.0f} examples/s "
                 f"over {which}, whole epochs (steps, callbacks, validation); with the change: "
                 f"{b.examples_per_s:,.0f} examples/s, **{b.examples_per_s / a.examples_per_s:.2f}x**.")
    lines.append(f"Its epochs took {seconds(fit_seconds(before))} in all as configured ({len(before['epochs_run'])} "
                 f"epochs) and {seconds(fit_seconds(after))} with the change ({len(after['epochs_run'])} epochs).")
    if len(a.per_example_steps) >= 5 and len(b.per_example_steps) >= 5:
        ratio, (low, high) = ratio_ci(a.per_example_steps, b.per_example_steps)
        lines.append(f"The steps alone, per example: {ratio:.2f}x (95% CI {low:.2f}-{high:.2f}x; two runs one after "
                     f"the other, so the interval does not see what changes between processes).")
    if a.loss is not None and b.loss is not None:
        lines.append(f"Loss after epoch {epochs}: {number(a.loss, 4)} as configured, {number(b.loss, 4)} "
                     f"with the change"
                     + (" (a larger batch changes the optimisation: judge it by your own metric)."
                        if "batch" in best["label"] else "."))
    return lines + [""]


def fit_seconds(fit: Mapping[str, Any]) -> float:
    """The seconds of the epochs first_fit gathered (each fit()'s set-up aside)."""
    return sum(e["seconds"] for e in fit["epochs_run"])


def apply_environment(best: Mapping[str, Any]) -> str:
    """The probe's TFPERF_WATCH_APPLY value."""
    return json.dumps({k: best[k] for k in ("steps_per_execution", "jit_compile", "policy", "batch")})

