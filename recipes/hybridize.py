"""Eager vs graph vs XLA: the overhead ladder.

How much of a small model's time is Python and dispatch, and what tf.function and XLA take away.

Run:   python recipes/hybridize.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21 and Keras 3; a CPU is enough, a GPU is used when present.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import sys

import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.measure import Timer, peak_matmul_flops_per_s, timing_ms
from tfperf.models import flops, get_net
from tfperf.recipe import Conclusion, Headline, Recipe
from tfperf.records.jsonl import Raced, race_table

# The technique: the same forward pass, each rung taking away a layer of per-call overhead -----------
# Eager runs each op as Python reaches it: every op pays for the interpreter and the op dispatcher.


def rungs(net):
    """The forward pass of `net` four ways, from eager to XLA."""
    def forward(x):
        return net(x, training=False)

    # tf.function: trace the Python once into a graph, which the runtime then executes without Python
    graph = tf.function(forward)
    # A concrete function skips the signature lookup that picks which trace to run
    concrete = graph.get_concrete_function(tf.TensorSpec([1, 512]))
    # XLA: compile the graph into fused kernels
    xla = tf.function(forward, jit_compile=True)
    return forward, graph, concrete, xla


def loop_in_graph(forward, n: int, *, jit_compile: bool = False):
    """n forward passes inside one graph call: the per-call overhead is paid once per loop, not per pass."""

    @tf.function(jit_compile=jit_compile)
    def loop(x):
        def body(i, x):
            # The carried x depends on the output, so no compiler may hoist the pass out of the loop.
            return i + 1, x + 1e-6 * tf.reduce_mean(forward(x))

        return tf.while_loop(lambda i, _: i < n, body, (tf.constant(0), x))[1]

    return loop


def gelu(x):
    """tanh GELU: nine element-wise ops, each a full pass over memory unless they are fused."""
    return 0.5 * x * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


# XLA: fuse the nine element-wise ops into one loop over memory (a memory-bound chain is where fusion pays)
fused_gelu = tf.function(gelu, jit_compile=True)

# Measuring -------------------------------------------------------------------------------------------
# Every alternative of a table is timed in the same interleaved rounds; a "faster" is a 95% interval of
# the ratio that excludes 1. The compute limit is the model's FLOPs at the matmul rate measured now; the
# yardstick of the element-wise chain is a copy, the least memory traffic any implementation needs, made on
# the device the chain runs on: NumPy's on a CPU, one inside GPU memory on a GPU (NumPy's would be the host's).

LADDER, FUSION = "overhead ladder (MLP, batch 1)", "element-wise chain (memory-bound)"
ONE_PASS, NUMPY_COPY, GPU_COPY = ("x + 1 (one memory pass)", "NumPy copy (the bandwidth yardstick)",
                                  "copy in GPU memory (the bandwidth yardstick)")
ROUNDS = 10


@dataclasses.dataclass(frozen=True)
class Found:
    ladder: Raced
    chains: Raced
    limit_us: float  # the model's arithmetic at the measured matmul rate, per sample
    peak_flops: float
    model_flops: int
    chain_bytes: int  # the least memory any chain implementation moves: read x once, write once
    batch: int
    yardstick: str  # the row of the copy the chain's bandwidth is read against


def copy_yardstick(c, gpu: bool):
    """The yardstick's row and its call: a copy of `c` where the chain runs (on a GPU, inside its memory)."""
    if gpu:
        deep_copy = tf.function(lambda x: tf.raw_ops.DeepCopy(x=x))  # tf.identity would copy nothing
        return GPU_COPY, lambda: deep_copy(c)
    src, dst = c.numpy(), np.empty(c.shape, c.dtype.as_numpy_dtype)
    return NUMPY_COPY, lambda: np.copyto(dst, src)


def add_flags(p) -> None:
    p.add_argument("--loop-iters", type=flags.positive_int, help="forward passes inside one graph call")
    p.add_argument("--chain-size", type=flags.positive_int, help="elements in the element-wise chain")
    p.add_argument("--min-time", type=flags.positive_float,
                   help="seconds of samples per alternative (when --steps is not given)")


def measure(args, rec) -> Found:
    tf.random.set_seed(args.seed)
    net = get_net("mlp")
    x, xb = tf.random.normal([1, 512]), tf.random.normal([args.batch_size, 512])
    forward, graph, concrete, xla = rungs(net)
    n = args.loop_iters
    graph_loop, xla_loop = loop_in_graph(forward, n), loop_in_graph(forward, n, jit_compile=True)
    batched_graph, batched_xla = f"batched graph ({args.batch_size} rows)", f"batched XLA ({args.batch_size} rows)"
    race = dict(rounds=ROUNDS, samples=args.steps, warmup=args.warmup, min_time_s=args.min_time, seed=args.seed,
                profile_dir=args.profile)

    ladder = race_table(rec, LADDER, [
        Timer(lambda: forward(x), name="eager"), Timer(lambda: graph(x), name="tf.function"),
        Timer(lambda: concrete(x), name="concrete function"), Timer(lambda: xla(x), name="XLA jit_compile"),
        Timer(lambda: graph_loop(x), name="graph loop (tf.while_loop)", items_per_call=n),
        Timer(lambda: xla_loop(x), name="XLA loop (tf.while_loop)", items_per_call=n),
        Timer(lambda: graph(xb), name=batched_graph, items_per_call=args.batch_size),
        Timer(lambda: xla(xb), name=batched_xla, items_per_call=args.batch_size)],
        against={"tf.function": "eager", "concrete function": "tf.function", "XLA jit_compile": "tf.function",
                 "graph loop (tf.while_loop)": "tf.function", "XLA loop (tf.while_loop)": "graph loop (tf.while_loop)",
                 batched_graph: "tf.function", batched_xla: batched_graph},
        metrics=lambda m, _: {"us_per_sample": m.median_per_item_s * 1e6, "samples_per_call": m.items_per_call,
                              **timing_ms(m)}, primary="us_per_sample", lower_is_better=True, **race)
    peak, model_flops = peak_matmul_flops_per_s(), flops(net)
    limit_us = model_flops / peak * 1e6
    rec.add(LADDER, "compute limit", {"us_per_sample": limit_us, "model_flops": model_flops,
                                      "matmul_gflops": peak / 1e9}, primary="us_per_sample", lower_is_better=True)

    c = tf.random.normal([args.chain_size])
    yardstick, copy = copy_yardstick(c, gpu=bool(tf.config.list_logical_devices("GPU")))
    one_pass, graph_gelu = tf.function(lambda x: x + 1.0), tf.function(gelu)
    chain_bytes = 2 * 4 * args.chain_size
    chains = race_table(rec, FUSION, [
        Timer(copy, name=yardstick), Timer(lambda: one_pass(c), name=ONE_PASS),
        Timer(lambda: gelu(c), name="GELU chain, eager"), Timer(lambda: graph_gelu(c), name="GELU chain, tf.function"),
        Timer(lambda: fused_gelu(c), name="GELU chain, XLA")],
        against={ONE_PASS: yardstick, "GELU chain, tf.function": "GELU chain, eager",
                 "GELU chain, XLA": "GELU chain, tf.function"},
        metrics=lambda m, found: {"ms_per_call": m.median_s * 1e3, "effective_gb_per_s": chain_bytes / m.median_s / 1e9,
                                  "memory_passes": m.median_s / found[ONE_PASS].median_s, "p90_ms": m.p90_s * 1e3},
        primary="ms_per_call", lower_is_better=True, **race)
    return Found(ladder, chains, limit_us, peak, model_flops, chain_bytes, args.batch_size, yardstick)


def said(helps: list[str], hurts: list[str], same: list[str]) -> str:
    """'helps a, b; makes c slower; makes no measurable difference to d', leaving out empty parts."""
    parts = [f"helps {' and '.join(helps)}" if helps else "",
             f"makes {' and '.join(hurts)} slower" if hurts else "",
             f"makes no measurable difference to {' and '.join(same)}" if same else ""]
    return "; ".join(p for p in parts if p)


def conclude(args, rec, found: Found) -> Conclusion:
    lc, cc = found.ladder.comparisons, found.chains.comparisons
    batched_xla = f"batched XLA ({found.batch} rows)"
    us = {row: m.median_per_item_s * 1e6 for row, m in found.ladder.measurements.items()}
    best = min(us, key=us.get)
    bandwidth = {row: found.chain_bytes / m.median_s / 1e9 for row, m in found.chains.measurements.items()}
    passes = {row: m.median_s / found.chains[ONE_PASS].median_s for row, m in found.chains.measurements.items()}
    limit_us, yardstick = found.limit_us, found.yardstick
    copy = "a NumPy copy" if yardstick == NUMPY_COPY else "a copy in GPU memory"
    lines = [f"best rung: {best}, {us[best]:.2f} us/sample = {us[best] / limit_us:.2f}x the compute limit "
             f"({limit_us:.2f} us: {found.model_flops:,} FLOPs at {found.peak_flops / 1e9:.1f} GFLOP/s)",
             f"one memory pass: {bandwidth[ONE_PASS]:.1f} GB/s = {bandwidth[ONE_PASS] / bandwidth[yardstick]:.2f}x "
             f"{copy} ({bandwidth[yardstick]:.1f} GB/s)"]
    xla_says = {"a batch-1 call": lc["XLA jit_compile"], "the large batch": lc[batched_xla],
                "the element-wise chain": cc["GELU chain, XLA"]}
    verdicts = {v: [w for w, c in xla_says.items() if c.verdict == v]
                for v in ("faster", "slower", "no measurable difference")}
    return Conclusion((
        f"At batch 1, tf.function against eager: {lc['tf.function'].describe()}; a concrete function against "
        f"tf.function: {lc['concrete function'].describe()}. The model's arithmetic is {limit_us:.1f} us, the "
        f"rest is overhead. Moving the loop into the graph, per pass against a tf.function call each: "
        f"{lc['graph loop (tf.while_loop)'].describe()}; XLA's loop against the graph loop: "
        f"{lc['XLA loop (tf.while_loop)'].describe()}. Batching is what reaches the hardware: the best rung, "
        f"{best}, is {us[best] / limit_us:.2f}x the compute limit. XLA against tf.function: "
        f"{lc['XLA jit_compile'].describe()} at batch 1, {lc[batched_xla].describe()} on the large batch, "
        f"{cc['GELU chain, XLA'].describe()} on the memory-bound GELU chain, which it runs in "
        f"{passes['GELU chain, XLA']:.1f} memory passes against {passes['GELU chain, tf.function']:.1f} unfused "
        f"(one pass reaches {bandwidth[ONE_PASS] / bandwidth[yardstick]:.2f}x {copy}'s bandwidth). "
        f"On this machine XLA {said(*verdicts.values())}: it pays where fusing ops saves memory passes or "
        f"dispatches, not where one big matmul already runs at the library's speed."), lines,
        headline=Headline.compared("tf.function against eager, one batch-1 call of an MLP", lc["tf.function"]))


RECIPE = Recipe(name="hybridize", doc=__doc__, order=10, measure=measure, conclude=conclude, add_flags=add_flags,
                uses=("steps", "warmup", "batch_size"),
                sizes={"warmup": (20, 5), "batch_size": (4096, 2048), "loop_iters": (1000, 200),
                       "chain_size": (1 << 24, 1 << 22), "min_time": (2.0, 0.6)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
