"""A doctor run: the model's facts, then each experiment of the registry that applies, in order, within the budget.

The model is loaded from a Keras file, a SavedModel folder or `module:factory` (`load_subject`) and fed inputs that
respect what it declares (`tfperf.deploy.inputs`). Each experiment (`tfperf.doctor.registry.EXPERIMENTS`) measures
through tfperf.measure (interleaved rounds, verdicts from confidence intervals) and returns a Section; a profile pass
traces measured variants after their races. `advice` turns the gains whose interval clears the bar into advice
ranked by the measured ratio; the rest is listed as "no measurable gain" and not recommended.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from tfperf import extras, flags
from tfperf.deploy.errors import InputError, ModelError, said_line
from tfperf.deploy.loader import Subject
from tfperf.doctor.advice import Diagnosis
from tfperf.doctor.experiment import Context, Section
from tfperf.doctor.facts import model_facts
from tfperf.doctor.options import RECIPE, DoctorError, Options
from tfperf.doctor.profile import ProfilePass
from tfperf.doctor import registry

FIRST_STEP = "the model"  # its facts: parameters, FLOPs, the matmul rate measured now
LOADING = "start-up"  # Python, TensorFlow and the model loaded: before the first step, where the process start is known


def plan(subject: Subject, options: Options) -> list[str]:
    """The steps a run takes, in order (for a progress bar)."""
    return [FIRST_STEP, *[step for e in registry.taken(subject, options) for step in e.step_names(subject, options)]]


def prepare(subject: Subject, options: Options) -> Options:
    """The options with what the experiments read and check before anything is measured (a --data pipeline, a
    --train-step); DoctorError in one line where they refuse it."""
    for experiment in registry.EXPERIMENTS:
        if experiment.prepare is not None:
            options = experiment.prepare(subject, options)
    return options


def failure(exc: Exception) -> str:
    """An experiment's unexpected error in one line: where a process of its own failed, that process's last error
    line ('ModelError: ...'), not the lines of where."""
    parts = [part.strip() for part in str(exc).split(" | ")]
    said = [p for p in parts if re.match(r"[\w.]+(Error|Exception): ", p)]
    # A command line's refusal ('tfperf doctor: error: ...', exit 2), not the TensorFlow log lines printed before it.
    refused = [p for p in parts if ": error: " in p]
    if refused and not said:
        return f"{type(exc).__name__}: {said_line(refused[-1])}"
    line = said_line(said[-1] if said else str(exc)) or type(exc).__name__
    return re.sub(r"^(?:\w+\.)+(\w+(?:Error|Exception): )", r"\1", line) if said else f"{type(exc).__name__}: {line}"


def diagnose(subject: Subject, options: Options, workdir: Path, *, traces: Path | None = None,
             out: Path | None = None, progress: Callable[[str], None] = lambda step: None,
             say: Callable[[str], None] = lambda what: None, since: float | None = None) -> Diagnosis:
    """Every experiment the run takes, in turn (what a flag asked for first), each skipped (and said so) once the
    budget is spent, except the answers asked for by their own flag, which are never cut. The profile pass writes its
    traces under `traces` (default: workdir/traces); a section that writes beside the report writes in `out`
    (default: workdir); `say` shows what a long part is doing. `since`: when the process started (on
    time.perf_counter()'s clock), so that the time the report says is the run's by the wall clock, loading
    TensorFlow and the model included."""
    from tfperf.records.jsonl import Recorder

    started = time.perf_counter()
    args = {"model": subject.source, "batch_sizes": list(options.batch_sizes), "rounds": options.rounds,
            "train": options.train, "loss": options.loss, "seed": options.seed,
            "data": options.data.source if options.data is not None else None,
            "memory_budget": options.memory_budget}
    rec = Recorder(RECIPE, args)
    progress(FIRST_STEP)
    facts = model_facts(subject, quick=options.quick, sample=options.sample)
    took = {**({LOADING: started - since} if since is not None else {}), FIRST_STEP: time.perf_counter() - started}
    traces = traces or workdir / "traces"
    left_out: dict[str, str] = {}
    # The traces are read through XProf: without it (tfperf[profile]) the pass is said to be skipped, not tried.
    profiler = ProfilePass(traces, rec, facts) if options.profile and extras.installed("xprof") else None
    if options.profile and profiler is None:
        left_out["profile pass"] = f"not run: {extras.message('xprof', 'the profile pass')}"
    ctx = Context(subject, rec, options, workdir, traces, out or workdir, progress, facts, profiler, say=say,
                  ends_by=None if options.budget_s is None else started + options.budget_s)
    # What the budget counts: the run's time but its start-up, what a flag asked for (which runs first) included.
    spent, asked = took[FIRST_STEP], 0.0
    stopped: tuple[str, int] | None = None
    for experiment in registry.taken(subject, options):
        if stopped is not None:
            ctx.sections[experiment.name] = Section(experiment.name, skipped={
                experiment.name: f"not run: {stopped[0]}"})
            continue
        if experiment.budgeted and options.budget_s is not None and spent > options.budget_s:
            ctx.sections[experiment.name] = Section(experiment.name, skipped={
                experiment.name: f"not run: the --budget of {options.budget_s:.0f} s was spent ({spent:.0f} s"
                                 + (f", {asked:.0f} s of it by what the flags asked for, which runs first and is "
                                    f"never cut" if asked else "") + ")"})
            continue
        began = time.perf_counter()
        try:
            ctx.sections[experiment.name] = experiment.run(ctx)
        except (KeyboardInterrupt, flags.Stopped) as exc:  # what was measured before it is still reported
            how, code = ("Ctrl-C", 130) if isinstance(exc, KeyboardInterrupt) else ("SIGTERM", 143)
            stopped = (f"stopped by {how} during {experiment.name}", code)
            ctx.sections[experiment.name] = Section(experiment.name, skipped={
                experiment.name: f"not finished: {stopped[0]} (its rows measured so far are in the records)"})
        except (DoctorError, ModelError, InputError):
            raise  # the user's input, refused in one line by the command
        except Exception as exc:  # noqa: BLE001 - one experiment that breaks loses neither the others nor the report
            reason = failure(exc)
            ctx.sections[experiment.name] = Section(experiment.name, skipped={
                experiment.name: f"failed: {reason} (the other experiments ran; please report it)"})
            say(f"{experiment.name} failed: {reason}")
        took[experiment.name] = time.perf_counter() - began
        spent += took[experiment.name]
        asked += 0.0 if experiment.budgeted else took[experiment.name]
    elapsed = time.perf_counter() - (started if since is None else since)
    return Diagnosis(subject, rec, facts, ctx.sections, left_out, elapsed, took, profiler,
                     partial=stopped[0] if stopped else None, exit_code=stopped[1] if stopped else 0)
