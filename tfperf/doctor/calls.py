"""What the inference tables found, for the experiments after them (the best way to call): each batch's race with its
calls, and the exports it timed. Its own module, so that no experiment imports another.

Each row is raced against the call a user serves with (`serving_baseline`): model(x) one request at a time (Keras' own
advice for a few inputs), in batches the traced graph a server runs (a tf.function, as a SavedModel signature is), a
SavedModel's signature always. predict() is a row, not the yardstick: it pays a data adapter per call, and against it
at batch 1 everything looked 1,000x faster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfperf.deploy.loader import Subject
from tfperf.doctor.xla import XlaFailure

RUNTIMES = {"LiteRT interpreter": "litert", "ONNX Runtime": "onnx"}
# A model that samples in its forward pass (a VAE, dropout called with training=True) answers differently each call:
# a faster way to call it agrees when it differs from the model by no more than this times the model from itself.
STOCHASTIC_MARGIN = 1.5
# A row's call, whether it answers in the model's structure, the code that applies it, and what it costs.
Call = tuple[Callable[[], Any], bool, str, str]


@dataclasses.dataclass
class Table:
    """One batch size's race, kept for the experiments after it (the best way to call): its rows' calls, the user's
    call it was raced against, which rows agree with the model, the reference answers and the race itself."""

    batch: int
    baseline: str
    calls: dict[str, Call]
    agrees: dict[str, bool]
    inputs: Any  # the rows every call at this batch answers, NumPy arrays by input name
    reference: Any
    tolerance: float  # how far a new way of calling may differ from `reference` (relative to its scale)
    raced: Any  # records.jsonl.Raced
    spread: float = 0.0  # how far the model's own answers moved between two calls on the same rows (a stochastic
    # model's: above FLOAT_TOLERANCE)


@dataclasses.dataclass
class Tables:
    """The inference experiment's result: each batch's Table, each exported runtime's folder and export command, and
    where XLA failed on the model (None where it did not)."""

    tables: list[Table] = dataclasses.field(default_factory=list)
    exports: dict[str, Path] = dataclasses.field(default_factory=dict)
    commands: dict[str, str] = dataclasses.field(default_factory=dict)
    failure: XlaFailure | None = None


def serving_baseline(subject: Subject, batch: int) -> str:
    """The row the others race against: the user's likely call at this batch (see the module's docstring)."""
    if subject.kind != "keras":
        return "signature"
    return "model(x)" if batch == 1 else "tf.function"

