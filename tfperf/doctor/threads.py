"""Threads: "how many threads? Is oneDNN helping? Does my thread setting take effect?"

TensorFlow's thread pools, each setting in a process of its own (they are fixed when TensorFlow starts)."""

from __future__ import annotations

import os

from tfperf import flags
from tfperf.deploy.inputs import make_inputs, to_tensors
from tfperf.deploy.loader import Subject
from tfperf.doctor.experiment import Context, Experiment, Section, child_command, flag
from tfperf.doctor.options import MIN_GAIN, Finding, Options, load_given, model_flags, model_parser
from tfperf.gpus import child_gpu_env


def thread_configs(cores: int) -> list[tuple[str, int | None, int | None, dict[str, str]]]:
    """(row, intra-op threads, inter-op threads, environment): TensorFlow's default first; one pool of 1, of each
    power of two between, and of all cores; a split pool where there are cores to split; then TensorFlow's default
    pools with oneDNN off, and with OpenMP held to one thread (it applies only where a build runs on OpenMP)."""
    configs = [("default threads", None, None, {}), ("intra 1, inter 1", 1, 1, {})]
    counts = [2 ** k for k in range(1, cores.bit_length()) if 2 ** k < cores] + ([cores] if cores > 1 else [])
    configs += [(f"intra {n}, inter 1", n, 1, {}) for n in counts]
    if cores >= 4:
        configs.append((f"intra {cores // 2}, inter 2", cores // 2, 2, {}))
    configs.append(("oneDNN off (TF_ENABLE_ONEDNN_OPTS=0)", None, None, {"TF_ENABLE_ONEDNN_OPTS": "0"}))
    configs.append(("OMP_NUM_THREADS=1", None, None, {"OMP_NUM_THREADS": "1"}))
    return configs


# How each kind of setting is applied in the user's program: all are fixed when TensorFlow starts.
APPLY = {
    "TF_ENABLE_ONEDNN_OPTS": "export TF_ENABLE_ONEDNN_OPTS=0  # in the environment, before Python imports TensorFlow",
    "OMP_NUM_THREADS": "export OMP_NUM_THREADS=1  # in the environment, before Python imports TensorFlow",
}
FRESH = ("fixed when TensorFlow starts: measured in a process of its own; in a running process it takes effect only "
         "if set before TensorFlow runs its first op (tf.config.threading raises RuntimeError after) or, for an "
         "environment variable, before TensorFlow is imported")


def thread_batches(subject: Subject, options: Options) -> list[int]:
    """The sweep's smallest and largest batch sizes (latency and throughput), those the model takes."""
    return sorted({b for b in (min(options.batch_sizes), max(options.batch_sizes)) if subject.fixed_batch in (None, b)})


def threads(subject: Subject, rec, options: Options, progress) -> tuple[list[Finding], dict]:
    """Thread pools swept in processes of their own (they are fixed when TensorFlow starts), interleaved."""
    from tfperf.measure import TimerServer
    from tfperf.records.jsonl import race_table

    from tfperf.deploy.limits import MEMORY_SHARE
    from tfperf.flags import available_memory

    configs = thread_configs(os.cpu_count() or 1)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **child_gpu_env([])}
    batches = thread_batches(subject, options)
    free = available_memory()  # the children run side by side: each may take its share more, and stops past it
    ceiling = ["--child-memory-limit", str(int(MEMORY_SHARE * free / len(configs)))] if free else []
    processes = []
    try:
        for row, intra, inter, extra_env in configs:  # started side by side; each says when it is ready
            argv = child_command("threads", subject.source, "--batch-sizes", ",".join(map(str, batches)),
                                 "--seed", str(options.seed), *model_flags(subject, options), *ceiling)
            if intra is not None:
                argv += ["--intra", str(intra), "--inter", str(inter)]
            # Thread pools are the CPU's: the sweep runs without GPUs, beside the GPU the parent holds.
            processes.append(TimerServer(argv, env={**env, **extra_env}))
        findings = []
        for batch in batches:
            progress(f"threads at batch {batch}")
            timers = [process.timer(f"batch {batch}", name=row) for (row, *_), process in zip(configs, processes)]
            by_row = {t.name: t for t in timers}
            table = f"threads at batch {batch}"
            # Beside each setting, the cores its process kept busy: a setting that does not take effect shows.
            raced = race_table(rec, table, timers, metrics=lambda m, _: {
                "ms_per_call": m.median_s * 1e3, "p99_ms": m.p99_s * 1e3, "rows_per_s": m.items_per_s,
                "cores_used": by_row[m.name].cores_used(), "batch": batch},
                primary="ms_per_call" if batch == 1 else "rows_per_s", lower_is_better=batch == 1,
                rounds=options.rounds, threshold=MIN_GAIN, max_extensions=options.max_extensions,
                min_time_s=options.min_time_s, seed=options.seed)
            default_cores = by_row[configs[0][0]].cores_used()
            for row, intra, inter, extra_env in configs[1:]:
                used = by_row[row].cores_used()
                code = (APPLY[next(iter(extra_env))] if extra_env else
                        f"tf.config.threading.set_intra_op_parallelism_threads({intra}); "
                        f"tf.config.threading.set_inter_op_parallelism_threads({inter})  # before TensorFlow runs an op")
                findings.append(Finding(
                    table, row, configs[0][0], raced.comparisons[row], code,
                    f"{cores_text(used, default_cores, limits=bool(extra_env.get('OMP_NUM_THREADS')) or intra == 1)}"
                    f"; {FRESH}; process-wide: a server running several models side by side divides the cores "
                    f"between them"))
        return findings, {}
    finally:
        for process in processes:
            process.close()


def cores_text(used: float | None, default: float | None, *, limits: bool) -> str:
    """The cores a setting's process kept busy beside the default's, and whether a setting meant to hold it to
    fewer took effect."""
    if used is None or default is None:
        return "cores used not measured"
    said = f"its process kept {used:.1f} cores busy (the default {default:.1f})"
    if limits and default > 1.2 and used > 0.9 * default:
        said += ": this setting did not take effect here"
    return said


def child(argv: list[str]) -> int:
    """A thread-sweep process: its thread pools set before TensorFlow runs anything, it times the model."""
    parser = model_parser("threads")
    parser.add_argument("--batch-sizes", type=lambda text: [int(b) for b in text.split(",")], default=[1])
    parser.add_argument("--intra", type=flags.positive_int)
    parser.add_argument("--inter", type=flags.positive_int)
    parser.add_argument("--child-memory-limit", type=int)  # bytes it may take beyond what it holds on starting
    args = parser.parse_args(argv)
    import tensorflow as tf

    from tfperf.measure import Timer, serve_timers

    if args.intra is not None:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra)
        tf.config.threading.set_inter_op_parallelism_threads(args.inter)
    from tfperf.deploy.limits import ceiling_beyond_now, ceilings

    # Its share counts from what it holds with TensorFlow imported: 800 MB, past the whole share of a machine whose
    # memory other work held (seen in CI: "the model took 838 MB of memory, past the 377 MB ceiling").
    memory = None if args.child_memory_limit is None else ceiling_beyond_now(args.child_memory_limit)
    with ceilings("doctor", None, memory):
        subject, sample = load_given(args)
        graph = tf.function(subject.call)
        timers = []
        for batch in args.batch_sizes:
            tensors = subject.pack(to_tensors(make_inputs(subject, batch, seed=args.seed, sample=sample)))
            timers.append(Timer(lambda t=tensors: graph(t), name=f"batch {batch}", items_per_call=batch))
        serve_timers(timers)
    return 0


def run(ctx: Context) -> Section:
    """The thread sweep as a section of the report."""
    findings, skipped = threads(ctx.subject, ctx.recorder, ctx.options, ctx.progress)
    return Section(EXPERIMENT.name, findings, skipped)


EXPERIMENT = Experiment(
    name="threads", question="How many threads? Is oneDNN helping? Does my thread setting take effect?",
    run=run, applies=lambda subject, options: options.threads,
    steps=lambda subject, options: [f"threads at batch {b}" for b in thread_batches(subject, options)],
    flags=(flag("--no-threads", action="store_true", help="skip the thread-pool sweep (it starts processes)"),))
