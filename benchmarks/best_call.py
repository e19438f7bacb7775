"""Does the doctor's best way to call capture the speed that is there? (issue 71, its inference half)

Run:   .venv/bin/python benchmarks/best_call.py                    (about 5 minutes on 2 CPU cores)
       .venv/bin/python benchmarks/best_call.py --models cnn       (one model)
Needs: what `make install` installs; nothing is downloaded.

For the three models of benchmarks/best_configuration.py (a conv net, an MLP, a two-block Transformer), each saved to
a file outside the repository:

1. `tfperf doctor MODEL --quick --no-threads`, in a fresh process as a user runs it; each goal's code block (latency
   at batch 1, throughput at batch 64) and claim read from what it printed.
2. In one more fresh process, every way of calling the model the doctor's search chooses among, each written as the
   code a user writes (call_confirm.code_lines): model(x), tf.function, jit_compile, and LiteRT and ONNX Runtime at
   every thread count, for each goal, raced in interleaved rounds; the fastest is the exhaustive best.
3. In the same process: your call (model(x) at batch 1, tf.function at batch 64), the doctor's block as printed and
   the exhaustive best, raced in interleaved rounds: the block against your call and against the best, with 95%
   intervals, and the doctor's claim beside what this measured.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from best_configuration import ratio, run_json, saved_models  # noqa: E402

ROUNDS = 10
RACE_S = 3.0  # each arm's time in the final race, over its rounds: a 2 ms call read 0.78-2.82x against itself at 0.5 s
GOALS = {"latency": (1, "model(x)"), "throughput": (64, "tf.function")}
ROWS = ("model(x)", "tf.function", "tf.function, jit_compile=True", "LiteRT interpreter", "ONNX Runtime")


def arms(path: str, batch: int) -> dict[str, list[str]]:
    """Every way of calling the model at `batch`, as the code a user writes: an export at each thread count."""
    from tfperf.deploy.loader import load_subject
    from tfperf.doctor.call_confirm import code_lines

    subject = load_subject(path)
    found = {}
    for row in ROWS:
        fmt = {"LiteRT interpreter": "litert", "ONNX Runtime": "onnx"}.get(row)
        for threads in ((1, os.cpu_count() or 1) if fmt else (None,)):
            name = row + (f", {threads} thread{'s' * (threads > 1)}" if threads else "")
            found[name] = code_lines(subject, row, batch, threads, f"tfperf export {path} --format {fmt}", "")
    return found


def timers(path: str, blocks: dict[str, list[str]], batch: int, work: Path) -> list:
    """Each block run as printed (an export command once per command, into `work`), its last line a Timer."""
    import numpy as np
    import tensorflow as tf

    import tfperf
    from tfperf.deploy.inputs import make_inputs
    from tfperf.deploy.loader import load_subject
    from tfperf.doctor.call_confirm import SHELL, applied, run_export

    subject = load_subject(path)
    space = {"tf": tf, "np": np, "tfperf": tfperf, "model": subject.model, "batch": batch,
             "x": subject.pack(make_inputs(subject, batch, seed=0))}
    for command in {line for lines in blocks.values() for line in lines if line.startswith(SHELL)}:
        fmt = re.search(r"--format (\w+)", command)[1]
        if not (work / "saved_models" / fmt).exists():  # one export per format, shared by every block that loads it
            run_export(command.removeprefix(SHELL), work / "saved_models" / fmt)
    found = []
    for name, lines in blocks.items():
        fmt = next((re.search(r"--format (\w+)", line)[1] for line in lines if line.startswith(SHELL)), None)
        here = [line.replace("'saved_models/", f"'{work}/saved_models/{fmt}/") for line in lines
                if not line.startswith(SHELL)]
        found.append(applied(here, dict(space), work, name))
    return found


def measure(path: str, doctor: dict[str, list[str]], work: Path) -> dict:
    """Per goal: every way raced, the fastest named; then your call, the doctor's block and that best raced."""
    from tfperf.measure import interleave, versus

    said = {}
    for goal, (batch, yours) in GOALS.items():
        ways = arms(path, batch)
        screened = {m.name: m for m in interleave(timers(path, ways, batch, work), rounds=6, warmup=0)}
        best = min(screened, key=lambda n: screened[n].median_per_item_s)
        blocks = {"your call": ways[yours], "the doctor's block": doctor[goal], "the exhaustive best": ways[best]}
        by = {m.name: m for m in interleave(timers(path, blocks, batch, work), rounds=ROUNDS, warmup=0,
                                            min_time_s=RACE_S)}
        pairs = (("your call", "the doctor's block"), ("your call", "the exhaustive best"),
                 ("the exhaustive best", "the doctor's block"))
        said[goal] = {"best": best, "ways": len(ways), "same": [line.split("  #", 1)[0] for line in ways[best]]
                      == doctor[goal], **{f"{b} vs {a}": versus(by[a], by[b]).describe()
                                                           for a, b in pairs},
                      "reached": versus(by["the exhaustive best"], by["the doctor's block"]).ratio}
    return said


def doctor_blocks(path: Path, out: Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """`tfperf doctor --quick --no-threads` as a user runs it: each goal's code block and its claim."""
    done = subprocess.run([sys.executable, "-m", "tfperf", "doctor", str(path), "--quick", "--no-threads", "--out",
                           str(out)], capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode != 0:
        raise SystemExit(f"doctor failed on {path.name}: {done.stderr.strip().splitlines()[-2:]}")
    blocks, claims = {}, {}
    for goal in GOALS:
        answer = done.stdout.split(f"**Best way to call for {goal}**: ", 1)[1]
        claims[goal] = answer.split("\n", 1)[0]
        block = re.search(r"```python\n(.*?)\n```", answer.split("**Best way to call", 1)[0], flags=re.S)
        blocks[goal] = [line.split("  #", 1)[0] for line in block.group(1).splitlines()] if block else (
            arms(str(path), GOALS[goal][0])[GOALS[goal][1]])  # nothing recommended: your call stands
    return blocks, claims


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["cnn", "mlp", "transformer"])
    p.add_argument("--role", choices=["measure"])
    p.add_argument("--path")
    p.add_argument("--blocks")
    args = p.parse_args()
    if args.role == "measure":
        with tempfile.TemporaryDirectory() as work:
            print(json.dumps(measure(args.path, json.loads(args.blocks), Path(work))))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in saved_models(Path(tmp), args.models):
            blocks, claims = doctor_blocks(path, Path(tmp) / f"doctor-{name}")
            found = run_json([__file__, "--role", "measure", "--path", str(path), "--blocks", json.dumps(blocks)])
            for goal, got in found.items():
                block, best = got["the doctor's block vs your call"], got["the exhaustive best vs your call"]
                gap = got["the doctor's block vs the exhaustive best"]
                print(f"{name}, {goal}: the doctor's claim: {claims[goal]}")
                print(f"  its block: {' | '.join(blocks[goal])}")
                print(f"  measured here ({ROUNDS} interleaved rounds): against your call, the doctor's block {block}; "
                      f"the exhaustive best of {got['ways']} ways ({got['best']}) {best}")
                same = " (the same way, raced as two arms)" if got["same"] else ""
                print(f"  the doctor's block against the best{same}: {gap} (it reached {got['reached']:.2f} of its "
                      f"speed); the claim {ratio(claims[goal]):.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
