"""`tfperf load --url`'s best within p99 10 ms beside wrk's and h2load's, on the same `tfperf serve` (issue 49).

Run:   .venv/bin/python benchmarks/load_client_vs_wrk.py [--rounds 3] [--budget-ms 10]   (about 10 minutes)
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
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from tfperf.measure.stats import ratio_ci  # noqa: E402
from tfperf.records.jsonl import Recorder  # noqa: E402
from tfperf.serving import h2load  # noqa: E402
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


def wrk(url: str, body: bytes, headers: dict[str, str], connections: int, seconds: int, folder: Path
        ) -> tuple[float, float, float]:
    """wrk's requests/s, p99 (ms, corrected for coordinated omission as wrk corrects it) and CPU seconds a
    request, posting `body` from one thread over `connections` kept-alive connections."""
    (folder / "body").write_bytes(body)
    lines = [f'local f = io.open("{folder}/body", "rb")', 'wrk.body = f:read("*a")', "f:close()",
             'wrk.method = "POST"', *(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())]
    (folder / "post.lua").write_text("\n".join(lines) + "\n")
    process = subprocess.Popen(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s",
                                str(folder / "post.lua"), url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = process.stdout.read().decode()
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = 0
    rate, p99 = re.search(r"Requests/sec:\s+([0-9.]+)", out), re.search(r"99%\s+([0-9.]+)(us|ms|s)", out)
    requests = re.search(r"(\d+) requests in", out)
    if not (rate and p99 and requests) or "Non-2xx" in out:
        raise RuntimeError(f"wrk failed: {out[-300:]}")
    cpu = (usage.ru_utime + usage.ru_stime) / max(int(requests[1]), 1)
    return float(rate[1]), float(p99[1]) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[p99[2]], cpu


def h2load_by_hand(endpoint, encoded, connections: int, seconds: float) -> tuple[float, float, float]:
    """h2load itself at `connections` streams for `seconds`: requests/s, p99 (ms) and CPU seconds a request."""
    level = h2load.closed_loop(endpoint, encoded, connections, window_s=seconds, max_windows=1, warmup_s=0.2)
    if level.errors:
        raise RuntimeError(level.errors[0])
    return level.throughput, level.percentile_s(99) * 1e3, level.client_cpu_per_request_s


def doubling(measure, budget_ms: float) -> tuple[float, int, float]:
    """The most requests/s a C client saw with p99 within the budget, its connections doubled from 1 until p99
    passes the budget or the rate grows less than 5%: (requests/s, connections, CPU seconds a request)."""
    best = (0.0, 0, 0.0)
    connections = 1
    while connections <= 128:
        rate, p99, cpu = measure(connections)
        if p99 > budget_ms:
            break
        grew = rate >= best[0] * 1.05
        best = max(best, (rate, connections, cpu))
        if not grew:
            break
        connections *= 2
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-ms", type=float, default=10.0)
    parser.add_argument("--seconds", type=int, default=2, help="each C-client level (whole seconds: wrk's unit)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for tool in ("wrk", "h2load"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            sys.exit(f"{tool} is not installed: apt-get install wrk nghttp2-client")
    from tfperf.deploy.layout import export_subject
    from tfperf.deploy.inputs import make_inputs
    from tfperf.deploy.loader import cookbook_subject

    budget = Budget(args.budget_ms / 1e3, 99.0)
    sizes = Sizes(window_s=0.5, max_windows=6, warmup_s=0.2, max_concurrency=128, concurrency_factor=2)
    with tempfile.TemporaryDirectory(prefix="load-client-vs-wrk-") as tmp_name:
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
                    rows.append((f"{protocol}: tfperf load --url, --client {client}", endpoint, client))
                reference = "wrk (C, by hand)" if endpoint.protocol != "grpc" else "h2load (C, by hand)"
                rows.append((f"{protocol}: {reference}", endpoint, None))
            rng = random.Random(args.seed)
            for r in range(args.rounds):
                rng.shuffle(rows)
                for label, endpoint, client in rows:
                    if client is not None:
                        bench = Bench({}, requests, budget, sizes, rec, tmp / "loadgen", endpoint=endpoint,
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
                            rate, _, per_request = doubling(
                                lambda c: h2load_by_hand(endpoint, encoded, c, args.seconds), args.budget_ms)
                        else:
                            body, headers = encoded
                            headers = {"Content-Type": "application/json", **headers}
                            rate, _, per_request = doubling(
                                lambda c: wrk(endpoint.infer_url, body, headers, c, args.seconds, tmp), args.budget_ms)
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
