"""Across hosts: "what will more hosts give me, over my link?"

The user's model on N hosts over a link, predicted (`tfperf doctor --hosts N --link RATE[,RTT]`): t1 is plain
fit's training step measured here, t2 the ring all-reduce of the model's float32 gradients over the link
(2(N-1)/N S/B + 2(N-1) latency, a latency being half the round trip) plus the engine's costs, a fixed one per
collective and one per byte, measured here with a small and a large all-reduce between two processes
(tfperf.cluster.collective), and a step on N hosts takes t1 + t2
while doing N times the examples: the speedup is N t1 / (t1 + t2), the gradients in one message after the pass;
with each gradient all-reduced as soon as backpropagation makes it (Horovod's wait-free overlap), only the t2 left
after the pass counts, each message paying the fixed cost: a ceiling where hiding saves more than the extra messages
cost, said to be slower where not; with fp16 compression the bytes halve.
Written to scaling.json beside the report, and said in a paragraph."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tfperf import flags
from tfperf.cluster.collective import EngineCost
from tfperf.cluster.ring import exposed_t2, ring_t2
from tfperf.doctor.experiment import Context, Experiment, Section, flag

DEFAULT_RTT_S = 100e-6  # a LAN's round trip when --link gives none: said in the report


def parse_link(text: str) -> tuple[float, float | None]:
    """'10gbit' or '1gbit,200us': a real cluster's link rate (bits/s) and round trip (None: not given), or
    ValueError in one line."""
    from tfperf.cluster.hosts import parse_link as parse_rate

    rate_text, _, rtt_text = text.partition(",")
    try:
        rate = parse_rate(rate_text).bits_per_s
        rtt = parse_rate(f"1gbit,{rtt_text}").delay_s if rtt_text else None
    except ValueError as exc:
        raise ValueError(str(exc).replace("delay", "round trip").replace(f"{rate_text!r}", f"{text!r}")) from None
    return rate, rtt


def predict(*, hosts: int, batch: int, samples_per_s: float, gradient_bytes: int, link_bits_per_s: float,
            rtt_s: float | None, readiness: list[tuple[float, int]] | None = None,
            engine: EngineCost | None = None) -> dict[str, Any]:
    """The prediction, with what it rests on (scaling.json's fields). With `readiness` (tfperf.models.
    gradient_readiness), also the ceiling where each gradient's all-reduce runs under the rest of backpropagation.
    `engine`: a collective's fixed cost, charged once per fused message, and the engine's cost per byte (none when
    not given)."""
    rtt = DEFAULT_RTT_S if rtt_s is None else rtt_s
    alpha, beta = rtt / 2, link_bits_per_s / 8
    costs = {"fixed_s": engine.fixed_s, "per_byte_s": engine.per_byte_s} if engine else {}
    t1 = batch / samples_per_s
    t2 = ring_t2(hosts, gradient_bytes, alpha, beta, **costs)
    t2_fp16 = ring_t2(hosts, gradient_bytes / 2, alpha, beta, **costs)
    found = {"hosts": hosts, "batch": batch, "link_bits_per_s": link_bits_per_s, "rtt_s": rtt,
             "rtt_assumed": rtt_s is None, "fixed_cost_s": costs.get("fixed_s", 0.0),
             "engine_per_byte_s": costs.get("per_byte_s", 0.0),
             "engine_cost_source": engine.source if engine else "none charged: not measured",
             "t1_s": t1, "t2_s": t2, "t2_fp16_s": t2_fp16,
             "gradient_bytes": gradient_bytes, "predicted_speedup": hosts * t1 / (t1 + t2),
             "predicted_speedup_fp16": hosts * t1 / (t1 + t2_fp16),
             "t2_exposed_s": None, "predicted_speedup_overlap": None, "predicted_speedup_overlap_fp16": None}
    if readiness:
        exposed = exposed_t2(t1, readiness, hosts, alpha, beta, **costs)
        halved = exposed_t2(t1, [(share, size / 2) for share, size in readiness], hosts, alpha, beta, **costs)
        found.update({"t2_exposed_s": exposed, "predicted_speedup_overlap": hosts * t1 / (t1 + exposed),
                      "predicted_speedup_overlap_fp16": hosts * t1 / (t1 + halved)})
    return found


def write(found: dict[str, Any], out: Path) -> Path:
    """scaling.json in `out`."""
    from tfperf.records.jsonl import atomic_write_text

    path = Path(out) / "scaling.json"
    atomic_write_text(path, json.dumps(found, indent=1) + "\n")
    return path


def describe(found: dict[str, Any]) -> str:
    """The prediction in a paragraph."""
    rtt = f"{found['rtt_s'] * 1e6:.0f} us round trip" + (" (assumed: --link RATE,RTT gives yours)"
                                                          if found["rtt_assumed"] else "")
    share = found["t2_s"] / (found["t1_s"] + found["t2_s"])
    return (f"On {found['hosts']} hosts over {found['link_bits_per_s'] / 1e9:g} Gbit/s ({rtt}), batch "
            f"{found['batch']} per host: a step computes for {found['t1_s'] * 1e3:.1f} ms (t1, plain fit measured "
            f"here) and all-reduces {found['gradient_bytes'] / 1e6:.1f} MB of float32 gradients in "
            f"{found['t2_s'] * 1e3:.1f} ms (t2: the ring model, its bytes at the pace of the link or of the engine's "
            f"{found['engine_per_byte_s'] * 2**20 * 1e3:.2f} ms per MiB sent, the slower, and a fixed "
            f"{found['fixed_cost_s'] * 1e3:.1f} ms per all-reduce, {found['engine_cost_source']}), {share:.0%} of the "
            f"step: predicted speedup "
            f"**{found['predicted_speedup']:.2f}x** over one host ({found['predicted_speedup'] / found['hosts']:.0%} "
            f"scaling efficiency), {found['predicted_speedup_fp16']:.2f}x with fp16 compression "
            f"(hvd.Compression.fp16). It assumes t1 does not change with the host count and that the gradients go "
            f"in one message after backpropagation, as hvd.DistributedGradientTape(tape, num_groups=1) sends them "
            f"(Horovod's own fusion gathers only what is ready in the same cycle, and may send several messages a "
            f"step, each paying the fixed cost). " + _overlap(found)
            + "recipes/across_hosts.py --models YOUR.keras measures where it lands across emulated hosts.")


def _overlap(found: dict[str, Any]) -> str:
    """The sentences on wait-free backpropagation: a ceiling where hiding t2 under the pass saves more than the
    extra messages' fixed costs, else said to be slower (on a fast link the fixed cost, not the bytes, decides)."""
    overlap = found["predicted_speedup_overlap"]
    if not overlap:
        return "The layers' FLOPs could not be counted one by one, so no prediction with overlap is given. "
    said = (f"Horovod all-reduces each gradient as soon as backpropagation has made it, under the rest of the pass, "
            f"in as many messages as the gradients come ready apart: with the backward pass two thirds of t1 and "
            f"spread over the layers by their FLOPs, {found['t2_exposed_s'] * 1e3:.1f} ms of all-reduce is left after "
            f"it, ")
    if overlap >= found["predicted_speedup"]:
        return said + (f"a ceiling of **{overlap:.2f}x** ({found['predicted_speedup_overlap_fp16']:.2f}x with fp16). "
                       f"A real cluster lands between the two, nearer the ceiling the more cores a host has left for "
                       f"communication. ")
    return said + (f"**{overlap:.2f}x**, less than one message after the pass: each message pays the fixed cost, and "
                   f"here that costs more than the overlap hides. Fusing them (num_groups=1, a longer "
                   f"HOROVOD_CYCLE_TIME, or fewer, larger tensors) brings the step towards "
                   f"{found['predicted_speedup']:.2f}x. ")


def run(ctx: Context) -> Section:
    """The speedup on --hosts hosts over --link, from plain fit's step measured by the training race."""
    import numpy as np

    from tfperf.models import gradient_readiness

    options = ctx.options
    plain = next((r for r in ctx.recorder.table("training") if r["row"].startswith("plain fit")), None)
    if plain is None:
        text, found = "The speedup on hosts was not predicted: plain fit's training step was not measured.", None
    else:
        from tfperf.cluster.collective import measure_engine_cost

        ctx.say("across hosts: the engine's costs, from a small and a large all-reduce between two processes "
                "(about 15 s)")
        engine = measure_engine_cost()
        link_bits, rtt = parse_link(options.link)
        weights = ctx.subject.model.trainable_weights
        found = predict(hosts=options.hosts, batch=int(plain["row"].split("batch ")[1].rstrip(")")),
                        samples_per_s=plain["metrics"]["samples_per_s"],
                        gradient_bytes=int(sum(4 * int(np.prod(w.shape)) for w in weights)),  # float32 gradients
                        link_bits_per_s=link_bits, rtt_s=rtt, readiness=gradient_readiness(ctx.subject.model),
                        engine=engine)
        write(found, ctx.out)
        text = describe(found)
    return Section(EXPERIMENT.name, found=found, answer=f"\n## Across hosts\n\n{text}")


def _link_rules(args) -> str | None:
    if (args.hosts is None) != (args.link is None):
        return "--hosts and --link go together: the speedup on N hosts over a link"
    if args.hosts and not args.train:
        return "--hosts predicts training across hosts from a measured training step: add --train --loss LOSS"
    try:
        args.link and parse_link(args.link)
    except ValueError as exc:
        return str(exc)
    return None


EXPERIMENT = Experiment(
    name="across hosts", question="What will more hosts give me, over my link?",
    run=run, applies=lambda subject, options: bool(options.hosts), budgeted=False,
    flags=(flag("--hosts", type=flags.positive_int, metavar="N",
                help="with --train: predict the model's speedup on N hosts over --link (scaling.json in --out)"),
           flag("--link", metavar="RATE[,RTT]", default=None,
                help="with --hosts: the link between hosts, e.g. 10gbit or 1gbit,200us (round trip; default 100us)")),
    rules=(_link_rules,))
