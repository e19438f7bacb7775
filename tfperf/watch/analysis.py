"""A watched run read whole: where its wall time went, every finding by cost, what was not measured (the rules
themselves are in tfperf/watch/findings.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tfperf.watch.findings import (Finding, FitSplit, call_findings, callback_findings, epoch_findings,
                                   first_epoch_findings, fit_loop_findings, fit_split, import_seconds, input_findings,
                                   primary, retrace_findings, traced_input, validation_finding, what_grew)


@dataclasses.dataclass(frozen=True)
class Analysis:
    """A watched run read whole: its split, its findings by cost, what could not be measured."""

    wall_s: float
    process: Mapping[str, Any] | None
    processes: int
    imports_s: float
    fit: FitSplit
    calls_s: float
    findings: list[Finding]
    not_measured: list[str]
    ranks: int = 0  # processes a launcher gave a rank
    functions_s: float = 0.0  # calls of the program's own tf.functions outside fit (a custom loop), tracing included
    input_line: str = ""  # the traced steps' wait for input, where it is no finding (or why it was not read)
    memory_line: str = ""  # what grew with memory over the run, by the census of Python objects


def analyse(processes: Sequence[Mapping[str, Any]], wall_s: float) -> Analysis:
    """The split of the run's wall time and every finding, most costly first."""
    main = primary(processes)
    fits = list(main.get("fits", [])) if main else []
    split = fit_split(fits)
    calls_s = sum(c["seconds"] for c in main.get("calls", {}).values()) if main else 0.0
    found: list[Finding] = []
    traced, input_line = traced_input(main, fits) if main else ([], "")
    if main:
        found = (callback_findings(split) + validation_finding(fits, split) + first_epoch_findings(fits)
                 + input_findings(fits) + traced + fit_loop_findings(fits) + retrace_findings(main.get("traces", []))
                 + call_findings(main)
                 + epoch_findings(fits))
    not_measured = []
    if main is None:
        not_measured.append("no Python process of this run imported TensorFlow or Keras: only its wall time is known")
    elif fits and not any(f.get("input") for f in fits) and not (main.get("profile") or {}).get("input"):
        not_measured.append("waiting for input is inside each step's time (the train function reads its batch "
                            "itself): `tfperf watch --profile-steps 20` traces steps and reads it with XProf; "
                            "`tfperf doctor MODEL --data module:function` races the pipeline alone")
    if main is not None and not main.get("complete"):
        not_measured.append("the process ended before its exit handlers ran (a signal or os._exit): what is "
                            "here was recorded up to its last epoch or call")
    if main is not None and main.get("traces_dropped"):
        not_measured.append(f"{main['traces_dropped']} traces past the first 5,000 were counted, not described")
    return Analysis(wall_s, main, len(processes), import_seconds(main) if main else 0.0, split, calls_s,
                    sorted(found, key=lambda f: -f.seconds), not_measured,
                    len({p["rank"] for p in processes if p.get("rank") is not None}),
                    sum(fn["seconds"] for fn in main.get("functions", {}).values()) if main else 0.0, input_line,
                    what_grew(main, any(x.key == "memory" for x in found)) if main else "")
