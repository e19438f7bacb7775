"""How long `tfperf doctor --quick` takes on models nobody here wrote, experiment by experiment.

Run:   .venv/bin/python benchmarks/doctor_speed.py            (about six minutes on 2 CPU cores)
Needs: what `make install` installs; nothing is downloaded (Keras Applications with weights=None).

The goal (issue 22): every experiment, the thread sweep included, within 180 s on a quiet 2-core
machine, for MobileNetV2 at 96x96 and ResNet50 at 64x64. Each model runs in a fresh process, as a
user runs it; the doctor's own report gives the time per experiment, printed here side by side.
"""

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {"MobileNetV2 96x96": ("MobileNetV2", (96, 96, 3)), "ResNet50 64x64": ("ResNet50", (64, 64, 3))}
GOAL_S = 180


def build(name: str, shape: tuple, path: Path) -> None:
    """The Keras Applications model with random weights, saved as a .keras file (in its own process)."""
    code = (f"import keras; keras.applications.{name}(input_shape={shape}, weights=None)"
            f".save({str(path)!r})")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, (name, shape) in MODELS.items():
            path = Path(tmp) / f"{name.lower()}.keras"
            build(name, shape, path)
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "tfperf", "doctor", str(path), "--quick", "--out",
                                   str(Path(tmp) / f"doctor-{name}")], capture_output=True, text=True,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            wall = time.perf_counter() - started
            found = re.search(r"Doctor took (\d+) s(?: \(goal[^)]*\))?: (.*)\.$", done.stdout, re.MULTILINE)
            if done.returncode != 0 or not found:
                print(f"{label}: doctor failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
                return 1
            skipped = re.search(r"^Not measured:\n\n((?:- .*\n)+)", done.stdout, re.MULTILINE)
            rows.append((label, int(found[1]), wall, found[2], skipped[1].strip() if skipped else "none"))
    print(f"| model | doctor's own time | wall time (with start-up) | per experiment | not measured |\n"
          f"|---|---|---|---|---|")
    for label, took, wall, parts, skipped in rows:
        print(f"| {label} | {took} s ({'within' if took <= GOAL_S else 'OVER'} the {GOAL_S} s goal) | "
              f"{wall:.0f} s | {parts} | {skipped} |")
    return 0 if all(took <= GOAL_S for _, took, *_ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
