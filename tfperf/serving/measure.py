"""Measuring serving configurations on an export: closed-loop sweeps, LoadGen rate searches, validation.

`Bench` holds what every measurement shares: the exports by runtime, the requests (one row each),
the budget, the sizes (windows, probe lengths) and the recorder. Each configuration's server is
checked to answer as the runtime's own unbatched call does before any load is timed; a server that
fails or disagrees is dropped with its reason and the rest go on.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.errors import first_line, said_line
from tfperf.measure.load import LoadLevel, closed_loop
from tfperf.serving import loadgen
from tfperf.serving.batcher import Arrays, BatchingOptions
from tfperf.serving.configs import ServingConfig, answers_vary, batch_function_server, check_agreement
from tfperf.serving.runtimes import BATCH_FUNCTION, export_of
from tfperf.serving.search import Budget, Swept, bracket_rate, concurrency_sweep

ANCHOR = ServingConfig("savedmodel", None, 1)  # the SavedModel signature, one request at a time


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How long each measurement runs."""

    window_s: float = 1.0
    max_windows: int = 10
    warmup_s: float = 0.3
    probe_s: float = 3.0  # one LoadGen Server probe of a rate
    probes: int = 5  # probes per open-loop rate search
    probe_cap_s: float = 60.0  # a probe at a low rate asks for fewer than its 100 queries rather than run longer
    validation_s: float = 10.0
    validation_cap_s: float = 900.0  # LoadGen validation runs of one answer, in all (a slow model's runs are long)
    max_concurrency: int = 64
    concurrency_factor: int = 2  # closed-loop levels 1, f, f^2, ...
    bisect_steps: int = 3  # levels between the last within the budget and the first over it
    instances: tuple[int, ...] = (1, 2, 4)  # the search's space
    batch_sizes: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    all_thread_counts: bool = True  # LiteRT and ONNX Runtime at 1 thread and at every core; else every core only
    socket_candidates: int = 2  # the best served by tfperf serve and measured through sockets (and the best again
    # with a worker process per core)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(window_s=0.25, max_windows=6, warmup_s=0.1, probe_s=0.8, probes=4, validation_s=2.0,
                   probe_cap_s=15.0, validation_cap_s=90.0, max_concurrency=32, bisect_steps=2, concurrency_factor=4,
                   instances=(1, 2), batch_sizes=(4, 16, 64), all_thread_counts=False, socket_candidates=1)


MIN_PROBE_QUERIES = 20  # an open-loop probe's fewest: its percentile is then near its slowest query


def batch_function_config(cores: int) -> ServingConfig:
    """TensorFlow's own batching op with TF Serving's usual CPU settings: a batch thread per core."""
    return ServingConfig(BATCH_FUNCTION, None, cores,
                         BatchingOptions(max_batch_size=32, batch_timeout_micros=1000, num_batch_threads=cores))


@dataclasses.dataclass
class Bench:
    """The exports, requests, budget and sizes every measurement of one `tfperf load` run shares. It holds what
    the measurements are given and what they load once; what they find is returned (`Swept`, LoadGen results)."""

    exports: dict[str, Path]  # runtime -> export folder
    requests: list[Arrays]
    budget: Budget
    sizes: Sizes
    rec: Any  # a tfperf.records.Recorder
    logs: Path  # LoadGen logs of the validation runs
    server_process: Any = None  # a remote.ServerProcess: the servers run there, the clients here
    endpoint: Any = None  # a running server (tfperf.serving.endpoint.Endpoint): configurations "endpoint" reach it
    endpoint_runtime: str | None = None  # the runtime the endpoint serves, when known: its answers are checked
    endpoint_cpu: Callable[[], float] | None = None  # the endpoint's CPU seconds so far, when it runs on this machine
    metrics_url: str | None = None  # the endpoint's Prometheus metrics (tfperf.serving.scrape): latency split
    client: str = "python"  # who sends a closed loop's requests through a socket: "python" (the endpoint's own
    # RemoteServer, on its event loop) or "h2load" (tfperf.serving.h2load: C, a tenth of the CPU a request)
    # Caches, shared by the copies through_socket makes: what they hold is loaded or started once.
    references: dict[str, Callable[[Arrays], Arrays]] = dataclasses.field(default_factory=dict)
    tf_processes: dict[int, Any] = dataclasses.field(default_factory=dict)  # SavedModel children by intra-op threads
    varies: dict[str, bool] = dataclasses.field(default_factory=dict)  # runtime -> answers_vary of its reference

    def reference(self, runtime: str) -> Callable[[Arrays], Arrays]:
        """The runtime's own unbatched call, loaded once: what every server of it must answer."""
        from tfperf.deploy.layout import load

        source = export_of(runtime)
        if source not in self.references:
            self.references[source] = load(self.exports[source])
        return self.references[source]

    @property
    def one_shape(self) -> bool:
        """Whether every request has the same shapes: h2load sends one of them again and again, which then
        measures the same work (requests of many lengths keep the Python client, which cycles through them)."""
        return len({tuple((k, np.shape(v)) for k, v in r.items()) for r in self.requests}) == 1

    def server(self, config: ServingConfig):
        """The configuration's server (close it when done), in the server process when there is one."""
        if config.runtime == "endpoint":
            from tfperf.serving.endpoint import RemoteServer

            # Connections up to http1's most, not the closed loop's: LoadGen's open loop has as many requests out
            # as its arrivals make, and one waiting for a connection here would be the client's delay.
            remote = RemoteServer(self.endpoint)
            remote.cpu_s = self.endpoint_cpu
            return remote
        if self.server_process is not None:
            source = export_of(config.runtime)
            process = self.server_process
            if config.runtime == "savedmodel" and config.threads is not None:
                process = self._tf_process(config.threads)
            return process.open(config, self.exports[source], self.requests[0])
        if config.runtime == BATCH_FUNCTION:
            return batch_function_server(self.exports["savedmodel"], config.batching, self.requests[0])
        return config.server(self.exports[config.runtime])

    def _tf_process(self, threads: int):
        """A server process whose TensorFlow runs `threads` intra-op threads (started on first use)."""
        from tfperf.serving.remote import ServerProcess

        if threads not in self.tf_processes:
            self.tf_processes[threads] = ServerProcess(intra_op_threads=threads)
        return self.tf_processes[threads]

    def close(self) -> None:
        """End the server processes this bench started (not the one it was given)."""
        for process in self.tf_processes.values():
            process.close()
        self.tf_processes.clear()

    def level(self, server, concurrency: int, splits: dict[str, dict[str, float]] | None = None) -> LoadLevel:
        """One closed-loop level: `concurrency` clients, each cycling through the requests from its own offset;
        with `metrics_url`, the server's own split of the time goes into `splits` under the level's label."""
        from tfperf.serving import scrape

        counters = [itertools.count(i * 7) for i in range(concurrency)]
        n = len(self.requests)
        before = scrape.snapshot(self.metrics_url) if self.metrics_url else None
        if self.client == "h2load" and getattr(server, "endpoint", None) is not None and self.one_shape:
            from tfperf.serving import h2load

            level = h2load.closed_loop(server.endpoint, server.encoded(self.requests[0]), concurrency,
                                       window_s=self.sizes.window_s, max_windows=self.sizes.max_windows,
                                       warmup_s=self.sizes.warmup_s, server_cpu=getattr(server, "cpu_s", None),
                                       server_seen=self.endpoint_cpu is not None, timeout_s=server.timeout_s)
        else:
            # A client with an event loop of its own (RemoteServer) is driven by coroutines on it: no thread
            # hand-over.
            send = getattr(server, "send", None)
            send = send if inspect.iscoroutinefunction(send) and getattr(server, "loop", None) is not None else None
            level = closed_loop(lambda client: (send or server)(self.requests[next(counters[client]) % n]),
                                concurrency, window_s=self.sizes.window_s, max_windows=self.sizes.max_windows,
                                warmup_s=self.sizes.warmup_s, server_cpu=getattr(server, "cpu_s", None),
                                sender_cpu=getattr(server, "sender_cpu_s", None),
                                server_seen=self.endpoint is None or self.endpoint_cpu is not None,
                                loop=server.loop if send is not None else None)
        if before is not None and splits is not None:
            splits[level.label] = scrape.split(before, scrape.snapshot(self.metrics_url))
        return level

    def sweep(self, config: ServingConfig, concurrencies: list[int] | None = None) -> Swept:
        """The configuration checked, then swept in closed loop (given levels, or doubling within the budget)."""
        try:
            server = self.server(config)
        except Exception as exc:  # noqa: BLE001  (a runtime that cannot serve this way is dropped, named)
            return self._dropped(config, f"does not start ({type(exc).__name__}: {first_line(exc, 150)})")
        runtime = self.endpoint_runtime if config.runtime == "endpoint" else config.runtime
        with server:
            # A running endpoint's model is not known here unless it was served from these exports: then its
            # answers through the socket are checked as any server's; otherwise they are the user's to check.
            wrong = None
            if runtime is not None:
                answering = server.decoding() if config.runtime == "endpoint" else server
                wrong = check_agreement(answering, self.reference(runtime), self.requests)
            if wrong:
                return self._dropped(config, wrong)
            if runtime is not None and runtime not in self.varies:
                self.varies[runtime] = answers_vary(self.reference(runtime), self.requests)
            splits: dict[str, dict[str, float]] = {}
            if concurrencies:
                levels = [self.level(server, c, splits) for c in concurrencies]
            else:
                levels = concurrency_sweep(lambda c: self.level(server, c, splits), self.budget,
                                           limit=self.sizes.max_concurrency, factor=self.sizes.concurrency_factor,
                                           bisect=self.sizes.bisect_steps)
            padding = getattr(server, "padding", None)
        failing = next((lv for lv in levels if lv.errors), None)
        if failing is not None:
            why = said_line(str(failing.errors[0]))
            return self._dropped(config, f"requests failed at {failing.label}: {why}", levels)
        self._record_levels(config, levels, padding, splits)
        return Swept(config, tuple(levels), padding=padding, splits=splits,
                     outputs_vary=self.varies.get(runtime) if runtime is not None else None)

    def _dropped(self, config: ServingConfig, why: str, levels=()) -> Swept:
        # The reason goes into a table cell: one line, what went wrong (a TensorFlow error's text runs to dozens of
        # lines of where it happened), no column separator.
        why = said_line(why).replace("|", "/")
        self.rec.add("configurations", config.name, {**config.settings(), "dropped": why,
                                                     "requests_per_s_within_budget": 0.0},
                     primary="requests_per_s_within_budget", lower_is_better=False, versus_first=False)
        return Swept(config, tuple(levels), why)

    def _record_levels(self, config: ServingConfig, levels: list[LoadLevel], padding: float | None,
                       splits: dict[str, dict[str, float]]) -> None:
        from tfperf.measure.measurement import Measurement

        extra = {"useful_token_share": padding} if padding is not None else {}
        for level in levels:
            split = splits.get(level.label, {})
            self.rec.add(f"closed loop: {config.name}", level.label, {**level.metrics(), **config.settings(), **extra,
                                                                       **split},
                         primary="p50_ms", lower_is_better=True, versus_first=False,
                         measurement=Measurement(level.label, level.latencies_s) if level.latencies_s else None)

    def offered(self, server, rate: float, *, seconds: float, min_queries: int, log_dir: Path | None = None,
                scenario: str = "Server") -> loadgen.LoadGenResult:
        """One LoadGen run against a running server."""
        n = len(self.requests)
        return loadgen.run(lambda i: server.submit(self.requests[i % n]), n, scenario=scenario, rate=rate,
                           latency_s=self.budget.latency_s, percentile=self.budget.percentile, duration_s=seconds,
                           min_queries=min_queries, log_dir=log_dir)

    def open_loop(self, config: ServingConfig, start_rate: float, capacity: float = math.inf) -> tuple[float, float]:
        """The highest LoadGen Server rate found within the budget and the lowest found over it, never probing
        above `capacity` (the most the configuration answered in closed loop)."""
        with self.server(config) as server:
            def within(rate: float) -> bool:
                # A slow model's probes asked for 100 queries at 1 request/s and went down from there: 11 minutes.
                result = self.offered(server, rate, seconds=self.sizes.probe_s, min_queries=self.probe_queries(rate))
                self.rec.add(f"open loop: {config.name}", f"rate {rate:.0f}/s", {**result.metrics(),
                             **config.settings()}, primary="completed_qps", lower_is_better=False, versus_first=False)
                return result.latency_met and not result.errors

            return bracket_rate(within, max(start_rate, 1.0), steps=self.sizes.probes, limit=capacity)

    def open_loop_of(self, swept: Swept) -> tuple[float, float]:
        """`open_loop` of a configuration swept in closed loop: from 0.9x its rate within the budget, never above
        the most it answered."""
        return self.open_loop(swept.config, 0.9 * swept.rate_within(self.budget),
                              max(lv.throughput for lv in swept.levels))

    def validation_rate(self, swept: Swept, bracket: tuple[float, float] | None) -> float:
        """The rate to validate at: the highest open-loop rate found within the budget; where every probe missed
        it, a step below the lowest that missed (validation's own 15%: it validated from 0.8x the closed-loop rate,
        2.6 times a rate already seen to miss); with no open loop, 0.8x the closed-loop rate within it."""
        if bracket and bracket[0]:
            return bracket[0]
        if bracket and math.isfinite(bracket[1]):
            return loadgen.VALIDATION_STEP * bracket[1]
        return 0.8 * swept.rate_within(self.budget)

    def validate(self, config: ServingConfig, rate: float, tries: int = 4) -> tuple[list[loadgen.LoadGenResult], str]:
        """LoadGen Server runs at `rate` until one is VALID (`loadgen.validated`'s rule), their logs kept, within the
        sizes' validation cap: (the runs, why one was not run, or '')."""
        with self.server(config) as server:
            def offer(rate: float, queries: int) -> loadgen.LoadGenResult:
                folder = self.logs / f"{time.strftime('%H%M%S')}-{next(attempt)}"
                result = self.offered(server, rate, seconds=self.sizes.validation_s, min_queries=queries,
                                      log_dir=folder)
                self.rec.add("validation", f"{config.name} at {rate:.0f}/s, {queries} queries",
                             {**result.metrics(), **config.settings(), "log_dir": str(folder)},
                             primary="completed_qps", lower_is_better=False, versus_first=False)
                return result

            attempt = itertools.count()
            return loadgen.validated(offer, rate, self.sizes.validation_s, tries, self.sizes.validation_cap_s)

    def probe_queries(self, rate: float) -> int:
        """A probe's queries: 100, or as many as `probe_cap_s` allows at a slow model's rate (1 request/s: 100 s a
        probe), never fewer than MIN_PROBE_QUERIES. A probe brackets or looks; validation claims."""
        return max(min(100, int(rate * self.sizes.probe_cap_s)), MIN_PROBE_QUERIES)

    def generator_overhead(self, config: ServingConfig, alone: float = math.inf) -> loadgen.LoadGenResult:
        """LoadGen SingleStream on the configuration: its QPS with and without LoadGen's own overhead. `alone`: the
        requests/s it answered one at a time, which sizes the run."""
        with self.server(config) as server:
            return self.offered(server, 1000.0, seconds=self.sizes.probe_s, min_queries=self.probe_queries(alone),
                                scenario="SingleStream")

    def ceiling(self, config: ServingConfig, expected: float) -> loadgen.LoadGenResult:
        """LoadGen Offline on the configuration: every request handed over at once, the throughput ceiling."""
        with self.server(config) as server:
            return self.offered(server, expected * 1.2, seconds=self.sizes.probe_s,
                                min_queries=self.probe_queries(expected), scenario="Offline")
