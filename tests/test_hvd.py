"""Horovod on Keras 3 through tfperf.hvd, with real ranks: identical weights, agreement with one device,
and a job that ends (naming the rank) when one of its ranks dies."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from conftest import BIN, REPO, recipe, run
from tfperf.records.jsonl import read_records

TESTS = REPO / "tests"


def horovodrun(np_, *args, launcher=()):
    # --gloo: horovodrun asks forked processes how Horovod was built (each imports TensorFlow to answer): told the
    # controller, it asks only whether Gloo was; Gloo is what scripts/install_horovod.sh builds.
    return [BIN / "horovodrun", "-np", str(np_), "--gloo", *launcher, sys.executable, *args]


def test_adapter_in_one_process():
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from tfperf import hvd as thvd

    hvd.init()
    layer = keras.layers.Dense(3)
    layer.build((None, 4))
    assert all(isinstance(v, tf.Variable) and not isinstance(v, keras.Variable)
               for v in thvd.tf_variables(layer.weights))
    assert thvd.average({"loss": 2.5, "acc": 0.5}) == {"loss": 2.5, "acc": 0.5}
    assert thvd.total({"seen": 7}) == {"seen": 7.0}
    assert thvd.max_weight_difference(layer.weights) == 0.0
    schedule = thvd.WarmupScaledLearningRate(0.1, 4, 10)
    assert [round(float(schedule(s)), 6) for s in (0, 5, 10, 100)] == [0.1, 0.25, 0.4, 0.4]
    with pytest.raises(ValueError, match="base > 0"):
        thvd.WarmupScaledLearningRate(0.0, 4, 10)


def test_departed_ranks_sees_ended_processes():
    from tfperf import hvd as thvd

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # not reaped until wait(): a zombie
    deadline = time.monotonic() + 10
    while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    host = socket.gethostname()
    peers = [(host, os.getpid()), (host, child.pid), (host, zombie.pid), ("elsewhere", 1)]
    assert thvd.departed_ranks(peers) == [1, 2]
    assert "rank(s) 1, 2 ended" in thvd.describe_failure(peers)
    # Another host: named when it no longer answers on the port horovodrun reached it by, else only suspected.
    assert "host elsewhere.invalid (rank 1) no longer answers" in thvd.describe_failure(
        [(host, os.getpid()), ("elsewhere.invalid", 1)])
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        assert "another host on 127.0.0.1" in thvd.describe_failure([(host, os.getpid()), ("127.0.0.1", 1)], port)
    zombie.wait()


@pytest.mark.slow
def test_two_ranks_agree_with_single_device_training(tmp_path):
    run(horovodrun(2, TESTS / "hvd_agreement.py", tmp_path))  # rank 0 then trains the single-device reference
    single = np.load(tmp_path / "rank0-of-1.npz")
    ranks = [np.load(tmp_path / f"rank{r}-of-2.npz") for r in range(2)]
    for key in single.files:
        assert np.array_equal(ranks[0][key], ranks[1][key]), f"{key} differs between the two ranks"
        # Averaged gradients of two half batches are the gradient of the whole batch: same training.
        np.testing.assert_allclose(ranks[0][key], single[key], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_mnist_hvd_two_ranks(tmp_path):
    ckpt, timeline = tmp_path / "ckpt", tmp_path / "timeline.json"
    proc = run(horovodrun(2, recipe("mnist_hvd"), "--quick", "--max-steps", "8", "--warmup", "2",
                          "--out", tmp_path, "--checkpoint-dir", ckpt, launcher=("--timeline-filename", timeline)))
    assert "total on 2 rank(s)" in proc.stdout and "weights identical on all ranks: True" in proc.stdout
    assert "[1]<stdout>" not in proc.stdout  # rank 0 alone talks
    records = read_records(tmp_path / "mnist_hvd.jsonl")
    rows = {r["row"]: r["metrics"] for r in records}
    assert {"rank 0", "rank 1", "total, np=2", "np=2"} <= set(rows)
    assert rows["total, np=2"]["samples_per_s"] == pytest.approx(
        rows["rank 0"]["samples_per_s"] + rows["rank 1"]["samples_per_s"])
    result = rows["np=2"]
    assert result["weight_drift"] == 0.0 and result["epochs"] == 2 and result["global_batch"] == 128
    assert result["updates"] == 16 and result["test_accuracy"] > 0.5  # 16 updates from 10% (chance)
    # Horovod's own timeline of the job, read into its phases: 16 steps of gradients all-reduced over Gloo.
    split = {r["row"]: r["metrics"] for r in records if r["table"].startswith("Horovod's timeline")}
    assert split["negotiation"]["s"] > 0 and split["operations"]["s"] > 0
    assert split["operations: GLOO_ALLREDUCE"]["s"] > 0
    assert split["collectives under way"]["s"] >= max(split["negotiation"]["s"], split["operations"]["s"])
    assert all(0 <= m["share_of_run"] <= 1 for m in split.values())
    assert "Horovod's timeline: " in proc.stdout and "waiting for the last rank" in proc.stdout
    from tfperf.measure.horovod_timeline import read_split

    assert read_split(timeline).steps == 16  # each gradient all-reduced once a step, 8 steps in 2 epochs
    runs = list(ckpt.iterdir())
    assert len(runs) == 1 and sorted(f.name for f in runs[0].iterdir()) == [
        "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index"]  # one writer, one checkpoint kept
    # --resume on fewer ranks: test_hosts' lost-host test relaunches this recipe on the host that remains from its
    # last checkpoint (a TensorFlow start, 10-15 s in the suite, was spent here on the same path).


def start_job(tmp_path, script, *args, env=None):
    cmd = horovodrun(2, script, "--epochs", "1000", "--out", tmp_path, "--checkpoint-dir", tmp_path / "ckpt", *args)
    return subprocess.Popen([str(c) for c in cmd], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                                            "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})


def wait_for_line(proc, pattern, timeout):
    """Read the job's output until a line matches; returns everything read."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{''.join(seen)[-3000:]}")


def rank_process(job, rank):
    for child in psutil.Process(job.pid).children(recursive=True):
        try:
            if child.environ().get("HOROVOD_RANK") == str(rank) and "python" in child.name():
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no process for rank {rank}")


def finish(job, timeout):
    try:
        rest, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        raise AssertionError(f"the job did not end within {timeout} s of losing a rank: it hangs")
    return rest


@pytest.mark.slow
def test_killed_rank_ends_the_job_and_is_named(tmp_path):
    job = start_job(tmp_path, recipe("mnist_hvd"))
    seen = wait_for_line(job, r"epoch 1/1000", timeout=240)
    rank_process(job, 1).send_signal(signal.SIGKILL)
    killed = time.monotonic()
    rest = finish(job, timeout=60)
    output = "".join(seen) + rest
    assert job.returncode != 0
    assert time.monotonic() - killed < 60
    assert re.search(r"Process name: 1\s+Exit code: 137|rank\(s\) 1 ended", output), output[-3000:]


@pytest.mark.slow
def test_rank_that_exits_mid_training_ends_the_job_and_is_named(tmp_path):
    job = start_job(tmp_path, TESTS / "hvd_rank_leaves.py", env={"LEAVE_AFTER_STEPS": "40"})
    seen = wait_for_line(job, r"2 rank\(s\)", timeout=240)  # rank 1 leaves after 40 steps, in epoch 2
    started = time.monotonic()
    rest = finish(job, timeout=90)
    output = "".join(seen) + rest
    assert job.returncode != 0
    failure = re.search(r"rank 0 of 2 lost its peers at epoch \d+, step (\d+): rank\(s\) 1 ended", output)
    assert failure, output[-3000:]
    assert failure.group(0).startswith("rank 0 of 2 lost its peers at epoch 2, step 41")
    assert time.monotonic() - started < 90


def timeline_file(path, steps=2, cut=0):
    """A timeline as Horovod's writer lays it out: two gradients a step, fused into one all-reduce, rank 1 late."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1}}]
    for pid, name in ((1, "grad_a"), (2, "grad_b")):
        events += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
                   {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
    for step in range(steps):
        t = step * 10_000
        for pid, asked, late, activity in ((1, 0, 400, "MEMCPY_IN_FUSION_BUFFER"), (2, 50, 405, "WAIT_FOR_DATA")):
            events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t + asked, "pid": pid},
                       {"ph": "X", "name": "0", "ts": t + asked, "pid": pid, "dur": 0},
                       {"ph": "X", "name": "1", "ts": t + late, "pid": pid, "dur": 0},
                       {"ph": "E", "ts": t + 410, "pid": pid},
                       {"ph": "B", "name": "ALLREDUCE", "ts": t + 420, "pid": pid},
                       {"ph": "B", "name": activity, "ts": t + 420, "pid": pid},
                       {"ph": "E", "ts": t + (440 if pid == 1 else 430), "pid": pid},
                       {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": t + 440, "pid": pid},
                       {"ph": "E", "ts": t + 640, "pid": pid},
                       {"ph": "E", "ts": t + 650, "pid": pid, "args": {"dtype": "float32", "shape": "[3]"}}]
    text = "[\n" + ",".join(json.dumps(e) for e in events) + "]"
    path.write_text(text[:len(text) - cut])
    return path


def test_a_horovod_timeline_is_read_into_negotiation_the_last_ranks_wait_and_the_all_reduce(tmp_path, capsys):
    from tfperf.cli import main
    from tfperf.measure.horovod_timeline import read_split, union_us

    assert union_us([(0, 10), (5, 20), (30, 40)]) == 30
    found = read_split(timeline_file(tmp_path / "t.json"))
    # Per step: negotiating 0-410 us, rank 0 waiting for rank 1 0-405 us, the fused all-reduce 420-650 us;
    # the two tensors overlap, so each phase is their union, never their sum.
    assert found.steps == 2 and found.tensors == 2 and found.operations == {"ALLREDUCE": 4}
    assert found.negotiation_s == pytest.approx(2 * 410e-6)
    assert found.waiting_for_last_rank_s == pytest.approx(2 * 405e-6)
    assert found.last_rank == {1: 4} and found.operation_s == pytest.approx(2 * 230e-6)
    assert found.activities == pytest.approx({"GLOO_ALLREDUCE": 2 * 200e-6, "MEMCPY_IN_FUSION_BUFFER": 2 * 20e-6,
                                              "WAIT_FOR_DATA": 2 * 10e-6})
    assert found.waits_s == pytest.approx(2 * 10e-6)
    assert found.collectives_s == pytest.approx(2 * 640e-6)  # 0-410 and 420-650 us: the 10 us between is no one's
    assert found.span_s == pytest.approx(10_650e-6) and found.per_step_ms(found.negotiation_s) == pytest.approx(0.41)
    assert "slowest one" in found.advice()  # waiting for rank 1 is the largest part
    # A job killed mid-write leaves its last event cut: read up to the last whole one.
    cut = read_split(timeline_file(tmp_path / "cut.json", cut=20))
    assert cut.operations == {"ALLREDUCE": 3} and cut.steps == 2
    assert main(["horovod-timeline", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "rank 1 reported last in 4 of the 4 negotiations of 4" in out and "GLOO_ALLREDUCE 0.00 s" in out
    (tmp_path / "notes.txt").write_text("not a timeline")
    (tmp_path / "odd.json").write_text('[{"ph": "B", "name": "ALLREDUCE", "pid": 1, "ts": "soon"}]')
    for bad, said in (("notes.txt", "is not a Horovod timeline"), ("odd.json", "holds trace events Horovod does not")):
        assert main(["horovod-timeline", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0] and "--timeline-filename" in err[0], err


def test_the_engines_costs_are_measured_between_two_processes_or_said_to_be_none(monkeypatch, capsys):
    """What `tfperf doctor --hosts` charges each fused message and each byte (issue 74): the small and the large
    all-reduce's samples as rank 0 prints them (here a job of one rank, in this process: its two-process launch costs
    the suite 20 s), read back by the launcher's side; or none, said with why."""
    from tfperf.cluster import collective
    from tfperf.cluster.errors import ClusterError

    collective.timed_allreduces()
    printed = capsys.readouterr().out
    launched = []

    def launch(cmd, **kwargs):
        launched.append([str(c) for c in cmd])
        return "".join(f"[0]<stdout>:{line}\n" for line in printed.splitlines())

    monkeypatch.setattr("tfperf.cluster.processes.launch", launch)
    found = collective.measure_engine_cost()
    assert launched[0][1:] == ["-np", "2", "--gloo", sys.executable, "-m", "tfperf.cluster.collective"]
    assert found.measured and 0 < found.fixed_s < 1.0 and 0 <= found.per_byte_s < 1e-6
    assert found.source.startswith("measured with a 4 KiB and a 16 MiB all-reduce")

    def fails(*args, **kwargs):
        raise ClusterError("horovodrun ... exited 1:\nno Gloo")

    monkeypatch.setattr("tfperf.cluster.processes.launch", fails)
    broken = collective.measure_engine_cost()
    assert not broken.measured and broken.fixed_s == broken.per_byte_s == 0.0
    assert broken.source.startswith("none charged: the all-reduces could not be measured (horovodrun")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    missing = collective.measure_engine_cost()
    assert not missing.measured and "Horovod is not installed" in missing.source
