"""Does the doctor's one training recommendation capture the speed that is there? (issue 71)

Run:   .venv/bin/python benchmarks/best_configuration.py        (about 30 minutes on 2 CPU cores)
       .venv/bin/python benchmarks/best_configuration.py --models mlp --rows 1024   (one model, smaller)
Needs: what `make install` installs; nothing is downloaded.

For three models written the way users write them (a conv net on 28x28 images, a tabular MLP of three Dense layers,
a two-block Transformer encoder with residual adds), each saved to a file outside the repository:

1. `tfperf doctor MODEL --quick --train --loss sparse_categorical_crossentropy --from-logits`, in a fresh process as
   a user runs it; the code block it printed is read from its report.
2. An exhaustive search of the same knobs in a plain Keras script (a fresh process): every combination of
   jit_compile (off, on), steps_per_execution (1, 16, 64), the mixed policy (none, this machine's), and the batch
   (32 to 512), each loaded from the file and trained on the same rows: a first epoch, then three timed epochs; the
   fastest median is the search's best.
3. One more fresh process: plain fit, the doctor's code block applied as printed (the user's optimizer and loss stand
   in as Adam(1e-3) and the model's loss) and the search's best, trained from the same weights an epoch at a time in
   interleaved rounds: each against plain fit with a 95% interval, the recommendation against the best, and the
   doctor's own claim beside what this measured.
"""

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = 10
SCREEN_EPOCHS = 3
KNOBS = {"jit_compile": (False, True), "steps_per_execution": (1, 16, 64), "policy": (None, "mixed"),
         "batch": (32, 64, 128, 256, 512)}

MODELS = '''
import keras


def cnn():
    x = keras.Input((28, 28, 1))
    h = keras.layers.MaxPooling2D()(keras.layers.Conv2D(32, 3, activation="relu")(x))
    h = keras.layers.MaxPooling2D()(keras.layers.Conv2D(64, 3, activation="relu")(h))
    h = keras.layers.Dense(128, activation="relu")(keras.layers.Flatten()(h))
    return keras.Model(x, keras.layers.Dense(10)(h))


def mlp():
    x = keras.Input((64,))
    h = keras.layers.Dense(256, activation="relu")(keras.layers.Dense(256, activation="relu")(x))
    return keras.Model(x, keras.layers.Dense(10)(h))


def transformer(length=32, vocab=1000, dim=64, heads=4, blocks=2):
    tokens = keras.Input((length,), dtype="int32")
    x = keras.layers.Embedding(vocab, dim)(tokens)
    for _ in range(blocks):
        x = keras.layers.LayerNormalization()(x + keras.layers.MultiHeadAttention(heads, dim // heads)(x, x))
        f = keras.layers.Dense(dim)(keras.layers.Dense(4 * dim, activation="relu")(x))
        x = keras.layers.LayerNormalization()(x + f)
    return keras.Model(tokens, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(x)))
'''


def saved_models(folder: Path, names: list[str]):
    """MODELS written to `folder` as a user's module, each model built and saved by it in a fresh process, as a user's
    script saves one: (name, path of its .keras file), one at a time."""
    (folder / "user_models.py").write_text(MODELS)
    for name in names:
        path = folder / f"{name}.keras"
        subprocess.run([sys.executable, "-c", f"import user_models; user_models.{name}().save({str(path)!r})"],
                       cwd=folder, check=True, capture_output=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        yield name, path


def run_json(argv: list[str]) -> dict:
    """A fresh process of this script (or tfperf) whose last line of output is JSON."""
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed: {done.stderr.strip().splitlines()[-3:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(model, count: int, seed: int = 0):
    """Rows the model takes (token ids below the vocabulary for the Transformer) and class ids for its outputs."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = (count, *model.inputs[0].shape[1:])
    x = rng.integers(0, 1000, shape).astype("int32") if "int" in model.inputs[0].dtype else rng.normal(
        size=shape).astype("float32")
    return x, rng.integers(0, model.outputs[0].shape[-1], count)


def arm(path: str, lines: list[str], x, y):
    """The model loaded from its file and `lines` applied to it as a script applies them: its epoch function."""
    import types

    import keras

    import tfperf.precision
    from tfperf.train import fit_epochs

    keras.utils.set_random_seed(0)
    space = {"keras": keras, "tfperf": tfperf, "model": keras.saving.load_model(path), "x": x, "y": y,
             "optimizer": keras.optimizers.Adam(1e-3),
             "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
    *setup, fit = lines
    for line in setup:
        exec(line, space)
    said = {}
    exec(fit, {**space, "model": types.SimpleNamespace(fit=lambda *a, **k: said.update(k))})
    return fit_epochs(space["model"], x, y, shuffle=False, **said)[0]


def config_lines(config: dict, mixed: str) -> list[str]:
    """A combination of the knobs as the lines a user writes (the learning rate scaled as the doctor scales it)."""
    lines = [f"model = tfperf.precision.under_policy(model, {mixed!r})"] if config["policy"] else []
    if config["batch"] != 32:
        lines.append(f"optimizer.learning_rate = 1e-3 * {(config['batch'] / 32) ** 0.5}")
    keywords = (", jit_compile=True" if config["jit_compile"] else "") + (
        f", steps_per_execution={config['steps_per_execution']}" if config["steps_per_execution"] > 1 else "")
    return [*lines, f"model.compile(optimizer=optimizer, loss=loss{keywords})",
            f"model.fit(x, y, batch_size={config['batch']})"]


def screen(path: str, count: int) -> dict:
    """Every combination: a first epoch, then SCREEN_EPOCHS timed ones; their medians by combination."""
    import keras
    import numpy as np

    from tfperf.gpus import mixed_policy_here

    mixed = mixed_policy_here() or "mixed_float16"
    x, y = rows(keras.saving.load_model(path), count)
    found = []
    for values in itertools.product(*KNOBS.values()):
        config = dict(zip(KNOBS, values))
        try:
            epoch = arm(path, config_lines(config, mixed), x, y)
            epoch()
            seconds = float(np.median([epoch().seconds for _ in range(SCREEN_EPOCHS)]))
        except Exception as exc:  # noqa: BLE001  (a combination this model cannot take is left out, said)
            found.append({"config": config, "error": f"{type(exc).__name__}"})
            continue
        found.append({"config": config, "examples_per_s": count / seconds, "lines": config_lines(config, mixed)})
    return {"screened": found, "mixed": mixed}


def race(path: str, count: int, arms: dict) -> dict:
    """The arms from the same weights, an epoch of each in turn: each against plain fit and the rest as asked."""
    import keras

    from tfperf.measure import Timer, interleave, versus

    x, y = rows(keras.saving.load_model(path), count)
    timers = [Timer(arm(path, lines, x, y), name=name, items_per_call=count) for name, lines in arms.items()]
    for t in timers:
        t.start(warmup=0)
    by = {m.name: m for m in interleave(timers, rounds=ROUNDS, samples=ROUNDS, warmup=0)}
    said = {}
    for a, b in (("plain fit", "doctor"), ("plain fit", "search's best"), ("search's best", "doctor")):
        c = versus(by[a], by[b])
        said[f"{b} vs {a}"] = {"ratio": c.ratio, "ci95": list(c.ci95), "describe": c.describe()}
    return {"compared": said, "examples_per_s": {n: m.items_per_s for n, m in by.items()}}


def doctor_block(path: Path, out: Path) -> tuple[list[str], str, str, float]:
    """`tfperf doctor --quick --train` as a user runs it: the code block it printed, its claim, what its own
    confirmation in a fresh process said, and the seconds it took (--quick's goal is 3 minutes)."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tfperf", "doctor", str(path), "--quick", "--train", "--loss",
                           "sparse_categorical_crossentropy", "--from-logits", "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode != 0:
        raise SystemExit(f"doctor failed on {path.name}: {done.stderr.strip().splitlines()[-2:]}")
    # The training answer alone, up to the next answer (another section's confirmation is not its own).
    answer = done.stdout.split("**Best configuration for training**: ", 1)[1].split("\n**", 1)[0]
    claim = answer.split("\n", 1)[0]
    confirmed = re.search(r"Confirmed as applied: [^:]*: ([^(]*\([^)]*\))", answer)
    block = re.search(r"```python\n(.*?)\n```", answer, flags=re.S)
    lines = [line.split("  #", 1)[0] for line in block.group(1).splitlines()] if block else [
        "model.compile(optimizer=optimizer, loss=loss)", "model.fit(x, y, batch_size=32)"]
    return lines, claim, confirmed.group(1) if confirmed else "not confirmed", time.perf_counter() - began


def ratio(text: str) -> float:
    """The speedup a describe() line states: "1.43x faster (...)" -> 1.43; "no measurable difference" -> 1."""
    found = re.search(r"([\d.]+)x (faster|slower)", text)
    return 1.0 if not found else float(found[1]) if found[2] == "faster" else 1 / float(found[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["cnn", "mlp", "transformer"])
    p.add_argument("--rows", type=int, default=2048, help="examples an epoch trains on in the plain scripts")
    p.add_argument("--role", choices=["screen", "race"])
    p.add_argument("--path")
    p.add_argument("--arms")
    p.add_argument("--keep", type=Path, help="a folder to keep each doctor's report in (default: none kept)")
    args = p.parse_args()
    if args.role == "screen":
        print(json.dumps(screen(args.path, args.rows)))
        return 0
    if args.role == "race":
        print(json.dumps(race(args.path, args.rows, json.loads(args.arms))))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in saved_models(Path(tmp), args.models):
            lines, claim, confirmed, took = doctor_block(path, (args.keep or Path(tmp)) / f"doctor-{name}")
            me = [__file__, "--path", str(path), "--rows", str(args.rows)]
            screened = run_json([*me, "--role", "screen"])
            ok = [s for s in screened["screened"] if "error" not in s]
            best = max(ok, key=lambda s: s["examples_per_s"])
            plain = config_lines(dict(jit_compile=False, steps_per_execution=1, policy=None, batch=32), "")
            raced = run_json([*me, "--role", "race", "--arms", json.dumps(
                {"plain fit": plain, "doctor": lines, "search's best": best["lines"]})])
            c, speed, best_name = raced["compared"], raced["examples_per_s"], "search's best"
            doctor, top, gap = (c["doctor vs plain fit"], c[f"{best_name} vs plain fit"],
                                c[f"doctor vs {best_name}"])
            print(f"{name}: the doctor's claim ({took:.0f} s for --quick --train): {claim}")
            print(f"  the doctor's code block: {' | '.join(lines)}")
            print(f"  the search's best of {len(ok)} combinations ({len(screened['screened']) - len(ok)} failed): "
                  f"{best['config']}")
            print(f"  measured here, {args.rows} rows an epoch, {ROUNDS} interleaved rounds: doctor "
                  f"{doctor['describe']}; the search's best {top['describe']}; the doctor against the best: "
                  f"{gap['describe']}")
            print(f"  the doctor's recommendation reached {doctor['ratio'] / top['ratio']:.2f} of the best's gain "
                  f"over plain fit ({speed['doctor']:,.0f} against {speed[best_name]:,.0f} examples/s; plain fit "
                  f"{speed['plain fit']:,.0f})")
            print(f"  the doctor's claim {ratio(claim):.2f}x against {doctor['ratio']:.2f}x measured here: "
                  f"{ratio(claim) / doctor['ratio'] - 1:+.0%}; its own confirmation in a fresh process said "
                  f"{confirmed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
