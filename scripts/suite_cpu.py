"""Where the test suite's CPU goes: pytest run with every Python process it starts logging its own CPU time.

    .venv/bin/python scripts/suite_cpu.py -- -q -n 2 --dist loadgroup

Runs pytest with those arguments, a `sitecustomize` on PYTHONPATH that logs, as each Python process exits, its
argv, CPU seconds, whether it imported TensorFlow, and the test it ran under (pytest's PYTEST_CURRENT_TEST, which
children inherit), then prints the tests whose processes cost the most. Two suites of this machine: two workers
keep 1.8 cores busy, so the suite's time is its CPU, and one `import tensorflow` is 6-7 CPU-s of it.
Not seen: processes that end by os._exit or a signal (multiprocessing's forks, killed ranks), and those
started with PYTHONPATH removed (test_install's fresh environments). Nothing is written outside a temporary folder.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SITECUSTOMIZE = '''
import atexit, json, os, resource, sys


def _log():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open(os.environ["TFPERF_SUITE_CPU_LOG"], "a") as log:  # one short line per process: appends interleave whole
            log.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
                                  "argv": sys.argv[:3], "tensorflow": "tensorflow" in sys.modules,
                                  "cpu_s": usage.ru_utime + usage.ru_stime}) + "\\n")
    except (KeyError, OSError):
        pass


atexit.register(_log)
'''


def summary(lines: list[dict], top: int) -> str:
    """The tests whose processes took the most CPU, and the totals."""
    by_test = collections.defaultdict(lambda: [0, 0, 0.0])
    for line in lines:
        row = by_test[line["test"] or "(pytest's own processes: the in-process tests)"]
        row[0] += 1
        row[1] += line["tensorflow"]
        row[2] += line["cpu_s"]
    out = [f"{len(lines)} Python processes, {sum(x['tensorflow'] for x in lines)} importing TensorFlow, "
           f"{sum(x['cpu_s'] for x in lines):,.0f} CPU-s", "", "| CPU-s | processes | with TensorFlow | test |",
           "|---|---|---|---|"]
    for test, (n, tf, cpu) in sorted(by_test.items(), key=lambda kv: -kv[1][2])[:top]:
        out.append(f"| {cpu:.1f} | {n} | {tf} | {test} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=30, help="tests to list (default 30)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: pytest's arguments")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as folder:
        (Path(folder) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        log = Path(folder) / "processes.jsonl"
        env = {**os.environ, "TFPERF_SUITE_CPU_LOG": str(log),
               "PYTHONPATH": os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))}
        pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
        code = subprocess.call([sys.executable, "-m", "pytest", *pytest_args], env=env)
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    print(summary(lines, args.top))
    return code


if __name__ == "__main__":
    sys.exit(main())
