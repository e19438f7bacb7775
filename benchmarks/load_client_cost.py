"""What one request costs `tfperf load --url`'s client: CPU seconds per request against an echo, engine by engine.

Run:   .venv/bin/python benchmarks/load_client_cost.py [--rounds 6] [--seconds 2] [--concurrency 8]
Needs: what `make install` installs; wrk (Debian's `apt-get install wrk`) for its row, uvloop for its row
       (each skipped, and said, when missing).

A load client that shares the machine with the server takes CPU the server then lacks (issue 49): wrk drove
`tfperf serve` at 4.8x the requests/s tfperf's own client reached. Here the server is an echo (one process,
aiohttp, answering a recorded TF Serving REST answer of one 28x28 row: no model work), so what differs
between rows is the client alone. Each engine sends the same encoded request from `concurrency` connections
in closed loop for `--seconds`, the engines taking turns in `--rounds` shuffled rounds; the figure is the
client's CPU (its process's user + system time, the echo's apart) per answered request, each engine
against the path tfperf took before (`RemoteServer` driven by `closed_loop`'s client threads, each request
handed to the event loop's thread and its Future waited on) with a 95% interval over rounds:
- threads -> loop (before): `tfperf.measure.load.closed_loop`'s threads calling `RemoteServer`;
- coroutines on the loop (tfperf now): the same closed loop with `loop=`, its clients coroutines on the
  client's event loop awaiting `RemoteServer.send`, no thread hand-over;
- the same on uvloop's event loop (not a dependency of tfperf: measured where installed);
- wrk (C, one thread), its CPU read from the child's rusage.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from tfperf.measure.load import closed_loop  # noqa: E402
from tfperf.measure.stats import compare_times  # noqa: E402
from tfperf.serving.echo import EchoProcess, Recorded  # noqa: E402
from tfperf.serving import h2load, wrk  # noqa: E402
from tfperf.serving.endpoint import RemoteServer, parse_url  # noqa: E402
from tfperf.serving.protocols import tfserving_rest  # noqa: E402
from tfperf.serving.protocols.tensors import Tensor, dump_json  # noqa: E402

TODAY = "threads -> loop (before)"


def echo_of_rest() -> Recorded:
    """A TF Serving REST endpoint's answers for a model of one 28x28 input and 10 scores."""
    inputs, outputs = [Tensor("x", "float32", (None, 28, 28))], [Tensor("scores", "float32", (None, 10))]
    metadata = dump_json(tfserving_rest.metadata("m", 1, "serving_default", inputs, outputs))
    answer = tfserving_rest.predict_response({"scores": np.linspace(0, 1, 10, dtype=np.float32)[None]}, False)
    return Recorded("rest", metadata, answer)


def cpu_s() -> float:
    """This process's user and system CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def threads_to_loop(remote: RemoteServer, request: dict, concurrency: int, seconds: float) -> tuple[int, float]:
    """Today's path: closed_loop's client threads, each request handed to the event loop's thread."""
    before = cpu_s()
    level = closed_loop(lambda client: remote(request), concurrency, window_s=seconds, max_windows=1, warmup_s=0.0)
    return len(level.latencies_s), cpu_s() - before


def coroutines(remote: RemoteServer, request: dict, concurrency: int, seconds: float) -> tuple[int, float]:
    """tfperf's path now: closed_loop's clients as coroutines on the client's event loop (`RemoteServer.send`)."""
    before = cpu_s()
    level = closed_loop(lambda client: remote.send(request), concurrency, window_s=seconds, max_windows=1,
                        warmup_s=0.0, loop=remote.loop)
    return len(level.latencies_s), cpu_s() - before


def wrk_engine(url: str, body: bytes, concurrency: int, seconds: float) -> tuple[int, float]:
    """wrk's answered requests and CPU seconds (`tfperf.serving.wrk`, its CPU from its own rusage)."""
    done = wrk.post(url, body, {"Content-Type": "application/json"}, connections=concurrency, seconds=seconds)
    return done.requests, done.cpu_s


def h2load_engine(remote: RemoteServer, request: dict, concurrency: int, seconds: float) -> tuple[int, float]:
    """h2load (C, one thread) as `tfperf load` drives it where it is installed (`tfperf.serving.h2load`)."""
    level = h2load.closed_loop(remote.endpoint, remote.encoded(request), concurrency, window_s=seconds,
                               max_windows=1, warmup_s=0.05)
    if level.errors:
        raise RuntimeError(level.errors[0])
    return len(level.latencies_s), level.client_cpu_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=2, help="each engine's run (whole seconds, as wrk takes them)")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    request = {"x": np.random.default_rng(0).random((1, 28, 28), dtype=np.float32)}
    body = tfserving_rest.encode_request(request, columnar=False)
    try:
        import uvloop
    except ImportError:
        uvloop = None
        print("uvloop is not installed: its row is skipped (pip install uvloop)")
    if not wrk.available():
        print("wrk is not installed: its row is skipped (apt-get install wrk)")
    if not h2load.available():
        print("h2load is not installed: its row is skipped (apt-get install nghttp2-client)")
    samples: dict[str, list[float]] = {}
    rates: dict[str, list[float]] = {}
    with EchoProcess(echo_of_rest()) as echo:
        url = f"http://127.0.0.1:{echo.port}/v1/models/m"
        remote = RemoteServer(parse_url(url), connections=args.concurrency)
        engines = {TODAY: lambda: threads_to_loop(remote, request, args.concurrency, args.seconds),
                   "coroutines on the loop (tfperf now)": lambda: coroutines(remote, request, args.concurrency,
                                                                              args.seconds)}
        if uvloop is not None:
            uv = RemoteServer(parse_url(url), connections=args.concurrency, loop_factory=uvloop.new_event_loop)
            engines["coroutines on uvloop"] = lambda: coroutines(uv, request, args.concurrency, args.seconds)
        if h2load.available():
            engines["h2load (C, 1 thread: tfperf load's client)"] = lambda: h2load_engine(remote, request,
                                                                                          args.concurrency,
                                                                                          args.seconds)
        if wrk.available():
            engines["wrk (C, 1 thread)"] = lambda: wrk_engine(url + ":predict", body, args.concurrency,
                                                             args.seconds)
        order = list(engines)
        try:
            for _ in range(args.rounds):
                random.shuffle(order)
                for name in order:
                    answered, spent = engines[name]()
                    samples.setdefault(name, []).append(spent / max(answered, 1))
                    rates.setdefault(name, []).append(answered / args.seconds)
        finally:
            remote.close()
            if uvloop is not None:
                uv.close()
    print(f"\nClient CPU per request against an echo (TF Serving REST rows, {args.concurrency} connections, "
          f"{args.rounds} rounds of {args.seconds:g} s; ratios against '{TODAY}' with 95% intervals over rounds):")
    for name in engines:
        values = samples[name]
        judged = ""
        if name != TODAY:
            c = compare_times(samples[TODAY], values, names=(TODAY, name), rounds=args.rounds)
            judged = f"; {1 / c.ratio:.2f}x the CPU (95% CI {1 / c.ci95[1]:.2f}-{1 / c.ci95[0]:.2f}x)"
        print(f"- {name}: {np.median(values) * 1e6:.0f} us of CPU a request, {np.median(rates[name]):,.0f} "
              f"requests/s{judged}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
