"""Measuring: Timer apart from Measurement, interleaved rounds, verdicts, and timing in other processes.

The modules, from the bottom: `stats` (NumPy: intervals, rank test, verdicts), `measurement` (NumPy:
a Measurement and `versus`), `rounds` (interleave and race alternatives), `processes` (fresh
processes, timers served by child processes, the one child-to-parent protocol), `timer` (the Timer:
the only module that imports TensorFlow) and `benchmark` (the d2l-shaped helper over Timer).
"""

from __future__ import annotations

from typing import Any

# Importing TensorFlow takes seconds: each name is loaded when first used, so that code that only
# reads measurements (`tfperf compare`, the report) never imports it.
_LAZY = {
    "Measurement": "tfperf.measure.measurement",
    "Elapsed": "tfperf.measure.measurement",
    "versus": "tfperf.measure.measurement",
    "one_after_another": "tfperf.measure.measurement",
    "timing_ms": "tfperf.measure.measurement",
    "Comparison": "tfperf.measure.stats",
    "interleave": "tfperf.measure.rounds",
    "race": "tfperf.measure.rounds",
    "fresh_processes": "tfperf.measure.processes",
    "serve_timers": "tfperf.measure.processes",
    "TimerServer": "tfperf.measure.processes",
    "TimerCluster": "tfperf.measure.processes",
    "RemoteTimer": "tfperf.measure.processes",
    "ChildError": "tfperf.measure.processes",
    "reply": "tfperf.measure.processes",
    "run_child": "tfperf.measure.processes",
    "Timer": "tfperf.measure.timer",
    "sync": "tfperf.measure.timer",
    "profiled": "tfperf.measure.timer",
    "peak_matmul_flops_per_s": "tfperf.measure.timer",
    "Benchmark": "tfperf.measure.benchmark",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfperf.measure' has no attribute {name!r}")
