"""`python -m tfperf.doctor.child MODULE ARGS...`: one part of a doctor run in a process of its own.

Some parts must run where TensorFlow starts fresh: thread pools and devices are fixed when it runs its first op,
XLA's dump folder and the Keras stack when it is imported, and a cold start is only cold once. Each such module of
tfperf.doctor has `child(argv) -> int`, and its parent starts it with `experiment.child_command(MODULE, ...)`; this
imports only that module before calling it (TensorFlow is imported by the part itself, when it chooses).
"""

from __future__ import annotations

import importlib
import sys


def main(argv: list[str]) -> int:
    """Call tfperf.doctor.MODULE's child(ARGS); a name that is not a doctor part is one line, exit 2."""
    if not argv or not argv[0].isidentifier():
        print("usage: python -m tfperf.doctor.child MODULE ARGS... (started by tfperf doctor)", file=sys.stderr)
        return 2
    try:
        part = importlib.import_module(f"tfperf.doctor.{argv[0]}")
    except ModuleNotFoundError:
        part = None
    if not callable(getattr(part, "child", None)):
        print(f"tfperf.doctor.{argv[0]} runs no part of the doctor in a process of its own", file=sys.stderr)
        return 2
    return part.child(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
