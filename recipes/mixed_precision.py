"""Mixed precision: float32 vs mixed_float16 vs mixed_bfloat16, for speed, memory and the same answer.

Compute in 16 bits, keep the variables in 32: where the hardware has 16-bit units this halves memory
traffic and can multiply matmul throughput; where it does not, it only adds conversions. On GPUs with
TF32 (Ampere and newer) float32 is run with TF32 on, TensorFlow's default there, and off.

Run:   python recipes/mixed_precision.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21 and Keras 3; mnist-5k works offline. A GPU with compute capability >= 7.0
       (float16) or >= 8.0 (bfloat16), or a CPU with AVX-512 BF16 / AMX, to see a speedup.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import math
import sys

import keras
import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.data import load_arrays, to_dataset
from tfperf.gpus import device_memory, in_exact_float32, reset_peak_memory, tf32_here
from tfperf.measure import Timer
from tfperf.measure.stats import FASTER, Comparison
from tfperf.measure.timer import matmul_flops_per_s
from tfperf.models import activation_bytes, get_net
from tfperf.precision import dtype_policy, hardware_summary
from tfperf.recipe import Conclusion, Headline, Recipe
from tfperf.records.jsonl import race_table
from tfperf.train import accuracy

# The technique: one dtype policy before the model is built -----------------------------------------
# In a program it is one call: keras.config.set_dtype_policy("mixed_bfloat16"). Layers built after it
# compute in 16 bits and keep float32 variables; the model's last layer stays float32 (get_net builds
# it so) so that the softmax and the loss are computed in full precision.


def build(model_name: str, data, policy: str, lr: float):
    """The model built under `policy`, and its optimizer."""
    with dtype_policy(policy):  # keras.config.set_dtype_policy(policy), scoped to compare policies here
        model = get_net(model_name, input_shape=data.input_shape, num_classes=data.num_classes)
    optimizer = keras.optimizers.Adam(lr)
    if policy == "mixed_float16":
        # float16's exponent is narrow: small gradients underflow to zero unless the loss is scaled up
        # before backpropagation and the gradients down after. bfloat16 has float32's range: no scaling.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return model, optimizer


def train_step_for(model, optimizer, loss_fn):
    """A compiled training step that scales the loss when the optimizer does (mixed_float16)."""

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))  # float32 logits, so a float32 loss
            scaled = optimizer.scale_loss(loss)  # mixed_float16: x loss scale; unchanged otherwise
        grads = tape.gradient(scaled, model.trainable_variables)  # the optimizer unscales them
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


# TF32: on Ampere (compute capability 8.0) and newer GPUs, TensorFlow runs float32 matmuls and convolutions on
# tensor cores with 10-bit mantissas by default, so "float32" there is already reduced precision. Where that
# is so, float32 is also run as float32 really computes, after
#     tf.config.experimental.enable_tensor_float_32_execution(False)


def policy_rows(tf32: bool) -> dict[str, tuple[str, bool]]:
    """The rows compared, each a Keras policy and whether it runs with TF32 off: float32 is run both ways
    where TF32 is in effect (a GPU of compute capability 8.0 or more), once elsewhere."""
    rows = {"float32": ("float32", False)}
    if tf32:
        rows["float32, TF32 off"] = ("float32", True)
    return {**rows, "mixed_float16": ("mixed_float16", False), "mixed_bfloat16": ("mixed_bfloat16", False)}


# Measuring ---------------------------------------------------------------------------------------
# The policies train from the same weights on the same batches; their steps are timed in the same
# interleaved rounds, and training goes on to check that each lands where float32 does.

TABLE = "training step by dtype policy"
LOSS_TOLERANCE, ACCURACY_TOLERANCE = 0.1, 0.03  # against float32 after the same steps from the same weights
DTYPES = {"mixed_float16": tf.float16, "mixed_bfloat16": tf.bfloat16}


@dataclasses.dataclass(frozen=True)
class Found:
    results: dict[str, dict]  # per row: speed, matmul rate, memory, loss and accuracy
    ok: dict[str, bool]  # per row: agrees with float32 within the tolerances, no NaN
    against_float32: dict[str, Comparison]
    device: str  # where the steps ran: "GPU:0" or "CPU:0"


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--train-steps", type=flags.positive_int, help="training steps of the numerical check")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")


def measure(args, rec) -> Found:
    data = load_arrays(args.dataset, seed=args.seed)
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    print(f"hardware: {hardware_summary()}", flush=True)
    batches = list(to_dataset(data.x_train, data.y_train, batch_size=args.batch_size, seed=args.seed, repeat=True,
                              drop_remainder=True).take(args.train_steps))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    tf32 = tf32_here()
    rows = policy_rows(tf32)
    models, steps = {}, {}
    for row, (policy, tf32_off) in rows.items():
        keras.utils.set_random_seed(args.seed)  # the same initial weights under every policy
        models[row], optimizer = build(args.model, data, policy, args.lr)
        step = train_step_for(models[row], optimizer, loss_fn)
        steps[row] = in_exact_float32(step) if tf32_off else step

    # Speed: a step under each policy, in the same interleaved rounds; then the numerical check: the rest
    # of the steps, continuing from the timed steps' weights.
    x0, y0 = batches[0]
    results, ok = {}, {}

    def row(m, _):
        name, model = m.name, models[m.name]
        policy, tf32_off = rows[name]
        reset_peak_memory(device)
        losses = [float(steps[name](x, y)) for x, y in batches]
        tail = float(np.mean(losses[-10:]))
        rate = in_exact_float32(matmul_flops_per_s) if tf32_off else matmul_flops_per_s
        peak = (device_memory(device) or {}).get("peak")
        results[name] = found = {
            "samples_per_s": m.items_per_s, "ms_per_step": m.median_s * 1e3,
            "matmul_gflops": rate(1024, dtype=DTYPES.get(policy, tf.float32)) / 1e9,
            "activation_mb": activation_bytes(model, args.batch_size) / 2**20,
            "peak_gpu_mb": peak / 2**20 if peak is not None else None, "device": device,
            "tf32": tf32 and policy == "float32" and not tf32_off,
            "final_loss": tail, "test_accuracy": accuracy(model, data.x_test, data.y_test),
            "nan_losses": sum(not math.isfinite(loss) for loss in losses),
            "compute_dtype": model.layers[1].compute_dtype, "variable_dtype": model.layers[1].variable_dtype}
        base = results["float32"]
        found["loss_diff"] = found["final_loss"] - base["final_loss"]
        found["accuracy_diff"] = found["test_accuracy"] - base["test_accuracy"]
        ok[name] = found["agrees_with_float32"] = (
            found["nan_losses"] == 0 and abs(found["loss_diff"]) <= LOSS_TOLERANCE
            and abs(found["accuracy_diff"]) <= ACCURACY_TOLERANCE)
        print(f"{name:<18} {m.items_per_s:8,.0f} samples/s  loss {tail:.4f}", flush=True)
        return found

    raced = race_table(rec, TABLE, [Timer(lambda step=steps[r]: step(x0, y0), name=r, items_per_call=args.batch_size)
                                    for r in rows], metrics=row, primary="samples_per_s", lower_is_better=False,
                       rounds=10, samples=args.steps, warmup=args.warmup, seed=args.seed, profile_dir=args.profile)
    return Found(results, ok, raced.comparisons, device)


def conclude(args, rec, found: Found) -> Conclusion:
    results, ok, against = found.results, found.ok, found.against_float32
    base = results["float32"]
    line = (f"numerical check ({args.train_steps} steps, loss within {LOSS_TOLERANCE}, accuracy within "
            f"{ACCURACY_TOLERANCE} of float32, no NaN): "
            + ", ".join(f"{p} {'ok' if ok[p] else 'FAILED'}" for p in results))

    mm = {p: results[p]["matmul_gflops"] / base["matmul_gflops"] for p in results}
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
    exact = "float32, TF32 off"
    if exact in against:
        text += (f" On {found.device}, \"float32\" ran with TF32 (TensorFlow's default from compute capability 8.0): "
                 f"with TF32 off a step was {against[exact].describe()} and a matmul ran at {mm[exact]:.2f}x its "
                 f"rate, so the float32 the mixed policies are judged against is already tensor-core arithmetic; "
                 f"its loss differs from TF32 off by {-results[exact]['loss_diff']:+.3f}.")
    failure = "" if all(ok.values()) else "a row departed from float32 beyond the tolerance"
    best = max(("mixed_float16", "mixed_bfloat16"), key=lambda p: against[p].ratio)
    return Conclusion(text, [line], failure,
                      Headline.compared(f"a training step under {best} (the better policy) against float32", against[best]))


RECIPE = Recipe(name="mixed_precision", doc=__doc__, order=30, measure=measure, conclude=conclude,
                add_flags=add_flags, uses=("steps", "warmup", "batch_size"),
                sizes={"steps": (60, 30), "warmup": (5, 3), "batch_size": (128, 128), "train_steps": (300, 60)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
