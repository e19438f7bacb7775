"""The best configurations measured as a deployment serves them: each started as `tfperf serve` in a process of its
own and called through sockets, over KServe v2's binary tensors (HTTP) and TF Serving's gRPC API, by the client
`tfperf load --url` uses; their answers checked against the runtime's own call before any load is timed, the
server's metrics read around each level (time in the queue and in the model). The best is tried again in a
worker process per core, one runtime thread each: threads of one process share Python's GIL, processes do not,
so only a socket can measure that configuration. An echo of the winner's answers measures the client's ceiling."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from tfperf.serving.configs import ServingConfig
from tfperf.serving.runtimes import RUNTIMES
from tfperf.serving.search import Budget, Swept
from tfperf.serving.ready import ready_ports

PROTOCOLS = ("v2", "grpc")  # the fastest over HTTP (binary tensors) and TF Serving's gRPC


class ServeError(RuntimeError):
    """`tfperf serve` did not come up: what it said last."""


@dataclasses.dataclass(frozen=True)
class Through:
    """One configuration served by `tfperf serve` and measured through a socket in one protocol."""

    config: ServingConfig  # what the server ran (serve.json)
    protocol: str  # the endpoint's protocol (tfperf.serving.endpoint.PROTOCOLS)
    swept: Swept  # the closed-loop sweep through the socket; its config is labelled with both

    def rate_within(self, budget: Budget) -> float:
        return self.swept.rate_within(budget)


def candidates(ranked: Sequence[Swept], cores: int, count: int) -> list[ServingConfig]:
    """The `count` best configurations `tfperf serve` can run, then the best again in a worker process per core
    with one runtime thread each (when there is more than one core)."""
    picked = list(dict.fromkeys(s.config for s in ranked if s.config.runtime in RUNTIMES))[:count]
    if picked and cores > 1:
        picked.append(dataclasses.replace(picked[0], workers=cores, threads=1))
    return picked


def label(config: ServingConfig, protocol: str) -> str:
    """How a configuration measured through a socket is named in the report and the records ("rest-columnar": TF
    Serving REST's columnar format)."""
    from tfperf.serving.endpoint import Endpoint

    wire = Endpoint(protocol.removesuffix("-columnar"), "", 0, "", columnar=protocol.endswith("-columnar"))
    return f"{config.name}, through {wire.name}"


class ServeProcess:
    """`tfperf serve EXPORT --config ...` on free ports of 127.0.0.1, in a process of its own (its workers too):
    `ports` (HTTP, gRPC) once every worker answers, `cpu_s()`; close it when done (SIGTERM: it drains)."""

    def __init__(self, export: Path, config: ServingConfig, name: str, log: Path, *, trust: bool = False,
                 timeout_s: float = 300.0):
        log.parent.mkdir(parents=True, exist_ok=True)
        settings = log.with_suffix(".json")
        settings.write_text(json.dumps(config.to_json()))
        argv = [sys.executable, "-m", "tfperf", "serve", str(export), "--config", str(settings), "--name", name,
                "--port", "0", "--grpc-port", "0", "--poll-seconds", "60", *(["--trust"] if trust else [])]
        self.log = log
        with open(log, "wb") as errors:
            self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True,
                                            start_new_session=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.process.stdout] + [lines.put(None)],
                         daemon=True).start()
        ready = []
        try:
            while len(ready) < config.workers:
                line = lines.get(timeout=timeout_s)
                if line is None:
                    raise ServeError(f"tfperf serve ended (exit {self.process.wait()}): {self._last_words()}")
                ports = ready_ports(line)
                if ports:
                    ready.append(ports)
        except queue.Empty:
            self.close()
            raise ServeError(f"tfperf serve did not answer within {timeout_s:.0f} s: {self._last_words()}") from None
        except BaseException:
            self.close()
            raise
        self.ports = ready[0]

    def _last_words(self) -> str:
        said = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        return said[-1][:300] if said else "nothing"

    def cpu_s(self) -> float:
        """CPU seconds the server and its workers have used so far."""
        import psutil

        try:
            parent = psutil.Process(self.process.pid)
            processes = [parent, *parent.children(recursive=True)]
        except psutil.Error:
            return 0.0
        total = 0.0
        for p in processes:
            try:
                times = p.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bench_for(bench, server: ServeProcess, protocol: str, name: str, runtime: str, *, columnar: bool = False):
    """A copy of `bench` (same requests, budget, sizes, records) that measures `server` in `protocol` (TF Serving
    REST `columnar` or in rows), checks its answers against `runtime`'s own call and reads its metrics around
    each level."""
    from tfperf.serving.endpoint import Endpoint
    from tfperf.serving.scrape import METRICS_PATH

    port = server.ports[0] if protocol in ("rest", "v2") else server.ports[1]
    return dataclasses.replace(bench, endpoint=Endpoint(protocol, "127.0.0.1", port, name, columnar=columnar),
                               endpoint_runtime=runtime, endpoint_cpu=server.cpu_s,
                               metrics_url=f"http://127.0.0.1:{server.ports[0]}{METRICS_PATH}")


def sweep_protocols(bench, server: ServeProcess, config: ServingConfig, name: str,
                    protocols: Sequence[str] = PROTOCOLS, say=lambda what: None,
                    concurrencies: list[int] | None = None) -> list[Through]:
    """One running server swept in closed loop in each protocol ("rest-columnar": TF Serving REST's columnar
    format), at the given levels or doubling within the budget, its answers checked first in each."""
    found = []
    for protocol in protocols:
        wire, columnar = protocol.removesuffix("-columnar"), protocol.endswith("-columnar")
        measuring = bench_for(bench, server, wire, name, config.runtime, columnar=columnar)
        labelled = ServingConfig("endpoint", label=label(config, protocol))
        say(f"closed loop: {labelled.name}")
        found.append(Through(config, protocol, measuring.sweep(labelled, concurrencies)))
    return found


def sweep_through(bench, configs: Sequence[ServingConfig], exports: dict, name: str, logs: Path, budget: Budget, *,
                  trust: bool = False, say=lambda what: None) -> tuple[list[Through], Through | None, ServeProcess | None]:
    """Each configuration served by `tfperf serve` and swept in closed loop in every one of PROTOCOLS; one that
    does not start, fails or answers differently is kept, dropped, with its reason. Returns them all, the best
    within the budget (`best_through`) and its server, still running (the caller closes it): the best's open
    loop and validation then measure the server its sweep measured, not a second start of it."""
    found: list[Through] = []
    best, kept = None, None
    try:
        for i, config in enumerate(configs):
            say(f"through a socket: starting tfperf serve ({config.name})")
            try:
                server = ServeProcess(Path(exports[config.runtime]), config, name, logs / f"serve-{i}.log",
                                      trust=trust)
            except ServeError as exc:
                for protocol in PROTOCOLS:
                    labelled = ServingConfig("endpoint", label=label(config, protocol))
                    found.append(Through(config, protocol, bench._dropped(labelled, str(exc))))
                continue
            try:
                swept = sweep_protocols(bench, server, config, name, PROTOCOLS, say)
            except BaseException:
                server.close()
                raise
            found += swept
            leader = best_through(found, budget)
            if leader is not None and any(leader is t for t in swept):  # this server leads: the last leader stops
                if kept is not None:
                    kept.close()
                best, kept = leader, server
            else:
                server.close()
    except BaseException:
        if kept is not None:
            kept.close()
        raise
    return found, best, kept


def best_through(found: Sequence[Through], budget: Budget) -> Through | None:
    """The configuration and protocol that served the most within the budget through a socket, or None."""
    usable = [t for t in found if not t.swept.dropped and t.rate_within(budget) > 0]
    return max(usable, key=lambda t: t.rate_within(budget), default=None)


def open_and_validate(bench, best: Through, server: ServeProcess, name: str, *,
                      say=lambda what: None) -> tuple[tuple[float, float], tuple[list, str], Swept,
                                                      tuple[float, float] | None]:
    """The best through a socket, on the server its sweep ran on (closed when done): LoadGen Server's highest rate
    within the budget (and the next rate tried, which missed), the validation runs at it, and the client's
    ceiling (`client_ceiling`) in its protocol."""
    with server:
        measuring = bench_for(bench, server, best.protocol, name, best.config.runtime)
        say(f"open loop (LoadGen Server): {best.swept.config.name}")
        bracket = measuring.open_loop_of(best.swept)
        rate = measuring.validation_rate(best.swept, bracket)
        say(f"validation (LoadGen Server) at {rate:.0f}/s")
        validations = measuring.validate(best.swept.config, rate)
        echo, echo_bracket = client_ceiling(measuring, measuring.endpoint, say)
    return bracket, validations, echo, echo_bracket


def client_ceiling(bench, endpoint, say=lambda what: None) -> tuple[Swept, tuple[float, float] | None]:
    """An echo of the endpoint's answers (no work, a process of its own) measured with the same client, load and
    rules: the closed-loop sweep and, when it met the budget, LoadGen's bracket."""
    import asyncio

    from tfperf.serving.echo import EchoProcess, record
    from tfperf.serving.endpoint import RemoteServer

    with RemoteServer(endpoint) as remote:
        remote._encode(bench.requests[0])
        recorded = asyncio.run_coroutine_threadsafe(record(remote), remote.loop).result(60)
    config = ServingConfig("endpoint", label=f"the client's ceiling: an echo of its answers ({endpoint.name})")
    with EchoProcess(recorded) as echo:
        measuring = dataclasses.replace(bench, endpoint=dataclasses.replace(endpoint, host="127.0.0.1", port=echo.port),
                                        endpoint_runtime=None, endpoint_cpu=None, metrics_url=None)
        say(f"closed loop: {config.name}")
        swept = measuring.sweep(config)
        bracket = None
        if not swept.dropped and swept.rate_within(bench.budget) > 0:
            say(f"open loop (LoadGen Server): {config.name}")
            bracket = measuring.open_loop_of(swept)
    return swept, bracket
