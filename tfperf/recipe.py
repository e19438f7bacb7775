"""One harness for the recipes: a recipe declares what it is and supplies `measure` and `conclude`; the
harness parses its flags, records, saves, prints the tables and writes the conclusion, and turns known
errors into one line."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf import extras, flags
from tfperf.records.findings import Headline, headline_path
from tfperf.records.jsonl import Recorder

# The shared flags a recipe may declare it uses, with what they mean when it does.
SHARED_FLAGS: dict[str, tuple[Callable[[str], Any], str]] = {
    "steps": (flags.positive_int, "timed steps (samples) per measurement"),
    "warmup": (flags.non_negative_int, "untimed steps after the first call"),
    "batch_size": (flags.positive_int, "examples per step"),
}


def _stop(signum, frame) -> None:
    raise flags.Stopped()


class RecipeError(Exception):
    """Input the recipe cannot run with, or something it needs that is missing: one line, exit 2."""


def gpu_problem() -> str | None:
    """GPUs that the NVIDIA driver sees and TensorFlow does not (nothing is asked of TensorFlow on a host
    without nvidia-smi): a recipe would quietly measure the CPU."""
    from tfperf.gpus import driver_gpus, missing_gpus, tensorflow_gpus

    driver = driver_gpus()
    return missing_gpus(driver, tensorflow_gpus(driver)) if driver else None


def where_the_time_went(profile_dir: str | Path, *, since: float = 0.0, limit: int = 8) -> str:
    """The top operations of each trace under `profile_dir` written after `since` (a time.time()), as
    Markdown: XProf's framework_op_stats of the trace, the table TensorBoard's Profile tab opens with."""
    from tfperf.measure.profiles import TraceError, op_times, ops_table, time_by_kind, traces_by_run

    parts = []
    for run, files in traces_by_run(profile_dir).items():
        if max(Path(f).stat().st_mtime for f in files) < since:
            continue  # a trace of an earlier run in the same folder
        try:
            ops = op_times(files)
            kinds = ", ".join(f"{name} {share:.0%}" for name, share in time_by_kind(ops).items() if share >= 0.005)
            table = ops_table(ops, limit=limit) + (f"\n\nBy kind: {kinds}." if kinds else "")
        except (TraceError, ImportError) as exc:
            table = f"(not converted: {exc})"
        parts.append(f"## where the time went: {run} (trace in {Path(files[0]).parent})\n\n{table}")
    return "\n\n".join(parts) or f"(no trace written under {profile_dir} by this run)"


@dataclasses.dataclass(frozen=True)
class Conclusion:
    """What a recipe concludes from its own run: the paragraph for the report, key lines printed before it,
    when a check the recipe makes failed, what failed (printed last; the script exits 1), and its headline:
    the one line of the report's findings table."""

    text: str
    lines: Sequence[str] = ()
    failure: str = ""
    headline: Headline | None = None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A recipe's declaration and its two parts.

    Args:
        sizes: for each flag whose default depends on --quick, its (full, quick) value.
        uses: the shared flags (SHARED_FLAGS) the recipe reads; only those are offered.
        add_flags: adds the recipe's own flags to its parser.
        measure: (args, recorder) -> what `conclude` needs; it adds rows to the recorder.
        conclude: (args, recorder, measured) -> Conclusion.
        task: for recipes that start copies of themselves (workers, probes): what such a copy runs, given
            --role, instead of measuring; returns the exit code.
        launcher: the command that starts the script (its executable beside Python's), e.g. horovodrun.
        order: where the recipe stands in the main job and the report (lower first).
    """

    name: str
    doc: str
    measure: Callable[[argparse.Namespace, Recorder], Any]
    conclude: Callable[[argparse.Namespace, Recorder, Any], Conclusion]
    order: int
    sizes: Mapping[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    uses: Sequence[str] = ()
    add_flags: Callable[[argparse.ArgumentParser], None] | None = None
    launcher: Sequence[str] = ()
    task: Callable[[argparse.Namespace], int] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.uses) - set(SHARED_FLAGS)
        if unknown:
            raise ValueError(f"{self.name}: unknown shared flags {sorted(unknown)}: choose from {sorted(SHARED_FLAGS)}")

    def parser(self) -> flags.ArgumentParser:
        """The recipe's command line: --quick, --out, --seed, --profile, the shared flags it uses, its own."""
        p = flags.ArgumentParser(prog=f"{self.name}.py", description=self.doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--quick", action="store_true", help="small sizes: the whole recipe in minutes")
        p.add_argument("--out", default="results", help="folder for records, figures and the conclusion")
        p.add_argument("--seed", type=int, default=0, help="random seed for data and weights")
        p.add_argument("--profile", metavar="DIR",
                       help="write a TensorBoard trace of a separate pass (never of the recorded samples) to DIR")
        for name in self.uses:
            kind, text = SHARED_FLAGS[name]
            p.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
        if self.add_flags:
            self.add_flags(p)
        return p

    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """Parse argv (default: the process's); each flag in `sizes` left unset takes its (full, quick) value."""
        return flags.parse(self.parser(), argv, sizes=self.sizes)

    def run(self, args: argparse.Namespace) -> tuple[Recorder, Any]:
        """Measure: the recorder holding the rows, and what `conclude` needs. Tests call this at tiny sizes."""
        rec = Recorder(self.name, vars(args))
        return rec, self.measure(args, rec)

    def main(self, argv: Sequence[str] | None = None) -> int:
        """The script's whole life: parse, measure, save, print the tables and the conclusion."""
        from tfperf.measure.processes import ChildError
        from tfperf.data import DatasetUnavailable
        from tfperf.records.report import markdown_table, write_conclusion

        args = self.parse(argv)
        if self.task is not None and getattr(args, "role", None):
            return self.task(args)
        started = time.time()
        problem = gpu_problem()
        if problem:
            print(f"{self.name}: error: {problem}", file=sys.stderr)
            return 2
        # SIGTERM (timeout, CI) unwinds as Ctrl-C does: the clusters, servers and emulated hosts a recipe
        # started are taken down by the blocks that started them.
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
        try:
            rec, measured = self.run(args)
            rec.save(args.out)
            conclusion = self.conclude(args, rec, measured)
        except (RecipeError, DatasetUnavailable, flags.UserError) as exc:  # bad input, said in one line
            print(f"{self.name}: error: {flags.one_line(exc)}", file=sys.stderr)
            return 2
        except ChildError as exc:  # a failed run, not bad input: the message names what failed
            print(f"{self.name}: failed: {exc}", file=sys.stderr)
            return 1
        except ModuleNotFoundError as exc:  # an optional part of tfperf the recipe uses is not installed
            why = extras.explain(exc, self.name)
            if why is None:
                raise
            print(f"{self.name}: error: {why}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, flags.Stopped) as exc:
            stopped = isinstance(exc, flags.Stopped)
            print(f"{self.name}: stopped by {'SIGTERM' if stopped else 'Ctrl-C'}", file=sys.stderr)
            return 143 if stopped else 130
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        tables = dict.fromkeys(r["table"] for r in rec.records)
        print("\n\n".join(f"## {t}\n\n{markdown_table(rec.table(t))}" for t in tables) + "\n")
        if args.profile:
            print(where_the_time_went(args.profile, since=started) + "\n")
        for line in conclusion.lines:
            print(line)
        write_conclusion(args.out, self.name, conclusion.text)
        if conclusion.headline is not None:
            conclusion.headline.save(args.out, self.name)
        else:  # a headline left by an earlier run would speak for this one
            headline_path(args.out, self.name).unlink(missing_ok=True)
        print(f"\n{conclusion.text}", flush=True)
        if conclusion.failure:
            print(f"{self.name}: FAILED: {conclusion.failure}", file=sys.stderr)
            return 1
        return 0


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What the main job needs to know of a recipe, read from its source without importing it."""

    name: str
    path: Path
    order: int
    launcher: tuple[str, ...]


def read_declaration(path: Path | str) -> Declaration:
    """The literal name, order and launcher of the module-level `Recipe(...)` in a recipe script.

    Read with `ast`, so that listing recipes does not import TensorFlow or Horovod."""
    path = Path(path)
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError as exc:
        raise ValueError(f"{path} is not Python: {exc.msg} (line {exc.lineno})") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Recipe":
            found = {k.arg: k.value for k in node.keywords}
            try:
                name = ast.literal_eval(found["name"])
                order = ast.literal_eval(found["order"])
                launcher = tuple(ast.literal_eval(found["launcher"])) if "launcher" in found else ()
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{path}: Recipe(...) needs literal name= and order= (and launcher=): {exc}") from None
            if name != path.stem:
                raise ValueError(f"{path}: declares name={name!r}; a recipe is named after its file")
            return Declaration(name, path, order, launcher)
    raise ValueError(f"{path}: no Recipe(...) declaration")


def declarations(folder: Path | str) -> list[Declaration]:
    """Every recipe in a folder, in the order they declare."""
    found = [read_declaration(p) for p in Path(folder).glob("*.py") if not p.name.startswith("_")]
    return sorted(found, key=lambda d: (d.order, d.name))

