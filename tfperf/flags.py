"""The command-line flags every recipe shares, defined once; recipes add only their own."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NoReturn

from tfperf.catalog import DATASET_NAMES, MODEL_NAMES


class Stopped(BaseException):
    """SIGTERM (what timeout, Kubernetes and CI send): unwinds like Ctrl-C, so that every `finally` that removes
    a half-written run or writes a partial report still runs."""


_STOP_REQUESTED: list[bool] = []  # set by the command line's SIGTERM handler
_CLEANUPS: list[Callable[[], None]] = []  # what a stop must undo now (innermost last)


@contextmanager
def cleaned_up(cleanup: Callable[[], None]) -> Iterator[None]:
    """Run `cleanup` (removing a staging folder) when the block ends, however it ends. A SIGTERM meanwhile runs it
    and ends the process without unwinding: an exception raised at an arbitrary point of a TensorFlow or
    tf2onnx conversion can crash the interpreter on its way out (seen: SIGSEGV instead of exit 143)."""
    _CLEANUPS.append(cleanup)
    try:
        yield
    finally:
        try:
            cleanup()  # still registered: a SIGTERM in the middle of it finishes it
        finally:
            _CLEANUPS.remove(cleanup)


def pending_cleanups() -> list[Callable[[], None]]:
    """What a stop must undo now, innermost first (see `cleaned_up`)."""
    return _CLEANUPS[::-1]


def request_stop() -> None:
    """Record a SIGTERM. The handler raises `Stopped` too, but Python ignores an exception raised while a
    garbage-collection callback or a destructor runs, so work about to be published checks `check_stop`."""
    _STOP_REQUESTED.append(True)


def check_stop() -> None:
    """Raise `Stopped` if a SIGTERM arrived, even one whose exception was swallowed."""
    if _STOP_REQUESTED:
        raise Stopped()


# An error is read in a terminal: a line longer than this says too much, whatever the input it quotes.
MAX_ERROR_CHARS = 400


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """A message as one line of at most `limit` characters: a longer one loses its middle (counted, not shown),
    since it opens with what was wrong and ends with what to do."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head, tail = (limit - 40) * 2 // 3, (limit - 40) // 3
    return f"{text[:head]} ...({len(text) - head - tail:,} characters cut)... {text[len(text) - tail:]}"


class UserError(Exception):
    """Bad input from the user: a command reports it in one line, with exit code 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad flags in one line with exit code 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def positive_int(text: str) -> int:
    """An integer >= 1, for sizes and counts."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0, for warm-up counts."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def positive_float(text: str) -> float:
    """A number > 0, for durations."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def latency(text: str) -> float:
    """A latency budget in seconds, from `10ms`, `500us`, `0.01s` or a bare number of milliseconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|us|s)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"must be a latency such as 10ms, 500us or 0.01s, got {text!r}")
    value = float(match[1]) * {"ms": 1e-3, "us": 1e-6, "s": 1.0, None: 1e-3}[match[2]]
    if not 1e-6 <= value <= 60:
        raise argparse.ArgumentTypeError(f"must be between 1us and 60s, got {text!r}")
    return value


def percentile(text: str) -> float:
    """A percentile between 50 and 99.99."""
    value = positive_float(text)
    if not 50 <= value <= 99.99:
        raise argparse.ArgumentTypeError(f"must be a percentile between 50 and 99.99, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """Comma-separated whole numbers, each at least 1 (concurrency levels)."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1 or values[-1] > 1024:
        raise argparse.ArgumentTypeError(f"must be numbers from 1 to 1024 such as 1,2,4,8, got {text!r}")
    return values


def length_range(text: str) -> tuple[int, int]:
    """LO:HI, two lengths with 1 <= LO <= HI."""
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise argparse.ArgumentTypeError(f"must be LO:HI token lengths such as 16:128, got {text!r}")
    return int(match[1]), int(match[2])


def parse_size(text: str) -> int:
    """'512MB', '2GB', '1.5G', '300M' or bytes: a size in bytes (powers of 1024)."""
    units = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
             "G": 2**30, "GB": 2**30, "GIB": 2**30}
    cleaned = text.strip().upper().replace(" ", "")
    number = cleaned.rstrip("KMGIB")
    unit = cleaned[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise ValueError(f"{text!r} is not a size: give it as 512MB, 2GB or a number of bytes")
    return int(value * units[unit])


def byte_size(text: str) -> int:
    """An argparse type for sizes: 512MB, 2GB or a number of bytes."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def available_memory() -> int | None:
    """The memory this process can still take, in bytes: the host's available memory, or less where an
    address-space limit (`ulimit -v`) leaves less above what the process already maps (None where the OS
    says neither)."""
    import os
    import resource

    found = []
    try:
        found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            mapped = 0
        found.append(max(soft - mapped, 0))
    return min(found) if found else None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def parse(
    p: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    *,
    sizes: Mapping[str, tuple[int, int]],
) -> argparse.Namespace:
    """Parse argv; each flag in `sizes` left unset takes its (full, quick) default (needs --quick)."""
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    for name, (full, quick) in sizes.items():
        if getattr(args, name, None) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def add_model_flag(p: argparse.ArgumentParser, default: str) -> None:
    """--model, limited to the names get_net knows."""
    p.add_argument("--model", default=default, choices=MODEL_NAMES, help="network from tfperf.get_net")


def link(text: str) -> str:
    """A --link value (a rate such as 1gbit), checked here, kept as its text."""
    from tfperf.cluster.hosts import parse_link

    try:
        parse_link(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_cluster_flags(p: argparse.ArgumentParser, *, sizes_help: str, link_help: str) -> None:
    """--workers, --sizes, --timeout and --link, for recipes that start a cluster of processes."""
    p.add_argument("--workers", type=positive_int, default=2, help="worker processes to start")
    p.add_argument("--sizes", type=positive_int, nargs="+", help=sizes_help)
    p.add_argument("--timeout", type=positive_int, default=600, help="seconds before the cluster is killed")
    p.add_argument("--link", type=link, help=f"{link_help}, joined by links of this rate: 100mbit, 1gbit, 10gbit, "
                                             f"25gbit or a rate (as root; tfperf.cluster.hosts)")


def add_dataset_flag(p: argparse.ArgumentParser, default: str) -> None:
    """--dataset, limited to the names tfperf.data knows."""
    p.add_argument("--dataset", default=default, choices=DATASET_NAMES,
                   help="mnist-5k, synthetic and digits work offline; mnist and fashion_mnist download once")
