"""`tfperf doctor MODEL`: the command around tfperf.doctor (flags, progress, the terminal summary)."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from tfperf import extras, flags
from tfperf.flags import UserError
from tfperf.flags import latency, percentile

QUICK_GOAL_S = 180  # the goal: --quick on a small model within 3 minutes on a 2-core machine


def batch_sizes(text: str) -> list[int]:
    """A comma-separated list of batch sizes, each at least 1."""
    try:
        sizes = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise argparse.ArgumentTypeError(f"must be batch sizes such as 1,32,256, got {text!r}")
    return sorted(set(sizes))


def check_batches_fit(subject, batches, train_examples: int = 0) -> None:
    """A UserError when the largest batch's inputs alone (or the training rows') would take more than half the
    memory this process can take: asked for before anything is allocated, not found as a MemoryError."""
    import numpy as np

    free = flags.available_memory()
    row = sum(int(np.prod(i.shape, dtype=np.float64)) * (8 if i.dtype == "string" else np.dtype(i.dtype).itemsize)
              for i in subject.inputs)
    rows = max(max(batches), train_examples)
    if free is not None and rows * row > free / 2:
        fits = max(int(free / 2 // max(row, 1)), 0)
        raise UserError(f"a batch of {rows:,} rows of {subject.name}'s inputs takes {rows * row / 2**30:,.1f} GB "
                        f"before the model computes anything, more than half the {free / 2**30:,.1f} GB this process "
                        f"can take: give --batch-sizes at most {fits:,}")


def add_command(sub) -> None:
    """Add `doctor` to the `tfperf` subcommands."""
    p = sub.add_parser("doctor", help="run the cookbook's experiments on your own model: advice ranked by measured gain",
                       description="Measure what makes YOUR model fast: predict() vs model(x) vs tf.function vs XLA "
                                   "vs LiteRT and ONNX Runtime over batch sizes, retracing, thread pools, and with "
                                   "--train --loss, training options. Where a switch does not help, why: the "
                                   "layer XLA cannot compile (bisected, the rest compiled and timed), whether a "
                                   "mixed policy took effect, and the kernels a slower mixed row spends more in. "
                                   "Verdicts come from 95%% intervals of interleaved rounds; only significant gains "
                                   "are advised.")
    p.add_argument("model", help="a .keras file, a SavedModel folder, or module:factory (a function returning a "
                                 "Keras model, for custom layers)")
    p.add_argument("--input-shape", action="append", metavar="[NAME=]D,D",
                   help="sizes (without the batch axis) to make, check and time inputs at where the model leaves "
                          "them free (default 32); exports keep such axes free; repeat per input")
    p.add_argument("--sample", metavar="FILE.npz", help="real inputs, arrays named after the model's inputs "
                                                         "(and 'y', targets for --train)")
    p.add_argument("--train", action="store_true", help="also run the training experiments (needs --loss)")
    p.add_argument("--loss", help="Keras loss name for --train, e.g. sparse_categorical_crossentropy")
    p.add_argument("--from-logits", action="store_true", help="the model outputs logits (for the --loss)")
    p.add_argument("--data", metavar="MODULE:FUNCTION",
                   help="train on your own input pipeline: a function returning a tf.data.Dataset of (inputs, "
                        "targets) batches; doctor then says whether training waits for data and measures fixes")
    p.add_argument("--long-run", type=flags.non_negative_int, metavar="SECONDS",
                   help="with --data: read your pipeline alone this long to see whether it slows down as it goes "
                        "(default 30; --quick 10; 0 skips it); the same examples are also raced from tensors, a "
                        "Python generator and TFRecord files")
    p.add_argument("--train-step", metavar="MODULE:FUNCTION",
                   help="your own training loop's step: a function step(model, optimizer, batch) that trains one "
                        "batch (inputs, targets) and returns the loss (needs --loss for the targets, or --data); timed "
                        "eagerly, in tf.function, with XLA and under mixed precision, then run under mixed_float16 "
                        "to find the first non-finite loss, gradient and variable (about 20 s for a small model)")
    p.add_argument("--memory-budget", type=flags.byte_size, metavar="SIZE",
                   help="find the largest batch whose inference call (with --train: training step) stays within "
                        "SIZE of memory (e.g. 2GB), by trying batch sizes")
    p.add_argument("--no-profile", action="store_true",
                   help="skip the profile pass (traces of the measured variants, read with XProf, in OUT/traces)")
    p.add_argument("--batch-sizes", type=batch_sizes, help="batch sizes to sweep (default 1,32,256; --quick 1,64)")
    p.add_argument("--quick", action="store_true", help=f"fewer rounds and sizes: a small model in under "
                                                        f"{QUICK_GOAL_S // 60} minutes on 2 cores")
    p.add_argument("--budget", type=flags.positive_float, metavar="SECONDS",
                   help="skip the experiments that would start after this many seconds (default: none; "
                        f"--quick {QUICK_GOAL_S - 30})")
    p.add_argument("--no-threads", action="store_true", help="skip the thread-pool sweep (it starts processes)")
    p.add_argument("--shapes", action="store_true",
                   help="why is the first call slow at every new shape: call the model at new batch sizes (and new "
                        "heights and widths, or lengths, where it leaves them free) through predict(), predict() with "
                        "XLA, tf.function, XLA and its SavedModel; traces and XLA compiles counted, the first call and "
                        "the steady time, beside input_signature, reduce_retracing and bucket padding (a process of "
                        "its own; about a minute for a small model)")
    p.add_argument("--shape-axes", choices=["all", "batch", "free"],
                   help="with --shapes (implied): vary only the batch, or only the axes the model leaves free "
                        "(height and width, or length), at about half the time of both (default: all)")
    p.add_argument("--load-time", action="store_true",
                   help="why does my model take so long to load: a cold start (import, load, first call) of each form "
                        "it can take (.keras, .h5, SavedModel through tf.saved_model.load and Keras, LiteRT, ONNX), "
                        "each in fresh processes taking turns, 6 rounds (about 4 s a process where TensorFlow is imported)")
    p.add_argument("--keras-stacks", action="store_true",
                   help="why is my model slower on Keras 3: the model under Keras 2 (tf_keras), Keras 3 on TensorFlow "
                        "and Keras 3 on JAX, each in its own process from the same weights (needs --loss): first "
                        "epoch, fit throughput, predict() and model(x), and one training step split into forward, "
                        "loss, gradient and optimizer update, each timed on its own")
    p.add_argument("--devices", type=flags.positive_int, metavar="N",
                   help="why do N devices not give Nx: the model trained under MirroredStrategy on 1 and N devices "
                        "(GPUs where there are N, else logical CPU devices), each in its own process from the same "
                        "weights (needs --loss): fit throughput, and one step split into compute, the all-reduce "
                        "left exposed and the input wait, with the global batch and learning rate scaling said")
    p.add_argument("--serve", action="store_true",
                   help="also answer the serving question: requests/s within --latency-budget, and the configuration "
                        "(runtime, threads, instances, batching) that gives the most (tfperf load's search)")
    p.add_argument("--latency-budget", type=latency, metavar="TIME",
                   help="with --serve: the latency the --percentile must stay within (default 10ms)")
    p.add_argument("--percentile", type=percentile, default=99.0, help="with --serve: which percentile (default 99)")
    p.add_argument("--hosts", type=flags.positive_int, metavar="N",
                   help="with --train: predict the model's speedup on N hosts over --link (scaling.json in --out)")
    p.add_argument("--link", metavar="RATE[,RTT]", default=None,
                   help="with --hosts: the link between hosts, e.g. 10gbit or 1gbit,200us (round trip; default 100us)")
    p.add_argument("--out", help="folder for report.md and records (default doctor/<model name>/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--signature", help="the SavedModel signature to diagnose (default serving_default, serve, or "
                                       "the only one)")
    p.add_argument("--trust", action="store_true",
                   help="load a model that would run code on load (Keras lambdas, ops off the allowlist) knowingly")
    # Internal: a thread-sweep process (its thread pools are fixed when TensorFlow starts).
    p.add_argument("--role", choices=["threads", "shapes"], help=argparse.SUPPRESS)
    p.add_argument("--xla-dump", help=argparse.SUPPRESS)  # the shapes process: where XLA writes what it compiles
    p.add_argument("--intra", type=flags.positive_int, help=argparse.SUPPRESS)
    p.add_argument("--inter", type=flags.positive_int, help=argparse.SUPPRESS)
    p.add_argument("--child-memory-limit", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_doctor)


def progress_bar(total: int):
    """A progress line on stderr per step: a bar, the step's name and the time so far."""
    started, done = time.perf_counter(), [0]

    def step(name: str) -> None:
        done[0] += 1
        filled = round(20 * min(done[0], total) / total)
        print(f"doctor [{'#' * filled}{'.' * (20 - filled)}] {min(done[0], total)}/{total} {name} "
              f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    return step


def serving_answer(subject, args: argparse.Namespace, sample, out: Path) -> str:
    """`tfperf load`'s answer for the model, in out/, as a paragraph with the command that reproduces it."""
    import shlex

    from tfperf.deploy.inputs import make_inputs
    from tfperf.serving.pipeline import answer, export_runtimes
    from tfperf.serving.runtimes import RUNTIMES
    from tfperf.serving.configs import one_row_requests
    from tfperf.serving.report import describe
    from tfperf.deploy.commands import loading_flags
    from tfperf.serving.search import Budget

    def say(what: str) -> None:
        print(f"doctor: serving: {what}", file=sys.stderr, flush=True)

    budget = Budget(args.latency_budget or 0.010, args.percentile)
    given = ["--sample", args.sample] if args.sample else []
    shapes = loading_flags(args)
    exports, commands, failed = export_runtimes(subject, out, RUNTIMES, sample, [*given, *shapes], say)
    requests = one_row_requests(make_inputs(subject, 64, seed=args.seed, sample=sample))
    found = answer(subject.source, exports, requests, out, budget=budget, quick=args.quick, commands=commands,
                   failed=failed, say=say)
    reproduce = shlex.join(["tfperf", "load", subject.source, "--latency-budget",
                            f"{budget.latency_s * 1e3:g}ms", "--percentile", f"{budget.percentile:g}",
                            *(["--input", args.sample] if args.sample else []), *shapes,
                            *(["--quick"] if args.quick else [])])
    return describe(found, reproduce, out / "report.md")


def hosts_answer(diagnosis, subject, hosts: int, link_bits_per_s: float, rtt_s: float | None, out: Path) -> str:
    """The model's speedup on `hosts` hosts over the link, from plain fit's step measured here: scaling.json in
    `out`, and the paragraph that says it."""
    from tfperf.doctor import scaling
    from tfperf.models import gradient_readiness

    plain = next((r for r in diagnosis.recorder.table("training") if r["row"].startswith("plain fit")), None)
    if plain is None:
        return "The speedup on hosts was not predicted: plain fit's training step was not measured."
    batch = int(plain["row"].split("batch ")[1].rstrip(")"))
    weights = subject.model.trainable_weights
    gradient_bytes = int(sum(4 * int(np.prod(w.shape)) for w in weights))  # float32 gradients, whatever the policy
    found = scaling.predict(hosts=hosts, batch=batch, samples_per_s=plain["metrics"]["samples_per_s"],
                            gradient_bytes=gradient_bytes, link_bits_per_s=link_bits_per_s, rtt_s=rtt_s,
                            readiness=gradient_readiness(subject.model))
    scaling.write(found, out)
    return scaling.describe(found)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Diagnose a model: measure, write out/report.md and records, print the advice."""
    from tfperf import doctor
    from tfperf.deploy.errors import InputError, ModelError
    from tfperf.deploy.inputs import check_runs, make_inputs, read_sample
    from tfperf.deploy.loader import load_subject, parse_input_shapes
    from tfperf.doctor.threads import serve_thread_timers
    from tfperf.doctor.pipeline import load_data
    from tfperf.doctor.training import training_loss

    try:
        if args.role == "threads":
            args.batch_sizes = args.batch_sizes or [1]
            return serve_thread_timers(args)
        if args.role == "shapes":
            from tfperf.doctor.shapes import serve_shapes

            return serve_shapes(args)
        if args.train and not args.loss:
            raise UserError("--train needs --loss (a Keras loss name such as sparse_categorical_crossentropy)")
        if args.loss and not (args.train or args.keras_stacks or args.train_step or args.devices):
            raise UserError("--loss is for the training experiments: add --train (or --keras-stacks, --train-step, "
                            "--devices N)")
        if args.train_step and not args.loss:
            raise UserError("--train-step runs your step on the doctor's batches: give --loss (a Keras loss name, for "
                            "the targets it makes, such as sparse_categorical_crossentropy)")
        if args.keras_stacks and not args.loss:
            raise UserError("--keras-stacks trains the model under each Keras: give --loss (a Keras loss name such as "
                            "sparse_categorical_crossentropy)")
        if args.devices and not args.loss:
            raise UserError(f"--devices {args.devices} trains the model under MirroredStrategy: give --loss (a Keras "
                            "loss name such as sparse_categorical_crossentropy)")
        if args.devices == 1:
            raise UserError("--devices 1 has nothing to compare with one device: give 2 or more")
        if args.data and not (args.train or args.train_step):
            raise UserError("--data is what the training experiments train on: add --train --loss LOSS (or "
                            "--train-step)")
        if args.latency_budget and not args.serve:
            raise UserError("--latency-budget is for the serving question: add --serve")
        if (args.hosts is None) != (args.link is None):
            raise UserError("--hosts and --link go together: the speedup on N hosts over a link")
        if args.hosts and not args.train:
            raise UserError("--hosts predicts training across hosts from a measured training step: add --train "
                            "--loss LOSS")
        link_bits = rtt = None
        if args.link:
            from tfperf.doctor.scaling import parse_link

            try:
                link_bits, rtt = parse_link(args.link)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        # Optional parts an asked-for experiment needs are checked before anything is loaded or measured.
        if args.memory_budget:
            extras.require("profile", "--memory-budget (it reads each try's peak from a trace)")
        if args.serve:
            extras.require("serve", "--serve")
            extras.require("loadgen", "--serve")
        free = flags.available_memory()
        if args.memory_budget and free and args.memory_budget > free:
            raise UserError(f"--memory-budget {args.memory_budget / 2**30:.1f} GB is more than the "
                            f"{free / 2**30:.1f} GB of memory available now: give at most that")
        shapes = parse_input_shapes(args.input_shape or [])
        sample = read_sample(args.sample) if args.sample else None
        subject = load_subject(args.model, input_shapes=shapes, trust=args.trust, signature=args.signature)
        out = Path(args.out) if args.out else Path("doctor") / subject.name
        if (out / f"{doctor.RECIPE}.jsonl").exists():
            raise UserError(f"{out} already holds a doctor run: pass another --out (then `tfperf compare "
                            f"{out}/{doctor.RECIPE}.jsonl <new>/{doctor.RECIPE}.jsonl`), or remove it")
        options = doctor.Options(
            batch_sizes=tuple(args.batch_sizes or ((1, 64) if args.quick else (1, 32, 256))),
            rounds=6 if args.quick else 10, min_time_s=0.15 if args.quick else 0.5, train=args.train,
            loss=args.loss, from_logits=args.from_logits, train_examples=512 if args.quick else 2048,
            threads=not args.no_threads, quick=args.quick,
            budget_s=args.budget or (QUICK_GOAL_S - 30 if args.quick else None), seed=args.seed, sample=sample,
            sample_path=args.sample, trust=args.trust, input_shapes=shapes, profile=not args.no_profile,
            memory_budget=args.memory_budget, shapes=args.shapes or bool(args.shape_axes),
            shape_axes=args.shape_axes or "all", load_time=args.load_time,
            keras_stacks=args.keras_stacks, devices=args.devices,
            long_run_s=args.long_run if args.long_run is not None else 10 if args.quick else 30)
        # What can be refused is refused before anything is measured or written.
        if args.loss:
            loss = training_loss(args.loss, args.from_logits)
            if args.data:
                options.data = load_data(args.data, subject, loss, options.train_examples)
        if args.train_step:
            from tfperf.doctor.custom_step import check_step, first_batch, load_step
            from tfperf.doctor.training import PLAIN_BATCH

            options.step, options.step_source = load_step(args.train_step), args.train_step
            check_step(subject, options, first_batch(subject, options, PLAIN_BATCH))
        check_batches_fit(subject, options.batch_sizes, options.train_examples if args.train else 0)
        check_runs(subject, make_inputs(subject, 2, seed=args.seed, sample=sample))
        created = not out.exists()
        workdir = out / ".work"  # conversions happen here: nothing is written outside --out
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            plan = doctor.plan(subject, options)
            print(f"doctor: {subject.source}: {len(plan)} steps: {', '.join(plan)}", file=sys.stderr)
            diagnosis = doctor.diagnose(subject, options, workdir, traces=out / "traces",
                                        progress=progress_bar(len(plan)))
            if args.serve:
                diagnosis.serving = serving_answer(subject, args, sample, out / "serving")
            if args.hosts:
                diagnosis.scaling = hosts_answer(diagnosis, subject, args.hosts, link_bits, rtt, out)
            report = doctor.write_report(diagnosis, out, goal_s=QUICK_GOAL_S if args.quick else None)
        except BaseException:
            if created:  # a run that failed leaves nothing behind
                shutil.rmtree(out, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    except (doctor.DoctorError, ModelError, InputError) as exc:
        raise UserError(str(exc)) from None
    print(doctor.summary(diagnosis, goal_s=QUICK_GOAL_S if args.quick else None))
    print(f"\nreport: {report}\nrecords: {out / (doctor.RECIPE + '.jsonl')} (compare two runs with tfperf compare)")
    if diagnosis.profiles:
        print(f"traces: {out / 'traces'} (tensorboard --logdir {out / 'traces'}, or XProf)")
    return 0
