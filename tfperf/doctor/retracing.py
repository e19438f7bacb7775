"""Retracing: "why is my tf.function slow on every call? Does it retrace?"

How a tf.function of the model behaves when it is called with new batch sizes or Python numbers.

These are pitfalls, measured on the model: what calling it one way or another would cost. They are
ranked with the advice only when the model's own way of being called (Keras' predict()) retraces.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfperf.deploy.inputs import make_inputs, to_tensors
from tfperf.deploy.loader import Subject
from tfperf.doctor.experiment import Context, Experiment, Section
from tfperf.doctor.options import MIN_GAIN, OWN_RETRACES, Finding, Options


def count_traces(function, calls: Sequence[tuple]) -> int:
    """How many times a tf.function traced while making these calls (argument tuples)."""
    before = function.experimental_get_tracing_count()
    for args in calls:
        function(*args)
    return function.experimental_get_tracing_count() - before


def retraces(function, calls: Sequence[tuple]) -> bool:
    """True when the calls made the function trace more than once: each trace rebuilds its graph."""
    return count_traces(function, calls) > 1


def own_traces(subject: Subject, rec, by_batch: Sequence[tuple]) -> int | None:
    """How often the model's own call traced over these calls, recorded: Keras' predict() traces a step function
    (reduce_retracing=True); a SavedModel's signature is a concrete function and never retraces (None)."""
    from tfperf.measure import Timer

    if subject.kind != "keras":
        return None
    model = subject.model
    model.predict(by_batch[0][0], verbose=0)  # builds predict_function if the inference section did not
    before = model.predict_function.experimental_get_tracing_count()
    order = iter(by_batch)
    timer = Timer(lambda: model.predict(next(order)[0], verbose=0), name="predict(), a new batch size each call")
    timer.start(warmup=0)
    m = timer._measurement(timer.take(len(by_batch) - 1), rounds=1)
    own = model.predict_function.experimental_get_tracing_count() - before
    rec.add("retracing", m.name, {"calls": len(by_batch), "traces": own, "ms_per_call": m.median_s * 1e3,
                                  "first_call_s": m.first_call_s}, primary="ms_per_call", lower_is_better=True,
            measurement=m, versus_first=False)
    return own


def retracing(subject: Subject, rec, options: Options) -> tuple[list[Finding], dict]:
    """Call the model through tf.function the way applications do: new batch sizes, a Python number."""
    import tensorflow as tf

    from tfperf.measure import Measurement, Timer, versus

    batches = [b for b in options.trace_batches if subject.fixed_batch in (None, b)]
    if len(batches) < 2:
        return [], {"retracing": f"the signature takes only batch {subject.fixed_batch}: nothing can retrace"}
    inputs = {b: subject.pack(to_tensors(make_inputs(subject, b, seed=options.seed, sample=options.sample)))
              for b in batches}
    specs = tf.nest.map_structure(lambda t: tf.TensorSpec((None, *t.shape[1:]), t.dtype), inputs[batches[0]])

    def per_call(function, arguments: Sequence[tuple], name: str) -> tuple[int, Measurement]:
        """Traces, and the time of each call after the first, making these calls in turn."""
        before = function.experimental_get_tracing_count()
        order = iter(arguments)
        timer = Timer(lambda: function(*next(order)), name=name)
        timer.start(warmup=0)
        m = timer._measurement(timer.take(len(arguments) - 1), rounds=1)
        return function.experimental_get_tracing_count() - before, m

    by_batch = [(inputs[b],) for b in batches]
    x1 = inputs[batches[0]]
    values = [0.5 + k / 10 for k in range(len(batches))]
    # A Python number as an argument is part of the trace's key: every new value traces again.
    scaled = lambda x, scale: tf.nest.map_structure(lambda o: o * scale, subject.call(x))  # noqa: E731
    rows = [("tf.function, a new batch size each call", tf.function(subject.call), by_batch),
            ("input_signature with a None batch axis", tf.function(subject.call, input_signature=[specs]), by_batch),
            ("reduce_retracing=True", tf.function(subject.call, reduce_retracing=True), by_batch),
            ("a Python float argument, a new value each call", tf.function(scaled), [(x1, v) for v in values]),
            ("the same values as tf.constant", tf.function(scaled), [(x1, tf.constant(v)) for v in values])]
    found = {}
    for i, (row, function, arguments) in enumerate(rows):
        traces, m = per_call(function, arguments, row)
        found[row] = (traces, m)
        baseline = rows[0][0] if i < 3 else rows[3][0]
        c = None if i in (0, 3) else versus(found[baseline][1], m, threshold=MIN_GAIN)
        rec.add("retracing", row, {"calls": len(arguments), "traces": traces, "ms_per_call": m.median_s * 1e3,
                                   "first_call_s": m.first_call_s}, primary="ms_per_call", lower_is_better=True,
                measurement=m, comparison=c, versus_first=False)
    own = own_traces(subject, rec, by_batch)
    # Ranked with the advice only when the model's own call retraces; otherwise reported apart.
    pitfall = own is None or own < OWN_RETRACES
    note = "" if own is None else f"your model's predict() traced {own} times in {len(by_batch)} calls"
    findings = []
    (plain_traces, plain), (signed_traces, signed) = found[rows[0][0]], found[rows[1][0]]
    relaxed_traces, relaxed = found[rows[2][0]]
    if plain_traces > 1:
        findings.append(Finding(
            "retracing: new batch sizes", rows[1][0], rows[0][0], versus(plain, signed, threshold=MIN_GAIN),
            "@tf.function(input_signature=[tf.TensorSpec([None, ...], dtype)])  # a None batch axis",
            f"none at run time; {plain_traces} traces in {len(batches)} calls became {signed_traces}",
            note=note, pitfall=pitfall))
        findings.append(Finding(
            "retracing: new batch sizes", rows[2][0], rows[0][0], versus(plain, relaxed, threshold=MIN_GAIN),
            "@tf.function(reduce_retracing=True)",
            f"{plain_traces} traces in {len(batches)} calls became {relaxed_traces}; the relaxed graph may be "
            f"less specialised", note=note, pitfall=pitfall))
    (number_traces, number), (constant_traces, constant) = found[rows[3][0]], found[rows[4][0]]
    if number_traces > 1:
        findings.append(Finding(
            "retracing: Python numbers", "numbers passed as tf.constant", rows[3][0],
            versus(number, constant, threshold=MIN_GAIN),
            "f(x, tf.constant(scale))   # not f(x, scale): a Python number is part of the trace key",
            f"none; {number_traces} traces in {len(values)} calls became {constant_traces}", pitfall=True))
    return findings, {}


def run(ctx: Context) -> Section:
    """The retracing table as a section of the report: pitfalls, ranked as advice only where predict() retraces."""
    ctx.progress(EXPERIMENT.name)
    findings, skipped = retracing(ctx.subject, ctx.recorder, ctx.options)
    return Section(EXPERIMENT.name, findings, skipped)


EXPERIMENT = Experiment(name="retracing", question="Why is my tf.function slow on every call? Does it retrace?",
                        run=run)
