"""Ceilings on a model's run: the time and the memory a process may spend loading and running a model whose ops
are allowed but may still loop or allocate without bound; past either it ends itself with one line (exit 2).
`tfperf predict` runs under them, and so do the doctor's thread-sweep processes."""

from __future__ import annotations

import contextlib
import sys

from tfperf import flags

TIME_LIMIT_S = 300.0  # predict's default time ceiling for loading and running the model
MEMORY_SHARE = 0.8  # its default memory ceiling: this share of the memory the process could take when it began


def _resident_bytes() -> int:
    import os

    try:
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def ceiling_beyond_now(allowance: float) -> int:
    """The resident memory at which this process has taken `allowance` bytes beyond what it holds now (TensorFlow
    imported holds 800 MB, 560 of them its libraries' pages)."""
    return int(_resident_bytes() + allowance)


def default_memory_ceiling() -> int | None:
    """MEMORY_SHARE of what the process can still take (ulimit -v included), above what it holds now."""
    free = flags.available_memory()
    return ceiling_beyond_now(MEMORY_SHARE * free) if free else None


@contextlib.contextmanager
def ceilings(command: str, time_s: float | None, memory_bytes: int | None, poll_s: float = 0.02):
    """While the block runs, a thread ends the process itself with one line on stderr (exit 2) when the block
    has run `time_s` seconds or the process's resident memory passes `memory_bytes`: a model of allowed ops can
    still loop or allocate without bound, and neither a traceback nor the kernel's OOM killer is an answer.
    The commands write what they write atomically after the block, so nothing half-written is left."""
    import os
    import threading
    import time

    stop = threading.Event()

    def end(line: str) -> None:
        sys.stderr.write(f"tfperf {command}: error: {line}\n")
        sys.stderr.flush()
        os._exit(2)

    def watch() -> None:
        began = time.monotonic()
        while not stop.wait(poll_s):
            if time_s is not None and time.monotonic() - began > time_s:
                end(f"the model ran past the {time_s:g} s time ceiling (--time-limit): it was stopped")
            held = _resident_bytes()
            if memory_bytes is not None and held > memory_bytes:
                end(f"the model took {held / 2**20:,.0f} MB of memory, past the {memory_bytes / 2**20:,.0f} MB "
                    f"ceiling (--memory-limit): it was stopped")

    thread = threading.Thread(target=watch, name="ceilings", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
