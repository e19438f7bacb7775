"""Horovod's timeline (`horovodrun --timeline-filename FILE`) read into negotiation, all-reduce and waits.

Rank 0 writes the timeline as Chrome's trace format: one "process" per tensor, a `NEGOTIATE_<OP>` span while the
ranks report that the tensor is ready (an instant tick per rank, named by its number), then the operation's span
(`ALLREDUCE`, `BROADCAST`, ...) with its activities nested inside it (`QUEUE`, `MEMCPY_IN_FUSION_BUFFER`,
`GLOO_ALLREDUCE`, `WAIT_FOR_DATA`, ...). Tensors overlap (fused into one message), so each phase's time here is
the wall-clock union over all tensors, never a sum. Plain JSON: no Horovod and no TensorFlow is needed to read it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

NEGOTIATE = "NEGOTIATE_"
# Activities in which a rank waits for its own framework rather than for the network.
WAITS = ("WAIT_FOR_DATA", "WAIT_FOR_OTHER_TENSOR_DATA")


class TimelineError(ValueError):
    """The file is not a Horovod timeline this module can read."""


def read_events(path: str | Path) -> list[dict]:
    """The timeline's events. Horovod closes the JSON array after every event, so a file cut short by a killed
    job is read up to its last whole event."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TimelineError(f"cannot read {path}: {exc}") from None
    try:
        events = json.loads(text)
    except json.JSONDecodeError:
        cut = text.rfind("}")
        try:
            events = json.loads(text[:cut + 1].rstrip().rstrip(",") + "]") if cut > 0 else None
        except json.JSONDecodeError:
            events = None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise TimelineError(f"{path} is not a Horovod timeline (a JSON array of trace events): write one with "
                            f"`horovodrun --timeline-filename FILE ...`")
    return events


@dataclasses.dataclass(frozen=True)
class Span:
    """One span of one tensor: a negotiation, an operation, or an activity inside an operation."""

    tensor: str
    name: str
    start_us: int
    end_us: int
    operation: str | None = None  # the operation an activity belongs to; None for a top-level span
    ready: tuple[tuple[int, int], ...] = ()  # a negotiation's (rank, time) ticks, in order


def spans(events: Iterable[dict]) -> list[Span]:
    """Each tensor's spans from its begin and end events (an end closes the latest open span of that tensor);
    spans still open when the file ends are left out."""
    names, open_spans, found = {}, collections.defaultdict(list), []
    for e in events:
        pid, phase = e.get("pid"), e.get("ph")
        if phase == "M" and e.get("name") == "process_name":
            names[pid] = e.get("args", {}).get("name", str(pid))
        elif phase == "B":
            open_spans[pid].append([e.get("name", "?"), int(e["ts"]), []])
        elif phase == "X" and open_spans[pid] and str(e.get("name", "")).isdigit():
            open_spans[pid][-1][2].append((int(e["name"]), int(e["ts"])))  # a rank said it is ready
        elif phase == "E" and open_spans[pid]:
            name, start, ticks = open_spans[pid].pop()
            parent = open_spans[pid][0][0] if open_spans[pid] else None
            found.append(Span(names.get(pid, str(pid)), name, start, int(e["ts"]), parent, tuple(ticks)))
    return found


def union_us(intervals: Iterable[tuple[int, int]]) -> int:
    """Microseconds covered by any of the intervals (overlaps counted once)."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total, end = total + stop - start, stop
        elif stop > end:
            total, end = total + stop - end, stop
    return total


@dataclasses.dataclass(frozen=True)
class TimelineSplit:
    """Where a Horovod run's collective time went, in wall-clock seconds over the whole timeline."""

    span_s: float  # first event to last
    tensors: int
    operations: dict[str, int]  # operation -> how many were done (all tensors)
    steps: int  # the steps this covers: given, or the most common count of operations per repeated tensor
    negotiation_s: float  # ranks reporting tensors ready, until all had
    negotiations: int
    waiting_for_last_rank_s: float  # within negotiations: from the first rank's report to the last one's
    last_rank: dict[int, int]  # rank -> negotiations (of those with the ranks' reports) in which it reported last
    operation_s: float  # the operations themselves, activities included
    activities: dict[str, float]  # activity -> seconds, largest first
    collectives_s: float  # negotiation or operation under way for any tensor

    @property
    def waits_s(self) -> float:
        """Time in the activities that wait for the framework's own data (WAIT_FOR_DATA and the like)."""
        return sum(s for name, s in self.activities.items() if name in WAITS)

    def per_step_ms(self, seconds: float) -> float:
        return seconds / max(self.steps, 1) * 1e3

    def describe(self) -> list[str]:
        """The split in sentences, with the change each part calls for when it is the largest."""
        share = lambda s: f"{s / self.span_s:.0%} of the run" if self.span_s else "-"  # noqa: E731
        per = lambda s: f"{s:.2f} s, {self.per_step_ms(s):.2f} ms a step"  # noqa: E731
        ops = ", ".join(f"{n} {name.lower()}" for name, n in sorted(self.operations.items(), key=lambda i: -i[1]))
        lines = [f"{self.span_s:.2f} s of timeline, {self.tensors} tensors, {ops}, about {self.steps} steps: "
                 f"collectives under way {per(self.collectives_s)} ({share(self.collectives_s)})"]
        last = sorted(self.last_rank.items(), key=lambda i: -i[1])
        named = sum(self.last_rank.values())
        late = (f"; rank {last[0][0]} reported last in {last[0][1]} of the {named} negotiations of {self.negotiations} "
                f"that record each rank's report (Horovod's response cache skips the reports of tensors it has seen)"
                if last else "")
        lines.append(f"negotiation {per(self.negotiation_s)}; of it waiting for the last rank to be ready "
                     f"{per(self.waiting_for_last_rank_s)}{late}")
        parts = ", ".join(f"{name} {s:.2f} s" for name, s in self.activities.items())
        lines.append(f"operations {per(self.operation_s)}" + (f": {parts}" if parts else ""))
        lines.append(f"waiting for the framework's data (WAIT_FOR_DATA and the like) {per(self.waits_s)}")
        lines.append(self.advice())
        return lines

    def advice(self) -> str:
        """What the largest part calls for."""
        transfer = sum(s for name, s in self.activities.items() if name not in WAITS)
        wait_rank, overhead = self.waiting_for_last_rank_s, self.negotiation_s - self.waiting_for_last_rank_s
        largest = max((wait_rank, "rank"), (overhead, "negotiation"), (transfer, "transfer"),
                      (self.waits_s, "data"))[1]
        if not self.collectives_s:
            return "No collective took measurable time: the run is its ranks' own computing."
        return {
            "rank": "Most of it is ranks waiting for the slowest one: a rank with less to do or a slower device "
                    "(its input pipeline, a busy core, a shard larger than the others) holds up every step; even "
                    "out the work before tuning the all-reduce.",
            "negotiation": "Most of it is coordination, not waiting nor data: many small tensors negotiated one "
                           "cycle at a time; raise HOROVOD_CYCLE_TIME or HOROVOD_FUSION_THRESHOLD so that more "
                           "gradients go in one message, or run more steps per all-reduce (a larger batch).",
            "transfer": "Most of it is moving the gradients: a faster link, gradients sent in 16 bits "
                        "(`hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)`), or a larger "
                        "batch per rank (fewer all-reduces per example) shrink it.",
            "data": "Most of it is Horovod waiting for the framework to produce the tensors: the gradients are "
                    "late, not the network; look at the step's own computing.",
        }[largest]


def split(events: Sequence[dict], steps: int | None = None) -> TimelineSplit:
    """The timeline's events read into negotiation (and the wait for the last rank), operations (by activity)
    and waits, each the union over tensors; `steps` defaults to the most common count of operations per tensor
    among those done more than once."""
    found = spans(events)
    times = [int(e["ts"]) for e in events if "ts" in e]
    if not found or not times:
        raise TimelineError("the timeline holds no finished negotiation or operation: was the job's first "
                            "collective done before it stopped?")
    negotiations = [s for s in found if s.operation is None and s.name.startswith(NEGOTIATE)]
    operations = [s for s in found if s.operation is None and not s.name.startswith(NEGOTIATE)]
    activities = collections.defaultdict(list)
    for s in found:
        if s.operation is not None:
            activities[s.name].append((s.start_us, s.end_us))
    last_rank = collections.Counter()
    waits = []
    for s in negotiations:
        if len({rank for rank, _ in s.ready}) > 1:
            ticks = sorted(s.ready, key=lambda t: t[1])
            last_rank[ticks[-1][0]] += 1
            waits.append((ticks[0][1], ticks[-1][1]))
    # Each gradient is all-reduced once a step: the most common count among tensors done more than once (the
    # start's broadcasts, once each, are many more tensors).
    per_tensor = collections.Counter(s.tensor for s in operations)
    repeated = collections.Counter(n for n in per_tensor.values() if n > 1)
    usual = repeated.most_common(1)[0][0] if repeated else 1
    seconds = lambda spans_: union_us((s.start_us, s.end_us) for s in spans_) / 1e6  # noqa: E731
    by_activity = {name: union_us(iv) / 1e6 for name, iv in activities.items()}
    return TimelineSplit(
        span_s=(max(times) - min(times)) / 1e6, tensors=len({s.tensor for s in found}),
        operations=dict(collections.Counter(s.name for s in operations)), steps=steps or usual,
        negotiation_s=seconds(negotiations), negotiations=len(negotiations),
        waiting_for_last_rank_s=union_us(waits) / 1e6,
        last_rank=dict(last_rank), operation_s=seconds(operations),
        activities=dict(sorted(by_activity.items(), key=lambda i: -i[1])),
        collectives_s=seconds([*negotiations, *operations]))


def read_split(path: str | Path, steps: int | None = None) -> TimelineSplit:
    """`split` of the timeline file at `path`; TimelineError for events that are not Horovod's."""
    events = read_events(path)
    try:
        return split(events, steps)
    except TimelineError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise TimelineError(f"{path} holds trace events Horovod does not write ({type(exc).__name__}: {exc}): "
                            f"give the file `horovodrun --timeline-filename` wrote") from None
