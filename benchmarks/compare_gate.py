"""tfperf compare as a CI gate, measured on this machine: how often it cries wolf on two runs of the same code,
and the smallest slowdown it still catches.

Run:   .venv/bin/python benchmarks/compare_gate.py [--pairs 10] [--recipes hybridize saved_model]
       [--hogs 0.25,0.5,0.75] [--out compare-gate]                      (about 20 minutes at the defaults)
Needs: what `make install` installs. Run it on an otherwise idle machine: anything else running is noise.
       Runs already in --out (the calibration, pairs) are kept and counted, so a second call with more --pairs
       adds pairs; --hogs "" skips the A/B part.

1. A calibration: the recipes three times in fresh processes (`tfperf run --quick --repeat 3`).
2. A/A: --pairs pairs of single runs of the same code, each pair compared (`tfperf compare A B`) with the
   calibration, and without one (the samples within each run, at its stated 25%, and at 5%, the old rule):
   how many pairs exit 1. The rate is given with its 95% interval (Wilson) over the pairs.
3. A/B: the same recipes run while a CPU hog takes a share of every core (a process per core, busy for that
   share of every 10 ms), each compared with a clean run of its own: the slowdown it caused (the geometric
   mean over the rows compared), whether compare exits 1, and how many rows it names.
"""

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def tfperf(*args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfperf", *args], capture_output=quiet, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def run(recipes: list[str], out: Path, repeat: int = 1) -> None:
    if out.is_dir() and len(list(out.glob("*.jsonl"))) == len(recipes):
        return  # made by an earlier call: kept
    done = tfperf("run", "--quick", "--only", *recipes, "--out", str(out), "--repeat", str(repeat),
                  "--calibration", "none")
    if done.returncode != 0:
        raise SystemExit(f"tfperf run failed: {done.stderr[-2000:]}")


def compare(a: Path, b: Path, *extra: str) -> tuple[int, int, float]:
    """(exit code, rows called regressed, geometric mean of B vs A) of `tfperf compare A B`."""
    done = tfperf("compare", str(a), str(b), *extra)
    if done.returncode not in (0, 1):
        raise SystemExit(f"tfperf compare failed: {done.stderr[-1000:]}")
    found = re.search(r"(\d+) regressed", done.stdout)
    mean = re.search(r"geometric mean of B vs A: ([0-9.]+)x", done.stdout)
    return done.returncode, int(found[1]) if found else 0, float(mean[1]) if mean else math.nan


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of a rate of `hits` in `n`."""
    if n == 0:
        return 0.0, 1.0
    z, p = 1.959964, hits / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (
        1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def hogs(share: float) -> list[subprocess.Popen]:
    """A process per core, each busy for `share` of every 10 ms."""
    code = ("import time\nbusy, idle = {b}, {i}\nwhile True:\n    end = time.perf_counter() + busy\n"
            "    while time.perf_counter() < end: pass\n    time.sleep(idle)\n").format(b=0.01 * share,
                                                                                      i=0.01 * (1 - share))
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--recipes", nargs="+", default=["hybridize", "saved_model"])
    p.add_argument("--hogs", default="0.25,0.5,0.75", help="shares of every core the hogs take in the A/B runs")
    p.add_argument("--out", default="compare-gate")
    args = p.parse_args()
    out = Path(args.out)
    started = time.perf_counter()

    print(f"calibration: {' '.join(args.recipes)} three times ...", file=sys.stderr, flush=True)
    run(args.recipes, out / "calibration", repeat=3)
    calibration = ["--calibration", str(out / "calibration")]
    alarms = {"calibrated": 0, "uncalibrated (25%)": 0, "uncalibrated at 5% (the old rule)": 0}
    rows = 0
    for k in range(args.pairs):
        print(f"A/A pair {k + 1}/{args.pairs} ...", file=sys.stderr, flush=True)
        a, b = out / f"aa{k}" / "a", out / f"aa{k}" / "b"
        run(args.recipes, a)
        run(args.recipes, b)
        for label, extra in (("calibrated", calibration), ("uncalibrated (25%)", ["--calibration", "none"]),
                             ("uncalibrated at 5% (the old rule)", ["--calibration", "none", "--threshold", "0.05"])):
            code, regressed, _ = compare(a, b, *extra)
            alarms[label] += code == 1
        rows = max(rows, sum(1 for f in a.glob("*.jsonl") for _ in f.open()))
    print(f"\nA/A: {args.pairs} pairs of runs of the same code ({' '.join(args.recipes)}, {rows} rows each)")
    print("| judged | pairs that exit 1 (false alarms) | rate (95% CI) |\n|---|---|---|")
    for label, hits in alarms.items():
        low, high = wilson(hits, args.pairs)
        print(f"| {label} | {hits} of {args.pairs} | {hits / args.pairs:.0%} ({low:.0%}-{high:.0%}) |")

    # Larger calibrations from the runs at hand: the calibration's 3 runs and the first runs of `extra` other pairs
    # (never the pair judged), as if the calibration had been run 3 + extra times, spread over the session.
    for extra in (2, 5, 10):
        if args.pairs <= extra:
            continue
        hits = 0
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(args.pairs):
                folder = Path(tmp) / str(k)
                (folder / "repeats").mkdir(parents=True)
                for f in (out / "calibration").glob("*.jsonl"):
                    (folder / f.name).symlink_to(f.resolve())
                for n in (2, 3):
                    (folder / "repeats" / str(n)).symlink_to((out / "calibration" / "repeats" / str(n)).resolve())
                for n, j in enumerate(range(1, extra + 1), start=4):
                    (folder / "repeats" / str(n)).symlink_to((out / f"aa{(k + j) % args.pairs}" / "a").resolve())
                hits += compare(out / f"aa{k}" / "a", out / f"aa{k}" / "b", "--calibration", str(folder))[0] == 1
        low, high = wilson(hits, args.pairs)
        print(f"| calibrated with {3 + extra} runs (3, and the first runs of {extra} other pairs) | {hits} of "
              f"{args.pairs} | {hits / args.pairs:.0%} ({low:.0%}-{high:.0%}) |")

    print("\nA/B: a CPU hog on every core during run B, each against a clean run A of its own")
    print("| hog's share of each core | slowdown (geometric mean of rows, B vs A) | exit | rows named |\n"
          "|---|---|---|---|")
    for share in (float(s) for s in args.hogs.split(",") if s):
        print(f"A/B with the hogs at {share:.0%} ...", file=sys.stderr, flush=True)
        a, b = out / f"ab{share:g}" / "a", out / f"ab{share:g}" / "b"
        run(args.recipes, a)
        procs = hogs(share)
        try:
            run(args.recipes, b)
        finally:
            for proc in procs:
                proc.kill()
        code, regressed, mean = compare(a, b, *calibration)
        print(f"| {share:.0%} | {1 / mean:.2f}x slower | {code} | {regressed} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
