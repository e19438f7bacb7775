"""The training ladder: one model, one data set, one change at a time from plain `model.fit`.

Each rung adds one technique to the best configuration so far and keeps it only if it is faster and
no less accurate, so the last kept rung is the best configuration this machine found, with the price
of each step on the way.

Run:   python recipes/training_ladder.py --quick          (about two minutes on 2 CPU cores)
       python recipes/training_ladder.py --model resnet18 (slow on a CPU)
Needs: TensorFlow 2.21 and Keras 3; mnist-5k works offline.

Introduction
------------
Performance advice comes as a list: compile with XLA, run several steps per call, raise the batch,
tune the input pipeline, use mixed precision, write the training step yourself. Whether each helps
depends on the model and the machine, so this recipe measures them in order on the same model and
data. Every rung trains from the same initial weights for the same number of epochs (the same
examples seen), so its test accuracy shows a rung that is faster but worse. MFU (model FLOPs
utilisation) is the training FLOPs per second over the matmul FLOP/s measured in this same run.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import math
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.bench import peak_matmul_flops_per_s, profiled
from tfperf.data import DatasetUnavailable, load_arrays, to_dataset
from tfperf.models import flops, get_net
from tfperf.precision import dtype_policy, hardware_summary
from tfperf.report import markdown_table, write_conclusion
from tfperf.results import Recorder
from tfperf.train import accuracy, fit_timed

TABLE = "training ladder"
ACCURACY_TOLERANCE = 0.05  # a rung may lose at most this much test accuracy against plain fit
KEEP_IF_FASTER = 1.05  # and must be at least 5% faster than the best so far: smaller gains are noise here


@dataclasses.dataclass(frozen=True)
class Config:
    batch: int = 32  # Keras' default for arrays
    jit: bool | str = "auto"  # Keras' default: XLA on GPUs, not on CPU-only machines
    steps_per_execution: int = 1
    pipeline: str = "arrays"  # or "tf.data"
    policy: str = "float32"
    custom_loop: bool = False


def train(cfg: Config, model_name: str, data, epochs: int, lr: float, seed: int, profile: str | None, row: str):
    """Train from the seed's initial weights; (epoch times, final training loss, test accuracy, model)."""
    keras.utils.set_random_seed(seed)
    with dtype_policy(cfg.policy):
        model = get_net(model_name, input_shape=data.input_shape, num_classes=data.num_classes)
    # Larger batches take fewer steps per epoch; the square-root rule keeps Adam's progress per epoch similar.
    optimizer = keras.optimizers.Adam(lr * math.sqrt(cfg.batch / 32))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ds = to_dataset(data.x_train, data.y_train, batch_size=cfg.batch, seed=seed).cache()
    if cfg.custom_loop:
        if cfg.policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # fit adds it itself; a loop must

        @tf.function(jit_compile=cfg.jit is True)
        def train_epoch(ds):  # the whole epoch is one graph call: no Python between steps
            total, count = tf.constant(0.0), tf.constant(0.0)
            for x, y in ds:
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                    scaled = optimizer.scale_loss(loss)
                grads = tape.gradient(scaled, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                total, count = total + loss, count + 1.0
            return total / count

        epoch_s, loss = [], float("nan")
        for epoch in range(epochs):
            with profiled(profile if epoch > 0 else None, row):
                t0 = time.perf_counter()
                loss = float(train_epoch(ds))
                epoch_s.append(time.perf_counter() - t0)
    else:
        model.compile(optimizer=optimizer, loss=loss_fn, metrics=["accuracy"], jit_compile=cfg.jit,
                      steps_per_execution=cfg.steps_per_execution)
        x = ds if cfg.pipeline == "tf.data" else data.x_train
        y = None if cfg.pipeline == "tf.data" else data.y_train
        batch = None if cfg.pipeline == "tf.data" else cfg.batch
        shuffle = cfg.pipeline != "tf.data"  # a tf.data pipeline shuffles itself
        history, timer = fit_timed(model, x, y, epochs=epochs, profile_dir=profile, profile_name=row,
                                   batch_size=batch, verbose=0, shuffle=shuffle)
        epoch_s, loss = timer.epoch_s, history.history["loss"][-1]
    return epoch_s, float(loss), accuracy(model, data.x_test, data.y_test), model


def main(argv=None) -> int:
    # Setup ------------------------------------------------------------------------------------
    p = flags.parser(__doc__)
    flags.add_model_flag(p, "cnn")
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--epochs", type=flags.positive_int, help="epochs per rung; the first is not timed")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate at batch 32")
    p.add_argument("--batches", type=flags.positive_int, nargs="+", help="batch sizes of the sweep")
    p.add_argument("--train-size", type=flags.positive_int, help="training examples used (default: all)")
    args = flags.parse(p, argv, sizes={"epochs": (5, 3), "train_size": (10**9, 10**9)})
    args.batches = args.batches or [64, 128, 256]
    try:
        data = load_arrays(args.dataset, seed=args.seed)
    except (DatasetUnavailable, ValueError) as exc:
        sys.exit(f"training_ladder: error: {exc}")
    data = dataclasses.replace(data, x_train=data.x_train[:args.train_size], y_train=data.y_train[:args.train_size])
    gpu = bool(tf.config.list_physical_devices("GPU"))
    mixed = "mixed_float16" if gpu else "mixed_bfloat16"  # float16 needs tensor cores; CPUs have bf16 at best
    rec = Recorder("training_ladder", vars(args))
    peak = peak_matmul_flops_per_s()
    train_flops = 3 * flops(get_net(args.model, input_shape=data.input_shape, num_classes=data.num_classes))
    print(f"{args.model} on {args.dataset}: {len(data.x_train)} training examples, {args.epochs} epochs per rung; "
          f"{train_flops / 1e6:.1f} MFLOP per training example; matmul peak {peak / 1e9:.0f} GFLOP/s; "
          f"{hardware_summary()}", flush=True)

    # The ladder: each rung changes one thing in the best configuration so far ---------------------
    rungs = [("plain fit", lambda c: Config()),
             ("jit_compile=True", lambda c: dataclasses.replace(c, jit=True)),  # XLA: fuse the step's ops
             ("steps_per_execution=16", lambda c: dataclasses.replace(c, steps_per_execution=16)),
             *[(f"batch {b}", lambda c, b=b: dataclasses.replace(c, batch=b)) for b in args.batches],
             ("tf.data input (cache, prefetch)", lambda c: dataclasses.replace(c, pipeline="tf.data")),
             (mixed, lambda c: dataclasses.replace(c, policy=mixed)),
             ("custom tf.function loop", lambda c: dataclasses.replace(c, custom_loop=True))]
    best, best_rate, previous_rate, plain = None, 0.0, None, None
    for row, change in rungs:
        cfg = change(best or Config())
        epoch_s, loss, acc, model = train(cfg, args.model, data, args.epochs, args.lr, args.seed, args.profile, row)
        steady = float(np.median(epoch_s[1:] or epoch_s))
        rate = len(data.x_train) / steady
        plain = plain or {"rate": rate, "accuracy": acc}
        ok = math.isfinite(loss) and acc >= plain["accuracy"] - ACCURACY_TOLERANCE
        kept = best is None or (ok and rate > best_rate * KEEP_IF_FASTER)
        rec.add(TABLE, row, {
            "samples_per_s": rate, "vs_previous": rate / previous_rate if previous_rate else 1.0,
            "vs_best_so_far": rate / best_rate if best_rate else 1.0, "mfu": train_flops * rate / peak,
            "first_epoch_s": epoch_s[0], "final_loss": loss, "test_accuracy": acc, "accurate_enough": ok,
            "kept": kept, "xla": bool(model.jit_compile) if not cfg.custom_loop else cfg.jit is True,
            "batch": cfg.batch}, primary="samples_per_s", lower_is_better=False)
        print(f"{row:<34} {rate:8,.0f} samples/s  acc {acc:.3f}  {'kept' if kept else 'dropped'}", flush=True)
        previous_rate = rate
        if kept:
            best, best_rate = cfg, rate

    # Results ----------------------------------------------------------------------------------
    rec.save(args.out)
    rows = rec.table(TABLE)
    print(f"\n## {TABLE}\n\n{markdown_table(rows)}\n")
    kept = [r["row"] for r in rows if r["metrics"]["kept"]]
    ratio = best_rate / plain["rate"]
    best_row = next(r for r in rows if r["row"] == kept[-1])
    print(f"best configuration: {' + '.join(kept)}: {best_rate:,.0f} samples/s = {ratio:.2f}x plain fit, "
          f"MFU {best_row['metrics']['mfu']:.1%} (plain fit {rows[0]['metrics']['mfu']:.1%})")

    # Conclusion, from this run's numbers ------------------------------------------------------
    m = {r["row"]: r["metrics"] for r in rows}
    dropped = [f"{r} ({m[r]['vs_best_so_far']:.2f}x the best so far"
               f"{', accuracy ' + format(m[r]['test_accuracy'], '.3f') if not m[r]['accurate_enough'] else ''})"
               for r in m if not m[r]["kept"]]
    goal = "reaching" if ratio >= 1.5 else "short of"
    xla = m["jit_compile=True"]["vs_previous"]
    xla_note = (f"XLA ran at {xla:.2f}x plain fit" + (
        ": on a CPU, XLA calls its own (Eigen) convolutions instead of the oneDNN kernels TensorFlow's ops use, "
        "so a convnet can lose more than fusion gains." if xla < 1 / KEEP_IF_FASTER and not gpu else
        ": fusing the step's element-wise ops saved memory passes." if xla > KEEP_IF_FASTER else
        ", within noise of it."))
    write_conclusion(args.out, "training_ladder", (
        f"The best configuration kept {', '.join(kept[1:]) or 'nothing beyond plain fit'} and ran "
        f"{ratio:.2f}x plain fit ({best_rate:,.0f} against {plain['rate']:,.0f} samples/s), {goal} the 1.5x goal, "
        f"at {best_row['metrics']['mfu']:.1%} MFU. Dropped: {'; '.join(dropped) or 'none'}. "
        f"{xla_note} "
        f"At {best_row['metrics']['mfu']:.0%} MFU most of a step is not matmul arithmetic: this {args.model}'s "
        f"layers are small, so per-step dispatch, the optimizer update and memory-bound ops weigh; the kept rungs "
        f"attack exactly that. {mixed}: {hardware_summary()}."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
