"""The deployment commands of `tfperf`: export (SavedModel, LiteRT, ONNX), predict, inspect.

Every command takes the same MODEL (`tfperf.deploy.loader`): a cookbook net, a .keras or .h5 file, a
SavedModel folder, or module:factory; `predict` and `inspect` take any export of the three formats.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

from tfperf import flags
from tfperf.catalog import MODEL_NAMES
from tfperf.deploy.limits import MEMORY_SHARE, TIME_LIMIT_S, ceilings, default_memory_ceiling
from tfperf.flags import UserError
from tfperf.records.units import number


def model_errors():
    from tfperf.deploy.errors import ExportError, InputError, ModelError

    return (ExportError, InputError, ModelError)


def dataset_rows(dataset: str, input_shape: tuple, seed: int = 0):
    """Training and test rows of a cookbook data set, checked against a cookbook net's input shape."""
    from tfperf.data import DatasetUnavailable, load_arrays

    try:
        data = load_arrays(dataset, seed=seed)
    except DatasetUnavailable as exc:
        raise UserError(str(exc)) from None
    if tuple(data.input_shape) != tuple(input_shape):
        raise UserError(f"--dataset {dataset} has inputs shaped {list(data.input_shape)}, the model takes "
                        f"{list(input_shape)}: calibrate on the data the model was trained on")
    return data


def print_export(exported) -> None:
    """The export's folder, what its check found, and a warning when it needs what the runtime lacks."""
    from tfperf.deploy.layout import describe_check

    meta = exported.metadata
    print(exported.path)
    for line in describe_check(meta):
        print(line)
    if str(meta.get("calibrated_on", "")).startswith("synthetic"):
        print(f"tfperf export: warning: int8 ranges calibrated on {meta['calibrated_on']}", file=sys.stderr)
    if meta.get("flex_ops"):
        print(f"tfperf export: warning: {exported.path} runs TensorFlow ops {', '.join(meta['flex_ops'])} through "
              f"the Flex delegate; ai-edge-litert's interpreter does not link it, so only a runtime built with it "
              f"can load this model", file=sys.stderr)


def cmd_export(args: argparse.Namespace) -> int:
    """Export any model the loader reads, checked against the model, as a versioned export."""
    from tfperf.deploy.inputs import read_sample
    from tfperf.deploy.layout import CALIBRATION_ROWS, export_subject
    from tfperf.deploy.loader import COOKBOOK_INPUT, cookbook_subject, load_subject, parse_input_shapes

    from tfperf.deploy.formats import FORMATS

    try:
        FORMATS[args.format].require()  # a converter not installed is said before the model is loaded
        shapes = parse_input_shapes(args.input_shape or [])
        sample = read_sample(args.sample, args.max_input_size) if args.sample else None
        if args.model in MODEL_NAMES:
            if args.signature or args.trust:
                raise UserError("--signature and --trust are for model files and folders, not cookbook nets")
            subject = cookbook_subject(args.model, weights=args.weights, num_classes=args.num_classes,
                                       input_shape=shapes.get("", shapes.get(COOKBOOK_INPUT)))
        else:
            if args.num_classes:
                raise UserError(f"--num-classes is for the cookbook nets ({', '.join(MODEL_NAMES)})")
            subject = load_subject(args.model, input_shapes=shapes, trust=args.trust, signature=args.signature,
                                   weights=args.weights)
        calibration = None
        if args.quantize == "int8" and sample is None and args.model in MODEL_NAMES:
            data = dataset_rows(args.dataset, subject.inputs[0].shape)
            calibration = ({COOKBOOK_INPUT: data.x_train[:CALIBRATION_ROWS]},
                           f"{CALIBRATION_ROWS} training rows of {args.dataset}")
        exported = export_subject(subject, args.root, name=args.name, version=args.version, format=args.format,
                                  quantize=args.quantize, sample=sample, calibration=calibration,
                                  select_tf_ops=args.select_tf_ops,
                                  metadata={"weights": args.weights} if args.weights else None)
    except model_errors() as exc:
        raise UserError(str(exc)) from None
    print_export(exported)
    return 0


def summarize(outputs: dict, classifier: str | None) -> list[str]:
    """A line per output (shape, dtype, range), and the predicted classes when the export is a classifier."""
    import numpy as np

    lines = []
    for name, a in outputs.items():
        numeric = a.dtype.kind in "biuf" and a.size
        span = f", values {number(np.min(a), 4)} to {number(np.max(a), 4)}" if numeric else ""
        lines.append(f"{name}: {a.dtype}{list(a.shape)}{span}")
    if classifier in outputs:
        lines.append("predicted classes: " + " ".join(str(c) for c in np.argmax(outputs[classifier], axis=-1)))
    return lines


def write_outputs(path: Path, outputs: dict, classifier: str | None) -> str:
    """Outputs to .npz (every output by name) or .npy (the one output, or a classifier's scores), atomically;
    what was written."""
    import numpy as np

    from tfperf.deploy.errors import InputError, listed
    from tfperf.deploy.inputs import npz_bytes
    from tfperf.records.jsonl import atomic_write_bytes

    buf = io.BytesIO()
    if path.suffix == ".npz":
        buf.write(npz_bytes(outputs))
        what = ", ".join(f"{k} {list(v.shape)}" for k, v in outputs.items())
    elif path.suffix == ".npy":
        name = next(iter(outputs)) if len(outputs) == 1 else classifier
        if name not in outputs:
            raise InputError(f"the export answers {len(outputs)} outputs ({listed(outputs)}): write them all "
                             f"with --output FILE.npz")
        np.save(buf, outputs[name])
        what = f"{name} {list(outputs[name].shape)}"
    else:
        raise InputError(f"--output {path}: give a .npz file (every output by name) or a .npy file (one output)")
    atomic_write_bytes(path, buf.getvalue())
    return what


def loading_flags(args: argparse.Namespace) -> list[str]:
    """The flags that say how a model was loaded (sizes, trust, signature), for a command printed to reproduce a
    result: without them, the printed command fails or loads another model."""
    found = [a for text in getattr(args, "input_shape", None) or [] for a in ("--input-shape", text)]
    if getattr(args, "trust", False):
        found.append("--trust")
    if getattr(args, "signature", None):
        found += ["--signature", args.signature]
    return found


def cmd_predict(args: argparse.Namespace) -> int:
    """Load an export in its format's runtime, check the inputs against its specs, run it."""
    from tfperf.deploy.inputs import non_finite, read_arrays
    from tfperf.deploy.inspection import check_safe
    from tfperf.deploy.formats import read_metadata
    from tfperf.deploy.layout import load, predict

    try:
        arrays = read_arrays(args.input, args.max_input_size)
        check_safe(args.model_dir, trust=args.trust)
        memory = args.memory_limit if args.memory_limit is not None else default_memory_ceiling()
        with ceilings("predict", args.time_limit, memory):
            runner = load(args.model_dir, signature=args.signature)
            outputs = predict(runner, arrays)
        classifier = read_metadata(args.model_dir).get("classifier")
        bad = non_finite(arrays)
        if bad:  # the model runs on them, but nothing it says about those rows can be trusted
            total = sum(a.size for a in arrays.values())
            print(f"tfperf predict: warning: {bad} of {total} input values are NaN or infinite; the predictions for "
                  f"the rows holding them are not meaningful", file=sys.stderr)
        if args.output:
            print(f"wrote {args.output}: {write_outputs(Path(args.output), outputs, classifier)}")
    except model_errors() as exc:
        raise UserError(str(exc)) from None
    for line in summarize(outputs, classifier):
        print(line)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe an export without running it; exit 1 when it holds ops off the allowlist."""
    from tfperf.deploy.inspection import format_report, inspect_model

    try:
        report = inspect_model(args.model_dir)
    except model_errors() as exc:
        raise UserError(str(exc)) from None
    print(format_report(report))
    return 0 if report.safe else 1


def add_format_flags(p: argparse.ArgumentParser) -> None:
    """--format, --quantize, --select-tf-ops."""
    from tfperf.deploy.formats import FORMATS, QUANTIZATIONS

    p.add_argument("--format", default="savedmodel", choices=list(FORMATS),
                   help="; ".join(f"{f.name}: {f.describe}" for f in FORMATS.values()))
    p.add_argument("--quantize", default="none", choices=QUANTIZATIONS,
                   help="litert only: dynamic (int8 weights) or int8 (weights and activations, calibrated on "
                        "--sample, or a cookbook net's --dataset)")
    p.add_argument("--select-tf-ops", action="store_true",
                   help="litert only: run ops LiteRT lacks as TensorFlow ops (the runtime must link the Flex delegate)")


MODEL_HELP = (f"a cookbook net ({', '.join(MODEL_NAMES)}), a .keras or .h5 file, a SavedModel folder, or "
              f"module:factory (a Python function that returns a Keras model)")


def add_commands(sub) -> None:
    """Add export, predict and inspect to the `tfperf` subcommands."""

    exp = sub.add_parser("export", help="write saved_models/<name>/<version>/ (TF Serving layout) in a format, "
                                        "checked against the model")
    exp.add_argument("model", help=MODEL_HELP)
    exp.add_argument("--weights", help="a cookbook net's checkpoint folder or prefix from `tfperf train`")
    exp.add_argument("--sample", metavar="FILE.npz",
                     help="real inputs (arrays named after the model's inputs): the export is checked on them, and "
                          "int8 calibrates on them")
    exp.add_argument("--max-input-size", type=flags.byte_size, metavar="SIZE",
                     help="largest --sample, once read, that export accepts (default: half the memory available)")
    exp.add_argument("--input-shape", action="append", metavar="[NAME=]D,D",
                     help="sizes (without the batch axis) to make, check and time inputs at where the model leaves "
                          "them free (default 32); exports keep such axes free; repeat per input")
    exp.add_argument("--signature", help="the SavedModel signature to export (default serving_default, serve, or "
                                         "the only one)")
    exp.add_argument("--trust", action="store_true",
                     help="load a model that would run code on load (Keras lambdas, ops off the allowlist) knowingly")
    exp.add_argument("--name", help="export name (default: the model's name)")
    exp.add_argument("--version", type=flags.positive_int, help="version number (default: the next free one)")
    exp.add_argument("--num-classes", type=flags.positive_int, help="a cookbook net's classes")
    exp.add_argument("--root", default="saved_models", help="folder of exports")
    add_format_flags(exp)
    flags.add_dataset_flag(exp, "mnist-5k")
    exp.set_defaults(func=cmd_export)

    pred = sub.add_parser("predict", help="run an export (any format, tfperf's or not) on .npy or .npz inputs")
    pred.add_argument("model_dir", help="an export folder: saved_models/<name>/<version>, or any SavedModel, "
                                        "LiteRT or ONNX folder")
    pred.add_argument("--input", required=True, help=".npy (a one-input model) or .npz (arrays named after the inputs)")
    pred.add_argument("--output", help="write every output (.npz, by name) or the one output (.npy); "
                                       "default: print a summary")
    pred.add_argument("--signature", help="the signature to serve (default serving_default, serve, or the only one)")
    pred.add_argument("--trust", action="store_true",
                      help="load a model even though `tfperf inspect` finds ops off its allowlist")
    pred.add_argument("--max-input-size", type=flags.byte_size, metavar="SIZE",
                      help="largest input, once read, that predict accepts (default: half the memory available)")
    pred.add_argument("--time-limit", type=flags.positive_float, default=TIME_LIMIT_S, metavar="SECONDS",
                      help=f"stop with one line if loading and running the model take longer (default {TIME_LIMIT_S:g})")
    pred.add_argument("--memory-limit", type=flags.byte_size, metavar="SIZE",
                      help=f"stop with one line if the process's memory passes SIZE while the model loads and runs "
                           f"(default: {MEMORY_SHARE:.0%}% of what it could take when it began)")
    pred.set_defaults(func=cmd_predict)

    insp = sub.add_parser("inspect", help="describe an export's inputs, outputs and ops without running it")
    insp.add_argument("model_dir")
    insp.set_defaults(func=cmd_inspect)
