"""A collective's costs on the engine, measured here: a small and a large all-reduce between two processes of this
machine (Horovod over Gloo), what `tfperf doctor --hosts` and recipes/across_hosts.py charge on top of the ring
model's link terms: a fixed cost per fused message, and a cost per byte the link does not hide.

On a fast link the link's latency and bandwidth give a small all-reduce tens of microseconds, and it takes
milliseconds (about 4 ms here on emulated hosts over every link, and 1.8-3.9 ms between two local processes): the
engine's own work per collective, not the link's, so two processes here read about what a cluster's hosts pay.
(HOROVOD_CYCLE_TIME=0.1 left one small all-reduce's cost as it was: it is not the background cycle's wait.) A large
all-reduce's bytes cost time on the wire and on the hosts' cores (copies into and out of Horovod's buffers and the
sockets', the sum: 16 MiB in 21 ms between two processes here), the cores working on some while the wire carries
others, so the slower of the two sets the pace."""

from __future__ import annotations

import dataclasses
import importlib.util
import statistics
import sys
from pathlib import Path

from tfperf.cluster.ring import LARGE_ALLREDUCE_BYTES, SMALL_ALLREDUCE_BYTES, engine_costs

REPS = 20  # each all-reduce's timed calls (the small one a few milliseconds, the large one tens)


@dataclasses.dataclass(frozen=True)
class EngineCost:
    """A collective's fixed cost (seconds) and the engine's cost per byte sent, and where they came from."""

    fixed_s: float
    per_byte_s: float
    source: str
    measured: bool


def timed_allreduces() -> None:
    """Under horovodrun: time the small and the large all-reduce; rank 0 prints both medians' samples (`reply`)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from tfperf.measure import Timer
    from tfperf.measure.processes import reply

    hvd.init()
    found = {}
    for name, size in (("large", LARGE_ALLREDUCE_BYTES), ("small", SMALL_ALLREDUCE_BYTES)):
        values = tf.ones([size // 4], tf.float32)
        m = Timer(lambda: hvd.allreduce(values, op=hvd.Sum, name=name), name=f"{name} all-reduce",
                  sync_fn=lambda r: r.numpy()).measure(REPS, warmup=3)
        found[f"{name}_samples_s"] = list(m.samples_s)
    if hvd.rank() == 0:
        print(reply(found), flush=True)


def measure_engine_cost(timeout: float = 180.0) -> EngineCost:
    """The small and the large all-reduce's medians over two local processes (loopback: the link's share is nil),
    or, where they cannot be measured (no Horovod, a launcher that fails), none charged and said so."""
    from tfperf.cluster.errors import ClusterError
    from tfperf.cluster.processes import launch
    from tfperf.measure.processes import rank0_replies

    if importlib.util.find_spec("horovod") is None:
        return EngineCost(0.0, 0.0, "none charged: Horovod is not installed here to measure it "
                                    "(scripts/install_horovod.sh)", False)
    launcher = Path(sys.executable).parent / "horovodrun"
    try:
        output = launch([launcher, "-np", "2", "--gloo", sys.executable, "-m", "tfperf.cluster.collective"],
                        timeout=timeout)
        found = rank0_replies(output)[-1]
        small, large = (statistics.median(found[f"{k}_samples_s"]) for k in ("small", "large"))
    except (ClusterError, IndexError, KeyError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return EngineCost(0.0, 0.0, f"none charged: the all-reduces could not be measured ({first[:160]})", False)
    fixed_s, per_byte_s = engine_costs(small, large, 2)
    return EngineCost(fixed_s, per_byte_s, f"measured with a {SMALL_ALLREDUCE_BYTES // 1024} KiB and a "
                                           f"{LARGE_ALLREDUCE_BYTES // 2**20} MiB all-reduce on Horovod's Gloo "
                                           f"between two processes here", True)


if __name__ == "__main__":
    timed_allreduces()
