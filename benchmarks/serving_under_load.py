"""Requests/s within p99 <= 10 ms on the seed CNN: the signature one at a time, BatchFunction, the best found,
and the best found served from a process of its own (`tfperf load --server-process`).

Run:   .venv/bin/python benchmarks/serving_under_load.py [--rounds 5] [--budget-ms 10]   (about 5 minutes)
Needs: what `make install` installs; nothing is downloaded.

The seed CNN is exported to SavedModel, LiteRT and ONNX; `tfperf load`'s search (its --quick space)
finds the best configuration within the budget. Then the three are measured side by side: in each of
`--rounds` rounds, in a shuffled order, each one's highest LoadGen Server rate (Poisson arrivals,
latency from scheduled time) whose p99 stays within the budget, bracketed by the next rate tried. Each
figure is the median over rounds with the range of the rounds; the ratio of the best to the signature
one at a time is taken round by round, so that a slow phase of the machine falls on both sides. The last
row serves the best configuration from a child process, its requests crossing a pipe: what the clients'
Python threads cost the server through the GIL, against what the pipe costs.
"""

import argparse
import dataclasses
import math
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget-ms", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    from tfperf.deploy.inputs import make_inputs
    from tfperf.deploy.layout import export_subject
    from tfperf.deploy.loader import cookbook_subject
    from tfperf.records.jsonl import Recorder
    from tfperf.serving.configs import one_row_requests
    from tfperf.serving.measure import ANCHOR, Bench, Sizes, batch_function_config
    from tfperf.serving.remote import ServerProcess
    from tfperf.serving.search import Budget, Space, ranked, search

    budget = Budget(args.budget_ms / 1e3, 99.0)
    sizes = Sizes.quick()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        subject = cookbook_subject("cnn")
        exports = {fmt: export_subject(subject, Path(tmp) / "exports", name=fmt, format=fmt).path
                   for fmt in ("savedmodel", "litert", "onnx")}
        requests = one_row_requests(make_inputs(subject, 64, seed=args.seed))
        bench = Bench(exports, requests, budget, sizes, Recorder("load", vars(args)), Path(tmp) / "loadgen")
        anchors = [bench.sweep(ANCHOR), bench.sweep(batch_function_config(cores))]
        print(f"searching ({budget}) ...", file=sys.stderr, flush=True)
        space = Space(("litert", "onnx", "savedmodel"), {"litert": (cores,), "onnx": (cores,), "savedmodel": (None,)},
                      instances=sizes.instances, batch_sizes=sizes.batch_sizes, timeouts_us=(1000,))
        swept = search(bench.sweep, space, budget)
        best = ranked([*anchors, *swept], budget)[0]
        apart = f"best, served from its own process: {best.config.name}"
        rows = {"SavedModel signature, one request at a time": anchors[0],
                "TensorFlow BatchFunction (TF Serving's kernel)": anchors[1], f"best: {best.config.name}": best,
                apart: best}
        server_process = ServerProcess()
        benches = {label: bench for label in rows} | {apart: dataclasses.replace(bench, server_process=server_process)}
        # Swept again from its own process: its rate search starts from, and stops at, what it answers there.
        rows[apart] = benches[apart].sweep(best.config)
        found = {label: [] for label in rows}
        start = {label: 0.9 * s.rate_within(budget) for label, s in rows.items()}
        rng = random.Random(args.seed)
        for r in range(args.rounds):
            order = list(rows)
            rng.shuffle(order)
            for label in order:
                print(f"round {r + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
                # Never probed above what it answered in closed loop (see tfperf.serving.search.bracket_rate).
                capacity = max((lv.throughput for lv in rows[label].levels), default=math.inf)
                met, missed = benches[label].open_loop(rows[label].config, start[label], capacity)
                found[label].append((met, missed))
                start[label] = met or start[label] * 0.5
        server_process.close()
    base = found["SavedModel signature, one request at a time"]
    print(f"\n{args.rounds} interleaved rounds on {cores} cores; requests/s offered (LoadGen Server) with {budget}:\n")
    print("| served as | closed loop within budget | offered, median (range over rounds) | vs the signature, "
          "median (range) |\n|---|---|---|---|")
    for label, s in rows.items():
        mets = [m for m, _ in found[label]]
        ratios = [m / b for (m, _), (b, _) in zip(found[label], base) if b > 0]
        ratio = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)" if ratios else "-"
        closed = f"{s.rate_within(budget):.0f}"
        print(f"| {label} | {closed} | {statistics.median(mets):.0f} ({min(mets):.0f}-"
              f"{max(mets):.0f}) | {ratio} |")
    here, there = found[f"best: {best.config.name}"], found[apart]
    apart_vs = [t / h for (t, _), (h, _) in zip(there, here) if h > 0]
    if apart_vs:
        print(f"\nThe best served from its own process against in the clients' process, round by round: "
              f"{statistics.median(apart_vs):.2f}x ({min(apart_vs):.2f}-{max(apart_vs):.2f}x): above 1, the clients' "
              f"threads cost the server more through the GIL than the pipe costs; below 1, the other way round.")
    shares = [lv.client_share for s in rows.values() for lv in s.levels]
    print(f"\nWhat limits it: the clients (Python threads beside the server) used up to {max(shares):.0%} of the "
          f"process's CPU in closed loop, and LoadGen issues every request through Python on the same 2 cores.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
