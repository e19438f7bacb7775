"""Why a switch did not help, proved on models made to fail it for a known reason: a layer XLA cannot compile (named
by the bisection, the rest compiled and timed), and a mixed policy that did not take effect."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfperf.deploy.loader import keras_subject
from tfperf.doctor import summary
from tfperf.doctor.advice import Diagnosis
from tfperf.doctor.inference import XLA_ROW, inference
from tfperf.doctor.options import Options
from tfperf.doctor.xla import bisect, compiled_around
from tfperf.measure.stats import FASTER, NO_DIFFERENCE, SLOWER
from tfperf.records.jsonl import Recorder

TINY = Options(batch_sizes=(1, 4), rounds=6, min_time_s=0.01, threads=False, exported=False)


class ToText(keras.layers.Layer):
    """Rounds its input through text: tf.strings.as_string has no XLA kernel."""

    def call(self, x):
        return tf.strings.to_number(tf.strings.as_string(x, precision=9))


def with_text_layer(inner: bool = False) -> keras.Model:
    """Dense, the text layer, Dense; with `inner`, the text layer sits in a model inside the model."""
    inputs = keras.Input((6,), name="features")
    h = keras.layers.Dense(8, activation="relu", name="dense_in")(inputs)
    if inner:
        block_in = keras.Input((8,))
        block = keras.Model(block_in, keras.layers.Dense(8, name="inside")(ToText(name="to_text")(block_in)),
                            name="block")
        h = block(h)
    else:
        h = ToText(name="to_text")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="dense_out")(h), name="texty")


def test_xla_failure_names_the_layer_and_times_the_rest_compiled(tmp_path):
    keras.utils.set_random_seed(0)
    subject = keras_subject(with_text_layer(), "texty", factory=None)
    rec = Recorder("doctor", {})
    findings, skipped, failure = inference(subject, rec, TINY, tmp_path, lambda step: None, {"matmul_flops_per_s": 1e9})
    # Every variant tried is in the report: the XLA row with its reason at each batch size.
    for batch in TINY.batch_sizes:
        assert "AsString has no XLA kernel" in skipped[f"{XLA_ROW} at batch {batch}"]
    assert failure.bisection.failing == ["to_text"] and failure.bisection.complete
    assert failure.bisection.refusals[0].kinds == ("ToText",)
    assert "test_switches.py" in failure.reason  # where in the user's code the op was made
    row = "jit_compile=True around to_text"
    assert failure.row == row
    for table in ("batch 1 latency", "throughput at batch 4"):
        got = {r["row"]: r["metrics"] for r in rec.table(table)}
        assert got[row]["max_relative_diff"] <= got[row]["tolerance"]
    xla = [f for f in findings if f.row == row and f.section.startswith("XLA")]
    assert [f.section for f in xla] == ["XLA at batch 1", "XLA at batch 4"]
    assert all(f.baseline == "tf.function" and f.comparison.verdict in (FASTER, SLOWER, NO_DIFFERENCE) for f in xla)
    text = summary(Diagnosis(subject, rec, findings, skipped, {"kind": "keras", "inputs": [], "outputs": [],
                                                               "matmul_flops_per_s": 1e9}, xla=failure))
    assert "## When XLA fails" in text and "layer `to_text` (ToText)" in text and "compiled_around(model" in text


def test_bisection_reaches_into_a_model_inside_the_model_and_compiles_around_it():
    model = with_text_layer(inner=True)
    x = tf.random.normal((3, 6), seed=1)
    found = bisect(model, x)
    assert found.failing == ["block/to_text"] and found.layers == 5  # 3 outer calls, 2 inside the block
    around = compiled_around(model, found.failing)
    np.testing.assert_allclose(around(x), model(x), rtol=1e-5, atol=1e-6)
    # A model that compiles: nothing named, one compile.
    fine = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    clean = bisect(fine, x)
    assert clean.refusals == () and clean.compiles == 1


def test_a_model_without_a_graph_is_said_so():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model(tf.zeros((1, 6)))
    assert bisect(model, tf.zeros((1, 6))) is None
    with pytest.raises(ValueError, match="no functional graph"):
        compiled_around(model, ["dense"])
