"""The doctor's answers to the user's own questions, each proved on a model whose answer is known: `--shapes` (the
first call at new sizes, traces and XLA compiles counted from TensorFlow, on a CNN with free height and width and a
Transformer with a free length), `--load-time` (each form cold-started in fresh processes) and `--keras-stacks` (the
model under each Keras, the training step split into its parts)."""

import keras
import numpy as np
import pytest

from tfperf.doctor.options import Options
from tfperf.doctor.shapes import (BUCKETS, PLAIN, RELAXED, SIGNATURE, axis_sizes, cut_back, pad_to, shapes,
                                  signature_text)
from tfperf.records.jsonl import Recorder

pytestmark = pytest.mark.slow


def cnn() -> keras.Model:
    """Free height and width, pooled: padding an image changes what the average sees."""
    inputs = keras.Input((None, None, 3), name="image")
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def transformer() -> keras.Model:
    """Token ids of any length through an embedding and one attention block, an answer per position."""
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(50, 8)(ids)
    x = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(x, x)
    return keras.Model(ids, keras.layers.Dense(2)(x))


def diagnosed(model: keras.Model, tmp_path, axes: str = "all"):
    from tfperf.deploy.loader import load_subject

    keras.utils.set_random_seed(0)
    path = tmp_path / "model.keras"
    model.save(path)
    subject = load_subject(str(path))
    rec = Recorder("doctor", {})
    findings, skipped, found = shapes(subject, rec, Options(shape_axes=axes), lambda step: None)
    assert not skipped, skipped
    return subject, rec, findings, found


def rows(rec: Recorder, table: str) -> dict:
    return {r["row"]: r["metrics"] for r in rec.table(table)}


def test_new_batch_sizes_and_image_sizes_are_counted_per_way_and_the_fixes_measured(tmp_path):
    subject, rec, findings, found = diagnosed(cnn(), tmp_path)
    assert [axis for axis, _, _ in found.axes] == ["batch", "height and width"]
    for table in ("new shapes: batch", "new shapes: height and width"):
        got = rows(rec, table)
        # Known counts: a plain tf.function traces once per new shape, XLA compiles once per new shape; a None axis
        # in the signature traces none; the restored signature is a concrete function; two buckets, two compiles.
        assert (got[PLAIN]["traces"], got[PLAIN]["compiles"]) == (6, 0)
        assert (got["tf.function, jit_compile=True"]["traces"], got["tf.function, jit_compile=True"]["compiles"]) == (6, 6)
        assert (got[SIGNATURE]["traces"], got[SIGNATURE]["compiles"]) == (0, 0)
        assert got[RELAXED]["traces"] <= 1 and got[RELAXED]["compiles"] == 0
        assert (got["SavedModel, tf.saved_model.load"]["traces"], got["SavedModel, tf.saved_model.load"]["compiles"]) == (0, 0)
        assert (got[BUCKETS]["traces"], got[BUCKETS]["compiles"]) == (0, 2)
        assert got["predict(), compile(jit_compile=True)"]["compiles"] == 6 and got["predict()"]["compiles"] == 0
        assert all(m["first_call_ms"] > 0 and m["steady_ms"] > 0 and m["new_sizes"] == 6 for m in got.values())
    by_row = {(f.section, f.row): f for f in findings}
    # Padded rows cut back are the same answers; padded pixels are not (the average sees the zeros).
    assert by_row[("new shapes: batch", BUCKETS)].agrees
    assert not by_row[("new shapes: height and width", BUCKETS)].agrees
    assert "padding changes this model's answers" in by_row[("new shapes: height and width", BUCKETS)].note
    signed = by_row[("new shapes: height and width", SIGNATURE)]
    assert signed.baseline == PLAIN and signed.comparison.statistic == "mean" and signed.comparison.paired
    assert "tf.TensorSpec([None, None, None, 3], tf.float32)" in signed.code
    assert "6 traces" in found.describe() and "6 XLA compiles" in found.describe()
    # Asked by --shapes, its answer opens the report: predict() traces once, so it does not pay for new sizes.
    said = found.answer(findings)
    assert said.startswith("**New shapes** (what --shapes asked") and "your own call: predict(): 1 trace" in said
    assert "It does not pay for new sizes; called through tf.function, it does, and **" in said


def test_a_transformers_new_lengths_are_counted_and_padding_with_a_mask_free_model_is_checked(tmp_path):
    # Its length only (--shape-axes free): the batch axis is the CNN's test's, and would double this one's time.
    subject, rec, findings, found = diagnosed(transformer(), tmp_path, axes="free")
    assert [axis for axis, _, _ in found.axes] == ["sequence length"]
    got = rows(rec, "new shapes: sequence length")
    assert (got[PLAIN]["traces"], got["tf.function, jit_compile=True"]["compiles"], got[BUCKETS]["compiles"]) == (6, 6, 2)
    assert got[SIGNATURE]["traces"] == 0
    # Attention without a mask sees the padded positions: the bucketed answers differ, and the doctor says so.
    assert got[BUCKETS]["answers_differ_by"] > 1e-4
    assert signature_text(subject) == "[tf.TensorSpec([None, None], tf.int32)]"


def test_the_shapes_answer_says_whether_your_own_call_pays_and_the_fix_measured_fastest():
    """Issue 73: asked --shapes, the report opened with the best way to call and the answer sat under Pitfalls. Each
    branch: your call pays (the fix in the advice), it does not (the fix for a tf.function), no fix faster."""
    from tfperf.doctor.shapes import ShapesFound, Way
    from tfperf.measure import Measurement, versus

    def way(row: str, traces: int, first_s: float) -> Way:
        first = Measurement(f"{row}, first", tuple(first_s * (1 + k / 100) for k in range(6)), rounds=6)
        steady = Measurement(f"{row}, seen", tuple(0.001 * (1 + k / 100) for k in range(6)), rounds=6)
        return Way(row, traces, 0, first, steady, versus(steady, first, statistic="mean"))

    def fix(baseline: Way, fixed: Way, pitfall: bool):
        from tfperf.doctor.options import Finding

        return Finding("new shapes: sequence length", fixed.row, baseline.row,
                       versus(baseline.first, fixed.first, threshold=0.02, statistic="mean"), "code", "", pitfall=pitfall)

    plain, signed = way(PLAIN, 6, 0.25), way(SIGNATURE, 0, 0.002)
    calm = ShapesFound((("sequence length", tuple(range(36, 60, 4)), (way("predict()", 1, 0.002), plain, signed)),))
    said = calm.answer([fix(plain, signed, pitfall=True)])
    assert "6 new sequence lengths (36-56), your own call: predict(): 1 trace, 0 XLA compiles" in said
    assert f"It does not pay for new sizes; called through {PLAIN}, it does, and **{SIGNATURE}** fixes that" in said
    paying = ShapesFound((("sequence length", tuple(range(36, 60, 4)), (way("predict()", 6, 0.25), plain, signed)),))
    said = paying.answer([fix(plain, signed, pitfall=False)])
    assert f"It pays for new sizes: **{SIGNATURE}** fixes it, its first calls " in said and "(in the advice)" in said
    assert "none of the fixes measured was faster" in paying.answer([fix(signed, plain, pitfall=False)])
    assert ShapesFound(()).answer([]) == ""


def test_shape_axes_choose_the_batch_or_the_models_free_axes_and_a_model_without_one_is_told():
    from tfperf.deploy.loader import InputSpec

    class Spec:
        inputs = (InputSpec("image", "float32", (4, 4, 3), (None, None, 3)),)
        free, free_axes = True, "height and width"

    class Fixed(Spec):
        inputs = (InputSpec("x", "float32", (6,), (6,)),)
        free = False

    assert list(axis_sizes(Spec)) == ["batch", "height and width"] and list(axis_sizes(Spec, "batch")) == ["batch"]
    assert axis_sizes(Spec, "free")["height and width"] == (4, [4 + k for k in range(1, 7)])  # a step of 4 // 8 -> 1
    assert axis_sizes(Fixed, "free") == {}
    findings, skipped, found = shapes(Fixed, Recorder("doctor", {}), Options(shape_axes="free"), lambda step: None)
    assert (findings, found) == ([], None) and "leaves no axis free but the batch" in skipped["new shapes"]


def test_padding_goes_on_the_axis_that_varies_and_the_answer_is_cut_back():
    from tfperf.deploy.loader import InputSpec

    class Spec:
        inputs = (InputSpec("image", "float32", (4, 4, 3), (None, None, 3)),)

    flat = {"image": np.ones((2, 4, 4, 3), np.float32)}
    assert pad_to(flat, Spec, "batch", 5)["image"].shape == (5, 4, 4, 3)
    wide = pad_to(flat, Spec, "height and width", 6)["image"]
    assert wide.shape == (2, 6, 6, 3) and wide[:, 4:].sum() == 0 and wide[:, :4, :4].sum() == 2 * 4 * 4 * 3
    back = cut_back({"y": np.arange(10).reshape(5, 2)}, {"y": np.zeros((3, 2))})
    assert back["y"].tolist() == [[0, 1], [2, 3], [4, 5]]


CUSTOM = '''
import keras


@keras.saving.register_keras_serializable(package="user")
class Doubled(keras.layers.Layer):
    def call(self, x):
        return 2.0 * x


def build():
    inputs = keras.Input((6,), name="features")
    return keras.Model(inputs, keras.layers.Dense(2)(Doubled()(inputs)))
'''


def test_load_time_cold_starts_each_form_in_fresh_processes_with_the_users_module(tmp_path, monkeypatch):
    """`--load-time` on a module:factory model with a custom layer: each form is loaded in a fresh process that
    imports the user's module first (its layer registers there), and import, load and first call are timed apart."""
    from tfperf.deploy.loader import load_subject
    from tfperf.doctor.loading import FORMS, load_times

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "usermodel.py").write_text(CUSTOM)
    subject = load_subject("usermodel:build")
    forms = {k: v for k, v in FORMS.items() if k.startswith((".keras", "ONNX"))}
    rec = Recorder("doctor", {})
    findings, skipped, found = load_times(subject, rec, Options(), tmp_path / "work", lambda step: None, runs=1,
                                          forms=forms)
    assert not skipped, skipped
    got = {r["row"]: r["metrics"] for r in rec.table("load time")}
    assert set(got) == set(forms)
    keras_file = got[".keras file, keras.saving.load_model"]
    # The .keras form imports TensorFlow in its process; ONNX Runtime's does not.
    assert keras_file["import_s"] > got["ONNX Runtime, InferenceSession"]["import_s"]
    assert all(m["load_s"] > 0 and m["first_call_ms"] > 0 and m["runs"] == 1 for m in got.values())
    assert [f.baseline for f in findings] == [".keras file, keras.saving.load_model"]  # the form it was given in
    assert "too few to judge" in findings[0].comparison.describe()  # 1 round: no verdict claimed
    assert "ONNX Runtime, InferenceSession:" in found.describe()


FACTORY = '''
import keras


def build():
    inputs = keras.Input((6,), name="features")
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(inputs)))
'''
STACKS_OPTIONS = dict(rounds=6, min_time_s=0.01, max_extensions=0, train_examples=64, loss="mean_squared_error")


def test_keras_stacks_on_a_factory_build_under_each_keras_with_the_step_split(tmp_path, monkeypatch):
    """module:factory: the user's `import keras` builds under each stack (Keras 2 too); every figure is judged
    against Keras 2's, and the step's four parts are raced on their own."""
    from tfperf.deploy.loader import load_subject
    from tfperf.doctor.keras_stacks import PARTS, keras_stacks

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "stackmodel.py").write_text(FACTORY)
    subject = load_subject("stackmodel:build")
    rec = Recorder("doctor", {})
    findings, skipped, found = keras_stacks(subject, rec, Options(**STACKS_OPTIONS), tmp_path / "work",
                                            lambda step: None)
    assert not skipped, skipped
    assert found.stacks == ("Keras 2 (tf_keras)", "Keras 3, TensorFlow", "Keras 3, JAX")
    for part in PARTS:
        rows = [r["row"] for r in rec.table(f"keras stacks: {part}")]
        assert rows == list(found.stacks) and all(r["metrics"]["ms"] > 0 for r in rec.table(f"keras stacks: {part}"))
    assert {(f.row, f.baseline) for f in findings} == {("Keras 3, TensorFlow", "Keras 2 (tf_keras)"),
                                                      ("Keras 3, JAX", "Keras 2 (tf_keras)")}
    assert found.facts["Keras 3, JAX"]["jit_compile"] is True and found.facts["Keras 2 (tf_keras)"]["device"] == "cpu"
    assert "optimizer update" in found.describe() and "first epoch" in found.describe()


def test_keras_stacks_on_a_file_say_in_one_line_that_keras_2_cannot_read_it(tmp_path):
    """A .keras file written by Keras 3: Keras 2's loader cannot read it, said in one line; the two Keras 3 backends
    are still compared, Keras 3 on TensorFlow the baseline."""
    from tfperf.deploy.loader import load_subject
    from tfperf.doctor.keras_stacks import keras_stacks

    keras.Sequential([keras.Input((6,), name="features"), keras.layers.Dense(3)]).save(tmp_path / "m.keras")
    subject = load_subject(str(tmp_path / "m.keras"))
    rec = Recorder("doctor", {})
    findings, skipped, found = keras_stacks(subject, rec, Options(**STACKS_OPTIONS), tmp_path / "work",
                                            lambda step: None)
    why = skipped["keras stacks: Keras 2 (tf_keras)"]
    assert why.startswith("TypeError") and "\n" not in why
    assert found.stacks == ("Keras 3, TensorFlow", "Keras 3, JAX") and found.baseline == "Keras 3, TensorFlow"
    assert [f.row for f in findings] == ["Keras 3, JAX"] and "not measured" in found.describe()


def test_the_new_questions_refuse_what_they_cannot_answer_in_one_line(tmp_path, capsys):
    """--keras-stacks trains: without --loss it is one line, exit 2, and nothing is written."""
    from tfperf.cli import main

    keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).save(tmp_path / "m.keras")
    assert main(["doctor", str(tmp_path / "m.keras"), "--keras-stacks", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tfperf doctor: error: --keras-stacks trains the model") and "\n" not in err
    assert not (tmp_path / "out").exists()
