"""Run-to-run noise: how far a figure moves between runs of the same code on one machine, measured from
repeated runs in fresh processes (an A/A calibration: `tfperf run --repeat 5`), and what follows from it:
the range a rerun lands in, and the band a change must clear before `tfperf compare` calls it one.

A figure's 95% interval from one run describes the spread of samples inside that run's processes; what
changes from one process to the next (where the allocator put the buffers, which core ran what, the
machine's other tenants) is invisible to it, and on shared machines it is often the larger part. So the
spread of each figure's logarithm over the calibration runs is kept, pulled toward its recipe's (few runs
estimate a spread poorly): how far is learnt from how much the figures' spreads differ, as limma does
for genes (Smyth 2004), and the result is used with Student's t for its degrees of freedom.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfperf import jsonio
from tfperf.measure import stats
from tfperf.records.findings import Headline
from tfperf.records.jsonl import atomic_write_text
from tfperf.records.runs import Run, read_runs

NOISE_FILE = "noise.json"
FORMAT = "tfperf-noise/1"
CONFIDENCE = 0.95
# The prior's degrees of freedom when no figure moved at all between the runs (nothing to learn it from).
PRIOR_DF = 4.0
# A recipe learns its prior from its own timed figures when it has at least this many that moved.
MIN_FIGURES = 5
# What the machine, its software and the run's sizes are: a calibration from another is a poor guide.
ENV_KEYS = ("cpu", "cores", "usable_cores", "gpus", "python", "tensorflow", "keras")
ARGS_IGNORED = ("out", "profile")
HEADLINE = "headline"

Key = tuple[str, str, str, str]  # (recipe, table, row, quantity): "primary", "ratio" or "headline"


def positive(value: Any) -> float | None:
    """A figure as a float when it is a finite positive number (its logarithm exists), else None."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def headline_key(recipe: str) -> Key:
    """The key of a recipe's headline figure."""
    return (recipe, "", "", HEADLINE)


def figures(run: Run) -> dict[Key, tuple[float, bool]]:
    """Every positive figure of a run, and whether it is timed: each row's primary metric (timed when the row
    kept its samples), each judged row's ratio and each headline (timed)."""
    found: dict[Key, tuple[float, bool]] = {}
    for r in run.records:
        where = (r["recipe"], r["table"], r["row"])
        if (value := positive(r["metrics"].get(r["primary"]))) is not None:
            found[(*where, "primary")] = (value, bool(r.get("samples_s")))
        if (ratio := positive(r.get("ratio"))) is not None:
            found[(*where, "ratio")] = (ratio, True)
    for recipe, headline in run.headlines.items():
        if (value := positive(headline.value)) is not None:
            found[headline_key(recipe)] = (value, True)
    return found


def measure_noise(runs: Sequence[Run], where: str = "") -> Noise:
    """The run-to-run spread of every figure that two or more of `runs` (of the same code) measured."""
    if len(runs) < 2:
        raise ValueError(f"{where or 'a calibration'} holds {len(runs)} run: run-to-run noise needs at least 2 "
                         f"(`tfperf run --repeat 5`)")
    values: dict[Key, list[float]] = {}
    timed: set[Key] = set()
    for run in runs:
        for key, (value, is_timed) in figures(run).items():
            values.setdefault(key, []).append(math.log(value))
            if is_timed:
                timed.add(key)
    spreads = {key: (float(np.var(logs, ddof=1)), float(len(logs) - 1)) for key, logs in values.items()
               if len(logs) >= 2}
    machine, recipes = priors({k: v for k, v in spreads.items() if k in timed})
    first = runs[0]
    env = {k: first.env.get(k) for k in ENV_KEYS}
    args = {}
    for r in first.records:
        args.setdefault(r["recipe"], {k: v for k, v in r["args"].items() if k not in ARGS_IGNORED})
    commit = first.env.get("git_commit")
    return Noise(len(runs), spreads, recipes, machine, env, args, commit,
                 datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), where)


def _prior(spreads: Sequence[tuple[float, float]], prior_df: float | None = None) -> tuple[float, float]:
    """(variance, degrees of freedom) of the prior these spreads give, the degrees of freedom capped at what
    they hold together (a prior learnt from a few figures cannot be surer than they are)."""
    variance, df = stats.variance_prior([v for v, _ in spreads], [d for _, d in spreads], prior_df=prior_df)
    return variance, min(df, sum(d for _, d in spreads))


def priors(spreads: Mapping[Key, tuple[float, float]]) -> tuple[tuple[float, float], dict[str, tuple[float, float]]]:
    """The prior spread of the machine's timed figures and of each recipe's, as (variance, degrees of freedom).
    A recipe with MIN_FIGURES timed figures that moved learns both from its own (the figures of one recipe are
    alike far more often than the machine's are: a serving recipe's are loud, a matmul's quiet); one with fewer
    takes the machine's degrees of freedom and, if it has any, its own figures' level."""
    moved = [s for s in spreads.values() if s[0] > 0]
    if not moved:
        return (0.0, PRIOR_DF), {}
    machine = _prior(moved)
    by_recipe: dict[str, list[tuple[float, float]]] = {}
    for key, spread in spreads.items():
        if spread[0] > 0:
            by_recipe.setdefault(key[0], []).append(spread)
    recipes = {recipe: _prior(found) if len(found) >= MIN_FIGURES else
               (_prior(found, prior_df=machine[1])[0], machine[1]) for recipe, found in by_recipe.items()}
    return machine, recipes


def within_sd(ci95: Sequence[float] | None) -> float:
    """The standard deviation of a figure's logarithm within its run, read from its 95% interval (0 without)."""
    if ci95 and (low := positive(ci95[0])) and (high := positive(ci95[1])) and high > low:
        return math.log(high / low) / (2 * stats.t_quantile(1 - (1 - CONFIDENCE) / 2, math.inf))
    return 0.0


def rerun_range(value: float, spread: Spread, ci95: Sequence[float] | None = None) -> tuple[float, float]:
    """Where a rerun's figure lands (95%), given this run's `value`: the difference of two runs' logarithms
    has twice a run's variance. Never narrower than the figure's own interval within its run (`ci95`)."""
    sd = max(spread.sd, within_sd(ci95))
    factor = math.exp(stats.t_quantile(1 - (1 - CONFIDENCE) / 2, spread.df) * sd * math.sqrt(2))
    return value / factor, value * factor


def load_calibration(path: Path | str) -> Noise:
    """The noise of a calibration: a results folder of repeated runs (measured now from its runs), or a
    noise.json one wrote. ValueError in one line when it is neither."""
    path = Path(path)
    if path.is_dir():
        try:
            runs = read_runs(path)
        except FileNotFoundError:
            runs = []
        if len(runs) >= 2:
            return measure_noise(runs, str(path))
        if (path / NOISE_FILE).is_file():
            path = path / NOISE_FILE
        else:
            raise ValueError(f"{path} holds {len(runs)} run and no {NOISE_FILE}: a calibration is the --out folder "
                             f"of `tfperf run --repeat 5` (runs of the same code in fresh processes)")
    if not path.is_file():
        raise ValueError(f"no such calibration: {path} (the --out folder of `tfperf run --repeat 5`)")
    return Noise.from_json(jsonio.loads(path.read_bytes(), str(path)), str(path))


def differences(noise: Noise, env: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """What differs between the calibration's machine and software and a run's (`env`)."""
    return {k: (noise.env.get(k), env.get(k)) for k in ENV_KEYS
            if noise.env.get(k) is not None and env.get(k) is not None and noise.env.get(k) != env.get(k)}


@dataclasses.dataclass(frozen=True)
class Spread:
    """A figure's run-to-run spread: the standard deviation of its logarithm from one run to the next, its
    degrees of freedom, and where it was learnt (the figure itself, its recipe's figures, the machine's)."""

    sd: float
    df: float
    source: str

    def band(self, runs_a: int = 1, runs_b: int = 1) -> float:
        """The factor (1.12: 12%) within which two sides' geometric means over `runs_a` and `runs_b` runs of
        the same code differ 95% of the time."""
        t = stats.t_quantile(1 - (1 - CONFIDENCE) / 2, self.df)
        return math.exp(t * self.sd * math.sqrt(1 / runs_a + 1 / runs_b))


@dataclasses.dataclass(frozen=True)
class Noise:
    """A calibration: the run-to-run spread of each figure, pooled per recipe, and what it was measured on."""

    runs: int
    spreads: Mapping[Key, tuple[float, float]]  # (variance of the log between runs, degrees of freedom)
    recipes: Mapping[str, tuple[float, float]]  # each recipe's prior (variance, degrees of freedom)
    machine: tuple[float, float]  # the prior of every figure together
    env: Mapping[str, Any]
    args: Mapping[str, Mapping[str, Any]]
    commit: str | None
    measured: str
    where: str = ""

    def spread(self, key: Key) -> Spread:
        """The spread to expect of a figure: its own, pulled toward its recipe's prior; a figure the
        calibration lacks takes its recipe's prior (or, for a recipe it lacks, the machine's)."""
        prior, source = self.recipes.get(key[0]), "its recipe's figures"
        if prior is None:
            prior, source = self.machine, "the machine's figures"
        own = self.spreads.get(key)
        if own is None:
            return Spread(math.sqrt(prior[0]), prior[1], source)
        variance, df = stats.moderated_variance(own[0], own[1], prior[0], prior[1])
        return Spread(math.sqrt(variance), df, "this figure")

    def headline_rerun(self, recipe: str, headline: Headline) -> tuple[float, float] | None:
        """Where a recipe's headline figure lands in a rerun (95%), or None when the figure has no value."""
        if positive(headline.value) is None:
            return None
        return rerun_range(headline.value, self.spread(headline_key(recipe)), headline.ci95)

    def describe(self) -> str:
        """'3 runs at 7fb7b4c (2026-11-25), results/': what the calibration is."""
        return f"{self.runs} runs at {self.commit or 'an unknown commit'} ({self.measured[:10]}), {self.where or '-'}"

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "runs": self.runs, "env": dict(self.env), "args": dict(self.args),
                "commit": self.commit, "measured": self.measured,
                "spreads": [[*key, v, df] for key, (v, df) in self.spreads.items()],
                "recipes": {recipe: [v, df] for recipe, (v, df) in self.recipes.items()},
                "machine": list(self.machine)}

    @classmethod
    def from_json(cls, found: Any, where: str) -> Noise:
        """A calibration read back; ValueError in one line when it is not one tfperf wrote."""
        try:
            if found.get("format") != FORMAT:
                raise ValueError(f"format {found.get('format')!r}")
            spreads = {tuple(map(str, s[:4])): (float(s[4]), float(s[5])) for s in found["spreads"]}
            recipes = {str(k): (float(v[0]), float(v[1])) for k, v in found["recipes"].items()}
            machine = (float(found["machine"][0]), float(found["machine"][1]))
            return cls(int(found["runs"]), spreads, recipes, machine, dict(found["env"]), dict(found["args"]),
                       found.get("commit"), str(found["measured"]), where)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"{where} is not a calibration tfperf wrote ({exc})") from None

    def save(self, folder: Path | str) -> Path:
        """Write it as folder/noise.json."""
        path = Path(folder) / NOISE_FILE
        atomic_write_text(path, json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
        return path
