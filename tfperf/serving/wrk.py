"""wrk (C, HTTP/1.1, Debian's `wrk`) as the reference client tfperf's own load is checked against, and the search
for the most requests/s a client gets within a p99 budget.

wrk runs a closed loop over kept-alive connections from one thread and corrects its latency percentiles for
coordinated omission (a request held back by a slow one is counted from when it should have been sent). Its CPU
seconds come from its own rusage (`os.wait4`), so what the client cost is measured beside what it got.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
GROWTH = 1.05  # the search stops once doubling the connections grows the rate by less than this
MOST_CONNECTIONS = 128


@dataclasses.dataclass(frozen=True)
class WrkRun:
    """What one wrk run got: requests answered, requests/s, p99 in milliseconds, and wrk's own CPU seconds."""

    requests: int
    per_s: float
    p99_ms: float
    cpu_s: float

    @property
    def cpu_per_request_s(self) -> float:
        """wrk's CPU seconds a request."""
        return self.cpu_s / max(self.requests, 1)


def available() -> bool:
    """Whether wrk is on PATH (`apt-get install wrk`; `make install` adds it as root)."""
    return shutil.which("wrk") is not None


def lua_script(body_file: Path, headers: Mapping[str, str]) -> str:
    """The wrk script that POSTs the bytes of `body_file` (read as bytes: binary tensors and JSON alike)."""
    lines = [f'local f = io.open("{body_file}", "rb")', 'wrk.body = f:read("*a")', "f:close()",
             'wrk.method = "POST"', *(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())]
    return "\n".join(lines) + "\n"


def parse(out: str, cpu_s: float) -> WrkRun:
    """A WrkRun from wrk's printed summary (run with --latency); RuntimeError in one line when it failed."""
    rate, p99 = re.search(r"Requests/sec:\s+([0-9.]+)", out), re.search(r"99%\s+([0-9.]+)(us|ms|s)\b", out)
    requests = re.search(r"(\d+) requests in", out)
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk's requests were refused: {' '.join(out.split())[-200:]}")
    if not (rate and p99 and requests):
        raise RuntimeError(f"wrk printed no summary: {' '.join(out.split())[-200:]}")
    return WrkRun(int(requests[1]), float(rate[1]), float(p99[1]) * UNITS_MS[p99[2]], cpu_s)


def post(url: str, body: bytes, headers: Mapping[str, str], *, connections: int, seconds: float) -> WrkRun:
    """POST `body` to `url` from one wrk thread over `connections` kept-alive connections for `seconds`."""
    if not available():
        raise RuntimeError("wrk is not installed: apt-get install wrk")
    with tempfile.TemporaryDirectory(prefix="tfperf-wrk-") as folder:
        (Path(folder) / "body").write_bytes(body)
        (Path(folder) / "post.lua").write_text(lua_script(Path(folder) / "body", headers))
        process = subprocess.Popen(["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s",
                                    f"{folder}/post.lua", url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = process.stdout.read().decode(errors="replace")
        _, _, usage = os.wait4(process.pid, 0)
        process.returncode = 0  # reaped here: Popen must not wait for it again
    return parse(out, usage.ru_utime + usage.ru_stime)


Result = TypeVar("Result")


def most_within(measure: Callable[[int], Result], budget_ms: float, *, rate: Callable[[Result], float],
                p99_ms: Callable[[Result], float]) -> tuple[int, Result] | None:
    """The connections and the result of the most requests/s `measure(connections)` got with p99 within
    `budget_ms`: connections doubled from 1 until p99 passes the budget or the rate grows less than 5%. None when
    one connection is already over the budget."""
    best: tuple[int, Result] | None = None
    connections = 1
    while connections <= MOST_CONNECTIONS:
        found = measure(connections)
        if p99_ms(found) > budget_ms:
            break
        grew = best is None or rate(found) >= rate(best[1]) * GROWTH
        if best is None or rate(found) > rate(best[1]):
            best = (connections, found)
        if not grew:
            break
        connections *= 2
    return best
