"""MultiWorkerMirroredStrategy: synchronous data parallelism over processes, configured by TF_CONFIG.

The recipe starts N worker processes on this host, each told its place in the cluster by TF_CONFIG;
they train the CNN together, each on its slice of every global batch, and all-reduce the gradients
with TensorFlow's own collective ops (a ring over gRPC on CPUs, NCCL on GPUs).

Run:   python recipes/multi_worker.py --quick        (about a minute on 2 CPU cores)
       python recipes/multi_worker.py --quick --link 1gbit   (as root: each worker on a host of its own)
Needs: TensorFlow 2.21 and Keras 3; free localhost ports. On real machines, run the worker part on
       each host with its own TF_CONFIG instead of letting this script start them. With --link each worker
       runs on an emulated host (a network namespace, its link shaped by tc), TF_CONFIG naming their addresses.
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
from tfperf.measure import (Measurement, Timer, TimerCluster, TimerServer, interleave, profiled, serve_timers,
                          versus)
from tfperf.cluster.errors import ClusterError
from tfperf.cluster.placement import Placement, placed
from tfperf.cluster.processes import tf_config
from tfperf.cluster.ring import ring_t2
from tfperf.cluster.hosts import available
from tfperf.measure.processes import reply
from tfperf.devices import usable_cores
from tfperf.gpus import child_gpu_env, host_gpu_count, worker_gpus
from tfperf.recipe import Conclusion, Headline, Recipe, RecipeError
from tfperf.measure.stats import FASTER, SLOWER

# The technique: one worker's part of synchronous training over processes ------------------------------
# Beyond one machine, `tf.distribute` needs one process per worker and a `TF_CONFIG` naming them all.
# The training step is the one any custom loop has, with two changes tagged `# MWMS:` below: the loss is
# averaged over the global batch, and the optimizer, called inside `strategy.run`, sums the workers'
# gradients with a collective all-reduce. The recipe runs 1 worker (the baseline) and N, checks that N
# workers train exactly like one process on the same global batches, and times the all-reduce by size.
# Both clusters stay up and take their timed steps in turns (shuffled rounds), so that this host's
# drift, tens of percent within a minute, falls on both and the speedup is judged round by round.


def worker(args) -> None:
    """One worker's part: runs in each process that TF_CONFIG describes."""
    import keras
    import tensorflow as tf

    from tfperf.data import load_arrays
    from tfperf.models import get_net

    n_workers = len(json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {}).get("worker", [None]))
    tf.config.threading.set_intra_op_parallelism_threads(max(1, usable_cores() // n_workers))  # share the cores
    # MWMS: reads TF_CONFIG, starts this worker's server, and waits for the others
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ctx_index = strategy.cluster_resolver.task_id if n_workers > 1 else 0
    data = load_arrays("mnist-5k", seed=args.seed)
    global_batch = args.batch_size  # the same global batch whatever the worker count: comparable training

    def worker_batches(seed, repeat):
        def make(ctx):  # MWMS: each worker takes its own slice of every global batch
            share = ctx.get_per_replica_batch_size(global_batch)
            ds = tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train)).shuffle(len(data.x_train), seed)
            ds = (ds.repeat() if repeat else ds).batch(global_batch, drop_remainder=True)
            i = ctx.input_pipeline_id
            return ds.map(lambda x, y: (x[i * share:(i + 1) * share], y[i * share:(i + 1) * share])).prefetch(2)
        return iter(strategy.distribute_datasets_from_function(make))

    with strategy.scope():  # MWMS: variables are mirrored, and start equal on every worker
        keras.utils.set_random_seed(args.seed)
        model = get_net("cnn")
        optimizer = keras.optimizers.SGD(args.lr)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(batch):
        def step(x, y):
            with tf.GradientTape() as tape:
                # MWMS: average over the global batch, so that summed gradients are the global mean's
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)), global_batch_size=global_batch)
            # MWMS: inside strategy.run the optimizer all-reduces (sums) the gradients before the update
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(step, args=batch), axis=None)

    # Agreement: fixed batches, a few steps; every worker saves what it holds.
    fixed = worker_batches(seed=1, repeat=False)
    losses = [float(train_step(next(fixed))) for _ in range(AGREEMENT_STEPS)]
    np.savez(Path(args.weights_dir) / f"n{n_workers}-worker{ctx_index}.npz", *[v.numpy() for v in model.weights])

    # Speed: this cluster stays up and takes steps when the recipe asks, in turns with the other cluster,
    # so that the two are compared round by round. Every worker is asked for the same steps at once (each
    # step is a collective); the clock waits for the step's loss without copying it to the host.
    batches = worker_batches(seed=args.seed, repeat=True)
    step = Timer(lambda: train_step(next(batches)), name="step", items_per_call=global_batch)
    serve_timers([step], warmup=args.warmup)
    # --profile traces extra steps on all the workers, never the timed ones.
    if args.profile:
        with profiled(args.profile if ctx_index == 0 else None, f"worker0-of-{n_workers}"):
            step.take(PROFILE_STEPS)
    result = {"workers": n_workers, "global_batch": global_batch, "agreement_losses": losses, "allreduce": []}

    for size in ([] if n_workers == 1 else args.sizes):
        # The tensor is made inside the replica function: all_reduce needs a value that lives on the replica.
        allreduce = tf.function(lambda: strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.ones([size // 4]))))
        # The first call traces and sets up the collective group; the clock waits for the reduced tensor
        # without copying it to the host.
        reps = Timer(allreduce, name=f"all-reduce {size}").measure(ALLREDUCE_REPS, warmup=1)
        result["allreduce"].append({"bytes": size, "samples_s": list(reps.samples_s)})
    if ctx_index == 0:  # the chief's result, after its last timer answer
        print(reply(result), flush=True)


# Measuring -------------------------------------------------------------------------------------------

TRAINING, ALLREDUCE, LINK = ("training, same global batch", "collective all-reduce by size",
                             "the links between the workers' hosts, as measured")
AGREEMENT_STEPS, TOLERANCE = 5, 1e-4
ALLREDUCE_REPS, PROFILE_STEPS = 6, 5  # timed all-reduces per size; steps traced under --profile
ROUNDS = 10  # turns each cluster takes, --steps shared out among them


@dataclasses.dataclass(frozen=True)
class Found:
    results: dict[int, dict]  # per worker count: what the chief replied, and the timed steps
    weight_diff: float  # N workers' weights against one process's after the agreement steps
    between: float  # and between the N workers
    link: dict | None  # the link between the workers' hosts as measured (--link), else None


def own_host(job: str, index: int) -> int:
    """With emulated hosts: worker i on host i."""
    return index


def start_workers(n: int, args, tmp: Path, where: Placement) -> TimerCluster:
    """Start n worker processes with their TF_CONFIG, as one cluster of timer processes, each where `where`
    places it."""
    cluster = where.cluster({"worker": n})
    cmd = [sys.executable, __file__, "--role", "worker", "--weights-dir", tmp, "--batch-size", args.batch_size,
           "--warmup", args.warmup, "--seed", args.seed, "--lr", args.lr,
           "--sizes", *args.sizes, *(["--profile", Path(args.profile).resolve()] if args.profile else [])]
    # One GPU (or a share of them) per worker: each replica takes its slice of the global batch.
    gpus = host_gpu_count()
    return TimerCluster([TimerServer(where.command("worker", i, cmd), timeout=args.timeout, name=f"worker {i} of {n}", env={
        **os.environ, "TF_CONFIG": tf_config(cluster, "worker", i) if n > 1 else "{}", "TF_CPP_MIN_LOG_LEVEL": "2",
        **child_gpu_env(worker_gpus(i, gpus))}) for i in range(n)])


def add_flags(p) -> None:
    flags.add_cluster_flags(p, sizes_help="all-reduce sizes in bytes", link_help="run each worker on a host of its own")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--role", choices=["worker"], help=argparse.SUPPRESS)  # internal: a started worker
    p.add_argument("--weights-dir", help=argparse.SUPPRESS)


def measure(args, rec) -> Found:
    if args.batch_size % args.workers:
        raise RecipeError(f"the global --batch-size {args.batch_size} must split evenly over "
                          f"{args.workers} workers: use a multiple of {args.workers}")

    why = args.link and available()
    if why:
        raise RecipeError(why)
    # Baseline (1 worker) and N workers, both clusters up, taking steps in turns ------------------
    with tempfile.TemporaryDirectory() as tmp, placed(args.link, args.workers, own_host) as where:
        tmp = Path(tmp)
        link = where.link
        if link:
            rec.add(LINK, f"{args.link}: {', '.join(where.where('worker', i) for i in range(args.workers))}",
                    dict(where.link), primary="measured_mbit_s", lower_is_better=False, versus_first=False)
        counts = sorted({1, args.workers})
        try:
            with contextlib.ExitStack() as stack:
                # One cluster gets ready (traces, compiles, warms up) before the next starts: none of it is timed.
                clusters, timers = {}, []
                for n in counts:
                    clusters[n] = stack.enter_context(start_workers(n, args, tmp, where))
                    timers.append(clusters[n].timer("step", f"{n} worker{'s' * (n > 1)}"))
                timed = dict(zip(counts, interleave(timers, rounds=ROUNDS, samples=args.steps, warmup=0,
                                                    seed=args.seed)))
            # The chief's result, replied after the clusters were closed.
            results = {n: {**clusters[n].processes[0].result, "timed": timed[n]} for n in counts}
        except (RuntimeError, OSError) as exc:  # a worker failed: the message carries its last lines
            raise ClusterError(f"the local cluster failed: {exc}") from None
        for n in counts:
            m = results[n]["timed"]
            print(f"{m.name}: {m.median_s * 1e3:.1f} ms per step of {results[n]['global_batch']}", flush=True)
        one = dict(np.load(tmp / "n1-worker0.npz"))
        many = [dict(np.load(tmp / f"n{args.workers}-worker{i}.npz")) for i in range(args.workers)]
    weight_diff = max(float(np.max(np.abs(many[0][k] - one[k]))) for k in one)
    between = max(float(np.max(np.abs(m[k] - many[0][k]))) for m in many for k in one)

    one = results[1]["timed"]
    for n, r in results.items():
        m = r["timed"]
        rec.add(TRAINING, m.name, {
            "ms_per_step": m.median_s * 1e3, "samples_per_s": m.items_per_s, "global_batch": r["global_batch"],
            "max_weight_diff_vs_1": weight_diff if n > 1 else 0.0, "max_diff_between_workers": between if n > 1 else 0.0},
            primary="samples_per_s", lower_is_better=False, measurement=m,
            comparison=versus(one, m) if n > 1 else None)
    for a in results[args.workers]["allreduce"]:
        m = Measurement(f"{a['bytes'] / 1024:,.0f} KiB", tuple(a["samples_s"]))
        # Across links: the ring model from the measured link, 2(n-1)/n S/B + 2(n-1) latency.
        model = {"ring_model_ms": ring_t2(args.workers, a["bytes"], link["rtt_us"] / 2e6,
                                          link["measured_mbit_s"] * 1e6 / 8) * 1e3} if link else {}
        rec.add(ALLREDUCE, m.name, {"ms": m.median_s * 1e3, "gb_per_s": a["bytes"] / m.median_s / 1e9, **model},
                primary="ms", lower_is_better=True, versus_first=False, measurement=m)

    return Found(results, weight_diff, between, link)


def conclude(args, rec, found: Found) -> Conclusion:
    results, weight_diff, between = found.results, found.weight_diff, found.between
    agrees = weight_diff <= TOLERANCE and between == 0.0
    # Same global batch: the ratio of samples/s, paired round by round.
    speed = versus(results[1]["timed"], results[args.workers]["timed"])
    line = (f"{args.workers} workers vs 1: {speed.describe()}; same training as one process: {agrees} "
          f"(max weight difference {weight_diff:.2g}, between workers {between:g})")

    cores = usable_cores()
    if found.link:
        link = found.link
        why = (f"Each worker ran on a host of its own behind a {args.link} link (measured "
               f"{link['measured_mbit_s']:.0f} Mbit/s, round trip {link['rtt_us']:.0f} us, addresses "
               f"{link['addresses']}): its share of the batch against one process on one host, plus the "
               f"gradients' all-reduce over that link.")
    elif speed.verdict == SLOWER:
        why = (f"On this {cores}-core host the workers share the cores and pay for the collective over gRPC, so "
               f"they lose to one process that uses all cores; across machines each worker brings its own.")
    elif speed.verdict == FASTER:
        why = (f"One process did not keep this host's {cores} cores busy with a batch of {args.batch_size}; "
               f"{args.workers} processes with a share of the threads each did, despite the collective.")
    else:
        why = (f"The cores the workers share on this {cores}-core host and the collective over gRPC cost about "
               f"what splitting the batch gained; across machines each worker brings its own cores.")
    sweep = results[args.workers]["allreduce"]
    small, large = (sweep[0], sweep[-1]) if sweep else (None, None)
    seconds = lambda a: float(np.median(a["samples_s"]))  # noqa: E731
    ring = (f" The all-reduce takes {seconds(small) * 1e3:.1f} ms for {small['bytes'] / 1024:.0f} KiB, where latency "
            f"dominates, and reaches {large['bytes'] / seconds(large) / 1e9:.2f} GB/s at {large['bytes'] / 2**20:.0f} "
            f"MiB: in a ring each worker sends 2(n-1)/n of the tensor whatever n is, so the bandwidth term does "
            f"not grow with the number of workers, only the 2(n-1) latency steps do." if sweep else "")
    return Conclusion((
        f"{args.workers} worker processes trained {'exactly ' if agrees else 'NOT '}like one process on the same "
        f"global batches (weights within {weight_diff:.2g} after {AGREEMENT_STEPS} steps; workers identical to "
        f"{between:g}). Against one process: {speed.describe()}. {why}{ring}"), [line],
        "" if agrees else "the workers did not train like one process",
        Headline.compared(f"MultiWorkerMirroredStrategy, {args.workers} worker processes against 1, same global "
                          f"batch", speed, rests_on=()))


def task(args) -> int:
    """A started worker (--role worker)."""
    worker(args)
    return 0


RECIPE = Recipe(name="multi_worker", doc=__doc__, order=100, measure=measure, conclude=conclude, add_flags=add_flags,
                task=task, uses=("steps", "warmup", "batch_size"),
                sizes={"steps": (100, 40), "warmup": (5, 3), "batch_size": (128, 128),
                       "sizes": ([4 ** k for k in range(5, 14)], [4 ** k for k in range(5, 13)])})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
