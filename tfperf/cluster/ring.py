"""The ring all-reduce model (t2 for n ranks over a link of latency alpha and bandwidth beta) and its overlap with
backpropagation: what the scaling model, the doctor's --hosts and the cluster recipes predict with."""

from __future__ import annotations

from collections.abc import Sequence


def ring_t2(n: int, size: float, alpha: float, beta: float) -> float:
    """Ring all-reduce of `size` bytes over n ranks: 2(n-1) steps, each a message of size/n bytes (latency alpha
    seconds, bandwidth beta bytes/s): 2(n-1)/n * size/beta + 2(n-1) alpha."""
    return 0.0 if n == 1 else 2 * (n - 1) * (alpha + size / n / beta)


def exposed_t2(t1: float, readiness: Sequence[tuple[float, float]], n: int, alpha: float, beta: float, *,
               backward_share: float = 2 / 3) -> float:
    """The all-reduce time a step on n hosts adds to t1 when each gradient is all-reduced as soon as backpropagation
    has made it and the link is free (wait-free backpropagation, as Horovod does from a graph: every gradient that
    waits when the link frees goes in one fused message). `readiness`: (share of the backward pass done, bytes) per
    gradient; the backward pass is the last `backward_share` of t1 (forward one matmul per layer, backward two).
    With every gradient ready only at the end it is the ring model's t2."""
    start = t1 * (1 - backward_share)
    ready = sorted((start + share * t1 * backward_share, size) for share, size in readiness)
    clock, i = 0.0, 0
    while i < len(ready):
        clock = max(clock, ready[i][0])
        fused = 0.0
        while i < len(ready) and ready[i][0] <= clock:
            fused += ready[i][1]
            i += 1
        clock += ring_t2(n, fused, alpha, beta)
    return max(0.0, clock - t1)
