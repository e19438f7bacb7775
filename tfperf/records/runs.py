"""A results folder as the runs it holds: the first run in the folder itself, runs 2..N of `tfperf run
--repeat N` under repeats/<k>/, each with its records and its recipes' headlines."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf.records.findings import Headline, headline_path, read_headline
from tfperf.records.jsonl import read_records

# `tfperf run --repeat N` writes runs 2..N under <out>/repeats/<run>/.
REPEATS = "repeats"


def repeat_dirs(folder: Path | str) -> list[Path]:
    """The folders of runs 2..N of a results folder, in run order."""
    return sorted((Path(folder) / REPEATS).glob("*/"), key=lambda d: (len(d.name), d.name))


def read_run(folder: Path | str, names: Sequence[str] | None = None) -> Run:
    """One run: the records of every *.jsonl in `folder` (or of the files `names`), and their headlines."""
    folder = Path(folder)
    files = [folder / n for n in names] if names is not None else sorted(folder.glob("*.jsonl"))
    records = [r for f in files if f.exists() for r in read_records(f)]
    recipes = dict.fromkeys([r["recipe"] for r in records] + [f.stem for f in files])
    headlines = {name: h for name in recipes if (h := read_headline(headline_path(folder, name))) is not None}
    return Run(folder, records, headlines)


def read_runs(path: Path | str) -> list[Run]:
    """The runs a results folder holds (first run, then its repeats), or those of one records file (the file,
    then the file of the same name in each repeat of its folder). FileNotFoundError names what is missing."""
    path = Path(path)
    if path.is_dir():
        if not any(path.glob("*.jsonl")):
            raise FileNotFoundError(f"{path} holds no records (*.jsonl): is it the --out folder of `tfperf run`?")
        return [read_run(path), *(read_run(d) for d in repeat_dirs(path) if any(d.glob("*.jsonl")))]
    if not path.is_file():
        raise FileNotFoundError(f"no such records file or results folder: {path}")
    again = [d for d in repeat_dirs(path.parent) if (d / path.name).exists()]
    return [read_run(path.parent, [path.name]), *(read_run(d, [path.name]) for d in again)]


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of some recipes: where it was written, its records, and each recipe's headline."""

    where: Path
    records: list[dict[str, Any]]
    headlines: Mapping[str, Headline] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, records: Sequence[Mapping[str, Any]], headlines: Mapping[str, Headline] | None = None) -> Run:
        """A run held in memory (tests, a recorder's rows)."""
        return cls(Path("."), [dict(r) for r in records], dict(headlines or {}))

    @property
    def env(self) -> dict[str, Any]:
        """The environment its first record was measured in ({} for an empty run)."""
        return dict(self.records[0]["env"]) if self.records else {}
