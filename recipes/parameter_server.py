"""Parameter servers: the key-value store of parameters, on a real ParameterServerStrategy cluster.

Parameter-server processes hold the variables; worker processes pull them, compute gradients on their
own batches, and push updates back, each at its own pace (asynchronous training). A coordinator (a
process this script starts) schedules the steps.

Run:   python recipes/parameter_server.py --quick        (about a minute on 2 CPU cores)
       python recipes/parameter_server.py --quick --link 1gbit   (as root: the ps on a second host)
Needs: TensorFlow 2.21 and Keras 3; free localhost ports. It starts the ps, worker and coordinator
       processes itself; on real machines each runs `tf.distribute.Server` on its own host. With --link the
       ps runs on an emulated host of its own (a network namespace, its link shaped by tc) and every pull and
       push crosses that link.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from tfperf import flags
from tfperf.measure import Measurement, Timer, TimerServer, interleave, serve_timers, versus
from tfperf.cluster.errors import ClusterError
from tfperf.cluster.placement import Placement, placed
from tfperf.cluster.processes import LocalCluster
from tfperf.cluster.hosts import available
from tfperf.measure.processes import reply
from tfperf.devices import usable_cores
from tfperf.gpus import child_gpu_env, host_gpu_count, worker_gpus
from tfperf.recipe import Conclusion, Headline, Recipe, RecipeError
from tfperf.measure.stats import FASTER, SLOWER, Comparison

# The technique: a ps/worker/coordinator cluster, and push and pull as variable reads and writes -------
# The seed's parameter-server section describes a key-value store: `push` sends a worker's gradients
# to the server that owns the keys, `pull` fetches the current parameters. With
# `tf.distribute.ParameterServerStrategy` that is literal: variables created in `strategy.scope()` live
# on the ps tasks, a step function scheduled on a worker reads them (pull) and `assign_sub`s its update
# (push). The recipe times pull and push by size, trains with 1 and 2 workers, and compares the traffic
# with the ring all-reduce that synchronous strategies use (multi_worker.py, scaling_model.py). Both
# clusters stay up and run their timed blocks of steps in turns, so the speedup is judged round by round.


def server(args) -> None:
    """A ps or worker task: a TensorFlow server that runs what the coordinator sends it, until killed."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(max(1, usable_cores() // args.workers))
    # A server answers tensors others ask for while its own ops wait on theirs: with one inter-op thread (the
    # default on a host of one core) a worker's step and the ps's request for its update wait on each other for
    # ever. A server takes its threads from its own config, not from tf.config.
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=max(2, usable_cores()))
    spec = tf.train.ClusterSpec(json.loads(args.cluster))
    tf.distribute.Server(spec, job_name=args.job, task_index=args.index, protocol="grpc", config=config,
                         start=True).join()


def coordinator(args) -> dict:
    """The chief: builds the model on the ps, schedules training steps and key-value probes on workers."""
    import keras
    import tensorflow as tf

    from tfperf.data import load_arrays
    from tfperf.models import get_net
    from tfperf.train import accuracy

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(json.loads(args.cluster)), rpc_layer="grpc", task_type="chief", task_id=0)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)  # PS: variables go to ps tasks
    coord = tf.distribute.coordinator.ClusterCoordinator(strategy)  # PS: schedules functions on idle workers
    data = load_arrays("mnist-5k", seed=args.seed)
    with strategy.scope():
        keras.utils.set_random_seed(args.seed)
        model = get_net("cnn")
    placement = sorted({v.value.device for v in model.trainable_variables})
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def dataset_fn():  # PS: runs on each worker, which reads its own stream of batches
        return (tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train)).shuffle(len(data.x_train))
                .repeat().batch(args.batch_size, drop_remainder=True).prefetch(2))

    batches = iter(coord.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator):
        x, y = next(iterator)
        with tf.GradientTape() as tape:  # PS: the forward pass pulls the parameters from the ps
            loss = loss_fn(y, model(x, training=True))
        for v, g in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables)):
            v.assign_sub(args.lr * g)  # PS: push: the update is applied on the ps that owns v, no waiting
        return loss

    # Throughput: blocks of steps scheduled back to back, one join per block (asynchronous workers have
    # no common step to time); the first step and --warmup more, each joined, let the workers trace it.
    # The cluster then stays up and runs a block when the recipe asks, in turns with the other cluster.
    losses = []
    schedule = Timer(lambda: losses.append(coord.schedule(train_step, args=(batches,))), name="block",
                     items_per_call=args.batch_size, block_size=block_steps(args.steps),
                     sync_fn=lambda _: coord.join())
    serve_timers([schedule], warmup=args.warmup)
    schedule.profile(args.profile, steps=1)  # the chief's side of one more block: scheduling, RPCs
    result = {"workers": args.workers, "placement": placement,
              "final_loss": float(np.mean([l.fetch() for l in losses[-10:]])),
              "test_accuracy": accuracy(model, data.x_test, data.y_test), "kv": []}

    for size in (args.sizes if args.workers > 1 else []):
        with strategy.scope():
            value = tf.Variable(tf.zeros([size // 4]))  # PS: one key, stored on a ps task

        @tf.function
        def pull():
            return tf.reduce_sum(tf.identity(value))  # the read runs on the ps, the sum on the worker

        @tf.function
        def push():
            value.assign_add(tf.ones([size // 4]))  # made on the worker, added on the ps
            return tf.constant(0.0)

        for name, fn in (("pull", pull), ("push", push)):
            # One call scheduled on a worker, waited for by fetching its scalar result; the first traces.
            probe = Timer(lambda fn=fn: coord.schedule(fn), name=name, sync_fn=lambda remote: remote.fetch())
            result["kv"].append({"op": name, "bytes": size,
                                 "samples_s": list(probe.measure(KV_REPS, warmup=1).samples_s)})
    return result


# Measuring -------------------------------------------------------------------------------------------

TRAINING, KV, LINK = ("asynchronous training, 1 ps", "key-value store: pull and push by size",
                      "the link to the ps host, as measured")
BLOCKS, KV_REPS = 8, 6  # timed blocks of training steps per cluster (one a turn); pulls and pushes per size


@dataclasses.dataclass(frozen=True)
class Found:
    results: dict[int, dict]  # per worker count: what the coordinator replied, and the timed blocks
    speedup: Comparison | None  # N workers against 1
    link: dict | None  # the link to the ps host as measured (--link), else None


def block_steps(steps: int) -> int:
    """Training steps per timed block: --steps shared out over BLOCKS blocks."""
    return max(1, steps // BLOCKS)


def ps_apart(job: str, index: int) -> int:
    """With emulated hosts: the ps on host 1, the coordinator and the workers on host 0."""
    return 1 if job == "ps" else 0


def start_cluster(workers: int, args, tmp: Path, servers: LocalCluster, where: Placement) -> TimerServer:
    """One ps and `workers` workers (started in `servers`) and a coordinator that serves its block timer, each
    task where `where` places it."""
    cluster = where.cluster({"chief": 1, "worker": workers, "ps": 1})
    base = [sys.executable, __file__, "--cluster", json.dumps(cluster), "--workers", workers]
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": "{}"}
    gpus = host_gpu_count()
    for job in ("ps", "worker"):
        for i in range(len(cluster[job])):
            # Parameter servers hold variables on the host: no GPU; each worker its own.
            visible = worker_gpus(i, gpus) if job == "worker" else []
            servers.start(f"{job}{i}-of-{workers}-workers",
                          where.command(job, i, [*base, "--role", "server", "--job", job, "--index", i]),
                          {**env, **child_gpu_env(visible)})
    return TimerServer(where.command("chief", 0, [
        *base, "--role", "coordinator", "--steps", args.steps, "--warmup", args.warmup, "--batch-size",
        args.batch_size, "--lr", args.lr, "--seed", args.seed, "--sizes", *args.sizes,
        *(["--profile", Path(args.profile).resolve()] if args.profile else [])]),
                        env={**os.environ, **env, **child_gpu_env([])}, timeout=args.timeout,
                        name=f"the coordinator of {workers} worker(s)")


def add_flags(p) -> None:
    flags.add_cluster_flags(p, sizes_help="pull/push sizes in bytes", link_help="run the ps on a host of its own")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    for internal in ("--role", "--cluster", "--job"):  # set by start_cluster for its processes
        p.add_argument(internal, help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, help=argparse.SUPPRESS)


def task(args) -> int:
    """A process of the cluster that start_cluster starts (--role server or coordinator)."""
    if args.role == "server":
        server(args)
        return 0
    print(reply(coordinator(args)), flush=True)  # after its last timer answer
    os._exit(0)  # skip teardown: the servers are killed next, and the eager context would try to reach them


def measure(args, rec) -> Found:
    # Baseline (1 worker) and N workers, both clusters up, running blocks of steps in turns ---------
    results = {}
    counts = sorted({1, args.workers})
    why = args.link and available()
    if why:
        raise RecipeError(why)
    with tempfile.TemporaryDirectory() as tmp, placed(args.link, 2, ps_apart) as where, \
            LocalCluster(Path(tmp) / "logs") as servers:
        link = where.link
        if link:
            rec.add(LINK, f"{args.link}: {where.where('chief', 0)} to {where.where('ps', 0)}", dict(where.link),
                    primary="measured_mbit_s", lower_is_better=False, versus_first=False)
        try:
            with contextlib.ExitStack() as stack:
                # One cluster gets ready (traces, warms up) before the next starts: none of it is timed.
                coordinators, timers = {}, []
                for n in counts:
                    coordinators[n] = stack.enter_context(start_cluster(n, args, Path(tmp), servers, where))
                    timers.append(coordinators[n].timer("block", f"{n} worker{'s' * (n > 1)}"))
                timed = interleave(timers, rounds=BLOCKS, samples=BLOCKS, warmup=0, seed=args.seed)
            for n, m in zip(counts, timed):  # each coordinator's result, replied after it was closed
                results[n] = {**coordinators[n].result, "timed": m}
        except (RuntimeError, OSError) as exc:  # a coordinator failed: the message carries its last lines
            raise ClusterError(f"the local cluster failed: {exc}") from None
    for n, r in results.items():
        print(f"{n} worker(s): {r['timed'].items_per_s:,.0f} samples/s over {BLOCKS} blocks of "
              f"{block_steps(args.steps)} steps", flush=True)
    speedup = versus(results[1]["timed"], results[args.workers]["timed"]) if args.workers > 1 else None
    for n, r in results.items():
        m = r["timed"]
        rec.add(TRAINING, m.name, {
            "steps_per_s": 1 / m.median_s, "samples_per_s": m.items_per_s,
            "final_loss": r["final_loss"], "test_accuracy": r["test_accuracy"]},
            primary="samples_per_s", lower_is_better=False, measurement=m, comparison=speedup if n > 1 else None)
    for kv in results[args.workers]["kv"]:
        m = Measurement(f"{kv['op']} {kv['bytes'] / 1024:,.0f} KiB", tuple(kv["samples_s"]))
        # Across a link: what the link alone allows, its round trip plus the bytes at its measured rate.
        allows = {"link_allows_ms": (link["rtt_us"] / 1e6 + kv["bytes"] * 8 / (link["measured_mbit_s"] * 1e6)) * 1e3
                  } if link else {}
        rec.add(KV, m.name, {"ms": m.median_s * 1e3, "gb_per_s": kv["bytes"] / m.median_s / 1e9, **allows},
                primary="ms", lower_is_better=True, versus_first=False, measurement=m)

    return Found(results, speedup, link)


def conclude(args, rec, found: Found) -> Conclusion:
    placement = found.results[args.workers]["placement"]
    line = f"the model's variables live on: {', '.join(placement)}"
    one, many = found.results[1], found.results[args.workers]
    speed = found.speedup or versus(one["timed"], many["timed"])
    kv = {(k["op"], k["bytes"]): float(np.median(k["samples_s"])) for k in many["kv"]}
    largest = max(b for _, b in kv) if kv else None
    traffic = (f" Pulling {largest / 2**20:.0f} MiB took {kv[('pull', largest)] * 1e3:.0f} ms and pushing it "
               f"{kv[('push', largest)] * 1e3:.0f} ms. Every step each worker pulls and pushes the whole model, so "
               f"with n workers the ps link carries 2n copies per round while a ring all-reduce sends 2(n-1)/n "
               f"per worker: one ps becomes the bottleneck as workers are added, which is why real deployments "
               f"shard the variables over several ps tasks." if largest else "")
    cores = usable_cores()
    if found.link and largest:
        link = found.link
        pull = next(r["metrics"] for r in rec.table(KV) if r["row"] == f"pull {largest / 1024:,.0f} KiB")
        why = (f"The ps ran on a host of its own behind a {args.link} link (measured {link['measured_mbit_s']:.0f} "
               f"Mbit/s, round trip {link['rtt_us']:.0f} us; the coordinator and the workers shared the other "
               f"host's core): pulling {largest / 2**20:.0f} MiB took {pull['ms']:.0f} ms where the link alone "
               f"allows {pull['link_allows_ms']:.0f} ms, so on a slow link every step waits on its pulls and pushes.")
    elif speed.verdict == FASTER:
        why = (f"One worker left this {cores}-core host idle between its steps (waiting on pulls and pushes); a "
               f"second filled those gaps.")
    elif speed.verdict == SLOWER:
        why = (f"On this {cores}-core host the workers share the cores with the ps and the coordinator, so more "
               f"workers added contention rather than compute.")
    else:
        why = (f"On this {cores}-core host the workers share the cores with the ps and the coordinator: what a "
               f"second worker overlapped, contention took back.")
    return Conclusion((
        f"The model's variables lived on {', '.join(placement)}; workers pulled and pushed them over gRPC. "
        f"{args.workers} asynchronous workers against one, in samples per second: {speed.describe()} (test "
        f"accuracy {many['test_accuracy']:.3f} against {one['test_accuracy']:.3f} after the same number of steps; "
        f"asynchronous workers apply gradients computed on parameters that others have since changed, and one "
        f"short run is noisy). {why}{traffic}"), [line],
        headline=Headline.compared(f"ParameterServerStrategy, {args.workers} asynchronous workers against 1",
                                   speed, rests_on=()))


# --steps here is the length of the timed training run, in blocks (asynchronous workers have no common step).
RECIPE = Recipe(name="parameter_server", doc=__doc__, order=110, measure=measure, conclude=conclude,
                add_flags=add_flags, task=task, uses=("steps", "warmup", "batch_size"),
                sizes={"steps": (400, 150), "warmup": (5, 2), "batch_size": (64, 64),
                       "sizes": ([4 ** k for k in range(5, 14, 2)], [4 ** k for k in range(5, 13, 2)])})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
