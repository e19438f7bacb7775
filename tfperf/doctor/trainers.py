"""What every configuration of the best-configuration search trains on, and a trainer of one configuration: a fresh
copy of the user's model compiled and fit as the configuration says, an epoch a call (tfperf/doctor/search.py races
them in the doctor's process, tfperf/doctor/apart.py in processes of their own)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tfperf.deploy.loader import Subject
from tfperf.doctor.climbed import Config
from tfperf.doctor.confirm import LEARNING_RATE
from tfperf.doctor.options import Options


@dataclasses.dataclass
class Rows:
    """What every configuration trains on: the same rows and targets, the loss, and how many examples an epoch."""

    x: Any
    y: Any
    loss: Callable
    examples: int
    batch_given: bool  # --data: the user's pipeline sets the batch


def training_rows(subject: Subject, options: Options, examples: int | None = None) -> Rows:
    """The user's pipeline (--data), or the doctor's synthetic rows and targets (`examples` of them, default
    options.train_examples)."""
    from tfperf.doctor.targets import synthetic_rows, training_loss

    loss = training_loss(options.loss, options.from_logits)
    if options.data is not None:
        return Rows(options.data.dataset, None, loss, options.data.examples, True)
    examples = examples or options.train_examples
    return Rows(*synthetic_rows(subject, options, examples), loss, examples, False)



def trainer(subject: Subject, config: Config, rows: Rows):
    """A fresh copy of the model from the same weights, compiled and fit as `config` says, its first epoch run (timed
    apart): (a Timer of one epoch a call, the losses it appends)."""
    import keras

    from tfperf.measure import Timer
    from tfperf.train import build_optimizer, fit_epochs

    model = subject.fresh(config.policy)
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE * config.learning_rate_scale), loss=rows.loss,
                  **config.compile_options())
    build_optimizer(model)  # its first epoch traces the step once, not twice: the climb builds twenty of them
    epoch, losses = fit_epochs(model, rows.x, rows.y, shuffle=False,
                               **({} if rows.batch_given else {"batch_size": config.batch}))
    timer = Timer(epoch, name=config.label, items_per_call=rows.examples)
    timer.start(warmup=0)
    return timer, losses
