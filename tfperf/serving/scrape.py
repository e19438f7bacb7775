"""Where a request's time went inside the server, from the server's own Prometheus metrics read before and after
a load level: the mean wait for a batch, the model's time for a batch, rows per batch, and the server's time
from request read to answer written; the rest of what the client measured is the hop (protocol, sockets, the
client itself). Two servers' metric names are known: `tfperf serve`'s and Triton's."""

from __future__ import annotations

import math
import urllib.error
import urllib.request

METRICS_PATH = "/monitoring/prometheus/metrics"  # where tfperf serve (as TF Serving) serves its metrics: here once

# Cumulative sums and counts each server exports, by what they mean here (summed over the labels).
NAMES = {
    "tfperf": {"queue_s": "tfperf_queue_latency_seconds_sum", "waits": "tfperf_queue_latency_seconds_count",
               "compute_s": "tfperf_compute_latency_seconds_sum", "batches": "tfperf_compute_latency_seconds_count",
               "rows": "tfperf_batch_size_sum", "server_s": "tfperf_request_latency_seconds_sum",
               "requests": "tfperf_request_latency_seconds_count"},
    # Triton charges each request its batch's compute time; durations in microseconds.
    "triton": {"queue_us": "nv_inference_queue_duration_us", "compute_us": "nv_inference_compute_infer_duration_us",
               "batches": "nv_inference_exec_count", "rows": "nv_inference_count",
               "server_us": "nv_inference_request_duration_us", "requests": "nv_inference_request_success"},
}


def snapshot(url: str, timeout_s: float = 5.0) -> dict[str, float] | None:
    """Every sample in the metrics at `url` summed over its labels, by sample name; None when it does not answer
    metrics a known server exports."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            text = answer.read().decode("utf-8", errors="replace")
        families = list(text_string_to_metric_families(text))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    totals: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                continue
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    # A family declared but not yet observed (no request answered so far) counts as zero.
    declared = {family.name for family in families}
    for names in NAMES.values():
        for name in names.values():
            if name not in totals and any(name.startswith(family) for family in declared):
                totals[name] = 0.0
    return totals if any(kind_of(totals) == k for k in NAMES) else None


def kind_of(totals: dict[str, float]) -> str | None:
    """Which server's names the metrics hold (tfperf or triton), or None."""
    for kind, names in NAMES.items():
        if names["requests"] in totals:
            return kind
    return None


def split(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """The server's means over what it answered between two snapshots, in ms (empty when either is missing or
    nothing was answered): server_queue_ms (a request's wait for its batch), server_model_ms (a batch's call),
    server_batch_rows, server_latency_ms (request read to answer written)."""
    if not before or not after or kind_of(after) is None:
        return {}
    kind = kind_of(after)
    names = NAMES[kind]

    def delta(key: str) -> float:
        return after.get(names[key], 0.0) - before.get(names[key], 0.0)

    requests, batches = delta("requests"), delta("batches")
    if requests <= 0:
        return {}
    if kind == "tfperf":
        waits = delta("waits")
        found = {"server_queue_ms": delta("queue_s") / waits * 1e3 if waits > 0 else math.nan,
                 "server_model_ms": delta("compute_s") / batches * 1e3 if batches > 0 else math.nan,
                 "server_latency_ms": delta("server_s") / requests * 1e3}
    else:
        found = {"server_queue_ms": delta("queue_us") / requests / 1e3,
                 "server_model_ms": delta("compute_us") / requests / 1e3,
                 "server_latency_ms": delta("server_us") / requests / 1e3}
    found["server_batch_rows"] = delta("rows") / batches if batches > 0 else math.nan
    return {k: v for k, v in found.items() if math.isfinite(v)}


# Past this share of the server's own time a request spent around the model (not waiting for a batch, not in it),
# the answer says so: the request's format and the server's handling of it, not the model, are where time goes.
AROUND_THE_MODEL = 0.5


def around_the_model(split: dict[str, float], clients: int, as_json: bool,
                     client_mean_ms: float | None = None) -> str | None:
    """A sentence on the server's own account of a request at `clients` clients: how much of it the model took and
    how much went around it (reading, decoding, encoding, writing), with what to try where the requests travel as
    JSON text (`as_json`); None without the metrics."""
    if not {"server_latency_ms", "server_model_ms"} <= split.keys() or split["server_latency_ms"] <= 0:
        return None
    server, model, queue = split["server_latency_ms"], split["server_model_ms"], split.get("server_queue_ms", 0.0)
    around = max(server - model - queue, 0.0)
    # Its means count every request answered between the level's two reads, the warm-up's too: above the client's
    # own mean they are the shares to read, not the figure.
    above = f" (a mean that counts the level's warm-up too: the client's own was {client_mean_ms:.1f} ms)" if (
        client_mean_ms is not None and server > client_mean_ms) else ""
    said = (f"The server's own metrics at {clients} client{'s' if clients != 1 else ''}: {server:.1f} ms a request"
            f"{above}, of which the model {model:.1f} ms (its batch's call) and the wait for a batch {queue:.1f} ms")
    if around / server > AROUND_THE_MODEL:
        return (said + f"; the other {around:.1f} ms ({around / server:.0%}) went around the model (reading and "
                       f"decoding the request, encoding and writing the answer): there, not in the model, is where "
                       f"this server's time goes" + (", and a request format lighter than JSON text (gRPC, or KServe "
                                                     "v2's binary tensors) is what to try first." if as_json else "."))
    return said + f": the model is {model / server:.0%} of the server's time, what a faster model would save."
