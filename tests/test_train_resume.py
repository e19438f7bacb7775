"""A training process killed with SIGKILL resumes from its last checkpoint and finishes the same total."""

import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from conftest import run

STEPS, EVERY = 120, 10


def train_cmd(ckpt):
    return [sys.executable, "-m", "tfperf", "train", "--model", "cnn", "--steps", str(STEPS),
            "--checkpoint-every", str(EVERY), "--keep", "2", "--batch-size", "32", "--checkpoint-dir", str(ckpt)]


def saved_step(ckpt):
    latest = tf.train.latest_checkpoint(str(ckpt))
    return int(latest.rsplit("-", 1)[1]) if latest else 0


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path):
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(train_cmd(ckpt), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while saved_step(ckpt) < 3 * EVERY and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up, as in a crash or an OOM kill
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "training ended before it could be killed mid-run"
    killed_at = saved_step(ckpt)
    assert 3 * EVERY <= killed_at < STEPS

    out = run(train_cmd(ckpt), cwd=tmp_path).stdout
    resumed = int(out.split("resumed from step ")[1].split(")")[0])
    assert resumed >= killed_at  # the latest complete checkpoint, not step 0
    assert f"done: {STEPS} steps" in out
    # The optimizer's own step counter came back with it: it counts every step ever taken.
    reader = tf.train.load_checkpoint(str(ckpt))
    iterations = [k for k in reader.get_variable_to_shape_map() if "optimizer" in k and "iteration" in k]
    assert iterations and int(reader.get_tensor(iterations[0])) == STEPS
    assert saved_step(ckpt) == STEPS
    assert len([f for f in os.listdir(ckpt) if f.endswith(".index")]) == 2  # --keep bounds the disk


def corrupt(ckpt_dir, step, part):
    """Damage one file of checkpoint ckpt-<step>: its index truncated, or its data overwritten."""
    target = next(p for p in ckpt_dir.iterdir() if p.name.startswith(f"ckpt-{step}.{part}"))
    data = target.read_bytes()
    target.write_bytes(data[:len(data) // 3] if part == "index" else b"\xff" * len(data))


def test_resume_skips_a_corrupt_newest_checkpoint_and_loses_only_its_steps(tmp_path):
    from tfperf.data import load_arrays
    from tfperf.models import get_net
    from tfperf.train import CheckpointError, train

    data = load_arrays("digits", seed=0)
    shape = dict(input_shape=data.input_shape, num_classes=data.num_classes)
    ckpt = tmp_path / "ckpt"
    first = train(get_net("mlp", **shape), data, steps=30, batch_size=16, checkpoint_dir=ckpt, checkpoint_every=10,
                  keep=3)
    assert first.steps == 30 and first.skipped == ()
    corrupt(ckpt, 30, "index")
    resumed = train(get_net("mlp", **shape), data, steps=40, batch_size=16, checkpoint_dir=ckpt, checkpoint_every=10,
                    keep=3)
    assert resumed.resumed_from == 20 and resumed.steps == 40  # the steps after ckpt-20 were redone, no more
    assert [prefix.rsplit("-", 1)[1] for prefix, _ in resumed.skipped] == ["30"]
    assert resumed.skipped[0][1]  # with the reason

    (ckpt / "checkpoint").write_bytes(b"\x00\xff not a text proto")  # the index of checkpoints is lost too
    again = train(get_net("mlp", **shape), data, steps=40, batch_size=16, checkpoint_dir=ckpt, checkpoint_every=10,
                  keep=3)
    assert again.resumed_from == 40  # found from the files themselves, not started over
    assert again.skipped[0][0].endswith("checkpoint") and "moved to checkpoint.unreadable-" in again.skipped[0][1]

    for step in (20, 30, 40):
        corrupt(ckpt, step, "data")
    with pytest.raises(CheckpointError, match="none of the 3 checkpoints .* restores"):
        train(get_net("mlp", **shape), data, steps=50, batch_size=16, checkpoint_dir=ckpt, checkpoint_every=10, keep=3)


def test_train_cli_says_which_checkpoint_it_skipped_and_exits_2_when_none_restores(tmp_path, monkeypatch, capsys):
    from tfperf.cli import main

    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "ckpt"
    cmd = ["train", "--model", "mlp", "--dataset", "digits", "--steps", "20", "--checkpoint-every", "10",
           "--keep", "2", "--batch-size", "16", "--checkpoint-dir", str(ckpt)]
    assert main(cmd) == 0
    corrupt(ckpt, 20, "data")
    capsys.readouterr()
    assert main(cmd) == 0
    said = capsys.readouterr()
    assert "skipped checkpoint" in said.err and "ckpt-20" in said.err
    assert "resumed from step 10" in said.out and "done: 20 steps" in said.out
    for step in (10, 20):
        corrupt(ckpt, step, "data")
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "tfperf train: error: none of the 2 checkpoints")
