"""Inference experiments: predict(), model(x), tf.function, XLA, LiteRT and ONNX Runtime at each batch size."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.formats import first_line
from tfperf.deploy.inputs import check_runs, flat_outputs, make_inputs, to_tensors
from tfperf.deploy.loader import Subject
from tfperf.doctor.options import MIN_GAIN, Finding, Options


def serving_function(subject: Subject):
    """The model as a tf.function of its inputs, flat and named, with any batch size, returning
    {'output_0': ..., ...}: what LiteRT and ONNX conversions take."""
    import tensorflow as tf

    names = [i.name for i in subject.inputs]
    signature = [tf.TensorSpec((subject.fixed_batch, *i.shape), tf.as_dtype(i.dtype), name=i.name)
                 for i in subject.inputs]

    def serve(*flat):
        outputs = tf.nest.flatten(subject.call(subject.pack(dict(zip(names, flat)))))
        return {f"output_{k}": t for k, t in enumerate(outputs)}

    return tf.function(serve, input_signature=signature)


def _ordered(outputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(outputs[k]) for k in sorted(outputs, key=lambda k: int(k.rpartition("_")[2]))]


def litert_runner(subject: Subject, workdir: Path, threads: int | None) -> Callable[[Mapping[str, np.ndarray]], list]:
    """The model converted to LiteRT (float32, builtin ops), in an interpreter: a call on inputs by name."""
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    from tfperf.deploy.formats import litert_from_saved_model

    staged = workdir / "litert-savedmodel"
    function = serving_function(subject)
    if subject.kind == "keras":
        # Through Keras' ExportArchive, which hands the converter the Keras variables to freeze (a plain
        # tf.Module holding a Keras 3 model converts to a model that answers garbage).
        import keras

        archive = keras.export.ExportArchive()
        archive.track(subject.model)
        archive.add_endpoint(name="serving_default", fn=function)
        archive.write_out(str(staged), verbose=False)
    else:
        module = tf.Module()
        module.tracked = subject.trackable  # so that the SavedModel holds the variables the function reads
        tf.saved_model.save(module, str(staged), signatures={"serving_default": function.get_concrete_function()})
    flat = litert_from_saved_model(staged)
    shutil.rmtree(staged, ignore_errors=True)
    interpreter = Interpreter(model_content=flat, num_threads=threads)
    runner = interpreter.get_signature_runner("serving_default")
    return lambda inputs: _ordered(runner(**inputs))


def onnx_runner(subject: Subject, threads: int | None) -> Callable[[Mapping[str, np.ndarray]], list]:
    """The model converted by tf2onnx, in an ONNX Runtime session: a call on inputs by name."""
    import onnxruntime as ort

    from tfperf.deploy.formats import onnx_from_function

    function = serving_function(subject)
    proto = onnx_from_function(function, function.input_signature)
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda inputs: _ordered(dict(zip(names, session.run(names, dict(inputs)))))



def model_facts(subject: Subject, *, quick: bool, sample: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Parameters, FLOPs per example, inputs and outputs, and the compute limit at the matmul rate measured now;
    DoctorError when the model fails on the inputs doctor will give it."""
    from tfperf.measure import peak_matmul_flops_per_s

    outputs = check_runs(subject, make_inputs(subject, 2, seed=0, sample=sample))
    rate = peak_matmul_flops_per_s((512,) if quick else (512, 1024, 2048))
    facts = {"kind": subject.kind, "parameters": subject.parameters, "weight_bytes": subject.weight_bytes,
             "inputs": [str(i) for i in subject.inputs],
             "outputs": [f"output_{k}: {o.dtype.name}[batch, {', '.join(map(str, o.shape[1:]))}]".replace(", ]", "]")
                         for k, o in enumerate(outputs)],
             "flops_per_example": subject.flops, "matmul_flops_per_s": rate}
    if subject.flops:
        facts["compute_limit_examples_per_s"] = rate / subject.flops
    return facts


def _timer_rows(rec, table: str, measurements, comparisons, extra: Mapping[str, dict], *, batch: int) -> None:
    """Record one race: the baseline row, then each alternative with its comparison."""
    for i, m in enumerate(measurements):
        metrics = {"ms_per_call": m.median_s * 1e3, "p99_ms": m.p99_s * 1e3, "rows_per_s": m.items_per_s,
                   "first_call_s": m.first_call_s, "batch": batch, **extra.get(m.name, {})}
        primary = "ms_per_call" if batch == 1 else "rows_per_s"
        rec.add(table, m.name, metrics, primary=primary, lower_is_better=batch == 1, measurement=m,
                comparison=None if i == 0 else comparisons[i - 1])


def inference(subject: Subject, rec, options: Options, workdir: Path, progress) -> tuple[list[Finding], dict]:
    """predict() / model(x) / tf.function / XLA / LiteRT / ONNX Runtime, at each batch size."""
    import tensorflow as tf

    from tfperf.measure import Timer, race, versus

    findings, skipped = [], {}
    threads = os.cpu_count()
    exported: dict[str, Callable] = {}
    if options.exported:
        for name, build in (("LiteRT interpreter", lambda: litert_runner(subject, workdir, threads)),
                            ("ONNX Runtime", lambda: onnx_runner(subject, threads))):
            try:
                exported[name] = build()
            except Exception as exc:  # a converter that cannot take this model: a finding, not a failure
                skipped[name] = f"conversion failed: {type(exc).__name__}: {first_line(exc)}"
    batches = [b for b in options.batch_sizes if subject.fixed_batch in (None, b)]
    if not batches:
        skipped["batch sweep"] = f"the signature takes only batch {subject.fixed_batch}"
        batches = [subject.fixed_batch]
    graph = tf.function(subject.call)
    xla = tf.function(subject.call, jit_compile=True)
    for batch in batches:
        progress(f"inference at batch {batch}")
        flat = make_inputs(subject, batch, seed=options.seed, sample=options.sample)
        tensors = subject.pack(to_tensors(flat))
        reference = check_runs(subject, flat)
        calls: dict[str, tuple[Callable[[], Any], str, str]] = {}
        if subject.kind == "keras":
            packed = subject.pack(flat)
            model = subject.model
            calls["predict()"] = (lambda: model.predict(packed, batch_size=batch, verbose=0), "", "")
            calls["model(x)"] = (lambda: model(tensors, training=False),
                                 "y = model(x, training=False)   # instead of model.predict(x) for small batches",
                                 "none: the same model in eager mode")
        else:
            calls["signature"] = (lambda: subject.call(tensors), "", "")
        calls["tf.function"] = (
            lambda: graph(tensors),
            "serve = tf.function(lambda x: model(x, training=False), input_signature=[...])  # None batch axis",
            "one trace per input signature (see retracing)")
        calls["tf.function, jit_compile=True"] = (
            lambda: xla(tensors),
            "serve = tf.function(lambda x: model(x, training=False), jit_compile=True, input_signature=[...])",
            "an XLA compile for every new input shape (first call below)")
        for name, run in exported.items():
            calls[name] = ((lambda run=run: run(flat)),
                           "tf.lite.TFLiteConverter.from_saved_model(...); ai_edge_litert Interpreter" if "LiteRT" in name
                           else "tf2onnx.convert.from_keras(model) (or from_function); onnxruntime.InferenceSession",
                           "a converted copy to ship and keep in step with the model; float32, outputs checked below")
        diffs, broken = {}, {}
        for name, (fn, _, _) in list(calls.items()):
            try:
                got = flat_outputs(fn())
                diffs[name] = max((float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64))))
                                   for g, r in zip(got, reference) if g.size), default=0.0)
            except Exception as exc:
                broken[name] = f"{type(exc).__name__}: {first_line(exc)}"
                del calls[name]
        for name, why in broken.items():
            skipped[f"{name} at batch {batch}"] = why
        timers = [Timer(fn, name=name, items_per_call=batch) for name, (fn, _, _) in calls.items()]
        ms, comparisons = race(timers, rounds=options.rounds, threshold=MIN_GAIN, min_time_s=options.min_time_s,
                               seed=options.seed)
        scale = max((float(np.max(np.abs(r))) for r in reference if r.size), default=1.0)
        tolerance = 1e-4 * max(1.0, scale)
        table = "batch 1 latency" if batch == 1 else f"throughput at batch {batch}"
        _timer_rows(rec, table, ms, comparisons, {n: {"max_abs_diff": d} for n, d in diffs.items()}, batch=batch)
        baseline = ms[0].name
        for m, c in zip(ms[1:], comparisons):
            _, code, cost = calls[m.name]
            agrees = diffs[m.name] <= tolerance
            note = "" if agrees else f"outputs differ from the model's by up to {diffs[m.name]:.2g}"
            findings.append(Finding(table, m.name, baseline, c, code, cost, agrees, note))
        # XLA: the question users ask is whether to turn it on for a function they already trace.
        by_name = {m.name: m for m in ms}
        if "tf.function" in by_name and "tf.function, jit_compile=True" in by_name:
            _, code, cost = calls["tf.function, jit_compile=True"]
            findings.append(Finding(f"XLA at batch {batch}", "jit_compile=True", "tf.function",
                                    versus(by_name["tf.function"], by_name["tf.function, jit_compile=True"],
                                           threshold=MIN_GAIN), code, cost,
                                    diffs["tf.function, jit_compile=True"] <= tolerance))
    return findings, skipped


