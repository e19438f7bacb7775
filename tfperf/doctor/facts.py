"""What the model is, measured once per run: its parameters, inputs and outputs, FLOPs per example, the matmul rate
of this machine now, and each row's MFU against it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tfperf.deploy.inputs import check_runs, make_inputs
from tfperf.deploy.loader import Subject
from tfperf.gpus import tensorflow_gpus


def model_facts(subject: Subject, *, quick: bool, sample: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Parameters, FLOPs per example (counted by TensorFlow), inputs and outputs, and the compute limit at
    the matmul rate measured now; InputError when the model fails on the inputs doctor will give it."""
    from tfperf.measure import peak_matmul_flops_per_s
    from tfperf.models import function_flops

    outputs = check_runs(subject, make_inputs(subject, 2, seed=0, sample=sample))
    # The roof the recipes use (all cores, sizes up to one that reaches the library's peak), at --quick too: a
    # 512 matmul alone stays well under it, and MFU over a low roof came out above 100%.
    rate = peak_matmul_flops_per_s()
    # At the sizes inputs are made at: a free axis (a sequence's length) has no count of its own.
    model_flops = function_flops(subject.fixed().function(batch=1).get_concrete_function())
    per_example = model_flops / (subject.fixed_batch or 1) if model_flops else None
    facts = {"kind": subject.kind, "parameters": subject.parameters, "weight_bytes": subject.weight_bytes,
             "inputs": [str(i) for i in subject.inputs],
             "outputs": [f"{name}: {o.dtype.name}[batch, {', '.join(map(str, o.shape[1:]))}]".replace(", ]", "]")
                         for name, o in outputs.items()],
             "flops_per_example": per_example, "matmul_flops_per_s": rate, "device": tensorflow_device()}
    if per_example:
        facts["compute_limit_examples_per_s"] = rate / per_example
    return facts


def tensorflow_device() -> str:
    """Where TensorFlow's rows run: its first GPU (by name) or the CPU. LiteRT and ONNX Runtime run on the CPU."""
    gpus = tensorflow_gpus()
    return f"GPU:0 ({gpus[0].name})" if gpus else "CPU"


ABOVE_THE_ROOF = ("above 100% of the matmul rate measured now, which a limit cannot be: the model's FLOPs as "
                  "TensorFlow counts them (direct convolutions) are more than this runtime computes (Winograd or "
                  "other fast convolutions), or the rate was measured low; not reported as an MFU")


def mfu(examples_per_s: float, facts: Mapping[str, Any], *, passes: float = 1.0) -> dict[str, Any]:
    """A row's model FLOPs utilisation: the model's FLOP/s at this rate (`passes` forward passes' worth per
    example: 3 for training) over the matmul rate measured now, as {"mfu": share}; None when the model's FLOPs
    are unknown; a share above 1 is a defect of the count or of the roof, named in "mfu_note", not a result."""
    flops = facts.get("flops_per_example")
    share = passes * flops * examples_per_s / facts["matmul_flops_per_s"] if flops else None
    if share is not None and share > 1.0:
        return {"mfu": None, "mfu_note": ABOVE_THE_ROOF}
    return {"mfu": share}
