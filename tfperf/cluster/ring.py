"""The ring all-reduce model (t2 for n ranks over a link of latency alpha and bandwidth beta, plus a collective's own
fixed cost) and its overlap with backpropagation: what the scaling model, the doctor's --hosts and the cluster recipes
predict with."""

from __future__ import annotations

from collections.abc import Sequence

# A small all-reduce, timed to read a collective's fixed cost: 1,024 float32 values, a bias vector's gradient. (One
# value takes another path in Gloo: 1.1 ms where 4 KiB and 64 KiB both took 4 ms over the same emulated 1 Gbit/s.)
SMALL_ALLREDUCE_BYTES = 4096


def ring_t2(n: int, size: float, alpha: float, beta: float, fixed_s: float = 0.0) -> float:
    """Ring all-reduce of `size` bytes over n ranks: 2(n-1) steps, each a message of size/n bytes (latency alpha
    seconds, bandwidth beta bytes/s), and the collective's fixed cost once (launching and completing it, whatever the
    link: `fixed_cost`): 2(n-1)/n * size/beta + 2(n-1) alpha + fixed_s."""
    return 0.0 if n == 1 else 2 * (n - 1) * (alpha + size / n / beta) + fixed_s


def fixed_cost(small_s: float, n: int, alpha: float, beta: float, size: float = SMALL_ALLREDUCE_BYTES) -> float:
    """A collective's fixed cost: what a small all-reduce of `size` bytes took beyond what the link gives it (on
    emulated hosts with Gloo about 4 ms, where a 10 Gbit/s link's latency and bandwidth give it 0.06 ms)."""
    return max(0.0, small_s - ring_t2(n, size, alpha, beta))


def exposed_t2(t1: float, readiness: Sequence[tuple[float, float]], n: int, alpha: float, beta: float, *,
               backward_share: float = 2 / 3, fixed_s: float = 0.0) -> float:
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
        clock += ring_t2(n, fused, alpha, beta, fixed_s)
    return max(0.0, clock - t1)
