"""What a watched run's record says: where its time went, and each finding that cost it time or memory, as
sentences that follow from the recorded numbers (each rule below says when it speaks)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

MB = 1024 * 1024
CALLBACK_SHARE = 0.05  # a callback is named when it took this share of fit's time...
CALLBACK_MIN_S = 0.2  # ...and at least this long
VALIDATION_SHARE = 0.15
VALIDATION_MIN_S = 0.5
VALIDATION_GOAL = 0.10  # the validation_freq suggested brings validation under this share
FIRST_EPOCH_RATIO = 1.5  # the first epoch is named when it took this many times the others' median...
FIRST_EPOCH_MIN_S = 0.5  # ...and this much longer
RETRACES = 3  # a function of the program's own is named from this many traces...
RETRACE_MIN_S = 0.5  # ...or when its traces took this long
LOOP_CALLS = 10  # predict() or evaluate() called this often on a batch or two each is a loop
LOOP_BATCHES = 2
FIT_LOOP = 3  # fit() called this often from one line
INPUT_SHARE = 0.3  # a generator is named when making batches took this share of the steps' time...
INPUT_MIN_S = 0.5  # ...and this long
INPUT_BOUND = 0.20  # traced steps: XProf calls a program HIGHLY input-bound from this share waiting for input
GROWTH_MIN = 50 * MB  # memory growth named from this much over the run...
GROWTH_EPOCHS = 3  # ...over at least this many epochs
DECLINE_EPOCHS = 4  # a decline is judged over this many epochs at least, against the second
DECLINE_RATIO = 1.2  # and said when the last epoch's steps are this much slower, the interval's low end above...
DECLINE_LOW = 1.1


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing the run paid for: what it cost in seconds (for the ranking), what happened, what to try."""

    key: str
    seconds: float
    text: str
    fix: str



def seconds(s: float) -> str:
    """A duration a reader reads: 850 ms, 4.2 s, 3 min 5 s."""
    if s < 1:
        return f"{s * 1000:.0f} ms" if s >= 0.001 else f"{s * 1e6:.0f} µs"
    if s < 100:
        return f"{s:.1f} s"
    return f"{int(s // 60)} min {s % 60:.0f} s"


def megabytes(n: float) -> str:
    return f"{n / MB:,.0f} MB" if abs(n) < 1024 * MB else f"{n / MB / 1024:,.2f} GB"


def share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def epoch_batches(fit: Mapping[str, Any], e: Mapping[str, Any]) -> tuple[int, list[int]]:
    """The batches an epoch ran, and each sampled step's: Keras names steps_per_execution batches for an epoch's
    last execution, which holds only what is left (records written before the probe capped them are capped here)."""
    known, spe = fit.get("batches_per_epoch"), fit.get("steps_per_execution") or 1
    total = min(e["batches"], known) if isinstance(known, int) and known > 0 else e["batches"]
    per_step = e.get("step_batches") or [max(1, min(spe, total - i * spe)) for i in range(len(e["step_sample"]))]
    return total, per_step


def epoch_examples(fit: Mapping[str, Any], e: Mapping[str, Any]) -> int | None:
    """The examples an epoch trained on: its batches times the batch, no more than the training rows where fit()
    was given arrays (the last batch is short); None where the batch is unknown."""
    batch = fit.get("batch_size") or fit.get("batch_size_arg")
    if not batch:
        return None
    examples = epoch_batches(fit, e)[0] * batch
    rows = fit.get("rows")
    return min(examples, int(rows * (1 - (fit.get("validation_split") or 0.0)))) if rows else examples


def primary(processes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The process the run's Keras work happened in: the one with the most time in fit and calls."""
    def work(p: Mapping[str, Any]) -> float:
        fits = sum(f.get("seconds") or 0.0 for f in p.get("fits", []))
        calls = sum(c["seconds"] for c in p.get("calls", {}).values())
        return fits + calls + sum(fn["seconds"] for fn in p.get("functions", {}).values()) + len(p.get("traces", []))

    busy = [p for p in processes if work(p) > 0 or p.get("imports")]
    first = [p for p in busy if p.get("rank") == 0]  # under a launcher: rank 0, as its logs are
    return max(first or busy, key=work) if busy else None


@dataclasses.dataclass(frozen=True)
class FitSplit:
    """Where fit's time went, summed over the run's fit() calls."""

    seconds: float
    steps: float
    validation: float
    callbacks: dict[str, float]
    set_up: float
    rest: float
    callbacks_async: bool


def fit_split(fits: Sequence[Mapping[str, Any]]) -> FitSplit:
    """Steps, validation, each callback, fit's set-up (before the first epoch and after the last), the rest."""
    total = steps = validation = set_up = rest = 0.0
    callbacks: dict[str, float] = {}
    threaded = False
    for fit in fits:
        epochs = fit.get("epochs_run", [])
        fit_s = fit.get("seconds") or sum(e["seconds"] for e in epochs)
        total += fit_s
        threaded = threaded or bool(fit.get("callbacks_async"))
        for e in epochs:
            steps += e["steps_s"]
            validation += e["validation_s"]
            own = sum(e["callbacks"].values())
            for name, s in e["callbacks"].items():
                callbacks[name] = callbacks.get(name, 0.0) + s
            serial = 0.0 if fit.get("callbacks_async") else own
            rest += max(0.0, e["seconds"] - e["steps_s"] - e["validation_s"] - serial)
        for name, s in fit.get("callbacks_outside_epochs", {}).items():
            callbacks[name] = callbacks.get(name, 0.0) + s
        set_up += max(0.0, fit_s - sum(e["seconds"] for e in epochs))
    return FitSplit(total, steps, validation, callbacks, set_up, rest, threaded)


def import_seconds(process: Mapping[str, Any]) -> float:
    """Importing TensorFlow and Keras: the union of their import intervals (one may import the other)."""
    spans = sorted((i["at_s"], i["at_s"] + i["seconds"]) for i in process.get("imports", {}).values())
    total, end = 0.0, -math.inf
    for start, stop in spans:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def callback_findings(split: FitSplit) -> list[Finding]:
    """A callback that took CALLBACK_SHARE of fit's time."""
    found = []
    for name, s in sorted(split.callbacks.items(), key=lambda kv: -kv[1]):
        if s < CALLBACK_MIN_S or s < CALLBACK_SHARE * split.seconds:
            continue
        beside = " (in a thread beside the steps: it competes with them for the CPU)" if split.callbacks_async else ""
        if name == "ProgbarLogger":
            fix = ("fit(..., verbose=2) prints one line an epoch instead of updating the bar each batch; "
                   "steps_per_execution=N calls the callbacks once every N batches")
        else:
            fix = (f"do {name}'s work in on_epoch_end, or every N batches (`if batch % N == 0`); "
                   f"steps_per_execution=N calls batch hooks once every N batches")
        found.append(Finding("callback", s, f"{name} took {seconds(s)}, {share(s, split.seconds)} of fit's time"
                             f"{beside}", fix))
    return found


def validation_finding(fits: Sequence[Mapping[str, Any]], split: FitSplit) -> list[Finding]:
    """Validation at VALIDATION_SHARE of fit's time, with the validation_freq that brings it under the goal."""
    if split.validation < VALIDATION_MIN_S or split.validation < VALIDATION_SHARE * split.seconds:
        return []
    runs = sum(1 for f in fits for e in f.get("epochs_run", []) if e["validation_s"] > 0)
    per_run = split.validation / max(runs, 1)
    epochs = sum(len(f.get("epochs_run", [])) for f in fits)
    per_epoch = (split.seconds - split.validation) / max(epochs, 1)
    freq = max(2, math.ceil((1 - VALIDATION_GOAL) / VALIDATION_GOAL * per_run / max(per_epoch, 1e-9)))
    text = (f"validation took {seconds(split.validation)}, {share(split.validation, split.seconds)} of fit's time "
            f"({runs} runs of {seconds(per_run)}, against {seconds(per_epoch)} for an epoch's training)")
    fix = (f"validation_freq={freq} validates every {freq} epochs (validation under "
           f"{100 * VALIDATION_GOAL:.0f}% of fit); validation_steps=N validates on part of the set")
    return [Finding("validation", split.validation * (1 - 1 / freq), text, fix)]


def first_epoch_findings(fits: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """A first epoch FIRST_EPOCH_RATIO times the others', and what the difference was made of."""
    found = []
    for fit in fits:
        epochs = fit.get("epochs_run", [])
        if len(epochs) < 2:
            continue
        first, others = epochs[0]["seconds"], statistics.median(e["seconds"] for e in epochs[1:])
        extra = first - others
        if extra < FIRST_EPOCH_MIN_S or first < FIRST_EPOCH_RATIO * others:
            continue
        e0 = epochs[0]
        compile_ = " and XLA compiling" if fit.get("jit_compile") else ""
        if len(e0["step_sample"]) < 3:  # a step or two an epoch: no typical step to hold the first against
            in_step, parts = 0.0, [f"{len(e0['step_sample'])} step(s) an epoch, so its first step cannot be told "
                                   f"from a typical one (tracing, building the graph{compile_}, first allocations)"]
        else:
            typical = statistics.median(e0["step_sample"])
            first_step = max(0.0, (e0["first_step_s"] or 0.0) - typical)
            in_step = min(e0.get("first_step_trace_s") or 0.0, first_step)
            parts = [f"the first step took {seconds(first_step)} beyond a typical one (tracing {seconds(in_step)} of "
                     f"it, the rest building the graph{compile_} and first allocations)"]
        outside = max(0.0, e0["trace_s"] - in_step)
        if outside >= 0.001:
            parts.append(f"tracing {seconds(outside)}" + (" outside the first step" if in_step else ""))
        again, fix = retraced_step(fit, e0)
        text = (f"the first epoch of fit() at {fit.get('site')} took {seconds(first)}, {first / others:.1f}x the "
                f"others' median {seconds(others)}: {seconds(extra)} more; " + "; ".join(parts + again))
        found.append(Finding("first epoch", extra, text, fix))
    return found


RETRACED_MIN_S = 0.05  # a step traced again inside its own trace is named from this much


def retraced_step(fit: Mapping[str, Any], epoch: Mapping[str, Any]) -> tuple[list[str], str]:
    """What the first epoch's tracing did twice, and the fix: ([the part said, if any], the fix)."""
    fix = "paid once per fit() of a new or recompiled model: call fit() once for all epochs (not once an epoch), " \
          "keep one model rather than rebuilding it"
    again = epoch.get("retraced_inside_s") or 0.0
    if again < RETRACED_MIN_S:
        return [], fix
    if fit.get("optimizer_unbuilt"):
        return ([f"TensorFlow traced fit's step again inside that trace ({seconds(again)}): Keras builds an optimizer "
                 f"not yet built inside the first trace, and a trace that makes variables is done twice"],
                f"build the optimizer after compile(): `model.optimizer.build(model.trainable_variables)`, which saves "
                f"the second trace (at least {seconds(again)}); and " + fix)
    return ([f"TensorFlow traced a function again inside fit's step ({seconds(again)}): its first trace made "
             f"variables (a layer building its weights inside the step)"],
            f"build the model before fit() (call it once on a batch) to save the second trace (at least "
            f"{seconds(again)}); and " + fix)


def input_findings(fits: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """A Python generator or PyDataset whose batches took INPUT_SHARE of the steps' time to make."""
    found = []
    for fit in fits:
        epochs = fit.get("epochs_run", [])
        made, batches = fit.get("input_s", 0.0), fit.get("input_batches", 0)
        steps = sum(e["steps_s"] for e in epochs)
        if not batches or made < INPUT_MIN_S or made < INPUT_SHARE * steps:
            continue
        bound = ": the steps can go no faster than it" if made >= 0.8 * steps else ""
        what, fix = _input_named(fit)
        text = (f"{what} given to fit() at {fit.get('site')} took {seconds(made)} to {_verb(fit)} {batches:,} "
                f"batches ({seconds(made / batches)} a batch), {share(made, steps)} of the steps' "
                f"{seconds(steps)}{bound}")
        found.append(Finding("input", made, text, fix))
    return found


def _verb(fit: Mapping[str, Any]) -> str:
    """A PyDataset with workers hands over what its workers made: the time timed is the wait for them."""
    return "hand over" if (fit.get("input_workers") or 1) > 1 else "make"


def _input_named(fit: Mapping[str, Any]) -> tuple[str, str]:
    """The input as the report names it, and what makes it faster."""
    if fit.get("input") != "a keras.utils.PyDataset":
        return "the Python generator", TRACED_INPUT_FIXES["generator"]
    workers, processes = fit.get("input_workers") or 1, fit.get("input_processes")
    if workers <= 1:
        return "the PyDataset (one worker)", TRACED_INPUT_FIXES["PyDataset"]
    kind = "processes" if processes else "threads"
    more = ("use_multiprocessing=True (its Python work holds the GIL in threads), " if not processes else "")
    return (f"the PyDataset ({workers} worker {kind})",
            f"{more}more workers than {workers} where there are cores to run them, a larger max_queue_size; or "
            "a tf.data pipeline with map(..., num_parallel_calls=tf.data.AUTOTUNE) and prefetch")


def traced_input(process: Mapping[str, Any], fits: Sequence[Mapping[str, Any]]) -> tuple[list[Finding], str]:
    """The traced steps' wait for input (--profile-steps): a finding from INPUT_BOUND on, else one sentence."""
    traced = process.get("profile")
    if not traced:
        return [], ""
    read = traced.get("input")
    if read is None:
        return [], f"Waiting for input: not read ({traced.get('input_error') or traced.get('error')})."
    fit = fits[traced["fit"]] if 0 <= traced.get("fit", -1) < len(fits) else {}
    steps_s = sum(e["steps_s"] for e in fit.get("epochs_run", []))
    stage = f"; its slowest stage {read['slowest_stage']}" if read.get("slowest_stage") else ""
    said = (f"the steps traced in epoch {traced['epoch'] + 1} (XProf read {read['steps']} of {traced['steps']}) "
            f"waited for input {read['share']:.0%} of their time (the median step, XProf's input-pipeline "
            f"analysis{stage})")
    if read["share"] < INPUT_BOUND:
        return [], f"Waiting for input: {said}: not input-bound."
    fix = TRACED_INPUT_FIXES.get(fit.get("input_kind"), TRACED_INPUT_FIXES["tf.data"])
    return [Finding("input", read["share"] * steps_s, said + ": the steps wait on the pipeline", fix)], ""


# What makes the input faster, by what fit() was given (keras_hooks._input_kind).
TRACED_INPUT_FIXES = {
    "tf.data": ("dataset.prefetch(tf.data.AUTOTUNE) at the end of the pipeline; map(..., num_parallel_calls="
                "tf.data.AUTOTUNE); cache() after the costly steps where the data fits; `tfperf doctor MODEL --data "
                "module:function` races those variants on your pipeline"),
    "PyDataset": ("make batches in parallel: super().__init__(workers=4, use_multiprocessing=True) in your "
                  "PyDataset (threads for I/O, processes for Python-heavy decoding); or read it into a tf.data "
                  "pipeline with map(..., num_parallel_calls=tf.data.AUTOTUNE) and prefetch"),
    "generator": ("a keras.utils.PyDataset with workers=N (use_multiprocessing=True for Python-heavy work), or a "
                  "tf.data pipeline: from_tensor_slices or TFRecords, map(..., num_parallel_calls=tf.data.AUTOTUNE), "
                  "prefetch"),
    "arrays": ("arrays are sliced into batches on the host: tf.data.Dataset.from_tensor_slices(...).batch(N)"
               ".prefetch(tf.data.AUTOTUNE) lets the slicing overlap the steps"),
}


def fit_loop_findings(fits: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """fit() called FIT_LOOP times from one line: each call pays its set-up again."""
    by_site: dict[str, list[Mapping[str, Any]]] = {}
    for fit in fits:
        by_site.setdefault(str(fit.get("site")), []).append(fit)
    found = []
    for site, calls in by_site.items():
        if len(calls) < FIT_LOOP:
            continue
        set_up = fit_split(calls).set_up
        first_epochs = sum(c["epochs_run"][0]["trace_s"] for c in calls[1:] if c.get("epochs_run"))
        cost = set_up + first_epochs
        text = (f"fit() was called {len(calls)} times at {site}: set-up outside epochs {seconds(set_up)} in all, "
                f"tracing in the later calls' first epochs {seconds(first_epochs)}")
        fix = "one fit(epochs=N) instead of N calls of fit(epochs=1); per-epoch work belongs in a callback"
        found.append(Finding("fit loop", cost, text, fix))
    return found


def _differences(before: Sequence[Sequence[str]], after: Sequence[Sequence[str]]) -> list[tuple[str, str, str]]:
    """(parameter, why, new value) for each parameter traced for something else than last time."""
    was = dict(map(tuple, before))
    out = []
    for name, now in map(tuple, after):
        old = was.get(name)
        if old is None or old == now:
            continue
        if "Literal[" in now or "Literal[" in old:
            out.append((name, "a new Python value", now.replace("Literal[", "").rstrip("]")))
        elif "shape=" in now and old.split("dtype=")[-1] == now.split("dtype=")[-1]:
            out.append((name, "a new shape", now.split("shape=")[1].split(", dtype")[0]))
        elif "dtype=" in now:
            out.append((name, "a new dtype", now.split("dtype=")[1].split(",")[0]))
        else:
            out.append((name, "a new argument type", now[:60]))
    return out


RETRACE_FIXES = {
    "a new Python value": "pass it as a tensor (tf.constant(...)) or read it from a tf.Variable: a Python number "
                          "is part of the traced signature, a tensor's value is not",
    "a new shape": "reduce_retracing=True in tf.function, or an input_signature with None for the dimension "
                   "that changes (or pad inputs to a few fixed lengths)",
    "a new dtype": "cast the argument to one dtype before the call",
    "a new argument type": "call it with the same kinds of arguments each time",
    "a new function object": "make the tf.function once, outside the loop or the function that calls it: a new "
                             "tf.function (or a new Python function under it) starts with no traces",
}


def retrace_findings(traces: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """A function of the program's own traced RETRACES times, with the line that called it and why."""
    by_def: dict[str, list[Mapping[str, Any]]] = {}
    for t in traces:
        if t.get("own"):
            by_def.setdefault(str(t.get("defined_at")), []).append(t)
    found = []
    for defined_at, ts in by_def.items():
        total = sum(t["seconds"] for t in ts)
        if len(ts) < RETRACES and total < RETRACE_MIN_S:
            continue
        reasons: dict[str, list[tuple[str, str]]] = {}
        last: dict[int, Sequence[Sequence[str]]] = {}
        for t in ts:
            if t["function"] in last:
                for param, why, value in _differences(last[t["function"]], t["signature"]) or [
                        ("", "a new function object", "")]:
                    reasons.setdefault(why, []).append((param, value))
            elif last:
                reasons.setdefault("a new function object", []).append(("", ""))
            last[t["function"]] = t["signature"]
        if not reasons:
            continue
        why, changes = max(reasons.items(), key=lambda kv: len(kv[1]))
        sites = sorted({str(t.get("site")) for t in ts})
        params = sorted({p for p, _ in changes if p})
        values = [v for p, v in changes if p]
        named = f" for {', '.join(f'`{p}`' for p in params)}" if params else ""
        example = f" ({', '.join(values[:3])}{', ...' if len(values) > 3 else ''})" if values else ""
        text = (f"`{ts[0]['name']}` ({defined_at}) was traced {len(ts)} times, {seconds(total)} in tracing, "
                f"called from {', '.join(sites[:3])}: {why}{named} {len(changes)} times{example}")
        found.append(Finding("retrace", total - ts[0]["seconds"], text, RETRACE_FIXES[why]))
    return found


def _slope(values: Sequence[float]) -> float:
    """Least-squares growth per step of a series."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    den = sum((i - mean_x) ** 2 for i in range(n))
    return sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / den if den else 0.0


def grows(series: Sequence[float], at_least: int) -> bool:
    """Memory readings that rose GROWTH_MIN over at least `at_least` readings, the trend upward."""
    return len(series) >= at_least and series[-1] - series[0] >= GROWTH_MIN and _slope(series) > 0


def call_findings(process: Mapping[str, Any]) -> list[Finding]:
    """predict() or evaluate() in a loop on a batch or two each; memory that grows call after call."""
    traces_by_site: dict[str, int] = {}
    for t in process.get("traces", []):
        traces_by_site[str(t.get("site"))] = traces_by_site.get(str(t.get("site")), 0) + 1
    found = []
    for c in process.get("calls", {}).values():
        if c["calls"] < LOOP_CALLS:
            continue
        per_call = c["seconds"] / c["calls"]
        traced = traces_by_site.get(str(c["site"]), 0)
        if c["kind"] in ("predict", "evaluate") and c["batches"] <= LOOP_BATCHES * c["calls"]:
            what = f", tracing {traced / c['calls']:.1f} functions a call" if traced >= c["calls"] else ""
            text = (f"{c['kind']}() was called {c['calls']} times at {c['site']} on {c['batches'] / c['calls']:.0f} "
                    f"batch a call: {seconds(per_call)} a call, {seconds(c['seconds'])} in all{what}")
            alternative = "model(x, training=False)" if c["kind"] == "predict" else "a compiled metric in a tf.function"
            fix = (f"{alternative} or model.{c['kind']}_on_batch(x): {c['kind']}() builds a data pipeline and its "
                   "callbacks on every call")
            found.append(Finding(f"{c['kind']} loop", c["seconds"] - per_call, text, fix))
        rss = [r for r in c.get("rss", []) if r]
        if grows(rss, LOOP_CALLS):
            text = (f"host memory grew {megabytes(_slope(rss))} per {c['kind']}() call at {c['site']} "
                    f"({megabytes(rss[0])} to {megabytes(rss[-1])} over {len(rss)} calls)")
            fix = ("keep no results in a growing Python list (write them out, or keep only what is needed); a "
                   "tf.function made per call keeps its graphs: make it once")
            found.append(Finding("memory", 0.0, text, fix))
    return found


def epoch_findings(fits: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Memory that grows epoch after epoch; steps that slow down epoch after epoch (against the second)."""
    from tfperf.measure.stats import ratio_ci  # numpy: read only when a report is made

    found = []
    for fit in fits:
        epochs = fit.get("epochs_run", [])
        rss = [e["rss"] for e in epochs[1:] if e.get("rss")]
        if grows(rss, GROWTH_EPOCHS):
            text = (f"host memory grew {megabytes(_slope(rss))} an epoch in fit() at {fit.get('site')} "
                    f"({megabytes(rss[0])} after epoch 2, {megabytes(rss[-1])} after epoch {len(epochs)})")
            fix = ("look for what keeps each batch: a callback appending tensors or logs to a list, "
                   "dataset.cache() filling, a new model or tf.function per epoch")
            found.append(Finding("memory", 0.0, text, fix))
        if len(epochs) < DECLINE_EPOCHS or len(epochs[1]["step_sample"]) < 5 or len(epochs[-1]["step_sample"]) < 5:
            continue
        ratio, (low, high) = ratio_ci(epochs[-1]["step_sample"], epochs[1]["step_sample"])
        if ratio < DECLINE_RATIO or low <= DECLINE_LOW:
            continue
        base = statistics.median(epochs[1]["step_sample"])
        lost = sum(max(0.0, e["steps_s"] - base * e["steps"]) for e in epochs[2:])
        text = (f"steps slowed down over fit() at {fit.get('site')}: epoch {len(epochs)}'s ran {ratio:.2f}x as slow "
                f"as epoch 2's (95% CI {low:.2f}-{high:.2f}x), {seconds(lost)} lost over the epochs after the "
                f"second")
        fix = ("look for what grows as training goes: memory (above), a callback's lists, a dataset cache, "
               "the machine's other work (thermal or shared cores)")
        found.append(Finding("decline", lost, text, fix))
    return found


def _size(n: float) -> str:
    return f"{n:,.0f} B" if n < 1024 else f"{n / 1024:,.0f} KB" if n < MB else megabytes(n)


def what_grew(process: Mapping[str, Any], memory_found: bool) -> str:
    """The census's answer to what grew with memory over the run (tfperf/watch/census.py), as one sentence: the
    containers it named; that none grew, said where memory grew enough for a finding; "" without a second count."""
    held = process.get("census") or {}
    last = held.get("last")
    if not last:
        return ""
    if last.get("error"):
        return f"Counting Python objects as memory grew failed ({last['error']})." if memory_found else ""
    over = (f"over the run (the census of Python objects at {seconds(held['first_at_s'])} and "
            f"{seconds(last['at_s'])}, memory {megabytes(held['first_rss'])} -> {megabytes(last['rss'])})")
    named = []
    for c in last.get("containers", []):
        before = f"{c['from']:,}" if c.get("from") is not None else "under 16"
        article = "an" if (c.get("item") or "x")[0].lower() in "aeiou" else "a"
        item = f", the last {article} {c['item']}" if c.get("item") else ""
        if c.get("item_bytes") is not None:
            item += f" of {_size(c['item_bytes'])}"
            item += f" (about {_size(c['grew_bytes'])} more if all are alike)" if c.get("grew_bytes") else ""
        named.append(f"the {c['kind']} {c['holder']}: {before} -> {c['to']:,} items{item}")
    if named:
        return f"What grew {over}: " + "; ".join(named) + "."
    if not memory_found:
        return ""
    return (f"What grew {over}: no Python list, dict, set or deque grew by 1,000 items or 8 MB; so it "
            "is held elsewhere: arrays kept by objects, or TensorFlow's own memory (a dataset's cache() or shuffle "
            "buffer, graphs of functions traced anew).")
