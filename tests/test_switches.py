"""Why a switch did not help, proved on models made to fail it for a known reason: a layer XLA cannot compile (named
by the bisection, the rest compiled and timed), and a mixed policy that did not take effect."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfperf.deploy.loader import keras_subject
from tfperf.doctor import summary
from tfperf.doctor.advice import Diagnosis
from tfperf.doctor.experiment import Context
from tfperf.doctor.inference import XLA_ROW
from tfperf.doctor.inference import run as inference_section
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
    section = inference_section(Context(subject, rec, TINY, tmp_path, tmp_path / "traces", tmp_path,
                                        facts={"matmul_flops_per_s": 1e9}))
    findings, skipped, failure = section.findings, section.skipped, section.found.failure
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
    text = summary(Diagnosis(subject, rec, {"kind": "keras", "inputs": [], "outputs": [], "matmul_flops_per_s": 1e9},
                             {section.name: section}))
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


class CastHeavy(keras.layers.Layer):
    """Adds zero twenty times, casting to float32 and back each time: casts only under a mixed policy (a cast to the
    dtype a tensor already has is no op)."""

    def call(self, x):
        for _ in range(20):
            x = tf.cast(tf.cast(x, tf.float32) + 0.0, self.compute_dtype)
        return x


class Float32Matmul(keras.layers.Layer):
    """A layer that casts its inputs and weights to float32 before its matmul, whatever the policy."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], 4))

    def call(self, x):
        return tf.matmul(tf.cast(x, tf.float32), tf.cast(self.w, tf.float32))


def cast_heavy_cnn(side: int = 48) -> keras.Model:
    inputs = keras.Input((side, side, 3), name="image")
    x = keras.layers.Conv2D(16, 3, padding="same", name="conv")(inputs)
    x = CastHeavy(name="cast_heavy")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(x))


def test_a_policy_set_after_the_model_was_built_did_not_take_effect_and_float32_layers_are_named():
    from tfperf.doctor.effect import policy_effect
    from tfperf.precision import dtype_policy

    x = tf.zeros((2, 48, 48, 3))
    model = cast_heavy_cnn()
    with dtype_policy("mixed_bfloat16"):  # as a user's set_global_policy after building
        late = policy_effect(model, x)
        assert late.took_effect is False and late.low_layers == []
        assert "did not take effect" in late.describe() and "set after the model was built" in late.describe()
        inputs = keras.Input((6,))
        mixed = keras.Model(inputs, keras.layers.Dense(3, name="head", dtype="float32")(
            Float32Matmul(name="f32")(keras.layers.Dense(8, name="hidden")(inputs))))
    found = policy_effect(mixed, tf.zeros((2, 6)))
    assert found.took_effect and sorted(found.low_layers) == ["f32", "hidden"] and found.outputs == ("head",)
    assert {(op.layer, op.dtype) for op in found.ops} == {("hidden", "bfloat16"), ("f32", "float32"),
                                                          ("head", "float32")}
    assert "Still float32 there: `f32`" in found.describe() and "(`head`) stay float32" in found.describe()
    assert policy_effect(model, x).took_effect is None  # no mixed policy anywhere: nothing to say


def test_kernel_by_kernel_the_casts_a_policy_added_are_named_with_their_layer(tmp_path):
    from tfperf.doctor.kernels import kernel_diff
    from tfperf.measure import Timer
    from tfperf.precision import dtype_policy

    x = tf.random.normal((8, 48, 48, 3), seed=2)
    plain = cast_heavy_cnn()
    with dtype_policy("mixed_bfloat16"):
        mixed = cast_heavy_cnn()
    timers = []
    for name, model in (("float32", plain), ("mixed_bfloat16", mixed)):
        call = tf.function(lambda x, model=model: model(x, training=False))
        timers.append(Timer(lambda call=call: call(x), name=name))
        timers[-1].start(warmup=1)
    diff = kernel_diff(*timers, [layer.name for layer in plain.layers], tmp_path, calls=3,
                       hint="This CPU's bfloat16 arithmetic: (a hint).")
    top = diff.slower[0]  # the most time added: the twenty round trips through float32
    assert (top.layer, top.type, top.plain_s, top.comparison) == ("cast_heavy", "Cast", 0.0, None)
    assert top.variant_s > 0 and all(g.comparison.units == 6 for g in diff.groups if g.comparison)
    text = diff.describe()
    assert "`Cast` in `cast_heavy` is added" in text and text.endswith("(a hint).")


def test_kernel_groups_read_jaxs_names_on_a_gpu_trace_and_tensorflows_as_before():
    """Names as XProf gave them from Keras 3 on JAX on an H100 (benchmarks/mixed_precision_on_gpu.py --kernels):
    a layer's scope wrapped in JAX's transforms, the backward pass under transpose(...), host rows beside the
    kernels, XLA's own copies typed Unknown."""
    from tfperf.doctor.kernels import grouped
    from tfperf.measure.profiles import OpTime

    def op(place, type_, name, ms):
        return OpTime(place, type_, name, 3, ms / 1e3, 0.0)

    gpu = [op("Device", "conv_general_dilated", "jit(train_step)/jvp(conv1)/conv_general_dilated", 1.5),
           op("Device", "conv_general_dilated", "jit(train_step)/transpose(jvp(conv1))/conv_general_dilated", 4.5),
           op("Device", "max", "jit(train_step)/jvp(conv1)/jit(relu)/max", 0.3),
           op("Device", "add", "jit(train_step)/sgd_5/add", 0.03),
           op("Device", "Unknown", "input_transpose_fusion.4", 0.03),
           op("Device", "Unknown", "input_transpose_fusion.7", 0.03),
           op("Host", "GetEventForComputeStreamSyncPoint", "ThenExecuteCallback", 0.3)]
    found = {k: round(v * 1e3, 6) for k, v in grouped(gpu, ["conv0", "conv1", "logits"], calls=3).items()}
    assert found == {("conv1", "conv_general_dilated"): 0.5, ("conv1", "conv_general_dilated (gradient)"): 1.5,
                     ("conv1", "max"): 0.1, ("sgd", "add"): 0.01, ("", "input_transpose_fusion"): 0.02,
                     ("ThenExecuteCallback", "GetEventForComputeStreamSyncPoint (host)"): 0.1}
    cpu = [op("Host", "Conv2D", "model/conv1_1/Conv2D", 3.0),
           op("Host", "Conv2DBackpropFilter", "gradient_tape/model/conv1/Conv2DBackpropFilter", 6.0)]
    assert set(grouped(cpu, ["conv1"], calls=1)) == {("conv1", "Conv2D"), ("conv1", "Conv2DBackpropFilter")}


def test_on_a_gpu_the_precision_hint_names_the_layers_whose_channels_tensor_cores_do_not_take():
    """A decision taken on a fake device list: 60 filters (seen on an H100 to make bfloat16 convolutions 1.7x
    slower) and a first convolution over 3 image channels."""
    from tfperf.doctor.kernels import precision_hint

    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(64, 3, name="stem")(inputs)
    x = keras.layers.Conv2D(60, 3, name="odd")(x)
    model = keras.Model(inputs, keras.layers.Dense(8, name="head")(keras.layers.Flatten()(x)))
    hint = precision_hint("mixed_bfloat16", model, ["odd", "stem", "head", "not-a-layer"], gpus=["GPU:0"])
    assert "`odd` (64 in, 60 out): pad their filters or units to multiples of 8" in hint
    assert "`stem` (3 in)" in hint and "padded with zero channels to 8" in hint and "`head`" not in hint
    assert precision_hint("mixed_float16", model, ["head"], gpus=["GPU:0"]) == ""
    assert "emulated" in precision_hint("mixed_float16", model, ["odd"], gpus=[])


class Amplify(keras.layers.Layer):
    def call(self, x):
        return x * 1e5


def blowup() -> keras.Model:
    """Its middle layer's values pass float16's largest (65504) at once."""
    inputs = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, name="hidden")(inputs)
    h = Amplify(name="amplify")(h)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(h))


def unscaled_step(model, optimizer, batch):
    """A custom loop's step that forgets optimizer.scale_loss."""
    x, y = batch
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


def scaled_step(model, optimizer, batch):
    x, y = batch
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss)
    optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables))
    return loss


def test_a_custom_step_is_timed_four_ways_and_its_first_non_finite_step_and_variable_are_named():
    from tfperf.doctor.custom_step import EAGER, GRAPH, TABLE, XLA, custom_step, watch_overflow
    from tfperf.gpus import mixed_policy_here

    keras.utils.set_random_seed(0)
    subject = keras_subject(blowup(), "blowup", factory=blowup, builds_under_policy=True)
    rng = np.random.default_rng(0)
    batch = (rng.random((8, 8), dtype=np.float32), rng.random((8, 4), dtype=np.float32))
    options = Options(rounds=6, min_time_s=0.01, quick=True, loss="mse", step=unscaled_step, step_source="t:step")
    rec = Recorder("doctor", {})
    findings, skipped, overflow = custom_step(subject, rec, options, lambda step: None, batch)
    assert not skipped, skipped
    mixed = f"{mixed_policy_here()}, in tf.function"
    assert [r["row"] for r in rec.table(TABLE)] == [EAGER, GRAPH, XLA, mixed]
    assert {f.row for f in findings} == {GRAPH, XLA, mixed} and all(f.baseline == EAGER for f in findings)
    # Under mixed_float16 the forward pass overflows at once: step 1's gradients, the layer, the missing scale_loss.
    assert overflow.first("gradient") == 1 and overflow.first("loss") == 1 and overflow.first("weight") is None
    assert set(overflow.steps[0].bad_gradients) == {"hidden/kernel", "hidden/bias", "head/kernel", "head/bias"}
    assert overflow.overflowing_layer == "amplify" and not any(s.scaled for s in overflow.steps)
    text = overflow.describe()
    assert "layer `amplify`" in text and "never calls optimizer.scale_loss" in text
    assert overflow.steps[-1].scale < overflow.initial_scale  # each skipped step halved it
    # The same model made tame, with a step that scales its loss: nothing goes non-finite, nothing advised.
    tame = keras_subject(cast_heavy_cnn(side=8), "tame", factory=lambda: cast_heavy_cnn(side=8),
                         builds_under_policy=True)
    fine = watch_overflow(tame, scaled_step, (rng.random((4, 8, 8, 3), dtype=np.float32),
                                              rng.random((4, 3), dtype=np.float32)), steps=8)
    assert fine.first("loss") is None and fine.first("weight") is None and not fine.steps[-1].bad_gradients
    assert all(s.scaled for s in fine.steps) and fine.overflowing_layer is None
    assert "never calls" not in fine.describe() and "not finite" not in fine.describe()


def test_a_string_layer_is_refused_without_compiling_and_the_rest_compiled_around_it():
    # keras-io's text classifiers keep TextVectorization in the model they export. Handing XLA its string tensors
    # aborted the doctor's process (TensorFlow's DataTypeCanUseMemcpy check); now such a run is refused unasked.
    vectorize = keras.layers.TextVectorization(max_tokens=50, output_sequence_length=6, name="vectorize")
    vectorize.adapt(np.array(["the movie was great", "a terrible film"]))
    text = keras.Input((1,), dtype="string", name="text")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 4, name="embed")(vectorize(text)))
    model = keras.Model(text, keras.layers.Dense(2, name="logits")(pooled))
    x = tf.constant([["a great movie"], ["terrible"]])
    found = bisect(model, x)
    assert found.failing == ["vectorize"] and "string tensors" in found.refusals[0].reason
    np.testing.assert_allclose(compiled_around(model, found.failing)(x), model(x), rtol=1e-5, atol=1e-6)


def test_a_bad_training_step_is_one_line_with_exit_2_and_nothing_written(tmp_path, capsys, monkeypatch):
    from test_doctor import one_line_error

    (tmp_path / "myloop.py").write_text(
        "import keras\n\n"
        "def build():\n"
        "    inputs = keras.Input((4,))\n"
        "    return keras.Model(inputs, keras.layers.Dense(2)(inputs))\n\n"
        "not_a_step = 3\n\n"
        "def returns_nothing(model, optimizer, batch):\n"
        "    return None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    common = ["myloop:build", "--quick", "--no-threads", "--no-profile", "--out", out]
    one_line_error(capsys, [*common, "--train-step", "myloop:returns_nothing"], "give --loss")
    one_line_error(capsys, [*common, "--loss", "mse", "--train-step", "myloop:not_a_step"], "no function 'not_a_step'")
    one_line_error(capsys, [*common, "--loss", "mse", "--train-step", "myloop:returns_nothing"], "not the loss")
    assert not out.exists()


def small_cnn(path) -> str:
    inputs = keras.Input((12, 12, 1), name="image")
    x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
    x = keras.layers.Flatten()(x)
    keras.Model(inputs, keras.layers.Dense(10)(x)).save(path)
    return str(path)


@pytest.mark.slow
def test_two_devices_train_the_users_model_under_mirroredstrategy_with_the_step_split(tmp_path):
    from tfperf.deploy.loader import load_subject
    from tfperf.doctor.devices import FIT, TIMED, devices

    subject = load_subject(small_cnn(tmp_path / "cnn.keras"))
    rec = Recorder("doctor", {})
    options = Options(devices=2, loss="sparse_categorical_crossentropy", from_logits=True, rounds=3, min_time_s=0.01,
                      max_extensions=0)
    findings, skipped, found = devices(subject, rec, options, tmp_path, lambda step: None)
    assert skipped == {} and found is not None
    one, two = found.facts["1 device"], found.facts["2 devices"]
    # No GPU here: two logical CPU devices; each keeps its batch, so the global batch and learning rate double.
    assert (len(one["devices"]), len(two["devices"])) == (1, 2) and two["kind"] == "cpu"
    assert (one["global_batch"], two["global_batch"]) == (32, 64)
    assert two["learning_rate"] == 2 * one["learning_rate"] and two["gradient_bytes"] == one["gradient_bytes"] > 0
    for what in TIMED:  # every part raced in both processes and recorded
        assert {r["row"] for r in rec.table(f"devices: {what}")} == {"1 device", "2 devices"}
    for row in found.counts:
        split = found.split_ms(row)
        assert split["step"] > 0 and split["compute"] > 0 and split["all-reduce alone"] > 0
        assert split["exposed beyond the compute"] >= 0 and split["input wait"] >= 0
        assert split["fit() per step"] >= split["fit() around the step"] >= 0
    text = found.describe()
    assert "linear scaling rule" in text and "ideal 2x" in text and "global batch 64" in text
    assert findings[0].section == f"devices: {FIT}" and "MirroredStrategy" in findings[0].code
    assert findings[0].note == found.why()


def test_the_reason_two_devices_fall_short_follows_the_split():
    from tfperf.doctor.devices import FIT, FIT_STEPS, DevicesFound
    from tfperf.measure.stats import Comparison

    def found(kind, one, many):  # (a fit() step, step, compute, all-reduce, step from the dataset) in ms
        medians = {}
        for row, parts in (("1 device", one), ("2 devices", many)):
            medians.update({(what, row): ms / 1e3 for what, ms in zip(
                ("step", "compute", "all-reduce", "step, batch from the dataset"), parts[1:])})
            medians[(FIT, row)] = FIT_STEPS * parts[0] / 1e3
        fit = Comparison("1 device", "2 devices", 1.2, (1.1, 1.3), FASTER, True, 0.1, 6)
        facts = {"1 device": {"devices": ["/GPU:0"], "global_batch": 32, "learning_rate": 1e-3, "kind": kind,
                              "gradient_bytes": 2**22, "note": ""},
                 "2 devices": {"devices": ["/GPU:0", "/GPU:1"], "global_batch": 64, "learning_rate": 2e-3,
                               "kind": kind, "gradient_bytes": 2**22, "note": ""}}
        return DevicesFound(("1 device", "2 devices"), medians, {FIT: fit}, facts, 16)

    # Logical CPU devices: each replica's compute doubled, the devices share the cores.
    why = found("cpu", (11, 10, 9, 0.5, 10.2), (20, 19, 18, 1, 19.2)).why()
    assert why.startswith("A step of fit() takes 20 ms on 2 devices against 11 ms") and "share it" in why
    # Two GPUs: the compute stayed, the step grew by an all-reduce left exposed.
    why = found("gpu", (11, 10, 9, 0.5, 10.2), (17, 16, 9.2, 6, 16.1)).why()
    assert "the all-reduce left exposed" in why and "4.0 MB of gradients" in why
    # The step waits for its batch.
    assert "wait for the batch" in found("gpu", (11, 10, 9, 0.5, 10.2), (20, 11, 9.2, 1, 19)).why()
    # fit()'s loop around the step: steps_per_execution.
    assert "steps_per_execution" in found("gpu", (11, 10, 9, 0.5, 10.2), (20, 10.5, 9.2, 1, 10.7)).why()
    # Nothing grew.
    assert "nothing grew" in found("gpu", (11, 10, 9, 0.5, 10.2), (11, 10, 9, 0.5, 10.2)).why()
    assert "1.20x (ideal 2x)" in found("gpu", (11, 10, 9, 0.5, 10.2), (20, 11, 9.2, 1, 19)).describe()


class Sample(keras.layers.Layer):
    """A VAE's sampling step: mean + sigma * noise, drawn anew at every call (inference included)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seeds = keras.random.SeedGenerator(0)

    def call(self, x):
        mean, log_var = x[:, :2], x[:, 2:]
        return mean + keras.ops.exp(0.5 * log_var) * keras.random.normal(keras.ops.shape(mean), seed=self.seeds)


def test_a_stochastic_model_is_said_to_be_one_and_its_rows_held_to_its_own_spread(tmp_path):
    """Issue 73: a VAE sampling in its forward pass had every row say 'outputs differ', so nothing was advised.
    Two calls on the same inputs differ: the report says so, and each row is held to 1.5x the model's own spread."""
    from tfperf.doctor.inference import STOCHASTIC_MARGIN

    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), name="features")
    sampler = keras.Model(inputs, keras.layers.Dense(3)(Sample()(keras.layers.Dense(4)(inputs))), name="sampler")
    rec = Recorder("doctor", {})
    section = inference_section(Context(keras_subject(sampler, "sampler", factory=None), rec, TINY, tmp_path,
                                        tmp_path / "traces", tmp_path, facts={"matmul_flops_per_s": 1e9}))
    said = section.skipped["exact agreement at batch 4"]
    spread = float(said.split("differed by up to ")[1].split(" ")[0])
    assert said.startswith("the model is stochastic") and spread > 1e-3
    rows = {r["row"]: r["metrics"] for r in rec.table("throughput at batch 4")}
    assert all(m["tolerance"] >= STOCHASTIC_MARGIN * spread * 0.95 for m in rows.values())  # spread said in 2 digits
    assert any(f.agrees for f in section.findings)  # alike within the spread, where each call draws anew
    # The best way to call reads the spread from its table, and its first screen says "alike, not equal".
    assert section.found.tables[-1].spread == pytest.approx(spread, rel=0.05)
    # A deterministic model is held to float32's tolerance, and nothing is said.
    plain = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)], name="plain")
    section = inference_section(Context(keras_subject(plain, "plain", factory=None), Recorder("doctor", {}), TINY,
                                        tmp_path, tmp_path / "traces", tmp_path, facts={"matmul_flops_per_s": 1e9}))
    assert not any(k.startswith("exact agreement") for k in section.skipped)
    from tfperf.deploy.formats import FLOAT_TOLERANCE

    assert all(t.spread <= FLOAT_TOLERANCE for t in section.found.tables)
