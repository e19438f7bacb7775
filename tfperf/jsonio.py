"""JSON from files a user hands over, read within bounds: a size cap, and a nesting depth checked before
parsing (Python's parser recurses, so a config nested a million deep is a RecursionError, not an error)."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

MAX_BYTES = 64 * 2**20  # a Keras config or a metadata file is kilobytes; records files stay well under this
MAX_DEPTH = 200  # Keras configs nest a few dozen levels (a model inside a layer inside a model ...)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string, escapes included: its brackets do not nest
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def nesting_depth(text: str) -> int:
    """The deepest nesting of [ and { in JSON text, brackets inside strings not counted. In C-speed passes (regular
    expressions, then a cumulative sum), not a Python loop per character: a server checks every request's body."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text) if '"' in text else text)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets.encode("ascii"), np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return max(int(np.cumsum(steps).max()), 0)


def loads(text: str | bytes, where: str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parsed JSON, or a ValueError in one line naming `where` and the bound it passes."""
    if len(text) > max_bytes:
        raise ValueError(f"{where} holds {len(text):,} bytes of JSON, more than the {max_bytes:,} it may")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{where} is not UTF-8 text") from None
    # Text with no more openings than the bound cannot nest past it: a request's small JSON header (KServe v2's
    # binary tensors) skips the check, which costs 10 us on it, most of what parsing it costs.
    depth = nesting_depth(text) if text.count("[") + text.count("{") > max_depth else 0
    if depth > max_depth:
        raise ValueError(f"{where} nests {depth} levels deep, more than the {max_depth} it may")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{where} is not valid JSON ({str(exc).splitlines()[0][:120]})") from None
