"""BERT in MLPerf's Server scenario, at toy scale: pad each batch to its longest request, or batch by length.

MLPerf's inference benchmark serves BERT under LoadGen's Server scenario: queries arrive at random (Poisson)
and 99% of them must be answered within a bound. Each query has its own number of tokens, and a batch must
share one length, so short requests are padded. Padded to the batch's longest (TF Serving's
`pad_variable_length_inputs`), a 20-token request computes 128 tokens whenever a long one shares its batch;
queued by length bucket, each is padded only to its bucket, but each queue fills more slowly. Which wins is
the rate each sustains within the bound, counted in the tokens that were asked for.

Run:   python recipes/bert_server.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21, Keras 3, KerasHub (BERT built from its config: nothing is downloaded), mlcommons-loadgen.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.measure.measurement import Measurement, versus
from tfperf.recipe import Conclusion, Headline, Recipe, RecipeError
from tfperf.serving.batcher import Batcher, BatchingOptions
from tfperf.flags import int_list, length_range

VOCAB = 30522  # BERT's WordPiece vocabulary


# The model: KerasHub's BERT classifier built from its config (random weights, nothing downloaded). Its three
# int32 inputs (token ids, segment ids, a padding mask) leave the sequence axis free.
def bert(layers: int, hidden: int, max_length: int) -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=layers, num_heads=max(hidden // 32, 1),
                                             hidden_dim=hidden, intermediate_dim=4 * hidden,
                                             max_sequence_length=max_length)
    return keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2, preprocessor=None)


# One traced graph for every batch size and every length: both axes are None in the signature.
def serving_function(model: keras.Model):
    spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[{"token_ids": spec, "segment_ids": spec, "padding_mask": spec}])
    def serve(inputs):
        return {"logits": model(inputs, training=False)}

    return serve


# A request is one row at its own length. Padding appends zeros: token 0 and mask 0, so the attention skips
# what was added and the answer is the request's own.
def request(rng: np.random.Generator, length: int) -> dict:
    return {"token_ids": rng.integers(1, VOCAB, size=(1, length), dtype=np.int32),
            "segment_ids": np.zeros((1, length), np.int32), "padding_mask": np.ones((1, length), np.int32)}


# The technique: TF Serving's batching knobs. One request per call; a batch padded to its longest request;
# or a queue per length bucket, each batch padded to its bucket. A free batch thread runs what waits at once.
def policies(max_batch_size: int, buckets: list[int]) -> dict[str, BatchingOptions]:
    return {
        "one request per call": BatchingOptions(max_batch_size=1, batch_timeout_micros=0, idle_runs_now=True),
        "padded to the longest": BatchingOptions(max_batch_size=max_batch_size, idle_runs_now=True,
                                                 pad_variable_length_inputs=True),
        f"length buckets {','.join(map(str, buckets))}": BatchingOptions(
            max_batch_size=max_batch_size, idle_runs_now=True, length_buckets=tuple(buckets)),
    }


# Measuring -------------------------------------------------------------------------------------------------

WORTH = 0.10  # the gain per request that makes length buckets worth their extra queues
CLOSED, OPEN, VALIDATION = "closed loop (mixed lengths)", "LoadGen Server probes", "LoadGen Server validation"


@dataclasses.dataclass(frozen=True)
class Served:
    """One policy: closed-loop latencies, the best rate within the bound and LoadGen's verdict there."""

    latencies: Measurement
    closed_rate: float  # requests/s in closed loop
    rate: float  # the highest Server rate found within the bound (0: none was)
    valid: bool  # LoadGen's verdict on a longer run at that rate
    p99_ms: float  # at that rate, from scheduled time
    useful_share: float  # tokens asked for over tokens computed
    disagreement: float  # the largest difference from a request's answer alone, over the answers' scale


@dataclasses.dataclass(frozen=True)
class Found:
    served: dict  # policy -> Served
    mean_length: float
    spread: float  # how much the answers vary across requests: agreement on constant answers proves nothing


def add_flags(p) -> None:
    p.add_argument("--layers", type=flags.positive_int, help="encoder layers")
    p.add_argument("--hidden", type=flags.positive_int, help="hidden size (heads of 32, feed-forward 4x)")
    p.add_argument("--lengths", type=length_range, metavar="LO:HI", help="request lengths, drawn uniformly")
    p.add_argument("--length-buckets", type=int_list, metavar="N,N", help="the buckets (the last >= HI)")
    p.add_argument("--max-batch-size", type=flags.positive_int, help="largest batch the batcher runs")
    p.add_argument("--clients", type=flags.positive_int, help="closed-loop clients")
    p.add_argument("--latency-ms", type=flags.positive_float, help="the p99 bound")
    p.add_argument("--window", type=flags.positive_float, help="seconds per closed-loop window")
    p.add_argument("--probe", type=flags.positive_float, help="seconds per LoadGen probe of a rate")
    p.add_argument("--probes", type=flags.positive_int, help="LoadGen probes per policy")


def slug(name: str) -> str:
    """A policy's name as a folder name."""
    return name.replace(" ", "_").replace(",", "-")


def check_answers(batcher: Batcher, serve, requests: list[dict]) -> float:
    """Submitted together (so they batch and pad), each answer equals the request's alone; the largest
    difference over the answers' scale."""
    futures = [batcher.submit(r) for r in requests]
    worst = 0.0
    for r, future in zip(requests, futures):
        alone = serve(r)["logits"].numpy()
        got = future.result()["logits"]
        worst = max(worst, float(np.abs(got - alone).max()) / max(1.0, float(np.abs(alone).max())))
    return worst


def serve_under_loadgen(name: str, batcher: Batcher, requests: list[dict], args, rec) -> tuple[float, bool, float]:
    """The highest LoadGen Server rate found within the bound (short probes), then runs long enough to claim the
    p99, 15% slower while INVALID: (the last rate run, VALID or not, its p99 in ms); (0, False, nan) if none met."""
    from tfperf.serving import loadgen
    from tfperf.serving.search import bracket_rate

    tokens = float(np.mean([r["token_ids"].shape[1] for r in requests]))

    def offered(rate: float, seconds: float, queries: int, log_dir=None) -> loadgen.LoadGenResult:
        return loadgen.run(lambda i: batcher.submit(requests[i]), len(requests), rate=rate,
                           latency_s=args.latency_ms / 1e3, duration_s=seconds, min_queries=queries, log_dir=log_dir)

    def within(rate: float) -> bool:
        result = offered(rate, args.probe, 100)
        rec.add(OPEN, f"{name}, {rate:.0f}/s", result.metrics(), primary="completed_qps", lower_is_better=False,
                versus_first=False)
        return result.latency_met and not result.errors

    capacity = rec.table(CLOSED)[-1]["metrics"]["requests_per_s"]
    rate, _ = bracket_rate(within, capacity * 0.7, steps=args.probes, limit=capacity)
    if not rate:
        return 0.0, False, float("nan")
    logs = Path(args.out) / "bert_server_loadgen" / slug(name)
    tries, _ = loadgen.validated(lambda r, n: offered(r, max(args.probe, n / r), n, logs / f"{r:.0f}"), rate,
                                 args.probe, tries=3)
    for result in tries:
        rec.add(VALIDATION, f"{name}, {result.target_qps:.0f}/s", {
            **result.metrics(), "useful_tokens_per_s": result.target_qps * tokens,
            "useful_token_share": batcher.padding}, primary="completed_qps", lower_is_better=False, versus_first=False)
    return tries[-1].target_qps, tries[-1].valid, tries[-1].percentiles_ms.get("99.00", float("nan"))


def measure(args, rec) -> Found:
    from tfperf.measure.load import closed_loop

    low, high = args.lengths
    buckets = sorted(args.length_buckets)
    if buckets[-1] < high:
        raise RecipeError(f"--length-buckets must reach the longest request ({high} tokens), got {buckets}")
    keras.utils.set_random_seed(args.seed)
    serve = serving_function(bert(args.layers, args.hidden, max(high, buckets[-1])))
    rng = np.random.default_rng(args.seed)
    requests = [request(rng, int(n)) for n in rng.integers(low, high + 1, size=256)]
    mean_length = float(np.mean([r["token_ids"].shape[1] for r in requests]))
    logits = np.concatenate([serve(r)["logits"].numpy() for r in requests[:32]])  # also traces the graph
    call = lambda batch: {k: v.numpy() for k, v in serve(batch).items()}  # noqa: E731

    served = {}
    for name, options in policies(args.max_batch_size, buckets).items():
        with Batcher(lambda size: call, options) as batcher:
            # Checked before anything is timed: padded in a batch, each answer is the request's own.
            worst = check_answers(batcher, serve, requests[:2 * args.max_batch_size])
            counters = [iter(range(c * 37, 10 ** 9)) for c in range(args.clients)]
            level = closed_loop(lambda c: batcher(requests[next(counters[c]) % len(requests)]), args.clients,
                                window_s=args.window, max_windows=6, warmup_s=args.window / 2, label=name)
            latencies = Measurement(name, level.latencies_s)
            rec.add(CLOSED, name, {**level.metrics(), "clients": args.clients, **options.settings(),
                                   "useful_tokens_per_s": level.throughput * mean_length},
                    primary="p50_ms", lower_is_better=True, versus_first=False, measurement=latencies)
            rate, valid, p99 = serve_under_loadgen(name, batcher, requests, args, rec)
            served[name] = Served(latencies, level.throughput, rate, valid, p99, batcher.padding or 1.0, worst)
    return Found(served, mean_length, float(np.ptp(logits, axis=0).max()))


def conclude(args, rec, found: Found) -> Conclusion:
    names = list(found.served)
    _, longest, bucketed = (found.served[n] for n in names)
    bound = f"p99 <= {args.latency_ms:g} ms"
    lines = [f"{name}: {s.closed_rate:.0f} requests/s with {args.clients} clients in closed loop; under LoadGen, "
             + (f"no rate probed met {bound}" if not s.rate else
                f"{s.rate:.0f} requests/s VALID within {bound} (p99 {s.p99_ms:.1f} ms), "
                f"{s.rate * found.mean_length:,.0f} useful tokens/s" if s.valid else
                f"INVALID still at {s.rate:.0f} requests/s (p99 {s.p99_ms:.1f} ms)")
             + f"; {s.useful_share:.0%} of the computed tokens were asked for" for name, s in found.served.items()]
    # A batching policy is worth its queues only if it gains 10%: smaller differences flip between runs here.
    comparison = versus(longest.latencies, bucketed.latencies, threshold=WORTH)
    valid = {n: s.rate for n, s in found.served.items() if s.valid}
    best = max(valid, key=valid.get) if valid else None
    loadgen_says = (f"the most requests VALID within {bound} came from {best}: {valid[best]:.0f}/s, "
                    f"{valid[best] * found.mean_length:,.0f} useful tokens/s (" + ", ".join(
                        f"{n}: {'%.0f/s' % valid[n] if n in valid else 'not VALID'}" for n in names if n != best) + ")"
                    if best else f"no policy was VALID within {bound} at the rates tried")
    text = (f"Requests of {args.lengths[0]}-{args.lengths[1]} tokens (mean {found.mean_length:.0f}) to a "
            f"{args.layers}-layer BERT of hidden size {args.hidden}. Under LoadGen's Server scenario "
            f"{loadgen_says}. Padded to the longest, {longest.useful_share:.0%} of the "
            f"computed tokens were asked for; by bucket, {bucketed.useful_share:.0%}. With {args.clients} clients "
            f"in closed loop, buckets against padding to the longest: {comparison.describe()} per request. Before "
            f"anything was timed, each batched answer was checked against the request's own alone (the mask "
            f"makes padding harmless): largest difference {max(s.disagreement for s in found.served.values()):.1g} "
            f"of scale.")
    wrong = [f"{n} ({s.disagreement:.2g})" for n, s in found.served.items() if s.disagreement > 1e-4]
    failure = (f"batched answers differ from the requests' own: {', '.join(wrong)}" if wrong else
               "" if found.spread > 1e-3 else
               "the model's answers do not vary across requests: the padded answers' agreement is not evidence")
    return Conclusion(text, lines, failure, Headline.compared(
        f"length buckets against padding to the longest, {args.clients} clients of mixed lengths (per request)",
        comparison))


RECIPE = Recipe(name="bert_server", doc=__doc__, order=148, measure=measure, conclude=conclude,
                add_flags=add_flags, sizes={"layers": (2, 2), "hidden": (128, 64), "lengths": ((16, 128), (16, 128)),
                                            "length_buckets": ([32, 64, 128], [32, 64, 128]),
                                            "max_batch_size": (16, 16), "clients": (16, 16),
                                            "latency_ms": (50.0, 50.0), "window": (1.0, 0.3), "probe": (2.0, 1.0),
                                            "probes": (5, 3)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
