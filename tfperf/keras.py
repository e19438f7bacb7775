"""`tfperf.keras.Watch()`: the watch for one `fit()`, as a Keras callback (issue 72), for a notebook's cell or a
script that cannot be run under `tfperf watch --`:

    watch = tfperf.keras.Watch(out="watch/fit")
    model.fit(x, y, epochs=5, callbacks=[watch])
    watch.findings        # what took the fit's time: steps, each callback, validation, the first epoch, retraces

It begins the watch when the fit begins and ends it when the fit ends, with the same record, findings and report as
`tfperf watch` and `tfperf.watch.session()`. Keras builds the fit's data and callback list before the first
callback hears of it, so their settings (the batch, the validation, the other callbacks to time) are read from the
fit that is running; a Python generator's own time is not split out (the session and the command do that).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import keras

# The module, not the function of the same name `tfperf.watch` exports.
sessions = importlib.import_module("tfperf.watch.session")

NAME = "tfperf.keras.Watch()"
_OPEN: list["Watch"] = []  # the Watch whose fit is running (one at a time: the probe is one per process)


def fit_locals(callback: keras.callbacks.Callback) -> dict[str, Any]:
    """The running fit()'s arguments and loop state (its frame's locals: `epoch_iterator`, `callbacks`, `x`,
    `batch_size`, the validation's), found up the stack from a callback's hook; {} where this Keras holds them
    otherwise (the fit is then watched without them)."""
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        held = frame.f_locals
        if "epoch_iterator" in held and callback in getattr(held.get("callbacks"), "callbacks", ()):
            return dict(held)
        frame = frame.f_back
    return {}


def recording_already() -> bool:
    """Whether a watch records this process already: a session, or `tfperf watch --`'s probe (loaded by path)."""
    from tfperf.watch import probe

    return any(getattr(module, "RECORDER", None) is not None
               for module in (probe, sys.modules.get("_tfperf_watch_probe")) if module is not None)


class Watch(keras.callbacks.Callback):
    """Watch the fit() this callback is given to: `findings`, `record` and (with `out`) report.md once it ends."""

    def __init__(self, out: str | Path | None = None, profile_steps: int = 0):
        super().__init__()
        self.out, self.profile_steps = out, profile_steps
        self.seen = sessions.Session()
        self._opened: sessions.Opened | None = None
        self._timed: list[Any] = []
        self._fit_started: float | None = None
        self.skipped = ""  # why this Watch recorded nothing, where it did not

    @property
    def findings(self) -> list:
        return self.seen.findings

    @property
    def record(self) -> dict[str, Any] | None:
        return self.seen.record

    def on_train_begin(self, logs=None):
        for earlier in list(_OPEN):  # a fit that raised never called on_train_end: its watch ends here
            earlier._close("the fit raised before it ended")
        from tfperf.watch import probe

        if recording_already():  # `tfperf watch --` or a session records this process: it sees this fit; the
            self.skipped = "another tfperf watch records this process: its report has this fit"  # fit goes on
            return
        traces = sessions.rank_folder(self.out) / "traces" if self.out is not None else None
        self._opened, self.seen = sessions.begin(self.profile_steps, traces), sessions.Session()
        _OPEN.append(self)
        hooks = probe._sibling("keras_hooks")  # the probe's Keras half, as install() loaded it
        held = fit_locals(self)
        summary = hooks._fit_summary(self.model, SimpleNamespace(arguments=held)) if held else {
            "site": probe.user_site(2), "model": type(self.model).__name__}
        callbacks = held.get("callbacks")
        if callbacks is not None:
            hooks._time_callbacks(callbacks, keras.callbacks.Callback)
            self._timed = [cb for cb in callbacks.callbacks if cb is not self]
        self._fit_started = probe._clock()
        probe.RECORDER.begin_fit(summary)
        iterator = held.get("epoch_iterator")
        probe.RECORDER.fit.update(
            batch_size=getattr(getattr(iterator, "data_adapter", None), "batch_size", None) or held.get("batch_size"),
            batches_per_epoch=self.params.get("steps") if isinstance(self.params, dict) else None,
            callbacks_async=bool(getattr(callbacks, "_async_train", False)))

    def on_train_end(self, logs=None):
        self._close("the fit ended")

    def _close(self, ending: str) -> None:
        """End this watch: the fit's record closed, the other callbacks' hooks given back, the report written."""
        from tfperf.watch import probe

        if self not in _OPEN:
            return
        _OPEN.remove(self)
        if probe.RECORDER is not None and self._fit_started is not None:
            probe.RECORDER.end_fit(self._fit_started)
        for cb in self._timed:  # the timing wrappers were put on the instances: take them off
            for hook in probe.CALLBACK_HOOKS:
                if getattr(cb.__dict__.get(hook), "_tfperf_watched", False):
                    del cb.__dict__[hook]
        self._timed = []
        sessions.end(self._opened, self.seen, self.out, NAME, ending)
