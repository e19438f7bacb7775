"""Run recipes/mnist_hvd.py under horovodrun, but rank 1 leaves (exit code 0) after LEAVE_AFTER_STEPS steps.

A stand-in for a worker whose code returns early or calls sys.exit mid-training: the process ends
cleanly, so horovodrun sees no failure from it; only its peers' next all-reduce notices.
"""

import os
import runpy
import sys
from pathlib import Path

import horovod.tensorflow as hvd

import tfperf.data

LEAVE_AFTER_STEPS = int(os.environ.get("LEAVE_AFTER_STEPS", "20"))
real_to_dataset = tfperf.data.to_dataset


class LeavingBatches:
    """The recipe's training batches; rank 1 exits when it asks for one more than it is allowed."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        for taken, batch in enumerate(self.dataset):
            if hvd.rank() == 1 and taken == LEAVE_AFTER_STEPS:
                os._exit(0)
            yield batch


tfperf.data.to_dataset = lambda *args, **kwargs: LeavingBatches(real_to_dataset(*args, **kwargs))
recipe = Path(__file__).resolve().parent.parent / "recipes" / "mnist_hvd.py"
sys.argv = [str(recipe), *sys.argv[1:]]
runpy.run_path(str(recipe), run_name="__main__")
