"""Feed `tfperf` (inspect, predict, export, doctor) truncated, bit-flipped, oversized and emptied copies of real
exports and inputs.

Run by tests/test_hostile.py in a process of its own (a runtime that crashes on a corrupt file takes only
this driver down, and the last case it printed names the file). Usage: fuzz_driver.py WORKDIR SEED CASES.
Prints one JSON line per case: the command, its exit code, whether a traceback reached the user, and
what it left on disk where it must leave nothing.
"""

import contextlib
import io
import json
import os
import random
import shutil
import sys
import traceback
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    how = rng.choice(["truncate", "flip", "flip", "append", "empty", "zero-run"])
    if how == "truncate":
        return how, data[:rng.randrange(len(data))]
    if how == "flip":
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        return how, bytes(buf)
    if how == "append":
        return how, data + os.urandom(rng.randint(1, 4096))
    if how == "zero-run":
        i = rng.randrange(len(data))
        return how, data[:i] + bytes(min(64, len(data) - i)) + data[i + 64:]
    return how, b""


def tfperf(*args) -> tuple[int, str]:
    from tfperf.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # noqa: BLE001  (what reaches the user as a traceback is the defect to report)
            code = "traceback"
            err.write(traceback.format_exc())
    return code, err.getvalue()


def main() -> int:
    work, seed, cases = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    seeds = json.loads((work / "seeds.json").read_text())  # {"exports": {fmt: folder}, "inputs": [files]}
    for case in range(cases):
        target = rng.choice(["export-file", "input"])
        folder = work / f"case{case}"
        if target == "export-file":
            fmt, source = rng.choice(sorted(seeds["exports"].items()))
            model = Path(shutil.copytree(source, folder / "model"))
            files = sorted(p for p in model.rglob("*") if p.is_file() and p.stat().st_size)
            victim = rng.choice(files)
            how, data = mutate(victim.read_bytes(), rng)
            victim.write_bytes(data)
            x = Path(seeds["inputs"][0])
            what = f"{how} {victim.relative_to(model)} of the {fmt} export"
        else:
            model = Path(seeds["exports"][rng.choice(sorted(seeds["exports"]))])
            source = Path(rng.choice(seeds["inputs"]))
            folder.mkdir(parents=True)
            how, data = mutate(source.read_bytes(), rng)
            x = folder / source.name
            x.write_bytes(data)
            what = f"{how} {source.name}"
        command = rng.choice(["inspect", "predict", "export", "doctor"])
        argv = {"inspect": ["inspect", model], "predict": ["predict", model, "--input", x],
                "export": ["export", model, "--root", folder / "exports", "--sample", x],
                # Its budget spent at once: the doctor reads, checks and reports, and measures nothing.
                "doctor": ["doctor", model, "--sample", x, "--quick", "--budget", "0.01", "--no-threads",
                           "--no-profile", "--out", folder / "exports" / "doctor"]}[command]
        if command in ("export", "doctor") and not (model / "saved_model.pb").exists():
            argv = ["predict", model, "--input", x, "--output", folder / "out.npz"]
        code, err = tfperf(*argv)
        left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                      if code not in (0,) and ("exports" in p.parts or p.name == "out.npz"))
        print(json.dumps({"case": case, "what": what, "argv": [str(a) for a in argv[:1]], "code": code,
                          "traceback": code == "traceback",
                          "lines": sum(line.startswith("tfperf ") for line in err.splitlines()),
                          "stderr": err.strip()[-300:], "left": left}), flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
