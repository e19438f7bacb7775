"""Horovod with Keras 3: the small adapter that `horovod.tensorflow.keras` no longer provides.

Horovod 0.28's Keras layer and its gradient tape call `.ref()` on each variable (horovod issue 4290);
Keras 3 variables do not have it. The plain `horovod.tensorflow` API works once it is handed the
`tf.Variable` that each Keras variable wraps, which is all this module does, plus the pieces every
Horovod training script needs (learning-rate warm-up, metric averaging, a cross-rank weight check).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping, Sequence

import horovod.tensorflow as hvd
import keras
import psutil
import tensorflow as tf

from tfperf.devices import usable_cores
from tfperf.gpus import ranks_per_gpu_warning


def tf_variables(variables: Iterable) -> list[tf.Variable]:
    """The tf.Variables under Keras 3 variables, which Horovod's ops and tape can use."""
    return [v.value if isinstance(v, keras.Variable) else v for v in variables]


def gradients(tape: tf.GradientTape, loss: tf.Tensor, variables: Sequence) -> list[tf.Tensor]:
    """Gradients of `loss` for Keras variables through a (distributed) tape that needs tf.Variables."""
    return tape.gradient(loss, tf_variables(variables))


def broadcast(variables: Iterable, root_rank: int = 0) -> None:
    """Overwrite every rank's variables with those of `root_rank` (initial weights, optimizer state)."""
    hvd.broadcast_variables(tf_variables(variables), root_rank=root_rank)


def average(metrics: Mapping[str, float]) -> dict[str, float]:
    """The mean of each scalar over all ranks, in one allreduce."""
    return _reduce_scalars(metrics, hvd.Average, "tfperf_average_metrics")


def total(metrics: Mapping[str, float]) -> dict[str, float]:
    """The sum of each scalar over all ranks, in one allreduce."""
    return _reduce_scalars(metrics, hvd.Sum, "tfperf_total_metrics")


def _reduce_scalars(metrics: Mapping[str, float], op, name: str) -> dict[str, float]:
    names = sorted(metrics)  # every rank must send its values in the same order
    values = tf.constant([float(metrics[n]) for n in names], tf.float64)
    return dict(zip(names, map(float, hvd.allreduce(values, op=op, name=name).numpy())))


def max_weight_difference(variables: Iterable, root_rank: int = 0) -> float:
    """The largest |w - w_root| over all ranks and weights: 0.0 when every rank holds the same model."""
    local = tf_variables(variables)
    worst = tf.constant(0.0, tf.float64)
    for i, v in enumerate(local):
        root = hvd.broadcast(tf.convert_to_tensor(v), root_rank=root_rank, name=f"tfperf_weight_check_{i}")
        worst = tf.maximum(worst, tf.cast(tf.reduce_max(tf.abs(tf.cast(v, tf.float64) - tf.cast(root, tf.float64))),
                                          tf.float64))
    return float(hvd.allreduce(worst, op=hvd.Max, name="tfperf_weight_check_max").numpy())


def peer_processes() -> list[tuple[str, int]]:
    """(host, pid) of every rank, indexed by rank; a collective, so every rank must call it."""
    return [tuple(p) for p in hvd.allgather_object((this_host(), os.getpid()), name="tfperf_peers")]


def this_host() -> str:
    """This rank's host as the launcher named it (horovodrun's -H sets HOROVOD_HOSTNAME), else the hostname."""
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


def departed_ranks(peers: Sequence[tuple[str, int]]) -> list[int]:
    """Ranks on this host whose process has ended (exited, killed, or a zombie not yet reaped)."""
    host, gone = this_host(), []
    for rank, (peer_host, pid) in enumerate(peers):
        if peer_host != host:
            continue  # another machine's processes cannot be checked from here
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                gone.append(rank)
        except psutil.NoSuchProcess:
            gone.append(rank)
    return gone


def unreachable(hosts: Iterable[str], port: int = 22, timeout: float = 2.0) -> list[str]:
    """The hosts whose ssh port (which horovodrun reaches every host by) does not answer within `timeout`."""
    lost = []
    for host in hosts:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError:
            lost.append(host)
    return lost


def describe_failure(peers: Sequence[tuple[str, int]], port: int = 22) -> str:
    """Which ranks left the job, for the message a surviving rank prints when a collective fails: ranks on this
    host that ended, or the other hosts that no longer answer on `port` (ssh's)."""
    gone = departed_ranks(peers)
    if gone:
        return f"rank(s) {', '.join(map(str, gone))} ended (pid {', '.join(str(peers[r][1]) for r in gone)})"
    remote = sorted({h for h, _ in peers} - {this_host()})
    lost = unreachable(remote, port)
    if lost:
        ranks = [str(r) for r, (h, _) in enumerate(peers) if h in lost]
        return f"host {', '.join(lost)} (rank {', '.join(ranks)}) no longer answers: it or its network failed"
    where = f" on {', '.join(remote)}" if remote else ""
    return f"no rank on this host has ended: the lost peer is on another host{where} or its network failed"


class WarmupScaledLearningRate(keras.optimizers.schedules.LearningRateSchedule):
    """`base * size`, reached linearly over `warmup_steps` (Goyal et al. 2017, "Accurate, large minibatch SGD").

    With `size` ranks the global batch is `size` times larger, so the learning rate scales with it; starting
    at `base` and ramping up avoids the early divergence a large rate causes on freshly initialised weights.
    """

    def __init__(self, base: float, size: int, warmup_steps: int):
        if base <= 0 or size < 1 or warmup_steps < 0:
            raise ValueError(f"need base > 0, size >= 1, warmup_steps >= 0; got {base}, {size}, {warmup_steps}")
        self.base, self.size, self.warmup_steps = float(base), int(size), int(warmup_steps)

    def __call__(self, step):
        target = self.base * self.size
        if self.warmup_steps == 0:
            return tf.constant(target, tf.float32)
        progress = tf.minimum(tf.cast(step, tf.float32) / self.warmup_steps, 1.0)
        return self.base + (target - self.base) * progress

    def get_config(self) -> dict:
        return {"base": self.base, "size": self.size, "warmup_steps": self.warmup_steps}


def pin_to_local_gpu() -> str:
    """Give each rank on a host its own GPU (or, on CPU, its share of the cores); returns what was done.

    Must run before any TensorFlow op: devices and thread pools are fixed at first use.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[hvd.local_rank() % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
        crowded = ranks_per_gpu_warning(hvd.local_size(), len(gpus))
        return f"GPU {gpu.name}" + (f" (warning: {crowded})" if crowded else "")
    # Ranks on one host share its cores: without a cap each rank starts a pool as large as the machine and
    # they thrash each other.
    threads = max(1, usable_cores() // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    return f"CPU, {threads} thread(s)"
