"""SavedModel for deployment: export, reload, and what serving from it costs.

Export a model in the TF Serving layout, load it back without any of its Python code, and time the
export, the reload and first call, and the steady-state latency against the in-process model.

Run:   python recipes/saved_model.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21 and Keras 3; a CPU is enough.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.measure import Timer, interleave, timing_ms, versus
from tfperf.models import default_input_shape, get_net
from tfperf.recipe import Conclusion, Headline, Recipe



# The technique: export in TF Serving's layout, then load with TensorFlow alone ------------------------
# The seed's serialization section ends at `tf.saved_model.save(net, 'my_mlp')`. A deployed model is
# loaded by another process, often another language (TF Serving is C++), so what matters is: an explicit
# signature (named input, any batch size), a layout that servers understand (`<name>/<version>/`), and
# what loading and calling the graph costs compared with the model in the training process. The
# reloaded signature is a concrete function: it never retraces, whatever the batch size. How the
# SavedModel compares with other runtimes (LiteRT, ONNX Runtime, Keras itself), including the cold
# start of a fresh serving process, is recipes/serving_runtimes.py's subject and is measured there.


def export_and_reload(net, root: Path):
    """The technique: export in TF Serving's layout, then load it back with TensorFlow alone."""
    # Export: Keras 3 writes a SavedModel whose `serve` endpoint (aliased `serving_default` for TF Serving)
    # takes any batch size; TF Serving expects <model_root>/<name>/<version>/.
    export_dir = root / net.name / "1"
    net.export(str(export_dir), verbose=False)
    # Load: no Keras and none of the model's Python code; `loaded.serve(x)` is a concrete function that never
    # retraces (keep `loaded` alive while you call it: it owns the variables).
    loaded = tf.saved_model.load(str(export_dir))
    return export_dir, loaded


# Measuring -------------------------------------------------------------------------------------------

STARTUP, LATENCY = "start-up: load and first call", "steady-state latency by batch size"


@dataclasses.dataclass(frozen=True)
class Found:
    export_s: float  # export, load and first call, in this process
    reload_s: float  # load and first call again
    size: int  # bytes on disk
    outputs_match: bool  # the reloaded signature answers as the in-process model does
    retraces: int  # the in-process tf.function's traces beyond the first, over the batch sizes
    reloaded_vs: dict  # batch -> Comparison of the reloaded signature against the in-process model


def add_flags(p) -> None:
    flags.add_model_flag(p, "cnn")
    p.add_argument("--batches", type=flags.positive_int, nargs="+", help="batch sizes of the latency sweep")


def measure(args, rec) -> Found:
    tf.random.set_seed(args.seed)
    shape = default_input_shape(args.model)

    # Start-up happens once per process: each is a Timer's first call, timed apart from any steady state.
    made = {}

    def first(name: str, fn) -> float:
        """Seconds of one call of fn, which keeps what it makes in `made`."""
        return Timer(fn, name=name).start(warmup=0)

    # Baseline: the model in the process that built it, as a tf.function with a None batch axis.
    def build_and_call():
        made["net"] = get_net(args.model)
        made["fn"] = tf.function(lambda x: made["net"](x, training=False),
                                 input_signature=[tf.TensorSpec([None, *shape])])
        return made["fn"](tf.zeros([1, *shape]))

    built_s = first("in-process: build + first call", build_and_call)
    net, in_process = made["net"], made["fn"]
    # Single readings (a first call happens once per process): no speedup column is drawn from them.
    rec.add(STARTUP, "in-process: build + first call", {"seconds": built_s}, primary="seconds", lower_is_better=True,
            versus_first=False)

    with tempfile.TemporaryDirectory() as root:
        def export_load_and_call():
            made["path"], made["loaded"] = export_and_reload(net, Path(root))
            return made["loaded"].serve(tf.zeros([1, *shape]))

        def load_and_call():
            made["again"] = tf.saved_model.load(str(made["path"]))
            return made["again"].serve(tf.zeros([1, *shape]))

        export_s = first("export, load and first call", export_load_and_call)
        path, serve = made["path"], made["loaded"].serve
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        reload_s = first("reloaded, same process: load + first call", load_and_call)
        rec.add(STARTUP, "reloaded, same process: load + first call", {"seconds": reload_s},
                primary="seconds", lower_is_better=True, versus_first=False)

        # Steady state: the same batch through both, p50 and p99, in the same interleaved rounds.
        outputs_match, reloaded_vs = True, {}
        for batch in args.batches:
            x = tf.random.normal([batch, *shape], seed=args.seed)
            outputs_match &= bool(np.allclose(in_process(x).numpy(), serve(x).numpy(), rtol=1e-5, atol=1e-5))
            mine, theirs = interleave([Timer(lambda: in_process(x), name=f"in-process, batch {batch}",
                                             items_per_call=batch),
                                       Timer(lambda: serve(x), name=f"reloaded, batch {batch}", items_per_call=batch)],
                                      samples=args.steps, warmup=args.warmup, seed=args.seed,
                                      profile_dir=args.profile)
            reloaded_vs[batch] = versus(mine, theirs)
            for m, c in ((mine, None), (theirs, reloaded_vs[batch])):
                rec.add(LATENCY, m.name, {"us_per_row": m.median_per_item_s * 1e6, **timing_ms(m)},
                        primary="us_per_row", lower_is_better=True, measurement=m, comparison=c)
        retraces = in_process.experimental_get_tracing_count() - 1

    return Found(export_s, reload_s, size, outputs_match, retraces, reloaded_vs)


def conclude(args, rec, found: Found) -> Conclusion:
    outputs_match, retraces, reloaded_vs = found.outputs_match, found.retraces, found.reloaded_vs
    line = (f"export, load and first call: {found.export_s:.2f} s, {found.size / 1e6:.1f} MB on disk; "
            f"outputs match in-process: "
            f"{outputs_match}; retraces over {len(args.batches)} batch sizes: {retraces}")

    lat = {r["row"]: r["metrics"] for r in rec.table(LATENCY)}
    p99_over_p50 = max(m["p99_ms"] / m["median_ms"] for m in lat.values())
    small, large = args.batches[0], args.batches[-1]
    conclusion = (
        f"Loading the {args.model} SavedModel back and answering its first request took {found.reload_s:.2f} s "
        f"in this process (a fresh serving process also imports TensorFlow first: serving_runtimes.py times "
        f"that), so send a warm-up request before taking traffic. Once warm, "
        f"the reloaded signature against the in-process model: "
        f"{'; '.join(f'at batch {b}, {c.describe()}' for b, c in reloaded_vs.items())}. It is the same graph, "
        f"without Keras. Batching is the lever: "
        f"{lat[f'reloaded, batch {small}']['us_per_row']:.0f} us per row at batch {small} against "
        f"{lat[f'reloaded, batch {large}']['us_per_row']:.1f} at batch {large}. The worst p99 is "
        f"{p99_over_p50:.1f}x its median on this shared machine: quote tails, not just medians. Outputs "
        f"{'match' if outputs_match else 'DO NOT match'} the in-process model and the signature traced once "
        f"for all batch sizes ({retraces} retraces)."
    )
    failure = "" if outputs_match and not retraces else "the reloaded model disagrees with the in-process one, or retraced"
    return Conclusion(conclusion, [line], failure, Headline.compared(
        f"the reloaded SavedModel signature against the in-process Keras model, batch {small}", reloaded_vs[small]))


RECIPE = Recipe(name="saved_model", doc=__doc__, order=140, measure=measure, conclude=conclude, add_flags=add_flags,
                uses=("steps", "warmup"),
                sizes={"steps": (200, 30), "warmup": (20, 5), "batches": ([1, 8, 64, 256], [1, 16, 128])})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
