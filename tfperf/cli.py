"""The `tfperf` command: run the cookbook, build its report, compare runs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tfperf import __version__, flags
from tfperf.recipe import Declaration, declarations
from tfperf.report import REPEATS

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


class UserError(Exception):
    """Bad input from the user: reported in one line, exit code 2."""


def recipe_declarations(only: Sequence[str] = ()) -> list[Declaration]:
    """The recipes in the order they declare (the report's order); `only` picks some by name."""
    found = {d.name: d for d in declarations(RECIPES_DIR)}
    unknown = sorted(set(only) - set(found))
    if unknown:
        raise UserError(f"unknown recipe {', '.join(unknown)}: choose from {', '.join(found)}")
    return [found[n] for n in only] if only else list(found.values())


def recipe_order() -> list[str]:
    """Recipe names in report order."""
    return [d.name for d in recipe_declarations()]


def recipe_command(recipe: Declaration, out: Path, quick: bool) -> list[str]:
    """How the main job starts one recipe: through its declared launcher (found beside Python), if any."""
    launcher = [str(Path(sys.executable).parent / recipe.launcher[0]), *recipe.launcher[1:]] if recipe.launcher else []
    cmd = [*launcher, sys.executable, str(recipe.path), "--out", str(out)]
    return cmd + ["--quick"] if quick else cmd


def repeat_dir(out: Path, run: int) -> Path:
    """Where run number `run` (1-based) of `tfperf run --repeat` writes: the first run in `out` itself."""
    return out if run == 1 else out / REPEATS / str(run)


def cmd_run(args: argparse.Namespace) -> int:
    """Run every recipe (or --only some), --repeat times each in fresh processes, then write the report."""
    import shutil

    from tfperf.report import build_report

    out = Path(args.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if (out / REPEATS).exists():  # spreads from an earlier run's repeats would be mixed with this run's
        shutil.rmtree(out / REPEATS)
    recipes = recipe_declarations(args.only)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    failed = []
    started = time.perf_counter()
    for i, recipe in enumerate(recipes, start=1):
        for run in range(1, args.repeat + 1):
            label = recipe.name if args.repeat == 1 else f"{recipe.name} ({run}/{args.repeat})"
            print(f"[{i}/{len(recipes)}] {label:<28}", end=" ", flush=True)
            t0 = time.perf_counter()
            where = repeat_dir(out, run)
            log = logs / (f"{recipe.name}.log" if run == 1 else f"{recipe.name}.{run}.log")
            with open(log, "w") as f:
                rc = subprocess.run(recipe_command(recipe, where, args.quick), stdout=f, stderr=subprocess.STDOUT,
                                    env=env, stdin=subprocess.DEVNULL).returncode
            status = "ok" if rc == 0 else f"FAILED (exit {rc}, log: {log})"
            print(f"{status} in {time.perf_counter() - t0:.1f} s", flush=True)
            if rc != 0:
                failed.append(label)
                tail = log.read_text().splitlines()[-15:]
                print("    " + "\n    ".join(tail), file=sys.stderr)
    report = build_report(out, order=recipe_order())
    print(f"report: {report} ({len(recipes) * args.repeat - len(failed)}/{len(recipes) * args.repeat} runs, "
          f"{time.perf_counter() - started:.0f} s)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild the report from the records already in a folder."""
    from tfperf.report import build_report

    try:
        print(build_report(args.dir, order=recipe_order()))
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    return 0


def _records(path: str) -> list[dict]:
    from tfperf.results import read_records

    try:
        return read_records(path)
    except FileNotFoundError:
        raise UserError(f"no such records file: {path}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(str(exc)) from None


def cmd_compare(args: argparse.Namespace) -> int:
    """Row by row, how run B compares with run A; exit 1 when a row regressed significantly."""
    from tfperf.compare import IMPROVED, compare_runs
    from tfperf.report import fmt

    a, b = _records(args.a), _records(args.b)
    result = compare_runs(a, b, threshold=args.threshold)
    if not result.rows and not result.metric_mismatches:
        raise UserError(f"{args.a} and {args.b} share no (recipe, table, row): nothing to compare")
    for name, (va, vb) in {**result.env_differences, **result.args_differences}.items():
        print(f"warning: {name} differs: {va!r} in A, {vb!r} in B", file=sys.stderr)
    print("| table | row | metric | A | B | B vs A (95% CI) | p | change |\n|---|---|---|---|---|---|---|---|")
    for r in result.rows:
        ci = f" ({r.ci95[0]:.2f}-{r.ci95[1]:.2f})" if r.ci95 else ""
        p = f"{r.p_value:.3g}" if r.p_value is not None else "-"
        status = r.status + (" (no samples)" if r.ci95 is None else "")
        print(f"| {r.key[0]}: {r.key[1]} | {r.key[2]} | {r.metric} | {fmt(r.a)} | {fmt(r.b)} | "
              f"{r.ratio:.3f}x{ci} | {p} | {status} |")
    for label, keys in (("only in A", result.only_in_a), ("only in B", result.only_in_b)):
        for key in keys:
            print(f"{label}: {' / '.join(key)}")
    for line in result.metric_mismatches:
        print(f"not compared: {line}")
    if result.geometric_mean is not None:
        print(f"geometric mean of B vs A: {result.geometric_mean:.3f}x over {len(result.rows)} rows")
    improved = [r for r in result.rows if r.status == IMPROVED]
    print(f"{len(improved)} improved, {len(result.regressions)} regressed beyond {args.threshold:.0%} "
          f"(significance {0.05}), {len(result.rows) - len(improved) - len(result.regressions)} without a "
          f"significant change")
    if result.regressions:
        print("regressed: " + "; ".join(f"{r.key[1]} / {r.key[2]} ({1 / r.ratio:.2f}x worse)"
                                        for r in result.regressions), file=sys.stderr)
        return 1
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """Print the environment that records carry."""
    from tfperf.results import environment

    print(json.dumps(environment(), indent=2))
    return 0


def _serving_errors():
    from tfperf.serving import ExportError, InputError, ModelError

    return (ExportError, InputError, ModelError)


def cmd_train(args: argparse.Namespace) -> int:
    """Train a get_net model with checkpoints (resuming from the latest), optionally export it."""
    from tfperf.data import DatasetUnavailable, load_arrays
    from tfperf.models import get_net
    from tfperf.serving import export
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
        try:
            path = export(model, args.root, name=args.name or f"{args.model}-{args.dataset}", metadata={
                "training": {"dataset": args.dataset, "steps": result.steps,
                             "test_accuracy": result.test_accuracy, "final_loss": result.final_loss}})
        except _serving_errors() as exc:
            raise UserError(str(exc)) from None
        print(f"exported: {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a get_net model (with trained weights from a checkpoint) as a versioned SavedModel."""
    from tfperf.models import get_net
    from tfperf.serving import export
    from tfperf.train import restore_weights

    try:
        shape = tuple(args.input_shape) if args.input_shape else None
        model = get_net(args.model, input_shape=shape, num_classes=args.num_classes)
        metadata = {}
        if args.weights:
            metadata["weights"] = restore_weights(model, args.weights)
        path = export(model, args.root, name=args.name, version=args.version, metadata=metadata)
    except (FileNotFoundError, ValueError) as exc:  # ExportError is a ValueError
        raise UserError(str(exc)) from None
    print(path)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """Load a SavedModel in this process, check the input against its signature, run it."""
    import numpy as np

    from tfperf.results import atomic_write_bytes
    from tfperf.inspection import check_safe
    from tfperf.serving import load, non_finite, predict, read_array

    try:
        x = read_array(args.input)
        if not args.trust:
            check_safe(args.model_dir)
        outputs = predict(load(args.model_dir), x)
    except _serving_errors() as exc:
        raise UserError(str(exc)) from None
    bad = non_finite(x)
    if bad:  # the model runs on them, but nothing it says about those rows can be trusted
        print(f"tfperf predict: warning: {bad} of {x.size} input values are NaN or infinite; the predictions for "
              f"the rows holding them are not meaningful", file=sys.stderr)
    if args.output:
        import io

        buf = io.BytesIO()
        np.save(buf, outputs["probabilities"])
        atomic_write_bytes(args.output, buf.getvalue())
        print(f"wrote {args.output}: probabilities {outputs['probabilities'].shape}")
    else:
        print("predicted classes:", " ".join(str(c) for c in np.argmax(outputs["probabilities"], axis=-1)))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe a SavedModel without running it; exit 1 when it holds risky ops."""
    from tfperf.inspection import format_report, inspect_saved_model

    try:
        report = inspect_saved_model(args.model_dir)
    except _serving_errors() as exc:
        raise UserError(str(exc)) from None
    print(format_report(report))
    return 0 if report.safe else 1


def fraction(text: str) -> float:
    """A non-negative fraction such as 0.05."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number such as 0.05, got {text!r}") from None
    if not 0 <= value < 10:
        raise argparse.ArgumentTypeError(f"must be between 0 and 10, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The `tfperf` parser with its subcommands."""
    p = flags.ArgumentParser(prog="tfperf", description=__doc__)
    p.add_argument("--version", action="version", version=f"tfperf {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=flags.ArgumentParser)

    run = sub.add_parser("run", help="the main job: run the recipes and write results/report.md")
    run.add_argument("--quick", action="store_true", help="each recipe at its --quick size")
    run.add_argument("--out", default="results", help="folder for records, logs, figures and the report")
    run.add_argument("--only", nargs="+", default=(), metavar="RECIPE", help="run only these recipes")
    run.add_argument("--repeat", type=flags.positive_int, default=1,
                     help="run each recipe N times in fresh processes; the report shows the run-to-run spread")
    run.set_defaults(func=cmd_run)

    report = sub.add_parser("report", help="rebuild report.md from the records in a folder")
    report.add_argument("dir", nargs="?", default="results")
    report.set_defaults(func=cmd_report)

    comp = sub.add_parser("compare", help="two runs' records row by row, with CIs; exit 1 on a significant regression")
    comp.add_argument("a", help="records of run A, the baseline (.jsonl)")
    comp.add_argument("b", help="records of run B (.jsonl)")
    comp.add_argument("--threshold", type=fraction, default=0.05,
                      help="smallest change that counts, as a fraction (default 0.05: 5%%)")
    comp.set_defaults(func=cmd_compare)

    train = sub.add_parser("train", help="train a model with checkpoints; a rerun resumes from the latest")
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
    train.set_defaults(func=cmd_train)

    exp = sub.add_parser("export", help="write saved_models/<name>/<version>/ (TF Serving layout)")
    flags.add_model_flag(exp, "cnn")
    exp.add_argument("--weights", help="checkpoint folder or prefix from `tfperf train` (default: fresh weights)")
    exp.add_argument("--name", help="export name (default: the model's name)")
    exp.add_argument("--version", type=flags.positive_int, help="version number (default: the next free one)")
    exp.add_argument("--input-shape", type=flags.positive_int, nargs="+", help="one example's shape")
    exp.add_argument("--num-classes", type=flags.positive_int)
    exp.add_argument("--root", default="saved_models", help="folder of exports")
    exp.set_defaults(func=cmd_export)

    pred = sub.add_parser("predict", help="run an exported model's serving signature on a .npy input")
    pred.add_argument("model_dir", help="saved_models/<name>/<version>")
    pred.add_argument("--input", required=True, help=".npy array shaped like the signature's input")
    pred.add_argument("--output", help="write the probabilities here (.npy); default: print the classes")
    pred.add_argument("--trust", action="store_true",
                      help="load a model even though `tfperf inspect` finds ops off its allowlist")
    pred.set_defaults(func=cmd_predict)

    insp = sub.add_parser("inspect", help="list a SavedModel's signatures, ops and variables without running it")
    insp.add_argument("model_dir")
    insp.set_defaults(func=cmd_inspect)

    env = sub.add_parser("env", help="print the environment recorded with each measurement")
    env.set_defaults(func=cmd_env)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tfperf` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"tfperf {args.command}: error: {exc}", file=sys.stderr)
        return 2
