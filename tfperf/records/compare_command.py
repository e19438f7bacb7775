"""`tfperf compare A B`: two runs row by row, each change judged against the run-to-run noise (a calibration, or
the runs' own repeats), with the recipes' headlines side by side; exit 1 when a row regressed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tfperf.flags import UserError

# Where `tfperf run --repeat 3 --out calibration` leaves a calibration of run-to-run noise, read by default.
CALIBRATION = "calibration"


def fraction(text: str) -> float:
    """A non-negative fraction such as 0.05."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number such as 0.05, got {text!r}") from None
    if not 0 <= value < 10:
        raise argparse.ArgumentTypeError(f"must be between 0 and 10, got {text}")
    return value


def add_command(sub) -> None:
    """Add `compare` to the `tfperf` subcommands."""
    comp = sub.add_parser("compare", help="two runs row by row; exit 1 when a row regressed beyond the run-to-run "
                                          "noise")
    comp.add_argument("a", help="run A, the baseline: a results folder (with its repeats) or a .jsonl file")
    comp.add_argument("b", help="run B: a results folder or a .jsonl file")
    comp.add_argument("--calibration", metavar="DIR",
                      help=f"the noise that judges the rows: the --out folder of `tfperf run --repeat 3` (default: A "
                           f"or B when it holds repeated runs, else ./{CALIBRATION} when it exists; none: do "
                           f"without)")
    comp.add_argument("--threshold", type=fraction, default=None,
                      help="smallest change that counts, as a fraction (default 0.05 with a calibration, 0.25 "
                           "without)")
    comp.set_defaults(func=cmd_compare)


def calibration_at(path: str | None, *, default: bool = False):
    """The calibration at `path`; None when there is none and `path` is only the default place to look."""
    from tfperf.records.noise import load_calibration

    if path is None or path.lower() == "none" or (default and not Path(path).exists()):
        return None
    try:
        return load_calibration(path)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _runs(path: str) -> list:
    """The runs at `path` (a results folder with its repeats, or a records file), or one line."""
    from tfperf.records.runs import read_runs

    try:
        return read_runs(path)
    except FileNotFoundError as exc:
        raise UserError(str(exc).strip("'\"")) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(str(exc)) from None


def _pick_calibration(args: argparse.Namespace, a: list, b: list):
    """What judges the rows: --calibration; else A's or B's own repeated runs; else ./calibration."""
    from tfperf.records.noise import measure_noise

    if args.calibration is not None:
        return calibration_at(args.calibration)
    for path, runs in ((args.a, a), (args.b, b)):
        if len(runs) >= 2:
            return measure_noise(runs, path)
    return calibration_at(CALIBRATION, default=True)


def print_comparison(result, a: str, b: str) -> None:
    """The comparison as `tfperf compare` prints it: what judges, the rows, the headlines, the sums."""
    from tfperf.records.compare import IMPROVED
    from tfperf.records.report import fmt

    if result.noise is not None:
        print(f"calibration: {result.noise.describe()}: a row changed only beyond what runs of the same code "
              f"differ by there (false discoveries held at 5% over all rows) and by more than "
              f"{result.threshold:.0%}")
    else:
        print(f"no calibration: rows judged by the samples within each run, which do not see run-to-run noise, so "
              f"a change counts only beyond {result.threshold:.0%} (`tfperf run --repeat 3 --out {CALIBRATION}` "
              f"measures this machine's noise, and compare then uses it)")
    for name, (va, vb) in {**result.env_differences, **result.args_differences}.items():
        print(f"warning: {name} differs: {va!r} in A, {vb!r} in B; the rows are judged all the same", file=sys.stderr)
    for name, (vc, vb) in result.calibration_differences.items():
        print(f"warning: {name} differs: {vc!r} in the calibration, {vb!r} in B: its noise may not be this "
              f"machine's", file=sys.stderr)
    runs = "" if result.runs == (1, 1) else f" (geometric means over {result.runs[0]} and {result.runs[1]} runs)"
    print(f"\n| table | row | metric | A | B{runs} | B vs A (95%) | noise (A/A 95%) | p | change |\n"
          f"|---|---|---|---|---|---|---|---|---|")
    for r in result.rows:
        ci = f" ({r.ci95[0]:.2f}-{r.ci95[1]:.2f})" if r.ci95 else ""
        p = "-" if r.p_value is None else "<0.001" if r.p_value < 0.001 else f"{r.p_value:.3g}"
        noise = (f"+-{r.noise - 1:.0%}; the change is {r.share_of_noise:.1f} of it" if r.share_of_noise is not None
                 else "-")
        status = r.status + (" (no samples)" if r.ci95 is None else "")
        print(f"| {r.key[0]}: {r.key[1]} | {r.key[2]} | {r.metric} | {fmt(r.a, r.metric)} | {fmt(r.b, r.metric)} | "
              f"{r.ratio:.3f}x{ci} | {noise} | {p} | {status} |")
    for label, keys in (("only in A", result.only_in_a), ("only in B", result.only_in_b)):
        for key in keys:
            print(f"{label}: {' / '.join(key)}")
    for line in result.metric_mismatches:
        print(f"not compared: {line}")
    if result.headlines:
        print("\n| recipe | A | B | A's rerun range | B inside it | verdicts | CPU time stolen, A / B |\n"
              "|---|---|---|---|---|---|---|")
        for h in result.headlines:
            value = lambda x: x.value_text(x.value) if x.value is not None else x.figure  # noqa: E731
            rerun = h.a.range_text(*h.rerun) if h.rerun else "-"
            inside = {True: "yes", False: "NO", None: "-"}[h.inside]
            verdicts = h.a.verdict if h.verdicts_agree else f"{h.a.verdict} / {h.b.verdict}"
            stolen = " / ".join("-" if s is None else f"{s:.1%}" for s in h.stolen)
            print(f"| {h.recipe} | {value(h.a)} | {value(h.b)} | {rerun} | {inside} | {verdicts} | {stolen} |")
        judged = [h for h in result.headlines if h.inside is not None]
        agree = sum(h.verdicts_agree for h in result.headlines)
        print(f"headlines: B's figure inside A's rerun range for {sum(h.inside for h in judged)} of {len(judged)}; "
              f"verdicts agree for {agree} of {len(result.headlines)}")
    if result.geometric_mean is not None:
        print(f"geometric mean of B vs A: {result.geometric_mean:.3f}x over {len(result.rows)} rows")
    improved = [r for r in result.rows if r.status == IMPROVED]
    print(f"{len(improved)} improved, {len(result.regressions)} regressed beyond "
          f"{'the noise and ' if result.noise is not None else ''}{result.threshold:.0%}, "
          f"{len(result.rows) - len(improved) - len(result.regressions)} without a change that counts")


def cmd_compare(args: argparse.Namespace) -> int:
    """Row by row, how run B compares with run A; exit 1 when a row regressed beyond the noise."""
    from tfperf.records.compare import compare_runs

    a, b = _runs(args.a), _runs(args.b)
    result = compare_runs(a, b, threshold=args.threshold, noise=_pick_calibration(args, a, b))
    if not result.rows and not result.metric_mismatches:
        recipes = lambda runs: sorted({r["recipe"] for r in runs[0].records})  # noqa: E731
        raise UserError(f"{args.a} ({', '.join(recipes(a))}) and {args.b} ({', '.join(recipes(b))}) share no "
                        f"(recipe, table, row): nothing to compare")
    print_comparison(result, args.a, args.b)
    if result.regressions:
        print("regressed: " + "; ".join(f"{r.key[0]}: {r.key[1]} / {r.key[2]} ({1 / r.ratio:.2f}x worse)"
                                        for r in result.regressions), file=sys.stderr)
        return 1
    return 0


