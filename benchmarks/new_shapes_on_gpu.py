"""New shapes on a GPU, Keras 3 on JAX: what the first call at every new size costs, and what fixes it.

Run:   KERAS_BACKEND=jax python benchmarks/new_shapes_on_gpu.py            (a few minutes on one GPU)
       KERAS_BACKEND=jax python benchmarks/new_shapes_on_gpu.py --tiny     (the same code at toy sizes, CPU)
Needs: Keras 3 and JAX (a CUDA build for the GPU); no TensorFlow: tfperf.measure times JAX arrays by
       `block_until_ready`, so this runs where TensorFlow's CUDA build cannot be installed.

"Why is the first call slow every time the shape changes?" XLA compiles a program for each shape it sees: on
JAX every jitted function (predict()'s step, a `jax.jit` of the model) compiles again at every new batch size,
image size or sequence length, and even model(x) run eagerly compiles each of its operations at each new shape.
`tfperf doctor --shapes` answers it for TensorFlow; this is the same question where TensorFlow cannot run: each
way of calling the model (predict(); model(x) eagerly; `jax.jit` of `model.stateless_call`, as a JAX server
does) is called at sizes it has not seen, along each free axis (the batch; an image's height and width; a
sequence's length). Per way: the first call at each new size with the traces and XLA compiles it caused, read
from JAX's own monitoring events (not guessed from times), then its steady time at those sizes. Beside them the
two fixes: padding to two bucket sizes (one compile per bucket; the padded answers, cut back, checked against
the unpadded ones: zeros change what a convolution averages, not what a masked Transformer computes), and JAX's
persistent compilation cache, which turns the compiles of a fresh process (a restarted server) into reads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfperf.measure import Timer, sync  # noqa: E402

TRACE = "/jax/core/compile/jaxpr_trace_duration"
COMPILE = "/jax/core/compile/backend_compile_duration"  # every compile, those read from the persistent cache too
CACHE_HIT = "/jax/compilation_cache/cache_hits"
EVENTS: Counter = Counter()
jax.monitoring.register_event_duration_secs_listener(lambda event, _seconds, **_: EVENTS.update([event]))
jax.monitoring.register_event_listener(lambda event, **_: EVENTS.update([event]))

VOCAB = 1000
PREDICT, EAGER, JIT, BUCKETS = ("predict()", "model(x), eager", "jax.jit(model.stateless_call)",
                                "jax.jit, padded to 2 buckets")


def conv_net(tiny: bool) -> keras.Model:
    """ResNet50 (weights=None) with a free height and width; a small convolution stack with --tiny."""
    if not tiny:
        # Keras Applications fix the input's size when they include their top: the net pooled, then a head.
        base = keras.applications.ResNet50(include_top=False, weights=None, input_shape=(None, None, 3),
                                           pooling="avg")
        return keras.Model(base.input, keras.layers.Dense(10)(base.output), name="resnet50")
    inputs = keras.Input((None, None, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, outputs, name="small_cnn")


def encoder(tiny: bool) -> keras.Model:
    """A Transformer encoder with a free length whose padding token (0) is masked: padding changes no answer."""
    width, heads, layers = (32, 2, 1) if tiny else (256, 4, 4)
    tokens = keras.Input((None,), dtype="int32")
    # The mask passed by hand: each attention attends to real tokens only, and the pooling averages them alone.
    # (Implicit masks from Embedding(mask_zero=True) did not reach the second block's attention here.)
    real = keras.ops.not_equal(tokens, 0)
    x = keras.layers.Embedding(VOCAB, width)(tokens)
    for _ in range(layers):
        attended = keras.layers.MultiHeadAttention(heads, width // heads)(
            x, x, attention_mask=keras.ops.expand_dims(real, 1))
        x = keras.layers.LayerNormalization()(x + attended)
        widened = keras.layers.Dense(4 * width, activation="gelu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(width)(widened))
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x, mask=real))
    return keras.Model(tokens, outputs, name="encoder")


Case = tuple[str, Callable[[], keras.Model], str, int, list[int], Callable[[int], np.ndarray]]


def cases(tiny: bool, new_sizes: int) -> list[Case]:
    """(label, builder, axis, seen size, new sizes, inputs at a size) for each model and free axis."""
    rng = np.random.default_rng(0)
    side, batch, length = (32, 4, 16) if tiny else (224, 8, 128)
    images = lambda b, s: rng.random((b, s, s, 3), dtype=np.float32)  # noqa: E731
    # Tokens never 0 (the padding id): the unpadded answer is the model's on real tokens.
    sentences = lambda b, n: rng.integers(1, VOCAB, (b, n)).astype(np.int32)  # noqa: E731
    image_sizes = [side + 4 * (i + 1) if tiny else side - 64 + 16 * i for i in range(new_sizes)]
    conv = "ResNet50" if not tiny else "small CNN"
    return [
        (conv, lambda: conv_net(tiny), "batch", batch, [batch + 1 + i for i in range(new_sizes)],
         lambda b: images(b, side)),
        (conv, lambda: conv_net(tiny), "height and width", side, image_sizes, lambda s: images(batch, s)),
        ("Transformer encoder", lambda: encoder(tiny), "length", length,
         [length + (length // 4) * (i + 1) - 3 for i in range(new_sizes)], lambda n: sentences(batch, n)),
    ]


def pad_to(x: np.ndarray, axis: str, size: int) -> np.ndarray:
    """`x` padded with zeros up to `size` on the axis that varies (the rows; height and width; the length)."""
    widths = [(0, 0)] * x.ndim
    for dim in {"batch": (0,), "height and width": (1, 2), "length": (1,)}[axis]:
        widths[dim] = (0, size - x.shape[dim])
    return np.pad(x, widths)


def ways(model: keras.Model, axis: str, seen: int, buckets: list[int]) -> dict[str, Callable[[np.ndarray], Any]]:
    """Each way of calling the model, as a function of the inputs that returns its answer (on the device)."""
    # Copies: predict() donates the variables' buffers to its own step, which would delete these under the rest.
    trainable = [jax.numpy.array(v.value, copy=True) for v in model.trainable_variables]
    frozen = [jax.numpy.array(v.value, copy=True) for v in model.non_trainable_variables]

    # What a JAX server writes: the model's pure function, jitted once; XLA still compiles it per input shape.
    serve = jax.jit(lambda t, f, x: model.stateless_call(t, f, x, training=False)[0])
    # The same function for the buckets, jitted apart: its compiles are its own, not the plain way's.
    serve_buckets = jax.jit(lambda t, f, x: model.stateless_call(t, f, x, training=False)[0])

    def padded(x: np.ndarray) -> np.ndarray:
        # Pad every new size up to the next bucket: XLA compiles once per bucket, not once per size.
        now = x.shape[0] if axis == "batch" else x.shape[1]
        # The size every way has seen stays unpadded: the buckets are for the new sizes.
        if now == seen or now in buckets or now > buckets[-1]:
            return serve_buckets(trainable, frozen, x)
        answer = serve_buckets(trainable, frozen, pad_to(x, axis, next(b for b in buckets if b >= now)))
        # Cut back on the host, where a server sends answers from: a slice on the device compiles per size too.
        return np.asarray(answer)[:x.shape[0]]

    return {PREDICT: lambda x: model.predict(x, batch_size=len(x), verbose=0),
            EAGER: lambda x: model(x, training=False),
            JIT: lambda x: serve(trainable, frozen, x),
            BUCKETS: padded}


def first_calls(fn: Callable, inputs: list[np.ndarray]) -> tuple[list[dict], list[np.ndarray]]:
    """Each input's first call: seconds, and the traces, XLA compiles and persistent-cache reads it caused; and
    the answers of those calls."""
    rows, answers = [], []
    for x in inputs:
        sync()
        before, started = Counter(EVENTS), time.perf_counter()
        answer = fn(x)
        sync(answer)
        seconds, after = time.perf_counter() - started, EVENTS
        rows.append({"s": seconds, "traces": after[TRACE] - before[TRACE],
                     "compiles": (after[COMPILE] - before[COMPILE]) - (after[CACHE_HIT] - before[CACHE_HIT]),
                     "cache_reads": after[CACHE_HIT] - before[CACHE_HIT]})
        answers.append(np.asarray(answer))
    return rows, answers


def steady_s(fn: Callable, inputs: list[np.ndarray]) -> float:
    """The median over the new sizes of each size's median call, once every size has been seen."""
    return float(np.median([Timer(lambda x=x: fn(x)).measure(min_time_s=0.1, min_samples=5, max_samples=50,
                                                           warmup=0).median_s for x in inputs]))


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference over the larger answer's scale."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), np.max(np.abs(b)), 1e-12))


def compare_ways(label: str, build: Callable, axis: str, seen: int, sizes: list[int], make: Callable) -> None:
    """One model and axis: every way's first calls at the new sizes and steady time, printed as a table."""
    keras.utils.set_random_seed(0)
    model = build()
    buckets = sorted({sizes[len(sizes) // 2 - 1], sizes[-1]})
    inputs = [make(s) for s in sizes]
    print(f"\n{label}, new {axis} ({', '.join(map(str, sizes))}; every way called at {seen} first; "
          f"buckets {', '.join(map(str, buckets))}):")
    print("| way | first call at each new size | traces | XLA compiles | then, a call | answers |")
    print("|---|---|---|---|---|---|")
    reference = None
    for name, fn in ways(model, axis, seen, buckets).items():
        sync(fn(make(seen)))  # the function exists and has run: what follows is the new sizes' cost alone
        rows, answers = first_calls(fn, inputs)
        reference = reference or answers  # predict()'s, the first way's
        firsts = [r["s"] for r in rows]
        worst = max(relative_difference(a, ref) for a, ref in zip(answers, reference))
        print(f"| {name} | {np.median(firsts):.2f} s median ({min(firsts):.2f}-{max(firsts):.2f} s), "
              f"{sum(firsts):.1f} s in all | {sum(r['traces'] for r in rows)} | "
              f"{sum(r['compiles'] for r in rows)} | "
              f"{steady_s(fn, inputs) * 1e3:.2f} ms | within {worst:.1e} of predict() |")


def cache_child(folder: str, tiny: bool, new_sizes: int) -> None:
    """In a fresh process: the jitted model's first call at the seen size and each new batch size, with JAX's
    persistent compilation cache in `folder`; prints one JSON line."""
    jax.config.update("jax_compilation_cache_dir", folder)
    # Cache every compile, however small or quick (the defaults skip those under a second).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    label, build, axis, seen, sizes, make = cases(tiny, new_sizes)[0]
    keras.utils.set_random_seed(0)
    started = time.perf_counter()
    serve = ways(build(), axis, seen, sizes)[JIT]
    rows, _ = first_calls(serve, [make(s) for s in [seen, *sizes]])
    print(json.dumps({"label": label, "build_s": time.perf_counter() - started, "rows": rows}))


def fresh_processes_with_cache(tiny: bool, new_sizes: int) -> None:
    """The same first calls in two fresh processes sharing a persistent cache: compiled, then read."""
    with tempfile.TemporaryDirectory() as folder:
        runs = []
        for _ in range(2):
            out = subprocess.run([sys.executable, __file__, "--cache-child", folder, *(["--tiny"] * tiny),
                                  "--new-sizes", str(new_sizes)], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        entries = len(os.listdir(folder))
    print(f"\n{runs[0]['label']}, jax.jit in a fresh process at {1 + new_sizes} batch sizes, with "
          f"jax_compilation_cache_dir ({entries} entries written):")
    print("| process | first call at each size | XLA compiles | read from the cache |")
    print("|---|---|---|---|")
    for name, run in zip(("first (empty cache)", "second (cache written by the first)"), runs):
        firsts = [r["s"] for r in run["rows"]]
        print(f"| {name} | {np.median(firsts):.2f} s median, {sum(firsts):.1f} s in all | "
              f"{sum(r['compiles'] for r in run['rows'])} | {sum(r['cache_reads'] for r in run['rows'])} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="toy sizes, to check the code on a CPU")
    parser.add_argument("--new-sizes", type=int, default=4, help="new sizes per axis")
    parser.add_argument("--no-cache", action="store_true",
                        help="skip the persistent cache's two fresh processes")
    parser.add_argument("--cache-child", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if keras.backend.backend() != "jax":
        print("This benchmark runs Keras 3 on JAX: set KERAS_BACKEND=jax.", file=sys.stderr)
        return 2
    if args.new_sizes < 2:
        print(f"--new-sizes must be at least 2 (two buckets), got {args.new_sizes}", file=sys.stderr)
        return 2
    if args.cache_child:
        cache_child(args.cache_child, args.tiny, args.new_sizes)
        return 0
    device = jax.devices()[0]
    print(f"Keras {keras.__version__} on JAX {jax.__version__}, {device.platform}: {device.device_kind}")
    for case in cases(args.tiny, args.new_sizes):
        compare_ways(*case)
    if not args.no_cache:
        fresh_processes_with_cache(args.tiny, args.new_sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
