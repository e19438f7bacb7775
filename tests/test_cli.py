"""The tfperf command and the shared flags: right answers, and one-line errors with exit code 2."""

import sys
from pathlib import Path

import pytest

from conftest import recipe, run
from tfperf import flags
from tfperf.results import make_record, write_records

ENV = {"cpu": "c", "cores": 2, "gpus": []}


def records(path, ms):
    return write_records(path, [make_record("demo", "t", "a", {"ms": ms}, primary="ms",
                                            lower_is_better=True, env=ENV)])


def test_compare_prints_the_ratio(tmp_path, tfperf_cli):
    out = tfperf_cli("compare", records(tmp_path / "a.jsonl", 3.0), records(tmp_path / "b.jsonl", 1.0)).stdout
    assert "| demo: t | a | ms | 3 | 1 | 3.000x | - | not judged (no samples) |" in out


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
    p = flags.parser("demo", prog="demo")
    flags.add_model_flag(p, "mlp")
    flags.add_dataset_flag(p, "mnist-5k")
    with pytest.raises(SystemExit) as exit_:
        flags.parse(p, argv, sizes={})
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_quick_picks_the_small_sizes():
    p = flags.parser("demo")
    sizes = {"steps": (100, 10), "batch_size": (256, 32)}
    assert flags.parse(p, ["--quick"], sizes=sizes).steps == 10
    assert flags.parse(p, [], sizes=sizes).batch_size == 256
    assert flags.parse(p, ["--quick", "--steps", "7"], sizes=sizes).steps == 7


def test_a_recipe_refuses_a_bad_flag_without_a_traceback():
    proc = run([sys.executable, recipe("hybridize"), "--loop-iters", "0"], check=False)
    assert proc.returncode == 2
    assert "--loop-iters: must be a positive integer" in proc.stderr and "Traceback" not in proc.stderr


def test_version(tfperf_cli):
    assert tfperf_cli("--version").stdout.startswith("tfperf ")


def test_main_job_starts_horovod_recipes_through_horovodrun():
    from tfperf.cli import HOROVOD_RANKS, RECIPES_DIR, recipe_command

    cmd = recipe_command(RECIPES_DIR / "mnist_hvd.py", Path("out"), quick=True)
    assert Path(cmd[0]).name == "horovodrun" and cmd[1:3] == ["-np", str(HOROVOD_RANKS)]
    assert cmd[3] == sys.executable and cmd[-1] == "--quick"
    assert recipe_command(RECIPES_DIR / "hybridize.py", Path("out"), quick=False)[0] == sys.executable
