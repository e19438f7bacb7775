"""Sequence length: "how does my Transformer's cost grow with the length of its requests?"

The sequence-length sweep of a model that leaves its sequence axis free (a Transformer): FLOPs per example at
each length (attention's einsums counted, which TensorFlow's profiler leaves out), the share of them in the
term that grows with the length's square (QK^T and the attention-weighted V), and one call's time at batch 1,
timed in interleaved rounds; from them, where attention starts to dominate and which lengths to batch apart."""

from __future__ import annotations

import dataclasses

import numpy as np

from tfperf.deploy.errors import first_line
from tfperf.deploy.inputs import make_inputs, to_tensors
from tfperf.deploy.loader import Subject
from tfperf.doctor.experiment import Context, Experiment, Section
from tfperf.doctor.options import Finding, Options
from tfperf.records.units import number

LENGTHS = (16, 32, 64, 128)
TABLE = "sequence length (batch 1)"


def quadratic_share(lengths: list[int], flops: list[float]) -> tuple[list[float], float | None]:
    """FLOPs(L) fitted as c + a L + b L^2 (least squares; exact for an encoder): each length's share in the b L^2
    term, and the length where that term reaches half (None when it does not grow, or not within 4x the
    longest measured)."""
    x = np.asarray(lengths, np.float64)
    if len(x) < 3:
        return [0.0] * len(x), None
    c, a, b = np.linalg.lstsq(np.stack([np.ones_like(x), x, x * x], axis=1), np.asarray(flops, np.float64),
                              rcond=None)[0]
    shares = [max(0.0, b * n * n / f) for n, f in zip(x, flops)]
    if b <= 0:
        return shares, None
    # b L^2 = c + a L  at the crossing (the positive root)
    roots = [r.real for r in np.roots([b, -a, -c]) if abs(r.imag) < 1e-9 and r.real > 0]
    crossing = min(roots) if roots else None
    return shares, crossing if crossing is not None and crossing <= 4 * max(lengths) else None


@dataclasses.dataclass(frozen=True)
class LengthSweep:
    """What the sweep found, per length measured."""

    lengths: tuple[int, ...]
    flops: tuple[float, ...]
    quadratic: tuple[float, ...]
    ms: tuple[float, ...]
    crossing: float | None

    def advice(self) -> str:
        """A paragraph for the report: how cost grows with length, and what to serve."""
        first, last = self.lengths[0], self.lengths[-1]
        growth = self.ms[-1] / self.ms[0] if self.ms[0] else float("nan")
        where = (f"the term that grows with the square of the length (attention's QK^T and weighted V) reaches half "
                 f"of the FLOPs at about {self.crossing:.0f} tokens" if self.crossing else
                 f"the term that grows with the square of the length stays under half of the FLOPs up to "
                 f"{4 * last} tokens ({self.quadratic[-1]:.0%} at {last})")
        buckets = ",".join(str(n) for n in self.lengths)
        return (f"From {first} to {last} tokens one call at batch 1 went from {self.ms[0]:.2f} to {self.ms[-1]:.2f} ms "
                f"({growth:.1f}x for {last // first}x the tokens) and the FLOPs per example from "
                f"{number(self.flops[0], 3)} to "
                f"{number(self.flops[-1], 3)}; {where}. Padding a short request to a long one pays the long "
                f"one's cost: "
                f"batch requests of similar length together (`tfperf load MODEL --lengths {first}:{last} "
                f"--length-buckets {buckets}` measures the buckets against padding to the longest within a budget).")


def length_sweep(subject: Subject, rec, options: Options, progress) -> tuple[list[Finding], dict, LengthSweep | None]:
    """FLOPs and batch-1 latency at each of LENGTHS the model takes; ([], what could not be measured, the sweep)."""
    import tensorflow as tf

    from tfperf.measure import Timer, interleave
    from tfperf.models import function_flops

    if not subject.free:
        return [], {}, None
    progress("sequence length")
    graph = tf.function(subject.call)
    lengths, flops, timers, skipped = [], [], [], {}
    for length in LENGTHS:
        at = subject.at(length)
        try:
            tensors = at.pack(to_tensors(make_inputs(at, 1, seed=options.seed, lengths=[length])))
            graph(tensors)  # a length past the model's own limit (its position embedding) fails here
        except Exception as exc:  # noqa: BLE001  (the longest a model takes is a finding, not a failure)
            skipped[f"sequence length {length}"] = f"the model fails at {length} tokens: {first_line(exc)}"
            break
        counted = function_flops(at.fixed().function(batch=1).get_concrete_function())
        lengths.append(length)
        flops.append(float(counted) if counted else float("nan"))
        timers.append(Timer(lambda tensors=tensors: graph(tensors), name=f"{length} tokens", items_per_call=length))
    if len(lengths) < 2:
        return [], skipped, None
    measured = interleave(timers, rounds=options.rounds, min_time_s=options.min_time_s)
    counted = all(np.isfinite(flops))
    shares, crossing = quadratic_share(lengths, flops) if counted else ([float("nan")] * len(lengths), None)
    for n, f, share, m in zip(lengths, flops, shares, measured):
        rec.add(TABLE, f"{n} tokens", {"tokens": n, "flops_per_example": f, "quadratic_share": share,
                                       "ms_per_call": m.median_s * 1e3, "us_per_token": m.median_s * 1e6 / n},
                primary="ms_per_call", lower_is_better=True, measurement=m, versus_first=False)
    return [], skipped, LengthSweep(tuple(lengths), tuple(flops), tuple(shares),
                                    tuple(m.median_s * 1e3 for m in measured), crossing)


def run(ctx: Context) -> Section:
    """The sweep as a section of the report."""
    findings, skipped, sweep = length_sweep(ctx.subject, ctx.recorder, ctx.options, ctx.progress)
    return Section(EXPERIMENT.name, findings, skipped, sweep,
                   detail=f"## Sequence length\n\n{sweep.advice()}\n" if sweep is not None else "")


EXPERIMENT = Experiment(
    name="sequence length", question="How does my Transformer's cost grow with the length of its requests?",
    run=run, applies=lambda subject, options: subject.free_axes == "sequence length")
