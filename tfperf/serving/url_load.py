"""`tfperf load --url URL`: the serving question asked of a running endpoint (any server that speaks TF Serving's
REST or gRPC API or KServe's v2), and of an echo of its answers, the client's own ceiling on this machine."""

from __future__ import annotations

import argparse
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
    from tfperf.serving import h2load
    from tfperf.serving.search import Budget

    try:
        endpoint = parse_url(args.url, columnar=args.columnar, json=args.json_tensors)
        with RemoteServer(endpoint, timeout_s=30) as remote:
            requests = endpoint_requests(remote.inputs, args)
            remote.answer(requests[0])  # one request answered before anything is timed
    except (EndpointError, InputError) as exc:
        raise UserError(str(exc)) from None
    metrics_url = metrics_url_of(endpoint, args.metrics_url)
    out = Path(args.out or Path("load") / f"{endpoint.model}-{endpoint.protocol.replace('+', '-')}")
    if (out / f"{recipe}.jsonl").exists():
        raise UserError(f"{out} already holds a load run: pass another --out, or remove it")
    out.mkdir(parents=True, exist_ok=True)

    def say(what: str) -> None:
        print(f"load: {what} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    found = answer_endpoint(endpoint, requests, out, budget=Budget(args.latency_budget, args.percentile),
                            quick=args.quick, concurrency=args.concurrency, record_args=vars(args), say=say,
                            recipe=recipe, metrics_url=metrics_url, client=h2load.client_for(args.client))
    return found, out


def metrics_url_of(endpoint, given: str | None) -> str | None:
    """Where the endpoint's Prometheus metrics are: --metrics-url, else tfperf serve's path on an HTTP endpoint's
    own port when it answers metrics a known server exports (Triton's are on a port of their own: give it)."""
    from tfperf.serving.scrape import METRICS_PATH, snapshot

    if given:
        if snapshot(given) is None:
            raise UserError(f"--metrics-url {given} answered no metrics of tfperf serve or Triton")
        return given
    if endpoint.protocol in ("rest", "v2"):
        url = f"http://{endpoint.host}:{endpoint.port}{METRICS_PATH}"
        return url if snapshot(url) is not None else None
    return None


def answer_endpoint(endpoint, requests: list, out: Path, *, budget, quick: bool, concurrency=None,
                    record_args: dict | None = None, say=lambda what: None, recipe: str = "load",
                    metrics_url: str | None = None, sizes=None, client: str = "python"):
    """The serving question asked of a running endpoint (closed loop, LoadGen's rate search, validation) and of an
    echo of its answers (the client's ceiling on this machine); report.md and load.jsonl in `out`. With
    `metrics_url`, each level's time is split by the server's own metrics (queue, model). `sizes`: how long
    each measurement runs (default: --quick's or the full ones); `client` sends the closed loops ("python" or
    "h2load")."""
    from tfperf.records.jsonl import Recorder
    from tfperf.serving.configs import ServingConfig
    from tfperf.serving.measure import Bench, Sizes
    from tfperf.serving.report import Found, write_report
    from tfperf.serving.through_socket import client_ceiling

    started = time.perf_counter()
    sizes = sizes or (Sizes.quick() if quick else Sizes())
    rec = Recorder(recipe, {k: v for k, v in (record_args or {}).items() if k != "func"})
    found = Found(f"{endpoint.name} at {endpoint.host}:{endpoint.port}, model {endpoint.model}", budget,
                  json_requests=endpoint.protocol == "rest" or endpoint.json)
    bench = Bench({}, requests, budget, sizes, rec, out / "loadgen", endpoint=endpoint, metrics_url=metrics_url,
                  client=client)
    try:
        config = ServingConfig("endpoint", label=endpoint.name)
        say(f"closed loop: {config.name}")
        swept = bench.sweep(config, concurrency)
        found.swept.append(swept)
        if not swept.dropped and swept.rate_within(budget) > 0:
            say(f"open loop (LoadGen Server): {config.name}")
            found.open_loop[config.name] = bench.open_loop_of(swept)
            rate = bench.validation_rate(swept, found.open_loop[config.name])
            say(f"validation (LoadGen Server) at {rate:.0f}/s")
            found.validated = config
            found.validations, found.not_validated = bench.validate(config, rate)
        found.client_ceiling, bracket = client_ceiling(bench, endpoint, say)
        if bracket is not None:
            found.open_loop[found.client_ceiling.config.name] = bracket
    except (KeyboardInterrupt, flags.Stopped) as exc:
        found.partial = f"stopped by {'Ctrl-C' if isinstance(exc, KeyboardInterrupt) else 'SIGTERM'}"
    finally:
        found.seconds = time.perf_counter() - started
        rec.save(out)
        write_report(found, out)
    return found
