"""Serving runtimes side by side: Keras, the SavedModel signature, LiteRT and ONNX Runtime on one model.

Train a model, export it in every format tfperf writes, and measure what serving it costs in each
runtime: cold start, batch-1 latency, throughput by batch size and threads, file size, agreement with
Keras and test accuracy (quantized models too).

Run:   python recipes/serving_runtimes.py --quick        (about three minutes on 2 CPU cores)
Needs: TensorFlow 2.21, ai-edge-litert, tf2onnx and onnxruntime (all installed by `make install`).

Introduction
------------
saved_model.py shows that batching is the lever once a SavedModel is loaded. At batch 1, the shape of
most online requests, another lever is larger: the runtime. TensorFlow runs a reloaded signature
through its general executor (op dispatch, a thread pool, tensors handed between them); Keras adds its
own layers of Python on top, and `model.predict()` on one row sets up a whole data pipeline for it.
LiteRT's interpreter and ONNX Runtime run the same graph, converted, as a fixed plan of kernels with
little per-call work. Here all seven ways of serving one set of weights are measured in the same
interleaved rounds, each in one process per thread setting (TensorFlow fixes its thread pools when it
starts), and checked against Keras' own outputs and accuracy.
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
from tfperf.measure import Measurement, Timer, fresh_processes, interleave, versus
from tfperf.measure.processes import reply, run_child
from tfperf.devices import usable_cores
from tfperf.precision import cpu_int8_support
from tfperf.recipe import Conclusion, Recipe
from tfperf.measure.stats import FASTER, NO_DIFFERENCE, SLOWER

COLD, LATENCY, THROUGHPUT, QUALITY = ("cold start in a fresh process: import, load, first call",
                                      "batch-1 latency", "throughput by batch size and threads",
                                      "files, agreement with Keras, test accuracy")
# Each runtime: the export it serves (format, quantization), or None for the Keras model itself.
RUNTIMES = {
    "Keras predict()": None,
    "Keras __call__": None,
    "SavedModel signature": ("savedmodel", "none"),
    "LiteRT float32": ("litert", "none"),
    "LiteRT dynamic-range int8": ("litert", "dynamic"),
    "LiteRT int8": ("litert", "int8"),
    "ONNX Runtime": ("onnx", "none"),
}
BASELINE = "SavedModel signature"
FLOAT_TOLERANCE = 1e-4  # float32 exports must answer as Keras does, within this
SPEEDUP_GOAL, INT8_ACCURACY_GOAL = 20.0, 0.01

# What a serving host does after a restart, in a fresh interpreter: import the runtime, load, answer once.
# Only tfperf.deploy (NumPy and the runtime itself) is imported: no TensorFlow for LiteRT or ONNX Runtime.
COLD_START = """
import importlib, json, sys, time
import numpy as np
kind, path, shape = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
x = np.zeros([1, *shape], np.float32)
t0 = time.perf_counter()
runtime = importlib.import_module({"keras": "keras", "savedmodel": "tensorflow",
                                   "litert": "ai_edge_litert.interpreter", "onnx": "onnxruntime"}[kind.split("-")[0]])
from tfperf.deploy.layout import load
from tfperf.measure.processes import reply
t1 = time.perf_counter()
model = runtime.saving.load_model(path) if kind.startswith("keras") else load(path)
t2 = time.perf_counter()
model.predict(x, verbose=0) if kind == "keras-predict" else model(x) if kind.startswith("keras") else model({"inputs": x})
t3 = time.perf_counter()
print(reply({"import_s": t1 - t0, "load_s": t2 - t1, "first_call_s": t3 - t2}))
"""


def cold_kind(runtime: str) -> str:
    """How COLD_START loads a runtime."""
    fmt = RUNTIMES[runtime]
    return fmt[0] if fmt else ("keras-predict" if "predict" in runtime else "keras-call")


def load_runtimes(work: Path, paths: dict, threads: int) -> dict:
    """Every runtime as a function of a NumPy batch, LiteRT and ONNX Runtime with `threads` threads."""
    import keras

    from tfperf.deploy.layout import load

    model = keras.saving.load_model(work / "model.keras")
    served = {}
    for runtime, fmt in RUNTIMES.items():
        if fmt is None:
            served[runtime] = ((lambda x: model.predict(x, verbose=0)) if "predict" in runtime
                               else (lambda x: model(x, training=False)))
        else:
            # A SavedModel runs on TensorFlow's pools, which this process sized when it started.
            runner = load(paths[runtime], threads=None if fmt[0] == "savedmodel" else threads)
            served[runtime] = lambda x, runner=runner: runner({"inputs": x})
    return served


def time_runtimes(work: Path, paths: dict, threads: int, batches: list, min_time_s: float, seed: int) -> dict:
    """In a process whose TensorFlow uses `threads` threads: every runtime at every batch size, the runtimes
    of one batch size in the same interleaved rounds; their Measurements as dicts, by batch size."""
    served = load_runtimes(work, paths, threads)
    rows = np.load(work / "x_test.npy")
    found = {}
    for batch in batches:
        x = np.resize(rows, (batch, *rows.shape[1:])).astype(np.float32)
        timers = [Timer(lambda f=f: f(x), name=runtime, items_per_call=batch) for runtime, f in served.items()]
        found[batch] = [dataclasses.asdict(m) for m in interleave(timers, min_time_s=min_time_s, seed=seed)]
    return found


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--train-steps", type=flags.positive_int, help="training steps before exporting")
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
    paths = json.loads((work / "paths.json").read_text())
    print(reply(time_runtimes(work, paths, args.threads, [1, *args.batches], args.min_time, args.seed)))
    return 0


def measure(args, rec) -> dict:
    import keras

    from tfperf.data import load_arrays
    from tfperf.models import get_net
    from tfperf.deploy.layout import export_subject, load, predict
    from tfperf.deploy.loader import cookbook_subject
    from tfperf.train import train

    # Setup: one trained model, exported in every format ----------------------------------------
    keras.utils.set_random_seed(args.seed)
    data = load_arrays(args.dataset, seed=args.seed)
    model = get_net(args.model, input_shape=data.input_shape, num_classes=data.num_classes)
    trained = train(model, data, steps=args.train_steps, batch_size=64, seed=args.seed)
    cores = usable_cores()
    threads = sorted({1, cores})
    x_test, y_test = data.x_test.astype(np.float32), data.y_test
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model.save(work / "model.keras")
        np.save(work / "x_test.npy", x_test[:256])
        paths = {}
        for runtime, fmt in RUNTIMES.items():
            if fmt:
                # Deploy: one call per format; int8 calibrates its ranges on real training rows
                paths[runtime] = str(export_subject(
                    cookbook_subject(args.model, model=model), work / "exports", name=args.model, format=fmt[0],
                    quantize=fmt[1], sample={"inputs": x_test[:256]},
                    calibration=({"inputs": data.x_train[:256]}, "256 training rows")).path)
        (work / "paths.json").write_text(json.dumps(paths))

        # Baseline: Keras' own answers; every runtime's outputs and accuracy against them ----------
        keras_probs = np.concatenate([keras.ops.convert_to_numpy(keras.ops.softmax(model(x_test[i:i + 256])))
                                      for i in range(0, len(x_test), 256)])
        size = {runtime: sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file()) for runtime, p in paths.items()}
        size["Keras predict()"] = size["Keras __call__"] = (work / "model.keras").stat().st_size
        probs = {"Keras predict()": keras_probs, "Keras __call__": keras_probs}
        for runtime, path in paths.items():
            runner = load(path)
            probs[runtime] = np.concatenate([predict(runner, {"inputs": x_test[i:i + 256]})["probabilities"]
                                             for i in range(0, len(x_test), 256)])
        accuracy = {runtime: float(np.mean(p.argmax(-1) == y_test)) for runtime, p in probs.items()}
        for runtime, p in probs.items():
            rec.add(QUALITY, runtime, {
                "file_bytes": size[runtime], "max_abs_difference": float(np.abs(p - keras_probs).max()),
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
                path = paths.get(runtime, str(work / "model.keras"))
                for name, m in fresh_processes([sys.executable, "-c", COLD_START, cold_kind(runtime), path, shape],
                                               1).items():
                    cold[runtime].setdefault(name, []).extend(m.samples_s)
        for runtime, parts in cold.items():
            total = Measurement(f"{runtime}: cold start", tuple(np.sum([parts[k] for k in parts], axis=0)))
            rec.add(COLD, runtime, {"seconds": total.median_s, **{k: float(np.median(v)) for k, v in parts.items()}},
                    primary="seconds", lower_is_better=True, measurement=total, versus_first=False)

    return {"threads": threads, "speedup": speedup, "accuracy": accuracy, "trained": trained, "timed": timed,
            "cold": {r: float(np.median(np.sum([p[k] for k in p], axis=0))) for r, p in cold.items()},
            "cold_import": {r: float(np.median(p["import_s"])) for r, p in cold.items()}}


def conclude(args, rec, found) -> Conclusion:
    # Results ----------------------------------------------------------------------------------
    threads, speedup, accuracy, timed, cold = (found[k] for k in ("threads", "speedup", "accuracy", "timed", "cold"))
    quality = {r["row"]: r["metrics"] for r in rec.table(QUALITY)}
    one = threads[0]  # batch-1 serving: one thread per request, as a server with a worker per core runs it
    latency = {r: ms for r, ms in timed[one][1].items()}
    best = min((r for r in RUNTIMES if r != BASELINE), key=lambda r: latency[r].median_s)
    best_vs = speedup[best, one]
    float_runtimes = [r for r, fmt in RUNTIMES.items() if fmt and fmt[1] == "none"]
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

    # Conclusion, from this run's numbers -------------------------------------------------------
    big = max(timed[one])
    # Per-call overhead: what a batch-1 call costs beyond one row's share of a large batch.
    overhead = {r: latency[r].median_s - timed[one][big][r].median_per_item_s for r in RUNTIMES}
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
        f"batch of {big}, a call costs the SavedModel signature {overhead[BASELINE] * 1e6:.0f} us (TensorFlow's "
        f"executor: dispatch, the thread pool, tensor handles), LiteRT float32 {overhead['LiteRT float32'] * 1e6:.0f} "
        f"us and ONNX Runtime {overhead['ONNX Runtime'] * 1e6:.0f} us, which run a fixed plan of kernels. "
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
        f"{', '.join(f'{r} {s:.2f}x' for r, s in scaling.items() if RUNTIMES[r])} over one thread. A fresh process "
        f"answers its first request after {cold[best]:.2f} s with {best} and {cold[BASELINE]:.2f} s with the "
        f"SavedModel (medians of {args.cold_runs}), {found['cold_import'][BASELINE]:.2f} s of which is importing "
        f"TensorFlow: a LiteRT or ONNX Runtime server needs no TensorFlow at all."
    )
    failure = "" if worst_float <= FLOAT_TOLERANCE else \
        f"a float32 export disagrees with Keras by {worst_float:.1e} (over {FLOAT_TOLERANCE:g})"
    return Conclusion(text, lines, failure)


RECIPE = Recipe(name="serving_runtimes", doc=__doc__, order=145, measure=measure, conclude=conclude,
                add_flags=add_flags, task=task,
                sizes={"train_steps": (600, 200), "batches": ([8, 64, 256], [8, 64, 256]), "cold_runs": (10, 3),
                       "min_time": (2.0, 0.4)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
