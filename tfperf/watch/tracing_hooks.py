"""The TensorFlow half of the probe (tfperf/watch/probe.py loads it by path once the program has imported
TensorFlow): every tf.function trace (which function, from which line of the program, for what signature, how
long, and a trace done again inside another), and the calls of the program's own tf.functions outside fit.
Standard library only, as the probe."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any

probe: Any = None  # the probe module, set by patch()


def _describe(function_type: Any) -> list[list[str]]:
    """Each parameter of a traced signature with what it was traced for (a shape and dtype, or a Python value)."""
    try:
        return [[name, str(p.type_constraint)[:200]] for name, p in function_type.parameters.items()]
    except Exception:  # noqa: BLE001
        return []


def _defined_at(python_function: Any) -> tuple[str | None, bool]:
    """Where a traced Python function was written, and whether that is the program's own code."""
    fn = inspect.unwrap(getattr(python_function, "__func__", python_function))
    code = getattr(fn, "__code__", None)
    if code is None:
        return None, False
    try:
        name = os.path.relpath(code.co_filename)
    except ValueError:
        name = code.co_filename
    return f"{name}:{code.co_firstlineno}", not probe._is_library(code.co_filename)


def _retraced_inside(inner: list[list]) -> float:
    """The seconds of a trace spent tracing again a function it had traced already (by name: the second trace wraps
    the Python function anew): TensorFlow traces a tf.function a second time when its first trace made variables,
    as Keras 3 fit()'s step does where it builds the optimizer inside it."""
    seen: set[str] = set()
    again = 0.0
    for name, seconds in inner:
        if name in seen:
            again += seconds
        seen.add(name)
    return again


def patch(probe_module: Any) -> None:
    """Every tf.function trace: which function, from which line of the program, for what signature, how long; the
    probe's recorder is read through `probe_module`."""
    global probe
    module = sys.modules.get("tensorflow.python.eager.polymorphic_function.tracing_compilation")
    if module is None or getattr(module._create_concrete_function, "_tfperf_watched", False):
        return
    probe = probe_module
    original = module._create_concrete_function

    @functools.wraps(original)
    def create(function_type, type_context, func_graph, tracing_options):
        rec = probe.RECORDER
        if rec is None:
            return original(function_type, type_context, func_graph, tracing_options)
        fn, started = tracing_options.python_function, probe._clock()
        if rec.tracing:  # a function traced inside another's trace is part of that one: kept with it
            rec.tracing += 1
            try:
                return original(function_type, type_context, func_graph, tracing_options)
            finally:
                rec.tracing -= 1
                rec.inner_traces.append([str(getattr(tracing_options, "name", "")), probe._clock() - started])
        site, rec.inner_traces = probe.user_site(2), []
        rec.tracing += 1
        try:
            return original(function_type, type_context, func_graph, tracing_options)
        finally:
            rec.tracing -= 1
            defined_at, own = _defined_at(fn)
            rec.trace({"name": str(getattr(tracing_options, "name", "function")), "function": id(fn),
                       "defined_at": defined_at, "own": own, "site": site, "seconds": probe._clock() - started,
                       "signature": _describe(function_type) if own else [], "at_s": started - rec.t0,
                       "retraced_inside_s": _retraced_inside(rec.inner_traces)})

    create._tfperf_watched = True
    probe.replace(module, "_create_concrete_function", create)
    _patch_function_calls(sys.modules.get("tensorflow.python.eager.polymorphic_function.polymorphic_function"))


def _patch_function_calls(module: Any) -> None:
    """Calls of the program's own tf.functions timed, outside fit and outside traces (a custom loop's steps; on a
    GPU, the time to dispatch them)."""
    if module is None:
        return
    original = module.Function.__call__
    own: dict[int, bool] = {}

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        rec = probe.RECORDER
        if rec is None or rec.tracing or rec.fit is not None:
            return original(self, *args, **kwargs)
        key = id(getattr(self, "_python_function", None))
        if key not in own:
            own[key] = _defined_at(getattr(self, "_python_function", None))[1]
        if not own[key]:
            return original(self, *args, **kwargs)
        started = probe._clock()
        try:
            return original(self, *args, **kwargs)
        finally:
            elapsed = probe._clock() - started
            fn = getattr(self, "_python_function", None)
            rec.function_call(key, lambda: {"name": getattr(self, "_name", "function"),
                                            "defined_at": _defined_at(fn)[0], "site": probe.user_site(3)}, elapsed)

    __call__._tfperf_watched = True
    probe.replace(module.Function, "__call__", __call__)
