"""Where the time goes: the doctor's profile pass, apart from every recorded sample, read through XProf.

Each variant traced is a timer an experiment has already measured; the trace is taken after its race,
kept under --out/traces for TensorBoard or XProf, and read with XProf's own conversions
(`tfperf.measure.profiles`): the top operations by self time, how much of a call lies outside them
(Python, dispatch, the executor: framework overhead), the FLOP/s achieved against the matmul rate, the
peak memory of TensorFlow's allocators and, for training, the profiler's own step breakdown and
input-bound verdict. `largest_batch` finds the largest batch within a memory budget by trying.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tfperf.measure.profiles import InputAnalysis, OpTime, by_type, input_analysis, op_times, ops_table, peak_memory
from tfperf.measure.profiles import trace_files
from tfperf.records.units import number

PROFILE_TABLE = "where the time goes (profile pass)"
MEMORY_TABLE = "peak memory (profile pass)"
TRACE_TARGET_S = 0.2  # traced calls per variant: enough to fill this long, within the bounds below
MIN_CALLS, MAX_CALLS = 3, 50
MAX_BATCH = 1 << 16  # the doubling stops here even within the budget


def host_and_device(peaks: Mapping[str, int]) -> tuple[int | None, int | None]:
    """The largest host allocator's peak and the largest GPU allocator's peak (None when there is none)."""
    host = [b for name, b in peaks.items() if "gpu" not in name.lower()]
    device = [b for name, b in peaks.items() if "gpu" in name.lower()]
    return (max(host) if host else None), (max(device) if device else None)


def megabytes(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**20:,.1f} MB"


@dataclasses.dataclass(frozen=True)
class Profiled:
    """One variant traced: where its time went, and its peak memory."""

    label: str
    trace: str  # the folder holding the trace
    calls: int  # calls traced (a call: one inference, or one training epoch)
    steps_per_call: int  # training steps in a call (1 for inference)
    call_s: float  # a call's median time, measured without the profiler
    ops: tuple[OpTime, ...]
    peak_bytes: Mapping[str, int]
    flops_per_call: float | None
    matmul_flops_per_s: float
    input: InputAnalysis | None = None

    @property
    def op_s_per_call(self) -> float:
        """The operations' self time in one call (their sum: ops run in parallel can exceed the call)."""
        return sum(o.self_s for o in self.ops) / self.calls

    @property
    def overhead_share(self) -> float:
        """The share of a call outside TensorFlow's operations: Python, dispatch, the executor."""
        return max(0.0, 1 - self.op_s_per_call / self.call_s)

    @property
    def flops_per_s(self) -> float | None:
        return self.flops_per_call / self.call_s if self.flops_per_call else None

    def describe(self, limit: int = 5) -> str:
        """A paragraph and the top operations, in Markdown."""
        per = "step" if self.steps_per_call > 1 else "call"
        call_ms, op_ms = self.call_s / self.steps_per_call * 1e3, self.op_s_per_call / self.steps_per_call * 1e3
        words = [f"**{self.label}**: {number(call_ms, 3)} ms per {per} (timed without the profiler); TensorFlow's "
                 f"operations ran {number(op_ms, 3)} ms of it (their self time in the trace)"]
        if self.input is not None:  # the input pipeline's ops run on threads beside the step's
            words.append(": the input pipeline's work and the model's are both in that sum (the step breakdown "
                         "below says how much of a step waits for input)")
        elif op_ms >= call_ms:
            words.append(": ops overlap on the thread pools and cover the whole call, so it is compute-bound")
        else:
            words.append(f": {self.overhead_share:.0%} of the {per} is framework overhead (Python, dispatch, the "
                         f"executor)" + (", which larger batches or fewer, larger calls amortize"
                                         if self.overhead_share >= 0.3 else ""))
        if self.flops_per_s:
            share = self.flops_per_s / self.matmul_flops_per_s
            words.append(f"; {number(self.flops_per_s / 1e9, 3)} GFLOP/s achieved, {share:.0%} "
                         f"of the {self.matmul_flops_per_s / 1e9:.0f} GFLOP/s matmul rate measured now" if share <= 1
                         else f"; {number(self.flops_per_s / 1e9, 3)} GFLOP/s by TensorFlow's count, more than the "
                              f"{self.matmul_flops_per_s / 1e9:.0f} GFLOP/s matmul rate measured now, which a limit "
                              f"cannot be (a defect of the count or of the rate, not a result)")
        host, device = host_and_device(self.peak_bytes)
        words.append(f"; peak memory of TensorFlow's allocators {megabytes(host)} on the host"
                     + (f", {megabytes(device)} on the GPU" if device is not None else ""))
        types = ", ".join(f"{t} {share:.0%}" for t, _, share in by_type(self.ops)[:4])
        lines = ["".join(words) + f". By op type: {types}.", "", ops_table(self.ops, limit)]
        if self.input is not None:
            a = self.input
            lines += ["", f"The profiler's step breakdown ({a.steps} steps): {number(a.step_ms, 3)} ms per "
                          f"step, of which "
                          f"{number(a.input_ms, 3)} ms waiting for input ({a.input_share:.0%}), "
                          f"{number(a.host_compute_ms, 3)} ms "
                          f"compute on the host, {number(a.other_ms, 3)} ms other. XProf says: \"{a.conclusion}\""
                          + (f" Slowest input stage: {a.slowest_stage}." if a.slowest_stage else "")]
        lines += ["", f"Trace: `{self.trace}` (open with `tensorboard --logdir` or XProf)."]
        return "\n".join(lines)


FITS = "fits"
UNSEEN = "too small for the profiler's memory view: counted as fitting"
HOST_UNSEEN = ("TensorFlow's host allocator does not show in this process's traces (a 16 MB result left no "
               "peak): it shows when oneDNN is on, which TensorFlow leaves off on CPUs without AVX-512. Run the "
               "doctor with TF_ENABLE_ONEDNN_OPTS=1 in the environment to measure peaks (those of oneDNN's kernels).")


@dataclasses.dataclass(frozen=True)
class BatchFit:
    """The largest batch found within a memory budget, and the tries that found it."""

    what: str
    budget_bytes: int
    largest: int | None  # None: batch 1 does not fit
    tries: tuple[tuple[int, int | None, str], ...]  # (batch, peak bytes or None, "fits" / why not)
    place: str  # "host" or "GPU": the memory the budget is held against
    resolution: int  # the largest batch is within this many of the first that does not fit
    unmeasured: str | None = None  # why no batch was tried: the allocator does not show in this process's traces

    def describe(self) -> str:
        if self.unmeasured:
            return f"Memory budget {megabytes(self.budget_bytes)} ({self.what}): not measured. {self.unmeasured}"
        tried = ", ".join(f"{b} ({megabytes(p) if p is not None else 'unseen' if why == UNSEEN else why})"
                          for b, p, why in self.tries)
        if any(why == UNSEEN for _, _, why in self.tries):
            tried += f" (unseen: {UNSEEN})"
        if self.largest is None:
            return (f"Memory budget {megabytes(self.budget_bytes)} ({self.what}, {self.place} memory): not even batch "
                    f"1 fits. Tried: {tried}.")
        fits = {b: p for b, p, why in self.tries if why in (FITS, UNSEEN)}
        over = [b for b, _, why in self.tries if why not in (FITS, UNSEEN)]
        limit = (f"the first that does not fit is {min(b for b in over if b > self.largest)}" if over
                 else f"the search stopped at {MAX_BATCH:,}")
        return (f"Memory budget {megabytes(self.budget_bytes)} ({self.what}, peak of TensorFlow's {self.place} "
                f"allocator in one traced call per batch size): the largest batch that fits is **{self.largest}** "
                f"(peak {megabytes(fits[self.largest])}); {limit}. Found by trying: doubling from 1 until a batch "
                f"went over, then bisecting to within {self.resolution}. Tried, in order: {tried}.")


class ProfilePass:
    """The doctor's traces: each of a timer already measured, under `root`, read through XProf; it records
    what it finds in tables of its own and keeps the time it takes."""

    def __init__(self, root: Path, recorder, facts: Mapping[str, Any]):
        self.root, self.recorder, self.facts = Path(root), recorder, facts
        self.found: list[Profiled] = []
        self.peaks: dict[str, Mapping[str, int]] = {}
        self.failed: dict[str, str] = {}
        self.took_s = 0.0

    def trace(self, timer, label: str, folder: str, *, call_s: float, flops_per_call: float | None,
              steps_per_call: int = 1, calls: int | None = None) -> Profiled | None:
        """Trace more calls of a measured timer (about TRACE_TARGET_S of them, unless `calls`) and read it."""
        started = time.perf_counter()
        try:
            calls = calls or min(MAX_CALLS, max(MIN_CALLS, math.ceil(TRACE_TARGET_S / max(call_s, 1e-6))))
            where = timer.profile(self.root / folder, steps=calls)
            paths = trace_files(where)
            found = Profiled(label, str(where), calls, steps_per_call, call_s, tuple(op_times(paths)),
                             peak_memory(paths), flops_per_call, self.facts["matmul_flops_per_s"],
                             input_analysis(paths) if steps_per_call > 1 else None)
        except Exception as exc:  # a trace XProf cannot read is a gap in the report, not a failed run
            self.failed[f"profile of {label}"] = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
            return None
        finally:
            self.took_s += time.perf_counter() - started
        self.found.append(found)
        self.peaks[label] = found.peak_bytes
        top = found.ops[0] if found.ops else None
        self._record_memory(label, found.peak_bytes)
        per_step = found.steps_per_call
        self.recorder.add(PROFILE_TABLE, label, {
            "ms_per_step": call_s / per_step * 1e3, "op_ms_per_step": found.op_s_per_call / per_step * 1e3,
            "framework_overhead_share": found.overhead_share,
            "gflops_per_s": found.flops_per_s / 1e9 if found.flops_per_s else None,
            "top_op": top.name if top else None, "top_op_type": top.type if top else None,
            "top_op_share": top.share if top else None,
            "input_share": found.input.input_share if found.input else None,
            "trace": found.trace}, primary="ms_per_step", lower_is_better=True, versus_first=False)
        return found

    def peak(self, timer, label: str, folder: str) -> Mapping[str, int] | None:
        """The peak memory of one more call of a measured timer, traced."""
        started = time.perf_counter()
        try:
            peaks = peak_memory(trace_files(timer.profile(self.root / folder, steps=1)))
        except Exception as exc:
            self.failed[f"peak memory of {label}"] = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
            return None
        finally:
            self.took_s += time.perf_counter() - started
        self.peaks[label] = peaks
        self._record_memory(label, peaks)
        return peaks

    def _record_memory(self, label: str, peaks: Mapping[str, int]) -> None:
        host, device = host_and_device(peaks)
        if host is None and device is None:
            self.failed[f"peak memory of {label}"] = "the trace holds no allocator's memory profile"
            return
        metrics = {"peak_host_mb": host / 2**20 if host is not None else None}
        if device is not None:
            metrics["peak_gpu_mb"] = device / 2**20
        self.recorder.add(MEMORY_TABLE, label, metrics, primary="peak_host_mb", lower_is_better=True,
                          versus_first=False)


def host_allocator_visible(root: Path) -> bool:
    """Whether this process's TensorFlow host allocator shows in a trace's memory profile: a 16 MB result is made
    and traced. With oneDNN off (TensorFlow's default on CPUs without AVX-512) nothing shows, at any size."""
    import tensorflow as tf

    from tfperf.measure import Timer

    size = tf.constant(1 << 22)
    filled = tf.function(lambda n: tf.fill([n], 2.0) * 3.0)  # sized by an input: nothing for Grappler to fold
    timer = Timer(lambda: tf.reduce_sum(filled(size)), name="allocator-probe")  # kept: a scalar, not 16 MB
    timer.start(warmup=0)
    host, _ = host_and_device(peak_memory(trace_files(timer.profile(root, steps=1))))
    return host is not None


def largest_batch(run_at: Callable[[int], Callable[[], Any]], budget_bytes: int, root: Path, *, what: str,
                  bytes_per_example: int = 0) -> BatchFit:
    """The largest batch whose call stays within `budget_bytes` of TensorFlow's memory, found by trying:
    batch 1, 2, 4, ... until one goes over (by its traced peak, or by running out of memory), then
    bisecting between the last that fit and the first that did not, to within 1/8 of the former.

    `run_at(batch)` builds the call at that batch (inputs included); its first call traces and is not
    measured. A batch whose inputs alone exceed the budget is not tried.
    """
    import tensorflow as tf

    from tfperf.measure import Timer

    tries: list[tuple[int, int | None, str]] = []
    place = "GPU" if tf.config.list_physical_devices("GPU") else "host"
    if place == "host" and not host_allocator_visible(root / "probe"):
        # Every batch would be unseen and so counted as fitting, up to the last: an answer with nothing under it.
        return BatchFit(what, budget_bytes, None, (), place, 1, unmeasured=HOST_UNSEEN)

    def fits(batch: int) -> bool:
        if bytes_per_example * batch > budget_bytes:
            tries.append((batch, None, "its inputs alone exceed the budget"))
            return False
        try:
            timer = Timer(run_at(batch), name=f"batch-{batch}")
            timer.start(warmup=0)
            host, device = host_and_device(peak_memory(trace_files(timer.profile(root, steps=1))))
        except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
            tries.append((batch, None, f"out of memory: {type(exc).__name__}"))
            return False
        peak = device if place == "GPU" else host
        if peak is None:  # seen here at small batches on the CPU: the memory profile lists no allocator at all
            tries.append((batch, None, UNSEEN))
            return True
        tries.append((batch, peak, FITS if peak <= budget_bytes else "over budget"))
        return peak <= budget_bytes

    low, high = 0, None
    batch = 1
    while batch <= MAX_BATCH:
        if not fits(batch):
            high = batch
            break
        low, batch = batch, batch * 2
    resolution = 1
    if high is not None and low:
        resolution = max(1, low // 8)
        while high - low > resolution:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
    return BatchFit(what, budget_bytes, low or None, tuple(tries), place, resolution)
