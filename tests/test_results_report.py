"""Records carry the environment, round-trip through JSON lines, and become tables, charts and a report."""

import json

import pytest

from tfperf.report import bar_chart, build_report, compare, markdown_table, speedup, write_conclusion
from tfperf.results import Recorder, environment, make_record, read_records, write_records

ENV = {"cpu": "test cpu", "cores": 2, "gpus": [], "python": "3.11", "tensorflow": "2.21.0",
       "keras": "3", "tfperf": "0.1.0", "git_commit": None}


def rec(row, value, *, table="t", lower=True, recipe="demo"):
    return make_record(recipe, table, row, {"ms": value, "note": "x"}, primary="ms",
                       lower_is_better=lower, args={"quick": True}, env=ENV)


def test_environment_names_what_a_figure_depends_on():
    env = environment()
    for key in ("tensorflow", "keras", "python", "cpu", "cores", "gpus", "intra_op_threads",
                "xla_auto_jit", "tfperf", "git_commit"):
        assert key in env
    assert env["cores"] >= 1 and env["tensorflow"].startswith("2.")
    json.dumps(env)


def test_record_needs_its_primary_metric():
    with pytest.raises(ValueError, match="primary"):
        make_record("r", "t", "row", {"a": 1}, primary="b", lower_is_better=True, env=ENV)


def test_records_round_trip_atomically(tmp_path):
    path = write_records(tmp_path / "demo.jsonl", [rec("a", 2.0), rec("b", 1.0)])
    back = read_records(path)
    assert [r["row"] for r in back] == ["a", "b"] and back[1]["metrics"]["ms"] == 1.0
    assert back[0]["env"]["cpu"] == "test cpu" and back[0]["args"] == {"quick": True}
    assert [p.name for p in tmp_path.iterdir()] == ["demo.jsonl"]  # no temporary file left behind


def test_malformed_records_are_named_by_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rec("a", 1.0)) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_records(bad)
    bad.write_text('{"recipe": "r"}\n')
    with pytest.raises(ValueError, match="lacks"):
        read_records(bad)


def test_speedup_respects_the_metric_direction():
    assert speedup(rec("b", 1.0), rec("a", 4.0)) == 4.0
    assert speedup(rec("b", 1.0, lower=False), rec("a", 4.0, lower=False)) == 0.25


def test_markdown_table_has_a_speedup_column_against_the_first_row():
    table = markdown_table([rec("slow", 4.0), rec("fast", 1.0)])
    lines = table.splitlines()
    assert lines[0] == "|  | ms | note | speedup vs slow |"
    assert lines[2].endswith("| 1.00x |") and lines[3].endswith("| 4.00x |")
    assert markdown_table([rec("only", 2.0)]).splitlines()[0] == "|  | ms | note |"  # nothing to compare with
    cases = [make_record("demo", "t", r, {"ms": 1.0}, primary="ms", lower_is_better=True, env=ENV,
                         versus_first=False) for r in ("case a", "case b")]
    assert "speedup" not in markdown_table(cases)


def test_bar_chart_writes_a_png(tmp_path):
    path = bar_chart([rec("a", 1.0), rec("b", 1000.0)], tmp_path / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_gathers_tables_figures_and_conclusions(tmp_path):
    write_records(tmp_path / "demo.jsonl", [rec("a", 2.0), rec("b", 1.0), rec("c", 3.0, table="u")])
    write_conclusion(tmp_path, "demo", "b is twice as fast as a.")
    text = build_report(tmp_path).read_text()
    assert "## demo" in text and "### t" in text and "### u" in text
    assert "figures/demo-t.png" in text and (tmp_path / "figures" / "demo-t.png").exists()
    assert "demo-u.png" not in text and not (tmp_path / "figures" / "demo-u.png").exists()  # one row, no chart
    assert "b is twice as fast as a." in text and "test cpu (2 cores)" in text


def test_report_without_records_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="--out"):
        build_report(tmp_path)


def test_compare_matches_rows_and_gives_ratios():
    rows = compare([rec("a", 2.0), rec("b", 1.0)], [rec("a", 1.0), rec("z", 5.0)])
    assert rows == [("demo: t", "a", "ms", 2.0, 1.0, 2.0)]


def test_recorder_keeps_tables_apart(tmp_path):
    r = Recorder("demo", {"quick": True})
    r.add("t", "a", {"ms": 1.0}, primary="ms", lower_is_better=True)
    r.add("u", "b", {"ms": 2.0}, primary="ms", lower_is_better=True)
    assert [x["row"] for x in r.table("u")] == ["b"]
    assert len(read_records(r.save(tmp_path))) == 2
