"""The steps `tfperf watch --profile-steps N` traced, read with XProf: the share of a step spent waiting for input,
which the step's own time cannot show (Keras' train function reads its batch inside itself)."""

from __future__ import annotations

from typing import Any

from tfperf import extras


def read_input(record: dict[str, Any] | None) -> None:
    """Put XProf's input-pipeline analysis of the traced steps into the process record's `profile` (its `input`),
    or why it could not be read (its `input_error`)."""
    traced = (record or {}).get("profile")
    if not traced or "dir" not in traced or traced.get("error"):
        return
    from tfperf.deploy.errors import first_line  # NumPy, through tfperf.deploy: only where steps were traced
    if not extras.installed("xprof"):
        traced["input_error"] = extras.message("xprof", "reading the traced steps")
        return
    from tfperf.measure.profiles import input_analysis, trace_files

    try:
        found = input_analysis(trace_files(traced["dir"]))
    except Exception as exc:  # noqa: BLE001 - a trace XProf cannot read is said, the rest of the report stands
        traced["input_error"] = f"XProf could not read the trace: {first_line(exc)}"
        return
    if found is None:
        traced["input_error"] = "XProf found no marked step in the trace"
        return
    traced["input"] = {"share": found.median_input_share, "step_ms": found.step_ms, "input_ms": found.input_ms,
                       "steps": found.steps, "conclusion": found.conclusion, "slowest_stage": found.slowest_stage}
