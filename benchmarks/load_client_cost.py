"""What one request costs `tfperf load --url`'s client: CPU seconds per request against an echo, engine by engine.

Run:   .venv/bin/python benchmarks/load_client_cost.py [--rounds 6] [--seconds 2] [--concurrency 8]
Needs: what `make install` installs; wrk and h2load (Debian's `wrk`, `nghttp2-client`) and uvloop for their rows
       (each skipped, and said, when missing).

A load client that shares the machine with the server takes CPU the server then lacks (issue 49): wrk drove
`tfperf serve` at 4.8x the requests/s tfperf's own client reached. Here the server is an echo (one process,
aiohttp, answering a recorded TF Serving REST answer of one 28x28 row: no model work), so what differs
between rows is the client alone. Each engine sends the same encoded request from `concurrency` connections
in closed loop for `--seconds`, the engines taking turns in `--rounds` shuffled rounds; the figure is the
client's CPU (its process's user + system time, the echo's apart) per answered request, each engine against
aiohttp's client (what tfperf sent with before `tfperf.serving.http1`) with a 95% interval over rounds:
- aiohttp (before): coroutines on the client's event loop, each awaiting an aiohttp POST;
- tfperf's client (`RemoteServer.send`): the same coroutines over `tfperf.serving.http1`, each request's bytes
  written once, the answer's head parsed by a Protocol;
- tfperf's client from other threads (`RemoteServer.submit`, as LoadGen's open loop sends): requests handed to
  the loop a group at a time;
- the same on uvloop's event loop (where installed);
- h2load and wrk (C, one thread), their CPU read from the child's rusage.
Then LoadGen's open loop (Server scenario, Poisson arrivals) at `--rate` requests/s through aiohttp and through
tfperf's client: the CPU a request, LoadGen's own bookkeeping included, and whether the run was VALID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from tfperf.measure.load import closed_loop  # noqa: E402
from tfperf.measure.stats import compare_times  # noqa: E402
from tfperf.serving.echo import EchoProcess, Recorded  # noqa: E402
from tfperf.serving import h2load, loadgen, wrk  # noqa: E402
from tfperf.serving.endpoint import RemoteServer, parse_url  # noqa: E402
from tfperf.serving.protocols import tfserving_rest  # noqa: E402
from tfperf.serving.protocols.tensors import Tensor, dump_json  # noqa: E402

BEFORE = "aiohttp (before)"


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


def aiohttp_on(loop, url: str, body: bytes, concurrency: int):
    """aiohttp's client on `loop` (running in another thread): a coroutine function that POSTs `body` once."""
    import aiohttp

    async def make():
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency, ttl_dns_cache=None))

    session = asyncio.run_coroutine_threadsafe(make(), loop).result(30)

    async def post() -> None:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as answer:
            await answer.read()
            if answer.status != 200:
                raise RuntimeError(f"HTTP {answer.status}")

    return post, session


def coroutines(send, loop, concurrency: int, seconds: float) -> tuple[int, float]:
    """closed_loop's clients as coroutines on `loop`, each awaiting `send()`."""
    before = cpu_s()
    level = closed_loop(lambda client: send(), concurrency, window_s=seconds, max_windows=1, warmup_s=0.0, loop=loop)
    return len(level.latencies_s), cpu_s() - before


def threads(call, concurrency: int, seconds: float) -> tuple[int, float]:
    """closed_loop's clients as threads, each calling `call()` (which hands the request to the loop and waits)."""
    before = cpu_s()
    level = closed_loop(lambda client: call(), concurrency, window_s=seconds, max_windows=1, warmup_s=0.0)
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


def open_loop(serve, rate: float, seconds: float) -> tuple[int, float, bool]:
    """LoadGen's Server scenario at `rate` for `seconds` (p99 within 10 ms): queries completed, this process's CPU
    seconds (LoadGen's threads included) and whether LoadGen called the run VALID."""
    before = cpu_s()
    result = loadgen.run(lambda index: serve(), 1, scenario="Server", rate=rate, latency_s=0.010,
                         duration_s=seconds, min_queries=int(rate * seconds * 0.5))
    return result.query_count, cpu_s() - before, result.valid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=2, help="each engine's run (whole seconds, as wrk takes them)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rate", type=float, default=2000.0, help="LoadGen's open loop: requests/s offered")
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
    valid: dict[str, list[bool]] = {}
    with EchoProcess(echo_of_rest()) as echo:
        url = f"http://127.0.0.1:{echo.port}/v1/models/m"
        remote = RemoteServer(parse_url(url))
        post, session = aiohttp_on(remote.loop, url + ":predict", body, args.concurrency)
        engines = {BEFORE: lambda: coroutines(post, remote.loop, args.concurrency, args.seconds),
                   "tfperf's client (http1), coroutines": lambda: coroutines(lambda: remote.send(request), remote.loop,
                                                                             args.concurrency, args.seconds),
                   "tfperf's client (http1), from threads": lambda: threads(lambda: remote(request),
                                                                            args.concurrency, args.seconds)}
        if uvloop is not None:
            uv = RemoteServer(parse_url(url), loop_factory=uvloop.new_event_loop)
            engines["tfperf's client (http1) on uvloop, coroutines"] = lambda: coroutines(
                lambda: uv.send(request), uv.loop, args.concurrency, args.seconds)
        if h2load.available():
            engines["h2load (C, 1 thread: tfperf load's closed loop)"] = lambda: h2load_engine(
                remote, request, args.concurrency, args.seconds)
        if wrk.available():
            engines["wrk (C, 1 thread)"] = lambda: wrk_engine(url + ":predict", body, args.concurrency, args.seconds)
        opened = {f"LoadGen Server at {args.rate:,.0f}/s, {BEFORE}":
                  lambda: open_loop(lambda: asyncio.run_coroutine_threadsafe(post(), remote.loop), args.rate,
                                    args.seconds),
                  f"LoadGen Server at {args.rate:,.0f}/s, tfperf's client (http1)":
                  lambda: open_loop(lambda: remote.submit(request), args.rate, args.seconds)}
        order = [*engines, *opened]
        try:
            for _ in range(args.rounds):
                random.shuffle(order)
                for name in order:
                    if name in engines:
                        answered, spent = engines[name]()
                    else:
                        answered, spent, ok = opened[name]()
                        valid.setdefault(name, []).append(ok)
                    samples.setdefault(name, []).append(spent / max(answered, 1))
                    rates.setdefault(name, []).append(answered / args.seconds)
        finally:
            asyncio.run_coroutine_threadsafe(session.close(), remote.loop).result(30)
            remote.close()
            if uvloop is not None:
                uv.close()
    print(f"\nClient CPU per request against an echo (TF Serving REST rows, {args.concurrency} connections in closed "
          f"loop, {args.rounds} rounds of {args.seconds:g} s; ratios against '{BEFORE}' with 95% intervals over "
          f"rounds):")
    for group, before in ((engines, BEFORE), (opened, next(iter(opened)))):
        for name in group:
            values = samples[name]
            judged = ""
            if name != before:
                c = compare_times(samples[before], values, names=(before, name), rounds=args.rounds)
                judged = f"; {1 / c.ratio:.2f}x the CPU (95% CI {1 / c.ci95[1]:.2f}-{1 / c.ci95[0]:.2f}x)"
            verdicts = f", VALID in {sum(valid[name])} of {len(valid[name])}" if name in valid else ""
            print(f"- {name}: {np.median(values) * 1e6:.0f} us of CPU a request, {np.median(rates[name]):,.0f} "
                  f"requests/s{verdicts}{judged}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
