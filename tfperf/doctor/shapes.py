"""New shapes: "why is the first call slow every time the shape changes?", measured on the model.

Along each axis the model leaves free (the batch; and every free axis of its inputs together: an image's height and
width, a sequence's length), the model is called at sizes it has not seen, in each way an application calls it:
predict(), predict() after compile(jit_compile=True), model(x) in a tf.function, the same with jit_compile=True, and
its SavedModel export loaded back with tf.saved_model.load. Per way: the first call at each new size, the traces it
caused (the tf.function's own tracing count) and the XLA compiles (the modules XLA writes as it compiles, counted
in the folder `--xla_dump_to` names: this runs in a process of its own started with that flag), then the steady
time at those sizes. Beside them the fixes, on the same model: an input_signature with None on the axes that vary,
reduce_retracing, and padding to two bucket sizes under XLA (one compile per bucket, answers checked against the
unpadded call).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.inputs import make_inputs, to_tensors
from tfperf.deploy.loader import Subject
from tfperf.doctor.experiment import Context, Experiment, Section, child_command, flag
from tfperf.doctor.options import MIN_GAIN, OWN_RETRACES, Finding, Options, load_given, model_flags, model_parser
from tfperf.measure.stats import SLOWER
from tfperf.records.units import number

NEW_SIZES = 6  # new sizes per axis: the 6 samples a side an unpaired verdict needs
SEEN_BATCH = 8  # the batch size every way is first called at (not counted: the function exists and has run)
TABLE = "new shapes"
PLAIN, SIGNATURE, RELAXED, BUCKETS = ("tf.function", "tf.function, input_signature with None axes",
                                      "tf.function, reduce_retracing=True", "XLA, padded to 2 buckets")


def axis_sizes(subject: Subject, which: str = "all") -> dict[str, tuple[int, list[int]]]:
    """Per axis the size it is first seen at and the new sizes it is then called at: the batch (batch 1 on the
    free axes' default size), and the free axes together, a step of an eighth of their default size apart.
    `which`: "all", "batch" or "free" (the axes the model leaves free, without the batch)."""
    axes = {"batch": (SEEN_BATCH, list(range(1, NEW_SIZES + 1)))} if which != "free" else {}
    if subject.free and which != "batch":
        default = next(s for i in subject.inputs for s, d in zip(i.shape, i.declared) if d is None)
        step = max(1, default // 8)
        axes[subject.free_axes] = (default, [default + step * k for k in range(1, NEW_SIZES + 1)])
    return axes


def signature_text(subject: Subject) -> str:
    """The input_signature a user writes, in the structure the model takes: None on the batch and on every free
    axis (`[spec]` for one input, `[{"name": spec, ...}]` for a dict of them)."""
    specs = {i.name: f"tf.TensorSpec([None, {', '.join('None' if d is None else str(d) for d in i.declared)}], "
                     f"tf.{i.dtype})".replace(", ]", "]") for i in subject.inputs}

    def written(structure: Any) -> str:
        if isinstance(structure, Mapping):
            return "{" + ", ".join(f"{k!r}: {written(v)}" for k, v in structure.items()) + "}"
        if isinstance(structure, (list, tuple)):
            return "[" + ", ".join(written(v) for v in structure) + "]"
        return specs[structure]

    return f"[{written(subject.structure)}]"


PLURAL = {"batch": "batch sizes", "height and width": "heights and widths", "sequence length": "sequence lengths"}


def counted(n: int, what: str) -> str:
    """"1 trace", "6 traces"."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def pad_to(flat: Mapping[str, np.ndarray], subject: Subject, axis: str, size: int) -> dict[str, np.ndarray]:
    """Inputs padded with zeros up to `size` on the axis that varies (the rows, or every free axis)."""
    padded = {}
    for spec in subject.inputs:
        array = flat[spec.name]
        if axis == "batch":
            widths = [(0, size - array.shape[0])] + [(0, 0)] * (array.ndim - 1)
        else:
            widths = [(0, 0)] + [(0, size - s) if d is None else (0, 0) for s, d in zip(array.shape[1:], spec.declared)]
        padded[spec.name] = np.pad(array, widths)
    return padded


def cut_back(padded: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Padded answers cut to the unpadded answers' shapes (extra rows or positions dropped)."""
    return {k: np.asarray(v)[tuple(slice(0, s) for s in np.shape(reference[k]))] for k, v in padded.items()}


def relative_difference(reference: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> float:
    """The largest difference over the outputs, relative to each output's scale (at least 1)."""
    worst = 0.0
    for name, ref in reference.items():
        ref, out = np.asarray(ref, np.float64), np.asarray(got[name], np.float64)
        if ref.shape != out.shape:
            return float("inf")
        scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1.0)
        worst = max(worst, float(np.max(np.abs(out - ref))) / scale if ref.size else 0.0)
    return worst


def xla_modules(dump: Path) -> int:
    """How many modules XLA has compiled in this process: one `module_NNNN.*` set of files each."""
    return len({p.name.split(".")[0] for p in dump.glob("module_*")})


def call_styles(subject: Subject, exported: Path | None) -> dict[str, tuple[Callable[[dict], Any], Callable[[], int]]]:
    """Each way an application calls the model, made anew (no trace of an earlier axis serves it): (a call on
    inputs by name returning outputs by name, the number of traces so far)."""
    import tensorflow as tf

    styles: dict[str, tuple[Callable[[dict], Any], Callable[[], int]]] = {}
    if subject.kind == "keras" and subject.fresh is not None:
        for row, jit in (("predict()", False), ("predict(), compile(jit_compile=True)", True)):
            model = subject.fresh(None)  # its own predict_function: traces of one style do not serve another
            if jit:
                model.compile(jit_compile=True)
            styles[row] = (lambda flat, m=model: subject.head(m.predict(subject.pack(flat), verbose=0)),
                           lambda m=model: m.predict_function.experimental_get_tracing_count()
                           if m.predict_function is not None else 0)
    for row, jit in ((PLAIN, False), ("tf.function, jit_compile=True", True)):
        function = tf.function(subject.call, jit_compile=jit)
        styles[row] = (lambda flat, f=function: subject.head(f(subject.pack(to_tensors(flat)))),
                       function.experimental_get_tracing_count)
    if exported is not None:  # the export a server loads: its signature is a concrete function, it never traces
        signature = tf.saved_model.load(str(exported)).signatures["serving_default"]
        styles["SavedModel, tf.saved_model.load"] = (lambda flat: signature(**to_tensors(flat)), lambda: 0)
    elif subject.kind != "keras":  # a SavedModel given as it is: its own signature
        styles["the SavedModel's signature"] = (lambda flat: subject.head(subject.call(subject.pack(to_tensors(flat)))),
                                                lambda: 0)
    specs = [tf.TensorSpec((None, *i.declared), tf.as_dtype(i.dtype), name=i.name) for i in subject.inputs]
    names = [i.name for i in subject.inputs]
    by_position = lambda *flat: subject.call(subject.pack(dict(zip(names, flat))))  # noqa: E731
    for row, options in ((SIGNATURE, {"input_signature": specs}), (RELAXED, {"reduce_retracing": True})):
        function = tf.function(by_position, **options)
        styles[row] = (lambda flat, f=function: subject.head(f(*[tf.constant(flat[n]) for n in names])),
                       function.experimental_get_tracing_count)
    return styles


def measure_shapes(subject: Subject, options: Options, dump: Path, workdir: Path) -> dict[str, Any]:
    """Run every way and fix along every axis (in the process XLA dumps from): what `shapes` records, as JSON."""
    import tensorflow as tf

    from tfperf.deploy.errors import ExportError, ModelError, first_line
    from tfperf.deploy.layout import export_subject
    from tfperf.measure.timer import sync

    def timed(call: Callable[[], Any]) -> tuple[float, dict[str, np.ndarray]]:
        started = time.perf_counter()
        out = call()
        sync(out)
        took = time.perf_counter() - started
        return took, {k: np.asarray(v) for k, v in out.items()}

    names = [i.name for i in subject.inputs]
    specs = [tf.TensorSpec((None, *i.declared), tf.as_dtype(i.dtype), name=i.name) for i in subject.inputs]
    exported, unexported = None, None
    if subject.kind == "keras":
        try:
            exported = export_subject(subject, workdir / "exports", name="shapes").path
        except (ExportError, ModelError) as exc:  # the other ways are still measured; this one says why not
            unexported = f"the SavedModel export failed: {first_line(exc)}"
    found: dict[str, Any] = {"axes": []}
    for axis, (seen, sizes) in axis_sizes(subject, options.shape_axes).items():
        def inputs(size: int, axis=axis) -> dict[str, np.ndarray]:
            if axis == "batch":
                return make_inputs(subject, size, seed=options.seed, sample=options.sample)
            return make_inputs(subject.at(size), 1, seed=options.seed)

        buckets = sorted({sizes[len(sizes) // 2 - 1], sizes[-1]})
        xla = tf.function(lambda *flat: subject.call(subject.pack(dict(zip(names, flat)))), jit_compile=True,
                          input_signature=specs)

        def padded(flat: dict, size: int, axis=axis, xla=xla, buckets=buckets, seen=seen) -> dict:
            # The size every way has seen stays unpadded: the buckets are for the new sizes, as the other ways'
            # traces and compiles are counted over the new sizes only.
            to = size if size == seen else next(b for b in buckets if b >= size)
            return subject.head(xla(*[tf.constant(a) for a in pad_to(flat, subject, axis, to).values()]))

        ways = {row: (lambda flat, size, call=call: call(flat), traces)
                for row, (call, traces) in call_styles(subject, exported).items()}
        reference = ways[PLAIN][0]
        ways[BUCKETS] = (padded, xla.experimental_get_tracing_count)
        rows = [{"row": "SavedModel, tf.saved_model.load", "error": unexported}] if unexported else []
        for row, (invoke, traces) in ways.items():
            record: dict[str, Any] = {"row": row, "first_s": [], "steady_s": []}
            try:
                timed(lambda: invoke(inputs(seen), seen))  # the function exists and has run once
                traces_before, compiles_before = traces(), xla_modules(dump)
                worst = None
                for size in sizes:
                    flat = inputs(size)
                    took, out = timed(lambda: invoke(flat, size))
                    record["first_s"].append(took)
                    if row == BUCKETS:  # the padded answer, cut back, against the unpadded one
                        unpadded = {k: np.asarray(v) for k, v in reference(flat, size).items()}
                        worst = max(worst or 0.0, relative_difference(unpadded, cut_back(out, unpadded)))
                traces_after, compiles_after = traces(), xla_modules(dump)
                for size in sizes:  # every size seen now: what a call costs once nothing is new
                    flat = inputs(size)
                    record["steady_s"].append(timed(lambda: invoke(flat, size))[0])
                record.update(traces=traces_after - traces_before, compiles=compiles_after - compiles_before,
                              difference=worst, buckets=buckets if row == BUCKETS else None)
            except Exception as exc:  # noqa: BLE001  (a way this model cannot be called is named, not raised)
                record = {"row": row, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"}
            rows.append(record)
        found["axes"].append({"axis": axis, "seen": seen, "sizes": sizes, "rows": rows})
    return found


def child(argv: list[str]) -> int:
    """The child process: load the model, measure, and hand the result to the parent (`reply`)."""
    from tfperf.measure.processes import reply

    parser = model_parser("shapes")
    parser.add_argument("--xla-dump", required=True)  # where XLA writes what it compiles: counted as compiles
    parser.add_argument("--shape-axes", choices=["all", "batch", "free"], default="all")
    args = parser.parse_args(argv)
    subject, sample = load_given(args)
    options = Options(seed=args.seed, sample=sample, shape_axes=args.shape_axes)
    with tempfile.TemporaryDirectory(prefix="tfperf-shapes-") as workdir:
        print(reply(measure_shapes(subject, options, Path(args.xla_dump), Path(workdir))), flush=True)
    return 0


def child_argv(subject: Subject, options: Options, dump: Path) -> list[str]:
    """The command line of the process the experiment runs in."""
    return child_command("shapes", subject.source, "--xla-dump", str(dump), "--seed", str(options.seed),
                         "--shape-axes", options.shape_axes, *model_flags(subject, options))


@dataclasses.dataclass(frozen=True)
class Way:
    """One way of calling the model along one axis: what the new sizes caused, and what they cost."""

    row: str
    traces: int
    compiles: int
    first: Any  # Measurement: the first call at each new size
    steady: Any  # Measurement: a call at the same sizes once seen, paired with `first` by size
    new_size_cost: Any  # stats.Comparison: the first call against the steady one at the same size

    def describe(self) -> str:
        """"tf.function: 6 traces, 0 XLA compiles; the first calls 0.25 s in all, 41 ms each, against 0.90 ms once
        seen (45x slower, 95% CI ...)": means, since a few compiles among the new sizes are what the user pays."""
        c = self.new_size_cost
        judged = (f"{1 / c.ratio:.1f}x slower, 95% CI {1 / c.ci95[1]:.1f}-{1 / c.ci95[0]:.1f}x" if c.verdict == SLOWER
                  else c.verdict)
        n = len(self.first.samples_s)
        each = "/".join(f"{t * 1e3:.0f}" for t in self.first.samples_s)
        return (f"{self.row}: {counted(self.traces, 'trace')}, {counted(self.compiles, 'XLA compile')}; the first "
                f"calls {sum(self.first.samples_s):.2f} s in all ({each} ms), against "
                f"{sum(self.steady.samples_s) / n * 1e3:.2f} ms a call once seen ({judged})")


@dataclasses.dataclass(frozen=True)
class ShapesFound:
    """Every axis's ways, for the report's paragraph."""

    axes: tuple[tuple[str, tuple[int, ...], tuple[Way, ...]], ...]

    def describe(self) -> str:
        """The paragraph under "New shapes": per axis, what each way did at the new sizes."""
        lines = ["What the first call at a size not seen before costs, per way of calling the model (traces read "
                 "from each tf.function's tracing count, XLA compiles from the modules XLA wrote; each first call "
                 "judged against a call at the same size once seen):", ""]
        for axis, sizes, ways in self.axes:
            lines.append(f"- {len(sizes)} new {PLURAL[axis]} ({sizes[0]}-{sizes[-1]}):")
            lines += [f"    - {w.describe()}" for w in ways]
        return "\n".join(lines)

    def answer(self, findings: list[Finding]) -> str:
        """The answer to --shapes, said before the advice: per axis, whether the model's own call pays for new
        sizes (its first calls against a call once seen) and the fix measured fastest for the way that does."""
        from tfperf.measure.stats import FASTER

        lines = ["**New shapes** (what --shapes asked: is the first call slow at every new shape?):", ""]
        for axis, sizes, ways in self.axes:
            if not ways:
                continue
            own, table = ways[0], f"{TABLE}: {axis}"
            fixes = sorted((f for f in findings if f.section == table and f.agrees and f.comparison.verdict == FASTER),
                           key=lambda f: f.comparison.ratio, reverse=True)
            pays = own.traces + own.compiles >= min(OWN_RETRACES, len(sizes))  # as _findings ranks it
            said = f"- {len(sizes)} new {PLURAL[axis]} ({sizes[0]}-{sizes[-1]}), your own call: {own.describe()}. "
            best = fixes[0] if fixes else None
            if pays:
                said += "It pays for new sizes" + (f": **{best.row}** fixes it, its first calls "
                                                   f"{best.comparison.describe()} (in the advice)." if best else
                                                   "; none of the fixes measured was faster.")
            else:
                said += "It does not pay for new sizes" + (
                    f"; called through {best.baseline}, it does, and **{best.row}** fixes that: its first calls "
                    f"{best.comparison.describe()} (under Pitfalls)." if best else ".")
            lines.append(said)
        return "\n".join(lines + [""]) if len(lines) > 2 else ""


def shapes(subject: Subject, rec, options: Options, progress) -> tuple[list[Finding], dict, ShapesFound | None]:
    """Run the experiment in a process of its own (XLA dumps what it compiles there), record it, and find what
    fixes the cost of new sizes along each axis."""
    from tfperf.measure import Measurement, versus
    from tfperf.measure.processes import ChildError, run_child

    if not axis_sizes(subject, options.shape_axes):
        return [], {TABLE: "not measured: the model leaves no axis free but the batch (--shape-axes free)"}, None
    progress("new shapes")
    with tempfile.TemporaryDirectory(prefix="tfperf-xla-") as dump:
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
        try:
            found = run_child(child_argv(subject, options, Path(dump)), who="the new-shapes process",
                              env={**os.environ, "XLA_FLAGS": flags, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=1800)
        except ChildError as exc:
            return [], {TABLE: f"not measured: {exc}"}, None
    findings, skipped, axes = [], {}, []
    for axis in found["axes"]:
        table = f"{TABLE}: {axis['axis']}"
        sizes = tuple(axis["sizes"])
        ways = {}
        for r in axis["rows"]:
            if "error" in r:
                skipped[f"{table}: {r['row']}"] = r["error"]
                continue
            # One round per size: the first call and the steady call at the same size are a pair.
            first = Measurement(name=f"{r['row']}, first call", samples_s=tuple(r["first_s"]), rounds=len(sizes))
            steady = Measurement(name=f"{r['row']}, once seen", samples_s=tuple(r["steady_s"]), rounds=len(sizes))
            ways[r["row"]] = Way(r["row"], r["traces"], r["compiles"], first, steady,
                                 versus(steady, first, statistic="mean"))
            rec.add(table, r["row"], {"new_sizes": len(sizes), "traces": r["traces"], "compiles": r["compiles"],
                                      "first_call_ms": first.median_s * 1e3, "steady_ms": steady.median_s * 1e3,
                                      "total_first_calls_s": float(np.sum(r["first_s"])),
                                      "answers_differ_by": r.get("difference")},
                    primary="first_call_ms", lower_is_better=True, measurement=first,
                    comparison=ways[r["row"]].new_size_cost, versus_first=False)
        axes.append((axis["axis"], sizes, tuple(ways.values())))
        findings += _findings(subject, axis, {r["row"]: r for r in axis["rows"] if "error" not in r}, ways, table)
    return findings, skipped, ShapesFound(tuple(axes))


def _findings(subject: Subject, axis: Mapping[str, Any], measured: Mapping[str, Mapping[str, Any]],
              ways: Mapping[str, Way], table: str) -> list[Finding]:
    """Each fix against the way it fixes, by the first calls at the new sizes: input_signature and
    reduce_retracing against tf.function, bucket padding against tf.function with XLA. Ranked with the advice
    when the model's own way of being called traces or compiles at most new sizes, else a pitfall."""
    from tfperf.measure import versus

    sizes = axis["sizes"]
    own = next(iter(ways.values()))  # predict() for a Keras model, else the SavedModel's signature
    spec = signature_text(subject)
    xla = "tf.function, jit_compile=True"
    fixes = {SIGNATURE: (PLAIN, f"serve = tf.function(model, input_signature={spec})"),
             RELAXED: (PLAIN, "serve = tf.function(model, reduce_retracing=True)"),
             BUCKETS: (xla, f"serve = tf.function(model, jit_compile=True, input_signature={spec}); pad each input "
                            f"with zeros up to the next of a few sizes (here "
                            f"{', '.join(map(str, measured.get(BUCKETS, {}).get('buckets') or []))}) and cut the answer back")}
    found = []
    for row, (baseline, code) in fixes.items():
        if row not in ways or baseline not in ways:
            continue
        fix, base = ways[row], ways[baseline]
        cost = (f"{counted(fix.traces, 'trace')} and {counted(fix.compiles, 'XLA compile')} over {len(sizes)} new "
                f"sizes ({sizes[0]}-{sizes[-1]}) instead of {base.traces} and {base.compiles}, their first calls "
                f"{sum(fix.first.samples_s):.2f} s in all instead of {sum(base.first.samples_s):.2f} s; once seen "
                f"{np.mean(fix.steady.samples_s) * 1e3:.2f} ms a call against {np.mean(base.steady.samples_s) * 1e3:.2f} ms")
        agrees, note = True, f"the model's own {own.describe()}"
        difference = measured[row].get("difference")
        if difference is not None:
            agrees = difference <= 1e-4
            if agrees:
                cost += f"; the padded answers, cut back, agree with the unpadded ones within {difference:.1e} of their scale"
            else:
                note = (f"padding changes this model's answers by {number(difference, 2)} of their scale "
                        f"(zeros enter what "
                        f"it computes): it needs a mask, or buckets of the sizes it was trained at")
        found.append(Finding(table, row, baseline, versus(base.first, fix.first, threshold=MIN_GAIN, statistic="mean"),
                             code, cost, agrees=agrees, note=note,
                             pitfall=own.traces + own.compiles < min(OWN_RETRACES, len(sizes))))
    return found


def shapes_command(model: str) -> str:
    """The doctor command that asks this question alone."""
    return shlex.join(["tfperf", "doctor", model, "--quick", "--shapes", "--no-threads"])


def run(ctx: Context) -> Section:
    """The new-shapes experiment as a section of the report."""
    findings, skipped, found = shapes(ctx.subject, ctx.recorder, ctx.options, ctx.progress)
    # Asked by its own flag: its answer leads the report (before the best way to call, which every run answers).
    return Section(EXPERIMENT.name, findings, skipped, found,
                   lead=found.answer(findings) if found is not None else "",
                   detail=f"## New shapes\n\n{found.describe()}\n" if found is not None else "", leads=True)


EXPERIMENT = Experiment(
    name=TABLE, question="Why is the first call slow every time the image size, sequence length or batch size "
                         "changes?",
    run=run, budgeted=False, applies=lambda subject, options: options.shapes,
    flags=(flag("--shapes", action="store_true",
                help="why is the first call slow at every new shape: call the model at new batch sizes (and new "
                     "heights and widths, or lengths, where it leaves them free) through predict(), predict() with "
                     "XLA, tf.function, XLA and its SavedModel; traces and XLA compiles counted, the first call and "
                     "the steady time, beside input_signature, reduce_retracing and bucket padding (a process of its "
                     "own; about a minute for a small model)"),
           flag("--shape-axes", choices=["all", "batch", "free"],
                help="with --shapes (implied): vary only the batch, or only the axes the model leaves free (height "
                     "and width, or length), at about half the time of both (default: all)")))
