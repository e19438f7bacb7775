"""What the hop costs: one model at the same load in process, over TF Serving's REST API, KServe v2 and gRPC.

A deployed model is called through a socket, and for a small model the call costs more than the model: the
request is encoded, sent, parsed and answered. TF Serving's REST API carries every number as JSON text (one
object per row, or one list per input: "columnar"); KServe's v2 protocol (Triton, KServe, MLServer) can send
a JSON header followed by the tensor's raw bytes; gRPC sends a protobuf. The same server (`tfperf serve`, a
process of its own) answers all four; the figure is the most requests/s within the latency budget.

Run:   python recipes/serving_protocols.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21, tensorflow-serving-api (TF Serving's gRPC stubs), mlcommons-loadgen; a CPU is enough;
       h2load (Debian's nghttp2-client) sends the load where installed, else tfperf's Python client.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import http.client
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.measure.measurement import Measurement, versus
from tfperf.recipe import Conclusion, Headline, Recipe
from tfperf.serving import h2load


# The technique: the same request in each protocol, as a client writes it. TF Serving's REST API, row format:
# one JSON object per instance, every float written out as text.
def rest_rows(x: np.ndarray) -> tuple[str, bytes, dict]:
    return ":predict", json.dumps({"instances": x.tolist()}).encode(), {"Content-Type": "application/json"}


# Columnar: one list per input ({"inputs": ...}); the same text, without an object per row.
def rest_columnar(x: np.ndarray) -> tuple[str, bytes, dict]:
    return ":predict", json.dumps({"inputs": x.tolist()}).encode(), {"Content-Type": "application/json"}


# KServe v2's binary tensor extension (what tritonclient sends): a JSON header naming each tensor's shape, type
# and byte count, then the raw bytes. Nothing is written out as text or parsed back.
def v2_binary(x: np.ndarray, name: str) -> tuple[str, bytes, dict]:
    header = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": False}}).encode()
    return "/infer", header + x.astype("<f4").tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                                          "Content-Type": "application/octet-stream"}


# The request sent in one write: http.client joins a bytes body to its headers. Written apart (as
# BaseHTTPRequestHandler's send_response and wfile.write do on the server's side), the second write waits for
# the peer's delayed ACK under Nagle's algorithm: about 40 ms a request on a kept-alive connection.
def post(port: int, path: str, body: bytes, headers: dict) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", path, body, headers)
    answer = json.loads(connection.getresponse().read())
    connection.close()
    return answer


# gRPC: TF Serving's PredictRequest, its tensor as a TensorProto, through the stubs tensorflow-serving-api ships.
def grpc_predict(port: int, model: str, name: str, x: np.ndarray) -> dict:
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs[name].CopyFrom(tf.make_tensor_proto(x))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return {k: tf.make_ndarray(v) for k, v in answer.outputs.items()}


# Measuring -------------------------------------------------------------------------------------------------

PROTOCOLS = ("rest", "rest-columnar", "v2", "grpc")  # tfperf.serving.through_socket's names for the four above
TABLE, ALONE = "the same load, by protocol (closed loop)", "one request at a time"


@dataclasses.dataclass(frozen=True)
class Found:
    swept: dict  # what ran (in process, or the protocol's name) -> tfperf.serving.search.Swept
    shown: dict  # the same keys -> how the records and the conclusion name them
    disagreement: float  # the largest difference of any protocol's answer from the model's, over its scale
    spread: float  # how much the model's answers vary across requests


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    p.add_argument("--concurrency", type=flags.positive_int, nargs="+", help="closed-loop clients, the same for all")
    p.add_argument("--window", type=flags.positive_float, help="seconds per closed-loop window")
    p.add_argument("--latency-ms", type=flags.positive_float, help="the p99 budget")
    p.add_argument("--max-batch-size", type=flags.positive_int, help="the server's batches")
    h2load.add_client_flag(p)


def measure(args, rec) -> Found:
    from tfperf.deploy.layout import export_subject, load
    from tfperf.deploy.loader import cookbook_subject
    from tfperf.serving.batcher import BatchingOptions
    from tfperf.serving.configs import ServingConfig
    from tfperf.serving.measure import Bench, Sizes
    from tfperf.serving.search import Budget
    from tfperf.serving.through_socket import ServeProcess, label, sweep_protocols

    work = Path(tempfile.mkdtemp(prefix="serving_protocols-"))
    exported = export_subject(cookbook_subject(args.model), work, name=args.model, format="onnx")
    model = load(exported.path)
    name = model.inputs[0].name
    rng = np.random.default_rng(args.seed)
    requests = [{name: rng.normal(size=(1, *model.inputs[0].shape[1:])).astype(np.float32)} for _ in range(64)]
    config = ServingConfig("onnx", os.cpu_count(), 2, BatchingOptions(max_batch_size=args.max_batch_size,
                                                                      batch_timeout_micros=1000))
    sizes = dataclasses.replace(Sizes(), window_s=args.window, max_windows=6, warmup_s=args.window / 2)
    # The clients through a socket: h2load (C) where installed, so that they take little of the server's cores.
    bench = Bench({"onnx": exported.path}, requests, Budget(args.latency_ms / 1e3), sizes, rec, work / "loadgen",
                  client=h2load.client_for(args.client))
    with ServeProcess(exported.path, config, args.model, work / "serve.log") as server:
        # Each protocol's answer, sent as above, is the model's own.
        x, want = requests[0][name], model(requests[0])
        out = next(iter(want))
        rows, columns = (post(server.ports[0], f"/v1/models/{args.model}{path}", body, headers)
                         for path, body, headers in (rest_rows(x), rest_columnar(x)))
        path, body, headers = v2_binary(x, name)
        tensors = post(server.ports[0], f"/v2/models/{args.model}{path}", body, headers)["outputs"]
        got = [np.asarray([row[out] for row in rows["predictions"]]), np.asarray(columns["outputs"][out]),
               np.asarray(next(t["data"] for t in tensors if t["name"] == out)).reshape(want[out].shape),
               grpc_predict(server.ports[1], args.model, name, x)[out]]
        scale = max(1.0, float(np.abs(want[out]).max()))
        disagreement = max(float(np.abs(g - want[out]).max()) / scale for g in got)
        # The measurement: the same clients, levels and rules in each protocol and in process.
        swept = {p: t.swept for p, t in zip(PROTOCOLS, sweep_protocols(
            bench, server, config, args.model, PROTOCOLS, concurrencies=list(args.concurrency)))}
    swept["in process"] = bench.sweep(config, list(args.concurrency))
    answers = np.concatenate([model(r)[out] for r in requests[:8]])
    shown = {w: w if w == "in process" else label(config, w).rpartition(", through ")[2] for w in swept}
    for what, s in swept.items():
        level = s.best_level(bench.budget)
        rec.add(TABLE, shown[what], {
            "requests_per_s_within_budget": s.rate_within(bench.budget), **(level.metrics() if level else {}),
            **({"dropped": s.dropped} if s.dropped else {})}, primary="requests_per_s_within_budget",
            lower_is_better=False, versus_first=False)
    return Found(swept, shown, disagreement, float(np.ptp(answers, axis=0).max()))


def sent_by(level) -> str:
    """Who sent a level's requests through the socket, and the CPU a request cost it, in words."""
    cost = level.client_cpu_per_request_s
    return f"; sent by {level.client}" + (f", {cost * 1e6:.0f} us of CPU a request" if cost else "")


def conclude(args, rec, found: Found) -> Conclusion:
    from tfperf.serving.search import Budget

    budget = Budget(args.latency_ms / 1e3)
    inside = found.swept["in process"]
    lines = []
    for what, s in found.swept.items():
        shown = found.shown[what]
        level = s.best_level(budget)
        if level is None:
            lines.append(f"{shown}: {s.dropped or 'misses ' + str(budget) + ' already one request at a time'}")
            continue
        p50, p99 = (level.percentile_ci_s(q) for q in (50, 99))
        lines.append(f"{shown}: {s.rate_within(budget):,.0f} requests/s within {budget} ({level.label}: p50 "
                     f"{level.percentile_s(50) * 1e3:.2f} ms, 95% CI {p50[0] * 1e3:.2f}-{p50[1] * 1e3:.2f}; p99 "
                     f"{level.percentile_s(99) * 1e3:.2f} ms, {p99[0] * 1e3:.2f}-{p99[1] * 1e3:.2f}), "
                     f"{s.rate_within(budget) / max(inside.rate_within(budget), 1e-9):.2f}x of in process"
                     + (sent_by(level) if what != "in process" else ""))
    # One request at a time, each protocol's latency against in process: what the hop alone costs.
    # A first level whose window closed before any answer came (a stalled request outlasts a short --window) has
    # nothing to compare: it is named, not timed.
    alone = {w: Measurement(found.shown[w], s.levels[0].latencies_s) for w, s in found.swept.items()
             if s.levels and s.levels[0].latencies_s}
    unanswered = [found.shown[w] for w in found.swept if w not in alone]
    costs = ({w: versus(alone["in process"], m) for w, m in alone.items() if w != "in process"}
             if "in process" in alone else {})
    for w, m in alone.items():
        rec.add(ALONE, found.shown[w], {"p50_ms": m.median_s * 1e3}, primary="p50_ms", lower_is_better=True,
                measurement=m, comparison=costs.get(w))
    rows, binary = costs.get("rest"), costs.get("v2")
    silent = f"no answer within a window at {args.concurrency[0]} client(s)"
    hop = "; ".join([*(f"{found.shown[w]}: {c.describe()}" for w, c in costs.items()),
                     *(f"{shown}: {silent}" for shown in unanswered)])
    text = (f"The {args.model}, served by one tfperf serve (ONNX Runtime, batches of up to {args.max_batch_size}) "
            f"and called at the same loads ({', '.join(map(str, args.concurrency))} clients): " + "; ".join(lines)
            + f". One request at a time, against in process: {hop}. " + (
                f"Binary tensors against JSON rows, one at a time: {versus(alone['rest'], alone['v2']).describe()}."
                if rows and binary else "") + " Before anything was timed, every protocol's answer was checked "
            f"against the model's: they differed by at most {found.disagreement:.1g} of its scale.")
    failure = ("a protocol answered differently from the model" if found.disagreement > 1e-4 else
               "" if found.spread > 1e-3 else "the model's answers do not vary: agreement on them is not evidence")
    headline = versus(alone["rest"], alone["v2"]) if rows and binary else None
    return Conclusion(text, lines, failure, Headline.compared(
        "KServe v2 binary tensors against TF Serving REST rows, one request at a time (median latency)", headline)
        if headline else Headline("KServe v2 binary tensors against TF Serving REST rows", "a protocol did not answer"))


RECIPE = Recipe(name="serving_protocols", doc=__doc__, order=149, measure=measure, conclude=conclude,
                add_flags=add_flags, sizes={"concurrency": ([1, 4, 16], [1, 4, 16]), "window": (0.5, 0.25),
                                            "latency_ms": (10.0, 10.0), "max_batch_size": (16, 16)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
