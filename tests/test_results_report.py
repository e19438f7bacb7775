"""Records carry the environment, round-trip through JSON lines, and become tables, charts and a report."""

import json

import pytest

from tfperf.measure import Measurement, versus
from tfperf.records.report import bar_chart, build_report, markdown_table, speedup, write_conclusion
from tfperf.records.jsonl import Recorder, environment, make_record, read_records, write_records
from tfperf.measure.stats import compare_times

ENV = {"cpu": "test cpu", "cores": 2, "gpus": [], "python": "3.11", "tensorflow": "2.21.0",
       "keras": "3", "tfperf": "0.1.0", "git_commit": None}


def rec(row, value, *, table="t", lower=True, recipe="demo"):
    return make_record(recipe, table, row, {"ms": value, "note": "x"}, primary="ms",
                       lower_is_better=lower, args={"quick": True}, env=ENV)


def test_environment_names_what_a_figure_depends_on():
    import keras  # noqa: F401  (the environment names TensorFlow's and Keras' figures once they are in use)
    import tensorflow  # noqa: F401

    env = environment()
    for key in ("tensorflow", "keras", "python", "cpu", "cores", "gpus", "intra_op_threads",
                "xla_auto_jit", "tfperf", "git_commit", "git_dirty", "load_average", "cpu_frequency", "variables"):
        assert key in env
    assert len(env["load_average"]) == 3 and isinstance(env["git_dirty"], bool)
    assert all(k.startswith(("TF_", "ONEDNN_", "DNNL_", "OMP_", "KMP_", "MKL_", "XLA_", "KERAS_", "CUDA_"))
               for k in env["variables"])
    assert env["cores"] >= 1 and env["tensorflow"].startswith("2.")
    json.dumps(env)


def test_records_carry_the_cpu_time_the_hypervisor_took_while_they_were_taken(tmp_path, monkeypatch):
    """On a shared host a neighbour's burst slows every figure of a run (issue 50: the ladder's speed fell with
    it, r = -0.9 over 40 epochs): the run's records say how much CPU time was stolen meanwhile."""
    from tfperf.records import environment as env_module, jsonl

    assert env_module.stolen_share((10, 1000), (25, 1300)) == 0.05
    assert env_module.stolen_share(None, (25, 1300)) is None and env_module.stolen_share((1, 9), (1, 9)) is None
    readings = iter([(100, 10_000), (130, 10_400)])
    monkeypatch.setattr(jsonl, "cpu_times", lambda: next(readings))
    recorder = Recorder("demo", {})
    recorder.add("t", "a", {"ms": 1.0}, primary="ms", lower_is_better=True)
    [record] = read_records(recorder.save(tmp_path))
    assert record["env"]["cpu_steal"] == 0.075
    stolen, total = env_module.cpu_times() or (0, 1)  # Linux: the machine's own counters
    assert 0 <= stolen <= total


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


def test_a_timed_record_keeps_its_samples_and_the_primary_metrics_interval():
    m = Measurement("fast", tuple(1e-3 * (1 + 0.01 * i) for i in range(20)), items_per_call=10)
    low, high = m.ci95_s
    ms = make_record("demo", "t", "fast", {"ms": m.median_s * 1e3}, primary="ms", lower_is_better=True,
                     env=ENV, measurement=m)
    assert ms["samples_s"] == list(m.samples_s) and ms["n"] == 20
    assert ms["ci95"] == pytest.approx([low * 1e3, high * 1e3])
    rate = make_record("demo", "t", "fast", {"rows_per_s": m.items_per_s}, primary="rows_per_s",
                       lower_is_better=False, env=ENV, measurement=m)
    assert rate["ci95"] == pytest.approx([10 / high, 10 / low])  # the slow end of the time is the low rate
    assert rate["timing"]["block_size"] == 1 and rate["timing"]["warnings"] == []


def measured(row, scale, *, rounds=10):
    samples = tuple(scale * (1 + 0.02 * (i % 7)) for i in range(20))
    return Measurement(row, samples, rounds=rounds)


def test_a_compared_record_carries_ratio_ci_and_verdict_and_the_table_shows_them():
    slow, fast = measured("slow", 2.0), measured("fast", 1.0)
    c = versus(slow, fast)
    records = [make_record("demo", "t", m.name, {"ms": m.median_s * 1e3}, primary="ms", lower_is_better=True,
                           env=ENV, measurement=m, comparison=cmp) for m, cmp in ((slow, None), (fast, c))]
    fast_record = records[1]
    assert fast_record["versus"] == "slow" and fast_record["verdict"] == "faster"
    assert fast_record["ratio"] == pytest.approx(2.0, rel=0.05)
    assert fast_record["ratio_ci95"][0] > 1.0
    table = markdown_table(records)
    assert "ms 95% CI" in table and "speedup (95% CI): verdict" in table
    assert ": faster than slow |" in table


def test_a_compared_record_keeps_both_sides_samples_and_rejudges_to_the_same_verdict():
    # The baseline as re-measured beside the row (here slower than its own row's samples) is what was judged.
    own, beside, fast = measured("slow", 1.0), measured("slow", 3.0), measured("fast", 1.0)
    c = versus(beside, fast, threshold=0.02)
    record = make_record("demo", "t", "fast", {"ms": fast.median_s * 1e3}, primary="ms", lower_is_better=True,
                         env=ENV, measurement=fast, comparison=c)
    evidence = json.loads(json.dumps(record))["compared"]
    assert evidence["baseline_per_item_s"] == list(beside.per_item_s) != list(own.per_item_s)
    assert evidence["rounds"] == 10 and evidence["threshold"] == 0.02
    again = compare_times(evidence["baseline_per_item_s"], evidence["candidate_per_item_s"],
                          rounds=evidence["rounds"], threshold=evidence["threshold"])
    assert (again.ratio, again.ci95, again.verdict) == (record["ratio"], tuple(record["ratio_ci95"]), "faster")


def test_rows_with_samples_get_a_bootstrapped_ci_against_the_first_row():
    records = [make_record("demo", "t", m.name, {"ms": m.median_s * 1e3}, primary="ms", lower_is_better=True,
                           env=ENV, measurement=m) for m in (measured("a", 1.0), measured("b", 1.0),
                                                             measured("c", 3.0))]
    lines = markdown_table(records).splitlines()
    assert "no measurable difference" in lines[3] and "slower" in lines[4]


def test_unstable_rows_are_summed_up_once_per_table_and_named_when_a_verdict_rests_on_them():
    noisy = Measurement("noisy", tuple([1.0, 2.0] * 10))
    steady = Measurement("steady", tuple([1.0] * 20))
    base = make_record("demo", "t", "steady", {"ms": 1.0}, primary="ms", lower_is_better=True, env=ENV,
                       measurement=steady)
    judged = make_record("demo", "t", "noisy", {"ms": 1.5}, primary="ms", lower_is_better=True, env=ENV,
                         measurement=noisy, comparison=versus(steady, noisy))
    table = markdown_table([base, judged])
    assert "| noisy (!) |" in table and "| steady |" in table  # the per-row mark stays
    assert "(!) 1 of 2 rows unstable" in table and "the verdicts of noisy rest on one" in table
    assert "--repeat 3" in table and "- noisy: unstable: IQR" in table
    folded = markdown_table([base, judged], fold=True)
    assert "<details><summary>the unstable rows</summary>" in folded and "- noisy: unstable" in folded
    alone = markdown_table([base, make_record("demo", "t", "noisy", {"ms": 1.5}, primary="ms", lower_is_better=True,
                                              env=ENV, measurement=noisy)], columns=["ms"])
    assert markdown_table([base]).count("(!)") == 0
    assert "(!) 1 of 2 rows unstable" in alone


def test_the_report_opens_with_each_recipes_headline_and_cautions_one_resting_on_an_unstable_row(tmp_path):
    from tfperf.records.findings import Headline, read_headline, headline_path

    noisy = Measurement("fast", tuple([1.0, 2.0] * 10))
    slow = Measurement("slow", tuple([3.0] * 20))
    records = [make_record("demo", "t", "slow", {"ms": 3.0}, primary="ms", lower_is_better=True, env=ENV,
                           measurement=slow),
               make_record("demo", "t", "fast", {"ms": 1.5}, primary="ms", lower_is_better=True, env=ENV,
                           measurement=noisy, comparison=versus(slow, noisy))]
    write_records(tmp_path / "demo.jsonl", records)
    write_records(tmp_path / "other.jsonl", [rec("a", 2.0, recipe="other")])
    Headline.recorded("fast against slow", records[1]).save(tmp_path, "demo")
    assert read_headline(headline_path(tmp_path, "demo")).rests_on == ("slow", "fast")
    text = build_report(tmp_path, order=["demo", "other"]).read_text()
    findings = text.split("## demo")[0]
    assert findings.index("## What this run found") < text.index("## demo")
    demo = next(l for l in findings.splitlines() if l.startswith("| [demo](#demo)"))
    assert "fast against slow" in demo and "faster" in demo and "rests on an unstable row: fast" in demo
    assert "may not hold in the next run: rerun with `tfperf run --repeat 3`" in findings  # said once, under it
    assert "| [other](#other) | (no headline" in findings
    headline_path(tmp_path, "other").write_text("[not a headline")  # a broken file: the report still builds
    assert "(no headline" in build_report(tmp_path).read_text().split("## demo")[0]


def test_report_html_keeps_only_what_a_report_uses_and_inlines_its_charts(tmp_path):
    from tfperf.records.html import to_html

    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "c.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path.parent / "outside.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    page = to_html("# t\n\n## found\n\n| a | b |\n|---|---|\n| [x](#s) | 2 |\n\n## s\n\n"
                   "![c](figures/c.png) ![o](../outside.png) <script>alert(1)</script> "
                   "<img src=x onerror=alert(2)> [out](https://example.com) <details><summary>k</summary>v</details>\n",
                   tmp_path)
    body = page.split("<body>")[1].split("<script>")[0]  # the page's one script (sorting, opening) follows
    assert page.count("<script>") == 1 and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "onerror" not in body and "<img>" in body  # the attribute is dropped, the tag kept bare
    assert '<img alt="c" src="data:image/png;base64,iVBORw0KGgo=">' in body  # inlined: no file, no network
    assert '<img alt="o">' in body and "outside" not in body  # a file outside the report's folder is not read
    assert '<a href="#s">x</a>' in body and "<a>out</a>" in body and "example.com" not in body
    assert "<details><summary>k</summary>v</details>" in body and "</img>" not in body
    assert '<section id="found">' in body and '<section id="s">' in body  # a report of one part stays open


def test_recorder_keeps_tables_apart(tmp_path):
    r = Recorder("demo", {"quick": True})
    r.add("t", "a", {"ms": 1.0}, primary="ms", lower_is_better=True)
    r.add("u", "b", {"ms": 2.0}, primary="ms", lower_is_better=True)
    assert [x["row"] for x in r.table("u")] == ["b"]
    assert len(read_records(r.save(tmp_path))) == 2


def test_the_report_shows_the_spread_and_verdicts_across_reruns():
    from tfperf.records.report import markdown_table

    def run(ms, verdict):
        base = make_record("demo", "t", "a", {"ms": 10.0}, primary="ms", lower_is_better=True, env={})
        row = make_record("demo", "t", "b", {"ms": ms}, primary="ms", lower_is_better=True, env={})
        row.update(versus="a", ratio=10.0 / ms, ratio_ci95=[1.1, 1.3], verdict=verdict)
        return [base, row]

    first = run(8.0, "faster")
    table = markdown_table(first, reruns=[run(9.0, "faster"), run(10.0, "no measurable difference")])
    assert "ms across 3 runs" in table
    line = next(l for l in table.splitlines() if l.startswith("| b |"))
    assert "8-10 ms (spread 22%)" in line and "faster 2/3, no measurable difference 1/3" in line


def test_report_html_in_a_browser_opens_with_the_findings_sorts_and_unfolds(tmp_path, browser):
    from browser import look_at
    from tfperf.records.findings import Headline

    fast, slow = Measurement("fast", tuple([1.0, 1.1] * 10)), Measurement("slow", tuple([3.0, 3.1] * 10))
    for recipe in ("alpha", "beta", "gamma"):
        write_records(tmp_path / f"{recipe}.jsonl", [
            make_record(recipe, "t", "slow", {"ms": 3.0}, primary="ms", lower_is_better=True, env=ENV, measurement=slow),
            make_record(recipe, "t", "fast", {"ms": 1.0}, primary="ms", lower_is_better=True, env=ENV, measurement=fast,
                        comparison=versus(slow, fast)),
            make_record(recipe, "t", "<img src=x onerror=console.error('injected')>", {"ms": 20.0}, primary="ms",
                        lower_is_better=True, env=ENV)])
        write_conclusion(tmp_path, recipe, f"{recipe}: fast is faster. <script>console.error('injected')</script>")
        Headline(f"{recipe} lesson", f"{recipe} figure", "faster").save(tmp_path, recipe)
    page = build_report(tmp_path).with_suffix(".html")
    seen = look_at(browser, page, tmp_path / "report.png")
    assert seen["errors"] == []  # nothing injected ran, nothing failed to load
    assert seen["broken_images"] == 0 and seen["folded"] == 3
    assert 0 < seen["findings_top"] < seen["findings_bottom"] <= seen["height"]  # on the first screen
    assert seen["findings_rows"] == 3 and "alpha lesson" in seen["first_screen"]
    assert "fast is faster" not in seen["first_screen"]  # the sections are folded under the findings
    shot = (tmp_path / "report.png").read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000
    # A click on a column's header sorts the table by it, numbers by value; a second click reverses.
    order = """Array.from(document.querySelectorAll('#alpha table')[0].tBodies[0].rows, r => r.cells[0].textContent)"""
    browser.evaluate("document.getElementById('alpha').open = true")
    browser.evaluate("document.querySelectorAll('#alpha table')[0].tHead.rows[0].cells[1].click()")
    assert browser.evaluate(order)[0] == "fast"
    browser.evaluate("document.querySelectorAll('#alpha table')[0].tHead.rows[0].cells[1].click()")
    assert browser.evaluate(order)[0].startswith("<img")  # shown as text, never as an element
    # A finding's link unfolds its section.
    browser.evaluate("document.querySelector('a[href=\"#beta\"]').click()")
    assert browser.evaluate("document.getElementById('beta').open") is True
    assert browser.errors() == []


def test_a_table_writes_each_metric_in_the_unit_its_name_says_without_exponents():
    """Issue 73: `mfu 3.944e-04`, `first_call_s 0.5991`, `tolerance 1.000e-04` left the reader to convert."""
    from tfperf.records.report import fmt
    from tfperf.records import units
    from tfperf.records.units import span

    said = {("first_call_s", 0.5991): "599.1 ms", ("t2_s", 1.23e-5): "12.3 µs", ("wall_s", 75.0): "75 s",
            ("p99_ms", 12.3): "12.3 ms", ("p99_ms", 1500.0): "1.5 s", ("server_us", 250.0): "250 µs",
            ("ms_per_call", 87.61): "87.61 ms", ("s_per_step", 0.02): "20 ms", ("engine_ms_per_mib", 1.985): "1.985 ms",
            ("gloo_timeout_s", 5): "5 s", ("gradient_bytes", 8_000_000): "7.629 MiB", ("file_bytes", 512): "512 B",
            ("peak_rss_growth_mib", 3.5): "3.5 MiB", ("peak_host_mb", 412.0): "412 MB", ("mfu", 3.944e-4): "0.03944%",
            ("input_share", 0.594): "59.4%", ("tolerance", 1e-4): "0.0001", ("loss", 1.2e-9): "1.20×10⁻⁹",
            # rates are not seconds, though their names end in _s
            ("samples_s", 1234.5): "1,234", ("measured_mbit_s", 3.2): "3.2", ("samples_per_s", 23_456.0): "23,456",
            ("matmul_flops_per_s", 2.5e9): "2.5 G", ("speedup", 1.5): "1.5", ("commits", 7): "7",
            ("count", 1_234_567): "1,234,567", ("loss", float("nan")): "NaN", ("p99_ms", float("inf")): "∞"}
    for (metric, value), text in said.items():
        assert fmt(value, metric) == text, (metric, value, fmt(value, metric))
    assert fmt(None, "p99_ms") == "-" and fmt(True, "ok") == "True" and fmt("cnn", "model") == "cnn"
    assert "e-0" not in fmt(3.944e-4) and "e+" not in fmt(2.5e12)
    # A range says its unit once where both ends share it.
    assert span(8.0, 10.0, "ms") == "8-10 ms" and span(0.9, 1.2, "fit_s") == "900 ms-1.2 s"
    assert span(0.12, 0.15, "input_share") == "12-15%" and span(1.0, 2.0, "speedup") == "1-2"
    assert units.rate(0.47) == "0.47" and units.rate(1234.4) == "1,234" and units.rate(0) == "0"
    # Prose's numbers too: a 1,234 ms step at three digits was `1.23e+03 ms`, a learning rate `1e-05`.
    assert units.number(1234.5, 3) == "1,234" and units.number(87.61, 3) == "87.6"
    assert units.number(1e-5, 6) == "0.00001" and units.number(0.0012345, 3) == "0.00123"
    assert [units.number(v) for v in (float("nan"), float("inf"), -float("inf"))] == ["nan", "inf", "-inf"]
    table = markdown_table([make_record("demo", "t", "a", {"first_call_s": 0.5991, "mfu": 3.944e-4},
                                        primary="first_call_s", lower_is_better=True, env=ENV)])
    assert table.splitlines()[2] == "| a | 599.1 ms | 0.03944% |"
