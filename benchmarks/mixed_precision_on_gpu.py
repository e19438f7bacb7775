"""Mixed precision on a GPU's tensor cores, Keras 3 on JAX: float32 against mixed_float16 and mixed_bfloat16.

Run:   KERAS_BACKEND=jax python benchmarks/mixed_precision_on_gpu.py            (a few minutes on one GPU)
       KERAS_BACKEND=jax python benchmarks/mixed_precision_on_gpu.py --tiny     (the same code at toy sizes, CPU)
       ... --kernels DIR: each policy also traced against float32 in turns, kernel by kernel (traces in DIR)
       ... --memory: the device memory each policy's step is compiled to use (XLA's buffer assignment)
Needs: Keras 3 and JAX (a CUDA build for the GPU); no TensorFlow: tfperf.measure times JAX arrays by
       `block_until_ready`, so this runs where TensorFlow's CUDA build cannot be installed.

"Why did mixed precision make it slower?" has two halves: on a CPU (no float16 units) it is slower, and on
a GPU it pays only where matrix work dominates and the shapes suit the tensor cores. Each model is built
under each policy from the same seed and trained on the same batch with `train_on_batch` (one jitted step:
forward, loss, backward, update), the policies taking turns in interleaved rounds (`tfperf.measure.race`),
each figure against float32's from the same rounds with its 95% interval. The first call (trace and XLA
compile) is one reading per variant. Whether the policy took effect is read from the model, not its name:
the layers computing in float16 or bfloat16. With --kernels, where the time went: each policy and float32
traced in turns (JAX's profiler, read through XProf), the GPU kernels' time grouped by layer and operation,
each group's ratio with its interval, as `tfperf doctor` reports a mixed policy that is not faster. On JAX
a float32 matmul on an Ampere or newer GPU already runs on tensor cores as TF32 (JAX's default precision), so
float32 here is not CUDA-core float32.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfperf.doctor.kernels import kernel_diff, precision_hint  # noqa: E402
from tfperf.measure import Timer, race  # noqa: E402

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
# float32 with every matmul and convolution in full float32 (JAX's "highest" precision): TF32 off.
FULL_FLOAT32 = "float32, TF32 off"
CLASSES = 10


def conv_stack(filters: int, shape: tuple[int, int, int]) -> keras.Model:
    """Four 3x3 convolutions of `filters` channels: the shape question (are the channels a multiple of 8?)."""
    inputs = keras.Input(shape)
    x = inputs
    for i in range(4):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i}")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(CLASSES, dtype="float32", name="logits")(x)  # the loss in float32
    return keras.Model(inputs, outputs, name=f"conv_stack_{filters}")


def models(tiny: bool) -> dict[str, tuple]:
    """Model label -> (builder of a policy's model, batch, input shape)."""
    side, batch = (32, 8) if tiny else (224, 128)
    small_side, small_batch = (16, 8) if tiny else (64, 256)
    apps = {"ResNet50": keras.applications.ResNet50, "MobileNetV2": keras.applications.MobileNetV2}
    found = {f"{name} {side}x{side}": (lambda f=f: f(input_shape=(side, side, 3), weights=None, classes=CLASSES),
                                       batch, (side, side, 3)) for name, f in apps.items()}
    for filters in (60, 64):
        found[f"4 convolutions, {filters} channels, {small_side}x{small_side}"] = (
            lambda n=filters: conv_stack(n, (small_side, small_side, 3)), small_batch, (small_side, small_side, 3))
    return found


def reduced_precision_layers(model: keras.Model) -> str:
    """How many of the model's layers with weights compute in a 16-bit type: whether the policy took effect."""
    weighted = [layer for layer in model.layers if layer.weights]
    low = [layer for layer in weighted if layer.compute_dtype in ("float16", "bfloat16")]
    return f"{len(low)}/{len(weighted)} weighted layers in {low[0].compute_dtype}" if low else "none in 16 bits"


def variant(build, policy: str, batch: int, shape: tuple) -> tuple[Timer, str, keras.Model]:
    """A Timer on one training step of the model built under `policy`, warmed up (its first call timed), what the
    policy did to the model, and the model."""
    full = policy == FULL_FLOAT32
    keras.config.set_dtype_policy("float32" if full else policy)
    try:
        keras.utils.set_random_seed(0)
        model = build()
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=False))
    finally:
        keras.config.set_dtype_policy("float32")  # models built later start from the default again
    rng = np.random.default_rng(0)
    x = rng.random((batch, *shape), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch)
    # Device-resident inputs: the step, not the host-to-device copy, is what is compared.
    x, y = jax.device_put(x), jax.device_put(y)

    def step():
        # JAX keys its compiled functions on the matmul precision in force: the context is part of every call.
        with jax.default_matmul_precision("highest") if full else contextlib.nullcontext():
            return model.train_on_batch(x, y, return_dict=False)

    timer = Timer(step, name=policy, items_per_call=batch)
    started = time.perf_counter()
    timer.first_call()
    return timer, f"{reduced_precision_layers(model)}, first call {time.perf_counter() - started:.1f} s", model


def step_memory(model: keras.Model, batch: int, shape: tuple) -> dict[str, int]:
    """Bytes XLA assigns to one training step's gradient (forward, loss, backward) of `model`: its arguments
    (weights, batch) and its temporaries (the activations kept for the backward pass, workspaces), read from the
    compiled program (`memory_analysis`), so that "mixed precision saves memory but no time" is answered in bytes."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]
    x = jax.numpy.zeros((batch, *shape), "float32")
    y = jax.numpy.zeros((batch,), "int32")

    def loss_of(tv, ntv, x, y):
        return jax.numpy.mean(loss_fn(y, model.stateless_call(tv, ntv, x, training=True)[0]))

    stats = jax.jit(jax.grad(loss_of)).lower(trainable, frozen, x, y).compile().memory_analysis()
    return {"arguments": stats.argument_size_in_bytes, "temporaries": stats.temp_size_in_bytes,
            "outputs": stats.output_size_in_bytes}


def memory_lines(built: dict[str, keras.Model], batch: int, shape: tuple) -> list[str]:
    """Each policy's step memory, beside float32's (the first)."""
    found = {policy: step_memory(model, batch, shape) for policy, model in built.items()}
    base = next(iter(found.values()))
    mib = 2 ** 20
    return [f"{policy}: temporaries {m['temporaries'] / mib:,.0f} MiB ({m['temporaries'] / base['temporaries']:.2f}x "
            f"float32's), arguments {m['arguments'] / mib:,.0f} MiB, gradients out {m['outputs'] / mib:,.0f} MiB"
            for policy, m in found.items()]


def kernels(timers: list[Timer], built: dict[str, keras.Model], folder: str) -> list[str]:
    """Each policy against float32 (the first timer), traced in turns: the kernels that got slower or were added."""
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    found = []
    for timer in timers[1:]:
        model = built[timer.name]
        diff = kernel_diff(timers[0], timer, [layer.name for layer in model.layers],
                           os.path.join(folder, re.sub(r"[^A-Za-z0-9]+", "-", timer.name)), calls=3)
        hint = precision_hint(timer.name, model, sorted({g.layer for g in diff.slower}), gpus)
        found.append(dataclasses.replace(diff, hint=hint).describe())
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="toy sizes, to check the code on a CPU")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--min-time", type=float, default=1.5, help="seconds of samples per variant")
    parser.add_argument("--only", nargs="*", default=None, help="models whose label starts with one of these")
    parser.add_argument("--tf32", action="store_true", help=f"add a row '{FULL_FLOAT32}' (full float32 matmuls)")
    parser.add_argument("--kernels", metavar="DIR", help="trace each policy against float32, kernel by kernel")
    parser.add_argument("--memory", action="store_true", help="the device memory each policy's step is compiled to")
    args = parser.parse_args()
    if keras.backend.backend() != "jax":
        print("This benchmark runs Keras 3 on JAX: set KERAS_BACKEND=jax.", file=sys.stderr)
        return 2
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)  # GPUs only
    print(f"Keras {keras.__version__} on JAX {jax.__version__}, {device.platform}: {device.device_kind}"
          f"{f', compute capability {capability}' if capability else ''}")
    policies = (*POLICIES, FULL_FLOAT32) if args.tf32 else POLICIES
    for label, (build, batch, shape) in models(args.tiny).items():
        if args.only and not any(label.startswith(prefix) for prefix in args.only):
            continue
        timers, facts, built = [], {}, {}
        for policy in policies:
            timer, facts[policy], built[policy] = variant(build, policy, batch, shape)
            timers.append(timer)
        measured, comparisons = race(timers, rounds=args.rounds, min_time_s=args.min_time, seed=0)
        against = {c.candidate: c for c in comparisons}
        print(f"\n{label}, batch {batch}, training step (train_on_batch):")
        for m in measured:
            judged = against[m.name].describe() if m.name in against else "the baseline"
            print(f"- {m.name}: {m.median_s * 1e3:.2f} ms a step, {m.items_per_s:,.0f} images/s; {judged} "
                  f"({facts[m.name]})")
        if args.memory:
            print("  device memory of one step's gradient, as XLA assigned it:")
            for line in memory_lines(built, batch, shape):
                print(f"  - {line}")
        if args.kernels:
            folder = os.path.join(args.kernels, re.sub(r"[^A-Za-z0-9]+", "-", label))
            for line in kernels(timers, built, folder):
                print(f"- {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
