"""The one shape every doctor experiment has: its flags and their rules, when it applies, its steps, and a
`Section` (what it found, what it left out and why, its own part of the report).

`tfperf.doctor.registry.EXPERIMENTS` lists them in the order they run (what a flag asked for first); the command
adds their flags and checks their rules, `run.plan` and `run.diagnose` walk the list, and the report reads each
section it gave back.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf.deploy.loader import Subject
from tfperf.doctor.options import Finding, Options


@dataclasses.dataclass(frozen=True)
class Flag:
    """An argument an experiment adds to `tfperf doctor`: its names and argparse's keywords for it."""

    names: tuple[str, ...]
    keywords: Mapping[str, Any]

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under."""
        return self.keywords.get("dest") or self.names[0].lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add this flag to `parser`."""
        parser.add_argument(*self.names, **self.keywords)


def flag(*names: str, **keywords: Any) -> Flag:
    """A flag, written as argparse's add_argument is called."""
    return Flag(names, keywords)


# A rule between flags: given the parsed flags, the one line that refuses them, or None where they are fine.
Rule = Callable[[argparse.Namespace], "str | None"]


def needs_loss(flag_name: str, does: str) -> Rule:
    """The rule that `flag_name` (an experiment that trains) is given with --loss; `does` says what it does."""
    dest = flag_name.lstrip("-").replace("-", "_")
    return lambda args: (f"{flag_name} {does}: give --loss (a Keras loss name such as "
                         f"sparse_categorical_crossentropy)" if getattr(args, dest) and not args.loss else None)


@dataclasses.dataclass
class Section:
    """What one experiment found: its findings (advice if they win), what it left out and why, the typed result
    the rest of the run may read (`found`), and its own text for the report."""

    name: str
    findings: list[Finding] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    found: Any = None
    lead: str = ""  # said before the advice, where it decides what the advice means (training waiting for data)
    answer: str = ""  # said right after the advice: the answer to a question asked by its own flag (--serve)
    detail: str = ""  # its own part of the report, after the advice (Markdown, its heading included)
    precision: list[tuple[str, Any]] = dataclasses.field(default_factory=list)  # (what, effect.PolicyEffect)
    # Its findings answer what the run was asked (--train's best configuration; the input pipeline where training
    # waits for it): they lead the advice and the headline, ahead of a larger gain to a question not asked.
    leads: bool = False


@dataclasses.dataclass
class Context:
    """What an experiment runs with: the model, the records, the options, a scratch folder, the progress line,
    the model's facts, the profile pass (None when off), and the sections of the experiments that ran before."""

    subject: Subject
    recorder: Any
    options: Options
    workdir: Path  # scratch, removed after the run
    traces: Path  # the profile pass's traces, kept
    out: Path  # the run's folder: what a section writes beside the report
    progress: Callable[[str], None] = lambda step: None
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    profiler: Any = None
    sections: dict[str, Section] = dataclasses.field(default_factory=dict)
    say: Callable[[str], None] = lambda what: None  # a line of what a long part is doing, for the command to show
    # When the budget is spent, on time.perf_counter()'s clock (None: no budget): a part that may take as long as it
    # is given (the best-configuration search) sizes itself to it.
    ends_by: float | None = None


def _always(subject: Subject, options: Options) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One question the doctor answers, in one place: `run(context)` measures and returns its Section."""

    name: str  # the step's name and the section's, said once: the progress line, the report, the skipped list
    question: str  # the question it answers, in the user's words
    run: Callable[[Context], Section]
    applies: Callable[[Subject, Options], bool] = _always  # whether this run takes it (a flag, the model's axes)
    steps: Callable[[Subject, Options], list[str]] | None = None  # its progress steps (default: its name)
    flags: tuple[Flag, ...] = ()
    rules: tuple[Rule, ...] = ()  # checked before the model is loaded
    # Checks and reads what needs the model (a --data pipeline, a --train-step), before anything is measured:
    # the options with what it read, or DoctorError.
    prepare: Callable[[Subject, Options], Options] | None = None
    # Skipped once --budget is spent: an answer asked for by its own flag (--train, --serve, --shapes) is not, and
    # runs before every budgeted one, its time counted (registry.taken): the budget goes to the question asked.
    budgeted: bool = True

    def step_names(self, subject: Subject, options: Options) -> list[str]:
        """The progress steps it takes on this model."""
        return self.steps(subject, options) if self.steps is not None else [self.name]


def child_command(module: str, *args: str) -> list[str]:
    """The command line of a doctor process of its own: `python -m tfperf.doctor.child MODULE ARGS`, which calls
    `tfperf.doctor.MODULE.child(ARGS)` (a part whose settings are fixed when TensorFlow starts, or that must start
    cold)."""
    return [sys.executable, "-m", "tfperf.doctor.child", module, *args]


def refusals(rules: Sequence[Rule], args: argparse.Namespace) -> list[str]:
    """What the rules refuse in these flags, in order."""
    return [said for rule in rules if (said := rule(args))]
