"""Keras 2 against Keras 3 on TensorFlow against Keras 3 on JAX: the same models, measured side by side.

Train the same two models (a CNN on digits, an LSTM on a synthetic sequence task) from the same
initial weights under each stack, each stack in its own processes, and compare first-epoch time, fit
throughput, final loss, predict() and model(x).

Run:   python recipes/keras_backends.py --quick        (about five minutes on 2 CPU cores)
Needs: TensorFlow 2.21, Keras 3, tf-keras 2.21 and jax[cpu] (all installed by `make install`).

Introduction
------------
"My model got slower after moving to Keras 3" is the most frequent performance complaint of the last
two years of TensorFlow users, and the usual answer is "it depends". It depends on things one can
measure: what `jit_compile="auto"` resolves to on each backend (XLA or not), how each backend runs a
convolution or a recurrent loop on this CPU, and what `predict()` sets up on every call. A Keras
backend is fixed when Keras is imported, so each stack runs in processes of its own: Keras 2 through
`tf_keras` (TF_USE_LEGACY_KERAS=1), Keras 3 with KERAS_BACKEND=tensorflow or jax. The stacks take
turns, round after round in shuffled order, so that a slow phase of the machine falls on all of them,
and each figure is compared with Keras 2's from the same rounds. Inside the Keras 3 TensorFlow process
the model is also trained with jit_compile set the other way, epoch for epoch beside the default.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from tfperf import flags
from tfperf.measure.processes import ChildError, reply, run_child
from tfperf.recipe import Conclusion, Recipe, RecipeError

FIT, FIRST, PREDICT, LOSS, JIT = ("fit throughput", "first epoch (trace and compile)", "inference calls",
                                  "final loss after the same steps", "Keras 3 on TensorFlow: jit_compile")
STACKS = {
    "Keras 2 (tf_keras)": {"TF_USE_LEGACY_KERAS": "1", "KERAS_BACKEND": "tensorflow"},
    "Keras 3, TensorFlow": {"KERAS_BACKEND": "tensorflow"},
    "Keras 3, JAX": {"KERAS_BACKEND": "jax"},
}
# How to install a stack that is missing (requirements.txt pins each; `make install` installs them all).
INSTALL = {
    "Keras 2 (tf_keras)": "pip install tf-keras==2.21.0",
    "Keras 3, TensorFlow": "pip install 'tensorflow==2.21.*' 'keras==3.*'",
    "Keras 3, JAX": "pip install 'jax[cpu]==0.10.2'",
}
MODELS = ("cnn", "lstm")
BATCH = 128
# Same weights, same batches in the same order: the stacks' losses differ only by floating-point
# order of operations (XLA fusion, other kernels), which a few epochs do not amplify past this.
LOSS_TOLERANCE = 0.05
SEQUENCE = (32, 8, 4)  # time steps, features, classes of the synthetic sequence task


def sequence_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic sequence task: the class is which of the first 4 features has the largest sum over time."""
    steps, features, classes = SEQUENCE
    x = np.random.default_rng(seed).normal(size=(n, steps, features)).astype(np.float32)
    return x, x[:, :, :classes].sum(axis=1).argmax(axis=1).astype(np.int32)


def build(name: str, k):
    """The model `name` with Keras module `k` (keras or tf_keras): tfperf's cnn, or an LSTM classifier."""
    if name == "cnn":
        from tfperf.models import get_net

        return get_net("cnn", keras_module=k)
    steps, features, classes = SEQUENCE
    inputs = k.Input((steps, features))
    return k.Model(inputs, k.layers.Dense(classes)(k.layers.LSTM(64)(inputs)), name="lstm")


def time_stack(stack: str, work: Path, epochs: int, calls: int, seed: int) -> dict:
    """In a process of one stack: each model's first epoch, timed epochs, loss, predict() and model(x)."""
    if STACKS[stack].get("TF_USE_LEGACY_KERAS"):
        import tf_keras as k
    else:
        import keras as k
    from tfperf.measure import Timer, interleave
    from tfperf.train import fit_epochs

    k.utils.set_random_seed(seed)
    data = np.load(work / "data.npz")
    found = {}
    for name in MODELS:
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
        fit = Timer(epoch, name=f"{stack}: {name}", items_per_call=len(x))
        row = {"jit_compile": jit, "first_epoch_s": fit.start(warmup=0)}
        if stack == "Keras 3, TensorFlow":
            # jit_compile: the default against the other setting, epoch for epoch in the same rounds
            other = compiled(jit_compile=not jit)
            other_epoch, _ = fit_epochs(other, x, y, keras_module=k, batch_size=BATCH, shuffle=False)
            flipped = Timer(other_epoch, name=f"jit_compile={not jit}", items_per_call=len(x))
            mine, theirs = interleave([fit, flipped], rounds=epochs, samples=epochs, warmup=0, seed=seed)
            row["fit_s"], row["flipped_fit_s"] = list(mine.samples_s), list(theirs.samples_s)
            row["flipped_first_epoch_s"] = flipped.first_call_s
        else:
            row["fit_s"] = fit.take(epochs)
        row["loss"] = float(model.evaluate(x_test, y_test, batch_size=256, verbose=0))
        one, many = x_test[:1], x_test[:256]
        row["predict_1_s"] = list(Timer(lambda: model.predict(one, verbose=0)).measure(calls, warmup=1).samples_s)
        row["predict_256_s"] = list(Timer(lambda: model.predict(many, verbose=0)).measure(calls, warmup=1).samples_s)
        row["call_1_s"] = list(Timer(lambda: model(one)).measure(calls, warmup=2).samples_s)
        found[name] = row
    return found


def add_flags(p) -> None:
    p.add_argument("--rounds", type=flags.positive_int, help="rounds of one process per stack, in shuffled order")
    p.add_argument("--epochs", type=flags.positive_int, help="timed epochs per model and process")
    p.add_argument("--calls", type=flags.positive_int, help="timed predict() and model(x) calls per process")
    p.add_argument("--train-size", type=flags.positive_int, help="training examples per model")
    # Internal: one stack's process.
    p.add_argument("--role", choices=["stack"], help=argparse.SUPPRESS)
    p.add_argument("--stack", choices=list(STACKS), help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)


def task(args) -> int:
    """One stack's process: its backend was chosen by the environment before Keras was imported."""
    print(reply(time_stack(args.stack, Path(args.work), args.epochs, args.calls, args.seed)))
    return 0


def import_failure(error: str) -> str | None:
    """The import error in a stack process's failure, or None when it failed another way."""
    found = re.findall(r"(?:ModuleNotFoundError|ImportError): [^\n|]*", error)
    return found[-1].strip() if found else None


def run_stack(stack: str, args, work: Path) -> dict:
    """Run one stack's process with its environment; its result (ChildError when it fails)."""
    env = {**os.environ, **STACKS[stack]}
    if "TF_USE_LEGACY_KERAS" not in STACKS[stack]:
        env.pop("TF_USE_LEGACY_KERAS", None)
    argv = [sys.executable, __file__, "--role", "stack", "--stack", stack, "--work", work, "--epochs", args.epochs,
            "--calls", args.calls, "--seed", args.seed]
    return run_child(argv, env=env, who=f"the {stack} process")


def measure(args, rec) -> dict:
    import keras

    from tfperf.measure import Measurement, versus
    from tfperf.data import load_arrays

    # Setup: data and initial weights, written once for every stack's processes -----------------
    digits = load_arrays("mnist-5k", seed=args.seed)
    seq_x, seq_y = sequence_data(args.train_size + 1000, args.seed)
    arrays = {"cnn_x": digits.x_train[:args.train_size], "cnn_y": digits.y_train[:args.train_size],
              "cnn_x_test": digits.x_test, "cnn_y_test": digits.y_test,
              "lstm_x": seq_x[:args.train_size], "lstm_y": seq_y[:args.train_size],
              "lstm_x_test": seq_x[args.train_size:], "lstm_y_test": seq_y[args.train_size:]}
    keras.utils.set_random_seed(args.seed)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        np.savez(work / "data.npz", **arrays)
        for name in MODELS:
            np.savez(work / f"{name}.weights.npz", **{f"w{i}": w for i, w in enumerate(build(name, keras).get_weights())})

        # The stacks take turns, round after round, in shuffled order --------------------------
        # A stack that cannot be imported is said so, with how to install it, and the others go on.
        rng = np.random.default_rng(args.seed)
        missing: dict[str, str] = {}
        for r in range(args.rounds):
            results = {}
            for stack in rng.permutation(list(STACKS)):
                if stack in missing:
                    continue
                try:
                    results[str(stack)] = run_stack(str(stack), args, work)
                except ChildError as exc:
                    why = import_failure(str(exc))
                    if r > 0 or why is None:
                        raise
                    missing[str(stack)] = why
                    print(f"{stack}: not measured: {why}; install it with {INSTALL[stack]}", flush=True)
            rounds.append(results)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    stacks = [s for s in STACKS if s not in missing]
    if not stacks:
        raise RecipeError("no Keras stack could be imported: " + "; ".join(f"{s}: {w}" for s, w in missing.items()))
    baseline = stacks[0]  # Keras 2 when it is there: the stack users move from

    # Results: every stack against Keras 2, paired by round ---------------------------------------
    def measurement(row: str, samples: list, items: int = 1) -> Measurement:
        """One row's samples from every round, in round order (an equal count from each)."""
        return Measurement(row, tuple(float(s) for s in samples), items_per_call=items, rounds=args.rounds)

    def across(stack: str, model: str, key: str) -> list:
        return [s for rnd in rounds for s in np.atleast_1d(rnd[stack][model][key])]

    found = {"jit": {}, "loss": {}, "compare": {}, "stacks": stacks, "baseline": baseline, "missing": missing}
    kinds = (  # table, sample key, row label, items per call, primary metric
        (FIT, "fit_s", "", args.train_size, "samples_per_s"),
        (FIRST, "first_epoch_s", "", 1, "seconds"),
        (PREDICT, "predict_1_s", "predict(), batch 1, ", 1, "ms"),
        (PREDICT, "predict_256_s", "predict(), batch 256, ", 256, "ms"),
        (PREDICT, "call_1_s", "model(x), batch 1, ", 1, "ms"))
    for model in MODELS:
        for table, key, label, items, metric in kinds:
            base = None
            for stack in stacks:
                m = measurement(f"{model}, {label}{stack}", across(stack, model, key), items)
                base = base or m  # the baseline stack comes first
                c = versus(base, m) if stack != baseline else None
                value = {"samples_per_s": m.items_per_s, "seconds": m.median_s, "ms": m.median_s * 1e3}[metric]
                rec.add(table, m.name, {metric: value}, primary=metric, lower_is_better=metric != "samples_per_s",
                        measurement=m, comparison=c)
                found["compare"][label.rstrip(", ") or table, model, stack] = c
        for stack in stacks:
            found["loss"][model, stack] = float(np.median([rnd[stack][model]["loss"] for rnd in rounds]))
            found["jit"][model, stack] = rounds[0][stack][model]["jit_compile"]
            rec.add(LOSS, f"{model}, {stack}", {"test_loss": found["loss"][model, stack],
                                                "jit_compile": found["jit"][model, stack]},
                    primary="test_loss", lower_is_better=True, versus_first=False)
        # jit_compile on Keras 3's TensorFlow backend: the default against the other setting, epoch for epoch.
        if "Keras 3, TensorFlow" not in stacks:
            continue
        default_jit = found["jit"][model, "Keras 3, TensorFlow"]
        default = measurement(f"{model}, jit_compile={default_jit} (default)",
                              across("Keras 3, TensorFlow", model, "fit_s"), args.train_size)
        flipped = measurement(f"{model}, jit_compile={not default_jit}",
                              across("Keras 3, TensorFlow", model, "flipped_fit_s"), args.train_size)
        found["compare"][JIT, model] = c = versus(default, flipped)
        for m, comparison in ((default, None), (flipped, c)):
            rec.add(JIT, m.name, {"samples_per_s": m.items_per_s}, primary="samples_per_s", lower_is_better=False,
                    measurement=m, comparison=comparison)
    return found


def conclude(args, rec, found) -> Conclusion:
    # Results ----------------------------------------------------------------------------------
    compare, loss, jit = found["compare"], found["loss"], found["jit"]
    stacks, baseline, missing = found["stacks"], found["baseline"], found["missing"]
    others = [s for s in stacks if s != baseline]
    short = {"Keras 2 (tf_keras)": "Keras 2", "Keras 3, TensorFlow": "Keras 3/TF", "Keras 3, JAX": "JAX"}
    lines, texts, failure = [], [], ""
    for model in MODELS:
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
        lines.append(f"{stack}: not measured ({why}); install it with {INSTALL[stack]}")

    # Conclusion, from this run's numbers -------------------------------------------------------
    def against(table: str, model: str) -> str:
        return ", ".join(f"{short[s]} {compare[table, model, s].describe()}" for s in others)

    for model in MODELS:
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
            text.append(f"First epoch (tracing and compiling) against {short[baseline]}: {against(FIRST, model)}. "
                        f"predict() on one row: {against('predict(), batch 1', model)}; model(x) on one row: "
                        f"{against('model(x), batch 1', model)}.")
        texts.append(" ".join(text))
    text = " ".join(texts) + (
        " On every stack predict() builds a data pipeline and a step function around each call: for single "
        "requests call the model, or export it (serving_runtimes.py measures the runtimes).")
    if missing:
        text += " Not measured: " + "; ".join(f"{s} ({why}; install it with `{INSTALL[s]}`)"
                                             for s, why in missing.items()) + "."
    return Conclusion(text, lines, failure)


RECIPE = Recipe(name="keras_backends", doc=__doc__, order=150, measure=measure, conclude=conclude,
                add_flags=add_flags, task=task,
                sizes={"rounds": (10, 6), "epochs": (3, 2), "calls": (10, 6), "train_size": (4000, 1024)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
