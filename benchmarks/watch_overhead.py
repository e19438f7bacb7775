"""What does `tfperf watch` cost a run, and does it change its results? (issue 72)

Run:   .venv/bin/python benchmarks/watch_overhead.py              (about 4 minutes on 2 CPU cores)
       .venv/bin/python benchmarks/watch_overhead.py --rounds 4   (shorter, wider intervals)
Needs: what `make install` installs; nothing is downloaded.

A training script written the way users write them (a small MLP whose steps take about a millisecond, the worst
case for a per-step probe: a validation split, a callback of its own, Keras' progress bar, then predict() on the
whole set), seeded and deterministic, is run in fresh processes, plain and under `tfperf watch`, in interleaved
rounds. The script times its own fit() and predict(); each process's wall time is taken from outside. Printed: the
medians side by side, watched over plain with a 95% interval (bootstrap over whole rounds), and whether the final
losses and predictions are bit for bit the same.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tfperf.measure.stats import ratio_ci

SCRIPT = '''
import json, sys, time
import numpy as np
import keras
import tensorflow as tf

keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
rng = np.random.default_rng(0)
x = rng.random((8192, 32), dtype=np.float32)
y = (x[:, :4].sum(axis=1) > 2).astype("int64")


class Count(keras.callbacks.Callback):  # a callback of the user's own: cheap, called every batch
    seen = 0

    def on_train_batch_end(self, batch, logs=None):
        Count.seen += 1


model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
started = time.perf_counter()
history = model.fit(x, y, batch_size=32, epochs=4, validation_split=0.1, callbacks=[Count()], verbose=1)
fit_s = time.perf_counter() - started
started = time.perf_counter()
predictions = model.predict(x, batch_size=256, verbose=0)
predict_s = time.perf_counter() - started
print("RESULT " + json.dumps({"fit_s": fit_s, "predict_s": predict_s, "loss": history.history["loss"][-1],
                              "val_loss": history.history["val_loss"][-1], "checksum": float(predictions.sum())}))
'''


def run(cmd: list[str], cwd: Path) -> tuple[dict, float]:
    """One fresh process: the script's own figures and the process's wall time."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - started
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="watch-overhead-") as tmp:
        folder = Path(tmp)
        (folder / "train.py").write_text(SCRIPT)
        plain_cmd = [sys.executable, "train.py"]
        watched_cmd = [sys.executable, "-m", "tfperf", "watch", "--out", "report", "--", *plain_cmd]
        runs = {"plain": [], "watched": []}
        for r in range(args.rounds):
            for name, cmd in (("plain", plain_cmd), ("watched", watched_cmd))[:: 1 if r % 2 == 0 else -1]:
                runs[name].append(run(cmd, folder))
            print(f"round {r + 1}/{args.rounds}: fit {runs['plain'][-1][0]['fit_s']:.2f} s plain, "
                  f"{runs['watched'][-1][0]['fit_s']:.2f} s watched", file=sys.stderr)
        report = (folder / "report" / "report.md").read_text().splitlines()[2]
    print(f"{args.rounds} interleaved rounds, fresh processes; watched / plain (above 1: the watch costs time)\n")
    print(f"{'':24}{'plain':>10}{'watched':>10}   ratio (95% CI)")
    for label, read in (("fit() (script's clock)", lambda rw: rw[0]["fit_s"]),
                        ("predict() (script's)", lambda rw: rw[0]["predict_s"]),
                        ("process wall time", lambda rw: rw[1])):
        plain, watched = [read(x) for x in runs["plain"]], [read(x) for x in runs["watched"]]
        ratio, (low, high) = ratio_ci(watched, plain, rounds=args.rounds)
        med = sorted(plain)[len(plain) // 2], sorted(watched)[len(watched) // 2]
        print(f"{label:24}{med[0]:>9.2f}s{med[1]:>9.2f}s   {ratio:.3f} ({low:.3f}-{high:.3f})")
    same = {k: len({x[0][k] for x in runs["plain"] + runs["watched"]}) == 1 for k in ("loss", "val_loss", "checksum")}
    print(f"\nfinal loss, val_loss and predictions identical in all {2 * args.rounds} runs: {same}")
    print(f"the last watched run's headline: {report}")


if __name__ == "__main__":
    main()
