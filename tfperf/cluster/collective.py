"""A collective's fixed cost, measured here: a small all-reduce between two processes of this machine (Horovod over
Gloo), what `tfperf doctor --hosts` charges each fused message on top of the ring model's link terms.

On a fast link the link's latency and bandwidth give a small all-reduce tens of microseconds, and it takes
milliseconds (about 4 ms here on emulated hosts over every link, and 3.2-3.9 ms between two local processes): the
engine's own work per collective, not the link's, so two processes here read about what a cluster's hosts pay.
(HOROVOD_CYCLE_TIME=0.1 left one small all-reduce's cost as it was: it is not the background cycle's wait.)"""

from __future__ import annotations

import dataclasses
import importlib.util
import statistics
import sys
from pathlib import Path

from tfperf.cluster.ring import SMALL_ALLREDUCE_BYTES

REPS = 20  # the small all-reduce's timed calls (each a few milliseconds)


@dataclasses.dataclass(frozen=True)
class FixedCost:
    """A collective's fixed cost in seconds, and where it came from, as a report says it."""

    seconds: float
    source: str
    measured: bool


def small_allreduce() -> None:
    """Under horovodrun: time the small all-reduce; rank 0 prints the samples (`reply`)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from tfperf.measure import Timer
    from tfperf.measure.processes import reply

    hvd.init()
    values = tf.ones([SMALL_ALLREDUCE_BYTES // 4], tf.float32)
    m = Timer(lambda: hvd.allreduce(values, op=hvd.Sum, name="small"), name="small all-reduce",
              sync_fn=lambda r: r.numpy()).measure(REPS, warmup=3)
    if hvd.rank() == 0:
        print(reply({"samples_s": list(m.samples_s)}), flush=True)


def measure_fixed_cost(timeout: float = 180.0) -> FixedCost:
    """The small all-reduce's median over two local processes (loopback: the link's share is nil), or, where it
    cannot be measured (no Horovod, a launcher that fails), none charged and said so."""
    from tfperf.cluster.errors import ClusterError
    from tfperf.cluster.processes import launch
    from tfperf.measure.processes import rank0_replies

    if importlib.util.find_spec("horovod") is None:
        return FixedCost(0.0, "none charged: Horovod is not installed here to measure it "
                              "(scripts/install_horovod.sh)", False)
    launcher = Path(sys.executable).parent / "horovodrun"
    try:
        output = launch([launcher, "-np", "2", "--gloo", sys.executable, "-m", "tfperf.cluster.collective"],
                        timeout=timeout)
        samples = rank0_replies(output)[-1]["samples_s"]
    except (ClusterError, IndexError, KeyError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return FixedCost(0.0, f"none charged: the small all-reduce could not be measured ({first[:160]})", False)
    seconds = statistics.median(samples)
    return FixedCost(seconds, f"measured with a {SMALL_ALLREDUCE_BYTES // 1024} KiB all-reduce on Horovod's Gloo "
                              f"between two processes here", True)


if __name__ == "__main__":
    small_allreduce()
