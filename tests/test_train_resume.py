"""A training process killed with SIGKILL resumes from its last checkpoint and finishes the same total."""

import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from conftest import REPO, run

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
