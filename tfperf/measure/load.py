"""Timing requests under load: latency percentiles with intervals, windows, and closed-loop clients.

A `Timer` times one call at a time. A server is judged by its requests: how many it answers per
second, and how long each waits, at a given load. `closed_loop(send, concurrency)` keeps N clients
each sending a request and waiting for its answer (perf_analyzer's concurrency mode), in measurement
windows, until three windows in a row agree within 10% on throughput and p99 (perf_analyzer's
stability rule) or the windows run out; the `LoadLevel` it returns keeps every latency, so each
percentile has its distribution-free 95% interval (`stats.quantile_ci`), and the CPU time the clients
used, so that a reader sees when the load generator, not the server, is the limit. Open-loop load
(arrivals at a rate, latency from each request's scheduled time) is MLPerf LoadGen's, in
`tfperf.serving.loadgen`. NumPy only: nothing here imports TensorFlow.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tfperf.measure.stats import quantile_ci

PERCENTILES = (50, 90, 99)
STABILITY = 0.10  # perf_analyzer's --stability-percentage default
STABLE_WINDOWS = 3  # windows in a row that must agree
MAX_WINDOW_S = 16.0  # a window doubled while it sees no answer stops growing here


@dataclasses.dataclass(frozen=True)
class Window:
    """One measurement window: requests completed in it, and their latencies."""

    seconds: float
    latencies_s: tuple[float, ...]

    @property
    def throughput(self) -> float:
        return len(self.latencies_s) / self.seconds if self.seconds > 0 else 0.0

    @property
    def p99_s(self) -> float:
        return float(np.percentile(self.latencies_s, 99)) if self.latencies_s else math.inf


def stable(windows: Sequence[Window], tolerance: float = STABILITY, count: int = STABLE_WINDOWS) -> bool:
    """perf_analyzer's rule: the last `count` windows' throughput and p99 each within `tolerance` of their mean."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    for values in ([w.throughput for w in last], [w.p99_s for w in last]):
        mean = float(np.mean(values))
        if not math.isfinite(mean) or mean <= 0 or max(abs(v - mean) for v in values) > tolerance * mean:
            return False
    return True


def measured_windows(windows: Sequence[Window]) -> Sequence[Window]:
    """The windows a level's percentiles and rate are read from: all of them. The stability rule decides when to
    stop measuring, not which requests count: reading only the last windows that agreed kept a level's calm
    stretches and left out its stalls (p99 6.6 ms at 4 clients where wrk and h2load, over 3 s straight, saw 12-30 ms
    on the same server)."""
    return windows


@dataclasses.dataclass(frozen=True)
class LoadLevel:
    """What a server did at one load: every measured window's latencies, and its rate."""

    label: str  # "concurrency 4", "rate 200/s"
    latencies_s: tuple[float, ...]
    seconds: float
    windows: tuple[Window, ...] = ()
    stable: bool = True
    client_cpu_s: float = 0.0  # CPU time the clients' threads used over the measured windows
    process_cpu_s: float = 0.0  # CPU time of the process (and of a server process, if any) over the same time
    errors: tuple[str, ...] = ()  # why requests failed (the first few), if any did
    server_seen: bool = True  # the server's CPU is in process_cpu_s (in this process, or a process of this machine)
    client: str = "python"  # who sent the requests: "python" (threads or coroutines here) or a C engine ("h2load")

    @property
    def count(self) -> int:
        return len(self.latencies_s)

    @property
    def throughput(self) -> float:
        """Requests answered per second."""
        return self.count / self.seconds if self.seconds > 0 else 0.0

    def percentile_s(self, p: float) -> float:
        return float(np.percentile(self.latencies_s, p)) if self.latencies_s else math.inf

    def percentile_ci_s(self, p: float) -> tuple[float, float]:
        """The 95% interval of the p-th percentile (inf where the samples cannot bound it)."""
        return quantile_ci(self.latencies_s, p / 100) if self.latencies_s else (math.inf, math.inf)

    @property
    def server_cores(self) -> float | None:
        """The cores the server kept busy while the level ran: the CPU time of this process (and of a server
        process, if any) that the clients did not use, over the measured windows' wall time."""
        wall = sum(w.seconds for w in self.windows)
        if not (self.server_seen and wall > 0 and self.process_cpu_s):
            return None  # an endpoint elsewhere: its CPU is not seen from here
        return max(self.process_cpu_s - self.client_cpu_s, 0.0) / wall

    @property
    def client_cores(self) -> float:
        """The cores the clients kept busy over the measured windows (the level's whole time where it kept none)."""
        wall = sum(w.seconds for w in self.windows) or self.seconds
        return self.client_cpu_s / wall if wall > 0 else 0.0

    @property
    def client_share(self) -> float:
        """The clients' share of the CPU time this process (and the server's, when apart) used while they ran (at
        most 1: the threads' clocks and the process's are read at slightly different moments)."""
        return min(self.client_cpu_s / self.process_cpu_s, 1.0) if self.process_cpu_s > 0 else 0.0

    @property
    def client_cpu_per_request_s(self) -> float | None:
        """The clients' CPU seconds per answered request, over every measured window."""
        answered = sum(len(w.latencies_s) for w in self.windows) or self.count
        return self.client_cpu_s / answered if answered and self.client_cpu_s else None

    def metrics(self) -> dict[str, Any]:
        """Figures for a record: throughput, percentiles in ms with their intervals, stability, client CPU."""
        per_request = self.client_cpu_per_request_s
        found: dict[str, Any] = {"requests_per_s": self.throughput, "requests": self.count,
                                 "stable": self.stable, "client_cpu_share": self.client_share,
                                 "server_cores_used": self.server_cores, "client": self.client,
                                 "client_cpu_us_per_request": per_request * 1e6 if per_request else None}
        for p in PERCENTILES:
            low, high = self.percentile_ci_s(p)
            found[f"p{p}_ms"] = self.percentile_s(p) * 1e3
            found[f"p{p}_ci95_ms"] = [low * 1e3 if math.isfinite(low) else None,
                                      high * 1e3 if math.isfinite(high) else None]
        if self.errors:
            found["errors"] = list(self.errors)
        return found


def closed_loop(send: Callable[[int], Any], concurrency: int, *, window_s: float = 1.0, max_windows: int = 10,
                warmup_s: float = 0.2, label: str | None = None,
                server_cpu: Callable[[], float] | None = None,
                sender_cpu: Callable[[], float] | None = None, server_seen: bool = True,
                loop: asyncio.AbstractEventLoop | None = None) -> LoadLevel:
    """N clients, each sending a request (`send(client)`, which returns when answered) and then the next.

    The clients are threads; with `loop` (an event loop running in a thread of its own), they are coroutines on
    it and `send(client)` returns an awaitable: no request crosses threads, which halves what a request costs
    an asyncio client (benchmarks/load_client_cost.py).

    Measures in windows of `window_s` after `warmup_s`, until the last three agree (stable) or
    `max_windows` ran; the level is built from the stable windows (else from all, marked unstable).
    A request that raises is counted as an error, not a latency. `server_cpu`: the CPU seconds of a
    server in another process, so far (its share is counted with this process's). `sender_cpu`: the CPU
    seconds so far of a thread the clients hand their requests to (an event loop that sends them), counted as
    the clients'. `server_seen`: False for an endpoint elsewhere, whose CPU this process cannot see.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    lock = threading.Lock()
    finished: list[tuple[float, float]] = []  # (end, latency) of each answered request
    errors: list[str] = []
    stop = threading.Event()
    cpu = [0.0] * concurrency

    def answered(t0: float, exc: Exception | None) -> None:
        t1 = time.perf_counter()
        with lock:
            if exc is None:
                finished.append((t1, t1 - t0))
            elif len(errors) < 5:  # a failing request is a result, counted and named
                errors.append(f"{type(exc).__name__}: {exc}"[:4000])  # whole: TF's cause comes after lines of where

    def client(i: int) -> None:
        start_cpu = time.thread_time()
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                send(i)
            except Exception as exc:  # noqa: BLE001
                answered(t0, exc)
                continue
            answered(t0, None)
        cpu[i] = time.thread_time() - start_cpu

    async def coroutine_clients() -> None:
        async def one(i: int) -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    await send(i)
                except Exception as exc:  # noqa: BLE001
                    answered(t0, exc)
                    await asyncio.sleep(0)  # a request that fails at once must not keep the loop from the others
                    continue
                answered(t0, None)

        await asyncio.gather(*(one(i) for i in range(concurrency)))

    threads = [] if loop is not None else [threading.Thread(target=client, args=(i,), daemon=True)
                                           for i in range(concurrency)]
    for thread in threads:
        thread.start()
    running = asyncio.run_coroutine_threadsafe(coroutine_clients(), loop) if loop is not None else None
    windows: list[Window] = []
    try:
        time.sleep(warmup_s)
        begin, cpu_begin = time.perf_counter(), time.process_time() + (server_cpu() if server_cpu else 0.0)
        sent_begin = sender_cpu() if sender_cpu else 0.0
        edge, window = begin, window_s
        while len(windows) < max_windows and not (windows and stable(windows)):
            time.sleep(max(edge + window - time.perf_counter(), 0.0))
            end = time.perf_counter()
            with lock:
                inside = tuple(lat for t, lat in finished if edge <= t < end)
            windows.append(Window(end - edge, inside))
            edge = end
            if errors and not any(w.latencies_s for w in windows):
                break  # every request fails: nothing to wait for
            if not inside and not errors:
                # No answer came in the window: a request takes longer than it (256x256x3 rows as JSON: 0.4 s a
                # request). The next window is twice as long, as perf_analyzer asks for a larger window.
                window = min(2 * window, MAX_WINDOW_S)
        cpu_end = time.process_time() + (server_cpu() if server_cpu else 0.0)
        sent = (sender_cpu() - sent_begin) if sender_cpu else 0.0
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        if running is not None:
            running.result()
    ok = stable(windows)
    used = measured_windows(windows)
    # The clients' CPU over the whole run, scaled to the measured part of it (the warm-up is small).
    total = time.perf_counter() - begin + warmup_s
    measured = sum(w.seconds for w in windows)
    return LoadLevel(label or f"concurrency {concurrency}", tuple(lat for w in used for lat in w.latencies_s),
                     sum(w.seconds for w in used), tuple(windows), ok,
                     client_cpu_s=(sum(cpu) * measured / total if total > 0 else 0.0) + sent,
                     process_cpu_s=cpu_end - cpu_begin, errors=tuple(errors), server_seen=server_seen)
