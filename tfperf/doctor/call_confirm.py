"""The best way to call, as code and confirmed: "does the serving code the doctor printed give, run as I run it,
what it claimed?"

The code is what a user pastes: an export command to run once in a shell, then the lines that load and call it (an
exported runtime at its threads), or a `tf.function` with the model's real input signature. The confirmation runs
those lines as printed, in a fresh process (the export made there by its own command), and races the last line, the
call, against the user's own call on the same rows.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfperf.deploy.errors import first_line
from tfperf.deploy.loader import Subject
from tfperf.doctor.experiment import Context, child_command
from tfperf.doctor.options import MIN_GAIN, load_given, model_flags, model_parser

SHELL = "# in a shell: "  # a line of the code block run once in a shell, not in Python
RUNTIME_ROWS = ("LiteRT interpreter", "ONNX Runtime")
TRACED = {"tf.function": "", "tf.function, jit_compile=True": ", jit_compile=True"}
# The user's own call, as lines the confirmation runs (x: the rows, in the structure the model takes).
YOUR_CALL = {"model(x)": ["y = model(x, training=False)"],
             "tf.function": ["serve = tf.function(lambda x: model(x, training=False))", "y = serve(x)"],
             "signature": ["y = call(x)"]}


def _structure_code(fn, structure: Any) -> str:
    if isinstance(structure, dict):
        return "{" + ", ".join(f"{k!r}: {_structure_code(fn, v)}" for k, v in structure.items()) + "}"
    if isinstance(structure, (list, tuple)):
        return "[" + ", ".join(_structure_code(fn, v) for v in structure) + "]"
    return fn(structure)


def signature_code(subject: Subject) -> str:
    """The model's input signature as Python: a tf.TensorSpec per input (batch and free sizes None), in its
    structure."""
    specs = {i.name: f"tf.TensorSpec({[None, *i.declared]}, tf.{i.dtype})" for i in subject.inputs}
    return _structure_code(lambda name: specs[name], subject.structure)


def by_name_code(subject: Subject) -> str:
    """`x` (the rows in the structure the model takes) as arrays by input name, which an export is called with."""
    if isinstance(subject.structure, dict):  # a dict by input name (a SavedModel signature's, always)
        return "x"
    if len(subject.inputs) == 1:
        return f"{{{subject.inputs[0].name!r}: x}}"
    return f"dict(zip({[i.name for i in subject.inputs]!r}, x))"


def code_lines(subject: Subject, row: str, batch: int, threads: int | None, command: str | None,
               table_code: str) -> list[str]:
    """The code that calls the model this way: an export loaded at its threads, a tf.function with the model's input
    signature, or the row's own Apply line."""
    lines = [f"# requests answered in batches of {batch}"] if batch > 1 else []
    if row in RUNTIME_ROWS:
        return [*lines, SHELL + command, "import tfperf.deploy",
                f"serve = tfperf.deploy.load({f'saved_models/{subject.name}/1'!r}, threads={threads or os.cpu_count()})"
                "  # the folder the export printed",
                f"y = tfperf.deploy.predict(serve, {by_name_code(subject)})"]
    if row in TRACED:
        return [*lines, f"signature = [{signature_code(subject)}]",
                f"serve = tf.function(lambda x: model(x, training=False){TRACED[row]}, input_signature=signature)",
                "y = serve(x)"]
    if row == "predict()":
        return [*lines, f"y = model.predict(x, batch_size={batch}, verbose=0)"]
    return [*lines, *(YOUR_CALL.get(row) or table_code.splitlines())]


def confirm_calls(ctx: Context, blocks: Sequence[tuple[int, str, list[str]]], rounds: int) -> list[dict[str, Any]]:
    """Each code block (its batch, the user's call it is raced against, its lines) run as printed in one fresh
    process and raced there against the user's call, `rounds` interleaved rounds: the child's reply for each, or
    {"error": why} for each."""
    from tfperf.measure.processes import ChildError, run_child

    work = ctx.workdir / "calls"
    work.mkdir(parents=True, exist_ok=True)
    (work / "call.json").write_text(json.dumps({
        "model": [ctx.subject.source, *model_flags(ctx.subject, ctx.options), "--seed", str(ctx.options.seed)],
        "blocks": [{"batch": batch, "baseline": YOUR_CALL[baseline], "code": code} for batch, baseline, code in blocks],
        "rounds": rounds, "max_extensions": ctx.options.max_extensions, "min_time_s": ctx.options.min_time_s}))
    ctx.progress("best way to call, confirmed in a fresh process")
    try:
        replies = run_child(child_command("call_confirm", str(work)), who="the confirmation process", timeout=900,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    except ChildError as exc:
        return [{"error": str(exc)} for _ in blocks]
    return replies if isinstance(replies, list) else [replies for _ in blocks]


def run_export(command: str, root: Path) -> None:
    """`tfperf export ...` as the shell runs it, in this process, writing under `root`."""
    import argparse
    from contextlib import redirect_stdout
    from io import StringIO

    from tfperf.deploy.commands import add_commands

    parser = argparse.ArgumentParser(prog="tfperf")
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args([*shlex.split(command)[1:], "--root", str(root)])
    with redirect_stdout(StringIO()):
        if args.func(args) != 0:
            raise RuntimeError(f"{command} failed")


def applied(code: Sequence[str], namespace: dict[str, Any], work: Path, name: str):
    """In the child: the code block's shell lines run (their exports written under `work`), its other lines run in
    `work` as a script there would, and its last line, the call, as a Timer over the rows."""
    from tfperf.measure import Timer

    *setup, call = [line for line in code if not line.startswith("#") or line.startswith(SHELL)]
    here = os.getcwd()
    for line in setup:
        if line.startswith(SHELL):  # from the parent's folder (a model path is relative to it), into `work`
            run_export(line.removeprefix(SHELL), work / "saved_models")
            continue
        os.chdir(work)
        try:
            exec(line, namespace)
        finally:
            os.chdir(here)
    compiled = compile(call, "<the code block's call>", "exec")
    timer = Timer(lambda: exec(compiled, namespace), name=name, items_per_call=namespace["batch"])
    timer.first_call()
    return timer


def race_block(block: dict[str, Any], spec: dict[str, Any], subject, sample, work: Path) -> dict[str, Any]:
    """In the child: one code block and the user's call, each run as written on the same rows, raced."""
    import numpy as np
    import tensorflow as tf

    import tfperf
    from tfperf.deploy.inputs import make_inputs
    from tfperf.measure.rounds import race

    rows = make_inputs(subject, block["batch"], seed=0, sample=sample)
    namespace = {"tf": tf, "np": np, "tfperf": tfperf, "model": subject.model,
                 "call": lambda x: subject.call(tf.nest.map_structure(tf.convert_to_tensor, x)),
                 "x": subject.pack(rows), "batch": block["batch"]}
    try:
        timers = [applied(block["baseline"], dict(namespace), work, "your call"),
                  applied(block["code"], dict(namespace), work, "the code block")]
        (yours, best), (c,) = race(timers, rounds=spec["rounds"], threshold=MIN_GAIN, warmup=0, seed=0,
                                   max_extensions=spec["max_extensions"], min_time_s=spec["min_time_s"])
    except Exception as exc:  # noqa: BLE001  (a block that does not run is the finding, said in one line)
        return {"error": f"{type(exc).__name__}: {first_line(exc)}"}
    return {"describe": c.describe(), "ratio": c.ratio, "ci95": list(c.ci95), "verdict": c.verdict,
            "your_ms": yours.median_s * 1e3, "best_ms": best.median_s * 1e3,
            "your_rows_per_s": yours.items_per_s, "best_rows_per_s": best.items_per_s}


def child(argv: list[str]) -> int:
    """`WORK`: each code block raced against the user's call; the comparisons replied, in the blocks' order."""
    from tfperf.measure.processes import reply

    work = Path(argv[0])
    spec = json.loads((work / "call.json").read_text())
    try:
        subject, sample = load_given(model_parser("call_confirm").parse_args(spec["model"]))
    except Exception as exc:  # noqa: BLE001  (a model the child cannot load: said for every block)
        print(reply({"error": f"{type(exc).__name__}: {first_line(exc)}"}), flush=True)
        return 0
    print(reply([race_block(block, spec, subject, sample, work) for block in spec["blocks"]]), flush=True)
    return 0
