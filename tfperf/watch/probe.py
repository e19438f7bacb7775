"""What `tfperf watch` runs inside the watched program: Keras' fit, evaluate and predict, their callbacks, each
training step (keras_hooks.py, loaded once Keras is), tf.function tracing (tracing_hooks.py, once TensorFlow is)
and the process's memory (census.py, what grows with it), recorded into one JSON file per process.

Standard library only, and loaded by file path (tfperf.watch.boot): the watched program's interpreter may not have
tfperf installed, and nothing of tfperf's may change what the program imports. Nothing is patched until the
program imports Keras or TensorFlow itself; the record is rewritten at each epoch's end and at exit, so that a run
stopped midway leaves what it did.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from typing import Any, Callable

FOLDER_ENV = "TFPERF_WATCH_DIR"
CAPTURE_ENV = "TFPERF_WATCH_CAPTURE"  # a folder: keep the first fit's model, rows and settings there
APPLY_ENV = "TFPERF_WATCH_APPLY"  # JSON: the doctor's best configuration, put on the first fit
PROFILE_ENV = "TFPERF_WATCH_PROFILE"  # JSON {"steps": N, "dir": path}: trace N steps of the first fit
PROFILE_SKIP = 5  # a one-epoch fit's first steps (its traces) are not the ones profiled
SAMPLES = 2000  # step durations kept per epoch (for medians and intervals); sums count every step
CALL_SAMPLES = 500
MAX_TRACES = 5000  # traces recorded one by one; beyond, counted  # memory readings kept per call site
WRITE_EVERY_S = 1.0  # outside epochs (predict in a loop), the record is rewritten at most this often
CALLBACK_HOOKS = ("on_epoch_begin", "on_epoch_end", "on_train_batch_begin", "on_train_batch_end", "on_train_begin",
                  "on_train_end", "on_test_batch_begin", "on_test_batch_end", "on_test_begin", "on_test_end",
                  "on_predict_batch_begin", "on_predict_batch_end", "on_predict_begin", "on_predict_end")
CALLS = ("evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")
_LIBRARY_PARTS = ("site-packages", "dist-packages", "<frozen", "__autograph_generated", "/keras/src/",
                  "/tensorflow/python/", "<string>")
_HERE = os.path.dirname(os.path.abspath(__file__))
_TFPERF = os.path.dirname(_HERE)
_STDLIB = os.path.dirname(os.__file__)


def _clock() -> float:
    return time.perf_counter()


def rss_bytes() -> int | None:
    """The process's resident memory now (Linux), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def launcher_rank() -> int | None:
    """This process's rank where a launcher started it (horovodrun's Gloo or MPI, torchrun-style RANK)."""
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _is_library(filename: str) -> bool:
    return (any(part in filename for part in _LIBRARY_PARTS) or filename.startswith((_TFPERF, _STDLIB))
            or filename.startswith("<"))


def user_site(skip: int = 2) -> str | None:
    """The file and line of the watched program's own code that led here: the first frame outside libraries."""
    frame = sys._getframe(skip)
    while frame is not None:
        name = frame.f_code.co_filename
        if not _is_library(name):
            try:
                name = os.path.relpath(name)
            except ValueError:
                pass
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _new_epoch(index: int) -> dict:
    return {"epoch": index, "seconds": 0.0, "steps_s": 0.0, "steps": 0, "batches": 0, "step_sample": [],
            "first_step_s": None, "callbacks": {}, "validation_s": 0.0, "traces": 0, "trace_s": 0.0, "rss": None,
            "input_s": 0.0, "input_batches": 0,
            "started": _clock()}


class Recorder:
    """What one process did, as a JSON-able dict, with the state of the call in progress."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, f"process-{os.getpid()}.json")
        self.lock = threading.RLock()
        self.t0 = _clock()
        self.data: dict[str, Any] = {"pid": os.getpid(), "argv": list(sys.argv), "rank": launcher_rank(),
                                     "imports": {}, "fits": [], "functions": {},
                                     "calls": {}, "traces": [], "rss_start": rss_bytes(), "complete": False}
        self.fit: dict | None = None
        self.epoch: dict | None = None
        self.validating = False
        self.step_started: float | None = None
        self.tracing = 0
        self.inner_traces: list[list] = []  # the functions traced inside the trace under way: [name, seconds]
        self.written = 0.0
        self.capture_to = os.environ.get(CAPTURE_ENV) or None
        self.apply = json.loads(os.environ.get(APPLY_ENV) or "{}")
        self.captured = False
        self.capture_target: Any = None
        self.profile_plan: dict[str, Any] = json.loads(os.environ.get(PROFILE_ENV) or "{}")
        self.profiling: dict[str, Any] | None = None  # the profiler's run in progress
        self.profile_mark: Any = None  # the step marker open around the step in progress
        self.census: Any = None  # census.Census: what grows with memory, counted as it grows (made at first use)

    # -- the record --------------------------------------------------------------------------------------------
    def write(self, *, final: bool = False) -> None:
        """Rewrite the record (atomically: a reader never sees half a file)."""
        with self.lock:
            self.data["seconds"] = _clock() - self.t0
            self.data["rss_end"] = rss_bytes()
            self.data["complete"] = final
            text = json.dumps(self.data)
            self.written = _clock()
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, self.path)
        except OSError:
            pass  # the folder is gone (the watch ended first): nothing to tell

    def maybe_write(self) -> None:
        if _clock() - self.written > WRITE_EVERY_S:
            self.write()

    # -- fit, epochs, steps ------------------------------------------------------------------------------------
    def begin_fit(self, summary: dict) -> None:
        with self.lock:
            self.fit = {**summary, "started_s": _clock() - self.t0, "seconds": None, "epochs_run": [],
                        "callbacks_outside_epochs": {}, "batch_size": None, "batches_per_epoch": None,
                        "traces": 0, "trace_s": 0.0, "rss_start": rss_bytes()}
            self.data["fits"].append(self.fit)

    def end_fit(self, started: float) -> None:
        self.stop_profile()
        with self.lock:
            if self.fit is not None:
                self.fit["seconds"] = _clock() - started
                self.fit["rss_end"] = rss_bytes()
            self.fit, self.epoch = None, None
        self.write()

    def begin_epoch(self, index: int) -> None:
        with self.lock:
            if self.fit is not None:
                self.epoch = _new_epoch(index)

    def end_epoch(self, logs: Any = None) -> None:
        self.stop_profile()  # an epoch shorter than the steps planned: what was traced is enough
        with self.lock:
            epoch, self.epoch = self.epoch, None
            if epoch is None or self.fit is None:
                return
            for name in ("loss", "val_loss"):  # the losses the epoch ended on (an applied change is judged by them)
                try:
                    epoch[name] = float(logs[name])  # a number, a NumPy scalar or a scalar tensor
                except (KeyError, TypeError, ValueError):
                    epoch[name] = None
            epoch["seconds"] = _clock() - epoch.pop("started")
            epoch["rss"] = rss_bytes()
            epoch["allocator"] = _allocator_bytes()
            self.fit["epochs_run"].append(epoch)
        self.count_objects(epoch["rss"])
        self.write()

    def step(self, seconds: float, batches: int) -> None:
        with self.lock:
            epoch = self.epoch
            if epoch is None:
                return
            known = self.fit.get("batches_per_epoch") if self.fit is not None else None
            if isinstance(known, int) and known > 0:  # Keras names steps_per_execution batches for an epoch's last
                batches = max(0, min(batches, known - epoch["batches"]))  # execution, which holds what is left
            if epoch["first_step_s"] is None:
                epoch["first_step_s"] = seconds
                epoch["first_step_trace_s"] = epoch["trace_s"] - epoch.get("trace_s_before_step", 0.0)
            epoch["steps_s"] += seconds
            epoch["steps"] += 1
            epoch["batches"] += batches
            # A step under the profiler is slower: counted in the epoch, kept out of the sample that typical
            # steps and a decline are read from.
            if len(epoch["step_sample"]) < SAMPLES and self.profiling is None:
                epoch["step_sample"].append(seconds)
                epoch.setdefault("step_batches", []).append(batches)

    # -- TensorFlow's profiler over a few steps (--profile-steps; started and stopped by keras_hooks) ----------
    def stop_profile(self) -> None:
        """Stop the profiler, which writes the trace, and keep what it traced in the record."""
        if self.profiling is None:
            return
        started = _clock()
        try:
            sys.modules["tensorflow"].profiler.experimental.stop()
        except Exception as exc:  # noqa: BLE001
            self.profiling["error"] = f"{type(exc).__name__}: {exc}"[:300]
        self.profiling["stop_s"] = _clock() - started
        self.data["profile"], self.profiling = self.profiling, None

    def made_batch(self, seconds: float) -> None:
        """A batch the program's own generator made for training (validation's are validation's time)."""
        with self.lock:
            for holder in (self.fit, self.epoch):  # prefetching runs ahead: a batch may be made between epochs
                if holder is not None and not self.validating:
                    holder["input_s"] = holder.get("input_s", 0.0) + seconds
                    holder["input_batches"] = holder.get("input_batches", 0) + 1

    def callback(self, name: str, seconds: float) -> None:
        with self.lock:
            if self.fit is None or self.validating:
                return  # validation's callbacks are validation's time; evaluate's and predict's are the call's
            where = self.epoch["callbacks"] if self.epoch is not None else self.fit["callbacks_outside_epochs"]
            where[name] = where.get(name, 0.0) + seconds

    def trace(self, entry: dict) -> None:
        with self.lock:
            if len(self.data["traces"]) < MAX_TRACES:
                self.data["traces"].append(entry)
            else:
                self.data["traces_dropped"] = self.data.get("traces_dropped", 0) + 1
            for holder in (self.fit, self.epoch):
                if holder is not None:
                    holder["traces"] += 1
                    holder["trace_s"] += entry["seconds"]
                    holder["retraced_inside_s"] = holder.get("retraced_inside_s", 0.0) + entry["retraced_inside_s"]

    def function_call(self, key: int, describe: Callable[[], dict], seconds: float) -> None:
        """A call of one of the program's own tf.functions outside fit (a custom training loop's step)."""
        with self.lock:
            entry = self.data["functions"].get(str(key))
            if entry is None:
                entry = self.data["functions"][str(key)] = {**describe(), "calls": 0, "seconds": 0.0, "sample": []}
            entry["calls"] += 1
            entry["seconds"] += seconds
            if len(entry["sample"]) < SAMPLES:
                entry["sample"].append(seconds)
        self.maybe_write()

    def call(self, kind: str, site: str | None, seconds: float, batches: int | None) -> None:
        with self.lock:
            key = f"{kind} {site}"
            entry = self.data["calls"].setdefault(key, {"kind": kind, "site": site, "calls": 0, "seconds": 0.0,
                                                        "batches": 0, "rss": [], "first_s": seconds})
            entry["calls"] += 1
            entry["seconds"] += seconds
            entry["batches"] += batches or 0
            rss = rss_bytes()
            if len(entry["rss"]) < CALL_SAMPLES:
                entry["rss"].append(rss)
        self.count_objects(rss)
        self.maybe_write()

    def count_objects(self, rss: int | None) -> None:
        """The census of Python objects, where memory has grown enough since its last count (census.py)."""
        if self.census is None:
            self.census = _sibling("census").Census()
        now = _clock()
        if self.census is False or not self.census.due(rss, now):
            return
        try:
            grown = self.census.take(rss, now)
        except Exception as exc:  # noqa: BLE001 - counting is never the program's failure: it stops
            self.census, grown = False, {"error": f"{type(exc).__name__}: {exc}"[:300]}
        with self.lock:
            held = self.data.setdefault("census", {"counts": 0})
            held["counts"] += 1
            if "first_at_s" not in held:
                held["first_at_s"], held["first_rss"] = now - self.t0, rss
            if grown is not None:
                held["last"] = {**grown, "at_s": now - self.t0, "rss": rss}


RECORDER: Recorder | None = None
_PATCHES: list[tuple[Any, str, Any]] = []  # (owner, name, what it held: _MISSING where it inherited) to undo
_MISSING = object()
_REGISTERED = False  # the exit and fork handlers, registered once a process


def replace(owner: Any, name: str, new: Any) -> None:
    """setattr, remembered so that uninstall() can put back what was there (or the inherited one)."""
    _PATCHES.append((owner, name, vars(owner).get(name, _MISSING) if isinstance(owner, type) else
                     getattr(owner, name)))
    setattr(owner, name, new)


def _allocator_bytes() -> int | None:
    """TensorFlow's allocator in use on the first GPU, where there is one (its CPU allocator keeps no count)."""
    tf = sys.modules.get("tensorflow")
    try:
        gpus = tf.config.list_logical_devices("GPU") if tf is not None else []
        return int(tf.config.experimental.get_memory_info(gpus[0].name)["current"]) if gpus else None
    except Exception:  # noqa: BLE001 - a reading that cannot be had is left out, never the program's failure
        return None


def patch_keras() -> None:
    """Keras 3's Model, callbacks and epoch iterator (tfperf/watch/keras_hooks.py, loaded by path as this is)."""
    if "keras.src.models.model" not in sys.modules:
        return
    _sibling("keras_hooks").patch(sys.modules[__name__])  # once: it returns at once where fit() is already watched


def _sibling(name: str) -> Any:
    """One of the probe's own modules beside this file, loaded by path as this one is (once a process)."""
    module = sys.modules.get(f"_tfperf_watch_{name}")
    if module is None:
        import importlib.util  # noqa: PLC0415

        spec = importlib.util.spec_from_file_location(f"_tfperf_watch_{name}", os.path.join(_HERE, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"_tfperf_watch_{name}"] = module
        spec.loader.exec_module(module)
    return module


def patch_tracing() -> None:
    """Every tf.function trace, and calls of the program's own (tfperf/watch/tracing_hooks.py, loaded by path)."""
    if "tensorflow.python.eager.polymorphic_function.tracing_compilation" in sys.modules:
        _sibling("tracing_hooks").patch(sys.modules[__name__])  # once: it returns at once where already patched


# -- Loading: patch when the program imports Keras or TensorFlow -------------------------------------------------
class _Loaded:
    """A loader that runs the real one, then times the import and applies the patches."""

    def __init__(self, loader: Any, name: str):
        self.loader, self.name = loader, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.loader, attr)

    def exec_module(self, module) -> None:
        started = _clock()
        self.loader.exec_module(module)
        if RECORDER is not None:
            RECORDER.data["imports"][self.name] = {"seconds": _clock() - started, "at_s": started - RECORDER.t0}
        patch_tracing()
        patch_keras()


class _Finder:
    """Sees the program import `tensorflow` or `keras` and hands their loaders to _Loaded."""

    NAMES = ("tensorflow", "keras")

    def __init__(self):
        self.busy: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.NAMES or name in self.busy:
            return None
        import importlib.util  # noqa: PLC0415

        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loaded(spec.loader, name)
        return spec


def install(folder: str) -> None:
    """Start recording this process into `folder` (once)."""
    global RECORDER
    if RECORDER is not None or not os.path.isdir(folder):
        return
    RECORDER = Recorder(folder)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    patch_tracing()  # already imported (a sitecustomize of the program's own did): patch now
    patch_keras()
    global _REGISTERED
    if not _REGISTERED:  # once a process, whatever the sessions
        _REGISTERED = True
        atexit.register(_write_final)
        if hasattr(os, "register_at_fork"):  # a forked worker records into a file of its own, from nothing
            os.register_at_fork(after_in_child=_forked)
    RECORDER.write()


def uninstall() -> dict | None:
    """Stop recording (tfperf.watch.session's end): the record written whole, every patch put back, the finder
    removed; the record returned."""
    global RECORDER
    rec, RECORDER = RECORDER, None
    while _PATCHES:
        owner, name, held = _PATCHES.pop()
        if held is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, held)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    if rec is None:
        return None
    rec.write(final=True)
    return rec.data


def _write_final() -> None:
    if RECORDER is not None:
        RECORDER.write(final=True)


def _forked() -> None:
    """In a forked child: a record of its own (the parent's, copied by the fork, stays the parent's)."""
    global RECORDER
    if RECORDER is not None:
        RECORDER = Recorder(os.path.dirname(RECORDER.path))
