"""Requests/s within p99 <= 10 ms on the seed CNN through sockets: a naive server, `tfperf serve` in each protocol,
and the in-process ceiling, side by side; the client's own ceiling beside them, and wrk (C) on the same server.

Run:   .venv/bin/python benchmarks/serving_for_real.py [--rounds 3] [--budget-ms 10]   (about 15 minutes)
Needs: what `make install` installs; wrk (Debian's `apt-get install wrk`) for its row, skipped without it.

The seed CNN is exported; `tfperf load`'s search (its --quick space, in process) finds the configuration. Then,
in each of --rounds rounds in a shuffled order, every row's highest LoadGen Server rate within the budget
(Poisson arrivals, latency from scheduled time; bracketed by the next rate tried) and its closed-loop rate:
- naive: Python's ThreadingHTTPServer calling the SavedModel signature per request, in TF Serving's REST
  format, what a user writes first; headers and body in one write (written apart, as send_response and
  wfile.write do, they meet Nagle's algorithm and delayed ACKs: about 40 ms a request on a kept-alive
  connection, a pitfall, not a baseline);
- `tfperf serve --config serve.json` (the configuration found), in a process of its own, called over TF
  Serving REST (row format and columnar), KServe v2 binary tensors, TF Serving gRPC and v2 gRPC;
- the same configuration in this process, no socket: the ceiling;
- an echo of the REST and gRPC answers (no work, own process): the Python client's ceiling.
Ratios are taken round by round. wrk (C) then drives the naive server and `tfperf serve` (REST rows and v2
binary), and the same configuration in a process per core (`--workers`, SO_REUSEPORT, one runtime thread each),
doubling its connections until p99 passes the budget: what a client that is not Python sees of the same servers.
"""

import argparse
import dataclasses
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfperf.serving import wrk  # noqa: E402

NAIVE = '''
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import numpy as np, tensorflow as tf
export, metadata, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
serve = tf.saved_model.load(export).signatures["serving_default"]
meta = open(metadata, "rb").read()

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clients expect

    def answer(self, body):
        self.wfile.write(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: "
                         + str(len(body)).encode() + b"\\r\\n\\r\\n" + body)  # one write: see the docstring

    def do_GET(self):
        self.answer(meta)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        x = np.asarray([r["inputs"] if isinstance(r, dict) else r for r in request["instances"]], np.float32)
        out = {k: v.numpy() for k, v in serve(inputs=tf.constant(x)).items()}
        rows = [{k: v[i].tolist() for k, v in out.items()} for i in range(len(x))]
        self.answer(json.dumps({"predictions": rows}).encode())

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
print("ready", flush=True)
server.serve_forever()
'''


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(proc: subprocess.Popen, word: str) -> str:
    line = proc.stdout.readline()
    if word not in line:
        raise SystemExit(f"server did not start: {line}{proc.stderr.read()[-2000:] if proc.poll() is not None else ''}")
    return line


def wrk_within(url: str, body: bytes, headers: dict[str, str], budget_ms: float) -> str:
    """The most requests/s wrk saw with p99 within the budget (`wrk.most_within`: connections doubled from 1 until
    p99 passes the budget or the rate stops growing 5%), in words."""
    if not wrk.available():
        return "not run: wrk is not installed (apt-get install wrk)"

    seen: list[wrk.WrkRun] = []

    def run(connections: int, seconds: int = 5) -> wrk.WrkRun:
        seen.append(wrk.post(url, body, headers, connections=connections, seconds=seconds))
        return seen[-1]

    try:
        run(1, seconds=2)  # warm-up: a backlog a LoadGen probe left is answered first
        found = wrk.most_within(run, budget_ms, rate=lambda r: r.per_s, p99_ms=lambda r: r.p99_ms)
        if found is None:
            first = seen[1]
            return f"p99 {first.p99_ms:.2f} ms already at 1 connection ({first.per_s:,.0f} requests/s): over the budget"
    except RuntimeError as e:
        return f"wrk failed: {e}"
    connections, best = found
    return f"{best.per_s:,.0f} requests/s at {connections} connections, p99 {best.p99_ms:.2f} ms"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget-ms", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    from tfperf.deploy.inputs import make_inputs
    from tfperf.deploy.layout import export_subject, load
    from tfperf.deploy.loader import cookbook_subject
    from tfperf.records.jsonl import Recorder
    from tfperf.serving.configs import ServingConfig, one_row_requests
    from tfperf.serving.echo import EchoProcess, record
    from tfperf.serving.endpoint import RemoteServer, parse_url
    from tfperf.serving.measure import Bench, Sizes
    from tfperf.serving.search import Budget, Space, ranked, search
    from tfperf.serving.through_socket import ServeProcess
    from tfperf.serving.protocols import tfserving_rest
    from tfperf.serving.protocols.tensors import Tensor, dump_json

    budget, sizes, cores = Budget(args.budget_ms / 1e3, 99.0), Sizes.quick(), os.cpu_count() or 1
    tmp = Path(tempfile.mkdtemp(prefix="serving-for-real-"))
    procs = []
    try:
        subject = cookbook_subject("cnn")
        exports = {fmt: export_subject(subject, tmp / "exports", name=fmt, format=fmt).path
                   for fmt in ("savedmodel", "onnx")}
        requests = one_row_requests(make_inputs(subject, 64, seed=args.seed))
        bench = Bench(exports, requests, budget, sizes, Recorder("load", {}), tmp / "loadgen")
        print(f"searching ({budget}, in process) ...", file=sys.stderr, flush=True)
        space = Space(("onnx", "savedmodel"), {"onnx": (cores,), "savedmodel": (None,)},
                      instances=sizes.instances, batch_sizes=sizes.batch_sizes, timeouts_us=(1000,))
        best = ranked(search(bench.sweep, space, budget), budget)[0].config
        print(f"found: {best.name}", file=sys.stderr, flush=True)
        serve = ServeProcess(exports[best.runtime], best, "cnn", tmp / "serve.log")
        procs.append(serve)
        rest, grpc_port = serve.ports
        # The same configuration in a process per core sharing the ports, each runtime on one thread: for wrk below.
        workers = ServeProcess(exports[best.runtime], dataclasses.replace(best, workers=cores, threads=1), "cnn",
                               tmp / "workers.log")
        procs.append(workers)
        workers_port = workers.ports[0]
        runner = load(exports["savedmodel"])
        outputs = runner(requests[0])
        meta = tfserving_rest.metadata("cnn", 1, "serving_default",
                                       [Tensor(s.name, s.dtype, s.shape) for s in runner.inputs],
                                       [Tensor(k, v.dtype.name, (None, *v.shape[1:])) for k, v in outputs.items()])
        (tmp / "metadata.json").write_bytes(dump_json(meta))
        naive_port = free_port()
        naive = subprocess.Popen([sys.executable, "-c", NAIVE, str(exports["savedmodel"]), str(tmp / "metadata.json"),
                                  str(naive_port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(naive)
        wait_for(naive, "ready")

        endpoints = {
            "naive: ThreadingHTTPServer, the signature per request (REST rows)":
                parse_url(f"http://127.0.0.1:{naive_port}/v1/models/cnn"),
            "tfperf serve, TF Serving REST (rows)": parse_url(f"http://127.0.0.1:{rest}/v1/models/cnn"),
            "tfperf serve, TF Serving REST (columnar)": parse_url(f"http://127.0.0.1:{rest}/v1/models/cnn",
                                                                  columnar=True),
            "tfperf serve, KServe v2 (binary tensors)": parse_url(f"http://127.0.0.1:{rest}/v2/models/cnn"),
            "tfperf serve, TF Serving gRPC": parse_url(f"grpc://127.0.0.1:{grpc_port}/cnn"),
            "tfperf serve, KServe v2 gRPC": parse_url(f"grpc+v2://127.0.0.1:{grpc_port}/cnn"),
        }
        echoes = {}
        for label, which in (("echo of the REST answers: the Python client's ceiling", "tfperf serve, TF Serving REST (rows)"),
                             ("echo of the gRPC answers: the Python client's ceiling", "tfperf serve, TF Serving gRPC")):
            with RemoteServer(endpoints[which]) as remote:
                remote._encode(requests[0])
                import asyncio

                recorded = asyncio.run_coroutine_threadsafe(record(remote), remote.loop).result(60)
            echo = EchoProcess(recorded)
            procs.append(echo)
            echoes[label] = parse_url(re.sub(r":\d+/", f":{echo.port}/", endpoints[which].url() if
                                             endpoints[which].protocol == "rest" else
                                             f"grpc://127.0.0.1:{echo.port}/cnn"))
        rows = {**{k: ServingConfig("endpoint", label=k) for k in [*endpoints, *echoes]},
                f"in process, no socket: {best.name}": best}
        targets = {**endpoints, **echoes}
        benches = {k: Bench(exports, requests, budget, sizes, bench.rec, tmp / "loadgen", endpoint=targets.get(k))
                   for k in rows}
        swept = {k: benches[k].sweep(c) for k, c in rows.items()}
        found = {k: [] for k in rows}
        rng = random.Random(args.seed)
        for r in range(args.rounds):
            order = list(rows)
            rng.shuffle(order)
            for k in order:
                print(f"round {r + 1}/{args.rounds}: {k}", file=sys.stderr, flush=True)
                capacity = max((lv.throughput for lv in swept[k].levels), default=math.inf)
                found[k].append(benches[k].open_loop(rows[k], 0.9 * swept[k].rate_within(budget) or 10.0, capacity))
        naive_label = next(iter(endpoints))
        inproc = f"in process, no socket: {best.name}"
        print(f"\nSeed CNN, {budget}, {args.rounds} interleaved rounds; configuration found: {best.name}\n")
        print("| served as | closed loop | offered, median (range over rounds) | vs naive | vs in process |")
        print("|---|---|---|---|---|")
        for k in rows:
            met = [m for m, _ in found[k]]

            def ratio(base: str) -> str:
                per = [a / b for (a, _), (b, _) in zip(found[k], found[base]) if b > 0]
                return f"{statistics.median(per):.2f}x ({min(per):.2f}-{max(per):.2f}x)" if per else "-"

            print(f"| {k} | {swept[k].rate_within(budget):,.0f} | {statistics.median(met):,.0f} "
                  f"({min(met):,.0f}-{max(met):,.0f}) | {ratio(naive_label)} | {ratio(inproc)} |")
        # wrk (C, one thread) on the same servers, and on serve --workers 2 (a process per core, SO_REUSEPORT):
        # what a client that is not Python sees, within the same budget.
        rows_body = dump_json({"instances": [{"inputs": requests[0]["inputs"][0].tolist()}]})
        x = requests[0]["inputs"]
        header = dump_json({"inputs": [{"name": "inputs", "shape": list(x.shape), "datatype": "FP32",
                                        "parameters": {"binary_data_size": x.nbytes}}],
                            "outputs": [{"name": k, "parameters": {"binary_data": True}} for k in outputs]})
        binary = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
        json_type = {"Content-Type": "application/json"}
        inproc_median = statistics.median(m for m, _ in found[inproc])
        print(f"\nwrk (C, one thread, doubling connections), the most requests/s with p99 <= {args.budget_ms:g} ms; "
              f"in process the median was {inproc_median:,.0f}/s:")
        for label, url, body, headers in (
                ("naive, REST rows", f"http://127.0.0.1:{naive_port}/v1/models/cnn:predict", rows_body, json_type),
                ("tfperf serve, REST rows", f"http://127.0.0.1:{rest}/v1/models/cnn:predict", rows_body, json_type),
                ("tfperf serve, KServe v2 binary", f"http://127.0.0.1:{rest}/v2/models/cnn/infer",
                 header + x.tobytes(), binary),
                (f"tfperf serve --workers {cores} --threads 1, REST rows",
                 f"http://127.0.0.1:{workers_port}/v1/models/cnn:predict", rows_body, json_type),
                (f"tfperf serve --workers {cores} --threads 1, KServe v2 binary",
                 f"http://127.0.0.1:{workers_port}/v2/models/cnn/infer", header + x.tobytes(), binary)):
            print(f"- {label}: {wrk_within(url, body, headers, args.budget_ms)}", flush=True)
    finally:
        for proc in procs:
            if isinstance(proc, subprocess.Popen):
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            else:
                proc.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
