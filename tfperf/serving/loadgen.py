"""Open-loop load from MLPerf LoadGen (`mlperf_loadgen`): Poisson arrivals, latency from scheduled time.

A Server run sends requests at a target rate as a Poisson process and counts each request's latency
from the moment it was scheduled, not from when a client got round to sending it, so a server that
falls behind is charged for the queue it builds (no coordinated omission). LoadGen decides VALID or
INVALID (the latency percentile within its bound, enough queries and time, early stopping) and says
why; this module reads its log (`mlperf_log_detail.txt`) rather than judging again. An Offline run
hands every request over at once: the throughput ceiling. A SingleStream run (one request at a time)
is where LoadGen reports its "QPS w/o loadgen overhead": what its own bookkeeping costs.

`serve(index)` is the server under test: it starts request `index` (a row of the query sample
library) and returns a Future of its answer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from tfperf.records import units
from tfperf.serving.batcher import Overloaded

DETAIL = "mlperf_log_detail.txt"  # beside mlperf_log_summary.txt, the same results as JSON lines
MIN_QUERIES_FOR_P99 = 460  # LoadGen's early stopping needs about this many on-time queries to claim a p99
VALIDATION_STEP = 0.85  # an INVALID validation (not for want of queries) is tried again this much lower


@dataclasses.dataclass(frozen=True)
class LoadGenResult:
    """What LoadGen reported for one run."""

    scenario: str
    target_qps: float
    valid: bool
    latency_met: bool  # the percentile stayed within its bound ("Performance constraints satisfied")
    reasons: tuple[str, ...]  # why it is INVALID, in LoadGen's words
    completed_qps: float
    query_count: int
    overlatency_count: int
    percentiles_ms: dict[str, float]  # "50.00", "90.00", "99.00", ...: from each query's scheduled time
    qps_without_overhead: float | None  # LoadGen's "QPS w/o loadgen overhead", where its scenario reports it
    errors: tuple[str, ...]
    log_dir: str | None
    more_queries_needed: int = 0  # early stopping's "would need to run at least N more queries" (0: it was met)

    @property
    def too_short(self) -> bool:
        """INVALID only because early stopping could not claim the percentile from this many queries: the same
        rate run longer may be VALID, while a lower rate run as long would not help."""
        return not self.valid and self.latency_met and not self.errors and self.more_queries_needed > 0 and \
            self.reasons == ("early stopping: too few queries to claim the percentile",)

    def metrics(self) -> dict[str, Any]:
        """Figures for a record."""
        return {"scenario": self.scenario, "target_qps": self.target_qps, "valid": self.valid,
                "latency_met": self.latency_met, "completed_qps": self.completed_qps,
                "queries": self.query_count, "overlatency": self.overlatency_count,
                **{f"loadgen_p{float(k):g}_ms": v for k, v in self.percentiles_ms.items()},  # p99, p99.9
                **({"qps_without_loadgen_overhead": self.qps_without_overhead}
                   if self.qps_without_overhead is not None else {}),
                **({"invalid_because": list(self.reasons)} if self.reasons else {})}


def read_detail(path: Path | str) -> dict[str, Any]:
    """LoadGen's detail log as key -> value (its `:::MLLOG {json}` lines; the last value of a key wins)."""
    found = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        if line.startswith(":::MLLOG "):
            try:
                entry = json.loads(line[len(":::MLLOG "):])
            except ValueError:
                continue
            found[entry.get("key")] = entry.get("value")
    return found


def _result(scenario: str, target_qps: float, detail: dict[str, Any], errors: list[str],
            log_dir: str | None) -> LoadGenResult:
    reasons = []
    for key, words in (("result_perf_constraints_met", "the latency percentile is over its bound"),
                       ("result_min_duration_met", "the run was shorter than its minimum duration"),
                       ("result_min_queries_met", "too few queries"),
                       ("early_stopping_met", "early stopping: too few queries to claim the percentile")):
        if detail.get(key) is False:
            reasons.append(words)
    if detail.get("result_invalid_reason"):
        reasons.append(str(detail["result_invalid_reason"]).strip())
    if errors:
        reasons.append(f"{len(errors)} requests failed ({errors[0]})")
    percentiles = {k[len("result_"):-len("_percentile_latency_ns")]: v / 1e6 for k, v in detail.items()
                   if k.startswith("result_") and k.endswith("_percentile_latency_ns")}
    without = detail.get("result_qps_without_loadgen_overhead")  # SingleStream reports it
    completed = next((detail[k] for k in ("result_completed_samples_per_sec", "result_samples_per_second",
                                          "result_qps_with_loadgen_overhead") if k in detail), 0.0)
    return LoadGenResult(scenario, target_qps, detail.get("result_validity") == "VALID" and not errors,
                         bool(detail.get("result_perf_constraints_met", True)), tuple(reasons), float(completed or 0),
                         int(detail.get("result_query_count", 0) or 0),
                         int(detail.get("result_overlatency_query_count", 0) or 0), percentiles, without,
                         tuple(errors[:5]), log_dir, _more_queries_needed(detail))


def _more_queries_needed(detail: dict[str, Any]) -> int:
    """The queries LoadGen's early stopping says it would still need, from its own words (0 when met)."""
    if detail.get("early_stopping_met") is not False:
        return 0
    match = re.search(r"at least (\d+) more quer", str(detail.get("early_stopping_result", "")))
    return int(match[1]) if match else 0


def run(serve: Callable[[int], Future], samples: int, *, scenario: str = "Server", rate: float = 100.0,
        latency_s: float = 0.010, percentile: float = 99.0, duration_s: float = 2.0, min_queries: int = 100,
        log_dir: Path | str | None = None) -> LoadGenResult:
    """One LoadGen run (`Server` at `rate` requests/s with `percentile` of latencies within `latency_s`,
    `Offline` expecting `rate`, or `SingleStream` expecting `rate` one at a time) over `samples` distinct requests; its logs land in `log_dir` (kept) or a temporary folder."""
    import mlperf_loadgen as lg

    errors: list[str] = []
    lock = threading.Lock()

    def complete(query_id: int, future: Future) -> None:
        exc = future.exception()
        if exc is not None:
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, 0, 0)])

    def start(query, patient: bool) -> None:
        while True:
            try:
                future = serve(query.index)
                break
            except Overloaded as exc:
                if not patient:  # at a rate, a refused request is a failed request, as a client sees it
                    future = Future()
                    future.set_exception(exc)
                    break
                time.sleep(0.0005)  # Offline hands over everything at once: wait for room in the queue
            except Exception as exc:  # noqa: BLE001  (refused at once)
                future = Future()
                future.set_exception(exc)
                break
        future.add_done_callback(lambda f, q=query.id: complete(q, f))

    def issue(queries) -> None:
        if scenario == "Offline":
            threading.Thread(target=lambda: [start(q, True) for q in queries], daemon=True).start()
        else:
            for query in queries:
                start(query, False)

    settings = lg.TestSettings()
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_duration_ms = int(duration_s * 1000)
    # Long enough to issue the queries asked for at the rate: a run that ends first is INVALID whatever the server
    # does ("the test exited early"), which a slow model at a short duration always was.
    settings.max_duration_ms = int(max(duration_s * 4, 1.5 * min_queries / max(rate, 1e-3)) * 1000)
    settings.min_query_count = int(min_queries)
    if scenario == "Server":
        settings.scenario = lg.TestScenario.Server
        settings.server_target_qps = float(rate)
        settings.server_target_latency_ns = int(latency_s * 1e9)
        settings.server_target_latency_percentile = percentile / 100
    elif scenario == "Offline":
        settings.scenario = lg.TestScenario.Offline
        settings.offline_expected_qps = float(rate)
    elif scenario == "SingleStream":  # one request at a time; LoadGen reports its QPS without its own overhead
        settings.scenario = lg.TestScenario.SingleStream
        settings.single_stream_expected_latency_ns = int(1e9 / max(rate, 1e-3))
    else:
        raise ValueError(f"scenario must be Server, Offline or SingleStream, got {scenario!r}")
    with tempfile.TemporaryDirectory(prefix="loadgen-") as scratch:
        folder = Path(log_dir) if log_dir is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        output = lg.LogOutputSettings()
        output.outdir = str(folder)
        output.copy_summary_to_stdout = False
        logging = lg.LogSettings()
        logging.log_output = output
        logging.enable_trace = False
        sut = lg.ConstructSUT(issue, lambda: None)
        qsl = lg.ConstructQSL(samples, samples, lambda indices: None, lambda indices: None)
        _start_test(lambda: lg.StartTestWithLogSettings(sut, qsl, settings, logging))
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        detail = read_detail(folder / DETAIL) if (folder / DETAIL).exists() else {}
    return _result(scenario, rate if scenario == "Server" else math.nan, detail, errors,
                   str(log_dir) if log_dir is not None else None)


def _start_test(start: Callable[[], None]) -> None:
    """LoadGen's test, run in a thread of its own while this one waits in Python. SIGTERM and Ctrl-C raise here,
    between waits, so the command unwinds and writes its partial report; the test is left to end on its own
    thread, its SUT not destroyed under it (raised inside the test, the stop crashed the process: signal 11)."""
    done = threading.Event()
    failed: list[BaseException] = []

    def test() -> None:
        try:
            start()
        except BaseException as exc:  # noqa: BLE001  (handed to the waiting thread)
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=test, name="loadgen", daemon=True).start()
    while not done.wait(0.1):
        pass
    if failed:
        raise failed[0]


def validated(offer: Callable[[float, int], LoadGenResult], rate: float, seconds: float,
              tries: int = 4, cap_s: float = math.inf) -> tuple[list[LoadGenResult], str]:
    """LoadGen Server runs (`offer(rate, queries)`) long enough for early stopping to claim the percentile; when
    INVALID, again at the same rate with twice the queries early stopping asked for if that was all it lacked, else
    at a 15% lower rate; `tries` runs at most: every attempt, the last decides. No run starts whose queries at its
    rate would take the runs past `cap_s` seconds in all (a slow model's p99 needs 920 queries: 3 minutes at 5
    requests/s): (the attempts, why one was not run, or '')."""
    def enough(rate: float) -> int:
        return max(int(rate * seconds), 2 * MIN_QUERIES_FOR_P99)

    attempts, queries, spent = [], enough(rate), 0.0
    for _ in range(tries):
        if spent + queries / rate > cap_s:
            return attempts, (f"{'another' if attempts else 'a'} LoadGen run at {units.rate(rate)} requests/s needed "
                              f"{queries:,} queries ({queries / rate:.0f} s) for early stopping to claim the "
                              f"percentile, past the {cap_s:.0f} s validation is given here")
        spent += queries / rate
        result = offer(rate, queries)
        attempts.append(result)
        if result.valid:
            break
        if result.too_short:
            queries = 2 * (result.query_count + result.more_queries_needed)
        else:
            rate *= VALIDATION_STEP
            queries = enough(rate)
    return attempts, ""
