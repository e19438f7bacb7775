"""Training: `fit` timed epoch by epoch, and a custom loop that checkpoints as it goes and resumes after a crash.

TensorFlow is imported where it is used: `fit_epochs` (the doctor's trainer) runs under any Keras backend, on a GPU
machine that has JAX and no TensorFlow too (benchmarks/best_configuration_on_gpu.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import keras
import numpy as np

from tfperf.measure import Elapsed
from tfperf.data import Arrays, to_dataset


class CheckpointError(ValueError):
    """No checkpoint in a folder that holds some could be restored."""


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """How a run ended: total steps (including those before a resume), loss and test accuracy."""

    steps: int
    resumed_from: int
    final_loss: float
    test_accuracy: float
    checkpoint: str | None
    skipped: tuple[tuple[str, str], ...] = ()  # newer checkpoints that could not be restored, and why


def checkpoints_on_disk(folder: Path | str) -> list[str]:
    """The ckpt-N prefixes in a folder, oldest first, read from the files themselves: when the
    'checkpoint' index file is lost or unreadable, they are still there to resume from."""
    found = [(int(p.name[5:-6]), str(p)[:-6]) for p in Path(folder).glob("ckpt-*.index") if p.name[5:-6].isdigit()]
    return [prefix for _, prefix in sorted(found)]


def restore_newest(ckpt: tf.train.Checkpoint, candidates: list[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """Restore the newest of `candidates` (oldest first) that restores whole; it and the newer ones skipped.

    A checkpoint whose files are truncated or corrupt fails to restore; the one before it (kept by
    max_to_keep) is tried next, so a run loses only the steps after it. CheckpointError when none
    restores: a fresh start would silently throw away what they hold.
    """
    skipped = []
    for prefix in reversed(candidates):
        try:
            ckpt.restore(prefix).assert_existing_objects_matched()
        except Exception as exc:  # truncated files raise IndexError, OpError, DataLossError, ValueError...
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            skipped.append((prefix, f"{type(exc).__name__}: {first[:160]}"))
            continue
        return prefix, skipped
    if candidates:
        raise CheckpointError(f"none of the {len(candidates)} checkpoints in {Path(candidates[0]).parent} restores "
                              f"(newest: {skipped[0][1]}); move the folder aside to start from scratch, or pass "
                              f"another --checkpoint-dir")
    return None, skipped


class StepMarker(keras.callbacks.Callback):
    """Marks each training batch of `fit` as a profiler step (`tf.profiler.experimental.Trace` with its step
    number), which the profiler's input pipeline analysis needs: Keras 3 marks none. Each step spans the
    batch's train function call, input included."""

    def __init__(self):
        super().__init__()
        self._steps = 0  # numbered across epochs: the profiler merges steps that share a number

    def on_train_batch_begin(self, batch, logs=None):
        import tensorflow as tf

        self._step = tf.profiler.experimental.Trace("train", step_num=self._steps, _r=1)
        self._step.__enter__()
        self._steps += 1

    def on_train_batch_end(self, batch, logs=None):
        self._step.__exit__(None, None, None)


def build_optimizer(model) -> bool:
    """Build a compiled Keras 3 model's optimizer now, where fit() would build it inside its first trace: whether it
    did. Without a distribution strategy Keras 3 on TensorFlow defers the build into the traced step, and variables
    made in a tf.function's first trace have TensorFlow trace it again (a two-block Transformer's first epoch: 18.7 s,
    7.7 s with the optimizer built first). A Keras 2 model, or one built already, is left as it is."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or getattr(optimizer, "built", True) or not hasattr(optimizer, "build"):
        return False
    optimizer.build(model.trainable_variables)
    return True


def fit_epochs(model, x, y=None, *, keras_module=None, callbacks: Sequence = (),
               **fit_kwargs) -> tuple[Callable[[], Elapsed], list[float]]:
    """A function that trains `model` one more epoch per call, for a `bench.Timer`, and the losses it appends.

    Each call returns the epoch's own time as an Elapsed, read by a callback at the epoch's ends: the
    data adapter and callbacks each `fit` call sets up stay out of the clock. Keras reads the epoch's
    logs before its end, so the work is done when the clock stops. `keras_module` is the Keras the
    model was built with (`tf_keras` for Keras 2; default Keras 3). `callbacks` are added to each `fit`
    (a `StepMarker` makes its steps visible to the profiler).
    """
    losses: list[float] = []
    started: list[float] = []
    clock = (keras_module or keras).callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: started.append(time.perf_counter()),
                                           on_epoch_end=lambda epoch, logs: started.append(time.perf_counter()))

    def epoch() -> Elapsed:
        history = model.fit(x, y, epochs=1, verbose=0, callbacks=[clock, *callbacks], **fit_kwargs)
        losses.append(float(history.history["loss"][-1]))
        end, begin = started.pop(), started.pop()
        return Elapsed(end - begin)

    return epoch, losses


def make_train_step(model, optimizer, loss_fn, *, jit_compile: bool = False) -> Callable:
    """One optimizer step on a batch, as a tf.function returning the loss (loss-scaled under a LossScaleOptimizer)."""
    import tensorflow as tf


    @tf.function(jit_compile=jit_compile)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = optimizer.scale_loss(loss)  # unchanged unless the optimizer scales losses (mixed_float16)
        optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables))
        return loss

    return train_step


def accuracy(model, x: np.ndarray, y: np.ndarray, batch_size: int = 512) -> float:
    """Top-1 accuracy of the model's logits on arrays."""
    correct = 0
    for start in range(0, len(x), batch_size):
        logits = model(x[start:start + batch_size], training=False)
        correct += int(np.sum(np.argmax(logits, axis=-1) == y[start:start + batch_size]))
    return correct / len(x)


def restore_weights(model, path: Path | str) -> str:
    """Load model weights from a training checkpoint (a folder or a checkpoint prefix)."""
    import tensorflow as tf

    path = str(path)
    prefix = tf.train.latest_checkpoint(path) if Path(path).is_dir() else path
    if not prefix or not Path(prefix + ".index").exists():
        raise FileNotFoundError(f"no checkpoint at {path}: pass a folder written by `tfperf train` "
                                f"(--checkpoint-dir) or one of its ckpt-N prefixes")
    tf.train.Checkpoint(model=model).restore(prefix).expect_partial()  # optimizer state is not needed here
    return prefix


def train(
    model,
    data: Arrays,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float = 1e-3,
    seed: int = 0,
    checkpoint_dir: Path | str | None = None,
    checkpoint_every: int = 50,
    keep: int = 3,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train with Adam for `steps` steps in total, checkpointing every `checkpoint_every` steps.

    The checkpoint holds the model, the optimizer's slots and step count, the step counter and the
    input iterator's position, so a restarted run continues the same sequence of batches.
    """
    import tensorflow as tf

    if steps < 1 or batch_size < 1 or checkpoint_every < 1 or keep < 1:
        raise ValueError(f"steps, batch_size, checkpoint_every and keep must be positive, got "
                         f"{steps}, {batch_size}, {checkpoint_every}, {keep}")
    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer.build(model.trainable_variables)  # slots must exist before a restore can fill them
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    batches = iter(to_dataset(data.x_train, data.y_train, batch_size=batch_size, seed=seed, repeat=True,
                              drop_remainder=True))
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    manager = None
    resumed_from, skipped = 0, []
    if checkpoint_dir is not None:
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step, batches=batches)
        # CheckpointManager writes the shards under a temporary name, then renames them and rewrites
        # the 'checkpoint' pointer atomically: a crash mid-save leaves the previous one as latest.
        state = Path(checkpoint_dir) / "checkpoint"
        try:
            manager = tf.train.CheckpointManager(ckpt, str(checkpoint_dir), max_to_keep=keep)
        except Exception as exc:  # the list of checkpoints is unreadable; the checkpoints may not be
            kept = state.with_name(f"checkpoint.unreadable-{int(time.time())}")
            state.rename(kept)  # kept for a post-mortem, never deleted
            manager = tf.train.CheckpointManager(ckpt, str(checkpoint_dir), max_to_keep=keep)
            lost = [(str(state), f"{type(exc).__name__}; moved to {kept.name}, checkpoints found from their files")]
        else:
            lost = []
        restored, skipped = restore_newest(ckpt, list(manager.checkpoints) or checkpoints_on_disk(checkpoint_dir))
        skipped = lost + skipped
        if restored:
            resumed_from = int(step.numpy())

    train_step = make_train_step(model, optimizer, loss_fn)
    loss = float("nan")
    while int(step.numpy()) < steps:
        x, y = next(batches)
        loss = float(train_step(x, y))
        step.assign_add(1)
        done = int(step.numpy())
        if on_step is not None:
            on_step(done, loss)
        if manager is not None and (done % checkpoint_every == 0 or done == steps):
            manager.save(checkpoint_number=done)
    return TrainResult(
        steps=int(step.numpy()),
        resumed_from=resumed_from,
        final_loss=loss,
        test_accuracy=accuracy(model, data.x_test, data.y_test),
        checkpoint=manager.latest_checkpoint if manager is not None else None,
        skipped=tuple(skipped),
    )
