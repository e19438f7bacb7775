"""A host that goes away: two hosts train, one is lost mid-run; a checkpoint and a relaunch, or Horovod Elastic.

Run:   python recipes/host_loss.py --quick          (about three minutes on 2 CPU cores, as root)
Needs: root, iproute2, openssh-server and Horovod (`make install` installs them). Hosts emulated on this
       machine (tfperf.cluster.hosts: network namespaces, an sshd each, a shaped link each): two train, a third
       runs Elastic's driver; a training host's link is taken down mid-training, as when a machine fails or is
       unplugged. Without root it says so and exits 2: losing a host takes hosts.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import dataclasses
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from tfperf import flags
from tfperf.measure.processes import PROTOCOL, reply
from tfperf.recipe import Conclusion, Headline, Recipe, RecipeError

# The technique, 1: checkpoints on rank 0, a bounded wait, a relaunch on the hosts that remain -------------
# recipes/mnist_hvd.py runs unchanged: rank 0 writes a checkpoint every epoch (tf.train.CheckpointManager writes
# the files, then the index that names them: a checkpoint is whole or absent), and a rank whose collective
# fails names the ranks or hosts that left. Gloo waits --gloo-timeout-seconds for a peer (30 s by default).
#     horovodrun -np 2 -H host1:1,host2:1 --gloo-timeout-seconds 10 python mnist_hvd.py --checkpoint-dir ckpts
# Then relaunch on the hosts that remain, from the last checkpoint:
#     horovodrun -np 1 -H host1:1 python mnist_hvd.py --resume ckpts/RUN


def elastic_train(args) -> None:
    """The technique, 2: Horovod Elastic. The state every rank must agree on is committed every few steps; when
    a host leaves, the ranks that remain restore the last commit and go on, fewer. Launched with
        horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./discover_hosts.sh python train.py
    where the script prints the hosts that are up, one `address:slots` a line, and ssh's keepalives end a lost
    host's session within seconds (~/.ssh/config: ServerAliveInterval 2, ServerAliveCountMax 3): the driver goes
    on without a host only once its command has ended."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from tfperf import hvd as thvd
    from tfperf.data import load_arrays

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(max(1, len(os.sched_getaffinity(0))))
    data = load_arrays("mnist-5k", seed=args.seed)
    keras.utils.set_random_seed(args.seed)
    model = keras.Sequential([keras.Input(data.input_shape), keras.layers.Flatten(),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(data.num_classes)])
    optimizer = keras.optimizers.SGD(0.05)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)  # the gradients averaged over however many ranks there are now
        optimizer.apply_gradients(zip(thvd.gradients(tape, loss, model.trainable_variables), model.trainable_variables))
        return loss

    # Elastic: what the ranks agree on (the tf.Variables under the Keras ones, and the step); a new or restored
    # rank gets it from rank 0.
    state = hvd.elastic.TensorFlowState(variables=thvd.tf_variables(model.variables + optimizer.variables), step=0)

    # Elastic: the function is rerun from the last commit whenever the ranks change.
    @hvd.elastic.run
    def train(state):
        while state.step < args.total_steps:
            i = (state.step * hvd.size() + hvd.rank()) * args.batch_size % (len(data.x_train) - args.batch_size)
            train_step(data.x_train[i:i + args.batch_size], data.y_train[i:i + args.batch_size])
            state.step += 1
            if state.step % args.commit_every == 0:
                drift = thvd.max_weight_difference(model.variables)  # 0.0 when every rank holds the same model
                if hvd.rank() == 0:
                    print(reply({"commit": state.step, "ranks": hvd.size(), "drift": drift, "at": time.time(),
                                 "host": thvd.this_host()}), flush=True)
                # Elastic: keep this state; a host added or lost is noticed here.
                state.commit()

    train(state)


# Measuring ------------------------------------------------------------------------------------------------

HERE = Path(__file__).resolve().parent
RELAUNCH, ELASTIC = ("a host lost, then a relaunch from the last checkpoint (mnist_hvd, unchanged)",
                     "Horovod Elastic: a host lost, the job goes on")


@dataclasses.dataclass(frozen=True)
class Found:
    link: str
    addresses: list[str]
    relaunch: dict
    elastic: dict


def parse_reply(line: str):
    """What a process replied on a launcher's output line (after horovodrun's `[rank]<stdout>:`), or None."""
    import json

    return json.loads(line[line.index(PROTOCOL) + len(PROTOCOL):]) if PROTOCOL in line else None


class Job:
    """A launcher started in the background, its output read line by line with the time each line came."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     stdin=subprocess.DEVNULL)
        self.lines: list[tuple[float, str]] = []
        self._new: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
            self._new.put(line)

    def until(self, test, deadline_s: float):
        """Wait for an output line that passes `test` (a regex, or a function of the line): its match or
        value; None at the deadline or when the job ends first."""
        check = (lambda line: re.search(test, line)) if isinstance(test, str) else test
        end = time.monotonic() + deadline_s
        for _, line in list(self.lines):
            if check(line):
                return check(line)
        while time.monotonic() < end:
            try:
                line = self._new.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self._new.empty():
                    return None
                continue
            if check(line):
                return check(line)
        return None

    def end(self, deadline_s: float) -> int | None:
        """The exit code, waiting up to `deadline_s`; None (and the job killed) if it was still running."""
        try:
            return self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def replies(self) -> list[tuple[float, dict]]:
        """What the job's processes replied, with when."""
        return [(t, parse_reply(line)) for t, line in self.lines if PROTOCOL in line]

    def tail(self, n: int = 8) -> str:
        return " | ".join(line for _, line in self.lines[-n:])


def lose_and_relaunch(hosts, args) -> dict:
    """mnist_hvd across both hosts; host 1's link down once rank 0 has checkpointed `--cut-after` epochs; then
    mnist_hvd again on host 0 alone, resumed from the last checkpoint."""
    ckpts, out = hosts.dir / "checkpoints", hosts.dir / "mnist_hvd"
    argv = [sys.executable, str(HERE / "mnist_hvd.py"), "--epochs", args.epochs, "--max-steps", args.max_steps,
            "--batch-size", args.batch_size, "--checkpoint-dir", ckpts, "--out", out, "--seed", args.seed]
    gloo = ["--gloo-timeout-seconds", str(args.gloo_timeout)]
    job = Job(hosts.horovodrun([str(a) for a in argv], on=[0, 1], options=gloo), hosts.env())
    if not job.until(rf"epoch {args.cut_after}/{args.epochs}:", 600):
        job.end(5)
        raise RecipeError(f"mnist_hvd across the hosts did not reach epoch {args.cut_after}: {job.tail()}")
    cut_at = time.time()
    hosts.cut(1)
    code = job.end(args.gloo_timeout * 3 + 60)
    error = next(((t, line) for t, line in job.lines if "mnist_hvd: error:" in line), None)
    named = re.findall(r"host ([0-9.]+) \(rank", error[1]) if error else []
    epochs_done = [int(m) for m in re.findall(r"epoch (\d+)/", "\n".join(line for _, line in job.lines))]
    run_dir = next(ckpts.iterdir(), None) if ckpts.is_dir() else None
    latest = re.search(r'model_checkpoint_path: "ckpt-(\d+)"', (run_dir / "checkpoint").read_text()) if (
        run_dir and (run_dir / "checkpoint").is_file()) else None
    found = {"ended": code is not None, "exit_code": code, "named": named,
             "detected_s": (error[0] - cut_at) if error else None, "error": error[1] if error else job.tail(),
             "last_epoch_printed": max(epochs_done, default=0), "checkpoint_epoch": int(latest[1]) if latest else 0}
    if not latest:
        return found
    # The relaunch, on the host that remains, from the last checkpoint.
    started = time.time()
    again = Job(hosts.horovodrun([str(a) for a in argv] + ["--resume", str(run_dir)], on=[0], options=gloo),
                hosts.env())
    code = again.end(600)
    epochs = [int(m) for m in re.findall(r"epoch (\d+)/", "\n".join(line for _, line in again.lines))]
    accuracy = re.search(r"test accuracy ([0-9.]+)", "\n".join(line for _, line in again.lines))
    return {**found, "relaunch_exit_code": code, "resumed_at_epoch": min(epochs, default=0),
            "final_epoch": max(epochs, default=0), "relaunch_s": time.time() - started,
            "test_accuracy": float(accuracy[1]) if accuracy else None,
            "relaunch_error": "" if code == 0 else again.tail()}


def elastic(hosts, args) -> dict:
    """Horovod Elastic across hosts 0 and 1, its driver on host 2 (a head node); after `--cut-after` commits on
    two ranks, the link of the host that does not hold rank 0 goes down."""
    argv = [sys.executable, str(HERE / "host_loss.py"), "--role", "elastic", "--seed", args.seed,
            "--batch-size", args.batch_size, "--total-steps", args.total_steps, "--commit-every", args.commit_every]
    job = Job(hosts.elastic_horovodrun([str(a) for a in argv], on=[0, 1], launcher=2,
                                       options=["--gloo-timeout-seconds", str(args.gloo_timeout)]), hosts.env(keepalive=True))
    def two_ranks_committed(line: str) -> dict | None:
        r = parse_reply(line)
        return r if r and r.get("ranks") == 2 and r.get("commit", 0) >= args.cut_after * args.commit_every else None

    committed = job.until(two_ranks_committed, 600)
    if not committed:
        job.end(5)
        raise RecipeError(f"Horovod Elastic across the hosts did not commit {args.cut_after} times: {job.tail()}")
    # By default the host without rank 0. Losing rank 0's host costs more: Horovod 0.28.1's driver first tells the
    # lost host's workers that the hosts changed, and that blocks in connect() until the kernel gives up on it.
    rank0_host = hosts.addresses.index(committed["host"])
    lost = rank0_host if args.lose == "rank0" else 1 - rank0_host
    cut_at = time.time()
    hosts.cut(lost)
    code = job.end(args.gloo_timeout * 3 + 120)
    commits = [r for _, r in job.replies() if "commit" in r]
    before = [c for c in commits if c["at"] < cut_at]
    after = [c for c in commits if c["at"] >= cut_at and c["ranks"] == 1]
    return {"exit_code": code, "ended": code is not None, "lost": hosts.addresses[lost],
            "lost_rank0": lost == rank0_host, "commits_before": len(before),
            "drift_before": max((c["drift"] for c in before), default=None),
            "last_commit_before": max((c["commit"] for c in before), default=0),
            "first_commit_after": after[0]["commit"] if after else None,
            "recovered_s": after[0]["at"] - cut_at if after else None,
            "final_step": max((c["commit"] for c in commits), default=0),
            "final_ranks": commits[-1]["ranks"] if commits else None, "tail": "" if code == 0 else job.tail()}


def add_flags(p) -> None:
    p.add_argument("--link", type=flags.link, default="1gbit", help="the hosts' link rate (default 1gbit)")
    p.add_argument("--epochs", type=flags.positive_int, help="mnist_hvd's epochs")
    p.add_argument("--max-steps", type=flags.positive_int, help="mnist_hvd's steps per epoch")
    p.add_argument("--cut-after", type=flags.positive_int, default=2,
                   help="take host 1 down after this many checkpoints (or Elastic commits)")
    p.add_argument("--gloo-timeout", type=flags.positive_int, default=10,
                   help="seconds Gloo waits for a peer before the collective fails (horovodrun's default is 30)")
    p.add_argument("--total-steps", type=flags.positive_int, help="Elastic training's steps")
    p.add_argument("--commit-every", type=flags.positive_int, help="Elastic: steps between commits")
    p.add_argument("--lose", choices=["other", "rank0"], default="other",
                   help="Elastic: lose the host without rank 0 (default) or rank 0's, which Horovod recovers from slower")
    p.add_argument("--role", choices=["elastic"], help=argparse.SUPPRESS)


def task(args) -> int:
    elastic_train(args)
    return 0


def measure(args, rec) -> Found:
    from tfperf.cluster.hosts import Hosts, available, parse_link

    why = available()
    if why:
        raise RecipeError(f"{why}; a host lost needs hosts")
    if args.cut_after >= args.epochs:
        raise RecipeError(f"--cut-after {args.cut_after} must be below --epochs {args.epochs}: the host is lost "
                          f"mid-training")
    # Hosts 0 and 1 train; host 2 is a head node for Elastic's driver (it shares a core with host 0). A HostsError
    # is a ClusterError: the recipe ends in its one line.
    with Hosts(3, parse_link(args.link), ssh=True) as hosts:
        relaunch = lose_and_relaunch(hosts, args)
        hosts.cut(1, down=False)  # the host back, for the second way
        lost = elastic(hosts, args)
        addresses = hosts.addresses[:2]
    r = relaunch
    rec.add(RELAUNCH, "link down: the job ends", {
        "ended": r["ended"], "seconds": r["detected_s"] if r["detected_s"] is not None else np.nan,
        "gloo_timeout_s": args.gloo_timeout, "host_named": ", ".join(r["named"]) or "none",
        "epochs_printed": r["last_epoch_printed"], "last_checkpoint_epoch": r["checkpoint_epoch"]},
        primary="seconds", lower_is_better=True, versus_first=False)
    if "relaunch_exit_code" in r:
        rec.add(RELAUNCH, "relaunch on the host that remains", {
            "exit_code": r["relaunch_exit_code"], "resumed_at_epoch": r["resumed_at_epoch"],
            "final_epoch": r["final_epoch"], "test_accuracy": r["test_accuracy"], "seconds": r["relaunch_s"]},
            primary="seconds", lower_is_better=True, versus_first=False)
    e = lost
    rec.add(ELASTIC, "2 ranks, before the link went down", {
        "commits": e["commits_before"], "max_weight_drift": e["drift_before"], "last_commit": e["last_commit_before"]},
        primary="commits", lower_is_better=False, versus_first=False)
    rec.add(ELASTIC, "1 rank, after", {
        "host_lost": e["lost"], "first_commit": e["first_commit_after"], "seconds_to_it": e["recovered_s"],
        "final_step": e["final_step"], "final_ranks": e["final_ranks"], "exit_code": e["exit_code"]},
        primary="final_step", lower_is_better=False, versus_first=False)
    return Found(args.link, addresses, relaunch, lost)


def conclude(args, rec, found: Found) -> Conclusion:
    r, e = found.relaunch, found.elastic
    expected = found.addresses[1]
    named = r["named"] == [expected]
    resumed = r.get("resumed_at_epoch") == r["checkpoint_epoch"] + 1 and r.get("final_epoch") == args.epochs
    went_on = (e["first_commit_after"] is not None and e["final_step"] == args.total_steps
               and e["drift_before"] == 0.0)
    failures = [what for ok, what in (
        (r["ended"], "the job did not end after the host was lost (a hang)"),
        (named, f"the job did not name the lost host {expected}"),
        (resumed, "the relaunch did not resume from the last checkpoint to the end"),
        (went_on, "Horovod Elastic did not go on with the host that remained")) if not ok]
    detected = f"{r['detected_s']:.1f} s" if r["detected_s"] is not None else "no message"
    lost_which = ("The host lost here held rank 0: Horovod 0.28.1's driver first tells the lost host's workers that "
                  f"the hosts changed, and the remaining rank waited while that blocked in connect() until the kernel "
                  f"gave up" if e.get("lost_rank0") else
                  "The host lost here did not hold rank 0; losing rank 0's host costs more (--lose rank0): Horovod "
                  "0.28.1's driver first tells the lost host's workers that the hosts changed, which blocks in "
                  "connect() until the kernel gives up (79 s in a check here)")
    text = (
        f"Two hosts ({', '.join(found.addresses)}, a {found.link} link) trained mnist_hvd unchanged; after rank 0's "
        f"checkpoint of epoch {r['checkpoint_epoch']} the second host's link went down. Rank 0's collective failed "
        f"after Gloo's {args.gloo_timeout} s timeout and the job ended {detected} after the cut, naming "
        f"{', '.join(r['named']) or 'no host'} ({'the lost one' if named else f'not the lost {expected}'}); "
        f"epoch {r['last_epoch_printed'] + 1}'s steps were lost, not the checkpoint. Relaunched on the host that "
        f"remained with --resume, it went on from epoch {r.get('resumed_at_epoch', '?')} to "
        f"{r.get('final_epoch', '?')} (test accuracy {r.get('test_accuracy') or float('nan'):.3f}): a checkpoint "
        f"costs the steps since the last one and the relaunch's start-up. Under Horovod Elastic the same loss cost "
        f"no relaunch: the two ranks had identical weights at each of {e['commits_before']} commits (largest "
        f"difference {e['drift_before']}); after {e['lost']}'s link went down the remaining rank restored the "
        f"commit of step {e['last_commit_before']} and committed step {e['first_commit_after']} on its own "
        f"{e['recovered_s'] or float('nan'):.1f} s after the cut, going on to step {e['final_step']}. Two timeouts "
        f"bound it: Gloo's, which ends the collective, and ssh's keepalives (ServerAliveInterval), which end the "
        f"lost host's session: Elastic's driver waits for every worker's command to end before it goes on without "
        f"it, and without keepalives (the relaunch's run above had none, as ssh by default) an ssh session to a "
        f"host that went away lasts as long as TCP waits. {lost_which}. Lower the timeouts and a lost host is "
        f"noticed sooner, at the risk of calling a slow step a lost host.")
    headline = Headline("a host lost mid-training (2 emulated hosts, its link cut)",
                        f"the job ended in {detected} naming {', '.join(r['named']) or 'no host'}, resumed from "
                        f"epoch {r['checkpoint_epoch']}; Elastic went on after "
                        f"{e['recovered_s'] or float('nan'):.1f} s",
                        "bounded, nothing lost" if not failures else "; ".join(failures))
    lines = [f"relaunch: {r}", f"elastic: {e}"]
    return Conclusion(text, lines, "; ".join(failures), headline)


RECIPE = Recipe(name="host_loss", doc=__doc__, order=136, measure=measure, conclude=conclude, add_flags=add_flags,
                task=task, uses=("batch_size",),
                sizes={"epochs": (8, 5), "max_steps": (30, 15), "batch_size": (64, 64), "total_steps": (400, 200),
                       "commit_every": (20, 10)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
