"""`tfperf watch -- python train.py`: the user's run, as it runs, and where its time and memory went.

`probe` runs inside the watched program (standard library only, loaded by path through `boot/sitecustomize.py`);
`findings` reads what it recorded into sentences that follow from the numbers; `command` runs the program and
writes the report.
"""

from tfperf.watch.session import session

__all__ = ["session"]
