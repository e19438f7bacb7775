"""The training ladder: one model, one data set, one change at a time from plain `model.fit`.

Each rung adds one technique to the best configuration so far and keeps it only if it is measurably
faster and no less accurate: the last kept rung is the best configuration this machine found.

Run:   python recipes/training_ladder.py --quick          (3-5 minutes on 2 CPU cores; more near the bar)
       python recipes/training_ladder.py --model resnet18 (slow on a CPU)
Needs: TensorFlow 2.21 and Keras 3; mnist-5k works offline.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import math
import sys

import keras
import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.measure import rounds
from tfperf.measure import Timer, peak_matmul_flops_per_s, versus
from tfperf.data import load_arrays, to_dataset
from tfperf.models import flops, get_net
from tfperf.gpus import mixed_policy_here
from tfperf.precision import dtype_policy, hardware_summary
from tfperf.recipe import Conclusion, Headline, Recipe
from tfperf.measure.stats import FASTER, Comparison
from tfperf.train import accuracy, fit_epochs

# The technique: the settings a training run can change, in the Keras calls that change them ---------


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration: plain `model.fit(x, y)` is Config()."""

    batch: int = 32  # Keras' default for arrays
    jit: bool | str = "auto"  # Keras' default: XLA on GPUs, not on CPU-only machines
    steps_per_execution: int = 1
    pipeline: str = "arrays"  # or "tf.data"
    policy: str = "float32"
    custom_loop: bool = False


class Trainer:
    """One configuration from the seed's initial weights; each call of `epoch` trains one more epoch."""

    def __init__(self, cfg: Config, model_name: str, data, lr: float, seed: int, width: int = 1):
        self.cfg, self.data, self.losses = cfg, data, []
        self.quality: tuple[float, float] | None = None  # (final loss, test accuracy) after the first rounds
        keras.utils.set_random_seed(seed)
        # Mixed precision: layers built under the policy compute in 16 bits and keep float32 variables
        # (a program calls keras.config.set_dtype_policy(...) once; scoped here so that rungs can differ)
        with dtype_policy(cfg.policy):
            self.model = get_net(model_name, input_shape=data.input_shape, num_classes=data.num_classes, width=width)
        # Larger batches take fewer steps per epoch; the square-root rule keeps Adam's progress per epoch similar.
        optimizer = keras.optimizers.Adam(lr * math.sqrt(cfg.batch / 32))
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        # tf.data, in the order TensorFlow's guide gives: cache the examples, then shuffle each epoch anew, batch,
        # and prefetch last, so that the next batch is made while the step runs
        self.ds = to_dataset(data.x_train, data.y_train, batch_size=cfg.batch, seed=seed, cache=True)
        if cfg.custom_loop:
            if cfg.policy == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # fit adds it itself; a loop must
            model = self.model

            # A custom loop: the step compiles with XLA as fit would compile it (see `xla`). Only the step: XLA
            # cannot compile tf.data's iterator ops, so the loop over the dataset stays outside it, as in fit.
            @tf.function(jit_compile=self.xla)
            def train_step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                    scaled = optimizer.scale_loss(loss)
                grads = tape.gradient(scaled, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            # The whole epoch is one graph call: no Python between steps. One iterator over the repeated dataset
            # serves every epoch (each pass still reshuffles): a new iterator per epoch (`iter(ds)` each call) is
            # torn down when the epoch returns, and that waited for tf.data's threads, 0.15 s here in one epoch of
            # three (0.30 s epochs beside 0.15 s ones). The loop over the iterator becomes a while loop; `for x, y
            # in ds` over the dataset itself would become a dataset reduce that runs every step as a tf.data
            # function (1.6-1.7x slower here on 2 cores).
            @tf.function
            def train_epoch(batches, steps):
                total = tf.constant(0.0)
                for _ in tf.range(steps):
                    x, y = next(batches)
                    total += train_step(x, y)
                return total / tf.cast(steps, tf.float32)

            self.batches, self.steps = iter(self.ds.repeat()), tf.constant(int(self.ds.cardinality()))
            self.train_epoch = train_epoch
        else:
            # XLA and several steps per call are compile() settings
            self.model.compile(optimizer=optimizer, loss=loss_fn, jit_compile=cfg.jit,
                               steps_per_execution=cfg.steps_per_execution)
            tf_data = cfg.pipeline == "tf.data"
            self.fit_epoch, self.losses = fit_epochs(
                self.model, self.ds if tf_data else data.x_train, None if tf_data else data.y_train,
                batch_size=None if tf_data else cfg.batch, shuffle=not tf_data)

    def epoch(self):
        """One epoch; `fit` reports the epoch's own time, without the set-up each `fit` call does."""
        if not self.cfg.custom_loop:
            return self.fit_epoch()
        loss = self.train_epoch(self.batches, self.steps)
        self.losses.append(loss)
        return loss

    @property
    def xla(self) -> bool:
        """Whether the step compiles with XLA: Keras' jit_compile="auto" resolved as fit resolves it (XLA on GPUs)."""
        if self.cfg.custom_loop:
            return self.cfg.jit is True or (self.cfg.jit == "auto" and bool(self.model.jit_compile))
        return bool(self.model.jit_compile)


# Measuring --------------------------------------------------------------------------------------------
# Performance advice comes as a list: compile with XLA, run several steps per call, raise the batch,
# tune the input pipeline, use mixed precision, write the training step yourself. Whether each helps
# depends on the model and the machine, so this recipe measures them in order on the same model and
# data. Every rung trains from the same initial weights for the same number of epochs (the same
# examples seen), so its test accuracy shows a rung that is faster but worse. MFU (model FLOPs
# utilisation) is the training FLOPs per second over the matmul FLOP/s measured in this same run, in the
# precision the configuration computes in (bfloat16's peak for a mixed_bfloat16 row).
#
# A rung is judged against the best configuration so far trained beside it: one epoch of each in turn,
# in shuffled order, for several rounds, so that the machine's drift falls on both. The rung is kept
# only when the 95% confidence interval of its speedup lies above its bar: 1 + MIN_GAIN for a setting,
# 1 + CUSTOM_LOOP_GAIN for the custom loop, code to maintain rather than a setting. When the interval
# straddles that bar (or its mirror for "slower"), the race runs more rounds, up to MAX_EXTENSIONS
# times, before it decides: a rung whose gain is near the bar is settled by more data rather than by
# the noise of one run, so that reruns keep the same configuration. (Looking again after more data
# widens the true error rate a little beyond the nominal 5%; the extensions are few and the bar is
# above 1, which keeps the cost small.) A rung whose interval still straddles the bar after them is
# not kept and is called unsettled: its gain is near the bar, and on these noisy epochs (a tenth of
# an epoch's time from one to the next on 2 shared cores) a rerun may keep it. The batch is raised
# while it pays: once a batch size is not kept, larger ones are not tried.

TABLE, FINAL = "training ladder", "best configuration vs plain fit"
# More rounds for a race whose CI straddles a bar, at most this many times. Four: tf.data's rung (1.06-1.10x)
# was still unsettled after two (1.06x, 95% CI 1.01-1.12x after 18 rounds) in one run of five.
MAX_EXTENSIONS = 4
ACCURACY_TOLERANCE = 0.05  # a rung may lose at most this much test accuracy against plain fit
MIN_GAIN = 0.02  # and its speedup's CI must clear 1.02: gains smaller than this are not worth a change
# A custom loop is not a setting but code the user then owns: fit's callbacks, checkpoints, distribution
# and progress reporting are theirs to rewrite, and it must pay for that: 10%. Against fit with
# steps_per_execution=16, which already runs 16 steps per graph call, it measured 1.04x (95% CI 0.99-1.08x
# over 40 rounds) here, at the 2% bar: runs kept it or called it unsettled, and the kept set moved with it.
CUSTOM_LOOP_GAIN = 0.10
HEADLINE_ROUNDS = 3  # the headline race runs this many times the rounds of a rung's


@dataclasses.dataclass(frozen=True)
class Found:
    kept: list[str]  # plain fit, then each kept rung in order
    verdicts: dict[str, tuple[Comparison, bool, str]]  # rung -> (against the best so far, accurate enough, that best)
    untried: list[str]  # batch sizes left out once a smaller one did not pay
    headline: Comparison | None  # the best configuration against plain fit, raced side by side
    top: dict  # the best configuration's metrics
    plain_mfu: float
    mixed: str  # the mixed policy this hardware gets
    gpu: bool
    xla_row: str = "jit_compile=True"  # the XLA rung: jit_compile=False where Keras' "auto" already means XLA


def compute_dtype(cfg: Config) -> str:
    """The precision a configuration's matmuls run in: its policy's compute dtype (mixed_bfloat16: bfloat16)."""
    return keras.DTypePolicy(cfg.policy).compute_dtype


def unsettled(c) -> bool:
    """The speedup's CI still straddles the keep bar after the extra rounds: a gain this near the bar
    is kept by some runs and not by others, which the reader should know."""
    low, high = c.ci95
    return low <= 1 + c.threshold < high


def reshuffles(ds) -> bool:
    """Whether two whole passes over a dataset give two orders (a cache after the shuffle replays the first)."""
    orders = [np.concatenate([np.asarray(y) for _, y in ds]) for _ in range(2)]
    return not np.array_equal(*orders)


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    flags.add_dataset_flag(p, "mnist-5k")
    p.add_argument("--rounds", type=flags.positive_int,
                   help="timed epochs of each configuration per comparison, after one untimed (compiling) epoch")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate at batch 32")
    p.add_argument("--batches", type=flags.positive_int, nargs="+", help="batch sizes of the sweep")
    p.add_argument("--train-size", type=flags.positive_int, help="training examples used (default: all)")
    p.add_argument("--width", type=flags.positive_int, default=1,
                   help="every hidden layer this many times wider: more arithmetic per step, so a higher MFU, "
                        "and less per-step overhead for the rungs to remove")


def measure(args, rec) -> Found:
    data = load_arrays(args.dataset, seed=args.seed)
    data = dataclasses.replace(data, x_train=data.x_train[:args.train_size], y_train=data.y_train[:args.train_size])
    gpu = bool(tf.config.list_physical_devices("GPU"))
    # float16 tensor cores from compute capability 7.0, bfloat16 from 8.0; CPUs have bf16 at best.
    mixed = mixed_policy_here() or "mixed_float16"  # below 7.0 the rung shows what emulation costs
    # The matmul peak is the best of one measurement now and one after each race: this machine's speed moves in
    # phases of seconds (a fixed Python loop took 6 ms or 11 ms, flipping), and one measurement that fell in a
    # slow phase (239 GFLOP/s against 438-451 in four other runs) nearly doubled every MFU of its run. A
    # configuration's MFU is against the peak of the precision it computes in: under mixed_bfloat16 the matmuls run
    # in bfloat16, whose peak here was 1.7x float32's (753-767 GFLOP/s against 399-444), and a float32 roof put the
    # mixed rows of a --width 4 run at 62% MFU where they ran at 36% of their own.
    peaks: dict[str, list[float]] = {"float32": [peak_matmul_flops_per_s()]}

    def measure_peaks(*configs: Config) -> None:
        """One more measurement of the peak of each precision these configurations compute in (the first of a
        precision over three sizes, later ones at 2048 only)."""
        for dtype in {compute_dtype(c) for c in configs}:
            if dtype in peaks:
                peaks[dtype].append(peak_matmul_flops_per_s(sizes=(2048,), dtype=dtype, steps=3))
            else:
                peaks[dtype] = [peak_matmul_flops_per_s(dtype=dtype)]

    net = get_net(args.model, input_shape=data.input_shape, num_classes=data.num_classes, width=args.width)
    train_flops = 3 * flops(net)
    # Keras' default jit_compile="auto" means XLA on GPUs, not on CPU-only hosts: asked of Keras itself (an
    # uncompiled model's jit_compile), so that the XLA rung compares XLA with its absence, either way.
    auto_xla = bool(net.jit_compile)
    xla_row, xla_setting = ("jit_compile=False", False) if auto_xla else ("jit_compile=True", True)
    examples = len(data.x_train)
    wider = f" ({args.width}x wider)" if args.width > 1 else ""
    print(f"{args.model}{wider} on {args.dataset}: {examples} training examples, {args.rounds} timed epochs per "
          f"configuration and comparison; {train_flops / 1e6:.1f} MFLOP per training example; matmul peak "
          f"{peaks['float32'][0] / 1e9:.0f} GFLOP/s (float32) so far; {hardware_summary()}; Keras' "
          f"jit_compile='auto' (plain fit's) resolves to {auto_xla} here", flush=True)

    def race(a: tuple[str, Config], b: tuple[str, Config], repeat: int = 1, bar: float = MIN_GAIN):
        """Train both from the same initial weights, an epoch of each in turn: their Measurements, the
        speedup of b over a, and the Trainers. While the speedup's CI straddles a verdict's boundary, the
        race goes on, `rounds` more epochs of each at a time, up to MAX_EXTENSIONS times: a gain near
        the bar is then settled by more data, not by which side this run's noise fell on."""
        trainers = [Trainer(cfg, args.model, data, args.lr, args.seed, args.width) for _, cfg in (a, b)]
        timers = [Timer(t.epoch, name=row, items_per_call=examples) for (row, _), t in zip((a, b), trainers)]

        # Loss and accuracy after the first rounds, the same epochs for every rung; extra rounds only add timings.
        def quality(_):
            for t in trainers:
                t.quality = (float(t.losses[-1]), accuracy(t.model, data.x_test, data.y_test))

        # --profile traces one more epoch of each, after the timed ones.
        ms, (c,) = rounds.race(timers, rounds=repeat * args.rounds, samples=repeat * args.rounds, threshold=bar,
                              max_extensions=MAX_EXTENSIONS, warmup=0, seed=args.seed, profile_dir=args.profile,
                              profile_steps=1, on_first_rounds=quality)
        measure_peaks(a[1], b[1])
        return ms, c, trainers

    def record(table, row, m, trainer, comparison=None, kept=None):
        loss, acc = trainer.quality
        dtype = compute_dtype(trainer.cfg)
        metrics = {"samples_per_s": m.items_per_s, "mfu": train_flops * m.items_per_s / max(peaks[dtype]),
                   "mfu_against": f"{dtype} matmul peak",
                   "first_epoch_s": m.first_call_s, "final_loss": loss, "test_accuracy": acc,
                   "xla": trainer.xla, "batch": trainer.cfg.batch}
        if trainer.cfg.pipeline == "tf.data" or trainer.cfg.custom_loop:  # accuracy cannot see a frozen order
            metrics["order_changes_each_epoch"] = reshuffles(trainer.ds)
        if kept is not None:
            metrics["kept"] = kept
        if comparison is not None and table == TABLE:
            metrics["keep_bar"] = 1 + comparison.threshold  # the speedup its CI had to clear
        rec.add(table, row, metrics, primary="samples_per_s", lower_is_better=False, measurement=m,
                comparison=comparison)
        return metrics

    # The ladder: each rung changes one thing in the best configuration so far ---------------------
    # The batch is raised after the precision rung: what a larger batch saves depends on what a step costs, and
    # mixed precision changes that. Under float32 batch 256 was no faster than 128 here (1.03x), under
    # mixed_bfloat16 1.18x (95% CI 1.05-1.41x): raised first, the sweep stopped at 128 in 4 runs of 5, and the
    # headline moved with that decision. The input pipeline comes after the batch: what it saves is a cost per
    # example, which weighs more as the step's own cost per example falls. At batch 32 it measured 1.06-1.11x,
    # near the bar (unsettled after 30 rounds in one run of six); at batch 256 under mixed_bfloat16 1.11-1.19x.
    rungs = [(xla_row, lambda c: dataclasses.replace(c, jit=xla_setting), MIN_GAIN),  # XLA: fuse the step's ops
             ("steps_per_execution=16", lambda c: dataclasses.replace(c, steps_per_execution=16), MIN_GAIN),
             (mixed, lambda c: dataclasses.replace(c, policy=mixed), MIN_GAIN),
             *[(f"batch {b}", lambda c, b=b: dataclasses.replace(c, batch=b), MIN_GAIN)
               for b in sorted(set(args.batches))],
             ("tf.data input (cache, prefetch)", lambda c: dataclasses.replace(c, pipeline="tf.data"), MIN_GAIN),
             ("custom tf.function loop", lambda c: dataclasses.replace(c, custom_loop=True, pipeline="tf.data"),
              CUSTOM_LOOP_GAIN)]
    best = ("plain fit", Config())
    plain = None
    verdicts, untried = {}, []

    def kept_row(row: str) -> bool:
        c, accurate, _ = verdicts[row]
        return c.verdict == FASTER and accurate

    for row, change, bar in rungs:
        # Raise the batch while it pays: once a batch size is not kept, larger ones are not tried.
        if row.startswith("batch ") and any(r.startswith("batch ") and not kept_row(r) for r in verdicts):
            untried.append(row)
            continue
        rival, base = change(best[1]), best
        # The custom loop iterates a tf.data pipeline: where the tf.data rung was not kept, the loop races fit over
        # that same pipeline, or its figure would be the pipeline's gain and the loop's together (1.18x once, where
        # the loop alone measured 1.01-1.08x).
        if rival.custom_loop and best[1].pipeline != rival.pipeline:
            base = (f"{best[0]}, over tf.data", dataclasses.replace(best[1], pipeline=rival.pipeline))
        (m_best, m_rung), c, (t_best, t_rung) = race(base, (row, rival), bar=bar)
        if plain is None:  # the first race's baseline is plain fit itself
            plain = record(TABLE, "plain fit", m_best, t_best, kept=True)
        metrics = record(TABLE, row, m_rung, t_rung, comparison=c, kept=False)
        accurate = math.isfinite(metrics["final_loss"]) and metrics["test_accuracy"] >= (
            plain["test_accuracy"] - ACCURACY_TOLERANCE) and metrics.get("order_changes_each_epoch", True)
        verdicts[row] = (c, accurate, base[0])
        kept = kept_row(row)
        near = accurate and unsettled(c)
        rec.records[-1]["metrics"].update(kept=kept, accurate_enough=accurate, unsettled=near)
        status = "not kept (unsettled: a rerun may keep it)" if near else "kept" if kept else "not kept"
        print(f"{row:<34} {m_rung.items_per_s:8,.0f} samples/s, acc {metrics['test_accuracy']:.3f}; against "
              f"{base[0]}: {c.describe()} after {c.units} rounds; {status}", flush=True)
        if kept:
            best = (row, rival)

    # The headline: the best configuration against plain fit, side by side ------------------------
    kept = ["plain fit", *[r for r in verdicts if kept_row(r)]]
    if best[0] != "plain fit":
        # Three times the rounds: plain fit's epochs swing by a sixth in phases of several epochs that the best
        # configuration does not share, so 6 rounds left its median, and the headline, anywhere in 1.5-2.0x.
        (m_plain, m_top), _, (t_plain, t_top) = race(("plain fit", Config()), (f"best: {best[0]}", best[1]),
                                                     repeat=HEADLINE_ROUNDS)
        record(FINAL, "plain fit", m_plain, t_plain)
        headline = versus(m_plain, m_top)
        top = record(FINAL, f"best: {best[0]}", m_top, t_top, comparison=headline)
    else:
        headline, top = None, plain

    # Every MFU against the best peak of its precision the whole run saw (a record made early saw fewer of them).
    for metrics in [top, *(r["metrics"] for r in rec.records)]:
        metrics["mfu"] = train_flops * metrics["samples_per_s"] / max(peaks[metrics["mfu_against"].split()[0]])
    plain_mfu = train_flops * (m_plain.items_per_s if headline else plain["samples_per_s"]) / max(peaks["float32"])
    for dtype, measured in peaks.items():
        print(f"matmul peak ({dtype}) {max(measured) / 1e9:.0f} GFLOP/s: the best of {len(measured)} measurements "
              f"through the run (the lowest {min(measured) / 1e9:.0f})", flush=True)
    return Found(kept, verdicts, untried, headline, top, plain_mfu, mixed, gpu, xla_row)


def configuration(kept: list[str]) -> tuple[list[str], list[str]]:
    """The kept rungs as one configuration: a batch kept over a smaller kept batch replaces it (make report's
    headline read "plain fit + ... + batch 64 + batch 128 + batch 256"); and the batches it was raised through."""
    batches = [row for row in kept if row.startswith("batch ")]
    return [row for row in kept if row not in batches[:-1]], [row.split()[1] for row in batches[:-1]]


def conclude(args, rec, found: Found) -> Conclusion:
    verdicts, headline, top, gpu = found.verdicts, found.headline, found.top, found.gpu
    kept, through = configuration(found.kept)
    raised = f" (raised through {', '.join(through)}, each kept over the one before)" if through else ""
    described = [f"{row}{raised}" if row.startswith("batch ") else row for row in kept[1:]]
    summary = headline.describe() if headline else "nothing was measurably faster than plain fit"
    line = (f"best configuration: {' + '.join(kept)}: {top['samples_per_s']:,.0f} samples/s, {summary}; "
            f"MFU {top['mfu']:.1%} (plain fit {found.plain_mfu:.1%})")

    # Conclusion, from this run's numbers ------------------------------------------------------
    not_kept = {row: (c, ok, base, ok and unsettled(c))
                for row, (c, ok, base) in verdicts.items() if row not in found.kept}
    dropped = [f"{row} (against {base}: {c.describe()}{'' if ok else ', and less accurate'})"
               for row, (c, ok, base, near) in not_kept.items() if not near]
    near = [f"{row} (against {base}: {c.describe()} after {c.units} rounds)"
            for row, (c, ok, base, near) in not_kept.items() if near]
    bars = sorted({f"{c.threshold:.0%}" for row, (c, ok, base, close) in not_kept.items() if close})
    near_note = (f" Unsettled, so a rerun may keep {'it' if len(near) == 1 else 'them'}: {'; '.join(near)}; a gain "
                 f"this close to the {' or '.join(bars)} bar needs more rounds (--rounds) to settle." if near else "")
    untried = (f" Not tried: {', '.join(found.untried)}, since a smaller batch already did not pay."
               if found.untried else "")
    frozen = [r["row"] for r in rec.records if r["metrics"].get("order_changes_each_epoch") is False]
    ceiling = (f"At {top['mfu']:.0%} MFU most of a step is not matmul arithmetic: this {args.model}'s layers are "
               f"small, so per-step dispatch, the optimizer update and memory-bound ops weigh, and the kept rungs "
               f"attack exactly that (--profile splits the op time by kind; a wider model with larger batches, --width 4 "
               f"--batches 64 128 256 512 1024, spends more of its step in arithmetic, and leaves the rungs less to "
               f"remove)." if top["mfu"] < 0.4 else
               f"At {top['mfu']:.0%} MFU much of a step is matmul arithmetic already: the rungs remove per-step "
               f"overhead, and this {args.model} has less of it to remove.")
    xla, _, _ = verdicts[found.xla_row]
    if found.xla_row == "jit_compile=False":  # plain fit was XLA already (Keras' "auto" on a GPU)
        xla_note = (f"Plain fit already compiled with XLA (Keras' jit_compile='auto' on a GPU); without it: "
                    f"{xla.describe()}.")
    else:
        xla_note = f"XLA against plain fit: {xla.describe()}" + (
        ": on a CPU, XLA calls its own (Eigen) convolutions instead of the oneDNN kernels TensorFlow's ops use, "
            "so a convnet can lose more than fusion gains." if xla.verdict == "slower" and not gpu else
            ": fusing the step's element-wise ops saved memory passes and dispatches." if xla.verdict == FASTER else
            ".")
    return Conclusion((
        f"The best configuration kept {', '.join(described) or 'nothing beyond plain fit'}: {summary} "
        f"({top['samples_per_s']:,.0f} samples/s), at {top['mfu']:.1%} MFU. "
        f"Not kept: {'; '.join(dropped) or 'none'}.{near_note}{untried} "
        f"{xla_note} {ceiling} {found.mixed}: {hardware_summary()}."), [line], "" if not frozen else
        f"{', '.join(frozen)} replayed one order every epoch: a cache after the shuffle freezes it",
        Headline.compared(f"the best training configuration ({' + '.join(kept)}, {top['mfu']:.1%} MFU) against "
                          f"plain fit", headline, figure=summary) if headline else
        Headline(f"the best training configuration ({' + '.join(kept)}) against plain fit", summary,
                 "no measurable difference"))


RECIPE = Recipe(name="training_ladder", doc=__doc__, order=20, measure=measure, conclude=conclude,
                add_flags=add_flags, sizes={"rounds": (10, 6), "train_size": (10**9, 10**9), "batches": ([64, 128, 256],) * 2})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
