"""`tfperf watch -- python train.py`: run the user's command unchanged, with the probe in its Python processes, then
write where the run's time and memory went (report.md, watch.json) and say it on stderr."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf import flags
from tfperf.flags import UserError

BOOT = str(Path(__file__).resolve().parent / "boot")
FOLDER_ENV = "TFPERF_WATCH_DIR"  # the probe's (tfperf/watch/probe.py) names for them
CAPTURE_ENV = "TFPERF_WATCH_CAPTURE"
APPLY_ENV = "TFPERF_WATCH_APPLY"
PROFILE_ENV = "TFPERF_WATCH_PROFILE"


def add_command(sub) -> None:
    """Add `watch` to the `tfperf` subcommands."""
    p = sub.add_parser("watch", help="run YOUR program unchanged (tfperf watch -- python train.py) and report where "
                                     "its time and memory went: steps, callbacks, validation, the first epoch, "
                                     "retraces with the line that caused them, predict() loops",
                       usage="tfperf watch [--out DIR] -- COMMAND [ARGS...]")
    p.add_argument("--out", help="folder for report.md and watch.json (default watch/<program name>/)")
    p.add_argument("--capture", action="store_true",
                   help="keep the first fit()'s model, compile settings and 2,048 of its rows in --out/capture "
                        "(after its first epoch), and print the doctor command that searches them")
    p.add_argument("--doctor", action="store_true",
                   help="--capture, then run that doctor command when the program ends: the best configuration of "
                        "the knobs it searches, on your model and rows (minutes: `tfperf doctor --quick --train`)")
    p.add_argument("--apply", metavar="DIR",
                   help="the --out folder of an earlier `watch --doctor`: put the doctor's best configuration on "
                        "this run's first fit() and compare it with that run's, epoch for epoch (report in "
                        "DIR/applied)")
    p.add_argument("--profile-steps", type=flags.positive_int, metavar="N",
                   help="trace N steps of the first fit() with TensorFlow's profiler (its second epoch, or a "
                        "one-epoch fit after 5 steps) and read with XProf the share of a step spent waiting for "
                        "input (those steps run slower; the trace is kept in --out/traces)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="the command line to run, after --")
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


def child_environment(base: Mapping[str, str], folder: str, capture: str | None = None) -> dict[str, str]:
    """The user's environment, with the probe's folder (and the capture's) and the boot folder leading PYTHONPATH."""
    env = dict(base)
    env[FOLDER_ENV] = folder
    if capture:
        env[CAPTURE_ENV] = capture
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


def doctor_command(captured: Mapping[str, Any] | None, folder: Path, out: Path) -> tuple[list[str] | None, str]:
    """The doctor command line that searches what the watch kept in `folder`, or why there is none."""
    if not captured:
        return None, "no fit() ran to the end of its first epoch, so nothing was kept for the doctor"
    if "model" not in captured:
        return None, f"the model could not be saved as a .keras file ({captured.get('model_error')})"
    if not captured.get("loss"):
        return None, ("the model's loss is not one Keras knows by name: run tfperf doctor on "
                      f"{folder / 'model.keras'} with --train --loss NAME (the closest Keras loss)")
    cmd = ["tfperf", "doctor", str(folder / "model.keras"), "--quick", "--train", "--loss", str(captured["loss"]),
           "--no-threads"]  # the question is training's: the thread sweep answers inference's
    cmd += ["--from-logits"] if captured.get("from_logits") else []
    cmd += ["--train-batch", str(captured["batch_size"])] if captured.get("batch_size") else []
    cmd += ["--epoch-examples", str(captured["epoch_examples"])] if captured.get("epoch_examples") else []
    cmd += ["--sample", str(folder / "sample.npz")] if "sample" in captured else []
    cmd += ["--out", str(out / "doctor")]
    rows = (f"{captured['sample_rows']:,} of your rows and targets" if "sample" in captured else
            f"rows the doctor makes up (yours could not be kept: {captured.get('sample_error')})")
    return cmd, f"on your model and {rows}"


def captured_in(folder: str | Path) -> tuple[dict[str, Any], Path]:
    """What `tfperf watch --capture` kept, from its --out folder (or the capture folder in it): (capture.json's
    settings, the folder holding them); a folder without one is the user's error, said with what to run."""
    given = Path(folder)
    kept = next((f for f in (given / "capture", given) if (f / "capture.json").is_file()), None)
    if kept is None:
        raise UserError(f"--from {folder}: no capture.json there or in {given / 'capture'}; run `tfperf watch "
                        f"--capture --out {folder} -- python train.py` first (it keeps the first fit()'s model, "
                        f"settings and rows)")
    try:
        return json.loads((kept / "capture.json").read_text()), kept
    except (OSError, ValueError) as exc:
        raise UserError(f"--from {folder}: {kept / 'capture.json'} cannot be read ({exc}); run the watch with "
                        f"--capture again") from None


def run_doctor(cmd: Sequence[str]) -> tuple[int, str]:
    """The doctor in a process of its own, its progress on stderr as it goes: (its exit status, what it printed)."""
    done = subprocess.run([sys.executable, "-m", "tfperf", *cmd[1:]], stdout=subprocess.PIPE, text=True)
    return done.returncode, done.stdout


def ending(rc: int, stopped: str | None) -> str:
    if stopped:
        return f"stopped by {stopped}, exit {rc}"
    if rc > 128:
        try:
            return f"killed by {signal.Signals(rc - 128).name}"
        except ValueError:
            pass
    return f"exit {rc}"


def watched_run(command: Sequence[str], env: Mapping[str, str], out: Path, capture: bool):
    """Run the command with the probe; its records, its capture copied into out/capture: (rc, signal, wall, records)."""
    with tempfile.TemporaryDirectory(prefix="tfperf-watch-") as folder:
        kept = Path(folder) / "capture"
        kept.mkdir()
        started = time.perf_counter()
        rc, stopped = run_child(command, child_environment(env, folder, str(kept) if capture else None))
        wall = time.perf_counter() - started
        processes = read_records(folder)
        out.mkdir(parents=True, exist_ok=True)
        if capture and any(kept.iterdir()):
            shutil.rmtree(out / "capture", ignore_errors=True)
            shutil.copytree(kept, out / "capture")
    return rc, stopped, wall, processes


def doctor_section(processes: Sequence[Mapping[str, Any]], out: Path, run: bool) -> dict[str, Any]:
    """The doctor command on what was kept, run when asked (after the program ended)."""
    captured = next((p["capture"] for p in processes if p.get("capture")), None)
    cmd, why = doctor_command(captured, out / "capture", out)
    doctor: dict[str, Any] = {"command": cmd, "why": why, "captured": captured}
    if cmd and run:
        print(f"\ntfperf watch: the program ended; the doctor now searches {why} (minutes):", file=sys.stderr)
        doctor["exit_code"], doctor["said"] = run_doctor(cmd)
    return doctor


def parsed_command(args: argparse.Namespace) -> tuple[list[str], Path]:
    """The command after --, and the folder the report goes to."""
    command = list(args.program)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UserError("give the command to watch after --, e.g. tfperf watch -- python train.py --epochs 3")
    if args.apply and (args.capture or args.doctor):
        raise UserError("--apply runs the doctor's advice from an earlier --doctor run: give it alone")
    default = Path(args.apply) / "applied" if args.apply else Path("watch") / program_name(command)
    out = Path(args.out) if args.out else default
    if args.apply and out.resolve() == Path(args.apply).resolve():
        raise UserError(f"--out {out} is the run --apply compares with: its watch.json would be overwritten; give "
                        f"another folder (default {default})")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file: give a folder for report.md and watch.json")
    return command, out


def cmd_watch(args: argparse.Namespace) -> int:
    """Run the command watched (with --doctor, search its first fit after; with --apply, put that search's best on
    it and judge it against the earlier run); write and say the report; exit as the command did."""
    from tfperf.watch import confirm
    from tfperf.watch.analysis import analyse
    from tfperf.watch.report import doctor_lines, markdown, summary
    from tfperf.watch.traced import read_input

    command, out = parsed_command(args)
    env = dict(getattr(args, "environ", None) or os.environ)
    best = before = None
    if args.apply:
        best, before = confirm.best_configuration(Path(args.apply)), confirm.earlier_run(Path(args.apply))
        env[APPLY_ENV] = confirm.apply_environment(best)
    if args.profile_steps:
        env[PROFILE_ENV] = json.dumps({"steps": args.profile_steps, "dir": str((out / "traces").resolve())})
    rc, stopped, wall, processes = watched_run(command, env, out, args.capture or args.doctor)
    for process in processes:
        read_input(process)
    analysis, end = analyse(processes, wall), ending(rc, stopped)
    doctor = doctor_section(processes, out, args.doctor and not stopped) if args.capture or args.doctor else None
    sections = doctor_lines(doctor)
    if best is not None:
        sections += confirm.confirmation_lines(before, processes, best, Path(args.apply))
    report = out / "report.md"
    report.write_text(markdown(analysis, command, end, sections))
    record = {"command": command, "exit_code": rc, "stopped_by": stopped, "wall_s": wall, "processes": processes,
              "findings": [dataclasses.asdict(f) for f in analysis.findings], "not_measured": analysis.not_measured,
              "doctor": doctor, "applied": best}
    (out / "watch.json").write_text(json.dumps(record, indent=1))
    print(summary(analysis, command, end, str(report), sections), file=sys.stderr)
    return rc
