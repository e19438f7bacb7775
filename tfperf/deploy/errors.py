"""What goes wrong with a model, an export or an input: one error each, and their one-line messages."""

from __future__ import annotations

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
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(_WHERE)] or lines
    return (said[0] if said else type(exc).__name__)[:limit]
