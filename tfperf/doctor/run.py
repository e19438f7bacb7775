"""tfperf doctor: the cookbook's experiments run on the user's own model, and advice ranked by measured gain.

A model is loaded from a Keras file, a SavedModel folder or `module:factory` (`load_subject`); its
inputs are read from it (sizes it leaves free from --input-shape, else 32; real values from --sample),
and synthetic inputs respect what it declares: dtypes, integer tokens within the embeddings' vocabulary, padding
where an embedding masks zeros, several inputs in lists or dicts. Then, each through tfperf.bench
(interleaved rounds, verdicts from confidence intervals): inference (predict(), model(x),
tf.function, XLA, LiteRT, ONNX Runtime) at batch 1 and over a batch sweep with outputs checked
against the model's; retracing; TensorFlow's thread pools, in processes of their own; given a loss,
training (steps_per_execution, jit_compile, mixed precision, batch sizes), on the user's own pipeline
with --data (then: is it input-bound, and what fixes it); the largest batch within a memory budget.
A profile pass traces the measured variants after their races (`profile`). `advise` turns the gains
whose interval clears the bar into advice ranked by the measured ratio; the rest is listed as "no
measurable gain" and not recommended.
"""

import time
from collections.abc import Callable
from pathlib import Path

from tfperf import extras
from tfperf.deploy.errors import first_line
from tfperf.deploy.inputs import make_inputs, to_tensors
from tfperf.deploy.loader import Subject
from tfperf.doctor.advice import Diagnosis
from tfperf.doctor.custom_step import custom_step, first_batch
from tfperf.doctor.effect import policy_effect
from tfperf.doctor.inference import inference, model_facts
from tfperf.doctor.memory import memory_budget
from tfperf.doctor.options import RECIPE, Finding, Options
from tfperf.doctor.pipeline import input_pipeline
from tfperf.doctor.profile import ProfilePass
from tfperf.doctor.retracing import retracing
from tfperf.doctor.shapes import shapes
from tfperf.doctor.threads import thread_batches, threads
from tfperf.doctor.devices import devices
from tfperf.doctor.keras_stacks import keras_stacks
from tfperf.doctor.lengths import length_sweep
from tfperf.doctor.loading import load_times
from tfperf.doctor.training import PLAIN_BATCH, training


def plan(subject: Subject, options: Options) -> list[str]:
    """The steps a run takes, in order (for a progress bar)."""
    batches = [b for b in options.batch_sizes if subject.fixed_batch in (None, b)] or [subject.fixed_batch]
    steps = ["the model", *[f"inference at batch {b}" for b in batches]]
    if subject.free_axes == "sequence length":
        steps.append("sequence length")
    if options.threads:
        steps += [f"threads at batch {b}" for b in thread_batches(subject, options)]
    if options.data is not None:
        steps += ["input pipeline", "input over a long run"]
    if options.train:
        steps.append("training")
    if options.step is not None:
        steps.append("your training step")
    if options.memory_budget:
        steps.append("memory budget")
    if options.shapes:
        steps.append("new shapes")
    if options.load_time:
        steps.append("load time")
    if options.keras_stacks:
        steps.append("keras stacks")
    if options.devices:
        steps.append("devices")
    return [*steps, "retracing"]


def diagnose(subject: Subject, options: Options, workdir: Path, *, traces: Path | None = None,
             progress: Callable[[str], None] = lambda step: None) -> Diagnosis:
    """Every experiment in turn, each skipped (and said so) once the budget is spent; the pitfalls
    (retracing) last, as what matters least to the model as it is used. The profile pass writes its
    traces under `traces` (default: workdir/traces)."""
    from tfperf.records.jsonl import Recorder

    started = time.perf_counter()
    args = {"model": subject.source, "batch_sizes": list(options.batch_sizes), "rounds": options.rounds,
            "train": options.train, "loss": options.loss, "seed": options.seed,
            "data": options.data.source if options.data is not None else None,
            "memory_budget": options.memory_budget}
    rec = Recorder(RECIPE, args)
    progress("the model")
    facts = model_facts(subject, quick=options.quick, sample=options.sample)
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    precision = []  # (what, effect.PolicyEffect): whether a mixed policy took effect, the model's first
    if subject.kind == "keras":
        try:
            precision.append(("the model as given", policy_effect(subject.model, subject.pack(to_tensors(
                make_inputs(subject, 2, seed=options.seed, sample=options.sample))))))
        except Exception as exc:  # a model that cannot be traced in a tf.function says so elsewhere too
            skipped["mixed precision check"] = f"{type(exc).__name__}: {first_line(exc)}"
    took = {"the model": time.perf_counter() - started}
    traces = traces or workdir / "traces"
    # The traces are read through XProf: without it (tfperf[profile]) the pass is said to be skipped, not tried.
    profiler = ProfilePass(traces, rec, facts) if options.profile and extras.installed("xprof") else None
    if options.profile and profiler is None:
        skipped["profile pass"] = f"not run: {extras.message('xprof', 'the profile pass')}"
    found: dict[str, object] = {}  # what a section finds beside its findings (an InputCheck, a BatchFit)

    def keep(name: str, result: tuple) -> tuple[list[Finding], dict]:
        found[name] = result[2]
        return result[0], result[1]

    sections: list[tuple[str, Callable[[], tuple[list[Finding], dict]]]] = [
        ("inference", lambda: keep("xla", inference(subject, rec, options, workdir, progress, facts, profiler)))]
    if subject.free_axes == "sequence length":  # a Transformer's cost grows with its requests' lengths
        sections.append(("sequence length", lambda: keep("sequence length", length_sweep(
            subject, rec, options, progress))))
    if options.threads:
        sections.append(("threads", lambda: threads(subject, rec, options, progress)))
    if options.data is not None:  # first: while training waits for data, a faster step gains nothing
        sections.append(("input pipeline", lambda: keep("input pipeline", input_pipeline(
            subject, rec, options, progress, profiler, facts, workdir))))
    if options.train:
        sections.append(("training", lambda: keep("training", training(subject, rec, options, progress, facts,
                                                                        profiler))
                         if not getattr(found.get("input pipeline"), "input_bound", False) else
                         ([], {"training": "not run: training waits for its data, so a faster step would wait "
                                           "longer; fix the input pipeline first, then run the doctor again"})))
    if options.step is not None:
        sections.append(("your training step", lambda: keep("your training step", custom_step(
            subject, rec, options, progress, first_batch(subject, options, PLAIN_BATCH)))))
    if options.memory_budget:
        sections.append(("memory budget", lambda: keep("memory budget", memory_budget(
            subject, options, progress, traces / "memory-budget"))))
    if options.shapes:  # asked for: before the budget's last minutes go to the pitfalls
        sections.append(("new shapes", lambda: keep("new shapes", shapes(subject, rec, options, progress))))
    if options.load_time:
        sections.append(("load time", lambda: keep("load time", load_times(subject, rec, options, workdir, progress))))
    if options.keras_stacks:
        sections.append(("keras stacks", lambda: keep("keras stacks", keras_stacks(subject, rec, options, workdir,
                                                                                   progress))))
    if options.devices:
        sections.append(("devices", lambda: keep("devices", devices(subject, rec, options, workdir, progress))))
    sections.append(("retracing", lambda: (progress("retracing"), retracing(subject, rec, options))[1]))
    for name, run in sections:
        spent = time.perf_counter() - started
        if options.budget_s is not None and spent > options.budget_s:
            skipped[name] = f"not run: the --budget of {options.budget_s:.0f} s was spent ({spent:.0f} s)"
            continue
        began = time.perf_counter()
        section_findings, left_out = run()
        took[name] = time.perf_counter() - began
        findings += section_findings
        skipped.update(left_out)
    if profiler is not None:
        skipped.update(profiler.failed)
    precision += found["training"][0] if "training" in found else []
    return Diagnosis(subject, rec, findings, skipped, facts, time.perf_counter() - started, took,
                     profiles=profiler.found if profiler else [], peaks=profiler.peaks if profiler else {},
                     profile_s=profiler.took_s if profiler else 0.0, input_check=found.get("input pipeline"),
                     batch_fit=found.get("memory budget"), lengths=found.get("sequence length"),
                     shapes=found.get("new shapes"), load_times=found.get("load time"),
                     stacks=found.get("keras stacks"), devices=found.get("devices"), xla=found.get("xla"),
                     precision=precision, kernels=found["training"][1] if "training" in found else [],
                     overflow=found.get("your training step"))


