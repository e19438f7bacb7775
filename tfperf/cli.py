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

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
# The report's order: from the overhead of one call up to many processes, then deployment.
RECIPE_ORDER = (
    "hybridize",
    "training_ladder",
    "mixed_precision",
    "input_pipeline",
    "async_execution",
    "auto_parallelism",
    "hardware",
    "multi_device_scratch",
    "mirrored_resnet",
    "multi_worker",
    "parameter_server",
    "mnist_hvd",
    "scaling_model",
    "saved_model",
)


class UserError(Exception):
    """Bad input from the user: reported in one line, exit code 2."""


def recipe_paths(only: Sequence[str] = ()) -> list[Path]:
    """The recipe scripts, in report order; `only` picks some by name."""
    found = {p.stem: p for p in RECIPES_DIR.glob("*.py") if not p.name.startswith("_")}
    unknown = sorted(set(only) - set(found))
    if unknown:
        raise UserError(f"unknown recipe {', '.join(unknown)}: choose from {', '.join(sorted(found))}")
    names = [n for n in only] if only else sorted(found, key=lambda n: (
        RECIPE_ORDER.index(n) if n in RECIPE_ORDER else len(RECIPE_ORDER), n))
    return [found[n] for n in names]


def recipe_command(script: Path, out: Path, quick: bool) -> list[str]:
    """How the main job starts one recipe."""
    cmd = [sys.executable, str(script), "--out", str(out)]
    return cmd + ["--quick"] if quick else cmd


def cmd_run(args: argparse.Namespace) -> int:
    """Run every recipe (or --only some), one line each, then write the report."""
    from tfperf.report import build_report

    out = Path(args.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    scripts = recipe_paths(args.only)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    failed = []
    started = time.perf_counter()
    for i, script in enumerate(scripts, start=1):
        print(f"[{i}/{len(scripts)}] {script.stem:<22}", end=" ", flush=True)
        t0 = time.perf_counter()
        log = logs / f"{script.stem}.log"
        with open(log, "w") as f:
            rc = subprocess.run(recipe_command(script, out, args.quick), stdout=f, stderr=subprocess.STDOUT,
                                env=env, stdin=subprocess.DEVNULL).returncode
        status = "ok" if rc == 0 else f"FAILED (exit {rc}, log: {log})"
        print(f"{status} in {time.perf_counter() - t0:.1f} s", flush=True)
        if rc != 0:
            failed.append(script.stem)
            tail = log.read_text().splitlines()[-15:]
            print("    " + "\n    ".join(tail), file=sys.stderr)
    report = build_report(out, order=RECIPE_ORDER)
    print(f"report: {report} ({len(scripts) - len(failed)}/{len(scripts)} recipes, "
          f"{time.perf_counter() - started:.0f} s)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild the report from the records already in a folder."""
    from tfperf.report import build_report

    try:
        print(build_report(args.dir, order=RECIPE_ORDER))
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
    """Print, row by row, how run B compares with run A."""
    from tfperf.report import compare, fmt

    rows = compare(_records(args.a), _records(args.b))
    if not rows:
        raise UserError(f"{args.a} and {args.b} share no (recipe, table, row): nothing to compare")
    print(f"| table | row | metric | A | B | B vs A |\n|---|---|---|---|---|---|")
    for table, row, metric, a, b, ratio in rows:
        print(f"| {table} | {row} | {metric} | {fmt(a)} | {fmt(b)} | {ratio:.2f}x |")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """Print the environment that records carry."""
    from tfperf.results import environment

    print(json.dumps(environment(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `tfperf` parser with its subcommands."""
    p = flags.ArgumentParser(prog="tfperf", description=__doc__)
    p.add_argument("--version", action="version", version=f"tfperf {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=flags.ArgumentParser)

    run = sub.add_parser("run", help="the main job: run the recipes and write results/report.md")
    run.add_argument("--quick", action="store_true", help="each recipe at its --quick size")
    run.add_argument("--out", default="results", help="folder for records, logs, figures and the report")
    run.add_argument("--only", nargs="+", default=(), metavar="RECIPE", help="run only these recipes")
    run.set_defaults(func=cmd_run)

    report = sub.add_parser("report", help="rebuild report.md from the records in a folder")
    report.add_argument("dir", nargs="?", default="results")
    report.set_defaults(func=cmd_report)

    comp = sub.add_parser("compare", help="ratio of two runs' records, row by row")
    comp.add_argument("a", help="records of run A (.jsonl)")
    comp.add_argument("b", help="records of run B (.jsonl)")
    comp.set_defaults(func=cmd_compare)

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
