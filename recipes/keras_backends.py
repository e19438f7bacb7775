"""Keras 2 against Keras 3 on TensorFlow against Keras 3 on JAX: the same models, measured side by side.

Train the same two models (a CNN on digits, an LSTM on a synthetic sequence task) from the same
initial weights under each stack, each stack in a process of its own, and compare first-epoch time,
fit throughput, final loss, predict() and model(x).

Run:   python recipes/keras_backends.py --quick        (about two minutes on 2 CPU cores)
       python recipes/keras_backends.py --quick --models lstm    (one of the two models)
Needs: TensorFlow 2.21, Keras 3, tf-keras 2.21 and jax[cpu] (all installed by `make install`).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import dataclasses
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tfperf import flags
from tfperf.measure.processes import ChildError
from tfperf.recipe import Conclusion, Headline, Recipe, RecipeError
from tfperf.stacks import STACKS, backend_device, install_hint, keras_module, stack_env

# The technique: the backend is chosen before Keras is imported ---------------------------------------
# "My model got slower after moving to Keras 3" is the most frequent performance complaint of the last
# two years of TensorFlow users, and the usual answer is "it depends": on what `jit_compile="auto"`
# resolves to on each backend (XLA or not), how each backend runs a convolution or a recurrent loop on
# this CPU, and what `predict()` sets up on every call. The stack is fixed when Keras is imported:
#     TF_USE_LEGACY_KERAS=1 python train.py         Keras 2 (the tf_keras package)
#     KERAS_BACKEND=tensorflow python train.py      Keras 3 on TensorFlow (the default)
#     KERAS_BACKEND=jax python train.py             Keras 3 on JAX
# The same model code runs under each, with `import keras` (or `import tf_keras as keras` for Keras 2).
SEQUENCE = (32, 8, 4)  # time steps, features, classes of the synthetic sequence task


def build(name: str, k):
    """The model `name` with Keras module `k` (keras or tf_keras): tfperf's cnn, or an LSTM classifier."""
    if name == "cnn":
        from tfperf.models import get_net

        return get_net("cnn", keras_module=k)
    steps, features, classes = SEQUENCE
    inputs = k.Input((steps, features))
    return k.Model(inputs, k.layers.Dense(classes)(k.layers.LSTM(64)(inputs)), name="lstm")


# Measuring -------------------------------------------------------------------------------------------
# Each stack runs in a process of its own that serves its timers; the three processes stay up and take
# turns, round after round in shuffled order, so that a slow phase of the machine falls on all of them,
# and each figure is compared with Keras 2's from the same rounds. Every stack trains the same epochs,
# so the final losses are comparable. In the Keras 3 TensorFlow process the model is also trained with
# jit_compile set the other way, epoch for epoch beside the default. The first epoch (tracing and
# compiling) happens once per process: one reading per stack, reported, not judged.

FIT, FIRST, PREDICT, LOSS, JIT = ("fit throughput", "first epoch (trace and compile)", "inference calls",
                                  "final loss after the same steps", "Keras 3 on TensorFlow: jit_compile")
MODELS = ("cnn", "lstm")
BATCH = 128
# Same weights, same batches in the same order: the stacks' losses differ only by floating-point
# order of operations (XLA fusion, other kernels), which a few epochs do not amplify past this.
LOSS_TOLERANCE = 0.05
CALLS = {"predict(), batch 1, ": ("predict", 1), "predict(), batch 256, ": ("predict", 256),
         "model(x), batch 1, ": ("call", 1)}


@dataclasses.dataclass(frozen=True)
class Found:
    compare: dict  # (table or call, model, stack) -> Comparison against the baseline stack
    loss: dict[tuple[str, str], float]  # (model, stack) -> test loss after the same epochs
    jit: dict[tuple[str, str], bool]  # (model, stack) -> what jit_compile resolved to
    stacks: list[str]  # the stacks measured
    baseline: str
    missing: dict[str, str]  # stacks that could not be imported, and why
    device: dict[str, str] = dataclasses.field(default_factory=dict)  # stack -> where its ops ran (cpu, gpu)
    models: tuple[str, ...] = MODELS  # the models measured, in MODELS' order


def sequence_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic sequence task: the class is which of the first 4 features has the largest sum over time."""
    steps, features, classes = SEQUENCE
    x = np.random.default_rng(seed).normal(size=(n, steps, features)).astype(np.float32)
    return x, x[:, :, :classes].sum(axis=1).argmax(axis=1).astype(np.int32)


def serve_stack(stack: str, work: Path, calls: int, seed: int, models: Sequence[str] = MODELS) -> None:
    """A stack's process: builds each model from the shared weights, serves its timers (fit epochs, predict()
    and model(x)), and after `quit` replies with each model's first epoch, jit_compile and final loss."""
    k = keras_module(stack)
    from tfperf.measure import Timer, serve_timers
    from tfperf.measure.processes import reply
    from tfperf.train import fit_epochs

    k.utils.set_random_seed(seed)
    data = np.load(work / "data.npz")
    timers, built = [], {}
    for name in models:
        x, y, x_test, y_test = (data[f"{name}_{part}"] for part in ("x", "y", "x_test", "y_test"))
        weights = np.load(work / f"{name}.weights.npz")

        def compiled(**options):
            model = build(name, k)
            model.set_weights([weights[f"w{i}"] for i in range(len(weights.files))])  # the same start everywhere
            model.compile(optimizer=k.optimizers.Adam(1e-3),
                          loss=k.losses.SparseCategoricalCrossentropy(from_logits=True), **options)
            return model

        model = compiled()
        jit = bool(getattr(model, "jit_compile", False) or getattr(model, "_jit_compile", False))
        epoch, _ = fit_epochs(model, x, y, keras_module=k, batch_size=BATCH, shuffle=False)
        fit = Timer(epoch, name=f"fit {name}", items_per_call=len(x))
        fit.start(warmup=0)  # the first epoch traces and compiles: timed apart
        timers.append(fit)
        found = {"jit_compile": jit, "first_epoch_s": fit.first_call_s, "device": backend_device(k)}
        if stack == "Keras 3, TensorFlow":  # jit_compile: the default against the other setting
            other = compiled(jit_compile=not jit)
            other_epoch, _ = fit_epochs(other, x, y, keras_module=k, batch_size=BATCH, shuffle=False)
            flipped = Timer(other_epoch, name=f"flipped fit {name}", items_per_call=len(x))
            found["flipped_first_epoch_s"] = flipped.start(warmup=0)
            timers.append(flipped)
        for label, (kind, rows) in CALLS.items():
            batch = x_test[:rows]
            call = (lambda m=model, b=batch: m.predict(b, verbose=0)) if kind == "predict" else (
                lambda m=model, b=batch: m(b))
            timer = Timer(call, name=f"{label}{name}", items_per_call=rows)
            timer.start(warmup=1 if kind == "predict" else 2)
            timers.append(timer)
        built[name] = (model, x_test, y_test, found)
    serve_timers(timers, warmup=0)
    print(reply({name: {**found, "loss": float(model.evaluate(x_test, y_test, batch_size=256, verbose=0))}
                 for name, (model, x_test, y_test, found) in built.items()}), flush=True)


def add_flags(p) -> None:
    p.add_argument("--rounds", type=flags.positive_int, help="rounds in which every stack takes its turn")
    p.add_argument("--epochs", type=flags.positive_int, help="timed epochs per model and stack in each round")
    p.add_argument("--calls", type=flags.positive_int, help="timed predict() and model(x) calls per round")
    p.add_argument("--train-size", type=flags.positive_int, help="training examples per model")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                   help="the models to train under each stack (default: both)")
    # Internal: one stack's process.
    p.add_argument("--role", choices=["stack"], help=argparse.SUPPRESS)
    p.add_argument("--stack", choices=list(STACKS), help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)


def task(args) -> int:
    """One stack's process: its backend was chosen by the environment before Keras was imported."""
    serve_stack(args.stack, Path(args.work), args.calls, args.seed, ordered(args.models))
    return 0


def import_failure(error: str) -> str | None:
    """The import error in a stack process's failure, or None when it failed another way."""
    found = re.findall(r"(?:ModuleNotFoundError|ImportError): [^\n|]*", error)
    return found[-1].strip() if found else None


def ordered(models: Sequence[str]) -> tuple[str, ...]:
    """The chosen models in MODELS' order, each once: the first is the headline's."""
    return tuple(m for m in MODELS if m in models)


def start_stack(stack: str, args, work: Path):
    """One stack's process, with its environment: a TimerServer of its timers."""
    from tfperf.measure import TimerServer

    env = stack_env(stack)
    argv = [sys.executable, __file__, "--role", "stack", "--stack", stack, "--work", work, "--calls", args.calls,
            "--seed", args.seed, "--models", *ordered(args.models)]
    return TimerServer(argv, env=env, name=f"the {stack} process")


def measure(args, rec) -> Found:
    import contextlib

    import keras

    from tfperf.data import load_arrays
    from tfperf.measure import interleave, versus

    digits = load_arrays("mnist-5k", seed=args.seed)
    seq_x, seq_y = sequence_data(args.train_size + 1000, args.seed)
    arrays = {"cnn_x": digits.x_train[:args.train_size], "cnn_y": digits.y_train[:args.train_size],
              "cnn_x_test": digits.x_test, "cnn_y_test": digits.y_test,
              "lstm_x": seq_x[:args.train_size], "lstm_y": seq_y[:args.train_size],
              "lstm_x_test": seq_x[args.train_size:], "lstm_y_test": seq_y[args.train_size:]}
    keras.utils.set_random_seed(args.seed)
    models = ordered(args.models)
    found, fits_of = Found({}, {}, {}, [], "", {}, models=models), {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as running:
        work = Path(tmp)
        np.savez(work / "data.npz", **arrays)
        for name in models:
            np.savez(work / f"{name}.weights.npz", **{f"w{i}": w for i, w in enumerate(build(name, keras).get_weights())})
        # The stacks' processes start side by side; a stack that cannot be imported is said so, with how to
        # install it, and the others go on.
        servers = {stack: running.enter_context(start_stack(stack, args, work)) for stack in STACKS}
        remote = {}
        for stack, server in servers.items():
            try:
                remote[stack] = server.timer(f"fit {models[0]}")  # waits until the process is ready
            except ChildError as exc:
                why = import_failure(str(exc))
                if why is None:
                    raise
                found.missing[stack] = why
                print(f"{stack}: not measured: {why}; install it with {install_hint(stack)}", flush=True)
        stacks = [s for s in STACKS if s not in found.missing]
        if not stacks:
            raise RecipeError("no Keras stack could be imported: " + "; ".join(
                f"{s}: {w}" for s, w in found.missing.items()))
        baseline = stacks[0]  # Keras 2 when it is there: the stack users move from
        race = dict(rounds=args.rounds, warmup=0, seed=args.seed)
        for model in models:
            # Fit: every stack's epochs, and the Keras 3 TensorFlow model with jit_compile flipped, in the same rounds.
            timers = [servers[s].timer(f"fit {model}", f"{model}, {s}") for s in stacks]
            flip = "Keras 3, TensorFlow" in stacks
            if flip:
                timers.append(servers["Keras 3, TensorFlow"].timer(f"flipped fit {model}", f"{model}, flipped"))
            fits = fits_of[model] = dict(zip([t.name for t in timers],
                                             interleave(timers, samples=args.rounds * args.epochs, **race)))
            for stack in stacks:
                m = fits[f"{model}, {stack}"]
                c = versus(fits[f"{model}, {baseline}"], m) if stack != baseline else None
                found.compare[FIT, model, stack] = c
                rec.add(FIT, m.name, {"samples_per_s": m.items_per_s}, primary="samples_per_s", lower_is_better=False,
                        measurement=m, comparison=c)
            for label, _ in CALLS.items():
                timers = [servers[s].timer(f"{label}{model}", f"{model}, {label}{s}") for s in stacks]
                calls = interleave(timers, samples=args.rounds * args.calls, **race)
                for stack, m in zip(stacks, calls):
                    c = versus(calls[0], m) if stack != baseline else None
                    found.compare[label.rstrip(", "), model, stack] = c
                    rec.add(PREDICT, m.name, {"ms": m.median_s * 1e3}, primary="ms", lower_is_better=True,
                            measurement=m, comparison=c)
            if flip:
                found.compare[JIT, model] = versus(fits[f"{model}, Keras 3, TensorFlow"], fits[f"{model}, flipped"])
        for server in servers.values():
            server.quit()  # every process replies with its results once it has finished
    results = {stack: servers[stack].result for stack in stacks}
    for model in models:
        for stack in stacks:
            r = results[stack][model]
            found.loss[model, stack], found.jit[model, stack] = r["loss"], r["jit_compile"]
            found.device[stack] = r.get("device", "cpu")
            rec.add(FIRST, f"{model}, {stack}", {"seconds": r["first_epoch_s"]}, primary="seconds",
                    lower_is_better=True, versus_first=False)
            rec.add(LOSS, f"{model}, {stack}", {"test_loss": r["loss"], "jit_compile": r["jit_compile"],
                                                "device": r.get("device", "cpu")},
                    primary="test_loss", lower_is_better=True, versus_first=False)
        if JIT in {key[0] for key in found.compare if key[1:] == (model,)}:
            default_jit = found.jit[model, "Keras 3, TensorFlow"]
            default = dataclasses.replace(fits_of[model][f"{model}, Keras 3, TensorFlow"],
                                          name=f"{model}, jit_compile={default_jit} (default)")
            flipped = dataclasses.replace(fits_of[model][f"{model}, flipped"], name=f"{model}, jit_compile={not default_jit}")
            for m, comparison in ((default, None), (flipped, found.compare[JIT, model])):
                rec.add(JIT, m.name, {"samples_per_s": m.items_per_s}, primary="samples_per_s", lower_is_better=False,
                        measurement=m, comparison=comparison)
    return dataclasses.replace(found, stacks=stacks, baseline=baseline)


def conclude(args, rec, found: Found) -> Conclusion:
    compare, loss, jit = found.compare, found.loss, found.jit
    stacks, baseline, missing = found.stacks, found.baseline, found.missing
    others = [s for s in stacks if s != baseline]
    short = {"Keras 2 (tf_keras)": "Keras 2", "Keras 3, TensorFlow": "Keras 3/TF", "Keras 3, JAX": "JAX"}
    lines, texts, failure = [], [], ""
    for model in found.models:
        spread = max(loss[model, s] for s in stacks) / min(loss[model, s] for s in stacks) - 1
        lines.append(f"{model}: test loss after the same steps {', '.join(f'{s} {loss[model, s]:.4f}' for s in stacks)}"
                     f" (spread {spread:.1%}, tolerance {LOSS_TOLERANCE:.0%}); jit_compile resolved to "
                     f"{', '.join(f'{s} {jit[model, s]}' for s in stacks)}")
        if spread > LOSS_TOLERANCE:
            failure = f"{model}: the stacks' losses differ by {spread:.1%}, over {LOSS_TOLERANCE:.0%}"
        for stack in others:
            lines.append(f"{model}, {stack} against {baseline}: fit {compare[FIT, model, stack].describe()}; "
                         f"predict() at batch 1 {compare['predict(), batch 1', model, stack].describe()}")
    for stack, why in missing.items():
        lines.append(f"{stack}: not measured ({why}); install it with {install_hint(stack)}")

    def against(table: str, model: str) -> str:
        return ", ".join(f"{short[s]} {compare[table, model, s].describe()}" for s in others)

    for model in found.models:
        text = []
        if others:
            fit = ", ".join(f"{s} {compare[FIT, model, s].describe()} (jit_compile resolved to {jit[model, s]})"
                            for s in others)
            text.append(f"{model}, fit against {baseline} (jit_compile {jit[model, baseline]}): {fit}.")
            if "Keras 3, JAX" in stacks:
                text.append("JAX compiles the whole step with XLA, whose CPU kernels for this model differ from "
                            "TensorFlow's.")
        if JIT in {key[0] for key in compare if key[1:] == (model,)}:
            flip, default_jit = compare[JIT, model], jit[model, "Keras 3, TensorFlow"]
            k3 = compare.get((FIT, model, "Keras 3, TensorFlow"))
            if k3 is not None and k3.verdict == "slower":
                advice = (f"Keras 3 on TensorFlow is slower here; setting jit_compile={not default_jit} in compile() "
                          f"gives {flip.describe()} against the default ({default_jit})" +
                          ("; that is the change to make" if flip.verdict == "faster" else
                           ", so that setting is not the cure on this machine"))
            else:
                advice = (f"no change is needed for speed on Keras 3's TensorFlow backend; jit_compile="
                          f"{not default_jit} there gives {flip.describe()} against the default ({default_jit})")
            text.append(f"{advice[0].upper() + advice[1:]}.")
        if others:
            first = {r["row"].split(", ", 1)[1]: r["metrics"]["seconds"] for r in rec.table(FIRST)
                     if r["row"].startswith(f"{model}, ")}
            text.append(f"First epoch (tracing and compiling, one per process, not judged): "
                        f"{', '.join(f'{short[s]} {first[s]:.1f} s' for s in stacks)}. "
                        f"predict() on one row: {against('predict(), batch 1', model)}; model(x) on one row: "
                        f"{against('model(x), batch 1', model)}.")
        texts.append(" ".join(text))
    text = " ".join(texts) + (
        " On every stack predict() builds a data pipeline and a step function around each call: for single "
        "requests call the model, or export it (serving_runtimes.py measures the runtimes).")
    if len(set(found.device.values())) > 1:  # e.g. JAX installed for the CPU beside TensorFlow on a GPU
        text += (" The stacks ran on different devices (" + ", ".join(f"{s}: {d}" for s, d in found.device.items())
                 + "): these rows compare devices as much as backends.")
    if missing:
        text += " Not measured: " + "; ".join(f"{s} ({why}; install it with `{install_hint(s)}`)"
                                             for s, why in missing.items()) + "."
    headline = None
    if others:
        stack = "Keras 3, TensorFlow" if "Keras 3, TensorFlow" in others else others[0]
        headline = Headline.compared(f"{found.models[0]} fit throughput, {stack} against {baseline}",
                                     compare[FIT, found.models[0], stack])
    return Conclusion(text, lines, failure, headline)


RECIPE = Recipe(name="keras_backends", doc=__doc__, order=150, measure=measure, conclude=conclude,
                add_flags=add_flags, task=task,
                sizes={"rounds": (10, 6), "epochs": (1, 1), "calls": (3, 2), "train_size": (4000, 1024)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
