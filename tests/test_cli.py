"""The tfperf command and the shared flags: right answers, and one-line errors with exit code 2."""

import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import recipe, run
from tfperf import flags
from tfperf.cli import RECIPES_DIR
from tfperf.recipe import Conclusion, Recipe, RecipeError, read_declaration
from tfperf.records.jsonl import make_record, read_records, write_records

ENV = {"cpu": "c", "cores": 2, "gpus": []}


def records(path, ms):
    return write_records(path, [make_record("demo", "t", "a", {"ms": ms}, primary="ms",
                                            lower_is_better=True, env=ENV)])


def test_compare_prints_the_ratio(tmp_path, tfperf_cli):
    out = tfperf_cli("compare", records(tmp_path / "a.jsonl", 3.0), records(tmp_path / "b.jsonl", 1.0)).stdout
    assert "| demo: t | a | ms | 3 ms | 1 ms | 3.000x | - | - | not judged (no samples) |" in out


@pytest.mark.parametrize("argv, message", [
    (["compare", "missing.jsonl", "missing.jsonl"], "no such records file"),
    (["report", "no-such-dir"], "no *.jsonl records"),
    (["run", "--only", "nope"], "unknown recipe nope"),
    (["frobnicate"], "invalid choice"),
])
def test_cli_errors_are_one_line_exit_2(tfperf_cli, tmp_path, argv, message):
    proc = tfperf_cli(*argv, check=False, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (["--steps", "-3"], "must be a positive integer, got -3"),
    (["--batch-size", "0"], "must be a positive integer"),
    (["--warmup", "x"], "must be an integer"),
    (["--model", "vgg"], "invalid choice: 'vgg'"),
    (["--dataset", "imagenet"], "invalid choice: 'imagenet'"),
])
def test_shared_flags_are_checked_in_one_line(argv, message, capsys):
    def add_flags(p):
        flags.add_model_flag(p, "mlp")
        flags.add_dataset_flag(p, "mnist-5k")

    demo = Recipe(name="demo", doc="demo", order=1, measure=None, conclude=None, add_flags=add_flags,
                  uses=("steps", "warmup", "batch_size"))
    with pytest.raises(SystemExit) as exit_:
        demo.parse(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_quick_picks_the_small_sizes():
    demo = Recipe(name="demo", doc="demo", order=1, measure=None, conclude=None, uses=("steps", "batch_size"),
                  sizes={"steps": (100, 10), "batch_size": (256, 32)})
    assert demo.parse(["--quick"]).steps == 10
    assert demo.parse([]).batch_size == 256
    assert demo.parse(["--quick", "--steps", "7"]).steps == 7


def test_a_recipe_offers_only_the_shared_flags_it_declares(capsys):
    demo = Recipe(name="demo", doc="demo", order=1, measure=None, conclude=None, uses=("warmup",))
    with pytest.raises(SystemExit) as exit_:
        demo.parse(["--steps", "3"])
    assert exit_.value.code == 2 and "unrecognized arguments: --steps 3" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown shared flags"):
        Recipe(name="demo", doc="demo", order=1, measure=None, conclude=None, uses=("epochs",))


def _measure_rows(args, rec):
    rec.add("table", "a", {"ms": 2.0}, primary="ms", lower_is_better=True)
    rec.add("table", "b", {"ms": 1.0}, primary="ms", lower_is_better=True)
    return {"best": "b"}


def test_the_harness_records_prints_and_concludes(tmp_path, capsys):
    demo = Recipe(name="demo", doc="demo", order=1, measure=_measure_rows,
                  conclude=lambda args, rec, found: Conclusion(f"{found['best']} wins", ["key line"]))
    assert demo.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "## table" in out and "| b |" in out and out.index("key line") < out.index("b wins")
    assert [r["row"] for r in read_records(tmp_path / "demo.jsonl")] == ["a", "b"]
    assert (tmp_path / "demo.conclusion.md").read_text() == "b wins\n"


def test_the_harness_turns_known_errors_into_one_line_and_failed_checks_into_exit_1(tmp_path, capsys):
    def refuse(args, rec):
        raise RecipeError("--devices 3 is more than this machine has: use --devices 2")

    bad = Recipe(name="demo", doc="demo", order=1, measure=refuse, conclude=None)
    assert bad.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "demo: error: --devices 3 is more than this machine has: use --devices 2\n"
    failed = Recipe(name="demo", doc="demo", order=1, measure=_measure_rows,
                    conclude=lambda args, rec, found: Conclusion("text", failure="outputs disagree"))
    assert failed.main(["--out", str(tmp_path)]) == 1
    assert "demo: FAILED: outputs disagree" in capsys.readouterr().err
    assert (tmp_path / "demo.jsonl").exists()  # the records of a failed check are kept for inspection


def test_sigterm_unwinds_a_recipe_so_that_what_it_started_comes_down(tmp_path, capsys):
    import os
    import signal

    closed = []

    def measure(args, rec):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            closed.append(True)  # what a `with Hosts(...)` or a cluster's block does on the way out

    demo = Recipe(name="demo", doc="demo", order=1, measure=measure, conclude=None)
    before = signal.getsignal(signal.SIGTERM)
    started = time.perf_counter()
    assert demo.main(["--out", str(tmp_path)]) == 143 and closed == [True]
    assert time.perf_counter() - started < 4 and "demo: stopped by SIGTERM" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back


def test_every_recipe_declares_itself_in_a_place_of_its_own():
    # The docs list them by family in this order (test_docs).
    from tfperf.cli import recipe_declarations

    found = recipe_declarations()
    assert {d.name for d in found} == {p.stem for p in RECIPES_DIR.glob("*.py")}
    assert len({d.order for d in found}) == len(found)  # no two recipes share a place


def test_a_declaration_must_be_literal_and_named_after_its_file(tmp_path):
    (tmp_path / "other.py").write_text('RECIPE = Recipe(name="wrong", order=1, measure=m, conclude=c)\n')
    with pytest.raises(ValueError, match="named after its file"):
        read_declaration(tmp_path / "other.py")
    (tmp_path / "late.py").write_text('RECIPE = Recipe(name="late", order=ORDER, measure=m, conclude=c)\n')
    with pytest.raises(ValueError, match="literal"):
        read_declaration(tmp_path / "late.py")


def test_a_recipe_refuses_a_bad_flag_without_a_traceback():
    proc = run([sys.executable, recipe("hybridize"), "--loop-iters", "0"], check=False)
    assert proc.returncode == 2
    assert "--loop-iters: must be a positive integer" in proc.stderr and "Traceback" not in proc.stderr


def test_every_command_and_recipe_answers_help(capsys):
    """--help is what a person reads first: every command's and every recipe's prints and exits 0 (a percent
    sign in a help string that argparse formats once made `tfperf predict --help` a traceback)."""
    import argparse

    from test_recipes import recipe_module
    from tfperf.cli import build_parser, recipe_declarations

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    helps = {f"tfperf {name}": sub.format_help() for name, sub in commands.items()}
    helps["tfperf"] = parser.format_help()
    helps.update({d.name: recipe_module(d.name).RECIPE.parser().format_help() for d in recipe_declarations()})
    for name, text in helps.items():
        assert text.startswith("usage:") and len(text) > 100, name
    assert {"tfperf predict", "tfperf load", "tfperf doctor", "hybridize", "mnist_hvd"} <= set(helps)
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["predict", "--help"])
    assert done.value.code == 0 and "80% of what" in capsys.readouterr().out


def test_an_error_about_what_a_file_holds_stays_one_short_line(tmp_path):
    """An .npz of thousands of long-named members is refused in one line that names a few and counts the rest."""
    import zipfile

    import numpy as np

    from tfperf.deploy.errors import InputError
    from tfperf.deploy.inputs import fit_inputs, read_arrays

    many = tmp_path / "many.npz"
    with zipfile.ZipFile(many, "w") as archive:
        for k in range(3000):
            with archive.open(f"{'member' * 30}{k}.npy", "w") as f:
                np.lib.format.write_array(f, np.zeros((1, 4), np.float32))
    with pytest.raises(InputError) as refused:
        fit_inputs(read_arrays(many), [("inputs", "float32", (4,))], "the input")
    message = str(refused.value)
    assert "and 2,995 more" in message and len(message) < flags.MAX_ERROR_CHARS
    assert "...(9,640 characters cut)..." in flags.one_line("x" * 10_000)
    assert len(flags.one_line("x" * 10_000)) <= flags.MAX_ERROR_CHARS


def test_version(tfperf_cli):
    assert tfperf_cli("--version").stdout.startswith("tfperf ")


def test_main_job_starts_horovod_recipes_through_their_declared_launcher():
    from tfperf.cli import recipe_command

    cmd = recipe_command(read_declaration(RECIPES_DIR / "mnist_hvd.py"), Path("out"), quick=True)
    assert Path(cmd[0]).name == "horovodrun" and Path(cmd[0]).parent == Path(sys.executable).parent
    assert cmd[1:3] == ["-np", "2"] and cmd[3] == sys.executable and cmd[-1] == "--quick"
    assert recipe_command(read_declaration(RECIPES_DIR / "hybridize.py"), Path("out"), quick=False)[0] == sys.executable


STUB = textwrap.dedent('''
    """A stub recipe: two sleeps of known length, timed and compared, and no TensorFlow."""
    import sys
    import time

    from tfperf.measure import Timer
    from tfperf.recipe import Conclusion, Recipe
    from tfperf.records.jsonl import race_table


    def measure(args, rec):
        return race_table(rec, "sleeps", [Timer(lambda: time.sleep(0.004), name="slow"),
                                          Timer(lambda: time.sleep(0.001), name="fast")],
                          metrics=lambda m, _: {"ms": m.median_s * 1e3}, primary="ms", lower_is_better=True,
                          rounds=6, samples=12, warmup=0)


    def conclude(args, rec, raced):
        return Conclusion(f"fast against slow: {raced.comparisons['fast'].describe()}")


    RECIPE = Recipe(name="stub", doc=__doc__, order=1, measure=measure, conclude=conclude)

    if __name__ == "__main__":
        sys.exit(RECIPE.main())
''')


def test_the_main_job_runs_each_recipe_in_fresh_processes_and_reports_the_spread(tmp_path, tfperf_cli):
    # The orchestration of `tfperf run` on a stub recipe: the real recipes are tested one by one above.
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "stub.py").write_text(STUB)
    out = tfperf_cli("run", "--recipes", tmp_path / "recipes", "--quick", "--repeat", "2",
                     "--out", tmp_path / "results").stdout
    assert "[1/1] stub (1/2)" in out and "[1/1] stub (2/2)" in out and "2/2 runs" in out
    results = tmp_path / "results"
    assert (results / "repeats" / "2" / "stub.jsonl").exists() and (results / "logs" / "stub.log").exists()
    report = (results / "report.md").read_text()
    assert "## stub" in report and "fast against slow:" in report and "ms 95% CI" in report
    assert "ms across 2 runs" in report and "faster 2/2" in report  # the spread and each verdict's count
    assert (results / "figures" / "stub-sleeps.png").exists()
    (tmp_path / "broken").mkdir()  # a recipe that fails: the job goes on, names it, and exits 1
    (tmp_path / "broken" / "stub.py").write_text(STUB.replace("return race_table(", "raise SystemExit('broke')\n"
                                                                                      "    return race_table("))
    failed = tfperf_cli("run", "--recipes", tmp_path / "broken", "--out", tmp_path / "failed", check=False)
    assert failed.returncode == 1 and "FAILED (exit 1" in failed.stdout and "failed: stub" in failed.stderr
    (tmp_path / "broken" / "stub.py").write_text("RECIPE = Recipe(name='stub', order=1,\n")  # not even Python
    line = tfperf_cli("run", "--recipes", tmp_path / "broken", check=False).stderr.strip()
    assert "stub.py is not Python" in line and len(line.splitlines()) == 1

