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
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from tfperf import flags
from tfperf.bench import Benchmark, peak_matmul_flops_per_s, timing_ms
from tfperf.models import flops, get_net
from tfperf.report import markdown_table, write_conclusion
from tfperf.results import Recorder

LADDER, FUSION = "overhead ladder (MLP, batch 1)", "element-wise chain (memory-bound)"
ONE_PASS = "x + 1 (one memory pass)"


def verdict(ratio: float) -> str:
    """Words for a speedup ratio, with a 10% band for noise on a shared machine."""
    if ratio > 1.1:
        return f"{ratio:.2f}x faster"
    if ratio < 1 / 1.1:
        return f"{1 / ratio:.2f}x slower"
    return f"no faster ({ratio:.2f}x)"


def main(argv=None) -> None:
    # Setup ------------------------------------------------------------------------------------
    p = flags.parser(__doc__)
    p.add_argument("--loop-iters", type=flags.positive_int, help="forward passes inside one graph call")
    p.add_argument("--chain-size", type=flags.positive_int, help="elements in the element-wise chain")
    args = flags.parse(p, argv, sizes={"steps": (200, 30), "warmup": (20, 5), "batch_size": (4096, 2048),
                                       "loop_iters": (1000, 200), "chain_size": (1 << 24, 1 << 22)})
    tf.random.set_seed(args.seed)
    rec = Recorder("hybridize", vars(args))
    net = get_net("mlp")
    x = tf.random.normal([1, 512])

    def forward(x):
        return net(x, training=False)

    def measure(row, fn, items=1):
        r = Benchmark.run(fn, steps=args.steps, warmup=args.warmup, name=row, items_per_step=items,
                          profile_dir=args.profile)
        rec.add(LADDER, row, {"us_per_sample": r.median_per_item_s * 1e6, "samples_per_call": items,
                              **timing_ms(r)}, primary="us_per_sample", lower_is_better=True)

    # Baseline: eager, one op at a time through Python -------------------------------------------
    measure("eager", lambda: forward(x))

    # Graph: trace once, then run without Python --------------------------------------------------
    graph = tf.function(forward)  # tf.function: one trace, then the graph runs in C++
    measure("tf.function", lambda: graph(x))
    # tf.function: a concrete function skips the signature lookup that picks which trace to run
    concrete = graph.get_concrete_function(tf.TensorSpec(x.shape, x.dtype))
    measure("concrete function", lambda: concrete(x))
    xla = tf.function(forward, jit_compile=True)  # XLA: compile the graph into fused kernels
    measure("XLA jit_compile", lambda: xla(x))

    # Many iterations inside one call: the per-call overhead is paid once per loop -----------------
    def loop(x, n):
        def body(i, x):
            # The carried x depends on the output, so no compiler may hoist the pass out of the loop.
            return i + 1, x + 1e-6 * tf.reduce_mean(forward(x))

        return tf.while_loop(lambda i, _: i < n, body, (tf.constant(0), x))[1]

    n = tf.constant(args.loop_iters)
    graph_loop, xla_loop = tf.function(loop), tf.function(loop, jit_compile=True)
    measure("graph loop (tf.while_loop)", lambda: graph_loop(x, n), items=args.loop_iters)
    measure("XLA loop (tf.while_loop)", lambda: xla_loop(x, n), items=args.loop_iters)

    # One batched call: the matmuls get big enough to use the vector units and all cores -----------
    xb = tf.random.normal([args.batch_size, 512])
    measure(f"batched graph ({args.batch_size} rows)", lambda: graph(xb), items=args.batch_size)
    measure(f"batched XLA ({args.batch_size} rows)", lambda: xla(xb), items=args.batch_size)

    # The compute limit: the model's FLOPs at the matmul speed measured now, on this machine -------
    peak = peak_matmul_flops_per_s()
    model_flops = flops(net)
    limit_us = model_flops / peak * 1e6
    rec.add(LADDER, "compute limit", {"us_per_sample": limit_us, "model_flops": model_flops,
                                      "matmul_gflops": peak / 1e9},
            primary="us_per_sample", lower_is_better=True)

    # The memory-bound case: element-wise ops, where fusion counts ---------------------------------
    c = tf.random.normal([args.chain_size])

    def gelu(x):  # tanh GELU: 9 element-wise ops, each a full pass over memory unless fused
        return 0.5 * x * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    chain_bytes = 2 * 4 * args.chain_size  # the least any implementation moves: read x once, write once
    one_pass = tf.function(lambda x: x + 1.0)
    chains = [(ONE_PASS, one_pass), ("GELU chain, eager", gelu),
              ("GELU chain, tf.function", tf.function(gelu)),
              ("GELU chain, XLA", tf.function(gelu, jit_compile=True))]  # XLA: fuse 9 ops into one loop
    for row, fn in chains:
        r = Benchmark.run(lambda: fn(c), steps=args.steps, warmup=args.warmup, name=row,
                          profile_dir=args.profile)
        rec.add(FUSION, row, {"ms_per_call": r.median_s * 1e3, "effective_gb_per_s": chain_bytes / r.median_s / 1e9,
                              "p90_ms": r.p90_s * 1e3}, primary="ms_per_call", lower_is_better=True)

    # Results --------------------------------------------------------------------------------------
    rec.save(args.out)
    ladder, fusion = rec.table(LADDER), rec.table(FUSION)
    print(f"## {LADDER}\n\n{markdown_table(ladder)}\n\n## {FUSION}\n\n{markdown_table(fusion)}\n")
    us = {r["row"]: r["metrics"]["us_per_sample"] for r in ladder}
    ms = {r["row"]: r["metrics"]["ms_per_call"] for r in fusion}
    best = min((row for row in us if row != "compute limit"), key=us.get)
    print(f"best rung: {best}, {us[best]:.2f} us/sample = {us[best] / limit_us:.2f}x the compute limit "
          f"({limit_us:.2f} us: {model_flops:,} FLOPs at {peak / 1e9:.1f} GFLOP/s)")

    # Conclusion, from this run's numbers -----------------------------------------------------------
    batched_graph = next(row for row in us if row.startswith("batched graph"))
    batched_xla = next(row for row in us if row.startswith("batched XLA"))
    xla_small = us["tf.function"] / us["XLA jit_compile"]
    xla_batched = us[batched_graph] / us[batched_xla]
    xla_chain = ms["GELU chain, tf.function"] / ms["GELU chain, XLA"]
    helps = [w for w, r in (("a batch-1 call", xla_small), ("the large batch", xla_batched),
                            ("the element-wise chain", xla_chain)) if r > 1.1]
    not_helps = [w for w, r in (("a batch-1 call", xla_small), ("the large batch", xla_batched),
                                ("the element-wise chain", xla_chain)) if r <= 1.1]
    conclusion = (
        f"At batch 1, tf.function is {verdict(us['eager'] / us['tf.function'])} than eager, and a concrete "
        f"function {verdict(us['eager'] / us['concrete function'])}: the model's arithmetic is "
        f"{limit_us:.1f} us, the rest is overhead. Moving the loop into the graph makes a pass "
        f"{verdict(us['tf.function'] / us['graph loop (tf.while_loop)'])} (graph) and "
        f"{verdict(us['tf.function'] / us['XLA loop (tf.while_loop)'])} (XLA) than a tf.function call each. "
        f"Batching is what reaches the hardware: the best rung, {best}, is {us[best] / limit_us:.2f}x the "
        f"compute limit. XLA against tf.function: {verdict(xla_small)} at batch 1, {verdict(xla_batched)} on "
        f"the large batch, {verdict(xla_chain)} on the memory-bound GELU chain, which it runs in "
        f"{ms['GELU chain, XLA'] / ms[ONE_PASS]:.1f} memory passes against "
        f"{ms['GELU chain, tf.function'] / ms[ONE_PASS]:.1f} unfused. On this machine XLA helps "
        f"{', '.join(helps) or 'nothing measured here'} and does not help {', '.join(not_helps) or 'anything'}: "
        f"it pays where fusing ops saves memory passes or dispatches, not where one big matmul "
        f"already runs at the library's speed."
    )
    write_conclusion(args.out, "hybridize", conclusion)
    print(conclusion)


if __name__ == "__main__":
    main()
