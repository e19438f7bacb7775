"""tfperf: a TensorFlow/Keras performance cookbook's library.

Its parts: `tfperf.measure` (timing), `tfperf.records` (records, report, compare), `tfperf.deploy`
(load any model, export, predict, inspect), `tfperf.doctor` (the experiments on a user's model), and
the small modules the recipes share (models, data, train, precision, devices, cluster, hvd, recipe).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"

# Importing TensorFlow takes seconds; load it only when a name that needs it is used,
# so that `tfperf compare` and `tfperf --help` answer at once.
_LAZY = {
    "get_net": "tfperf.models",
    "flops": "tfperf.models",
    "MODEL_NAMES": "tfperf.catalog",
    "Benchmark": "tfperf.measure.benchmark",
    "Timer": "tfperf.measure.timer",
    "Measurement": "tfperf.measure.measurement",
    "interleave": "tfperf.measure.rounds",
    "race": "tfperf.measure.rounds",
    "versus": "tfperf.measure.measurement",
    "sync": "tfperf.measure.timer",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfperf' has no attribute {name!r}")
