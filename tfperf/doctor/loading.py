"""Load time: "why does my SavedModel take 15 s to load where the .h5 took 3?", measured on the model.

The model is written in each form it can take: a .keras file, an .h5 file, the SavedModel `tfperf export` writes
(loaded with `tf.saved_model.load`, and through Keras with `keras.layers.TFSMLayer`), and its LiteRT and ONNX exports
where those extras are installed. Then, in rounds, each form is loaded in a fresh process the way a server loads it
and called once: the import of its runtime, the load and the first call are timed apart (a cold start is their sum).
A model given as module:factory has its module imported first in each process, as the user's own server does, so
that custom layers it registers are known; a form that cannot be loaded so says why.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.loader import Subject
from tfperf.doctor.experiment import Context, Experiment, Section, child_command, flag
from tfperf.doctor.options import MIN_GAIN, Finding, Options
from tfperf.measure.stats import MIN_UNITS

TABLE = "load time"
TIMES = ("import_s", "load_s", "first_call_s")
# Each form: (how the child loads and calls it, the file, or the export format, it reads). LiteRT and ONNX are
# written where their extras are installed; a form that cannot be written is said so.
FORMS: dict[str, tuple[str, str]] = {
    ".keras file, keras.saving.load_model": ("keras", "model.keras"),
    ".h5 file, keras.saving.load_model": ("keras", "model.h5"),
    "SavedModel, tf.saved_model.load": ("saved_model", "savedmodel"),
    "SavedModel, keras.layers.TFSMLayer": ("tfsm_layer", "savedmodel"),
    "LiteRT, Interpreter": ("litert", "litert"),
    "ONNX Runtime, InferenceSession": ("onnx", "onnx"),
}
CODE = {
    "keras": "model = keras.saving.load_model(PATH)",
    "saved_model": "served = tf.saved_model.load(PATH).signatures['serving_default']",
    "tfsm_layer": "layer = keras.layers.TFSMLayer(PATH, call_endpoint='serving_default')",
    "litert": "runner = Interpreter(model_path=PATH).get_signature_runner()  # from ai_edge_litert.interpreter",
    "onnx": "session = onnxruntime.InferenceSession(PATH)",
}


def load_and_call(how: str, path: str, inputs: Mapping[str, np.ndarray], modules: Sequence[str] = ()) -> dict[str, float]:
    """In a fresh process: import the runtime (and for a Keras file the `modules` whose layers it names: the user's
    module:factory module, KerasHub, ... which register them as they are imported, as in the user's own server),
    load the form, call it once; each step's seconds."""
    times, started = {}, time.perf_counter()
    if how in ("keras", "saved_model", "tfsm_layer"):
        import keras
        import tensorflow as tf

        if how == "keras":
            import importlib

            sys.path.insert(0, ".")
            for module in modules:
                importlib.import_module(module)
    elif how == "litert":
        from ai_edge_litert.interpreter import Interpreter
    else:
        import onnxruntime
    times["import_s"], started = time.perf_counter() - started, time.perf_counter()
    if how == "keras":
        model = keras.saving.load_model(path)
        call = lambda: model(inputs if len(inputs) > 1 else next(iter(inputs.values())))  # noqa: E731
    elif how == "saved_model":
        served = tf.saved_model.load(path).signatures["serving_default"]
        call = lambda: served(**{k: tf.constant(v) for k, v in inputs.items()})  # noqa: E731
    elif how == "tfsm_layer":
        # TFSMLayer hands its endpoint one argument: the input itself, or a list of them in the endpoint's order.
        layer = keras.layers.TFSMLayer(path, call_endpoint="serving_default")
        tensors = [tf.constant(v) for v in inputs.values()]
        call = lambda: layer(tensors[0] if len(tensors) == 1 else tensors)  # noqa: E731
    elif how == "litert":
        runner = Interpreter(model_path=str(Path(path) / "model.tflite")).get_signature_runner()
        call = lambda: runner(**inputs)  # noqa: E731
    else:
        session = onnxruntime.InferenceSession(str(Path(path) / "model.onnx"), providers=["CPUExecutionProvider"])
        call = lambda: session.run(None, dict(inputs))  # noqa: E731
    times["load_s"], started = time.perf_counter() - started, time.perf_counter()
    out = call()
    for value in (out.values() if isinstance(out, Mapping) else out if isinstance(out, (list, tuple)) else [out]):
        np.asarray(value)  # the answer is there
    times["first_call_s"] = time.perf_counter() - started
    return times


def child(argv: list[str]) -> int:
    """`python -m tfperf.doctor.child loading HOW PATH INPUTS.npz [MODULE ...]`: one cold start, replied to the
    parent. Nothing but this module is imported before the timing starts."""
    how, path, inputs = argv[:3]
    with np.load(inputs) as arrays:
        given = {k: arrays[k] for k in arrays.files}
    try:
        found = load_and_call(how, path, given, argv[3:])
    except Exception as exc:  # noqa: BLE001  (a form that cannot be loaded so is the finding: its first line)
        text = str(exc).strip()
        found = {"error": f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"}
    from tfperf.measure.processes import reply

    print(reply(found), flush=True)
    return 0


def write_forms(subject: Subject, folder: Path, options: Options,
                forms: Mapping[str, tuple[str, str]] = FORMS) -> tuple[dict[str, str], dict[str, str]]:
    """Each form written under `folder`: (paths by form, forms that could not be written and why)."""
    from tfperf.deploy.errors import first_line
    from tfperf.deploy.layout import export_subject
    from tfperf.extras import MissingExtra

    written, failed, exports = {}, {}, {}
    folder.mkdir(parents=True, exist_ok=True)
    for form, (how, name) in forms.items():
        try:
            if how == "keras":
                if subject.kind != "keras":
                    raise ValueError("a SavedModel given as it is has no Keras file")
                path = folder / name
                if not path.exists():
                    subject.model.save(path)
            else:
                if name not in exports:
                    exports[name] = export_subject(subject, folder / "exports", name=name, format=name,
                                                   sample=options.sample, seed=options.seed).path
                path = exports[name]
            written[form] = str(path)
        except MissingExtra as exc:
            failed[form] = str(exc)
        except Exception as exc:  # noqa: BLE001  (a form this model cannot take is a finding, not a failure)
            failed[form] = f"{type(exc).__name__}: {first_line(exc)}"
    return written, failed


@dataclasses.dataclass(frozen=True)
class LoadTimes:
    """Each form's cold start, for the report's paragraph."""

    measured: dict[str, dict[str, Any]]  # form -> {name: Measurement} of its times
    cold: dict[str, Any]  # form -> Measurement of import + load + first call

    def describe(self) -> str:
        """One line per form: import, load and first call, and the cold start they make."""
        lines = ["A cold start per form the model can take, each in fresh processes taking turns (median of the "
                 "runs: importing its runtime, loading, the first call; NumPy, which every form needs, is imported "
                 "before the clock starts):", ""]
        for form, cold in sorted(self.cold.items(), key=lambda kv: kv[1].median_s):
            parts = self.measured[form]
            lines.append(f"- {form}: {cold.median_s:.2f} s (import {parts['import_s'].median_s:.2f} s, load "
                         f"{parts['load_s'].median_s:.2f} s, first call {parts['first_call_s'].median_s * 1e3:.0f} ms)")
        return "\n".join(lines)


def load_times(subject: Subject, rec, options: Options, workdir: Path, progress, *, runs: int = MIN_UNITS,
               forms: Mapping[str, tuple[str, str]] = FORMS) -> tuple[list[Finding], dict, LoadTimes | None]:
    """Write every form, cold-start each in fresh processes taking turns (`runs` rounds: the 6 a paired verdict
    needs), record them, and find which loads fastest against the form the model was given in."""
    from tfperf.deploy.inputs import make_inputs
    from tfperf.measure import Measurement, versus
    from tfperf.measure.processes import ChildError, run_child

    progress("load time")
    written, skipped = write_forms(subject, workdir / "forms", options, forms)
    inputs = workdir / "forms" / "inputs.npz"
    np.savez(inputs, **make_inputs(subject, 1, seed=options.seed, sample=options.sample))
    # What a Keras file needs imported to load: the user's module (module:factory), the libraries it names (KerasHub).
    from tfperf.deploy.keras_files import libraries_named, read_config

    modules = [subject.source.rpartition(":")[0]] if ":" in subject.source and not Path(subject.source).exists() else []
    keras_file = next((Path(p) for f, p in written.items() if forms[f][0] == "keras"), None)
    if keras_file is not None:
        modules += libraries_named(read_config(keras_file))
    taken: dict[str, dict[str, list[float]]] = {form: {t: [] for t in TIMES} for form in written}
    for _ in range(runs):  # rounds: every form once, then again, so that a slow spell falls on all of them
        for form in list(taken):
            argv = child_command("loading", forms[form][0], written[form], str(inputs), *modules)
            try:
                found = run_child(argv, who=f"loading the {form}", timeout=600,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            except ChildError as exc:
                found = {"error": str(exc)}
            if "error" in found:
                skipped[f"{TABLE}: {form}"] = f"cannot be loaded and called so: {found['error']}"
                del taken[form]
                continue
            for t in TIMES:
                taken[form][t].append(float(found[t]))
    if not taken:
        return [], skipped, None
    measured = {form: {t: Measurement(name=f"{form}: {t}", samples_s=tuple(v), rounds=runs) for t, v in times.items()}
                for form, times in taken.items()}
    cold = {form: Measurement(name=form, samples_s=tuple(map(sum, zip(*(times[t] for t in TIMES)))), rounds=runs)
            for form, times in taken.items()}
    given = _given_form(subject, cold)
    findings = []
    for form, m in cold.items():
        comparison = versus(cold[given], m, threshold=MIN_GAIN) if form != given else None
        parts = measured[form]
        rec.add(TABLE, form, {"cold_start_s": m.median_s, "import_s": parts["import_s"].median_s,
                              "load_s": parts["load_s"].median_s, "first_call_ms": parts["first_call_s"].median_s * 1e3,
                              "runs": runs}, primary="cold_start_s", lower_is_better=True, measurement=m,
                comparison=comparison, versus_first=False)
        if comparison is not None:
            how = forms[form][0]
            findings.append(Finding(
                TABLE, form, given, comparison, CODE[how],
                f"import {parts['import_s'].median_s:.2f} s, load {parts['load_s'].median_s:.2f} s, first call "
                f"{parts['first_call_s'].median_s * 1e3:.0f} ms (against {measured[given]['import_s'].median_s:.2f}, "
                f"{measured[given]['load_s'].median_s:.2f} s and {measured[given]['first_call_s'].median_s * 1e3:.0f} ms)"
                + ("; a converted copy to ship, checked against the model" if how in ("litert", "onnx") else "")))
    return findings, skipped, LoadTimes(measured, cold)


def _given_form(subject: Subject, cold: Mapping[str, Any]) -> str:
    """The form the model came in (the baseline the others are judged against), else the first measured."""
    source = subject.source
    mine = (".h5 file" if source.endswith(".h5") else ".keras file" if subject.kind == "keras"
            else "SavedModel, tf.saved_model.load")
    return next((form for form in cold if form.startswith(mine)), next(iter(cold)))


def run(ctx: Context) -> Section:
    """Each form's cold start as a section of the report."""
    findings, skipped, found = load_times(ctx.subject, ctx.recorder, ctx.options, ctx.workdir, ctx.progress)
    return Section(EXPERIMENT.name, findings, skipped, found,
                   detail=f"## Load time\n\n{found.describe()}\n" if found is not None else "")


EXPERIMENT = Experiment(
    name=TABLE, question="Why does my SavedModel take so long to load? Is the .h5 faster?",
    run=run, budgeted=False, applies=lambda subject, options: options.load_time,
    flags=(flag("--load-time", action="store_true",
                help="why does my model take so long to load: a cold start (import, load, first call) of each form it "
                     "can take (.keras, .h5, SavedModel through tf.saved_model.load and Keras, LiteRT, ONNX), each in "
                     "fresh processes taking turns, 6 rounds (about 4 s a process where TensorFlow is imported)"),))
