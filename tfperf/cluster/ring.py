"""The ring all-reduce model (t2 for n ranks over a link of latency alpha and bandwidth beta, plus the engine's own
costs: a fixed one per collective and one per byte) and its overlap with backpropagation: what the scaling model, the
doctor's --hosts and the cluster recipes predict with."""

from __future__ import annotations

from collections.abc import Sequence

# A small all-reduce, timed to read a collective's fixed cost: 1,024 float32 values, a bias vector's gradient. (One
# value takes another path in Gloo: 1.1 ms where 4 KiB and 64 KiB both took 4 ms over the same emulated 1 Gbit/s.)
SMALL_ALLREDUCE_BYTES = 4096
# A large one, timed beside it to read what the engine spends per byte (copying into and out of its buffers,
# summing, the socket's copies) on the hosts' cores: a wide layer's gradient.
LARGE_ALLREDUCE_BYTES = 16 * 2**20


def ring_t2(n: int, size: float, alpha: float, beta: float, fixed_s: float = 0.0, per_byte_s: float = 0.0,
            lent_bytes: float = 0.0) -> float:
    """Ring all-reduce of `size` bytes over n ranks: 2(n-1) steps, each a message of size/n bytes (latency alpha
    seconds, bandwidth beta bytes/s), the hosts' cores spending `per_byte_s` on each byte sent (`engine_costs`) while
    the wire carries the bytes before, so the slower of the two sets the pace, and the collective's fixed cost once
    (launching and completing it, whatever the link): 2(n-1)/n * size * max(1/beta, per_byte_s) + 2(n-1) alpha +
    fixed_s. `lent_bytes`: what a shaped link lets through at once after idling (an emulated link's token bucket,
    `lent`; a wire lends nothing), off the wire's share."""
    if n == 1:
        return 0.0
    sent = 2 * (n - 1) / n * size
    return 2 * (n - 1) * alpha + max(max(0.0, sent - lent_bytes) / beta, sent * per_byte_s) + fixed_s


def lent(bucket_bytes: float | None, idle_s: float, beta: float) -> float:
    """What a token bucket of `bucket_bytes` (None: a wire, no bucket) has refilled after the link idled `idle_s` at
    beta bytes/s, to let through at once: all of it after a step's compute, the fixed cost's worth between
    back-to-back all-reduces."""
    return 0.0 if not bucket_bytes else min(bucket_bytes, idle_s * beta)


def engine_costs(small_s: float, large_s: float, n: int, *, small: float = SMALL_ALLREDUCE_BYTES,
                 large: float = LARGE_ALLREDUCE_BYTES) -> tuple[float, float]:
    """A collective's fixed cost and the engine's seconds per byte sent, from a small and a large all-reduce timed
    where the link costs next to nothing (two processes of one machine): the small one is all fixed cost, what the
    large one takes beyond it is per byte, over the 2(n-1)/n of its bytes each rank sends."""
    return small_s, max(0.0, large_s - small_s) / (2 * (n - 1) / n * (large - small))


def per_byte_at(read: Sequence[tuple[float, float]], size: float) -> float:
    """The engine's seconds per byte for an all-reduce of `size` bytes from (size, seconds per byte) read at a few
    sizes: in proportion between two of them, the nearest one's outside them. It grows with the size where the
    buffers outgrow the cores' last-level cache (on 10 Gbit/s here 1.0 ms per MiB at 8 MiB, 1.3 at 32 MiB)."""
    points = sorted(read)
    if not points:
        return 0.0
    if size <= points[0][0]:
        return points[0][1]
    for (low, at_low), (high, at_high) in zip(points, points[1:]):
        if size <= high:
            return at_low + (at_high - at_low) * (size - low) / (high - low)
    return points[-1][1]


def fixed_cost(small_s: float, n: int, alpha: float, beta: float, size: float = SMALL_ALLREDUCE_BYTES) -> float:
    """A collective's fixed cost: what a small all-reduce of `size` bytes took beyond what the link gives it (on
    emulated hosts with Gloo about 4 ms, where a 10 Gbit/s link's latency and bandwidth give it 0.06 ms)."""
    return max(0.0, small_s - ring_t2(n, size, alpha, beta))


def exposed_t2(t1: float, readiness: Sequence[tuple[float, float]], n: int, alpha: float, beta: float, *,
               backward_share: float = 2 / 3, fixed_s: float = 0.0, per_byte_s: float = 0.0) -> float:
    """The all-reduce time a step on n hosts adds to t1 when each gradient is all-reduced as soon as backpropagation
    has made it and the link is free (wait-free backpropagation, as Horovod does from a graph: every gradient that
    waits when the link frees goes in one fused message, each message paying the fixed cost). `readiness`: (share of
    the backward pass done, bytes) per gradient; the backward pass is the last `backward_share` of t1 (forward one
    matmul per layer, backward two). With every gradient ready only at the end it is the ring model's t2."""
    start = t1 * (1 - backward_share)
    ready = sorted((start + share * t1 * backward_share, size) for share, size in readiness)
    clock, i = 0.0, 0
    while i < len(ready):
        clock = max(clock, ready[i][0])
        fused = 0.0
        while i < len(ready) and ready[i][0] <= clock:
            fused += ready[i][1]
            i += 1
        clock += ring_t2(n, fused, alpha, beta, fixed_s, per_byte_s)
    return max(0.0, clock - t1)
