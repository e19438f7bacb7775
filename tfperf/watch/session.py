"""`with tfperf.watch.session(out="watch/notebook") as run:` the watch inside this process, around any code (a
notebook's cells, a custom loop): the same record, findings and report as `tfperf watch -- COMMAND`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Session:
    """What a session saw, filled in when its block ends: the record, the analysis, the report's path."""

    record: dict[str, Any] | None = None
    analysis: Any = None
    report: Path | None = None

    @property
    def findings(self) -> list:
        return list(self.analysis.findings) if self.analysis is not None else []


@dataclasses.dataclass(frozen=True)
class Opened:
    """A watch begun in this process: its scratch folder and when it began."""

    folder: str
    started: float


def rank_folder(out: str | Path) -> Path:
    """Where this process writes what it saw: `out`, or `out`/rankN in a launched rank other than 0 (under
    `horovodrun -np 2` both ranks run the same script with the same `out`, and wrote one report over the other)."""
    from tfperf.watch import probe

    rank = probe.launcher_rank()
    return Path(out) if not rank else Path(out) / f"rank{rank}"


def begin(profile_steps: int = 0, traces: str | Path | None = None) -> Opened:
    """Start watching this process (the probe installed, Keras and TensorFlow patched). One at a time.
    `profile_steps`: trace that many steps of the first fit into `traces` (default: a scratch folder)."""
    from tfperf.watch import probe

    if probe.RECORDER is not None:
        raise RuntimeError("a tfperf watch is already recording this process: end it first")
    folder = tempfile.mkdtemp(prefix="tfperf-watch-")
    started = time.perf_counter()
    probe.install(folder)
    if profile_steps and probe.RECORDER is not None:
        probe.RECORDER.profile_plan = {"steps": int(profile_steps),
                                       "dir": str(Path(traces or Path(folder) / "traces").resolve())}
    return Opened(folder, started)


def end(opened: Opened, seen: Session, out: str | Path | None, name: str, ending: str = "the block ended") -> Session:
    """Stop watching: every patch put back; `seen` filled with the record and its analysis, and report.md and
    watch.json written to `out` (when given)."""
    from tfperf.watch import probe
    from tfperf.watch.analysis import analyse
    from tfperf.watch.report import markdown
    from tfperf.watch.traced import read_input

    seen.record = probe.uninstall()
    wall = time.perf_counter() - opened.started
    read_input(seen.record)  # before the scratch folder goes: the traces may be in it
    shutil.rmtree(opened.folder, ignore_errors=True)
    seen.analysis = analyse([seen.record] if seen.record else [], wall)
    if out is not None:
        folder_out = rank_folder(out)
        folder_out.mkdir(parents=True, exist_ok=True)
        seen.report = folder_out / "report.md"
        seen.report.write_text(markdown(seen.analysis, name, ending))
        (folder_out / "watch.json").write_text(json.dumps(
            {"command": [name], "wall_s": wall, "processes": [seen.record] if seen.record else [],
             "findings": [dataclasses.asdict(f) for f in seen.analysis.findings]}, indent=1))
    return seen


@contextlib.contextmanager
def session(out: str | Path | None = None, name: str = "with tfperf.watch.session()",
            profile_steps: int = 0) -> Iterator[Session]:
    """Watch the block's Keras and TensorFlow work; at its end put every patch back, and write report.md and
    watch.json to `out` (when given; `out`/rankN in a launcher's rank N > 0). One session at a time in a process.
    `profile_steps`: as `tfperf watch --profile-steps` (the trace kept in `out`/traces when `out` is given)."""
    opened, seen = begin(profile_steps, rank_folder(out) / "traces" if out is not None else None), Session()
    try:
        yield seen
    finally:
        end(opened, seen, out, name)
