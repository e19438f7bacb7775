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

# Subpackages a user reaches from `import tfperf` alone: `tfperf.keras.Watch()`, `tfperf.watch.session()`.
_SUBMODULES = ("keras", "watch")

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"tfperf.{name}")
    raise AttributeError(f"module 'tfperf' has no attribute {name!r}")
