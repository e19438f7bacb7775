"""The doctor's best-configuration climb on a GPU, against every combination of the same knobs (Keras 3 on JAX).

Run:   KERAS_BACKEND=jax python benchmarks/best_configuration_on_gpu.py          (about 7 minutes on one GPU)
       KERAS_BACKEND=jax python benchmarks/best_configuration_on_gpu.py --tiny   (the same code, toy sizes, a CPU)
       ... --out DIR: the figures as JSON too; --budget-s S: stop starting new work after S seconds
Needs: Keras 3 and JAX (a CUDA build for the GPU); no TensorFlow: the doctor's search, its trainer and tfperf's
       timing import none, so this runs where TensorFlow's CUDA build cannot be installed.

Issue 71 asks whether the doctor's climb (one knob at a time, each value kept only where it pays on top of what is
kept, a knob raced again once what it depends on changed) finds the speed an exhaustive search of the same knobs
finds. On 2 CPU cores benchmarks/best_configuration.py answers it; on a GPU the small models users write are bound
by each step's fixed cost (launches, the host's work per step), so the knobs weigh differently. For each of that
benchmark's three models (a conv net, an MLP, a two-block Transformer encoder):

1. The doctor's own climb (`tfperf.doctor.search.climb`: its races, rules, rows and trainer) at --quick's options.
2. Every combination of the same knobs, each a fresh copy from the same weights: a first epoch, then three timed;
   the fastest median is the exhaustive best.
3. One race of plain fit, the climb's best and the exhaustive best (interleaved epochs, 95% intervals).

On JAX, Keras compiles fit's step with XLA by default (jit_compile="auto") and jit_compile=False runs it op by op:
jit_compile is no knob here, every configuration is compiled, plain fit too. The mixed policy is the one the doctor
picks for this GPU (`tfperf.gpus.mixed_policy` on its compute capability).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import jax  # noqa: E402
import keras  # noqa: E402

import tfperf.gpus  # noqa: E402
from best_configuration import MODELS, rows as rows_for  # noqa: E402  (the models users write, their rows)
from tfperf.doctor import search  # noqa: E402
from tfperf.doctor.experiment import Context  # noqa: E402
from tfperf.doctor.options import Options  # noqa: E402
from tfperf.measure.measurement import versus  # noqa: E402

SCREEN_EPOCHS = 3


@dataclasses.dataclass
class Built:
    """What the climb reads of the user's model: its inputs, and a fresh copy from the same weights under a policy."""

    build: Callable[[], keras.Model]
    weights: list
    inputs: list

    def fresh(self, policy: str | None) -> keras.Model:
        keras.config.set_dtype_policy(policy or "float32")
        try:
            model = self.build()
        finally:
            keras.config.set_dtype_policy("float32")
        model.set_weights(self.weights)
        return model


class Kept:
    """A recorder that keeps what the doctor records (its rows are read back here, not written)."""

    def __init__(self):
        self.rows: list[tuple] = []

    def add(self, section: str, row: str, values: dict, **_) -> None:
        self.rows.append((section, row, values))


def gpus_here() -> list[tfperf.gpus.Gpu]:
    """JAX's GPUs as tfperf describes them (name and compute capability)."""
    found = [d for d in jax.devices() if d.platform == "gpu"]
    return [tfperf.gpus.Gpu(d.device_kind, tuple(int(p) for p in str(d.compute_capability).split(".")[:2]))
            for d in found]


def patch_doctor(gpus: list) -> None:
    """Point the doctor's search at JAX: the mixed policy for these GPUs (as on a CPU without), no jit_compile knob."""
    tfperf.gpus.mixed_policy_here = lambda: tfperf.gpus.mixed_policy(gpus) if gpus else "mixed_bfloat16"
    knobs = search.knobs
    search.knobs = lambda *a, **k: [(n, v) for n, v in knobs(*a, **k) if n != "jit_compile"]


def synthetic_rows_of(base: keras.Model) -> None:
    """The doctor's rows for this model: synthetic inputs and class ids, as many as it asks for."""
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    search.training_rows = lambda subject, options, examples=None: search.Rows(
        *rows_for(base, examples or options.train_examples, options.seed), loss,
        examples or options.train_examples, False)


def grid(built: Built, rows: search.Rows, mixed: str | None, batches: list[int], deadline: float) -> dict:
    """Every combination of the knobs, each a fresh copy: label -> (config, examples/s of the median epoch)."""
    found = {}
    for spe, policy, batch in itertools.product((1, 16, 64), (None, mixed), (search.PLAIN_BATCH, *batches)):
        config = search.Config(steps_per_execution=spe, policy=policy, batch=batch)
        if time.monotonic() > deadline:
            found[config.label] = (config, None)
            continue
        timer, _ = search.trainer(built, config, rows)
        found[config.label] = (config, rows.examples / statistics.median(timer.take(SCREEN_EPOCHS)))
        del timer
    return found


def one_model(name: str, options: Options, gpus: list, deadline: float, say: Callable[[str], None]) -> dict:
    """The climb, the exhaustive search and the race between their bests on one model."""
    build = _models()[name]
    keras.utils.set_random_seed(0)
    base = build()
    built = Built(build, base.get_weights(), list(base.inputs))
    synthetic_rows_of(base)
    with tempfile.TemporaryDirectory() as scratch:
        ctx = Context(built, Kept(), options, Path(scratch), Path(scratch), Path(scratch),
                      progress=lambda step: say(f"{name}: {step}"))
        rows, skipped, started = search.sized_rows(built, options), {}, {}
        began = time.monotonic()
        best, at_your_batch, tried = search.climb(ctx, rows, skipped, started)
        climb_s = time.monotonic() - began
        started.clear()
        mixed, batches = search._ladder(built, options)
        say(f"{name}: every combination")
        searched = grid(built, rows, mixed, batches, deadline)
        timed = {label: rate for label, (_, rate) in searched.items() if rate}
        top = max(timed, key=timed.get) if timed else None  # none when the budget ran out first
        say(f"{name}: plain fit, the climb's best, the exhaustive best")
        contenders = list({c.label: c for c in (search.Config(), best, *([searched[top][0]] if top else []))
                           }.values())
        ms, _, losses = search.race(ctx, contenders, rows, rounds=search.HEADLINE_ROUNDS * options.rounds)
    plain = ms[search.Config().label]
    against_plain = {label: versus(plain, m) for label, m in ms.items() if label != plain.name}
    climb_vs_top = versus(ms[top], ms[best.label]) if top and best.label != top else None
    return {
        "rows": rows.examples, "mixed_policy": mixed, "climb_s": round(climb_s, 1),
        "rungs": [dict(row=r.row, on_top_of=r.base, ratio=r.comparison.ratio, ci95=r.comparison.ci95,
                       verdict=r.comparison.verdict, kept=r.kept) for r in tried],
        "skipped": skipped, "climb_best": best.label, "climb_best_at_your_batch": at_your_batch.label,
        "exhaustive_best": top, "screened": timed,
        "not_screened": [k for k, (_, rate) in searched.items() if rate is None],
        "examples_per_s": {label: m.items_per_s for label, m in ms.items()},
        "against_plain": {k: dict(ratio=c.ratio, ci95=c.ci95) for k, c in against_plain.items()},
        "climb_against_exhaustive": (
            dict(ratio=climb_vs_top.ratio, ci95=climb_vs_top.ci95, verdict=climb_vs_top.verdict) if climb_vs_top
            else "the same configuration" if top else "no search: budget"),
        "final_loss": losses,
    }


def _models() -> dict[str, Callable[[], keras.Model]]:
    namespace: dict = {}
    exec(MODELS, namespace)  # noqa: S102 (the benchmark's own source text)
    return {name: namespace[name] for name in ("cnn", "transformer", "mlp")}


def printed(name: str, found: dict) -> str:
    """One model's figures as lines."""
    ratio = lambda c: f"{c['ratio']:.2f}x ({c['ci95'][0]:.2f}-{c['ci95'][1]:.2f}x)"  # noqa: E731
    lines = [f"## {name}: {found['rows']:,} rows an epoch, mixed policy {found['mixed_policy']}",
             f"climb ({found['climb_s']} s, {len(found['rungs'])} rungs): {found['climb_best']}"
             f" (at your batch: {found['climb_best_at_your_batch']})"]
    lines += [f"  {r['row']} on {r['on_top_of']}: {ratio(r)} {r['verdict']}{' kept' if r['kept'] else ''}"
              for r in found["rungs"]]
    ranked = sorted(found["screened"].items(), key=lambda kv: -kv[1])
    lines.append(f"every combination ({len(ranked)} screened, {len(found['not_screened'])} not: budget); top 5:")
    lines += [f"  {label}: {rate:,.0f} examples/s" for label, rate in ranked[:5]]
    lines.append("race:")
    against = found["against_plain"]
    lines += [f"  {label}: {rate:,.0f} examples/s, loss {found['final_loss'][label]:.3f}"
              + (f", {ratio(against[label])} against plain fit" if label in against else "")
              for label, rate in found["examples_per_s"].items()]
    c = found["climb_against_exhaustive"]
    lines.append(f"the climb's best against the exhaustive best: {c if isinstance(c, str) else ratio(c)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="toy rows and rounds (a CPU check of the code)")
    parser.add_argument("--models", nargs="+", default=["cnn", "transformer", "mlp"])
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    deadline = started + args.budget_s
    gpus = gpus_here()
    patch_doctor(gpus)
    options = (Options.quick_run(rounds=2, train_examples=64, max_extensions=0) if args.tiny
               else Options.quick_run())
    say = lambda what: print(f"[{time.monotonic() - started:5.0f} s] {what}", file=sys.stderr, flush=True)  # noqa
    print(f"# the doctor's climb against every combination, Keras {keras.__version__} on JAX {jax.__version__}, "
          f"{[g.name for g in gpus] or 'no GPU: ' + jax.devices()[0].device_kind}", flush=True)
    results = {}
    for i, name in enumerate(args.models):
        now = time.monotonic()
        if now > deadline:
            print(f"## {name}: not run (budget spent)", flush=True)
            continue
        share = now + (deadline - now) / (len(args.models) - i)  # each model left an equal part of what is left
        results[name] = one_model(name, options, gpus, share, say)
        print(printed(name, results[name]), flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "best_configuration_on_gpu.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
