"""Every experiment the doctor runs, in the order it runs them: the one list the command, the plan, the run and
the report walk. Adding an experiment is a module with an `EXPERIMENT` (tfperf.doctor.experiment) and a line here.

The order: inference first (what the model costs as it is called), then the best way to call it, made of those
tables; the input pipeline before training (while training waits for data, a faster step gains nothing); the best
configuration after the one-switch training race; the pitfalls (retracing) last of what runs by default; answers
asked for by their own flag (serving, hosts) after the rest they read. A run takes what its flags asked for first,
in this order, then what runs by default (`taken`): the budget goes to the question asked.
"""

from __future__ import annotations

from tfperf.deploy.loader import Subject
from tfperf.doctor import (best_call, custom_step, devices, inference, keras_stacks, lengths, loading, memory,
                           pipeline, retracing, scaling, search, serving, shapes, threads, training)
from tfperf.doctor.experiment import Experiment
from tfperf.doctor.options import Options

EXPERIMENTS: tuple[Experiment, ...] = (
    inference.EXPERIMENT,
    best_call.EXPERIMENT,
    lengths.EXPERIMENT,
    threads.EXPERIMENT,
    pipeline.EXPERIMENT,
    training.EXPERIMENT,
    search.EXPERIMENT,
    custom_step.EXPERIMENT,
    memory.EXPERIMENT,
    shapes.EXPERIMENT,
    loading.EXPERIMENT,
    keras_stacks.EXPERIMENT,
    devices.EXPERIMENT,
    retracing.EXPERIMENT,
    serving.EXPERIMENT,
    scaling.EXPERIMENT,
)


def taken(subject: Subject, options: Options) -> list[Experiment]:
    """The experiments this run takes on this model, in order: what a flag asked for (never cut by the budget)
    first, then what runs by default, which gets what is left of it. With --quick --train on a two-block Transformer
    the default ones ran first (66 s of inference tables and thread sweeps), and the answer asked for ended the run
    at 295 s, past --quick's 3 minutes."""
    applies = [e for e in EXPERIMENTS if e.applies(subject, options)]
    return [e for e in applies if not e.budgeted] + [e for e in applies if e.budgeted]
