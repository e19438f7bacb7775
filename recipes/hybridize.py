"""Eager vs graph vs XLA: the overhead ladder.

How much of a small model's time is Python and dispatch, and what tf.function and XLA take away.

Run:   python recipes/hybridize.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21 and Keras 3; a CPU is enough, a GPU is used when present.

Introduction
------------
Eager TensorFlow runs each op as Python reaches it: easy to debug, but every op pays for the
interpreter and the op dispatcher. `tf.function` traces the Python once into a graph that the
runtime executes without Python; `jit_compile=True` hands that graph to XLA, which fuses ops into
fewer kernels. For a model as small as the seed's MLP at batch 1 the arithmetic is microseconds, so
the ladder below is mostly a measurement of overhead, rung by rung, down to the compute limit: the
model's FLOPs at the matmul FLOP/s measured in this same run.

The second table is the other half of the story: a chain of element-wise ops is limited by memory
bandwidth, not FLOPs, and there XLA's fusion (one pass over memory instead of one per op) is what helps.
Its yardstick is a NumPy copy of the same array, the least memory traffic any implementation needs.

Every alternative in a table is measured in the same interleaved rounds, and every "faster" below is a
95% confidence interval of the ratio that excludes 1; an interval that straddles 1 says "no measurable
difference".
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.measure import Timer, interleave, peak_matmul_flops_per_s, timing_ms, versus
from tfperf.models import flops, get_net
from tfperf.recipe import Conclusion, Recipe

LADDER, FUSION = "overhead ladder (MLP, batch 1)", "element-wise chain (memory-bound)"
ONE_PASS, NUMPY_COPY = "x + 1 (one memory pass)", "NumPy copy (the bandwidth yardstick)"
ROUNDS = 10


def said(helps: list[str], hurts: list[str], same: list[str]) -> str:
    """'helps a, b; makes c slower; makes no measurable difference to d', leaving out empty parts."""
    parts = [f"helps {' and '.join(helps)}" if helps else "",
             f"makes {' and '.join(hurts)} slower" if hurts else "",
             f"makes no measurable difference to {' and '.join(same)}" if same else ""]
    return "; ".join(p for p in parts if p)


def add_flags(p) -> None:
    p.add_argument("--loop-iters", type=flags.positive_int, help="forward passes inside one graph call")
    p.add_argument("--chain-size", type=flags.positive_int, help="elements in the element-wise chain")
    p.add_argument("--min-time", type=flags.positive_float,
                   help="seconds of samples per alternative (when --steps is not given)")


def measure(args, rec) -> dict:
    # Setup ------------------------------------------------------------------------------------
    tf.random.set_seed(args.seed)
    net = get_net("mlp")
    x = tf.random.normal([1, 512])

    def forward(x):
        return net(x, training=False)

    def race(table, timers, baselines, metrics, primary):
        """Interleave the table's timers; record each row (metrics(m, all)) against the row named in `baselines`."""
        found = dict(zip([t.name for t in timers], interleave(
            timers, rounds=ROUNDS, samples=args.steps, warmup=args.warmup, min_time_s=args.min_time,
            seed=args.seed, profile_dir=args.profile)))
        comparisons = {}
        for row, m in found.items():
            c = versus(found[baselines[row]], m) if row in baselines else None
            comparisons[row] = c
            rec.add(table, row, metrics(m, found), primary=primary, lower_is_better=True, measurement=m, comparison=c)
        return found, comparisons

    # Baseline: eager, one op at a time through Python -------------------------------------------
    timers = [Timer(lambda: forward(x), name="eager")]

    # Graph: trace once, then run without Python --------------------------------------------------
    # tf.function: one trace, then the graph runs in C++
    graph = tf.function(forward)
    timers.append(Timer(lambda: graph(x), name="tf.function"))
    # tf.function: a concrete function skips the signature lookup that picks which trace to run
    concrete = graph.get_concrete_function(tf.TensorSpec(x.shape, x.dtype))
    timers.append(Timer(lambda: concrete(x), name="concrete function"))
    # XLA: compile the graph into fused kernels
    xla = tf.function(forward, jit_compile=True)
    timers.append(Timer(lambda: xla(x), name="XLA jit_compile"))

    # Many iterations inside one call: the per-call overhead is paid once per loop -----------------
    def loop(x, n):
        def body(i, x):
            # The carried x depends on the output, so no compiler may hoist the pass out of the loop.
            return i + 1, x + 1e-6 * tf.reduce_mean(forward(x))

        return tf.while_loop(lambda i, _: i < n, body, (tf.constant(0), x))[1]

    n = tf.constant(args.loop_iters)
    graph_loop, xla_loop = tf.function(loop), tf.function(loop, jit_compile=True)
    timers.append(Timer(lambda: graph_loop(x, n), name="graph loop (tf.while_loop)", items_per_call=args.loop_iters))
    timers.append(Timer(lambda: xla_loop(x, n), name="XLA loop (tf.while_loop)", items_per_call=args.loop_iters))

    # One batched call: the matmuls get big enough to use the vector units and all cores -----------
    xb = tf.random.normal([args.batch_size, 512])
    batched_graph, batched_xla = f"batched graph ({args.batch_size} rows)", f"batched XLA ({args.batch_size} rows)"
    timers.append(Timer(lambda: graph(xb), name=batched_graph, items_per_call=args.batch_size))
    timers.append(Timer(lambda: xla(xb), name=batched_xla, items_per_call=args.batch_size))

    baselines = {"tf.function": "eager", "concrete function": "tf.function", "XLA jit_compile": "tf.function",
                 "graph loop (tf.while_loop)": "tf.function", "XLA loop (tf.while_loop)": "graph loop (tf.while_loop)",
                 batched_graph: "tf.function", batched_xla: batched_graph}
    ladder, lc = race(LADDER, timers, baselines, lambda m, _: {
        "us_per_sample": m.median_per_item_s * 1e6, "samples_per_call": m.items_per_call, **timing_ms(m)},
        "us_per_sample")

    # The compute limit: the model's FLOPs at the matmul speed measured now, on this machine -------
    peak = peak_matmul_flops_per_s()
    model_flops = flops(net)
    limit_us = model_flops / peak * 1e6
    rec.add(LADDER, "compute limit", {"us_per_sample": limit_us, "model_flops": model_flops,
                                      "matmul_gflops": peak / 1e9},
            primary="us_per_sample", lower_is_better=True)

    # The memory-bound case: element-wise ops, where fusion counts ---------------------------------
    c = tf.random.normal([args.chain_size])
    src, dst = c.numpy(), np.empty(args.chain_size, np.float32)

    def gelu(x):  # tanh GELU: 9 element-wise ops, each a full pass over memory unless fused
        return 0.5 * x * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    chain_bytes = 2 * 4 * args.chain_size  # the least any implementation moves: read x once, write once
    one_pass = tf.function(lambda x: x + 1.0)
    timers = [Timer(lambda: np.copyto(dst, src), name=NUMPY_COPY),
              Timer(lambda: one_pass(c), name=ONE_PASS),
              Timer(lambda: gelu(c), name="GELU chain, eager"),
              Timer(tf.function(lambda: gelu(c)), name="GELU chain, tf.function")]
    # XLA: fuse the nine element-wise ops into one loop
    timers.append(Timer(tf.function(lambda: gelu(c), jit_compile=True), name="GELU chain, XLA"))
    chains, cc = race(FUSION, timers, {ONE_PASS: NUMPY_COPY, "GELU chain, tf.function": "GELU chain, eager",
                                          "GELU chain, XLA": "GELU chain, tf.function"}, lambda m, found: {
        "ms_per_call": m.median_s * 1e3, "effective_gb_per_s": chain_bytes / m.median_s / 1e9,
        "memory_passes": m.median_s / found[ONE_PASS].median_s, "p90_ms": m.p90_s * 1e3}, "ms_per_call")

    return {"ladder": ladder, "lc": lc, "chains": chains, "cc": cc, "limit_us": limit_us, "peak": peak,
            "model_flops": model_flops, "chain_bytes": chain_bytes}


def conclude(args, rec, found) -> Conclusion:
    # Results --------------------------------------------------------------------------------------
    ladder, lc, chains, cc = found["ladder"], found["lc"], found["chains"], found["cc"]
    batched_xla = f"batched XLA ({args.batch_size} rows)"
    limit_us, peak, model_flops, chain_bytes = found["limit_us"], found["peak"], found["model_flops"], found["chain_bytes"]
    us = {row: m.median_per_item_s * 1e6 for row, m in ladder.items()}
    best = min(us, key=us.get)
    bandwidth = {row: chain_bytes / m.median_s / 1e9 for row, m in chains.items()}
    lines = [f"best rung: {best}, {us[best]:.2f} us/sample = {us[best] / limit_us:.2f}x the compute limit "
             f"({limit_us:.2f} us: {model_flops:,} FLOPs at {peak / 1e9:.1f} GFLOP/s)",
             f"one memory pass: {bandwidth[ONE_PASS]:.1f} GB/s = {bandwidth[ONE_PASS] / bandwidth[NUMPY_COPY]:.2f}x "
             f"a NumPy copy ({bandwidth[NUMPY_COPY]:.1f} GB/s)"]

    # Conclusion, from this run's numbers -----------------------------------------------------------
    xla_says = {"a batch-1 call": lc["XLA jit_compile"], "the large batch": lc[batched_xla],
                "the element-wise chain": cc["GELU chain, XLA"]}
    helps = [w for w, c in xla_says.items() if c.verdict == "faster"]
    hurts = [w for w, c in xla_says.items() if c.verdict == "slower"]
    same = [w for w, c in xla_says.items() if c.verdict == "no measurable difference"]
    passes = {row: chains[row].median_s / chains[ONE_PASS].median_s for row in chains}
    conclusion = (
        f"At batch 1, tf.function against eager: {lc['tf.function'].describe()}; a concrete function against "
        f"tf.function: {lc['concrete function'].describe()}. The model's arithmetic is {limit_us:.1f} us, the "
        f"rest is overhead. Moving the loop into the graph, per pass against a tf.function call each: "
        f"{lc['graph loop (tf.while_loop)'].describe()}; XLA's loop against the graph loop: "
        f"{lc['XLA loop (tf.while_loop)'].describe()}. Batching is what reaches the hardware: the best rung, "
        f"{best}, is {us[best] / limit_us:.2f}x the compute limit. XLA against tf.function: "
        f"{lc['XLA jit_compile'].describe()} at batch 1, {lc[batched_xla].describe()} on the large batch, "
        f"{cc['GELU chain, XLA'].describe()} on the memory-bound GELU chain, which it runs in "
        f"{passes['GELU chain, XLA']:.1f} memory passes against {passes['GELU chain, tf.function']:.1f} unfused "
        f"(one pass reaches {bandwidth[ONE_PASS] / bandwidth[NUMPY_COPY]:.2f}x a NumPy copy's bandwidth). "
        f"On this machine XLA {said(helps, hurts, same)}: it pays where fusing "
        f"ops saves memory passes or dispatches, not where one big matmul already runs at the library's speed."
    )
    return Conclusion(conclusion, lines)


RECIPE = Recipe(name="hybridize", doc=__doc__, order=10, measure=measure, conclude=conclude, add_flags=add_flags,
                uses=("steps", "warmup", "batch_size"),
                sizes={"warmup": (20, 5), "batch_size": (4096, 2048), "loop_iters": (1000, 200),
                       "chain_size": (1 << 24, 1 << 22), "min_time": (2.0, 0.6)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
