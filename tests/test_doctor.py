"""tfperf doctor on models unlike the cookbook's: token inputs through an Embedding and an LSTM or
attention, several inputs in dicts and lists, several outputs, a SavedModel from a tf.Module without
Keras; retracing detected where it happens and only there; every bad input in one line with exit 2."""

import json
import os
import re
import sys
import textwrap
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfperf import doctor
from tfperf.deploy.errors import InputError
from tfperf.deploy.inputs import make_inputs
from tfperf.deploy.loader import load_subject
from tfperf.doctor.retracing import count_traces, retraces, retracing
from tfperf.doctor.training import training
from tfperf.cli import main
from conftest import run, varying_outputs
from tfperf.records.jsonl import read_records
from tfperf.measure.stats import FASTER, NO_DIFFERENCE, SLOWER

VERDICTS = (FASTER, SLOWER, NO_DIFFERENCE)

# Three calls in the retracing table, not seven: each is a trace of the model (1.2 s for MobileNetV2), and these
# tests check counts, not the verdicts seven calls give.
TINY = dict(batch_sizes=(1, 4), rounds=6, min_time_s=0.01, train_examples=64, threads=False, max_extensions=0,
            trace_batches=(1, 2, 3), long_run_s=0.0,  # the search: test_best_configuration; confirming: test_best_call
            asked={"no_search": True, "no_confirm": True})

FACTORIES = textwrap.dedent("""
    import keras
    import tensorflow as tf

    def text_model():
        # Token ids through a masking Embedding and an LSTM, beside a float input: a dict of inputs.
        tokens = keras.Input((12,), dtype="int32", name="tokens")
        extra = keras.Input((3,), name="extra")
        h = keras.layers.LSTM(8)(keras.layers.Embedding(40, 8, mask_zero=True)(tokens))
        out = keras.layers.Dense(4)(keras.layers.Concatenate()([h, extra]))
        return keras.Model({"tokens": tokens, "extra": extra}, out, name="text")

    def above_100(x):
        tf.debugging.assert_greater(x, 100.0, message="this model takes values above 100")
        return x

    def failing_model():
        # It builds (the output shape is declared) and fails on values below 100, such as doctor's.
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Lambda(above_100, output_shape=(4,))(inputs))

    def not_a_model():
        return 42
""")


PIPELINES = textwrap.dedent("""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    def model():
        inputs = keras.Input((8,), name="features")
        return keras.Model(inputs, keras.layers.Dense(4)(keras.layers.Dense(16, activation="relu")(inputs)))

    def _examples():
        rng = np.random.default_rng(0)
        return tf.data.Dataset.from_tensor_slices((rng.random((64, 8), dtype=np.float32), np.arange(64) % 4))

    def _read(x):  # stands in for reading and decoding files: it waits, 20 ms a batch
        time.sleep(0.02)
        return x

    def _load(x, y):
        return tf.ensure_shape(tf.py_function(_read, [x], tf.float32), [None, 8]), y

    def slow():
        return _examples().batch(16).map(_load)

    def fast():
        return _examples().batch(16).map(_load).cache().prefetch(tf.data.AUTOTUNE)

    def crawling():  # each batch waits longer than the one before: a pipeline that slows down as it goes
        began = []

        def _later(x):
            began.append(began[0] if began else time.perf_counter())
            time.sleep(min(0.001 + 0.01 * (time.perf_counter() - began[0]), 0.03))  # up to 30 ms a batch
            return x

        return _examples().batch(16).map(lambda x, y: (
            tf.ensure_shape(tf.py_function(_later, [x], tf.float32), [None, 8]), y))

    def generated():  # the examples from a Python generator, one at a time
        rng = np.random.default_rng(0)
        x, y = rng.random((64, 8), dtype=np.float32), np.arange(64) % 4
        spec = (tf.TensorSpec((8,), tf.float32), tf.TensorSpec((), tf.int64))
        return tf.data.Dataset.from_generator(lambda: zip(x, y), output_signature=spec).batch(16)

    def unbatched():
        return _examples()

    def features_only():
        return _examples().map(lambda x, y: x).batch(16)

    def wrong_width():
        return tf.data.Dataset.from_tensor_slices((np.zeros((32, 5), np.float32), np.zeros(32, np.int64))).batch(8)

    def a_list():
        return [1, 2, 3]
""")


ROOF: list[float] = []  # the matmul rate this worker measured, once


@pytest.fixture(autouse=True)
def one_roof_per_worker(monkeypatch):
    """Each diagnose measures the machine's matmul rate (2-4 s here, 3 sizes up to 2048): these tests take the
    rate the first of them measured in this process. The roof's measurement itself is tested below."""
    import tfperf.measure

    measure = tfperf.measure.peak_matmul_flops_per_s

    def once(*args, **kwargs) -> float:
        if args or kwargs:
            return measure(*args, **kwargs)
        ROOF[:] = ROOF or [measure()]
        return ROOF[0]

    monkeypatch.setattr(tfperf.measure, "peak_matmul_flops_per_s", once)


@pytest.fixture
def pipelines(tmp_path, monkeypatch):
    """A module with a small model and tf.data pipelines for it, importable as `pipelines_<test>`."""
    name = f"pipelines_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{name}.py").write_text(PIPELINES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module of model factories in the working folder, importable as `factories_<test>`."""
    name = f"factories_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{name}.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def attention_file(tmp_path):
    """A .keras file: token ids through self-attention with a residual `+` (an op without weights) beside a float
    input (a list), two outputs."""
    ids, side = keras.Input((10,), dtype="int32", name="ids"), keras.Input((4,), name="side")
    h = keras.layers.Embedding(30, 16)(ids)
    h = keras.layers.GlobalAveragePooling1D()(h + keras.layers.MultiHeadAttention(2, 8)(h, h))
    model = keras.Model([ids, side], [keras.layers.Dense(3)(h), keras.layers.Dense(1)(side)], name="attn")
    path = tmp_path / "attn.keras"
    model.save(path)
    return path


class Scorer(tf.Module):
    """A model without Keras: a tf.Module whose one tf.function becomes the SavedModel's signature."""

    def __init__(self):
        self.w = tf.Variable(tf.random.normal([6, 3], seed=1))

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32, name="features")])
    def __call__(self, features):
        return {"scores": tf.nn.softmax(tf.matmul(features, self.w))}


def check_structure(d, out, tables):
    """The report and records a run leaves: tables, raw samples, intervals, verdicts, the summary's parts."""
    report = doctor.write_report(d, out)
    records = read_records(out / "doctor.jsonl")
    assert {r["table"] for r in records} >= set(tables)
    for r in records:
        assert r["recipe"] == "doctor"
        if "samples_s" in r:
            assert r["n"] == len(r["samples_s"]) and len(r["ci95"]) == 2
        if "versus" in r:
            assert r["verdict"] in VERDICTS and len(r["ratio_ci95"]) == 2
    text = report.read_text()
    assert text.startswith(f"# tfperf doctor: {d.subject.name}") and all(f"### {t}" in text for t in tables)
    summary = doctor.summary(d)
    assert "Advice" in summary or "No change measured here" in summary
    assert "Measured without a gain that counts" in summary
    for finding, also in d.advice:  # advice is only ever a significant gain that keeps the answers
        assert finding.comparison.verdict == "faster" and finding.agrees and finding.code
        assert all(o.comparison.verdict == "faster" for o in also)
    return records


@pytest.mark.slow
def test_token_dict_model_from_a_factory_with_training(factories, tmp_path):
    subject = load_subject(f"{factories}:text_model")
    assert [(i.name, i.dtype, i.shape) for i in subject.inputs] == [("extra", "float32", (3,)),
                                                                     ("tokens", "int32", (12,))]
    assert subject.vocabulary == 40 and subject.mask_zero
    x = make_inputs(subject, 64, seed=0)
    tokens = x["tokens"]
    assert tokens.max() < 40 and (tokens[:, 0] > 0).all()  # within the vocabulary, never all padding
    assert (tokens == 0).any() and all((row[np.argmax(row == 0):] == 0).all() for row in tokens if (row == 0).any())
    options = doctor.Options(**TINY, train=True, loss="sparse_categorical_crossentropy", from_logits=True)
    d = doctor.diagnose(subject, options, tmp_path / "work")
    records = check_structure(d, tmp_path / "out", ["batch 1 latency", "throughput at batch 4", "retracing",
                                                    "training"])
    training = {r["row"]: r["metrics"] for r in records if r["table"] == "training"}
    assert {"plain fit (batch 32)", "steps_per_execution=16", "jit_compile=True"} <= set(training)
    assert all(np.isfinite(m["final_loss"]) for m in training.values())
    latency = {r["row"]: r["metrics"] for r in records if r["table"] == "batch 1 latency"}
    assert {"predict()", "model(x)", "tf.function", "tf.function, jit_compile=True", "ONNX Runtime"} <= set(latency)
    assert latency["ONNX Runtime"]["max_relative_diff"] < 1e-4
    # The LSTM with a mask needs TensorFlow ops LiteRT lacks: said, not hidden.
    assert "LiteRT interpreter" in latency or "LiteRT interpreter" in d.skipped


@pytest.mark.slow
def test_list_inputs_and_two_outputs_from_a_keras_file_with_mixed_precision(tmp_path):
    subject = load_subject(str(attention_file(tmp_path)))
    assert subject.structure == ["ids", "side"] and subject.vocabulary == 30 and not subject.mask_zero
    options = doctor.Options(**TINY, train=True, loss="mean_squared_error")
    d = doctor.diagnose(subject, options, tmp_path / "work")
    records = check_structure(d, tmp_path / "out", ["batch 1 latency", "retracing", "training"])
    assert len(d.facts["outputs"]) == 2
    assert any(r["row"].startswith("mixed_") for r in records if r["table"] == "training"), d.skipped
    # Issue 71: the row survives the residual `+`, and its Apply line rebuilds a loaded model (set_global_policy
    # alone would change none of its layers).
    mixed = next(f for f in d.findings if f.section == "training" and f.row.startswith("mixed_"))
    assert mixed.code.startswith("model = tfperf.precision.under_policy(model, ")
    import tfperf.precision

    applied = {"model": keras.saving.load_model(attention_file(tmp_path)), "tfperf": tfperf}
    exec(mixed.code, applied)
    assert {layer.dtype_policy.name for layer in applied["model"].layers if layer.weights} == {
        mixed.row, "float32"}  # the output layers stay float32
    latency = {r["row"]: r["metrics"] for r in records if r["table"] == "batch 1 latency"}
    assert all(m["max_relative_diff"] < 1e-4 for row, m in latency.items()), latency


def test_a_saved_model_from_a_tf_module_without_keras_and_with_a_fake_gpus_tf32(tmp_path, monkeypatch):
    from tfperf.doctor import inference

    tf.saved_model.save(Scorer(), str(tmp_path / "scorer"))
    subject = load_subject(str(tmp_path / "scorer"))
    assert subject.kind == "savedmodel" and [str(i) for i in subject.inputs] == ["features: float32[batch, 6]"]
    # TF32 in effect (an Ampere GPU, faked): TensorFlow's rows are held to TF32's bar, the exports to 1e-4.
    monkeypatch.setattr(inference, "tf32_here", lambda: True)
    d = doctor.diagnose(subject, doctor.Options(**TINY), tmp_path / "work")
    records = check_structure(d, tmp_path / "out", ["batch 1 latency", "throughput at batch 4", "retracing"])
    latency = {r["row"]: r["metrics"] for r in records if r["table"] == "batch 1 latency"}
    assert list(latency)[0] == "signature" and {"LiteRT interpreter", "ONNX Runtime"} <= set(latency)
    assert all(m["max_relative_diff"] < 1e-5 for m in latency.values())
    assert {row: m["tolerance"] for row, m in latency.items()} == {
        "signature": 1e-2, "tf.function": 1e-2, "tf.function, jit_compile=True": 1e-2, "LiteRT interpreter": 1e-4,
        "ONNX Runtime": 1e-4}
    with pytest.raises(doctor.DoctorError, match="need the Keras model"):
        training(subject, None, doctor.Options(**TINY, train=True, loss="mse"), print)


@pytest.mark.slow
def test_a_keras_applications_model_gets_flops_mfu_and_advice_its_export_command_reproduces(tmp_path, capsys,
                                                                                          browser):
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)
    varying_outputs(model, np.random.default_rng(0).random((16, 32, 32, 3), dtype=np.float32)).save(
        tmp_path / "mobilenet.keras")
    subject = load_subject(str(tmp_path / "mobilenet.keras"))
    # Two batch sizes for the retracing rows: each first call traces MobileNetV2 anew (a second each, 15 s of 67).
    d = doctor.diagnose(subject, doctor.Options(**{**TINY, "batch_sizes": (1,), "trace_batches": (1, 2)}),
                        tmp_path / "work")
    records = check_structure(d, tmp_path / "out", ["batch 1 latency", "retracing"])
    # FLOPs from TensorFlow's own count of the traced model: its convolutions (depthwise too) by hand, and a
    # few percent of bias adds, normalisation and element-wise arithmetic on top.
    from test_models import hand_count

    assert hand_count(model) <= d.facts["flops_per_example"] <= 1.1 * hand_count(model)
    assert d.facts["compute_limit_examples_per_s"] > 0
    assert all(0 < r["metrics"]["mfu"] < 1 for r in records if r["table"] == "batch 1 latency")
    assert all(r["metrics"].get("mfu") is None or r["metrics"]["mfu"] <= 1 for r in records)  # no share above a limit
    # Retracing is a pitfall of how a function might be called: never ranked as advice for this model,
    # whose own predict() does not retrace.
    own = next(r for r in records if r["row"] == "predict(), a new batch size each call")
    assert own["metrics"]["traces"] <= 2
    assert not [a for a, _ in d.advice if a.section.startswith("retracing")]
    assert all(a.pitfall for a, _ in d.pitfalls)
    assert "Pitfalls, measured on your model" in doctor.summary(d) or not d.pitfalls
    # Its report.html, as a person sees it: the headline first, the advice open beneath it, no errors.
    from browser import look_at

    seen = look_at(browser, tmp_path / "out" / "report.html", tmp_path / "doctor.png")
    assert seen["errors"] == [] and seen["broken_images"] == 0 and seen["folded"] == 0
    assert seen["findings_rows"] == 1 and 0 < seen["findings_top"] < seen["height"]
    said = ("none measurably faster" if not d.advice else
            "what this run was asked (" if d.advice[0][0].section in d.leading else "the largest gain (")
    assert said in seen["first_screen"]
    # The runtime rows time the very files their "Apply:" command writes.
    onnx = next(f for f in d.findings if f.row == "ONNX Runtime" and f.section == "batch 1 latency")
    command = onnx.code.split()
    assert command[:3] == ["tfperf", "export", str(tmp_path / "mobilenet.keras")] and "--format" in command
    assert main([*command[1:], "--root", str(tmp_path / "mine")]) == 0
    capsys.readouterr()
    from tfperf.deploy.layout import load, predict

    timed, made = load(tmp_path / "work" / "exports" / "onnx" / "1"), load(tmp_path / "mine" / "mobilenet" / "1")
    assert sorted(timed.session.get_modelmeta().custom_metadata_map) == sorted(made.session.get_modelmeta(
    ).custom_metadata_map) and [s.name for s in timed.inputs] == [s.name for s in made.inputs]
    x = {timed.inputs[0].name: np.random.default_rng(1).random((4, 32, 32, 3), dtype=np.float32)}
    np.testing.assert_array_equal(predict(timed, x)["output_0"], predict(made, x)["output_0"])


def test_an_experiment_is_added_as_one_module_and_one_line_of_the_registry(tmp_path, capsys, monkeypatch):
    """Issue 70: what a new experiment declares (its flag, its rule, when it applies, its steps, its section) is all
    the command, the plan, the run and the report need; its flag reaches it through Options.asked."""
    from tfperf.doctor import registry
    from tfperf.doctor.experiment import Experiment, Section, flag

    def count(ctx):
        ctx.progress("counting layers")
        layers = len(ctx.subject.model.layers)
        return Section("layer count", skipped={"layer count: weights": "not counted"}, found=layers,
                       detail=f"## Layer count\n\n{layers} layers, below {ctx.options.asked['below']}.\n")

    counting = Experiment(
        "layer count", "How many layers has my model?", count,
        applies=lambda subject, options: options.asked.get("count_layers", False),
        steps=lambda subject, options: ["counting layers"],
        flags=(flag("--count-layers", action="store_true", help="count the layers"),
               flag("--below", type=int, default=99, help="with --count-layers: the count to stay under")),
        rules=(lambda args: "--below is for --count-layers" if args.below != 99 and not args.count_layers else None,))
    def breaks(ctx):  # an experiment whose own process fails: said in one line, the others run, the report stays
        raise RuntimeError('python exited with 1:   File "loader.py", line 219 | tfperf.deploy.errors.ModelError: '
                           'cnn is a folder without saved_model.pb')

    breaking = Experiment("breaking", "Does it break?", breaks, applies=lambda subject, options: True,
                          steps=lambda subject, options: [])
    only_retracing = [e for e in registry.EXPERIMENTS if e.name == "retracing"]
    monkeypatch.setattr(registry, "EXPERIMENTS", (*only_retracing, breaking, counting))
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)]).save(tmp_path / "m.keras")
    model = str(tmp_path / "m.keras")
    one_line_error(capsys, [model, "--below", "5"], "--below is for --count-layers")
    code, out, err = run_cli([model, "--quick", "--no-profile", "--count-layers", "--below", "7", "--out",
                              tmp_path / "out"], capsys)
    assert code == 0, err[-2000:]
    assert "3 steps: the model, retracing, counting layers" in err
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Layer count\n\n2 layers, below 7." in report and "layer count: weights: not counted" in report
    assert "layer count" in report.split("Doctor took")[1]  # its time, under its own name
    said = "breaking: failed: ModelError: cnn is a folder without saved_model.pb (the other experiments ran"
    assert said in report and "breaking failed: ModelError: cnn is a folder" in err and "Traceback" not in err


def test_a_larger_batchs_loss_is_checked_against_plain_fits_and_the_apply_line_fits_how_the_model_was_made():
    """Issue 71: a batch row whose loss after the same examples is off plain fit's by more than the bar does not
    agree (it said True for 2.061 against 1.761), and says what to retune; a policy is applied before building a
    model the user's code builds, and by a rebuild to a model loaded from a file."""
    from tfperf.doctor.targets import loss_check, mixed_code

    assert loss_check("batch 64", 1.80, 1.761) == (True, "")
    for row, loss, plain in (("batch 64", 2.061, 1.761), ("batch 512", 0.432, 0.153), ("batch 64", 0.115, 0.030)):
        agrees, note = loss_check(row, loss, plain)
        assert not agrees and f"{loss:.4g} against plain fit's {plain:.4g}" in note and "learning rate" in note
    agrees, note = loss_check("jit_compile=True", 0.5, 0.4)
    assert not agrees and "learning rate" not in note
    assert loss_check("mixed_bfloat16", float("nan"), 0.4) == (False, "final loss nan against 0.4: not finite")
    assert mixed_code("mixed_bfloat16", True).startswith("keras.mixed_precision.set_global_policy('mixed_bfloat16')")
    assert "under_policy(model, 'mixed_bfloat16')" in mixed_code("mixed_bfloat16", False)


def test_pitfalls_are_ranked_with_the_advice_only_when_the_models_own_call_retraces():
    from tfperf.doctor.advice import Diagnosis
    from tfperf.doctor.experiment import Section
    from tfperf.doctor.options import Finding
    from tfperf.measure.stats import Comparison

    def finding(section, ratio, pitfall):
        c = Comparison("a", "b", ratio, (ratio * 0.9, ratio * 1.1), FASTER, paired=True, units=6)
        return Finding(section, f"{section} row", "baseline", c, "code", "cost", pitfall=pitfall)

    measured = [finding("batch 1 latency", 3.0, False), finding("retracing: new batch sizes", 20.0, True)]
    d = Diagnosis(None, None, {}, {"measured": Section("measured", measured)})
    assert [a.section for a, _ in d.advice] == ["batch 1 latency"]
    assert [a.section for a, _ in d.pitfalls] == ["retracing: new batch sizes"]
    own = [measured[0], finding("retracing: new batch sizes", 20.0, False)]  # predict() retraced
    assert [a.section for a, _ in Diagnosis(None, None, {}, {"measured": Section("measured", own)}).advice] == [
        "retracing: new batch sizes", "batch 1 latency"]


def test_retracing_is_detected_where_it_happens_and_only_there():
    plain = tf.function(lambda x: x * 2)
    by_shape = [(tf.zeros([n, 3]),) for n in (1, 2, 3, 4)]
    assert count_traces(plain, by_shape) == 4 and retraces(tf.function(lambda x: x * 2), by_shape)
    signed = tf.function(lambda x: x * 2, input_signature=[tf.TensorSpec([None, 3])])
    assert count_traces(signed, by_shape) == 1 and not retraces(
        tf.function(lambda x: x * 2, input_signature=[tf.TensorSpec([None, 3])]), by_shape)
    same_shape = [(tf.zeros([2, 3]),)] * 4
    assert not retraces(tf.function(lambda x: x * 2), same_shape)
    scaled = lambda x, s: x * s  # noqa: E731
    assert retraces(tf.function(scaled), [(tf.zeros([2]), v) for v in (0.1, 0.2, 0.3)])
    assert not retraces(tf.function(scaled), [(tf.zeros([2]), tf.constant(v)) for v in (0.1, 0.2, 0.3)])


def test_the_retracing_table_counts_traces_of_a_model(tmp_path):
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    model.save(tmp_path / "m.keras")
    subject = load_subject(str(tmp_path / "m.keras"))
    from tfperf.records.jsonl import Recorder

    rec = Recorder("doctor", {})
    findings, _ = retracing(subject, rec, doctor.Options(**TINY))
    traces = {r["row"]: r["metrics"]["traces"] for r in rec.records}
    calls = len(TINY["trace_batches"])
    assert traces["tf.function, a new batch size each call"] == calls
    assert traces["input_signature with a None batch axis"] == 1 and traces["reduce_retracing=True"] <= 2
    assert traces["a Python float argument, a new value each call"] == calls
    assert traces["the same values as tf.constant"] == 1
    assert {f.section for f in findings} == {"retracing: new batch sizes", "retracing: Python numbers"}


def test_samples_feed_the_inputs_and_are_checked(tmp_path, factories):
    subject = load_subject(f"{factories}:text_model")
    sample = {"tokens": np.arange(36, dtype=np.int32).reshape(3, 12) % 40, "extra": np.ones((3, 3), np.float32)}
    x = make_inputs(subject, 5, sample=sample)
    assert x["tokens"].shape == (5, 12) and (x["tokens"][3] == sample["tokens"][0]).all()
    with pytest.raises(InputError, match="lacks extra"):
        make_inputs(subject, 2, sample={"tokens": sample["tokens"]})
    with pytest.raises(InputError, match=r"shape \[3, 5\]"):
        make_inputs(subject, 2, sample={**sample, "extra": np.ones((3, 5), np.float32)})


def run_cli(args, capsys):
    code = main(["doctor", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(capsys, args, match):
    code, _, err = run_cli(args, capsys)
    lines = [line for line in err.strip().splitlines() if line.startswith("tfperf doctor: error:")]
    assert code == 2 and len(lines) == 1 and match in lines[0], err[-2000:]
    assert "Traceback" not in err
    return lines[0]


def test_bad_input_is_one_line_with_exit_2(tmp_path, capsys, factories):
    (tmp_path / "notes.txt").write_text("hello")
    one_line_error(capsys, [tmp_path / "notes.txt"], "is not a model")
    one_line_error(capsys, [tmp_path / "missing.keras"], "no such file")
    one_line_error(capsys, ["nowhere"], "no such model")
    (tmp_path / "broken.keras").write_bytes(b"PK\x03\x04 not really a zip")
    one_line_error(capsys, [tmp_path / "broken.keras"], "is not a Keras file")
    (tmp_path / "empty").mkdir()
    one_line_error(capsys, [tmp_path / "empty"], "without saved_model.pb")

    @keras.saving.register_keras_serializable(package="doctor_test")
    class Doubler(keras.layers.Layer):
        def call(self, x):
            return x * 2

    inputs = keras.Input((4,))
    keras.Model(inputs, Doubler()(inputs)).save(tmp_path / "custom.keras")
    keras.saving.get_custom_objects().clear()  # a fresh process would not know Doubler
    one_line_error(capsys, [tmp_path / "custom.keras"], "module:factory")
    from test_deploy import unsafe_keras_file

    line = one_line_error(capsys, [unsafe_keras_file(tmp_path)], "safe mode")
    assert "'doubler'" in line and "--trust" in line

    inputs = keras.Input((None, 6))
    keras.Model(inputs, keras.layers.Dense(2)(inputs)).save(tmp_path / "ragged.keras")
    one_line_error(capsys, [tmp_path / "ragged.keras", "--input-shape", "7,7"], "declares")

    text = keras.Input((1,), dtype="string", name="text")
    keras.Model(text, keras.layers.StringLookup(vocabulary=["a", "b"])(text)).save(tmp_path / "text.keras")
    one_line_error(capsys, [tmp_path / "text.keras", "--quick"], "--sample")

    one_line_error(capsys, [f"{factories}:failing_model", "--quick"], "the model fails on these inputs")
    one_line_error(capsys, [f"{factories}:not_a_model"], "not a Keras model")
    one_line_error(capsys, [f"{factories}:missing"], "has no function")
    one_line_error(capsys, ["no_such_module_here:build"], "cannot import")
    one_line_error(capsys, [f"{factories}:text_model", "--train"], "needs --loss")
    one_line_error(capsys, [f"{factories}:text_model", "--quick", "--train", "--loss", "nonsense"], "unknown --loss")
    one_line_error(capsys, [f"{factories}:text_model", "--devices", "2"], "--devices 2 trains the model")
    one_line_error(capsys, [f"{factories}:text_model", "--devices", "1", "--loss", "mse"], "give 2 or more")
    (tmp_path / "bad.npz").write_bytes(b"not npz")
    one_line_error(capsys, [f"{factories}:text_model", "--sample", tmp_path / "bad.npz"], "cannot read")
    assert not (tmp_path / "doctor").exists()  # nothing written for input that was refused


def test_a_saved_model_that_reaches_risky_ops_is_refused_unless_trusted(tmp_path, capsys):
    class Writer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def __call__(self, x):
            tf.io.write_file(str(tmp_path / "pwned"), tf.strings.as_string(x[0, 0]))
            return {"y": x * 2}

    tf.saved_model.save(Writer(), str(tmp_path / "writer"))
    line = one_line_error(capsys, [tmp_path / "writer"], "WriteFile")
    assert "--trust" in line and not (tmp_path / "pwned").exists()
    assert load_subject(str(tmp_path / "writer"), trust=True).kind == "savedmodel"


@pytest.mark.slow
def test_the_command_writes_only_into_out_and_refuses_to_overwrite(tmp_path, capsys, tfperf_cli):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)], name="small")
    model.save(tmp_path / "small.keras")
    out = tmp_path / "runs" / "a"
    # The command as users run it, in its own process; the thread sweep runs too: its processes take turns
    # with this one's timers.
    began = time.perf_counter()
    proc = tfperf_cli("doctor", tmp_path / "small.keras", "--quick", "--batch-sizes", "8", "--no-confirm", "--out",
                      out, cwd=tmp_path)  # the confirmation's process: test_best_call, and test_install's doctor
    wall = time.perf_counter() - began
    assert "Doctor took" in proc.stdout and "goal for --quick" in proc.stdout
    # The time it says is the process's by the wall clock, its start-up included (issue 73: "took 90 s" of 141 s);
    # only the report's writing comes after it.
    said, start_up = (float(re.search(pattern, proc.stdout)[1]) for pattern in (r"Doctor took (\d+) s",
                                                                                 r"start-up (\d+) s"))
    assert 0 < start_up < said <= wall + 1 and said >= wall - max(15.0, 0.2 * wall), (said, wall)
    assert "doctor [" in proc.stderr and "threads at batch 8" in proc.stderr  # the progress bar
    assert sorted(p.name for p in out.iterdir()) == ["doctor.conclusion.md", "doctor.headline.json", "doctor.jsonl",
                                                     "figures", "report.html", "report.md", "traces"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "small.keras"]
    # The top-operations table it printed is XProf's own framework_op_stats of the trace it left in --out.
    from tfperf.measure.profiles import tool, trace_files

    lines = proc.stdout.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("**tf.function at batch 8**")))
    printed = [row.split(" | ")[:2] for row in lines[start + 4:] if row.startswith("| ")]
    printed = printed[:next((i for i, r in enumerate(printed) if r[0] == "| op type"), len(printed))]
    trace = next(line for line in lines[start:] if line.startswith("Trace: `")).split("`")[1]
    assert trace.startswith(str(out / "traces"))
    table = tool(trace_files(trace), "framework_op_stats")[0]
    ids = [c["id"] for c in table["cols"]]
    raw = sorted((dict(zip(ids, (c["v"] for c in row["c"]))) for row in table["rows"]),
                 key=lambda r: -r["total_self_time"])
    raw = [[f"| {r['type']}", r["operation"]] for r in raw if r["type"] != "IDLE"]
    if raw:
        assert printed and printed == raw[:len(printed)]
    else:  # TensorFlow's executor traced none of this small model's ops (it skips ops it judges cheap; seen in
        # about half the runs here): the doctor says so rather than print a table
        assert lines[start + 2] == "(no TensorFlow operation in this trace)"
    records = read_records(out / "doctor.jsonl")
    threads = [r for r in records if r["table"] == "threads at batch 8"]
    assert threads, next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("- threads"))
    assert threads[0]["row"] == "default threads" and len(threads) >= 2
    assert all(r["timing"]["rounds"] >= 6 for r in threads)
    # oneDNN off and OpenMP held to one thread, each in its process, with the cores each process kept busy.
    rows = {r["row"]: r["metrics"] for r in threads}
    assert {"oneDNN off (TF_ENABLE_ONEDNN_OPTS=0)", "OMP_NUM_THREADS=1", "intra 1, inter 1"} <= set(rows)
    assert all(0 < m["cores_used"] <= os.cpu_count() * 1.2 for m in rows.values())
    line = one_line_error(capsys, [tmp_path / "small.keras", "--out", out], "already holds a doctor run")
    assert "tfperf compare" in line
    assert main(["compare", str(out / "doctor.jsonl"), str(out / "doctor.jsonl")]) == 0
    assert "regressed" in capsys.readouterr().out
    assert json.loads((out / "doctor.jsonl").read_text().splitlines()[0])["args"]["model"].endswith("small.keras")


@pytest.mark.whole_machine  # its verdict is a share of the step spent waiting
def test_on_your_pipeline_the_doctor_says_whether_training_waits_for_data(pipelines, tmp_path):
    from tfperf.doctor.pipeline import VARIANTS_TABLE, load_data
    from tfperf.doctor.targets import training_loss

    subject = load_subject(f"{pipelines}:model")
    loss = training_loss("sparse_categorical_crossentropy", True)
    base = dict(TINY, batch_sizes=(1,), exported=False, train=True, loss="sparse_categorical_crossentropy",
                from_logits=True)
    slow = doctor.diagnose(subject, doctor.Options(**base, data=load_data(f"{pipelines}:slow", subject, loss, 64)),
                           tmp_path / "slow")
    check = slow.sections["input pipeline"].found
    assert check.timing_verdict == "input-bound" and check.share > 0.5 and check.ms_per_batch
    assert check.profiler is not None and check.profiler.input_bound and "input-bound" in check.profiler.conclusion
    assert "The two agree" in check.describe()
    # A measured input change is advised, ranked with the rest; the model-side training rows wait.
    advised = [a for a, _ in slow.advice if a.section == VARIANTS_TABLE]
    assert advised and advised[0].row == "+ cache, prefetch" and "cache()" in advised[0].code
    assert "training" in slow.skipped and "input pipeline" in slow.skipped["training"]
    summary = doctor.summary(slow)
    assert summary.index("waits for data") < summary.index("Advice") and "## Where the time goes" in summary
    traced = [p for p in slow.profiles if p.input is not None]
    assert traced and traced[0].input.input_share == check.profiler.input_share

    fast = doctor.diagnose(subject, doctor.Options(**base, data=load_data(f"{pipelines}:fast", subject, loss, 64)),
                           tmp_path / "fast")
    found = fast.sections["input pipeline"].found
    assert not found.input_bound and found.timing_verdict != "input-bound"
    assert not [a for a, _ in fast.advice if a.section == VARIANTS_TABLE] and "input pipeline variants" in fast.skipped
    records = check_structure(fast, tmp_path / "out", ["input pipeline: is training waiting for data?", "training"])
    assert {"plain fit (batch 16)", "steps_per_execution=16"} <= {r["row"] for r in records if r["table"] == "training"}


def test_a_pipeline_that_slows_down_is_seen_over_a_long_run_and_other_sources_of_its_examples_are_raced(
        pipelines, tmp_path):
    from tfperf.doctor.input_sources import (LONG_RUN_TABLE, SOURCES_TABLE, YOURS, LongRun, input_sources,
                                             long_run)
    from tfperf.doctor.pipeline import load_data
    from tfperf.doctor.targets import training_loss
    from tfperf.measure.stats import compare_times
    from tfperf.records.jsonl import Recorder

    subject = load_subject(f"{pipelines}:model")
    loss = training_loss("sparse_categorical_crossentropy", True)
    rec = Recorder(doctor.RECIPE, {})
    # A batch waits 1 ms more for every 0.1 s of the run: its last third is far slower than its first.
    crawl = long_run(f"{pipelines}:crawling", 2.0, rec)
    assert crawl.declined and crawl.comparison.ratio < 0.6 and "declines as it goes" in crawl.describe()
    # Rebuilt, the pipeline is fast again: its own state slowed it, not the machine.
    assert crawl.fresh.verdict == "faster" and "the pipeline's own state, not the machine" in crawl.describe()
    windows = [r["metrics"]["batches_per_s"] for r in rec.records if r["table"] == LONG_RUN_TABLE]
    assert len(windows) == 10 and windows[-1] < windows[1] and crawl.batches == sum(
        round(rate * crawl.seconds / 10) for rate in windows)
    steady = LongRun("m:f", 30.0, 900, ((3.0, 30.0),) * 10, compare_times([0.03] * 9, [0.03] * 9, threshold=0.1))
    assert not steady.declined and "No decline seen over a 30 s run" in steady.describe()
    drift = LongRun("m:f", 30.0, 900, ((3.0, 30.0),) * 10, compare_times([0.030] * 9, [0.032] * 9, threshold=0.1))
    assert not drift.declined and "slower, but not shown to pass the 10%" in drift.describe()  # 1.07x, not a decline
    # Issue 73: 'declines as it goes' (2.18x) on 16 batches of from_tensor_slices. A last third slower by far, where
    # a new pipeline read after it is as slow, is the machine slowing; and a handful of batches judges nothing.
    slowed = compare_times([0.03] * 9, [0.06] * 9, threshold=0.1)
    machine = LongRun("m:f", 30.0, 900, ((3.0, 30.0),) * 10, slowed, compare_times([0.06] * 9, [0.06] * 9))
    assert not machine.declined and "the machine slowed during the run" in machine.describe()
    few = LongRun("m:f", 30.0, 20, ((3.0, 0.7),) * 10, slowed, None, judged=18)
    assert not few.declined and "too few batches after the warm-up (18, fewer than 30)" in few.describe()
    # The same 64 examples from tensors, a Python generator and TFRecord files, against the user's generator.
    data = load_data(f"{pipelines}:generated", subject, loss, 64)
    findings, skipped, found = input_sources(data, rec, doctor.Options(**TINY), tmp_path / "sources")
    assert found is None and "--long-run 0" in skipped[LONG_RUN_TABLE]
    rows = {r["row"]: r for r in rec.records if r["table"] == SOURCES_TABLE}
    assert list(rows) == [YOURS, "from_tensor_slices (arrays in memory)", "from_generator (a Python generator)",
                          "TFRecord files, written once"]
    assert all(r["metrics"]["samples_per_s"] > 0 and r["n"] == 6 for r in rows.values())
    assert len(list((tmp_path / "sources").glob("*.tfrecord"))) == 4
    tensors = next(f for f in findings if f.row.startswith("from_tensor_slices"))
    # No Python per example: faster, by the race's own interval (how much faster is a benchmark's to say: a fresh
    # clone's run, beside the other worker's load, read 1.31x, CI 1.25-2.17x, where 15x was seen alone).
    assert tensors.comparison.verdict == "faster" and "from_tensor_slices" in tensors.code, \
        tensors.comparison.describe()


def test_bad_data_is_one_line_with_exit_2(pipelines, capsys):
    train = [f"{pipelines}:model", "--quick", "--train", "--loss", "sparse_categorical_crossentropy"]
    one_line_error(capsys, [*train, "--data", "no_such_module_here:load"], "cannot import")
    one_line_error(capsys, [*train, "--data", f"{pipelines}:a_list"], "not a tf.data.Dataset")
    one_line_error(capsys, [*train, "--data", f"{pipelines}:unbatched"], "batch them")
    one_line_error(capsys, [*train, "--data", f"{pipelines}:features_only"], "(inputs, targets)")
    one_line_error(capsys, [*train, "--data", f"{pipelines}:wrong_width"], "does not take the first batch")
    one_line_error(capsys, [f"{pipelines}:model", "--data", f"{pipelines}:fast"], "add --train")
    with pytest.raises(SystemExit) as refused:  # argparse refuses it, in one line
        main(["doctor", *train, "--memory-budget", "lots"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "is not a size" in err and len(err.strip().splitlines()) == 1


def check_fit(fit, budget):
    """A BatchFit found by trying: the largest batch fits the budget, a batch within `resolution` above it
    does not, and every try is listed in the order it was made."""
    from tfperf.doctor.profile import FITS, UNSEEN

    peaks = {b: (p, why) for b, p, why in fit.tries}
    assert fit.largest and peaks[fit.largest][1] in (FITS, UNSEEN)
    assert all(p is None or p <= budget for p, why in peaks.values() if why == FITS)
    over = [b for b, (p, why) in peaks.items() if why not in (FITS, UNSEEN)]
    assert over and min(b for b in over if b > fit.largest) - fit.largest <= fit.resolution
    assert [b for b, _, _ in fit.tries][:3] == [1, 2, 4]  # doubling first, then bisecting
    text = fit.describe()
    assert f"**{fit.largest}**" in text and "Found by trying" in text


MEMORY_BUDGETS = """
import dataclasses, json, sys
from pathlib import Path
import keras
from tfperf import doctor
from tfperf.deploy.loader import load_subject
from tfperf.doctor.memory import memory_budget

root = Path(sys.argv[1])
train = doctor.Options(memory_budget=40 * 2**20, train=True, loss="sparse_categorical_crossentropy", from_logits=True)
fits = [memory_budget(load_subject("cnn"), train, lambda step: None, root / "cnn")[2]]
keras.utils.set_random_seed(0)
keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10).save(root / "m.keras")
fits.append(memory_budget(load_subject(str(root / "m.keras")), doctor.Options(memory_budget=6 * 2**20),
                          lambda step: None, root / "mobilenet")[2])
print(json.dumps([dataclasses.asdict(fit) for fit in fits]))
"""


@pytest.mark.slow
def test_the_memory_budget_finds_the_largest_batch_by_trying(tmp_path):
    from tfperf.doctor.memory import memory_budget
    from tfperf.doctor.profile import BatchFit, host_allocator_visible

    if not host_allocator_visible(tmp_path / "probe"):  # oneDNN off, as on CPUs without AVX-512: it says so
        _, _, fit = memory_budget(load_subject("cnn"), doctor.Options(memory_budget=2**30), lambda step: None,
                                  tmp_path / "refused")
        assert fit.largest is None and fit.tries == () and "not measured" in fit.describe()
        assert "TF_ENABLE_ONEDNN_OPTS=1" in fit.describe()
    # The search, where the host allocator shows: a training step (the CNN) and an inference call (MobileNetV2).
    out = run([sys.executable, "-c", MEMORY_BUDGETS, tmp_path], env={"TF_ENABLE_ONEDNN_OPTS": "1"}).stdout
    fits = [BatchFit(**{**f, "tries": tuple(map(tuple, f["tries"]))}) for f in json.loads(out.splitlines()[-1])]
    for fit, budget in zip(fits, (40 * 2**20, 6 * 2**20)):
        check_fit(fit, budget)
        assert fit.place == "host" and fit.unmeasured is None
    assert fits[0].what.startswith("a training step") and fits[1].what.startswith("an inference call")
    # Peaks were read, not only guessed from the inputs: the largest batch that fits has a peak on record.
    assert all(dict((b, p) for b, p, _ in fit.tries)[fit.largest] for fit in fits)


def test_a_share_above_the_roof_is_named_a_defect_and_quick_measures_the_full_roof(monkeypatch):
    """Issue 32: MFU is a share of a limit; above 100% it is a defect of the FLOP count or of the roof, never a
    result; and --quick measures the same roof as the recipes (a 512 matmul alone stays far under it)."""
    from tfperf.doctor import facts as model

    facts = {"flops_per_example": 1e6, "matmul_flops_per_s": 1e11}
    assert model.mfu(5e4, facts) == {"mfu": 0.5}
    assert model.mfu(3e5, facts) == {"mfu": None, "mfu_note": model.ABOVE_THE_ROOF}
    assert model.mfu(1.0, {"flops_per_example": None, "matmul_flops_per_s": 1e11}) == {"mfu": None}
    sizes = []
    import tfperf.measure

    monkeypatch.setattr(tfperf.measure, "peak_matmul_flops_per_s", lambda *a, **k: sizes.append(a) or 1e11)
    model.model_facts(load_subject("mlp"), quick=True)
    assert sizes == [()]  # the default sizes, up to 2048, at --quick too


def test_the_thread_sweep_covers_counts_onednn_and_openmp_and_says_when_a_limit_did_not_take():
    from tfperf.doctor.threads import cores_text, thread_configs

    rows = [row for row, *_ in thread_configs(8)]
    assert rows[:2] == ["default threads", "intra 1, inter 1"]
    assert {"intra 2, inter 1", "intra 4, inter 1", "intra 8, inter 1", "intra 4, inter 2"} <= set(rows)
    assert [env for row, _, _, env in thread_configs(2) if env] == [{"TF_ENABLE_ONEDNN_OPTS": "0"},
                                                                    {"OMP_NUM_THREADS": "1"}]
    assert "did not take effect" in cores_text(1.9, 2.0, limits=True)
    assert "did not take effect" not in cores_text(1.0, 2.0, limits=True)
    assert "did not take effect" not in cores_text(1.9, 2.0, limits=False)


def test_a_thread_sweep_process_counts_its_memory_share_from_what_it_holds_with_tensorflow_imported(
        tmp_path, monkeypatch, capsys):
    """A small share (64 MB) on a process that holds far more with TensorFlow imported: it times the model and
    answers. Counted against all it held, this process ended itself, as the sweep's children did in CI ("the model
    took 838 MB of memory, past the 377 MB ceiling"); a process over its share ends with one line (test_hostile)."""
    import io

    from tfperf.doctor.threads import child
    from tfperf.measure.processes import replies

    keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)]).save(tmp_path / "small.keras")
    monkeypatch.setattr(sys, "stdin", io.StringIO("take batch 8 3\nquit\n"))
    assert child([str(tmp_path / "small.keras"), "--batch-sizes", "8", "--child-memory-limit", str(64 * 2**20)]) == 0
    ready, samples = replies(capsys.readouterr().out)
    assert ready["batch 8"]["items_per_call"] == 8 and len(samples) == 3 and min(samples) > 0


@pytest.mark.whole_machine  # it asks for both cores
def test_a_timer_server_reports_the_cores_its_process_kept_busy():
    """Two threads hashing in the child (hashlib lets go of the GIL on large buffers): its CPU time over the wall
    time of the samples is about 2 cores; a timer that sleeps keeps none busy."""
    import sys
    import textwrap

    from tfperf.measure import TimerServer

    child = textwrap.dedent("""
        import hashlib, threading, time
        from tfperf.measure import Timer, serve_timers

        block = bytes(1 << 20)

        def spin(seconds=0.05):
            end = time.perf_counter() + seconds
            def work():
                while time.perf_counter() < end:
                    hashlib.sha256(block).digest()
            helper = threading.Thread(target=work)
            helper.start()
            work()
            helper.join()

        serve_timers([Timer(spin, name="spin"), Timer(lambda: time.sleep(0.05), name="sleep")])
    """)
    with TimerServer([sys.executable, "-c", child]) as server:
        server.timer("spin").take(6)
        server.timer("sleep").take(6)
        spinning, sleeping = server.cores_used("spin"), server.cores_used("sleep")
    assert 1.3 < spinning <= 2.2 and sleeping < 0.3, (spinning, sleeping)


def test_the_timing_and_the_profiler_are_said_to_agree_only_when_both_decided_the_same():
    """Issue 73: "The two agree" was printed where the timing said undecided (59% waiting, 95% CI 4-74%)."""
    from tfperf.doctor.pipeline import PIPELINE_ALONE, STEP_ALONE, YOURS, InputCheck
    from tfperf.measure.profiles import InputAnalysis

    bound = InputAnalysis(10.0, 6.0, 4.0, 0.0, "HIGHLY input-bound", None, 4, (0.6, 0.6, 0.6, 0.6))
    ms = {YOURS: 10.0, STEP_ALONE: 4.0, PIPELINE_ALONE: 9.0}
    said = {interval: InputCheck("p:data", 0.59, interval, ms, bound).describe()
            for interval in [(0.5, 0.7), (0.04, 0.74), (0.01, 0.05)]}
    assert "**input-bound**" in said[(0.5, 0.7)] and "The two agree." in said[(0.5, 0.7)]
    assert "**undecided**" in said[(0.04, 0.74)] and "The timing cannot say" in said[(0.04, 0.74)]
    assert "agree" not in said[(0.04, 0.74)]
    assert "**not input-bound**" in said[(0.01, 0.05)] and "The two disagree" in said[(0.01, 0.05)]


def test_the_profilers_verdict_is_the_median_steps_and_an_epochs_first_step_is_said_apart():
    """CI: a cached, prefetched pipeline read input-bound where its first step (0.7 waiting, the pipeline starting)
    moved XProf's average over four steps; the three after it waited 3%."""
    from tfperf.doctor.pipeline import PIPELINE_ALONE, STEP_ALONE, YOURS, InputCheck
    from tfperf.measure.profiles import InputAnalysis

    started = InputAnalysis(28.5, 15.3, 13.2, 0.0, "Your program is HIGHLY input-bound", None, 4,
                            (0.7, 0.03, 0.03, 0.027), (6.5, 2.4, 2.5, 2.5))
    assert started.input_share > 0.5 and started.median_input_share < 0.05 and not started.input_bound
    said = InputCheck("p:fast", 0.35, (0.08, 0.7), {YOURS: 4.0, STEP_ALONE: 2.6, PIPELINE_ALONE: 0.5},
                      started).describe()
    assert ("the median step 3% waiting for input (not input-bound; 54% averaged over its 4 steps, the first "
            "waiting 70% while the pipeline starts)") in said
    stalled = InputAnalysis(28.5, 15.3, 13.2, 0.0, "HIGHLY", None, 4, (0.03, 0.7, 0.03, 0.027))
    assert "a few steps waiting far longer than the median" in InputCheck(
        "p:fast", 0.35, (0.08, 0.7), {YOURS: 4.0, STEP_ALONE: 2.6, PIPELINE_ALONE: 0.5}, stalled).describe()
    waiting = InputAnalysis(25.0, 20.0, 5.0, 0.0, "HIGHLY", None, 4, (0.8, 0.8, 0.8, 0.8))
    assert waiting.input_bound and "averaged" not in InputCheck("p:slow", 0.8, (0.7, 0.9), {
        YOURS: 25.0, STEP_ALONE: 5.0, PIPELINE_ALONE: 20.0}, waiting).describe()


def test_a_row_that_disagrees_without_a_note_says_so_and_no_sentence_dangles():
    """Issue 73: "...; and " ended a line where a row disagreed and had no note."""
    from types import SimpleNamespace

    from tfperf.doctor import Diagnosis, Section
    from tfperf.doctor.options import Finding
    from tfperf.measure.stats import Comparison

    faster = Comparison("a", "b", 3.0, (2.7, 3.3), FASTER, paired=True, units=6)
    off = Finding("batch 1 latency", "LiteRT interpreter", "predict()", faster, "", "", agrees=False)
    facts = {"kind": "keras", "inputs": [], "outputs": [], "matmul_flops_per_s": 1e9}
    text = doctor.summary(Diagnosis(SimpleNamespace(source="m.keras"), None, facts, {"inference": Section("inference",
                                                                                                            [off])}))
    line = next(line for line in text.splitlines() if line.startswith("- LiteRT interpreter against predict()"))
    assert line.endswith("; and its answers or loss disagree")
    # A note after "Costs: ...." begins a sentence: capitalised where it is a word, left alone where it is code.
    from tfperf.doctor.advice import sentence

    noted = Finding("retracing", "input_signature", "tf.function", faster, "code", "none",
                    note="your model's predict() traced 0 times in 7 calls")
    text = doctor.summary(Diagnosis(SimpleNamespace(source="m.keras"), None, facts, {"retracing": Section(
        "retracing", [noted])}))
    assert "Costs: none. Your model's predict() traced 0 times in 7 calls." in text
    assert sentence("tf.function traced 6 times") == "tf.function traced 6 times" and sentence("") == ""


def test_the_time_a_run_took_is_judged_against_the_goal_the_user_set():
    """--quick's goal is 3 minutes; a --budget given is the user's own (MobileNetV2 with --quick --budget 420 read
    "goal for --quick: under 180 s: NOT met")."""
    from types import SimpleNamespace

    from tfperf.doctor import Diagnosis

    facts = {"kind": "keras", "inputs": [], "outputs": [], "matmul_flops_per_s": 1e9}
    d = Diagnosis(SimpleNamespace(source="m.keras"), None, facts, {}, elapsed_s=462.0)
    assert "Doctor took 462 s (goal for --budget 420: under 420 s: NOT met)" in doctor.summary(d, goal=(420.0,
                                                                                                     "--budget 420"))
    d.elapsed_s = 155.0
    assert "Doctor took 155 s (goal for --quick: under 180 s: met)" in doctor.summary(d, goal=(180.0, "--quick"))
    assert "goal" not in doctor.summary(d).split("Doctor took", 1)[1]


def test_what_a_flag_asked_for_runs_first_is_never_cut_and_the_default_ones_get_what_is_left(tmp_path,
                                                                                              monkeypatch):
    """Issue 73: four opt-in flags spent --quick's budget and retracing, a default experiment, was skipped; issue 71:
    the default experiments ran first and the answer --train asked for ended a --quick run at 295 s. On a clock the
    experiments move: what a flag asked for runs first, whatever the budget; the default ones then run while the
    budget lasts, and the first past it is skipped, saying why. Without an asked one the sentence does not name it."""
    from types import SimpleNamespace

    from tfperf.doctor import registry
    from tfperf.doctor import run as run_module
    from tfperf.doctor.experiment import Experiment, Section

    clock = [0.0]
    monkeypatch.setattr(run_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    seen: list[float | None] = []

    def taking(name: str, seconds: float, budgeted: bool = True) -> Experiment:
        def run(ctx):
            seen.append(ctx.ends_by)
            clock[0] += seconds
            return Section(name)
        return Experiment(name, "?", run, budgeted=budgeted)

    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="tiny").save(tmp_path / "m.keras")
    subject = load_subject(str(tmp_path / "m.keras"))
    options = doctor.Options(**{**TINY, "budget_s": 150.0, "profile": False})
    monkeypatch.setattr(registry, "EXPERIMENTS", (taking("default", 10), taking("asked by a flag", 100, False),
                                                  taking("retracing", 5), taking("long default", 60),
                                                  taking("last default", 1), taking("asked too", 20, False)))
    d = doctor.diagnose(subject, options, tmp_path / "work")
    assert list(d.took_s)[1:] == ["asked by a flag", "asked too", "default", "retracing", "long default"]
    assert d.skipped == {"last default": "not run: the --budget of 150 s was spent (195 s, 120 s of it by what the "
                                         "flags asked for, which runs first and is never cut)"}
    assert seen[0] == 150.0  # the clock read 0 when the run began: the budget ends 150 s on

    seen.clear()
    monkeypatch.setattr(registry, "EXPERIMENTS", (taking("default", 200), taking("next", 1)))
    d = doctor.diagnose(subject, options, tmp_path / "work2")
    assert d.skipped == {"next": "not run: the --budget of 150 s was spent (200 s)"}
    options = doctor.Options(**{**TINY, "budget_s": None, "profile": False})
    doctor.diagnose(subject, options, tmp_path / "work3")
    assert seen[-1] is None


def test_a_stopped_doctor_reports_what_it_measured_marked_partial_and_exits_143(tmp_path, monkeypatch):
    """Issue 73: SIGTERM removed the doctor's whole --out. Stopped mid-experiment (the SIGTERM handler raises
    flags.Stopped; Ctrl-C, KeyboardInterrupt), the run keeps the rows measured so far, names the experiments it did
    not reach, writes the report marked PARTIAL and ends 143 (130 for Ctrl-C)."""
    from tfperf import flags
    from tfperf.cli import main
    from tfperf.doctor import registry
    from tfperf.doctor.experiment import Experiment, Section

    def measuring(ctx):
        ctx.recorder.add("first table", "a row", {"ms": 2.0}, primary="ms", lower_is_better=True)
        return Section("first")

    def stopping(how):
        def run(ctx):
            ctx.recorder.add("second table", "measured before the signal", {"ms": 3.0}, primary="ms", lower_is_better=True)
            raise how()
        return run

    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="tiny").save(tmp_path / "m.keras")
    for how, code in ((flags.Stopped, 143), (KeyboardInterrupt, 130)):
        never = []
        monkeypatch.setattr(registry, "EXPERIMENTS", (
            Experiment("first", "?", measuring), Experiment("second", "?", stopping(how)),
            Experiment("third", "?", lambda ctx: never.append(1) or Section("third"))))
        out = tmp_path / f"out{code}"
        assert main(["doctor", str(tmp_path / "m.keras"), "--quick", "--no-profile", "--out", str(out)]) == code
        said = "SIGTERM" if code == 143 else "Ctrl-C"
        report = (out / "report.md").read_text()
        assert f"PARTIAL: stopped by {said} during second" in report and never == []
        assert f"PARTIAL (stopped by {said} during second)" in report.split("## ")[1]  # the first screen
        assert "| measured before the signal |" in report and "| a row |" in report
        assert f"third: not run: stopped by {said} during second" in report
        assert f"second: not finished: stopped by {said} during second" in report
        assert {r["row"] for r in read_records(out / "doctor.jsonl")} >= {"a row", "measured before the signal"}


def test_a_child_that_refused_is_said_by_its_refusal_not_the_log_lines_before_it():
    """CI: the thread sweep failed as "ChildError: python exited with 2: I0000 ... oneDNN custom operations are
    on...": the child's one-line refusal (exit 2) was among its last lines, after TensorFlow's log."""
    from tfperf.doctor.run import failure
    from tfperf.measure.processes import ChildError

    said = failure(ChildError("python exited with 2: I0000 port.cc:153] oneDNN custom operations are on. | "
                              "tfperf doctor: error: the model took 800 MB past the 640 MB ceiling"))
    assert said == "ChildError: tfperf doctor: error: the model took 800 MB past the 640 MB ceiling"
    assert failure(ChildError("python exited with 1: x | ValueError: bad shape")) == "ValueError: bad shape"
