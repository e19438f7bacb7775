"""`tfperf load --url`'s best within p99 10 ms beside wrk's and h2load's, on the same `tfperf serve` (issue 49).

Run:   .venv/bin/python benchmarks/load_client_vs_wrk.py [--rounds 3] [--budget-ms 10]   (about 10 minutes)
       ... --quick: tfperf's rows at `load --url --quick`'s levels; --busy: another process spinning on one core
Needs: what `make install` installs, with wrk and h2load (`apt-get install wrk nghttp2-client`).

The seed CNN exported to ONNX and served by `tfperf serve` as issue 49 tried it (`--runtime onnx --max-batch-size
16 --threads 1 --instances 1 --workers 2`: the configuration tfperf's own benchmark found best through a socket),
client and server on this machine. In each round, in a shuffled order, over KServe v2 binary tensors, TF Serving
REST rows and TF Serving gRPC:
- `tfperf load --url`'s closed loop (`Bench.sweep`, what `answer_endpoint` runs: clients 1, 2, 4, ... until p99
  passes the budget), its clients h2load (`--client h2load`, the default where installed) and tfperf's Python
  client (`--client python`): the most requests/s within the budget;
- a C client driven by hand, one thread, connections doubled from 1 until p99 passes the budget or the rate stops
  growing: wrk over HTTP/1.1 (its percentiles corrected for coordinated omission), h2load over gRPC.
Each row's ratio to the C client's, round by round, with a 95% interval over rounds; and each client's CPU per
request at its best level, and the cores the server had left.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from tfperf.measure.stats import ratio_ci  # noqa: E402
from tfperf.records.jsonl import Recorder  # noqa: E402
from tfperf.serving import h2load, wrk  # noqa: E402
from tfperf.serving.batcher import BatchingOptions  # noqa: E402
from tfperf.serving.configs import ServingConfig, one_row_requests  # noqa: E402
from tfperf.serving.endpoint import encode, parse_url  # noqa: E402
from tfperf.serving.measure import Bench, Sizes  # noqa: E402
from tfperf.serving.search import Budget  # noqa: E402
from tfperf.serving.through_socket import ServeProcess  # noqa: E402

ISSUE_CONFIG = ServingConfig("onnx", threads=1, instances=1, workers=2,
                             batching=BatchingOptions(max_batch_size=16, batch_timeout_micros=1000))
PROTOCOLS = {"KServe v2 (binary tensors)": "http://127.0.0.1:{rest}/v2/models/cnn",
             "TF Serving REST (rows)": "http://127.0.0.1:{rest}/v1/models/cnn",
             "TF Serving gRPC": "grpc://127.0.0.1:{grpc}/cnn"}


def h2load_by_hand(endpoint, encoded, connections: int, seconds: float) -> tuple[float, float, float]:
    """h2load itself at `connections` streams for `seconds`: requests/s, p99 (ms) and CPU seconds a request."""
    level = h2load.closed_loop(endpoint, encoded, connections, window_s=seconds, max_windows=1, warmup_s=0.2)
    if level.errors:
        raise RuntimeError(level.errors[0])
    return level.throughput, level.percentile_s(99) * 1e3, level.client_cpu_per_request_s


def best_within(measure, budget_ms: float) -> tuple[float, float]:
    """A C client's most requests/s with p99 within the budget (`wrk.most_within`'s doubling search), and its CPU
    seconds a request there; (0, nan) when one connection is already over."""
    found = wrk.most_within(measure, budget_ms, rate=lambda r: r[0], p99_ms=lambda r: r[1])
    return (found[1][0], found[1][2]) if found else (0.0, float("nan"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-ms", type=float, default=10.0)
    parser.add_argument("--seconds", type=int, default=2, help="each C-client level (whole seconds: wrk's unit)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="tfperf's rows at `load --url --quick`'s levels (1, 4, 16, 32), with its bisection "
                             "between the last within the budget and the first over, and without it")
    parser.add_argument("--busy", action="store_true",
                        help="another process keeps one core busy throughout, as on a shared machine (issue 73: "
                             "there `load --url --quick` answered 0.32x wrk's best)")
    args = parser.parse_args()
    if not (wrk.available() and h2load.available()):
        sys.exit("wrk and h2load are needed: apt-get install wrk nghttp2-client")
    from tfperf.deploy.layout import export_subject
    from tfperf.deploy.inputs import make_inputs
    from tfperf.deploy.loader import cookbook_subject

    budget = Budget(args.budget_ms / 1e3, 99.0)
    sizes = Sizes.quick() if args.quick else Sizes(window_s=0.5, max_windows=6, warmup_s=0.2, max_concurrency=128,
                                                   concurrency_factor=2)
    with tempfile.TemporaryDirectory(prefix="load-client-vs-wrk-") as tmp_name, contextlib.ExitStack() as busy:
        if args.busy:  # a spinning process, for the whole run: the server and the clients share what is left
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            busy.callback(spinner.kill)
        tmp = Path(tmp_name)
        subject = cookbook_subject("cnn")
        export = export_subject(subject, tmp / "exports", name="cnn", format="onnx").path
        requests = one_row_requests(make_inputs(subject, 64, seed=args.seed))
        rec = Recorder("load_client_vs_wrk", vars(args))
        print(f"serving: tfperf serve {ISSUE_CONFIG.name}, 2 workers", file=sys.stderr, flush=True)
        found: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        left: dict[str, list[float]] = {}
        with ServeProcess(export, ISSUE_CONFIG, "cnn", tmp / "serve.log") as server:
            rest, grpc_port = server.ports
            rows = []
            for protocol, template in PROTOCOLS.items():
                endpoint = parse_url(template.format(rest=rest, grpc=grpc_port))
                for client in ("h2load", "python"):
                    rows.append((f"{protocol}: tfperf load --url, --client {client}", endpoint, client, sizes))
                if args.quick:  # the levels alone, as before the bisection (issue 73)
                    rows.append((f"{protocol}: tfperf load --url, --client h2load, no bisection", endpoint, "h2load",
                                 dataclasses.replace(sizes, bisect_steps=0)))
                reference = "wrk (C, by hand)" if endpoint.protocol != "grpc" else "h2load (C, by hand)"
                rows.append((f"{protocol}: {reference}", endpoint, None, sizes))
            rng = random.Random(args.seed)
            for r in range(args.rounds):
                rng.shuffle(rows)
                for label, endpoint, client, row_sizes in rows:
                    if client is not None:
                        bench = Bench({}, requests, budget, row_sizes, rec, tmp / "loadgen", endpoint=endpoint,
                                      endpoint_cpu=server.cpu_s, client=client)
                        swept = bench.sweep(ServingConfig("endpoint", label=label))
                        if swept.dropped:
                            raise SystemExit(f"{label}: {swept.dropped}")
                        level = swept.best_level(budget)
                        rate = swept.rate_within(budget)
                        per_request = level.client_cpu_per_request_s if level else None
                        wall = sum(w.seconds for w in level.windows) if level else 0.0
                        left.setdefault(label, []).append((os.cpu_count() or 1) - level.client_cpu_s / wall
                                                          if level and wall else float("nan"))
                    else:
                        encoded = encode(endpoint, requests[0])
                        if endpoint.protocol == "grpc":
                            rate, per_request = best_within(
                                lambda c: h2load_by_hand(endpoint, encoded, c, args.seconds), args.budget_ms)
                        else:
                            body, headers = encoded
                            headers = {"Content-Type": "application/json", **headers}

                            def by_wrk(connections: int) -> tuple[float, float, float]:
                                done = wrk.post(endpoint.infer_url, body, headers, connections=connections,
                                                seconds=args.seconds)
                                return done.per_s, done.p99_ms, done.cpu_per_request_s

                            rate, per_request = best_within(by_wrk, args.budget_ms)
                    found.setdefault(label, []).append(rate)
                    cpu.setdefault(label, []).append(per_request or float("nan"))
                    print(f"round {r + 1}: {label}: {rate:,.0f} requests/s within p99 {args.budget_ms:g} ms",
                          file=sys.stderr, flush=True)
    print(f"\nThe most requests/s within p99 <= {args.budget_ms:g} ms on tfperf serve ({ISSUE_CONFIG.name}, 2 workers), "
          f"{args.rounds} rounds; each row against its protocol's C client round by round (95% CI over rounds):")
    for protocol in PROTOCOLS:
        reference = next(k for k in found if k.startswith(protocol) and "by hand" in k)
        for label in sorted(k for k in found if k.startswith(protocol)):
            rates = found[label]
            line = f"- {label}: {np.median(rates):,.0f} requests/s"
            if not np.isnan(cpu[label]).all():
                line += f", client CPU {np.nanmedian(cpu[label]) * 1e6:.0f} us a request"
            if label in left and not np.isnan(left[label]).all():
                line += f", {np.nanmedian(left[label]):.1f} cores left to the server"
            if label != reference and all(found[reference]) and all(rates):
                # ratio_ci's candidate/baseline speedup is baseline/candidate for times: pass rates the other way.
                ratio, (low, high) = ratio_ci([1 / x for x in found[reference]], [1 / x for x in rates],
                                              rounds=args.rounds)
                line += f"; {ratio:.2f}x the C client's (95% CI {low:.2f}-{high:.2f}x)"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
