"""What grows with the watched program's memory: the lists, dicts, sets and deques the garbage collector tracks,
by length, counted first once memory has risen from its lowest reading, and again each time it has grown since; a
container that grew is named by what holds it (a local of a running function, a module's global, an object's
attribute). Standard library only, loaded by path as the probe is (tfperf/watch/probe.py)."""

from __future__ import annotations

import collections
import gc
import os
import sys
import time
import types
from typing import Any

FIRST = 16 * 1024 * 1024  # the first count once memory rose this much from its lowest (a run whose memory stays
#                           flat pays nothing)...
GROWTH = 32 * 1024 * 1024  # ...a new count once it grew this much from its lowest since the last count...
SPACING = 20  # ...and this many times the last count's own time has passed (so counting costs 5% at most, and
#                only while memory grows)
LONG = 1000  # a container is named from this many items more than at the first count...
NAMED_BYTES = 8 * 1024 * 1024  # ...or from this many bytes more, its items counted at its last item's size
KEPT = 16  # containers this long are followed (one shorter at the first count is "under 16" then)
TOP_CONTAINERS = 3
_KINDS = frozenset((list, dict, set, collections.deque, collections.OrderedDict, collections.defaultdict))


def _relative(filename: str) -> str:
    try:
        return os.path.relpath(filename)
    except ValueError:
        return filename


def _item(container: Any) -> Any:
    """The newest item of a container (a dict's last value), or None."""
    try:
        if isinstance(container, dict):
            return next(reversed(container.values()))
        if isinstance(container, (list, collections.deque)):
            return container[-1]
        return next(iter(container))
    except (StopIteration, IndexError, TypeError, RuntimeError):
        return None


def _nbytes(item: Any) -> int | None:
    """An array's or tensor's bytes (NumPy's nbytes, or its shape times its dtype's size), else None."""
    try:  # the program's own objects: a property may raise anything
        size = getattr(item, "nbytes", None)
        if isinstance(size, int):
            return size
        count = 1
        for dim in item.shape:
            count *= int(dim)
        return count * int(item.dtype.size)
    except Exception:  # noqa: BLE001 - not array-like: its size is not said
        return None


def _shallow(item: Any) -> int:
    """sys.getsizeof, or 0 where the program's object will not say."""
    try:
        return sys.getsizeof(item, 0)
    except Exception:  # noqa: BLE001
        return 0


def _in_frames(obj: Any) -> str | None:
    """A local variable of a function running now (in any thread) that holds `obj`."""
    for top in sys._current_frames().values():
        frame = top
        while frame is not None:
            if frame.f_code.co_filename != __file__:
                for name, value in list(frame.f_locals.items()):  # a copy: other threads run between items
                    if value is obj:
                        return _local(name, frame)
            frame = frame.f_back
    return None


def _local(name: str, frame: types.FrameType) -> str:
    filename = _relative(frame.f_code.co_filename)
    if frame.f_code.co_name == "<module>":
        return f"the global `{name}` of {filename} (running at line {frame.f_lineno})"
    return f"`{name}` in {frame.f_code.co_name}() (running at {filename}:{frame.f_lineno})"


def _holder(obj: Any, ignore: set[int]) -> str:
    """What holds `obj`, said as a reader finds it in their code."""
    local = _in_frames(obj)
    if local:
        return local
    modules = {id(vars(m)): m for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    fallback = None
    for ref in gc.get_referrers(obj):
        if id(ref) in ignore or isinstance(ref, types.FrameType):
            continue
        if id(ref) in modules:
            module = modules[id(ref)]
            name = next((k for k, v in list(ref.items()) if v is obj), "?")
            return f"the global `{name}` of {_relative(getattr(module, '__file__', None) or module.__name__)}"
        attrs = getattr(ref, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(ref, type):
            name = next((k for k, v in list(attrs.items()) if v is obj), None)
            if name:
                return f"`{name}` of a {type(ref).__name__}"
        if isinstance(ref, dict):
            owner = next((o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref), None)
            name = next((k for k, v in list(ref.items()) if v is obj), None)
            if owner is not None and name:
                return f"`{name}` of a {type(owner).__name__}"
        fallback = fallback or f"an item of a {type(ref).__name__}"
    return fallback or "nothing the census could name"


class Census:
    """Counts taken as memory grows; each after the first says which containers grew since the first."""

    def __init__(self, growth: int = GROWTH, spacing: float = SPACING, first: int = FIRST):
        self.growth, self.spacing, self.first = growth, spacing, first
        self.lengths: dict[int, int] | None = None  # the first count's containers of KEPT items or more, by id
        self.low: int | None = None  # the lowest memory reading since the last count (or since the start)
        self.last_at = 0.0
        self.cost = 0.0

    def due(self, rss: int | None, now: float) -> bool:
        if rss is None:
            return False
        self.low = rss if self.low is None else min(self.low, rss)  # memory falls too (a fit's buffers freed)
        if self.lengths is None:
            return rss - self.low >= self.first
        return rss - self.low >= self.growth and now - self.last_at >= self.spacing * self.cost

    def take(self, rss: int, now: float) -> dict | None:
        """Count now: None for the first count, else the containers that grew since it."""
        started = time.perf_counter()
        objects = gc.get_objects()
        try:
            long = [o for o in objects if type(o) in _KINDS and len(o) >= KEPT]
        finally:
            del objects
        grown = None
        if self.lengths is None:
            self.lengths = {id(o): len(o) for o in long}
        else:
            grown = {"containers": self._containers(long)}
        del long
        self.cost, self.low, self.last_at = time.perf_counter() - started, rss, now
        if grown is not None:
            grown["seconds"] = self.cost
        return grown

    def _containers(self, long: list) -> list[dict]:
        """The containers that grew most since the first count, by items or by their items' bytes."""
        found = []
        for obj in long:
            grew = len(obj) - self.lengths.get(id(obj), 0)
            if grew < KEPT:
                continue
            item = _item(obj)
            size = _nbytes(item)
            grown_bytes = grew * (size if size is not None else _shallow(item))
            if grew >= LONG or grown_bytes >= NAMED_BYTES:
                found.append({"kind": type(obj).__name__, "id": id(obj), "from": self.lengths.get(id(obj)),
                              "to": len(obj), "grew": grew, "item": type(item).__name__ if item is not None else None,
                              "item_bytes": size, "grew_bytes": grown_bytes})
            del item
        found = sorted(found, key=lambda c: -c["grew_bytes"])[:TOP_CONTAINERS]
        held = {id(o): o for o in long if id(o) in {c["id"] for c in found}}
        for c in found:  # named by what holds them: a search of the referrers, done for these few alone
            c["holder"] = _holder(held[c.pop("id")], {id(long), id(held)})
        return found
