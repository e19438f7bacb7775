"""Serving under load: "how many requests/s can my model serve within a p99 of 10 ms, and how?"

`tfperf load`'s search run on the model (runtime, threads, instances, batching), its report in OUT/serving/, and a
paragraph with the command that reproduces it.
"""

from __future__ import annotations

import dataclasses
import shlex

from tfperf import extras
from tfperf.doctor.experiment import Context, Experiment, Section, flag
from tfperf.doctor.options import model_flags
from tfperf.flags import latency, percentile


def run(ctx: Context) -> Section:
    """`tfperf load`'s answer for the model, in out/serving/."""
    from tfperf.deploy.inputs import make_inputs
    from tfperf.serving.configs import one_row_requests
    from tfperf.serving.pipeline import answer, export_runtimes
    from tfperf.serving.report import describe
    from tfperf.serving.runtimes import RUNTIMES
    from tfperf.serving.search import Budget

    subject, options, out = ctx.subject, ctx.options, ctx.out / "serving"
    say = lambda what: ctx.say(f"serving: {what}")  # noqa: E731
    budget = Budget(options.latency_budget_s, options.percentile)
    given = ["--sample", options.sample_path] if options.sample_path else []
    shapes = model_flags(subject, dataclasses.replace(options, sample_path=None))  # how the model was loaded
    exports, commands, failed = export_runtimes(subject, out, RUNTIMES, options.sample, [*given, *shapes], say)
    requests = one_row_requests(make_inputs(subject, 64, seed=options.seed, sample=options.sample))
    found = answer(subject.source, exports, requests, out, budget=budget, quick=options.quick, commands=commands,
                   failed=failed, say=say)
    reproduce = shlex.join(["tfperf", "load", subject.source, "--latency-budget", f"{budget.latency_s * 1e3:g}ms",
                            "--percentile", f"{budget.percentile:g}",
                            *(["--input", options.sample_path] if options.sample_path else []), *shapes,
                            *(["--quick"] if options.quick else [])])
    text = describe(found, reproduce, out / "report.md")
    return Section(EXPERIMENT.name, found=found, answer=f"\n## Serving under load\n\n{text}")


def _needs_serve(args) -> str | None:
    if args.latency_budget and not args.serve:
        return "--latency-budget is for the serving question: add --serve"
    if args.serve:  # what it needs is said before anything is loaded
        absent = [*extras.missing("serve"), *extras.missing("loadgen")]
        if absent:
            return extras.message(absent[0], "--serve")
    return None


EXPERIMENT = Experiment(
    name="serving", question="How many requests/s can my model serve within a p99 of 10 ms, and with which runtime, "
                             "threads and batching?",
    run=run, applies=lambda subject, options: options.serve, budgeted=False,
    flags=(flag("--serve", action="store_true",
                help="also answer the serving question: requests/s within --latency-budget, and the configuration "
                     "(runtime, threads, instances, batching) that gives the most (tfperf load's search)"),
           flag("--latency-budget", type=latency, metavar="TIME",
                help="with --serve: the latency the --percentile must stay within (default 10ms)"),
           flag("--percentile", type=percentile, default=99.0, help="with --serve: which percentile (default 99)")),
    rules=(_needs_serve,))
