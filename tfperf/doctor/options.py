"""What a doctor run measures (`Options`), what each experiment finds (`Finding`), and its bars."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

RECIPE = "doctor"  # the name its records carry, so that `tfperf compare` matches two doctor runs
MIN_GAIN = 0.02  # a speedup must be shown to exceed 2% before it is advised
LOSS_TOLERANCE = 0.10  # relative final-loss difference from plain fit beyond which a change "disagrees"
# Batch sizes an application might send, each new to the function: 7 calls give the 6 samples a verdict needs
# (the first call of each row is its first trace), and small batches keep the cost in the traces themselves.
TRACE_BATCHES = (1, 2, 3, 4, 5, 6, 7)
OWN_RETRACES = 3  # a model whose own predict() traces this often over TRACE_BATCHES retraces in production


class DoctorError(ValueError):
    """Input doctor cannot use; the message says what to do instead."""


@dataclasses.dataclass
class Finding:
    """One alternative measured against a baseline: what to advise if it wins."""

    section: str
    row: str
    baseline: str
    comparison: Any  # stats.Comparison
    code: str
    cost: str
    agrees: bool = True
    note: str = ""
    pitfall: bool = False  # about how a function might be called, not a change to the model as it is used


@dataclasses.dataclass
class Options:
    """What a doctor run measures and how long it may take."""

    batch_sizes: tuple[int, ...] = (1, 32, 256)
    rounds: int = 6
    max_extensions: int = 2  # more rounds, at most this many times, while a comparison straddles a bar
    min_time_s: float = 0.5  # per alternative and batch size, spread over the rounds
    train: bool = False
    loss: str | None = None
    from_logits: bool = False
    train_examples: int = 1024
    threads: bool = True
    exported: bool = True
    budget_s: float | None = None
    quick: bool = False
    seed: int = 0
    sample: Mapping[str, np.ndarray] | None = None
    sample_path: str | None = None  # where `sample` came from, for the thread-sweep processes
    trust: bool = False
    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    profile: bool = True  # the profile pass: traces of measured variants, read through XProf
    shapes: bool = False  # the first call at new sizes, per way of calling the model (a process of its own)
    shape_axes: str = "all"  # the axes the new-shapes experiment varies: "all", "batch" or "free" (the model's own)
    load_time: bool = False  # a cold start per form the model can take, in fresh processes
    devices: int | None = None  # train under MirroredStrategy on 1 and this many devices (needs `loss`)
    keras_stacks: bool = False  # the model under Keras 2, Keras 3 on TensorFlow and on JAX (needs `loss`)
    data: Any = None  # pipeline.UserData: the user's tf.data pipeline to train on (--data)
    long_run_s: float = 30.0  # --data: the pipeline alone read this long, to see whether it declines (0: not run)
    step: Any = None  # the user's training step, step(model, optimizer, batch) -> loss (--train-step)
    step_source: str | None = None  # where `step` came from (module:function)
    memory_budget: int | None = None  # bytes: find the largest batch within them (--memory-budget)
    trace_batches: tuple[int, ...] = TRACE_BATCHES  # the retracing table's calls, a new batch size each


def model_flags(subject, options: Options) -> list[str]:
    """The flags that load the model as the user gave it (sizes, sample, signature, trust), for the `tfperf` commands
    the doctor prints and the processes it starts. With --trust, a child does not inspect the model again: the path
    may hold other bytes by now."""
    words = [a for name, shape in options.input_shapes.items()
             for a in ("--input-shape", (f"{name}=" if name else "") + ",".join(map(str, shape)))]
    if subject.signature:
        words += ["--signature", subject.signature]
    if options.sample_path:
        words += ["--sample", options.sample_path]
    if options.trust:
        words.append("--trust")
    return words
