"""Serving runtimes side by side: Keras, the SavedModel signature, LiteRT and ONNX Runtime on one model.

Train a model, convert it for each runtime, and measure what serving it costs in each: cold start,
batch-1 latency, throughput by batch size and threads, file size, agreement with Keras and accuracy.

Run:   python recipes/serving_runtimes.py --quick        (about three minutes on 2 CPU cores)
Needs: TensorFlow 2.21, ai-edge-litert, tf2onnx and onnxruntime (all installed by `make install`).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from tfperf import flags
from tfperf.devices import usable_cores
from tfperf.measure import Measurement, Timer, fresh_processes, interleave, versus
from tfperf.measure.processes import reply, run_child
from tfperf.measure.stats import FASTER, NO_DIFFERENCE, SLOWER, Comparison
from tfperf.precision import cpu_int8_support
from tfperf.recipe import Conclusion, Headline, Recipe

# The technique: one trained Keras model, converted for each runtime, and each runtime's own calls -------
# At batch 1, the shape of most online requests, the runtime is a lever: TensorFlow runs a reloaded
# signature through its general executor (op dispatch, a thread pool, tensors handed between them);
# Keras adds its own layers of Python, and `model.predict()` on one row sets up a whole data pipeline.
# LiteRT's interpreter and ONNX Runtime run the same graph, converted, as a fixed plan of kernels.


def convert(model, work: Path, calibration: np.ndarray) -> dict[str, Path]:
    """The trained model as each runtime's file, with the converters' own calls. `tfperf export` makes the same
    files (tfperf.deploy.converters: ops a converter lacks named in one line, a faster tf2onnx path); a test
    checks that the two answer alike."""
    import tensorflow as tf
    import tf2onnx

    files = {"SavedModel signature": work / "savedmodel"}
    # SavedModel: Keras 3's model.export writes the `serve` endpoint TF Serving runs, for any batch size.
    model.export(str(files["SavedModel signature"]), verbose=False)
    for runtime, quantize in (("LiteRT float32", None), ("LiteRT dynamic-range int8", "dynamic"), ("LiteRT int8", "int8")):
        # LiteRT: convert the SavedModel (given a Keras 3 model's function directly, the converter would not
        # freeze its variables).
        converter = tf.lite.TFLiteConverter.from_saved_model(str(files["SavedModel signature"]))
        if quantize:
            # Quantization: int8 weights, computed with float activations (dynamic range) ...
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if quantize == "int8":
            # ... or int8 activations too, their ranges calibrated on real inputs; inputs and outputs stay float32.
            converter.representative_dataset = lambda: ([row[None]] for row in calibration)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        files[runtime] = work / f"{quantize or 'float32'}.tflite"
        files[runtime].write_bytes(converter.convert())
    # ONNX: tf2onnx converts a tf.function with an input signature; a None batch axis takes any batch size.
    spec = tf.TensorSpec((None, *model.input_shape[1:]), tf.float32, name="inputs")
    proto, _ = tf2onnx.convert.from_function(tf.function(lambda inputs: model(inputs, training=False)),
                                             input_signature=[spec], opset=17)
    files["ONNX Runtime"] = work / "model.onnx"
    files["ONNX Runtime"].write_bytes(proto.SerializeToString())
    return files


def serve(runtime: str, path: Path, threads: int):
    """A runtime's file loaded in that runtime: a function of a float32 batch that returns the logits."""
    if runtime == "SavedModel signature":
        import tensorflow as tf

        # TensorFlow: the SavedModel loads without any of the model's Python code; `serve` never retraces.
        loaded = tf.saved_model.load(str(path))
        return lambda x: loaded.serve(x)  # the closure keeps `loaded`, which owns the variables
    if runtime.startswith("LiteRT"):
        from ai_edge_litert.interpreter import Interpreter

        # LiteRT: an interpreter with its own thread count runs the flatbuffer through its signature.
        runner = Interpreter(model_path=str(path), num_threads=threads).get_signature_runner()
        name = next(iter(runner.get_input_details()))
        return lambda x: next(iter(runner(**{name: x}).values()))
    import onnxruntime as ort

    # ONNX Runtime: a session on the CPU execution provider, with its intra-op threads set.
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"inputs": x})[0]


# What a serving host does after a restart, in a fresh interpreter: import the runtime, load, answer once.
# No TensorFlow is imported for LiteRT or ONNX Runtime.
COLD_START = """
import json, sys, time
import numpy as np
from tfperf.measure.processes import reply
kind, path, shape = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
x = np.zeros([1, *shape], np.float32)
t0 = time.perf_counter()
if kind.startswith("keras"):
    import keras
    t1 = time.perf_counter()
    model = keras.saving.load_model(path)
    t2 = time.perf_counter()
    model.predict(x, verbose=0) if kind == "keras-predict" else model(x)
elif kind == "savedmodel":
    import tensorflow as tf
    t1 = time.perf_counter()
    loaded = tf.saved_model.load(path)
    t2 = time.perf_counter()
    loaded.serve(x)
elif kind == "litert":
    from ai_edge_litert.interpreter import Interpreter
    t1 = time.perf_counter()
    runner = Interpreter(model_path=path).get_signature_runner()
    t2 = time.perf_counter()
    runner(**{next(iter(runner.get_input_details())): x})
else:
    import onnxruntime as ort
    t1 = time.perf_counter()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    t2 = time.perf_counter()
    session.run(None, {"inputs": x})
t3 = time.perf_counter()
print(reply({"import_s": t1 - t0, "load_s": t2 - t1, "first_call_s": t3 - t2}))
"""

# Measuring -------------------------------------------------------------------------------------------
# All seven ways of serving one set of weights are measured in the same interleaved rounds, each thread
# setting in a process of its own (TensorFlow fixes its thread pools when it starts), and checked against
# Keras' own outputs and accuracy.

COLD, LATENCY, THROUGHPUT, QUALITY = ("cold start in a fresh process: import, load, first call",
                                      "batch-1 latency", "throughput by batch size and threads",
                                      "files, agreement with Keras, test accuracy")
RUNTIMES = ("Keras predict()", "Keras __call__", "SavedModel signature", "LiteRT float32",
            "LiteRT dynamic-range int8", "LiteRT int8", "ONNX Runtime")
BASELINE = "SavedModel signature"
FLOAT_TOLERANCE = 1e-4  # float32 runtimes must answer as Keras does, within this
SPEEDUP_GOAL, INT8_ACCURACY_GOAL = 20.0, 0.01


@dataclasses.dataclass(frozen=True)
class Found:
    threads: list[int]  # thread settings timed
    speedup: dict[tuple[str, int], Comparison | None]  # (runtime, threads) -> batch-1 latency against the signature
    accuracy: dict[str, float]
    timed: dict[int, dict[int, dict[str, Measurement]]]  # threads -> batch -> runtime -> Measurement
    cold: dict[str, float]  # median seconds from a fresh process to the first answer
    cold_import: dict[str, float]  # of which importing the runtime


def cold_kind(runtime: str) -> str:
    """How COLD_START loads a runtime."""
    return {"Keras predict()": "keras-predict", "Keras __call__": "keras-call", "SavedModel signature": "savedmodel",
            "ONNX Runtime": "onnx"}.get(runtime, "litert")


def served(work: Path, files: dict, threads: int) -> dict:
    """Every runtime as a function of a NumPy batch (LiteRT and ONNX Runtime with `threads` threads)."""
    import keras

    model = keras.saving.load_model(work / "model.keras")
    found = {"Keras predict()": lambda x: model.predict(x, verbose=0), "Keras __call__": lambda x: model(x, training=False)}
    # A SavedModel runs on TensorFlow's pools, which this process sized when it started.
    found.update({runtime: serve(runtime, Path(path), threads) for runtime, path in files.items()})
    return found


def time_runtimes(work: Path, files: dict, threads: int, batches: list, min_time_s: float, seed: int) -> dict:
    """In a process whose TensorFlow uses `threads` threads: every runtime at every batch size, the runtimes
    of one batch size in the same interleaved rounds; their Measurements as dicts, by batch size."""
    runtimes = served(work, files, threads)
    rows = np.load(work / "x_test.npy")
    found = {}
    for batch in batches:
        x = np.resize(rows, (batch, *rows.shape[1:])).astype(np.float32)
        timers = [Timer(lambda f=f: f(x), name=runtime, items_per_call=batch) for runtime, f in runtimes.items()]
        found[batch] = [dataclasses.asdict(m) for m in interleave(timers, min_time_s=min_time_s, seed=seed)]
    return found


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--train-steps", type=flags.positive_int, help="training steps before converting")
    p.add_argument("--batches", type=flags.positive_int, nargs="+", help="batch sizes of the throughput table")
    p.add_argument("--cold-runs", type=flags.positive_int, help="fresh processes per runtime for the cold start")
    p.add_argument("--min-time", type=flags.positive_float, help="seconds each runtime is timed per batch size")
    # Internal: timing runs in its own process per thread setting.
    p.add_argument("--role", choices=["time"], help=argparse.SUPPRESS)
    p.add_argument("--threads", type=flags.positive_int, help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)


def task(args) -> int:
    """Time every runtime with --threads threads (TensorFlow's pools are sized before its first op)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1 if args.threads == 1 else 0)
    work = Path(args.work)
    files = json.loads((work / "files.json").read_text())
    print(reply(time_runtimes(work, files, args.threads, [1, *args.batches], args.min_time, args.seed)))
    return 0


def measure(args, rec) -> Found:
    import keras

    from tfperf.data import load_arrays
    from tfperf.models import get_net
    from tfperf.train import train

    keras.utils.set_random_seed(args.seed)
    data = load_arrays(args.dataset, seed=args.seed)
    model = get_net(args.model, input_shape=data.input_shape, num_classes=data.num_classes)
    train(model, data, steps=args.train_steps, batch_size=64, seed=args.seed)
    cores = usable_cores()
    threads = sorted({1, cores})
    x_test, y_test = data.x_test.astype(np.float32), data.y_test
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model.save(work / "model.keras")
        np.save(work / "x_test.npy", x_test[:256])
        files = convert(model, work, data.x_train[:256].astype(np.float32))  # int8 calibrates on training rows
        (work / "files.json").write_text(json.dumps({r: str(p) for r, p in files.items()}))

        # Keras' own answers; every runtime's outputs and accuracy against them ------------------------
        softmax = lambda logits: np.exp(logits - logits.max(-1, keepdims=True)) / np.exp(  # noqa: E731
            logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)
        runtimes = served(work, files, cores)
        probs = {r: np.concatenate([softmax(np.asarray(f(x_test[i:i + 256]))) for i in range(0, len(x_test), 256)])
                 for r, f in runtimes.items()}
        keras_probs = probs["Keras __call__"]
        size = {r: sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file()) if Path(p).is_dir()
                else Path(p).stat().st_size for r, p in files.items()}
        size["Keras predict()"] = size["Keras __call__"] = (work / "model.keras").stat().st_size
        accuracy = {runtime: float(np.mean(p.argmax(-1) == y_test)) for runtime, p in probs.items()}
        for runtime in RUNTIMES:
            rec.add(QUALITY, runtime, {
                "file_bytes": size[runtime], "max_abs_difference": float(np.abs(probs[runtime] - keras_probs).max()),
                "test_accuracy": accuracy[runtime], "accuracy_change": accuracy[runtime] - accuracy["Keras __call__"]},
                primary="test_accuracy", lower_is_better=False, versus_first=False)

        # Latency and throughput: one process per thread setting, all runtimes in the same rounds ---
        timed = {}
        for n in threads:
            found = run_child([sys.executable, __file__, "--role", "time", "--threads", n, "--work", work,
                               "--batches", *args.batches, "--min-time", args.min_time, "--seed", args.seed],
                              who=f"timing with {n} thread(s)")
            timed[n] = {int(b): {m["name"]: Measurement(**{**m, "samples_s": tuple(m["samples_s"])}) for m in ms}
                        for b, ms in found.items()}
            # Each measurement takes its row's name: a compared row names the row it is compared with.
            for batch, ms in timed[n].items():
                where = f"batch {batch}, " * (batch > 1) + f"{n} thread{'s' * (n > 1)}"
                timed[n][batch] = {r: dataclasses.replace(m, name=f"{r}, {where}") for r, m in ms.items()}
        speedup = {}
        for n in threads:
            for batch, ms in timed[n].items():
                for runtime, m in ms.items():
                    vs = versus(ms[BASELINE], m) if runtime != BASELINE else None
                    if batch == 1:
                        speedup[runtime, n] = vs
                        rec.add(LATENCY, m.name, {"p50_us": m.median_s * 1e6, "p99_us": m.p99_s * 1e6},
                                primary="p50_us", lower_is_better=True, measurement=m, comparison=vs)
                    else:
                        rec.add(THROUGHPUT, m.name, {"samples_per_s": m.items_per_s, "ms_per_batch": m.median_s * 1e3},
                                primary="samples_per_s", lower_is_better=False, measurement=m, comparison=vs)

        # Cold start: fresh processes, the runtimes taking turns run after run ----------------------
        shape = json.dumps(list(data.input_shape))
        cold = {r: {} for r in RUNTIMES}
        for _ in range(args.cold_runs):
            for runtime in RUNTIMES:
                path = files.get(runtime, work / "model.keras")
                for name, m in fresh_processes([sys.executable, "-c", COLD_START, cold_kind(runtime), path, shape],
                                               1).items():
                    cold[runtime].setdefault(name, []).extend(m.samples_s)
        for runtime, parts in cold.items():
            total = Measurement(f"{runtime}: cold start", tuple(np.sum([parts[k] for k in parts], axis=0)))
            rec.add(COLD, runtime, {"seconds": total.median_s, **{k: float(np.median(v)) for k, v in parts.items()}},
                    primary="seconds", lower_is_better=True, measurement=total, versus_first=False)

    return Found(threads, speedup, accuracy, timed,
                 cold={r: float(np.median(np.sum([p[k] for k in p], axis=0))) for r, p in cold.items()},
                 cold_import={r: float(np.median(p["import_s"])) for r, p in cold.items()})


def overhead_words(alone, batched) -> str:
    """What a call of one row costs beyond one row's share of a batch, in words: a figure where the medians'
    95% intervals resolve it, else the bound the measurement gives."""
    rows = batched.items_per_call
    low = alone.ci95_s[0] - batched.ci95_s[1] / rows
    high = alone.ci95_s[1] - batched.ci95_s[0] / rows
    if low > 0:
        return f"{(alone.median_s - batched.median_per_item_s) * 1e6:.0f} us"
    return f"no overhead this measurement resolves (at most {max(high, 0) * 1e6:.0f} us)"


def conclude(args, rec, found: Found) -> Conclusion:
    threads, speedup, accuracy, timed, cold = found.threads, found.speedup, found.accuracy, found.timed, found.cold
    quality = {r["row"]: r["metrics"] for r in rec.table(QUALITY)}
    one = threads[0]  # batch-1 serving: one thread per request, as a server with a worker per core runs it
    latency = {r: ms for r, ms in timed[one][1].items()}
    best = min((r for r in RUNTIMES if r != BASELINE), key=lambda r: latency[r].median_s)
    best_vs = speedup[best, one]
    float_runtimes = ["SavedModel signature", "LiteRT float32", "ONNX Runtime"]
    worst_float = max(quality[r]["max_abs_difference"] for r in float_runtimes)
    int8_change = accuracy["LiteRT int8"] - accuracy["LiteRT float32"]
    # A goal is met when the whole CI clears it, missed when the whole CI falls short, open otherwise.
    goal = ("met" if best_vs.ci95[0] >= SPEEDUP_GOAL else "NOT met" if best_vs.ci95[1] < SPEEDUP_GOAL
            else "not settled by this run (its CI spans the goal)")
    lines = [
        f"best batch-1 runtime: {best}, {best_vs.ratio:.1f}x faster than the SavedModel signature "
        f"(95% CI {best_vs.ci95[0]:.1f}-{best_vs.ci95[1]:.1f}x, {one} thread)",
        f"goal: at least {SPEEDUP_GOAL:.0f}x: {goal}; "
        f"float32 outputs within {FLOAT_TOLERANCE:g} of Keras: largest difference {worst_float:.1e}",
        f"int8 LiteRT accuracy {accuracy['LiteRT int8']:.4f} against float32 {accuracy['LiteRT float32']:.4f} "
        f"({int8_change * 100:+.1f} points; goal within {INT8_ACCURACY_GOAL * 100:.0f}: "
        f"{'met' if abs(int8_change) <= INT8_ACCURACY_GOAL else 'NOT met'})",
    ]

    big = max(timed[one])
    # Per-call overhead: what a batch-1 call costs beyond one row's share of a large batch, said as a figure only
    # where the two medians' intervals resolve it (a difference inside them reads "-0 us" otherwise).
    overhead = {r: overhead_words(latency[r], timed[one][big][r]) for r in RUNTIMES}
    per_row = {r: timed[one][big][r].median_per_item_s for r in RUNTIMES}
    kernels = versus(timed[one][big][BASELINE], timed[one][big]["LiteRT float32"])
    int8_vs_float = versus(timed[one][big]["LiteRT float32"], timed[one][big]["LiteRT int8"])
    trap = versus(latency["Keras __call__"], latency["Keras predict()"])
    # int8 pays where the CPU multiplies int8 in one instruction; elsewhere (de)quantizing around
    # emulated dot products can cost more than the smaller weights save.
    int8_reason = {FASTER: ": smaller weights and int8 arithmetic pay off here",
                   SLOWER: ": without fast int8 dot products the quantized kernels lose to XNNPACK's float32 ones"
                   if cpu_int8_support().startswith("no ") else
                   ": the (de)quantization around each layer costs more than int8 arithmetic saves at this size",
                   NO_DIFFERENCE: ""}[int8_vs_float.verdict]
    all_threads = threads[-1]
    scaling = {r: timed[all_threads][big][r].items_per_s / timed[one][big][r].items_per_s for r in RUNTIMES}
    text = (
        f"At batch 1 with {one} thread, {best} answers in {latency[best].median_s * 1e6:.0f} us against "
        f"{latency[BASELINE].median_s * 1e6:.0f} us for the reloaded SavedModel signature: "
        f"{best_vs.describe()}. Most of that gap is per-call work, not arithmetic: beyond one row's share of a "
        f"batch of {big}, a call costs the SavedModel signature {overhead[BASELINE]} (TensorFlow's "
        f"executor: dispatch, the thread pool, tensor handles), LiteRT float32 {overhead['LiteRT float32']} "
        f"and ONNX Runtime {overhead['ONNX Runtime']}, which run a fixed plan of kernels. "
        f"Per row at batch {big}, where overhead is spread thin, LiteRT float32 against the signature is "
        f"{kernels.describe()} ({per_row['LiteRT float32'] * 1e6:.1f} against {per_row[BASELINE] * 1e6:.1f} us "
        f"per row): what is left is the kernels (LiteRT's XNNPACK against TensorFlow's oneDNN/Eigen). "
        f"Quantizing to int8 shrinks the file from {quality['LiteRT float32']['file_bytes'] / 1e6:.2f} MB to "
        f"{quality['LiteRT int8']['file_bytes'] / 1e6:.2f} MB and changes test accuracy by {int8_change * 100:+.1f} "
        f"points; its speed against float32 at batch {big}: {int8_vs_float.describe()}, on a CPU with "
        f"{cpu_int8_support()}{int8_reason}. The trap users report is Keras `predict()` on one row: "
        f"{latency['Keras predict()'].median_s * 1e3:.1f} ms against {latency['Keras __call__'].median_s * 1e3:.2f} "
        f"ms for `model(x)` ({trap.describe()} for predict()), because predict() builds a data pipeline and "
        f"a step function around every call; serve with `model(x)` or, better, an exported runtime. "
        f"With {all_threads} threads at batch {big} the runtimes gain "
        f"{', '.join(f'{r} {s:.2f}x' for r, s in scaling.items() if not r.startswith('Keras'))} over one thread. A fresh process "
        f"answers its first request after {cold[best]:.2f} s with {best} and {cold[BASELINE]:.2f} s with the "
        f"SavedModel (medians of {args.cold_runs}), {found.cold_import[BASELINE]:.2f} s of which is importing "
        f"TensorFlow: a LiteRT or ONNX Runtime server needs no TensorFlow at all."
    )
    failure = "" if worst_float <= FLOAT_TOLERANCE else \
        f"a float32 export disagrees with Keras by {worst_float:.1e} (over {FLOAT_TOLERANCE:g})"
    return Conclusion(text, lines, failure,
                      Headline.compared(f"the best batch-1 runtime, {best}, against {BASELINE}", best_vs))


RECIPE = Recipe(name="serving_runtimes", doc=__doc__, order=145, measure=measure, conclude=conclude,
                add_flags=add_flags, task=task,
                sizes={"train_steps": (600, 200), "batches": ([8, 64, 256], [8, 64, 256]), "cold_runs": (10, 3),
                       "min_time": (2.0, 0.4)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
