"""The `tfperf` command: run the cookbook, build its report, compare runs, train a cookbook net; deploy
(tfperf.deploy.commands), diagnose (tfperf.doctor.command) and load-test (tfperf.serving.command) models."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfperf import __version__, extras, flags
from tfperf.records.compare_command import CALIBRATION, calibration_at
from tfperf.watch import command as watch_command
from tfperf.flags import UserError

if TYPE_CHECKING:
    from tfperf.recipe import Declaration

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


def recipe_declarations(only: Sequence[str] = (), folder: Path = RECIPES_DIR) -> list[Declaration]:
    """The recipes of a folder (the cookbook's by default) in the order they declare (the report's order);
    `only` picks some by name."""
    if not Path(folder).is_dir():
        if Path(folder) == RECIPES_DIR:  # installed from a wheel: the recipes live in the cookbook's repository
            raise UserError("the cookbook's recipes are not part of the installed package: run this from a clone "
                            "of tfperf's repository, or give --recipes DIR")
        raise UserError(f"no such folder of recipes: {folder}")
    from tfperf.recipe import declarations  # NumPy, through the records: not before `tfperf watch`'s program

    try:
        found = {d.name: d for d in declarations(folder)}
    except ValueError as exc:  # a file that does not declare a recipe as the harness needs
        raise UserError(str(exc)) from None
    unknown = sorted(set(only) - set(found))
    if unknown:
        raise UserError(f"unknown recipe {', '.join(unknown)}: choose from {', '.join(found)}")
    return [found[n] for n in only] if only else list(found.values())


def recipe_order(folder: Path = RECIPES_DIR) -> list[str]:
    """Recipe names in report order."""
    return [d.name for d in recipe_declarations(folder=folder)]


def recipe_command(recipe: Declaration, out: Path, quick: bool) -> list[str]:
    """How the main job starts one recipe: through its declared launcher (found beside Python), if any."""
    launcher = [str(Path(sys.executable).parent / recipe.launcher[0]), *recipe.launcher[1:]] if recipe.launcher else []
    cmd = [*launcher, sys.executable, str(recipe.path), "--out", str(out)]
    return cmd + ["--quick"] if quick else cmd


def repeat_dir(out: Path, run: int) -> Path:
    """Where run number `run` (1-based) of `tfperf run --repeat` writes: the first run in `out` itself."""
    from tfperf.records.runs import REPEATS

    return out if run == 1 else out / REPEATS / str(run)


def cmd_run(args: argparse.Namespace) -> int:
    """Run every recipe (or --only some), --repeat times each in fresh processes, then write the report."""
    import shutil

    from tfperf.records.findings import headline_path
    from tfperf.records.noise import NOISE_FILE
    from tfperf.records.report import build_report
    from tfperf.records.runs import REPEATS

    out = Path(args.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    recipes = recipe_declarations(args.only, Path(args.recipes))
    # A folder of repeated runs is its own calibration; a single run uses the one given (read before running).
    own = args.repeat > 1 or Path(args.calibration).resolve() == out.resolve()
    calibration = None if own else calibration_at(args.calibration, default=args.calibration == CALIBRATION)
    if (out / REPEATS).exists():  # spreads from an earlier run's repeats would be mixed with this run's
        shutil.rmtree(out / REPEATS)
    (out / NOISE_FILE).unlink(missing_ok=True)  # an earlier run's noise would speak for this one
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    failed = []
    started = time.perf_counter()
    # Repeats go round the recipes, so that each recipe's runs lie minutes apart: the machine's slow drifts fall
    # inside the spread a calibration measures, not between it and the next run.
    for run in range(1, args.repeat + 1):
        for i, recipe in enumerate(recipes, start=1):
            label = recipe.name if args.repeat == 1 else f"{recipe.name} ({run}/{args.repeat})"
            print(f"[{i}/{len(recipes)}] {label:<28}", end=" ", flush=True)
            t0 = time.perf_counter()
            where = repeat_dir(out, run)
            log = logs / (f"{recipe.name}.log" if run == 1 else f"{recipe.name}.{run}.log")
            headline_path(where, recipe.name).unlink(missing_ok=True)  # an earlier run's must not speak for this one
            with open(log, "w") as f:
                rc = subprocess.run(recipe_command(recipe, where, args.quick), stdout=f, stderr=subprocess.STDOUT,
                                    env=env, stdin=subprocess.DEVNULL).returncode
            status = "ok" if rc == 0 else f"FAILED (exit {rc}, log: {log})"
            print(f"{status} in {time.perf_counter() - t0:.1f} s", flush=True)
            if rc != 0:
                failed.append(label)
                tail = log.read_text().splitlines()[-15:]
                print("    " + "\n    ".join(tail), file=sys.stderr)
    runs = f"{len(recipes) * args.repeat - len(failed)}/{len(recipes) * args.repeat} runs"
    try:
        report = build_report(out, order=recipe_order(Path(args.recipes)), calibration=calibration)
    except FileNotFoundError:  # every run failed before it recorded a row: there is nothing to report
        print(f"report: not written, no recipe recorded anything ({runs}, "
              f"{time.perf_counter() - started:.0f} s)")
    else:
        print(f"report: {report} and {report.with_suffix('.html').name} ({runs}, "
              f"{time.perf_counter() - started:.0f} s)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild the report from the records already in a folder."""
    from tfperf.records.report import build_report

    calibration = calibration_at(args.calibration, default=args.calibration == CALIBRATION)
    try:
        # The cookbook's order where its recipes are at hand; a doctor's or load's folder needs none.
        order = recipe_order() if RECIPES_DIR.is_dir() else ()
        print(build_report(args.dir, order=order, calibration=calibration))
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    return 0


def cmd_horovod_timeline(args: argparse.Namespace) -> int:
    """Read a Horovod timeline into negotiation (and the wait for the last rank), operations and waits."""
    from tfperf.measure.horovod_timeline import TimelineError, read_split

    try:
        found = read_split(args.file, args.steps)
    except TimelineError as exc:
        raise UserError(str(exc)) from None
    print("\n".join(found.describe()))
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """Print the environment that records carry, as a process that runs models sees it."""
    import keras  # noqa: F401  (loaded, so that its runtime settings are read too)
    import tensorflow  # noqa: F401

    try:  # loaded, so that its build (NCCL, Gloo, MPI) is read too
        import horovod.tensorflow  # noqa: F401
    except ImportError:
        pass

    from tfperf.records.environment import environment

    found = environment()
    print(json.dumps(found, indent=2))
    problem = found.get("gpu", {}).get("problem")
    if problem:  # GPUs the driver sees and TensorFlow does not: every recipe would quietly run on the CPU
        print(f"tfperf env: error: {problem}", file=sys.stderr)
        return 2
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train a get_net model with checkpoints (resuming from the latest), optionally export it."""
    from tfperf.data import DatasetUnavailable, load_arrays
    from tfperf.deploy.commands import model_errors, print_export
    from tfperf.deploy.layout import CALIBRATION_ROWS, export_subject
    from tfperf.deploy.loader import COOKBOOK_INPUT, cookbook_subject
    from tfperf.models import get_net
    from tfperf.train import CheckpointError, train

    try:
        data = load_arrays(args.dataset, seed=args.seed)
        model = get_net(args.model, input_shape=data.input_shape, num_classes=data.num_classes)
    except (DatasetUnavailable, ValueError) as exc:
        raise UserError(str(exc)) from None
    ckpt_dir = Path(args.checkpoint_dir or Path("checkpoints") / f"{args.model}-{args.dataset}")
    every = max(1, args.steps // 20)

    def progress(step: int, loss: float) -> None:
        if step % every == 0 or step == args.steps:
            print(f"step {step}/{args.steps} loss {loss:.4f}", flush=True)

    try:
        result = train(model, data, steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr,
                       seed=args.seed, checkpoint_dir=ckpt_dir, checkpoint_every=args.checkpoint_every,
                       keep=args.keep, on_step=progress)
    except CheckpointError as exc:
        raise UserError(str(exc)) from None
    for prefix, why in result.skipped:
        print(f"skipped checkpoint {prefix}: it cannot be restored ({why})", file=sys.stderr)
    start = f"resumed from step {result.resumed_from}" if result.resumed_from else "started from scratch"
    print(f"done: {result.steps} steps ({start}), loss {result.final_loss:.4f}, "
          f"test accuracy {result.test_accuracy:.4f}, checkpoint {result.checkpoint}")
    if args.export:
        subject = cookbook_subject(args.model, model=model)
        calibration = ({COOKBOOK_INPUT: data.x_train[:CALIBRATION_ROWS]},
                       f"{CALIBRATION_ROWS} training rows of {args.dataset}")
        try:
            exported = export_subject(
                subject, args.root, name=args.name or f"{args.model}-{args.dataset}", format=args.format,
                quantize=args.quantize, select_tf_ops=args.select_tf_ops, sample={COOKBOOK_INPUT: data.x_test},
                calibration=calibration, metadata={"training": {
                    "dataset": args.dataset, "steps": result.steps, "test_accuracy": result.test_accuracy,
                    "final_loss": result.final_loss, "checkpoint": result.checkpoint}})
        except model_errors() as exc:
            raise UserError(str(exc)) from None
        print("exported: ", end="")
        print_export(exported)
    return 0


def version_line() -> str:
    """tfperf's version and the TensorFlow, Keras and Python it runs on, read from the installed distributions
    (importing TensorFlow would take seconds)."""
    from importlib import metadata

    def installed(*names: str) -> str:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return "not installed"

    return (f"tfperf {__version__} (TensorFlow {installed('tensorflow', 'tensorflow-cpu', 'tf-nightly')}, "
            f"Keras {installed('keras', 'keras-nightly')}, Python {platform.python_version()})")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `tfperf` parser with its subcommands; for `watch` alone, that one: the other commands' modules (NumPy and
    more, about 0.2 s) are not imported before the user's program starts, a cost `tfperf watch` adds to their run."""
    p = flags.ArgumentParser(prog="tfperf", description=__doc__)
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True, parser_class=flags.ArgumentParser)
    if command == "watch":
        watch_command.add_command(sub)
        return _described(p, sub)
    from tfperf.deploy import commands as deploy_commands
    from tfperf.doctor import command as doctor_command
    from tfperf.records import compare_command
    from tfperf.serving import command as load_command
    from tfperf.serving import serve_command

    _add_cookbook_commands(sub)
    compare_command.add_command(sub)
    train = sub.add_parser("train", help="train a cookbook net with checkpoints; a rerun resumes from the latest")
    flags.add_model_flag(train, "cnn")
    flags.add_dataset_flag(train, "mnist-5k")
    train.add_argument("--steps", type=flags.positive_int, default=300, help="total training steps")
    train.add_argument("--batch-size", type=flags.positive_int, default=64)
    train.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--checkpoint-dir", help="default: checkpoints/<model>-<dataset>")
    train.add_argument("--checkpoint-every", type=flags.positive_int, default=50, help="steps between checkpoints")
    train.add_argument("--keep", type=flags.positive_int, default=3, help="checkpoints kept")
    train.add_argument("--export", action="store_true", help="export the trained model when done")
    train.add_argument("--name", help="export name (default <model>-<dataset>)")
    train.add_argument("--root", default="saved_models", help="folder of exports")
    deploy_commands.add_format_flags(train)
    train.set_defaults(func=cmd_train)
    deploy_commands.add_commands(sub)
    doctor_command.add_command(sub)
    load_command.add_command(sub)
    serve_command.add_command(sub)
    watch_command.add_command(sub)

    timeline = sub.add_parser("horovod-timeline", help="where a Horovod job's collective time went: negotiation, "
                                                       "waiting for the last rank, all-reduce, waits")
    timeline.add_argument("file", help="the timeline rank 0 wrote: horovodrun --timeline-filename FILE ...")
    timeline.add_argument("--steps", type=flags.positive_int,
                          help="training steps the job took (default: how many times most tensors were reduced)")
    timeline.set_defaults(func=cmd_horovod_timeline)

    env = sub.add_parser("env", help="print the environment recorded with each measurement")
    env.set_defaults(func=cmd_env)
    return _described(p, sub)


def _described(parser: argparse.ArgumentParser, sub: Any) -> argparse.ArgumentParser:
    """Each command's --help opens with what it does (its line in the list of commands)."""
    for listed in sub._choices_actions:
        command = sub.choices[listed.dest]
        command.description = command.description or listed.help
    return parser


def _add_cookbook_commands(sub: Any) -> None:
    """run and report: the cookbook's own recipes and records."""
    run = sub.add_parser("run", help="the main job: run the recipes and write results/report.md and report.html")
    run.add_argument("--quick", action="store_true", help="each recipe at its --quick size")
    run.add_argument("--out", default="results", help="folder for records, logs, figures and the report")
    run.add_argument("--only", nargs="+", default=(), metavar="RECIPE", help="run only these recipes")
    run.add_argument("--recipes", default=str(RECIPES_DIR), metavar="DIR",
                     help="run the recipes of another folder (default: the cookbook's)")
    run.add_argument("--repeat", type=flags.positive_int, default=1,
                     help="run each recipe N times in fresh processes; the report shows the run-to-run spread, and "
                          "the folder becomes a calibration of this machine's noise (3 is enough)")
    calibration_help = (f"a calibration of run-to-run noise: the --out folder of `tfperf run --repeat 3` "
                        f"(default: ./{CALIBRATION} when it exists; none: do without)")
    run.add_argument("--calibration", default=CALIBRATION, metavar="DIR",
                     help=calibration_help + "; the report gives each figure the range a rerun lands in")
    run.set_defaults(func=cmd_run)

    report = sub.add_parser("report", help="rebuild report.md and report.html from the records in a folder")
    report.add_argument("dir", nargs="?", default="results")
    report.add_argument("--calibration", default=CALIBRATION, metavar="DIR", help=calibration_help)
    report.set_defaults(func=cmd_report)



def _stop_handler(command: str, may_exit: bool):
    """The SIGTERM handler: while an export is written (a conversion inside TensorFlow, where unwinding can
    crash), undo it, say so and exit 143 at once; otherwise unwind through `finally` as Ctrl-C does."""

    def terminate(signum, frame):
        flags.request_stop()
        cleanups = flags.pending_cleanups()
        if may_exit and cleanups:
            for cleanup in cleanups:
                try:
                    cleanup()
                except OSError:
                    pass  # half done by the block's own cleanup, which this signal interrupted
            print(f"tfperf {command}: stopped by SIGTERM; what it was writing was removed", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(143)
        raise flags.Stopped()

    return terminate


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tfperf` console script."""
    import signal
    import threading

    environ = dict(os.environ)  # the user's, for a program `tfperf watch` runs
    # TensorFlow's and XProf's info logs would bury the progress lines; read when TensorFlow loads.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(given[0] if given else None).parse_args(argv)
    args.environ = environ
    args.own_process = argv is None  # the process's own command line: its start is the command's (doctor's time)
    main_thread = threading.current_thread() is threading.main_thread()
    # Ending the process from the handler is for a real command line only, never for a caller's process.
    handler = _stop_handler(args.command, may_exit=argv is None)
    previous = signal.signal(signal.SIGTERM, handler) if main_thread else None
    try:
        code = args.func(args)
        if code in (130, 143) and main_thread and argv is None:
            # Stopped by SIGTERM or Ctrl-C, its partial report written: end here, for the reason given below (and
            # a LoadGen test left to end on its own thread would crash the interpreter's teardown).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except UserError as exc:
        print(f"tfperf {args.command}: error: {flags.one_line(exc)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional part the command reached is not installed: say which extra
        why = extras.explain(exc, f"tfperf {args.command}")
        if why is None:
            raise
        print(f"tfperf {args.command}: error: {why}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, flags.Stopped) as exc:
        how = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        print(f"tfperf {args.command}: stopped by {how}; what it was writing was removed", file=sys.stderr)
        if isinstance(exc, flags.Stopped) and main_thread and argv is None:
            # The `finally` blocks have run. An exception raised at an arbitrary point inside TensorFlow can leave
            # its C++ state half torn, and the interpreter's teardown then crash (seen: SIGSEGV): end here.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(143)
        return 130 if isinstance(exc, KeyboardInterrupt) else 143
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
