"""When XLA fails: the layers it cannot compile, found by bisecting the model's graph, and the model with the rest
compiled.

`jit_compile=True` compiles a whole function or fails: one op without an XLA kernel (a string op, a py_function) or
a size known only at run time stops the model from compiling at all. `bisect` runs a Keras functional model's
layers in their graph's order, compiles runs of them on the tensors they saw, and halves every run that fails until
each failing layer stands alone (a few compiles for one failing layer among hundreds). `compiled_around` then builds
the model with every run between failing layers compiled by XLA and the failing layers left to TensorFlow's
executor: what a user applies to keep the rest of XLA's gain.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

from tfperf.deploy.errors import first_line

XLA_REFUSED = "XLA cannot compile it: "  # how a variant XLA refused is listed among what was not measured
MAX_COMPILES = 40  # compiles a bisection may take (about 2 log2(layers) per failing layer)

_UNSUPPORTED = re.compile(r"unsupported operations when trying to compile graph .*? on (\w+): (.+?) \(No registered")
_NOISE = re.compile(r"__inference_[^\s\]]*(\[[^\]]*\])?")


def xla_reason(exc: BaseException) -> str:
    """Why XLA refused, in one line: the ops without a kernel and the device, else the error's first line without
    TensorFlow's generated function names; and where in the user's code the op was made, when the error says."""
    text = str(exc)
    found = _UNSUPPORTED.search(text)
    reason = (f"{found.group(2)} has no XLA kernel on {found.group(1)}" if found
              else _NOISE.sub("the function", first_line(exc, limit=400))[:200])
    # "The op is created at:" lists frames, innermost last: the last one outside installed packages is the user's.
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text.split("The op is created at:", 1)[-1])
    own = [f for f in frames if "site-packages" not in f[0] and "dist-packages" not in f[0] and f[0] != "<string>"]
    if "The op is created at:" in text and own:
        path, line, function = own[-1]
        reason += f" (made at {path.rsplit('/', 1)[-1]}:{line}, in {function})"
    return reason


def graph_nodes(model) -> tuple[Any, list] | None:
    """A Keras functional model's graph (its Functional, a built Sequential's inner one) and its layer calls in an
    order that runs them (deepest first, as Keras runs them); None for a model without a graph (subclassed)."""
    functional = model if hasattr(model, "_nodes_by_depth") else getattr(model, "_functional", None)
    if functional is None or not hasattr(functional, "_nodes_by_depth"):
        return None
    nodes = [node for depth in sorted(functional._nodes_by_depth, reverse=True)
             for node in functional._nodes_by_depth[depth] if node.operation is not None and not node.is_input]
    return functional, nodes


def run_nodes(nodes: Sequence, values: dict[int, Any], call: Callable | None = None) -> dict[int, Any]:
    """Run layer calls in order on the tensors in `values` (by the id of the KerasTensor each stands for); returns
    `values` with every output added. `call(node, args, kwargs)` runs one call (default: the layer itself)."""
    import keras

    for node in nodes:
        args, kwargs = node.arguments.fill_in(values)
        outputs = call(node, args, kwargs) if call else node.operation(*args, **kwargs)
        for symbolic, value in zip(node.outputs, keras.tree.flatten(outputs)):
            values[id(symbolic)] = value
    return values


def _needs(nodes: Sequence) -> list[int]:
    """The tensors a run of layer calls takes from outside itself."""
    made = {id(t) for node in nodes for t in node.outputs}
    return list(dict.fromkeys(id(t) for node in nodes for t in node.input_tensors if id(t) not in made))


def _segment(nodes: Sequence, keep: set[int] | None = None, call: Callable | None = None
             ) -> tuple[list[int], Callable]:
    """A run of layer calls as a function of the tensors it needs, answering those it makes (only `keep`, when
    given): (what it needs, the function). `call` as in `run_nodes`."""
    needs = _needs(nodes)

    def run(given: Sequence) -> dict[str, Any]:
        made = run_nodes(nodes, dict(zip(needs, given)), call)
        return {str(k): v for k, v in made.items() if k not in needs and (keep is None or k in keep)}

    return needs, run


# XLA takes no string tensors, and handing it one can abort the process (a failed check in TensorFlow's tensor code,
# seen with TextVectorization) rather than raise: such a function is refused before it is compiled.
NO_STRINGS = "takes or makes string tensors, which XLA cannot compile (and trying can abort the process)"


def has_strings(tensors) -> bool:
    """True when any of the tensors is a string tensor."""
    return any(getattr(getattr(t, "dtype", None), "name", str(getattr(t, "dtype", ""))) == "string" for t in tensors)


def compile_error(nodes: Sequence, values: dict[int, Any]) -> BaseException | None:
    """What XLA raises compiling this run of layer calls on the tensors they saw; None when it compiles. A run that
    takes or makes string tensors is refused without compiling."""
    import tensorflow as tf

    needs, run = _segment(nodes)
    made = [values[id(t)] for node in nodes for t in node.outputs if id(t) in values]
    if has_strings([values[k] for k in needs] + made):
        return ValueError(NO_STRINGS)
    try:
        tf.function(run, jit_compile=True)([values[k] for k in needs])
    except Exception as exc:  # XLA's own refusal, or an op that fails once compiled: both keep it from compiling
        return exc
    return None


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Layers XLA cannot compile: one layer, or a run of layers that compile apart but not together."""

    layers: tuple[str, ...]  # the layers' names
    kinds: tuple[str, ...]  # their classes
    reason: str

    def describe(self) -> str:
        named = ", ".join(f"`{n}` ({k})" for n, k in zip(self.layers, self.kinds))
        if len(self.layers) == 1:
            return f"layer {named}: {self.reason}"
        return f"layers {named} compile apart but not together: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Bisection:
    """What bisecting a model's graph found."""

    layers: int  # layer calls in the graph
    compiles: int  # compiles the bisection took
    refusals: tuple[Refusal, ...]
    complete: bool  # False when MAX_COMPILES ran out first: more layers may fail

    @property
    def failing(self) -> list[str]:
        return [name for r in self.refusals for name in r.layers]


def bisect(model, inputs, *, max_compiles: int = MAX_COMPILES) -> Bisection | None:
    """The layers of a Keras functional model that XLA cannot compile, on `inputs` (the model's structure): runs of
    layer calls are compiled on the tensors they saw, a failing run halved until each failing layer stands alone.
    None for a model without a graph to bisect."""
    import keras

    found = graph_nodes(model)
    if found is None:
        return None
    functional, nodes = found
    refusals: list[Refusal] = []
    compiles, complete, layers = 0, True, 0

    def search(run: list, values: dict[int, Any], prefix: str) -> bool:
        """True when the run (or a part of it) failed; each failing part named in `refusals`."""
        nonlocal compiles, complete
        if compiles >= max_compiles:
            complete = False
            return False
        compiles += 1
        error = compile_error(run, values)
        if error is None:
            return False
        if len(run) > 1:
            half = len(run) // 2
            parts = [search(run[:half], values, prefix), search(run[half:], values, prefix)]
            if any(parts) or not complete:
                return True
        elif within(run[0], values, prefix):  # a model inside the model: its own layers are bisected
            return True
        refusals.append(Refusal(tuple(prefix + n.operation.name for n in run),
                                tuple(type(n.operation).__name__ for n in run), xla_reason(error)))
        return True

    def within(node, values: dict[int, Any], prefix: str) -> bool:
        inner = graph_nodes(node.operation)
        if inner is None:
            return False
        args, _ = node.arguments.fill_in(values)
        return graph(inner, args, f"{prefix}{node.operation.name}/")

    def graph(found: tuple, inputs, prefix: str) -> bool:
        nonlocal layers
        functional, nodes = found
        layers += len(nodes)
        values = run_nodes(nodes, {id(s): v for s, v in zip(functional.inputs, keras.tree.flatten(inputs))})
        return search(nodes, values, prefix)

    graph((functional, nodes), inputs, "")
    return Bisection(layers, compiles, tuple(refusals), complete)


def compiled_around(model, layers: Sequence[str]) -> Callable:
    """The model's call with XLA everywhere but `layers` (names as `bisect` gives them, `outer/inner` inside a model
    in the model): each run of layer calls between them compiled as one XLA cluster (`tf.function(jit_compile=True)`),
    the named layers run by TensorFlow's executor, the whole in a tf.function. Takes inputs in the model's structure;
    ValueError for a model without a graph."""
    import keras
    import tensorflow as tf

    found = graph_nodes(model)
    if found is None:
        raise ValueError(f"{model.name} has no functional graph to compile in parts")
    functional, nodes = found
    inside: dict[str, list[str]] = {}  # a model in the model that holds failing layers: its own failing layers
    for name in layers:
        outer, _, inner = name.partition("/")
        if inner:
            inside.setdefault(outer, []).append(inner)
    apart = set(layers) | set(inside)
    runs: list[list] = []
    for node in nodes:
        if node.operation.name in apart or not runs or runs[-1][0].operation.name in apart:
            runs.append([node])
        else:
            runs[-1].append(node)
    outputs = [id(t) for t in functional.outputs]
    parts = {name: compiled_around(node.operation, inside[name]) for node in nodes
             if (name := node.operation.name) in inside}

    def in_parts(node, args, kwargs):
        part = parts.get(node.operation.name)
        return part(*args) if part is not None else node.operation(*args, **kwargs)

    steps = []
    for k, run in enumerate(runs):
        later = {i for r in runs[k + 1:] for i in _needs(r)} | set(outputs)
        needs, segment = _segment(run, keep=later, call=in_parts)
        compiled = run[0].operation.name not in apart
        steps.append((needs, tf.function(segment, jit_compile=True) if compiled else segment))

    @tf.function
    def call(inputs):
        values = {id(s): v for s, v in zip(functional.inputs, keras.tree.flatten(inputs))}
        for needs, step in steps:
            values.update({int(k): v for k, v in step([values[i] for i in needs]).items()})
        return keras.tree.pack_sequence_as(functional._outputs_struct, [values[i] for i in outputs])

    return call


@dataclasses.dataclass(frozen=True)
class XlaFailure:
    """`jit_compile=True` failing on the model: why, the layers the bisection named, and the row that times the rest
    compiled (None, with `not_timed` saying why, when there is none)."""

    reason: str
    bisection: Bisection | None
    row: str | None = None
    not_timed: str = ""

    def describe(self) -> str:
        words = [f"`jit_compile=True` fails on the whole model: {self.reason}."]
        b = self.bisection
        if b is None:
            words.append("The model has no Keras functional graph (a SavedModel or a subclassed model), so its layers "
                         "could not be compiled apart.")
        elif not b.refusals:
            words.append(f"Bisecting its {b.layers} layer calls ({b.compiles} compiles) named none: "
                         + ("the compile budget ran out first." if not b.complete else
                            "each part compiles on its own, so the failure lies in how the whole is traced."))
        else:
            words.append(f"Bisecting its {b.layers} layer calls ({b.compiles} compiles, each on the tensors the layers "
                         f"saw) names: " + "; ".join(r.describe() for r in b.refusals) + "."
                         + ("" if b.complete else f" The bisection stopped at {MAX_COMPILES} compiles: more may fail."))
        if self.row:
            names = ", ".join(repr(n) for n in b.failing)
            words.append(f"The rest of the model compiled, those layers left to TensorFlow's executor, is timed as "
                         f"**{self.row}** against tf.function in the inference tables. Apply: move the layer out of "
                         f"the model (a string or Python op belongs in the input pipeline), or compile around it: "
                         f"`serve = tfperf.doctor.xla.compiled_around(model, [{names}])`.")
        elif self.not_timed:
            words.append(f"The rest of the model was not timed compiled: {self.not_timed}.")
        return " ".join(words)
