"""`tfperf watch -- python train.py`: run the user's command unchanged, with the probe in its Python processes, then
write where the run's time and memory went (report.md, watch.json) and say it on stderr."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf.flags import UserError

BOOT = str(Path(__file__).resolve().parent / "boot")
FOLDER_ENV = "TFPERF_WATCH_DIR"  # the probe's (tfperf/watch/probe.py) name for it


def add_command(sub) -> None:
    """Add `watch` to the `tfperf` subcommands."""
    p = sub.add_parser("watch", help="run YOUR program unchanged (tfperf watch -- python train.py) and report where "
                                     "its time and memory went: steps, callbacks, validation, the first epoch, "
                                     "retraces with the line that caused them, predict() loops",
                       usage="tfperf watch [--out DIR] -- COMMAND [ARGS...]")
    p.add_argument("--out", help="folder for report.md and watch.json (default watch/<program name>/)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command line to run, after --")
    p.set_defaults(func=cmd_watch)


def program_name(command: Sequence[str]) -> str:
    """A folder name for the run: the script's stem, the -m module, else the program's name."""
    args = list(command[1:]) if Path(command[0]).name.startswith("python") else list(command)
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            return args[i + 1].replace(".", "-")
        if arg == "-c":
            return "python-c"
        if not arg.startswith("-"):
            return Path(arg).stem or "program"
    return Path(command[0]).name or "program"


def child_environment(base: Mapping[str, str], folder: str) -> dict[str, str]:
    """The user's environment, with the probe's folder and the boot folder leading PYTHONPATH."""
    env = dict(base)
    env[FOLDER_ENV] = folder
    env["PYTHONPATH"] = BOOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_child(command: Sequence[str], env: Mapping[str, str]) -> tuple[int, str | None]:
    """Run the command with the terminal's streams; SIGTERM is passed on, Ctrl-C reaches it from the terminal.
    Returns its exit status (128 + N for a signal N) and the signal that stopped the watch, if any."""
    stopped: list[str] = []
    try:
        child = subprocess.Popen(list(command), env=dict(env))
    except OSError as exc:
        raise UserError(f"cannot run {command[0]!r}: {exc.strerror or exc}; give a program on PATH or a path to "
                        f"one, after --") from None

    def forward(signum, frame):
        stopped.append(signal.Signals(signum).name)
        if signum == signal.SIGTERM:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return (128 - rc if rc < 0 else rc), (stopped[0] if stopped else None)


def read_records(folder: str | Path) -> list[dict[str, Any]]:
    """Each watched process's record (one the process was writing when it died is skipped)."""
    records = []
    for path in sorted(Path(folder).glob("process-*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records


def ending(rc: int, stopped: str | None) -> str:
    if stopped:
        return f"stopped by {stopped}, exit {rc}"
    if rc > 128:
        try:
            return f"killed by {signal.Signals(rc - 128).name}"
        except ValueError:
            pass
    return f"exit {rc}"


def cmd_watch(args: argparse.Namespace) -> int:
    """Run the command watched; write and say the report; exit as the command did."""
    from tfperf.watch.findings import analyse
    from tfperf.watch.report import markdown, summary

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UserError("give the command to watch after --, e.g. tfperf watch -- python train.py --epochs 3")
    out = Path(args.out) if args.out else Path("watch") / program_name(command)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file: give a folder for report.md and watch.json")
    base = getattr(args, "environ", None) or os.environ
    with tempfile.TemporaryDirectory(prefix="tfperf-watch-") as folder:
        started = time.perf_counter()
        rc, stopped = run_child(command, child_environment(base, folder))
        wall = time.perf_counter() - started
        processes = read_records(folder)
    analysis = analyse(processes, wall)
    end = ending(rc, stopped)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.md"
    report.write_text(markdown(analysis, command, end))
    record = {"command": command, "exit_code": rc, "stopped_by": stopped, "wall_s": wall, "processes": processes,
              "findings": [dataclasses.asdict(f) for f in analysis.findings], "not_measured": analysis.not_measured}
    (out / "watch.json").write_text(json.dumps(record, indent=1))
    print(summary(analysis, command, end, str(report)), file=sys.stderr)
    return rc
