"""h2load, nghttp2's load generator in C (Debian's nghttp2-client), as the client of a closed-loop level through a
socket: what `tfperf load` uses where it is installed, so that the client takes little of the CPU the server
shares with it on one machine.

Against an echo (benchmarks/load_client_cost.py), a request through tfperf's Python client costs about 20 us of CPU
over HTTP/1.1 (`tfperf.serving.http1`, in closed loop) and 120-150 us over gRPC (grpc.aio); h2load's 15-55 us over
HTTP/1.1 and 40-80 us over HTTP/2. Each window of a level is one h2load run of `window_s`: `concurrency` connections
over HTTP/1.1 (TF Serving REST, KServe v2), or one HTTP/2 connection with `concurrency` streams for gRPC, as a gRPC
channel multiplexes them; each client sends the same encoded request again as soon as the last is answered (h2load
posts one body), and its per-request log gives every request's latency. The answers are not read: `Bench.sweep`
checks them through the Python client before any load is timed; h2load counts HTTP statuses, not gRPC's (a gRPC
error arrives in a trailer with status 200).

Coordinated omission, engine by engine: in closed loop a client sends its next request only when the last one is
answered, so a stall holds back the requests that would have been sent during it and is counted once, in the
request that waited. h2load and tfperf's Python client count it so; wrk adds the held-back requests to its
percentiles (`stats_correct`, from the mean interval per connection); wrk2 and LoadGen time each request from
its scheduled arrival, which only an open loop has (`tfperf.serving.loadgen`).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfperf.flags import UserError
from tfperf.measure.load import LoadLevel, Window, measured_windows, stable

H2LOAD = "h2load"
# gRPC methods a closed loop calls, by protocol: the path of the predict call.
GRPC_PATHS = {"grpc": "/tensorflow.serving.PredictionService/Predict",
              "grpc+v2": "/inference.GRPCInferenceService/ModelInfer"}


def available() -> bool:
    """Whether h2load is on PATH (Debian: apt-get install nghttp2-client)."""
    return shutil.which(H2LOAD) is not None


def add_client_flag(parser: Any) -> None:
    """`--client` on an argparse parser: who sends a closed loop's requests through a socket (see `client_for`)."""
    parser.add_argument("--client", choices=("auto", H2LOAD, "python"), default="auto",
                        help="who sends the closed loop's requests through a socket: h2load (C, nghttp2-client: "
                             "over gRPC a third of the Python client's CPU a request, left to the server), or tfperf's "
                             "Python client; auto: h2load where installed. LoadGen's open loop is Python's either way")


def client_for(asked: str) -> str:
    """The closed loop's client through a socket for `tfperf load --client`: auto is h2load where it is on PATH."""
    if asked == "h2load" and not available():
        raise UserError("--client h2load: h2load is not on PATH (Debian: apt-get install nghttp2-client)")
    if asked == "auto":
        return H2LOAD if available() else "python"
    return asked


def wire_request(endpoint: Any, encoded: Any) -> tuple[str, dict[str, str], bytes, bool]:
    """One encoded request as h2load sends it: the URL, its headers, its body and whether it goes over HTTP/1.1
    (`encoded`: what `tfperf.serving.endpoint.encode` made for `endpoint`)."""
    if endpoint.protocol in ("rest", "v2"):
        body, headers = encoded
        headers = {k.lower(): v for k, v in headers.items()}
        headers.setdefault("content-type", "application/json")
        return endpoint.infer_url, headers, body, True
    message = encoded.SerializeToString()
    # A gRPC message on the wire: not compressed (0), its length in 4 bytes, big-endian, then the message.
    framed = b"\x00" + struct.pack(">I", len(message)) + message
    url = f"http://{endpoint.host}:{endpoint.port}{GRPC_PATHS[endpoint.protocol]}"
    return url, {"content-type": "application/grpc", "te": "trailers"}, framed, False


def _seconds_arg(seconds: float) -> str:
    return f"{max(int(round(seconds * 1000)), 1)}ms"


def run(argv: list[str], output: Path, timeout_s: float) -> tuple[str, float]:
    """Run h2load (`argv`), its output into the file `output`: that output and the CPU seconds h2load used (its
    own rusage, read as it is reaped). RuntimeError when it runs past `timeout_s` (an endpoint that stops
    answering keeps h2load waiting for its last requests)."""
    with open(output, "wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    killer = threading.Timer(timeout_s, process.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        killer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    said = output.read_text(errors="replace")
    if process.returncode < 0:
        raise RuntimeError(f"h2load did not end within {timeout_s:.0f} s: the endpoint stopped answering")
    if process.returncode != 0:
        raise RuntimeError(f"h2load failed (exit {process.returncode}): {_last_line(said)}")
    return said, usage.ru_utime + usage.ru_stime


def _last_line(said: str) -> str:
    lines = [line for line in said.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "nothing"


def read_log(path: Path) -> list[tuple[float, float, int]]:
    """h2load's per-request log: (start s, latency s, HTTP status) of each request answered in the main phase."""
    found = []
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 3:
            found.append((int(fields[0]) / 1e6, int(fields[2]) / 1e6, int(fields[1])))
    return found


_COUNTS = re.compile(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                     r"(\d+) errored, (\d+) timeout")


def failures(said: str, statuses: list[int]) -> str | None:
    """Why requests failed in one run (h2load's counts and the statuses it logged), or None."""
    counts = _COUNTS.search(said)
    bad = [s for s in statuses if not 200 <= s < 300]
    if counts is None:
        return f"h2load said no counts: {_last_line(said)}"
    failed, errored, timeouts = (int(counts[i]) for i in (5, 6, 7))
    if int(counts[2]) == 0:  # h2load counts no failure when no connection opened
        return "h2load started no request: nothing accepted its connections"
    if not (failed or errored or timeouts or bad):
        return None
    codes = ", ".join(f"{n} answered {code}" for code, n in sorted(collections.Counter(bad).items()))
    return (f"h2load: {failed} failed, {errored} errored, {timeouts} timed out" + (f"; {codes}" if codes else ""))


def closed_loop(endpoint: Any, encoded: Any, concurrency: int, *, window_s: float = 1.0, max_windows: int = 10,
                warmup_s: float = 0.2, server_cpu: Callable[[], float] | None = None, server_seen: bool = True,
                timeout_s: float = 60.0, label: str | None = None) -> LoadLevel:
    """`tfperf.measure.load.closed_loop`'s level, with h2load as the clients: `concurrency` of them sending
    `encoded` (one request, as `tfperf.serving.endpoint.encode` made it) to `endpoint` in windows of `window_s`
    (an h2load run each, after one of `warmup_s`) until three agree or `max_windows` ran. The clients' CPU is
    h2load's; `server_cpu`, when given, the server's CPU seconds so far."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    url, headers, body, http1 = wire_request(endpoint, encoded)
    with tempfile.TemporaryDirectory(prefix="tfperf-h2load-") as tmp:
        folder = Path(tmp)
        (folder / "body").write_bytes(body)
        # HTTP/1.1: a connection per client. gRPC: one connection, a stream per client (a channel's way).
        shape = ["--h1", f"-c{concurrency}", "-m1"] if http1 else ["-c1", f"-m{concurrency}"]
        argv = [H2LOAD, *shape, "-t1", "-d", str(folder / "body"), *(f"-H{k}: {v}" for k, v in headers.items())]
        log = folder / "log"

        def window(seconds: float) -> tuple[list[tuple[float, float, int]], str, float]:
            log.unlink(missing_ok=True)  # h2load appends to its log: each run reads its own requests only
            said, cpu = run([*argv, "-D", _seconds_arg(seconds), f"--log-file={log}", url], folder / "said",
                            seconds + timeout_s)
            return read_log(log), said, cpu

        windows: list[Window] = []
        errors: list[str] = []
        client_cpu = 0.0
        try:
            window(warmup_s)  # new connections and the server's first requests: not measured
        except RuntimeError as exc:
            errors.append(str(exc))
        began = time.perf_counter()
        server_began = server_cpu() if server_cpu else 0.0
        while not errors and len(windows) < max_windows and not (windows and stable(windows)):
            try:
                answered, said, cpu = window(window_s)
            except RuntimeError as exc:  # a failing level is a result, named
                errors.append(str(exc))
                break
            client_cpu += cpu
            why = failures(said, [status for _, _, status in answered])
            if why:
                errors.append(why)
                break
            windows.append(Window(window_s, tuple(latency for _, latency, _ in answered)))
        wall = time.perf_counter() - began
        server_used = (server_cpu() - server_began) if server_cpu else 0.0
    ok = stable(windows)
    used = measured_windows(windows)
    measured = sum(w.seconds for w in windows)
    # The server's CPU over the runs and the gaps between them (each run starts a process and its connections),
    # scaled to the measured windows, as the clients' CPU is.
    scale = min(measured / wall, 1.0) if wall > 0 else 0.0
    return LoadLevel(label or f"concurrency {concurrency}", tuple(lat for w in used for lat in w.latencies_s),
                     sum(w.seconds for w in used), tuple(windows), ok, client_cpu_s=client_cpu,
                     process_cpu_s=client_cpu + server_used * scale, errors=tuple(errors), server_seen=server_seen,
                     client=H2LOAD)
