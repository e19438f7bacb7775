"""Measurement records: one JSON object a line, each carrying the environment it was measured in."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfperf import jsonio
from tfperf.records.environment import cpu_times, environment, stolen_share

if TYPE_CHECKING:  # imported only for annotations: records load without TensorFlow
    from tfperf.measure.measurement import Measurement
    from tfperf.measure.rounds import Baseline
    from tfperf.measure.stats import Comparison

REQUIRED_KEYS = ("recipe", "table", "row", "primary", "lower_is_better", "metrics", "args", "env")


def make_record(
    recipe: str,
    table: str,
    row: str,
    metrics: Mapping[str, Any],
    *,
    primary: str,
    lower_is_better: bool,
    args: Mapping[str, Any] | None = None,
    env: Mapping[str, Any] | None = None,
    versus_first: bool = True,
    measurement: Measurement | None = None,
    comparison: Comparison | None = None,
) -> dict[str, Any]:
    """One row of a recipe's table; `primary` names the metric that speedups and plots use.

    `versus_first=False` marks a table whose rows are not alternatives to its first row (a projection,
    a sweep of independent cases): the report then gives it no speedup column.
    A timed row passes its `measurement`: the record keeps the raw samples (`samples_s`), `n` and
    `ci95`, the primary metric's 95% interval. The primary metric must be proportional to the time
    per call (lower is better: ms per call, us per row) or to its inverse (higher is better: rows per
    second), so that the interval of the median time maps onto it. A row judged against another
    passes the `comparison` (bench.versus): `versus` names that row; `ratio` (how many times better
    this row is), `ratio_ci95` and `verdict` come with it.
    """
    if primary not in metrics:
        raise ValueError(f"primary metric {primary!r} is not among the metrics {sorted(metrics)}")
    record = {
        "recipe": recipe,
        "table": table,
        "row": row,
        "primary": primary,
        "lower_is_better": lower_is_better,
        "versus_first": versus_first,
        "metrics": dict(metrics),
        "args": dict(args or {}),
        "env": dict(env) if env is not None else environment(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if measurement is not None:
        record.update(measured_fields(measurement, float(metrics[primary]), lower_is_better))
    if comparison is not None:
        record.update(compared_fields(comparison))
    return record


def measured_fields(m: Measurement, primary_value: float, lower_is_better: bool) -> dict[str, Any]:
    """A timed row's raw samples, their summary, and the primary metric's 95% interval."""
    low, high = m.ci95_s
    median = m.median_s
    if lower_is_better:  # the metric is proportional to the time
        ci = [primary_value * low / median, primary_value * high / median]
    else:  # to its inverse: the slow end of the time is the low end of the rate
        ci = [primary_value * median / high, primary_value * median / low]
    return {"samples_s": list(m.samples_s), "n": m.n, "ci95": ci, "timing": m.summary()}


def compared_fields(c: Comparison) -> dict[str, Any]:
    """A row judged against another: which, by how much, how sure, the verdict, and the evidence: the
    times per item both sides were judged on (the baseline re-measured beside this row, not its own
    row's samples) and the rounds that paired them, so that `stats.compare_times` can re-judge it."""
    fields = {"versus": c.baseline, "ratio": c.ratio, "ratio_ci95": list(c.ci95), "verdict": c.verdict}
    if c.samples is not None:
        fields["compared"] = {"baseline_per_item_s": list(c.samples[0]), "candidate_per_item_s": list(c.samples[1]),
                              "rounds": c.units if c.paired else None, "threshold": c.threshold,
                              **({"statistic": c.statistic} if c.statistic != "median" else {})}
    return fields


def atomic_write_text(path: Path | str, text: str) -> None:
    """Write a text file so that readers see the old content or the new, never half of it."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write a file so that readers see the old content or the new, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_records(path: Path | str, records: Iterable[Mapping[str, Any]]) -> Path:
    """Replace `path` with these records, one JSON object a line."""
    lines = [json.dumps(r, sort_keys=True, default=_jsonable) for r in records]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return Path(path)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, Path) or hasattr(value, "as_numpy_dtype"):  # paths, tf.DType
        return str(value)
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"cannot record a {type(value).__name__} as JSON")


def read_records(path: Path | str) -> list[dict[str, Any]]:
    """Read records back, with a clear error naming the file and line if one is malformed."""
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = jsonio.loads(line, f"{path}:{number}")
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not a JSON record ({exc})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: not a JSON record (a {type(record).__name__}, not an object)")
        missing = [k for k in REQUIRED_KEYS if k not in record]
        if missing:
            raise ValueError(f"{path}:{number}: record lacks {', '.join(missing)}")
        records.append(record)
    return records


class Recorder:
    """Collects one recipe's records, with the environment read once, and saves them together."""

    def __init__(self, recipe: str, args: Mapping[str, Any]):
        self.recipe = recipe
        self.args = {k: v for k, v in args.items()}
        self.env = environment()
        self.records: list[dict[str, Any]] = []
        self._cpu_times = cpu_times()

    def add(self, table: str, row: str, metrics: Mapping[str, Any], *, primary: str,
            lower_is_better: bool, versus_first: bool = True, measurement: Measurement | None = None,
            comparison: Comparison | None = None) -> dict[str, Any]:
        """Record one row of `table` (see make_record for `measurement` and `comparison`)."""
        record = make_record(self.recipe, table, row, metrics, primary=primary, lower_is_better=lower_is_better,
                             args=self.args, env=self.env, versus_first=versus_first,
                             measurement=measurement, comparison=comparison)
        self.records.append(record)
        return record

    def table(self, table: str) -> list[dict[str, Any]]:
        """The rows of one table, in the order added."""
        return [r for r in self.records if r["table"] == table]

    def save(self, out: Path | str) -> Path:
        """Replace out/<recipe>.jsonl with this run's records, each with the CPU time stolen while they were taken."""
        stolen = stolen_share(self._cpu_times, cpu_times())
        if stolen is not None:
            for record in self.records:
                record["env"]["cpu_steal"] = round(stolen, 4)
        return write_records(Path(out) / f"{self.recipe}.jsonl", self.records)


@dataclasses.dataclass(frozen=True)
class Raced:
    """A table measured by `race_table`: each row's Measurement, and its comparison with its baseline."""

    measurements: dict[str, Measurement]
    comparisons: dict[str, Comparison]

    def __getitem__(self, row: str) -> Measurement:
        return self.measurements[row]


def race_table(rec: Recorder, table: str, timers: Sequence, *,
               metrics: Callable[[Measurement, Mapping[str, Measurement]], Mapping[str, Any]], primary: str,
               lower_is_better: bool, against: Mapping[str, Baseline] | None = None, versus_first: bool = True,
               **race_options: Any) -> Raced:
    """Measure a table in one call: race the timers in interleaved rounds (`tfperf.measure.race`, which
    takes `rounds`, `samples`, `threshold`, `max_extensions`, ... as `race_options`), judge each row against
    its baseline (`against`: a row's name, or a function of the measurements; default: the first row),
    and record every row with its samples and comparison. `metrics(m, measurements)` gives a row's figures."""
    from tfperf.measure.rounds import race

    names = [t.name for t in timers]
    pairs = dict(against) if against is not None else {name: names[0] for name in names[1:]}
    ms, comparisons = race(timers, against=pairs, **{"max_extensions": 0, **race_options})
    found = dict(zip(names, ms))
    compared = dict(zip(pairs, comparisons))
    for row in names:
        rec.add(table, row, metrics(found[row], found), primary=primary, lower_is_better=lower_is_better,
                measurement=found[row], comparison=compared.get(row), versus_first=versus_first)
    return Raced(found, compared)

