"""What a doctor run measures (`Options`), what each experiment finds (`Finding`), and its bars."""

from __future__ import annotations

import argparse
import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

RECIPE = "doctor"  # the name its records carry, so that `tfperf compare` matches two doctor runs
MIN_GAIN = 0.02  # a speedup must be shown to exceed 2% before it is advised
LOSS_TOLERANCE = 0.10  # relative final-loss difference from plain fit beyond which a change "disagrees"
# Batch sizes an application might send, each new to the function: 7 calls give the 6 samples a verdict needs
# (the first call of each row is its first trace), and small batches keep the cost in the traces themselves.
TRACE_BATCHES = (1, 2, 3, 4, 5, 6, 7)
OWN_RETRACES = 3  # a model whose own predict() traces this often over TRACE_BATCHES retraces in production


class DoctorError(ValueError):
    """Input doctor cannot use; the message says what to do instead."""


@dataclasses.dataclass
class Finding:
    """One alternative measured against a baseline: what to advise if it wins."""

    section: str
    row: str
    baseline: str
    comparison: Any  # stats.Comparison
    code: str
    cost: str
    agrees: bool = True
    note: str = ""
    pitfall: bool = False  # about how a function might be called, not a change to the model as it is used


QUICK_GOAL_S = 180  # --quick on a small model within 3 minutes on a 2-core machine
# What --quick changes, in one place (the command's help text reads these): fewer rounds, sizes and examples, and a
# budget that leaves the last half minute to the report.
QUICK = dict(batch_sizes=(1, 64), rounds=6, min_time_s=0.15, train_examples=512, budget_s=QUICK_GOAL_S - 30.0,
             long_run_s=10.0)
# The best-configuration search sizes each race to what is left, so under --quick's own budget it may run this much
# longer than the experiments that stop at the budget and run on past it (their half minute): on the benchmark's
# Transformer its batch race was left out with 79-87 s left where it needed 84-91 s, and the run ended at 173-182 s.
QUICK_SEARCH_GRACE_S = 10.0


# Each field `Options.from_args` reads from `tfperf doctor`'s flags: the flag's argparse dest, and what its value
# means. A flag left out (None, or absent where its experiment is not registered) keeps the default, or --quick's;
# an experiment's flag not named here reaches it in `Options.asked`.
FROM_FLAGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "batch_sizes": ("batch_sizes", tuple), "budget_s": ("budget", float), "seed": ("seed", int),
    "sample_path": ("sample", str), "trust": ("trust", bool), "profile": ("no_profile", operator.not_),
    "threads": ("no_threads", operator.not_), "train": ("train", bool), "loss": ("loss", str),
    "from_logits": ("from_logits", bool), "data_source": ("data", str), "long_run_s": ("long_run", float),
    "step_source": ("train_step", str), "memory_budget": ("memory_budget", int), "shapes": ("shapes", bool),
    "shape_axes": ("shape_axes", str), "load_time": ("load_time", bool), "keras_stacks": ("keras_stacks", bool),
    "devices": ("devices", int), "serve": ("serve", bool), "latency_budget_s": ("latency_budget", float),
    "percentile": ("percentile", float), "hosts": ("hosts", int), "link": ("link", str),
    "train_batch": ("train_batch", int),
}
FLAGS_READ = frozenset({"quick", "input_shape", *(dest for dest, _ in FROM_FLAGS.values())})


@dataclasses.dataclass(frozen=True)
class Options:
    """What a doctor run measures and how long it may take: built once (`from_args`, `quick`), never changed."""

    batch_sizes: tuple[int, ...] = (1, 32, 256)
    rounds: int = 10
    max_extensions: int = 2  # more rounds, at most this many times, while a comparison straddles a bar
    min_time_s: float = 0.5  # per alternative and batch size, spread over the rounds
    train: bool = False
    loss: str | None = None
    from_logits: bool = False
    train_examples: int = 2048
    train_batch: int = 32  # the user's fit() batch: plain fit's, where the search starts (Keras' default: 32)
    threads: bool = True
    exported: bool = True
    budget_s: float | None = None
    budget_given: bool = False  # --budget was given: the user's own goal (not --quick's, whatever its value)
    quick: bool = False
    seed: int = 0
    sample: Mapping[str, np.ndarray] | None = None
    sample_path: str | None = None  # where `sample` came from, for the processes the doctor starts
    trust: bool = False
    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    profile: bool = True  # the profile pass: traces of measured variants, read through XProf
    shapes: bool = False  # the first call at new sizes, per way of calling the model (a process of its own)
    shape_axes: str = "all"  # the axes the new-shapes experiment varies: "all", "batch" or "free" (the model's own)
    load_time: bool = False  # a cold start per form the model can take, in fresh processes
    devices: int | None = None  # train under MirroredStrategy on 1 and this many devices (needs `loss`)
    keras_stacks: bool = False  # the model under Keras 2, Keras 3 on TensorFlow and on JAX (needs `loss`)
    data_source: str | None = None  # --data as given (module:function)
    data: Any = None  # pipeline.UserData: the user's tf.data pipeline to train on, read from data_source
    long_run_s: float = 30.0  # --data: the pipeline alone read this long, to see whether it declines (0: not run)
    step: Any = None  # the user's training step, step(model, optimizer, batch) -> loss (--train-step)
    step_source: str | None = None  # where `step` came from (module:function)
    memory_budget: int | None = None  # bytes: find the largest batch within them (--memory-budget)
    trace_batches: tuple[int, ...] = TRACE_BATCHES  # the retracing table's calls, a new batch size each
    serve: bool = False  # the serving question: requests/s within a latency budget (tfperf load's search)
    latency_budget_s: float = 0.010  # with `serve`: the latency the percentile must stay within
    percentile: float = 99.0
    hosts: int | None = None  # with `train`: the speedup predicted on this many hosts over `link`
    link: str | None = None  # RATE[,RTT], as --link takes it
    # The flags of experiments that no field above names, by their argparse dest: an experiment added to the
    # registry reads its own flags here (options.asked["my_flag"]) without a field of its own.
    asked: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def searches(self) -> bool:
        """Whether --train's best-configuration search runs (not with --no-search)."""
        return self.train and not self.asked.get("no_search")

    @property
    def races_one_switch(self) -> bool:
        """Whether --train races each switch alone against plain fit: not at --quick where the search runs (it races
        each on top of the others; --quick's 3 minutes do not hold both), unless --hosts reads plain fit's step."""
        return self.train and not (self.quick and self.searches and not self.hosts)

    @classmethod
    def quick_run(cls, **given: Any) -> "Options":
        """--quick's preset: QUICK's values, then what is given."""
        return cls(**{**QUICK, "quick": True, **given})

    @classmethod
    def from_args(cls, args: Any, *, sample: Mapping[str, np.ndarray] | None = None,
                  input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                  asked: Mapping[str, Any] | None = None) -> "Options":
        """The options `tfperf doctor`'s flags ask for; a flag not given keeps its default (or --quick's). `asked`:
        the experiments' other flags."""
        given: dict[str, Any] = {field: meaning(value) for field, (dest, meaning) in FROM_FLAGS.items()
                                 if (value := getattr(args, dest, None)) is not None}
        if given.get("shape_axes"):  # --shape-axes implies --shapes
            given["shapes"] = True
        given["budget_given"] = "budget_s" in given
        given.update(sample=sample, input_shapes=dict(input_shapes or {}), asked=dict(asked or {}))
        return cls.quick_run(**given) if getattr(args, "quick", False) else cls(**given)


def model_flags(subject, options: Options) -> list[str]:
    """The flags that load the model as the user gave it (sizes, sample, signature, trust), for the `tfperf` commands
    the doctor prints and the processes it starts. With --trust, a child does not inspect the model again: the path
    may hold other bytes by now."""
    words = [a for name, shape in options.input_shapes.items()
             for a in ("--input-shape", (f"{name}=" if name else "") + ",".join(map(str, shape)))]
    if subject.signature:
        words += ["--signature", subject.signature]
    if options.sample_path:
        words += ["--sample", options.sample_path]
    if options.trust:
        words.append("--trust")
    return words


def model_parser(part: str) -> argparse.ArgumentParser:
    """A doctor process of its own reads back the model as `model_flags` wrote it (with the model and --seed)."""
    parser = argparse.ArgumentParser(prog=f"python -m tfperf.doctor.child {part}")
    parser.add_argument("model")
    parser.add_argument("--input-shape", action="append")
    parser.add_argument("--signature")
    parser.add_argument("--sample")
    parser.add_argument("--trust", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def load_given(args: argparse.Namespace) -> tuple[Any, Mapping[str, np.ndarray] | None]:
    """The model and the sample (or None) that `model_parser`'s flags name."""
    from tfperf.deploy.inputs import read_sample
    from tfperf.deploy.loader import load_subject, parse_input_shapes

    subject = load_subject(args.model, input_shapes=parse_input_shapes(args.input_shape or []), trust=args.trust,
                           signature=args.signature)
    return subject, read_sample(args.sample) if args.sample else None
