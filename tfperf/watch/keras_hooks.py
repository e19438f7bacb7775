"""The Keras half of the probe (tfperf/watch/probe.py loads it by path once the program has imported Keras):
fit, evaluate and predict wrapped, each callback's hooks timed, steps timed between the batch hooks, epochs between
theirs, a Python generator's or PyDataset's batches timed. Standard library only, as the probe."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
from typing import Any, Callable

probe: Any = None  # the probe module, set by patch()
CAPTURE_ROWS = 2048  # rows of the first fit's data kept for the doctor


# -- Keras ---------------------------------------------------------------------------------------------------
def _fit_summary(model: Any, bound: inspect.BoundArguments) -> dict:
    """What fit was asked: the arguments and compile settings a report names."""
    a = bound.arguments
    callbacks = a.get("callbacks") or []
    x = a.get("x")
    return {"site": probe.user_site(3), "model": type(model).__name__, "model_id": id(model), "epochs": a.get("epochs"),
            "batch_size_arg": a.get("batch_size"), "verbose": a.get("verbose"),
            "validation": a.get("validation_data") is not None or bool(a.get("validation_split")),
            "validation_freq": a.get("validation_freq"), "x": type(x).__name__,
            "rows": len(x) if hasattr(x, "shape") and hasattr(x, "__len__") else None,
            "validation_split": a.get("validation_split") or 0.0, "input_kind": _input_kind(x),
            "user_callbacks": [type(c).__name__ for c in (callbacks if isinstance(callbacks, list) else [])],
            "steps_per_execution": getattr(model, "steps_per_execution", None),
            "jit_compile": _safe(lambda: bool(model.jit_compile)),
            # Keras 3 on TensorFlow builds an optimizer not yet built inside fit's first traced step
            "optimizer_unbuilt": _safe(lambda: model.optimizer is not None and not model.optimizer.built),
            "dtype_policy": _safe(lambda: model.dtype_policy.name)}


def _input_kind(x: Any) -> str:
    """What fit() was given, for the fix a slow input gets: "tf.data", "PyDataset", "generator" or "arrays"."""
    if hasattr(x, "element_spec"):
        return "tf.data"
    if any(c.__name__ == "PyDataset" for c in type(x).__mro__):
        return "PyDataset"
    return "generator" if inspect.isgenerator(x) or hasattr(x, "__next__") else "arrays"


def _safe(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:  # noqa: BLE001 - a setting this Keras does not have is left out
        return None


def _loss_name(loss: Any) -> tuple[str | None, bool]:
    """A Keras loss by the name the doctor takes (`sparse_categorical_crossentropy`), and whether on logits."""
    if isinstance(loss, str):
        return loss, False
    config = _safe(lambda: loss.get_config()) or {}
    name = type(loss).__name__ if hasattr(loss, "get_config") else getattr(loss, "__name__", None)
    if name is None or name in ("LossFunctionWrapper", "function"):
        name = config.get("fn") if isinstance(config.get("fn"), str) else None
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() if name else None
    return snake, bool(config.get("from_logits", False))


def _rows(x: Any, take: int) -> Any:
    """The first `take` rows of an array, a dict or a tuple of arrays, or of a tf.data dataset's batches."""
    import numpy as np  # noqa: PLC0415 - the program has it: Keras does

    if hasattr(x, "element_spec"):  # a tf.data.Dataset: iterate a few batches of it again
        batches, rows = [], 0
        for batch in x:
            batches.append(batch)
            rows += len(np.asarray(_first_leaf(batch)))
            if rows >= take:
                break
        joined = [np.concatenate([np.asarray(leaf) for leaf in leaves]) for leaves in zip(*map(_leaves, batches))]
        return _pack(batches[0], [j[:take] for j in joined])
    if isinstance(x, dict):
        return {k: np.asarray(v)[:take] for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(np.asarray(v)[:take] for v in x)
    return np.asarray(x)[:take]


def _leaves(batch: Any) -> list:
    if isinstance(batch, dict):
        return [batch[k] for k in sorted(batch)]
    if isinstance(batch, (list, tuple)):
        return [leaf for part in batch for leaf in _leaves(part)]
    return [batch]


def _first_leaf(batch: Any) -> Any:
    return _leaves(batch)[0]


def _pack(like: Any, leaves: list) -> Any:
    """`leaves` back into the structure of `like` (the inverse of _leaves)."""
    it = iter(leaves)

    def build(part):
        if isinstance(part, dict):
            return {k: build(part[k]) for k in sorted(part)}
        if isinstance(part, (list, tuple)):
            return type(part)(build(p) for p in part)
        return next(it)

    return build(like)


def epoch_rows(arguments: dict, batch_size: int | None) -> int | None:
    """The examples one epoch of this fit() trains on, where fit() says: steps_per_epoch batches, the training part of
    its arrays, or a finite dataset's batches (the last one counted whole); None where it cannot be known."""
    x, steps = arguments.get("x"), arguments.get("steps_per_epoch")
    if steps and batch_size:
        return int(steps) * int(batch_size)
    if hasattr(x, "element_spec"):
        batches = _safe(lambda: int(x.cardinality()))
        return batches * batch_size if batches and batches > 0 and batch_size else None
    leaf = _safe(lambda: _first_leaf(x))
    rows = _safe(lambda: len(leaf)) if hasattr(leaf, "shape") else None  # arrays: a PyDataset's len counts batches
    return int(rows * (1 - (arguments.get("validation_split") or 0.0))) if rows else None


def capture(model: Any, arguments: dict, batch_size: int | None, folder: str) -> dict:
    """What the doctor needs to search on the user's own fit: the model file, a sample of the rows with their
    targets (sample.npz, as `tfperf doctor --sample` reads it) and the compile settings; what could not be had, said."""
    import numpy as np  # noqa: PLC0415

    said: dict[str, Any] = {"loss": None, "from_logits": False, "batch_size": batch_size,
                            "steps_per_execution": getattr(model, "steps_per_execution", None),
                            "jit_compile": _safe(lambda: bool(model.jit_compile)),
                            "dtype_policy": _safe(lambda: model.dtype_policy.name),
                            "optimizer": type(getattr(model, "optimizer", None)).__name__,
                            "learning_rate": _safe(lambda: float(model.optimizer.learning_rate))}
    said["loss"], said["from_logits"] = _loss_name(getattr(model, "loss", None))
    try:
        model.save(os.path.join(folder, "model.keras"))
        said["model"] = "model.keras"
    except Exception as exc:  # noqa: BLE001 - said in the report, never the program's failure
        said["model_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    x, y = arguments.get("x"), arguments.get("y")
    if batch_size is None and hasattr(x, "element_spec"):  # batched by the program: its first batch says how
        said["batch_size"] = _safe(lambda: int(len(np.asarray(_first_leaf(next(iter(x)))))))
    said["epoch_examples"] = epoch_rows(arguments, said["batch_size"])
    try:
        if hasattr(x, "element_spec"):
            x, y = _rows(x, CAPTURE_ROWS)[:2]
        elif not hasattr(x, "__len__") or isinstance(x, str):
            raise TypeError(f"fit() was given {type(x).__name__}, which cannot be read twice")
        x, y = _rows(x, CAPTURE_ROWS), _rows(y, CAPTURE_ROWS) if y is not None else None
        arrays = x if isinstance(x, dict) else {"x": x} if not isinstance(x, (list, tuple)) else {
            getattr(t, "name", f"input_{i}"): a for i, (t, a) in enumerate(zip(model.inputs, x))}
        if y is not None and not isinstance(y, (dict, list, tuple)):
            arrays = {**arrays, "y": y}
        np.savez(os.path.join(folder, "sample.npz"), **arrays)
        said["sample"], said["sample_rows"] = "sample.npz", int(len(next(iter(arrays.values()))))
    except Exception as exc:  # noqa: BLE001
        said["sample_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    with open(os.path.join(folder, "capture.json"), "w") as f:
        json.dump(said, f, indent=1)
    return said


def apply_to_fit(model: Any, bound: inspect.BoundArguments, knobs: dict, first: bool = True) -> dict:
    """`tfperf watch --apply`: the doctor's best configuration put on the model of the program's first fit (compile's
    steps_per_execution and jit_compile, and the learning rate scaled by the square-root rule, once; fit's batch at
    each of its fit() calls); what took, and what could not, said. The mixed policy was set when Keras loaded."""
    done: dict[str, Any] = {"not_applied": []}
    if first:
        if knobs.get("steps_per_execution"):
            model.steps_per_execution = int(knobs["steps_per_execution"])
        if knobs.get("jit_compile") is not None:
            model.jit_compile = bool(knobs["jit_compile"])
        model.train_function = None  # built again at fit() with the settings above
    done.update(steps_per_execution=getattr(model, "steps_per_execution", None),
                jit_compile=_safe(lambda: bool(model.jit_compile)), policy=_safe(lambda: model.dtype_policy.name))
    wanted = knobs.get("policy") or "float32"
    if first and done["policy"] != wanted:
        done["not_applied"].append(f"{wanted}: the model runs {done['policy']} (one loaded from a file keeps the "
                                   f"dtypes it was saved with: build it under the policy, or tfperf.precision."
                                   f"under_policy)")
    batch, x = knobs.get("batch"), bound.arguments.get("x")
    given = bound.arguments.get("batch_size") or 32  # Keras' default
    if batch and batch != given:
        if hasattr(x, "element_spec") or not hasattr(x, "__len__"):
            done["not_applied"].append(f"batch {batch}: fit() was given {type(x).__name__}, whose batches are its "
                                       "own (batch it there)")
        else:
            bound.arguments["batch_size"] = int(batch)
            done["batch_size"] = int(batch)
            rate = _safe(lambda: float(model.optimizer.learning_rate))
            if first and rate is not None and _safe(lambda: setattr(model.optimizer, "learning_rate",
                                                                    rate * (batch / given) ** 0.5)) is None:
                done["learning_rate"] = rate * (batch / given) ** 0.5
    return done


def _watch_fit(original: Callable) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if probe.RECORDER is None or probe.RECORDER.fit is not None:
            return original(self, *args, **kwargs)
        arguments: dict = {}
        try:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            summary = _fit_summary(self, bound)
        except TypeError:
            summary = {"site": probe.user_site(2), "model": type(self).__name__}
        rec = probe.RECORDER
        if rec.apply and arguments and rec.data.get("applied_to", id(self)) == id(self):
            done = apply_to_fit(self, bound, rec.apply, first="applied" not in rec.data)
            rec.data.setdefault("applied", done)
            rec.data["applied_to"] = id(self)  # the first fit's model, at each of its fit() calls
            args, kwargs = bound.args[1:], bound.kwargs
            summary.update(steps_per_execution=self.steps_per_execution, batch_size_arg=bound.arguments["batch_size"],
                           jit_compile=_safe(lambda: bool(self.jit_compile)))
        started = probe._clock()
        rec.begin_fit(summary)
        if rec.capture_to and not rec.captured:
            rec.capture_target = (self, arguments)
        try:
            return original(self, *args, **kwargs)
        finally:
            rec.end_fit(started)

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


# -- TensorFlow's profiler over a few steps (--profile-steps): what share of a step waits for input ------------
def _profile_ready(rec: Any) -> bool:
    """The first fit's second epoch (its first runs the traces), or a one-epoch fit past its first steps."""
    if not rec.profile_plan or rec.fit is None or rec.epoch is None or "profile" in rec.data:
        return False
    epochs = rec.fit.get("epochs") or 1
    return bool(rec.fit["epochs_run"]) if epochs > 1 else rec.epoch["steps"] >= probe.PROFILE_SKIP


def _profile_step_begin(rec: Any) -> None:
    """Before a step: start the profiler when it is time, and mark the step for XProf's step breakdown."""
    tf = sys.modules.get("tensorflow")
    if tf is None or rec.validating or (rec.profiling is None and not _profile_ready(rec)):
        return
    if rec.profiling is None:
        try:
            tf.profiler.experimental.start(rec.profile_plan["dir"])
        except Exception as exc:  # noqa: BLE001 - another profiler running, say: said, never the run's failure
            rec.data["profile"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            return
        rec.profiling = {"dir": rec.profile_plan["dir"], "steps": 0, "epoch": rec.epoch["epoch"],
                         "fit": len(rec.data["fits"]) - 1}
    try:
        rec.profile_mark = tf.profiler.experimental.Trace("train", step_num=rec.profiling["steps"], _r=1)
        rec.profile_mark.__enter__()
    except Exception:  # noqa: BLE001 - an unmarked step: XProf reads the others
        rec.profile_mark = None


def _profile_step_end(rec: Any) -> None:
    """After a step: close its mark; once the planned steps ran, stop the profiler (it writes the trace)."""
    if rec.profiling is None:
        return
    if rec.profile_mark is not None:
        try:
            rec.profile_mark.__exit__(None, None, None)
        except Exception:  # noqa: BLE001
            pass
        rec.profile_mark = None
    rec.profiling["steps"] += 1
    if rec.epoch is not None:
        rec.epoch["profiled_steps"] = rec.epoch.get("profiled_steps", 0) + 1
    if rec.profiling["steps"] >= rec.profile_plan["steps"]:
        rec.stop_profile()


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
            _profile_step_begin(probe.RECORDER)  # starting the profiler is not the step's time
            probe.RECORDER.step_started = (probe._clock(), batch)

    def on_train_batch_end(self, batch, logs=None):
        ended = probe._clock()
        if probe.RECORDER is not None and probe.RECORDER.step_started is not None:
            started, first = probe.RECORDER.step_started
            probe.RECORDER.step_started = None
            probe.RECORDER.step(ended - started, max(1, int(batch) - int(first) + 1))
            _profile_step_end(probe.RECORDER)  # nor is writing its trace
        batch_end(self, batch, logs)

    def on_epoch_begin(self, epoch, logs=None):
        if probe.RECORDER is not None:
            probe.RECORDER.begin_epoch(int(epoch))
        epoch_begin(self, epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        epoch_end(self, epoch, logs)
        rec = probe.RECORDER
        if rec is not None:
            rec.end_epoch(logs)
            if rec.capture_to and not rec.captured and getattr(rec, "capture_target", None) is not None:
                rec.captured = True  # once, after the first epoch: the model is built and its data known
                model, arguments = rec.capture_target
                rec.capture_target = None
                batch = rec.data["fits"][-1].get("batch_size") if rec.data["fits"] else None
                rec.data["capture"] = capture(model, arguments, batch, rec.capture_to)

    for name, fn in [("__init__", __init__), ("on_train_batch_begin", on_train_batch_begin),
                     ("on_train_batch_end", on_train_batch_end), ("on_epoch_begin", on_epoch_begin),
                     ("on_epoch_end", on_epoch_end)]:
        probe.replace(cls, name, functools.wraps(getattr(cls, name))(fn))


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


def _time_input(adapter: Any, fit: dict) -> None:
    """Time the batches the program's own Python code makes for fit: a generator's, or a PyDataset's as Keras'
    adapter iterates it (its __getitem__, or the wait for its workers' queue where it has workers)."""
    if hasattr(adapter, "generator") and callable(adapter.generator):
        adapter.generator = _timed_generator(adapter.generator)  # read at each epoch by the adapter
        fit["input"] = "a Python generator"
        return
    dataset = getattr(adapter, "py_dataset", None)
    if dataset is not None and callable(getattr(adapter, "_get_iterator", None)):
        # The TensorFlow iterator reads this bound method when it makes its dataset, after this __init__
        adapter._get_iterator = _timed_generator(adapter._get_iterator)
        fit["input"] = "a keras.utils.PyDataset"
        fit["input_workers"] = _safe(lambda: int(dataset.workers))
        fit["input_processes"] = _safe(lambda: bool(dataset.use_multiprocessing))


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
        if rec.fit is not None:
            _time_input(adapter, rec.fit)
        if rec.fit is not None and rec.fit["batch_size"] is None:
            rec.fit["batch_size"] = _safe(lambda: adapter.batch_size)
            rec.fit["batches_per_epoch"] = batches
        elif rec.fit is None:
            rec.last_batches = batches

    probe.replace(cls, "__init__", __init__)


def patch(probe_module: Any) -> None:
    """Keras 3's Model, callbacks and epoch iterator, once; the probe's recorder is read through `probe_module`."""
    global probe
    from keras.src.callbacks import callback, callback_list  # noqa: PLC0415 - Keras is loaded by now
    from keras.src.models.model import Model  # noqa: PLC0415
    from keras.src.trainers import epoch_iterator  # noqa: PLC0415

    if getattr(Model.fit, "_tfperf_watched", False):
        return
    probe = probe_module
    policy = (probe.RECORDER.apply or {}).get("policy") if probe.RECORDER is not None else None
    if policy and policy != "float32":  # --apply: before the program builds its model, as the doctor's code says
        from keras.src.dtype_policies.dtype_policy import set_dtype_policy  # noqa: PLC0415

        set_dtype_policy(policy)
    model = Model
    probe.replace(model, "fit", _watch_fit(model.fit))
    for kind in probe.CALLS:
        if hasattr(model, kind):
            probe.replace(model, kind, _watch_call(kind, getattr(model, kind)))
    _patch_callback_list(callback_list, callback.Callback)
    _patch_epoch_iterator(epoch_iterator)
