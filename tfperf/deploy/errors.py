"""What goes wrong with a model, an export or an input: one error each, and their one-line messages."""

from __future__ import annotations

import re
from collections.abc import Iterable


class ExportError(ValueError):
    """An export that must not happen as asked (a version that exists, a bad name, an op a format lacks)."""


class ModelError(ValueError):
    """A model that cannot be used: missing, not a model, corrupt, unsafe, or without the signature asked for."""


class InputError(ValueError):
    """Input that does not fit the model's inputs: the message names the expected spec."""


def listed(names: Iterable[object], limit: int = 5, width: int = 60) -> str:
    """Names for a one-line message: the first `limit`, each cut to `width` characters, and how many more
    ('a, b, c, d, e and 199,995 more'): an error about what a file holds must stay one readable line."""
    names = [str(n) for n in names]
    shown = [n if len(n) <= width else n[:width - 3] + "..." for n in names[:limit]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more:,} more" if more else "")


# Lines of TensorFlow's op errors that say where, not what: the cause is the first line after them.
_WHERE = ("Graph execution error", "Detected at node", "<stack traces unavailable>", "File ", "[[")


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first non-empty line that says what went wrong, for one-line error messages."""
    return said_line(str(exc), limit) or type(exc).__name__


def said_line(text: str, limit: int = 200) -> str:
    """The first non-empty line of an error's text that says what went wrong (not where), at most `limit`
    characters: a reason that fits a table cell or a one-line message ('' for none). Text that opens with the
    error's type ('InvalidArgumentError: Graph execution error:') keeps the type before the line that says what."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    typed = re.match(r"(\w+(?:Error|Exception|Exit)): (.*)", lines[0]) if lines else None
    if typed:
        lines[0] = typed[2]
    said = [line for line in lines if line and not line.startswith(_WHERE)
            and line != "Traceback (most recent call last):"]
    line = (said or lines or [""])[0]
    line = f"{typed[1]}: {line}" if typed else line
    return line if len(line) <= limit else line[:limit - 3] + "..."
