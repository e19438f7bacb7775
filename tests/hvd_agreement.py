"""A few steps of data-parallel SGD through tfperf.hvd; each rank saves its weights to OUT/rank<r>-of-<n>.npz.

Then rank 0 trains the single-device reference, saved as OUT/rank0-of-1.npz: the same global batches from the
same initial weights (rank 0's, broadcast), with a plain tape and no all-reduce, in the same process (a process
of its own would start TensorFlow once more). The ranks start from different random weights on purpose: only
the broadcast can make them agree.
"""

import sys
from pathlib import Path

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from tfperf import hvd as thvd
from tfperf.models import get_net

STEPS, GLOBAL_BATCH, FEATURES = 5, 32, 20

hvd.init()
thvd.pin_to_local_gpu()
rank, size = hvd.rank(), hvd.size()
keras.utils.set_random_seed(rank)
model = get_net("mlp", input_shape=(FEATURES,), num_classes=2)
optimizer = keras.optimizers.SGD(0.5)
optimizer.build(model.trainable_variables)
thvd.broadcast(model.variables + optimizer.variables, root_rank=0)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

initial = [v.numpy() for v in model.weights]  # rank 0's, on every rank

rng = np.random.default_rng(123)
x = rng.normal(size=(STEPS, GLOBAL_BATCH, FEATURES)).astype(np.float32)
y = (x[..., 0] > 0).astype(np.int32)
share = GLOBAL_BATCH // size
for step in range(STEPS):
    xb, yb = x[step, rank * share:(rank + 1) * share], y[step, rank * share:(rank + 1) * share]
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    tape = hvd.DistributedGradientTape(tape)
    optimizer.apply_gradients(zip(thvd.gradients(tape, loss, model.trainable_variables), model.trainable_variables))

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
np.savez(out / f"rank{rank}-of-{size}.npz", *[v.numpy() for v in model.weights])

if rank == 0:
    reference = get_net("mlp", input_shape=(FEATURES,), num_classes=2)
    reference.set_weights(initial)
    reference_optimizer = keras.optimizers.SGD(0.5)
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            loss = loss_fn(y[step], reference(x[step], training=True))
        grads = tape.gradient(loss, reference.trainable_variables)
        reference_optimizer.apply_gradients(zip(grads, reference.trainable_variables))
    np.savez(out / "rank0-of-1.npz", *[v.numpy() for v in reference.weights])
