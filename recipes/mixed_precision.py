"""Mixed precision: float32 vs mixed_float16 vs mixed_bfloat16, for speed, memory and the same answer.

Compute in 16 bits, keep the variables in 32: where the hardware has 16-bit units this halves memory
traffic and can multiply matmul throughput; where it does not, it only adds conversions.

Run:   python recipes/mixed_precision.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21 and Keras 3; mnist-5k works offline. A GPU with compute capability >= 7.0
       (float16) or >= 8.0 (bfloat16), or a CPU with AVX-512 BF16 / AMX, to see a speedup.

Introduction
------------
The seed used `tf.keras.mixed_precision.experimental`, which no longer exists; today it is one call,
`keras.config.set_dtype_policy("mixed_float16")` (here scoped with `tfperf.precision.dtype_policy`).
Layers then compute in float16 and keep float32 variables; the model's last layer stays float32
(`get_net` does that) so the softmax and the loss are computed in full precision. float16 has a
narrow exponent range, so small gradients underflow to zero: `keras.optimizers.LossScaleOptimizer`
multiplies the loss before backpropagation and divides the gradients after. bfloat16 has float32's
range and needs no scaling. The recipe times a training step under each policy, computes the
activation memory, and checks that training gives the same result as float32.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import math
import sys

import keras
import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.measure import Timer, interleave, versus
from tfperf.measure.timer import matmul_flops_per_s
from tfperf.data import load_arrays, to_dataset
from tfperf.models import activation_bytes, get_net
from tfperf.precision import dtype_policy, hardware_summary
from tfperf.recipe import Conclusion, Recipe
from tfperf.measure.stats import FASTER
from tfperf.train import accuracy

TABLE = "training step by dtype policy"
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
LOSS_TOLERANCE, ACCURACY_TOLERANCE = 0.1, 0.03  # against float32 after the same steps from the same weights


def peak_device_memory(device: str) -> int | None:
    """Peak bytes the allocator handed out on a GPU since the last reset; None on CPUs (not tracked)."""
    try:
        return int(tf.config.experimental.get_memory_info(device)["peak"])
    except (ValueError, tf.errors.InvalidArgumentError):
        return None


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--train-steps", type=flags.positive_int, help="training steps of the numerical check")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")


def measure(args, rec) -> dict:
    # Setup ------------------------------------------------------------------------------------
    data = load_arrays(args.dataset, seed=args.seed)
    gpu = bool(tf.config.list_physical_devices("GPU"))
    print(f"hardware: {hardware_summary()}", flush=True)
    batches = list(to_dataset(data.x_train, data.y_train, batch_size=args.batch_size, seed=args.seed, repeat=True,
                              drop_remainder=True).take(args.train_steps))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    # Baseline float32, then each mixed policy: the same weights, the same batches ----------------
    models, steps = {}, {}
    for policy in POLICIES:
        keras.utils.set_random_seed(args.seed)
        with dtype_policy(policy):  # mixed: layers built here compute in 16 bits, keep float32 variables
            model = get_net(args.model, input_shape=data.input_shape, num_classes=data.num_classes)
        optimizer = keras.optimizers.Adam(args.lr)
        if policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # mixed: keep small fp16 gradients alive
        models[policy], steps[policy] = model, train_step_for(model, optimizer, loss_fn)

    # All three policies in the same interleaved rounds, so that the machine's drift falls on each alike.
    x0, y0 = batches[0]
    timers = [Timer(lambda step=steps[p]: step(x0, y0), name=p, items_per_call=args.batch_size) for p in POLICIES]
    speed = dict(zip(POLICIES, interleave(timers, samples=args.steps, warmup=args.warmup, seed=args.seed,
                                          profile_dir=args.profile)))
    against_float32 = {p: versus(speed["float32"], speed[p]) for p in POLICIES[1:]}

    # Numerical check against float32: the rest of the steps, continuing from the timed steps' weights --
    results = {}
    for policy in POLICIES:
        model = models[policy]
        if gpu:
            tf.config.experimental.reset_memory_stats("GPU:0")
        losses = [float(steps[policy](x, y)) for x, y in batches]
        tail = float(np.mean(losses[-10:]))
        dtype = tf.float16 if policy == "mixed_float16" else tf.bfloat16 if policy == "mixed_bfloat16" else tf.float32
        results[policy] = {
            "samples_per_s": speed[policy].items_per_s, "ms_per_step": speed[policy].median_s * 1e3,
            "matmul_gflops": matmul_flops_per_s(1024, dtype=dtype) / 1e9,
            "activation_mb": activation_bytes(model, args.batch_size) / 2**20,
            "peak_gpu_mb": (peak_device_memory("GPU:0") or 0) / 2**20 if gpu else None,
            "final_loss": tail, "test_accuracy": accuracy(model, data.x_test, data.y_test),
            "nan_losses": sum(not math.isfinite(l) for l in losses),
            "compute_dtype": model.layers[1].compute_dtype, "variable_dtype": model.layers[1].variable_dtype}
        print(f"{policy:<15} {speed[policy].items_per_s:8,.0f} samples/s  loss {tail:.4f}", flush=True)

    base = results["float32"]
    ok = {}
    for policy, m in results.items():
        m["loss_diff"] = m["final_loss"] - base["final_loss"]
        m["accuracy_diff"] = m["test_accuracy"] - base["test_accuracy"]
        ok[policy] = (m["nan_losses"] == 0 and abs(m["loss_diff"]) <= LOSS_TOLERANCE
                      and abs(m["accuracy_diff"]) <= ACCURACY_TOLERANCE)
        rec.add(TABLE, policy, {**m, "agrees_with_float32": ok[policy]}, primary="samples_per_s",
                lower_is_better=False, measurement=speed[policy], comparison=against_float32.get(policy))
    return {"results": results, "ok": ok, "against_float32": against_float32}


def train_step_for(model, optimizer, loss_fn):
    """A compiled training step that scales the loss when the optimizer does (mixed_float16)."""

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))  # float32 logits, so a float32 loss
            scaled = optimizer.scale_loss(loss)  # mixed: x loss scale for fp16, unchanged otherwise
        grads = tape.gradient(scaled, model.trainable_variables)  # the optimizer unscales them
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def conclude(args, rec, found) -> Conclusion:
    results, ok, against = found["results"], found["ok"], found["against_float32"]
    base = results["float32"]
    line = (f"numerical check ({args.train_steps} steps, loss within {LOSS_TOLERANCE}, accuracy within "
            f"{ACCURACY_TOLERANCE} of float32, no NaN): " + ", ".join(f"{p} {'ok' if ok[p] else 'FAILED'}" for p in POLICIES))

    # Conclusion, from this run's numbers ------------------------------------------------------
    mm = {p: results[p]["matmul_gflops"] / base["matmul_gflops"] for p in POLICIES}
    wins = [p for p, c in against.items() if c.verdict == FASTER]
    text = (
        f"On this machine ({hardware_summary()}), against float32 a training step under mixed_float16 was "
        f"{against['mixed_float16'].describe()} and under mixed_bfloat16 {against['mixed_bfloat16'].describe()}; "
        f"a 1024 matmul ran at {mm['mixed_float16']:.2f}x and {mm['mixed_bfloat16']:.2f}x float32's rate. "
        f"{'Here ' + ' and '.join(wins) + ' paid' if wins else 'Here no mixed policy paid'}: mixed precision "
        f"pays where 16-bit units multiply the matmul rate (tensor cores, AVX-512 BF16, AMX) and halves the "
        f"{base['activation_mb']:.1f} MB of activations to {results['mixed_bfloat16']['activation_mb']:.1f} MB; "
        f"without them each op converts to float32 and back, which costs time. Numerically, after "
        f"{args.train_steps} steps the losses differ from float32 by {results['mixed_float16']['loss_diff']:+.3f} "
        f"(fp16, loss-scaled) and {results['mixed_bfloat16']['loss_diff']:+.3f} (bf16), with "
        f"{sum(r['nan_losses'] for r in results.values())} NaN losses: "
        f"{'both agree with float32 within the tolerance' if all(ok.values()) else 'NOT within the tolerance'}.")
    failure = "" if all(ok.values()) else "a mixed policy departed from float32 beyond the tolerance"
    return Conclusion(text, [line], failure)


RECIPE = Recipe(name="mixed_precision", doc=__doc__, order=30, measure=measure, conclude=conclude,
                add_flags=add_flags, uses=("steps", "warmup", "batch_size"),
                sizes={"steps": (60, 30), "warmup": (5, 3), "batch_size": (128, 128), "train_steps": (300, 60)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
