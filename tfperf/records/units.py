"""Numbers in the units a reader reads: a metric's value written by what its name says it holds (issue 73).

Records name their metrics the way the code measures them (`first_call_s`, `p99_ms`, `gradient_bytes`,
`input_share`, `mfu`): a table that printed `first_call_s 0.5991` or `mfu 3.944e-04` left the reader to convert.
Each `Unit` below says which names it reads and how it writes a value; the first that reads a name writes it,
and a name none reads is written as a plain number, without exponents.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

# A name ending `_s` holds seconds unless the word before says it counts something per second
# (`samples_s`, `measured_mbit_s`): those are rates.
RATE_WORDS = frozenset({"per", "samples", "steps", "examples", "requests", "rows", "tokens", "batches", "images",
                        "items", "mbit", "bits", "gb", "mb", "flops", "gflops"})
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def number(value: float, digits: int = 4) -> str:
    """About `digits` significant digits, thousands separated, large ones with an SI prefix, no `e` notation."""
    size = abs(value)
    if not math.isfinite(value):
        return f"{value}"  # nan, inf: as Python writes them (a loss that went to NaN is a finding)
    if value == 0 or 1e-3 <= size < 10 ** digits:
        return f"{value:,.{digits}g}"
    if 10 ** digits <= size < 1e6:
        return f"{value:,.0f}"
    if size >= 1e6:
        prefix, scale = next((p, s) for p, s in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)) if size >= s)
        return f"{value / scale:,.4g} {prefix}" if size / scale < 1e4 else f"{value / scale:,.0f} {prefix}"
    if size >= 1e-6:  # small: written out, three significant digits (0.000394)
        places = 2 - math.floor(math.log10(size))
        return f"{value:.{places}f}".rstrip("0")
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa}×10{str(int(exponent)).translate(SUPERSCRIPT)}"


def seconds(value: float) -> str:
    """A duration: µs, ms or s, whichever puts it between 1 and 1000."""
    size = abs(value)
    if value == 0:
        return "0 s"
    if size < 1e-3:
        return f"{number(value * 1e6)} µs"
    if size < 1:
        return f"{number(value * 1e3)} ms"
    return f"{number(value)} s"


def binary_bytes(value: float) -> str:
    """A size in bytes, KiB, MiB or GiB."""
    for suffix, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(value) >= scale:
            return f"{number(value / scale)} {suffix}"
    return f"{number(value)} B"


def decimal_bytes(value: float) -> str:
    """A size in bytes, kB, MB or GB."""
    for suffix, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{number(value / scale)} {suffix}"
    return f"{number(value)} B"


def percent(value: float) -> str:
    """A share (0 to 1) as a percentage."""
    return f"{number(value * 100)}%"


def _time_per(words: list[str], unit: str) -> bool:
    """Whether a metric's name says `unit` per something: `unit`, then `per`, then at least one word."""
    return any(words[i:i + 2] == [unit, "per"] for i in range(len(words) - 2))


@dataclasses.dataclass(frozen=True)
class Unit:
    """Which metric names hold this unit (by their last words) and how a value of it is written."""
    reads: Callable[[list[str]], bool]
    write: Callable[[float], str]


UNITS = (
    Unit(lambda w: w[-1] in ("s", "seconds") and (len(w) < 2 or w[-2] not in RATE_WORDS), seconds),
    Unit(lambda w: w[-1] == "ms" and (len(w) < 2 or w[-2] != "per"), lambda v: seconds(v / 1e3)),
    Unit(lambda w: w[-1] == "us" and (len(w) < 2 or w[-2] != "per"), lambda v: seconds(v / 1e6)),
    # A time per something, its unit before `per`: ms_per_call, s_per_step, engine_ms_per_mib (not MiB).
    Unit(lambda w: _time_per(w, "ms"), lambda v: seconds(v / 1e3)),
    Unit(lambda w: _time_per(w, "s"), seconds),
    Unit(lambda w: w[-1] == "bytes", binary_bytes),
    Unit(lambda w: w[-1] == "mib", lambda v: binary_bytes(v * 2 ** 20)),
    Unit(lambda w: w[-1] == "mb", lambda v: decimal_bytes(v * 1e6)),
    Unit(lambda w: w[-1] == "gb", lambda v: decimal_bytes(v * 1e9)),
    Unit(lambda w: w[-1] in ("share", "fraction", "mfu"), percent),
)


def write(value: float | None, metric: str | None = None) -> str:
    """`value` in the unit `metric`'s name says it holds, or as a plain number ('-' for none)."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "NaN"  # a loss that went to NaN is a finding; "not measured" is None, written "-" by the caller
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    words = metric.lower().split("_") if metric else []
    unit = next((u for u in UNITS if words and u.reads(words)), None)
    if unit:
        return unit.write(value)
    return f"{value:,}" if isinstance(value, int) else number(value)


def span(low: float | None, high: float | None, metric: str | None = None) -> str:
    """A range, its unit said once where both ends have it: '8-10 ms', '900 ms-1.2 s', '12-15%'."""
    a, b = write(low, metric), write(high, metric)
    unit = next((u for u in (" µs", " ms", " s", "%", " KiB", " MiB", " GiB", " TiB", " kB", " MB", " GB", " TB",
                             " B", " M", " G", " T", " P") if a.endswith(u) and b.endswith(u)), None)
    return f"{a[:-len(unit)]}-{b}" if unit else f"{a}-{b}"


def rate(value: float) -> str:
    """A rate in requests or examples per second: whole numbers from 10 up, two digits below (0.47, not 0)."""
    return f"{value:,.0f}" if abs(value) >= 10 or value == 0 else f"{value:.2g}"
