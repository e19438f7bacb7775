"""`tfperf load --url URL`: the serving question asked of a running endpoint (any server that speaks TF Serving's
REST or gRPC API or KServe's v2), and of an echo of its answers, the client's own ceiling on this machine."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from tfperf import flags
from tfperf.flags import UserError


def endpoint_requests(inputs, args, rows: int = 64) -> list:
    """One-row requests for a running endpoint: rows of --input, or synthetic rows made from its metadata (floats
    from a normal, integers 0 or 1: the vocabulary is not known from outside; free sizes from --input-shape)."""
    import numpy as np

    from tfperf.deploy.errors import InputError
    from tfperf.deploy.inputs import fit_inputs, read_sample
    from tfperf.deploy.loader import FREE_SIZE, parse_input_shapes
    from tfperf.serving.configs import one_row_requests

    specs = [(t.name, t.dtype, t.shape[1:]) for t in inputs]
    if args.input:
        return one_row_requests(fit_inputs(read_sample(args.input), specs, "--input"))
    try:
        shapes = parse_input_shapes(args.input_shape or [])
    except ValueError as exc:
        raise InputError(str(exc)) from None
    rng = np.random.default_rng(args.seed)
    made = {}
    for name, dtype, shape in specs:
        given = shapes.get(name, shapes.get("") if len(specs) == 1 else None)
        dims = tuple(given) if given else tuple(FREE_SIZE if d is None else d for d in shape)
        if dtype == "string":
            raise InputError(f"input {name!r} takes strings, which tfperf cannot invent: pass --input FILE.npz")
        kind = np.dtype(dtype).kind
        made[name] = (rng.normal(size=(rows, *dims)) if kind == "f" else rng.integers(0, 2, size=(rows, *dims))
                      ).astype(dtype)
    return one_row_requests(made)


def load_url(args: argparse.Namespace, started: float, recipe: str) -> tuple[Any, Path]:
    """`tfperf load --url`: the closed loop, LoadGen's rate search and validation against a running endpoint,
    and the same against an echo of its answers (the client's ceiling), side by side in report.md; what was
    found, and the folder it is in."""
    from tfperf.deploy.errors import InputError
    from tfperf.serving.endpoint import EndpointError, RemoteServer, parse_url
    from tfperf.serving.search import Budget

    try:
        endpoint = parse_url(args.url, columnar=args.columnar, json=args.json_tensors)
        with RemoteServer(endpoint, timeout_s=30) as remote:
            requests = endpoint_requests(remote.inputs, args)
            remote.answer(requests[0])  # one request answered before anything is timed
    except (EndpointError, InputError) as exc:
        raise UserError(str(exc)) from None
    out = Path(args.out or Path("load") / f"{endpoint.model}-{endpoint.protocol.replace('+', '-')}")
    if (out / f"{recipe}.jsonl").exists():
        raise UserError(f"{out} already holds a load run: pass another --out, or remove it")
    out.mkdir(parents=True, exist_ok=True)

    def say(what: str) -> None:
        print(f"load: {what} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    found = answer_endpoint(endpoint, requests, out, budget=Budget(args.latency_budget, args.percentile),
                            quick=args.quick, concurrency=args.concurrency, record_args=vars(args), say=say,
                            recipe=recipe)
    return found, out


def answer_endpoint(endpoint, requests: list, out: Path, *, budget, quick: bool, concurrency=None,
                    record_args: dict | None = None, say=lambda what: None, recipe: str = "load"):
    """The serving question asked of a running endpoint (closed loop, LoadGen's rate search, validation) and of an
    echo of its answers (the client's ceiling on this machine); report.md and load.jsonl in `out`."""
    import asyncio

    from tfperf.records.jsonl import Recorder
    from tfperf.serving.configs import ServingConfig
    from tfperf.serving.echo import EchoProcess, record
    from tfperf.serving.endpoint import RemoteServer
    from tfperf.serving.measure import Bench, Sizes
    from tfperf.serving.report import Found, write_report

    started = time.perf_counter()
    sizes = Sizes.quick() if quick else Sizes()
    rec = Recorder(recipe, {k: v for k, v in (record_args or {}).items() if k != "func"})
    found = Found(f"{endpoint.name} at {endpoint.host}:{endpoint.port}, model {endpoint.model}", budget)
    try:
        for who, target in (("endpoint", endpoint), ("echo", None)):
            if who == "echo":
                with RemoteServer(endpoint) as remote:
                    remote._encode(requests[0])
                    recorded = asyncio.run_coroutine_threadsafe(record(remote), remote.loop).result(60)
                echo = EchoProcess(recorded)
                target = dataclasses.replace(endpoint, host="127.0.0.1", port=echo.port)
            config = ServingConfig("endpoint", label=endpoint.name if who == "endpoint" else
                                   f"the client's ceiling: an echo of its answers ({endpoint.name})")
            bench = Bench({}, requests, budget, sizes, rec, out / "loadgen", endpoint=target)
            try:
                say(f"closed loop: {config.name}")
                swept = bench.sweep(config, concurrency)
                found.swept.append(swept)
                if not swept.dropped and swept.rate_within(budget) > 0:
                    say(f"open loop (LoadGen Server): {config.name}")
                    capacity = max(lv.throughput for lv in swept.levels)
                    found.open_loop[config.name] = bench.open_loop(config, 0.9 * swept.rate_within(budget), capacity)
                    if who == "endpoint":
                        rate = found.open_loop[config.name][0] or 0.8 * swept.rate_within(budget)
                        say(f"validation (LoadGen Server) at {rate:.0f}/s")
                        found.validated, found.validations = config, bench.validate(config, rate)
            finally:
                if who == "echo":
                    echo.close()
    except (KeyboardInterrupt, flags.Stopped):
        found.partial = "interrupted (Ctrl-C or SIGTERM)"
    finally:
        found.seconds = time.perf_counter() - started
        rec.save(out)
        write_report(found, out)
    return found
