"""What goes wrong with a model, an export or an input: one error each, and their one-line messages."""

from __future__ import annotations


class ExportError(ValueError):
    """An export that must not happen as asked (a version that exists, a bad name, an op a format lacks)."""


class ModelError(ValueError):
    """A model that cannot be used: missing, not a model, corrupt, unsafe, or without the signature asked for."""


class InputError(ValueError):
    """Input that does not fit the model's inputs: the message names the expected spec."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first non-empty line, for one-line error messages."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]
