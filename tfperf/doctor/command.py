"""`tfperf doctor MODEL`: the command around tfperf.doctor (flags, progress, the terminal summary)."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from tfperf import flags
from tfperf.doctor.experiment import refusals
from tfperf.doctor.options import FLAGS_READ, QUICK, QUICK_GOAL_S, Options
from tfperf.doctor import registry
from tfperf.flags import UserError


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
    """Add `doctor` to the `tfperf` subcommands: its own flags, then each experiment's."""
    p = sub.add_parser("doctor", help="run the cookbook's experiments on your own model: advice ranked by measured gain",
                       description="Measure what makes YOUR model fast: predict() vs model(x) vs tf.function vs XLA "
                                   "vs LiteRT and ONNX Runtime over batch sizes, retracing, thread pools, and with "
                                   "--train --loss, training options. Where a switch does not help, why: the "
                                   "layer XLA cannot compile (bisected, the rest compiled and timed), whether a "
                                   "mixed policy took effect, and the kernels a slower mixed row spends more in. "
                                   "Verdicts come from 95%% intervals of interleaved rounds; only significant gains "
                                   "are advised.")
    p.add_argument("model", nargs="?", help="a .keras file, a SavedModel folder, or module:factory (a function "
                                            "returning a Keras model, for custom layers)")
    p.add_argument("--from", dest="from_watch", metavar="DIR",
                   help="the --out folder of `tfperf watch --capture -- python train.py`: your first fit()'s model, "
                        "loss and rows as it kept them, searched with --train (instead of MODEL)")
    p.add_argument("--input-shape", action="append", metavar="[NAME=]D,D",
                   help="sizes (without the batch axis) to make, check and time inputs at where the model leaves "
                          "them free (default 32); exports keep such axes free; repeat per input")
    p.add_argument("--sample", metavar="FILE.npz", help="real inputs, arrays named after the model's inputs "
                                                         "(and 'y', targets for --train)")
    p.add_argument("--no-profile", action="store_true",
                   help="skip the profile pass (traces of the measured variants, read with XProf, in OUT/traces)")
    sizes = lambda given: ",".join(map(str, given))  # noqa: E731
    p.add_argument("--batch-sizes", type=batch_sizes, help=f"batch sizes to sweep (default "
                                                            f"{sizes(Options.batch_sizes)}; --quick "
                                                            f"{sizes(QUICK['batch_sizes'])})")
    p.add_argument("--quick", action="store_true", help=f"fewer rounds and sizes: a small model in under "
                                                        f"{QUICK_GOAL_S // 60} minutes on 2 cores")
    p.add_argument("--budget", type=flags.positive_float, metavar="SECONDS",
                   help=f"skip the experiments that would start after this many seconds (default: none; --quick "
                        f"{QUICK['budget_s']:.0f})")
    p.add_argument("--out", help="folder for report.md and records (default doctor/<model name>/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--signature", help="the SavedModel signature to diagnose (default serving_default, serve, or "
                                       "the only one)")
    p.add_argument("--trust", action="store_true",
                   help="load a model that would run code on load (Keras lambdas, ops off the allowlist) knowingly")
    for experiment in registry.EXPERIMENTS:
        for each in experiment.flags:
            each.add_to(p)
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


def from_watch(args: argparse.Namespace) -> None:
    """`--from DIR`: the model, loss, logits and rows a watch kept, put where MODEL and the flags would put them
    (flags the user gave win; the report goes to DIR/doctor unless --out says)."""
    from tfperf.watch.command import captured_in, doctor_command

    if args.model:
        raise UserError(f"give a model or --from {args.from_watch}, not both: --from searches the model the watch "
                        f"kept")
    captured, kept = captured_in(args.from_watch)
    cmd, why = doctor_command(captured, kept, Path(args.from_watch))
    if cmd is None:
        raise UserError(f"--from {args.from_watch}: {why}")
    args.model, args.train = str(kept / captured["model"]), True
    args.loss = args.loss or captured["loss"]
    args.from_logits = args.from_logits or bool(captured.get("from_logits"))
    args.train_batch = args.train_batch or captured.get("batch_size")
    args.epoch_examples = args.epoch_examples or captured.get("epoch_examples")
    if not args.sample and captured.get("sample"):
        args.sample = str(kept / captured["sample"])
    args.out = args.out or str(Path(args.from_watch) / "doctor")


def checked_options(args: argparse.Namespace):
    """The model and the options the flags ask for, each refusal in one line before anything is measured:
    (subject, options, out)."""
    from tfperf import doctor
    from tfperf.deploy.inputs import check_runs, make_inputs, read_sample
    from tfperf.deploy.loader import load_subject, parse_input_shapes

    if args.from_watch:
        from_watch(args)
    elif not args.model:
        raise UserError("give the model to diagnose (a .keras file, a SavedModel folder or module:factory), or "
                        "--from DIR, the folder of a `tfperf watch --capture` run")
    refused = refusals([rule for experiment in registry.EXPERIMENTS for rule in experiment.rules], args)
    if refused:
        raise UserError(refused[0])
    shapes = parse_input_shapes(args.input_shape or [])
    sample = read_sample(args.sample) if args.sample else None
    subject = load_subject(args.model, input_shapes=shapes, trust=args.trust, signature=args.signature)
    out = Path(args.out) if args.out else Path("doctor") / subject.name
    if (out / f"{doctor.RECIPE}.jsonl").exists():
        raise UserError(f"{out} already holds a doctor run: pass another --out (then `tfperf compare "
                        f"{out}/{doctor.RECIPE}.jsonl <new>/{doctor.RECIPE}.jsonl`), or remove it")
    asked = {f.dest: getattr(args, f.dest) for e in registry.EXPERIMENTS for f in e.flags if f.dest not in FLAGS_READ}
    options = doctor.prepare(subject, Options.from_args(args, sample=sample, input_shapes=shapes, asked=asked))
    check_batches_fit(subject, options.batch_sizes, options.train_examples if options.train else 0)
    check_runs(subject, make_inputs(subject, 2, seed=options.seed, sample=sample))
    return subject, options, out


def process_start() -> float:
    """When this process started, on time.perf_counter()'s clock (now, where the system does not say)."""
    import psutil

    try:
        return time.perf_counter() - max(0.0, time.time() - psutil.Process().create_time())
    except psutil.Error:
        return time.perf_counter()


def cmd_doctor(args: argparse.Namespace) -> int:
    """Diagnose a model: measure, write out/report.md and records, print the advice."""
    from tfperf import doctor
    from tfperf.deploy.errors import InputError, ModelError

    # The time the report says: the process's, TensorFlow's import included, where it runs this command line alone
    # (not when main() is called from a longer process: a test's, a notebook's).
    started = process_start() if getattr(args, "own_process", False) else time.perf_counter()
    # A --budget given is the goal the user set (MobileNetV2 with --quick --budget 420 read "goal for --quick: under
    # 180 s: NOT met"); else --quick's.
    budget = getattr(args, "budget", None)
    goal = (budget, f"--budget {budget:g}") if budget else (QUICK_GOAL_S, "--quick") if args.quick else None
    try:
        subject, options, out = checked_options(args)
        created = not out.exists()
        workdir = out / ".work"  # conversions happen here: nothing is written outside --out
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            plan = doctor.plan(subject, options)
            print(f"doctor: {subject.source}: {len(plan)} steps: {', '.join(plan)}", file=sys.stderr)
            diagnosis = doctor.diagnose(subject, options, workdir, traces=out / "traces", out=out,
                                        progress=progress_bar(len(plan)),
                                        say=lambda what: print(f"doctor: {what}", file=sys.stderr, flush=True),
                                        since=started)
            report = doctor.write_report(diagnosis, out, goal=goal)
        except BaseException:
            if created:  # a run that failed leaves nothing behind
                shutil.rmtree(out, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    except (doctor.DoctorError, ModelError, InputError) as exc:
        raise UserError(str(exc)) from None
    print(doctor.summary(diagnosis, goal=goal))
    print(f"\nreport: {report}\nrecords: {out / (doctor.RECIPE + '.jsonl')} (compare two runs with tfperf compare)")
    if diagnosis.profiles:
        print(f"traces: {out / 'traces'} (tensorboard --logdir {out / 'traces'}, or XProf)")
    if diagnosis.partial:
        print(f"tfperf doctor: {diagnosis.partial}; the partial report: {report}", file=sys.stderr)
    return diagnosis.exit_code
