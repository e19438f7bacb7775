"""Memory budget: "what is the largest batch that fits in 2 GB?"

`--memory-budget`: the largest batch whose inference call (or, with --train, training step) stays within
the budget, found by trying batch sizes and reading each one's peak from a trace (`profile.largest_batch`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.inputs import make_inputs, to_tensors
from tfperf.deploy.loader import Subject
from tfperf import extras, flags
from tfperf.doctor.experiment import Context, Experiment, Section, flag
from tfperf.doctor.options import Options
from tfperf.doctor.profile import BatchFit, largest_batch


def input_bytes(subject: Subject) -> int:
    """The bytes of one example's inputs."""
    return sum(int(np.prod(i.shape, dtype=np.int64)) * np.dtype(i.dtype).itemsize for i in subject.inputs)


def _rows(structure: Any, batch: int) -> Any:
    """A batch of `batch` rows made by repeating the rows of `structure`'s arrays."""
    import tensorflow as tf

    def repeat(a):
        a = np.asarray(a)
        return a[np.resize(np.arange(len(a)), batch)]

    return tf.nest.map_structure(repeat, structure)


def _training_step(subject: Subject, options: Options) -> Callable[[int], Callable[[], Any]]:
    import keras

    from tfperf.doctor.targets import synthetic_rows, training_loss

    model = subject.fresh(None)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=training_loss(options.loss, options.from_logits))
    if options.data is not None:
        first = next(iter(options.data.dataset.take(1)))
        x0, y0 = first[0], first[1]
    else:
        x0, y0 = synthetic_rows(subject, options, 64)

    def at(batch: int) -> Callable[[], Any]:
        x, y = _rows(x0, batch), _rows(y0, batch)
        return lambda: model.train_on_batch(x, y)

    return at


def _inference_call(subject: Subject, options: Options) -> Callable[[int], Callable[[], Any]]:
    import tensorflow as tf

    graph = tf.function(subject.call)

    def at(batch: int) -> Callable[[], Any]:
        tensors = subject.pack(to_tensors(make_inputs(subject, batch, seed=options.seed, sample=options.sample)))
        return lambda: graph(tensors)

    return at


def memory_budget(subject: Subject, options: Options, progress, root: Path) -> tuple[list, dict, BatchFit | None]:
    """The largest batch within `options.memory_budget` bytes: the training step with --train, else inference."""
    progress("memory budget")
    if subject.fixed_batch is not None and not options.train:
        return [], {"memory budget": f"the signature takes only batch {subject.fixed_batch}"}, None
    if options.train:
        what, at = "a training step, model.train_on_batch", _training_step(subject, options)
    else:
        what, at = "an inference call, tf.function", _inference_call(subject, options)
    fit = largest_batch(at, options.memory_budget, root, what=what, bytes_per_example=input_bytes(subject))
    return [], {}, fit


def run(ctx: Context) -> Section:
    """The largest batch within the budget, as a section of the report."""
    findings, skipped, fit = memory_budget(ctx.subject, ctx.options, ctx.progress, ctx.traces / "memory-budget")
    return Section(EXPERIMENT.name, findings, skipped, fit, detail=fit.describe() + "\n" if fit is not None else "")


def _within_memory(args) -> str | None:
    free = flags.available_memory()
    if args.memory_budget and free and args.memory_budget > free:
        return (f"--memory-budget {args.memory_budget / 2**30:.1f} GB is more than the {free / 2**30:.1f} GB of "
                f"memory available now: give at most that")
    return None


EXPERIMENT = Experiment(
    name="memory budget", question="What is the largest batch that fits in my memory?",
    run=run, budgeted=False, applies=lambda subject, options: bool(options.memory_budget),
    flags=(flag("--memory-budget", type=flags.byte_size, metavar="SIZE",
                help="find the largest batch whose inference call (with --train: training step) stays within SIZE "
                     "of memory (e.g. 2GB), by trying batch sizes"),),
    # It reads each try's peak from a trace: without XProf, said before anything is loaded.
    rules=(lambda args: extras.message("xprof", "--memory-budget (it reads each try's peak from a trace)")
           if args.memory_budget and not extras.installed("xprof") else None, _within_memory))
