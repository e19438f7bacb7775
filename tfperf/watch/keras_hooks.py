"""The Keras half of the probe (tfperf/watch/probe.py loads it by path once the program has imported Keras):
fit, evaluate and predict wrapped, each callback's hooks timed, steps timed between the batch hooks, epochs between
theirs, a Python generator's batches timed. Standard library only, as the probe."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

probe: Any = None  # the probe module, set by patch()


# -- Keras ---------------------------------------------------------------------------------------------------
def _fit_summary(model: Any, bound: inspect.BoundArguments) -> dict:
    """What fit was asked: the arguments and compile settings a report names."""
    a = bound.arguments
    callbacks = a.get("callbacks") or []
    x = a.get("x")
    return {"site": probe.user_site(3), "model": type(model).__name__, "epochs": a.get("epochs"),
            "batch_size_arg": a.get("batch_size"), "verbose": a.get("verbose"),
            "validation": a.get("validation_data") is not None or bool(a.get("validation_split")),
            "validation_freq": a.get("validation_freq"), "x": type(x).__name__,
            "rows": len(x) if hasattr(x, "shape") and hasattr(x, "__len__") else None,
            "validation_split": a.get("validation_split") or 0.0,
            "user_callbacks": [type(c).__name__ for c in (callbacks if isinstance(callbacks, list) else [])],
            "steps_per_execution": getattr(model, "steps_per_execution", None),
            "jit_compile": _safe(lambda: bool(model.jit_compile)),
            "dtype_policy": _safe(lambda: model.dtype_policy.name)}


def _safe(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:  # noqa: BLE001 - a setting this Keras does not have is left out
        return None


def _watch_fit(original: Callable) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if probe.RECORDER is None or probe.RECORDER.fit is not None:
            return original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            summary = _fit_summary(self, bound)
        except TypeError:
            summary = {"site": probe.user_site(2), "model": type(self).__name__}
        started = probe._clock()
        probe.RECORDER.begin_fit(summary)
        try:
            return original(self, *args, **kwargs)
        finally:
            probe.RECORDER.end_fit(started)

    fit._tfperf_watched = True
    return fit


def _watch_call(kind: str, original: Callable) -> Callable:
    @functools.wraps(original)
    def call(self, *args, **kwargs):
        rec = probe.RECORDER
        if rec is None:
            return original(self, *args, **kwargs)
        if kind == "evaluate" and rec.epoch is not None and not rec.validating:  # fit's validation
            started = probe._clock()
            rec.validating = True
            try:
                return original(self, *args, **kwargs)
            finally:
                rec.validating = False
                with rec.lock:
                    if rec.epoch is not None:
                        rec.epoch["validation_s"] += probe._clock() - started
        if rec.fit is not None or rec.validating:
            return original(self, *args, **kwargs)  # called from inside fit (a callback's predict): fit's time
        site, started = probe.user_site(2), probe._clock()
        try:
            return original(self, *args, **kwargs)
        finally:
            rec.call(kind, site, probe._clock() - started, getattr(rec, "last_batches", None))
            rec.last_batches = None

    call._tfperf_watched = True
    return call


def _timed_hook(name: str, method: Callable) -> Callable:
    @functools.wraps(method)
    def hook(*args, **kwargs):
        started = probe._clock()
        try:
            return method(*args, **kwargs)
        finally:
            if probe.RECORDER is not None:
                probe.RECORDER.callback(name, probe._clock() - started)

    hook._tfperf_watched = True
    return hook


def _time_callbacks(callback_list: Any, base: type) -> None:
    """Each callback's own hooks timed, by its class name (instance attributes: the class is left alone)."""
    for cb in getattr(callback_list, "callbacks", []):
        for hook_name in probe.CALLBACK_HOOKS:
            method = getattr(cb, hook_name, None)
            if method is None or getattr(method, "_tfperf_watched", False):
                continue
            if getattr(type(cb), hook_name, None) is getattr(base, hook_name, None):
                continue  # Keras' empty default: nothing to time, and timing it would cost every step
            try:
                setattr(cb, hook_name, _timed_hook(type(cb).__name__, method))
            except (AttributeError, TypeError):
                pass  # a callback with __slots__ or a read-only hook stays untimed


def _patch_callback_list(module: Any, base: type) -> None:
    """Steps timed between the batch hooks (the train function's call), epochs between theirs."""
    cls = module.CallbackList
    init, batch_begin, batch_end = cls.__init__, cls.on_train_batch_begin, cls.on_train_batch_end
    epoch_begin, epoch_end = cls.on_epoch_begin, cls.on_epoch_end

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if probe.RECORDER is not None:
            _time_callbacks(self, base)
            if probe.RECORDER.fit is not None and not probe.RECORDER.validating:
                probe.RECORDER.fit["callbacks_async"] = bool(getattr(self, "_async_train", False))

    def on_train_batch_begin(self, batch, logs=None):
        batch_begin(self, batch, logs)
        if probe.RECORDER is not None:
            epoch = probe.RECORDER.epoch
            if epoch is not None and epoch["first_step_s"] is None:
                epoch["trace_s_before_step"] = epoch["trace_s"]
            probe.RECORDER.step_started = (probe._clock(), batch)

    def on_train_batch_end(self, batch, logs=None):
        ended = probe._clock()
        if probe.RECORDER is not None and probe.RECORDER.step_started is not None:
            started, first = probe.RECORDER.step_started
            probe.RECORDER.step_started = None
            probe.RECORDER.step(ended - started, max(1, int(batch) - int(first) + 1))
        batch_end(self, batch, logs)

    def on_epoch_begin(self, epoch, logs=None):
        if probe.RECORDER is not None:
            probe.RECORDER.begin_epoch(int(epoch))
        epoch_begin(self, epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        epoch_end(self, epoch, logs)
        if probe.RECORDER is not None:
            probe.RECORDER.end_epoch()

    for name, fn in [("__init__", __init__), ("on_train_batch_begin", on_train_batch_begin),
                     ("on_train_batch_end", on_train_batch_end), ("on_epoch_begin", on_epoch_begin),
                     ("on_epoch_end", on_epoch_end)]:
        setattr(cls, name, functools.wraps(getattr(cls, name))(fn))


def _timed_generator(make: Callable) -> Callable:
    """The program's generator as Keras' generator adapter calls it, each batch it makes timed."""
    def timed():
        batches = iter(make())
        while True:
            started = probe._clock()
            try:
                batch = next(batches)
            except StopIteration:
                return
            if probe.RECORDER is not None:
                probe.RECORDER.made_batch(probe._clock() - started)
            yield batch

    return timed


def _patch_epoch_iterator(module: Any) -> None:
    """The batch size and batches an epoch the data adapter found (fit's, or the call's)."""
    cls = module.EpochIterator
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        rec = probe.RECORDER
        if rec is None or rec.validating:
            return
        adapter = getattr(self, "data_adapter", None)
        batches = _safe(lambda: adapter.num_batches)
        if rec.fit is not None and hasattr(adapter, "generator") and callable(adapter.generator):
            adapter.generator = _timed_generator(adapter.generator)
            rec.fit["input"] = "a Python generator"
        if rec.fit is not None and rec.fit["batch_size"] is None:
            rec.fit["batch_size"] = _safe(lambda: adapter.batch_size)
            rec.fit["batches_per_epoch"] = batches
        elif rec.fit is None:
            rec.last_batches = batches

    cls.__init__ = __init__


def patch(probe_module: Any) -> None:
    """Keras 3's Model, callbacks and epoch iterator, once; the probe's recorder is read through `probe_module`."""
    global probe
    from keras.src.callbacks import callback, callback_list  # noqa: PLC0415 - Keras is loaded by now
    from keras.src.models.model import Model  # noqa: PLC0415
    from keras.src.trainers import epoch_iterator  # noqa: PLC0415

    if getattr(Model.fit, "_tfperf_watched", False):
        return
    probe = probe_module
    model = Model
    model.fit = _watch_fit(model.fit)
    for kind in probe.CALLS:
        if hasattr(model, kind):
            setattr(model, kind, _watch_call(kind, getattr(model, kind)))
    _patch_callback_list(callback_list, callback.Callback)
    _patch_epoch_iterator(epoch_iterator)
