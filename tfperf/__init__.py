"""tfperf: a TensorFlow/Keras performance cookbook's library."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# Importing TensorFlow takes seconds; load it only when a name that needs it is used,
# so that `tfperf compare` and `tfperf --help` answer at once.
_LAZY = {
    "get_net": "tfperf.models",
    "flops": "tfperf.models",
    "MODEL_NAMES": "tfperf.models",
    "Timer": "tfperf.bench",
    "Measurement": "tfperf.bench",
    "interleave": "tfperf.bench",
    "versus": "tfperf.bench",
    "sync": "tfperf.bench",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfperf' has no attribute {name!r}")
