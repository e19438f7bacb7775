"""The deployment commands of `tfperf`: train, export (SavedModel, LiteRT, ONNX), predict, inspect."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tfperf import flags
from tfperf.flags import UserError

# Rows of training data that int8 quantization calibrates on: enough to see each activation's range.
REPRESENTATIVE_ROWS = 256


def _model_errors():
    from tfperf.deploy.layout import ExportError, InputError, ModelError

    return (ExportError, InputError, ModelError)


def representative_rows(dataset: str, input_shape: tuple, seed: int = 0):
    """Training rows of `dataset` for int8 calibration, checked against the model's input shape."""
    from tfperf.data import DatasetUnavailable, load_arrays

    try:
        data = load_arrays(dataset, seed=seed)
    except DatasetUnavailable as exc:
        raise UserError(str(exc)) from None
    if tuple(data.input_shape) != tuple(input_shape):
        raise UserError(f"--dataset {dataset} has inputs shaped {list(data.input_shape)}, the model takes "
                        f"{list(input_shape)}: calibrate on the data the model was trained on")
    return data.x_train[:REPRESENTATIVE_ROWS]


def export_options(args: argparse.Namespace, model) -> dict:
    """export()'s format options from the flags; int8 gets its calibration rows."""
    options = {"format": args.format, "quantize": args.quantize, "select_tf_ops": args.select_tf_ops}
    if args.quantize == "int8":
        options["representative"] = representative_rows(args.dataset, model.input_shape[1:])
    return options


def cmd_train(args: argparse.Namespace) -> int:
    """Train a get_net model with checkpoints (resuming from the latest), optionally export it."""
    from tfperf.data import DatasetUnavailable, load_arrays
    from tfperf.models import get_net
    from tfperf.deploy.layout import export
    from tfperf.train import CheckpointError, train

    try:
        data = load_arrays(args.dataset, seed=args.seed)
        model = get_net(args.model, input_shape=data.input_shape, num_classes=data.num_classes)
    except (DatasetUnavailable, ValueError) as exc:
        raise UserError(str(exc)) from None
    ckpt_dir = Path(args.checkpoint_dir or Path("checkpoints") / f"{args.model}-{args.dataset}")
    every = max(1, args.steps // 20)

    def progress(step: int, loss: float) -> None:
        if step % every == 0 or step == args.steps:
            print(f"step {step}/{args.steps} loss {loss:.4f}", flush=True)

    try:
        result = train(model, data, steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr,
                       seed=args.seed, checkpoint_dir=ckpt_dir, checkpoint_every=args.checkpoint_every,
                       keep=args.keep, on_step=progress)
    except CheckpointError as exc:
        raise UserError(str(exc)) from None
    for prefix, why in result.skipped:
        print(f"skipped checkpoint {prefix}: it cannot be restored ({why})", file=sys.stderr)
    start = f"resumed from step {result.resumed_from}" if result.resumed_from else "started from scratch"
    print(f"done: {result.steps} steps ({start}), loss {result.final_loss:.4f}, "
          f"test accuracy {result.test_accuracy:.4f}, checkpoint {result.checkpoint}")
    if args.export:
        try:
            path = export(model, args.root, name=args.name or f"{args.model}-{args.dataset}",
                          **export_options(args, model), metadata={
                              "training": {"dataset": args.dataset, "steps": result.steps,
                                           "test_accuracy": result.test_accuracy, "final_loss": result.final_loss}})
        except _model_errors() as exc:
            raise UserError(str(exc)) from None
        warn_flex(path)
        print(f"exported: {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a get_net model (with trained weights from a checkpoint) as a versioned export."""
    from tfperf.models import get_net
    from tfperf.deploy.layout import export
    from tfperf.train import restore_weights

    try:
        shape = tuple(args.input_shape) if args.input_shape else None
        model = get_net(args.model, input_shape=shape, num_classes=args.num_classes)
        metadata = {}
        if args.weights:
            metadata["weights"] = restore_weights(model, args.weights)
        path = export(model, args.root, name=args.name, version=args.version, **export_options(args, model),
                      metadata=metadata)
    except (FileNotFoundError, ValueError) as exc:  # ExportError is a ValueError
        raise UserError(str(exc)) from None
    warn_flex(path)
    print(path)
    return 0


def warn_flex(path: Path) -> None:
    """Say on stderr when a LiteRT export needs the Flex delegate, which the installed interpreter lacks."""
    from tfperf.deploy.layout import read_metadata

    flex = read_metadata(path).get("flex_ops")
    if flex:
        print(f"tfperf export: warning: {path} runs TensorFlow ops {', '.join(flex)} through the Flex delegate; "
              f"ai-edge-litert's interpreter does not link it, so only a runtime built with it can load this model",
              file=sys.stderr)


def cmd_predict(args: argparse.Namespace) -> int:
    """Load an export in its format's runtime, check the input against its spec, run it."""
    import io

    import numpy as np

    from tfperf.deploy.inspection import check_safe
    from tfperf.records.records import atomic_write_bytes
    from tfperf.deploy.layout import load, non_finite, predict, read_array

    try:
        x = read_array(args.input)
        if not args.trust:
            check_safe(args.model_dir)
        outputs = predict(load(args.model_dir), x)
    except _model_errors() as exc:
        raise UserError(str(exc)) from None
    bad = non_finite(x)
    if bad:  # the model runs on them, but nothing it says about those rows can be trusted
        print(f"tfperf predict: warning: {bad} of {x.size} input values are NaN or infinite; the predictions for "
              f"the rows holding them are not meaningful", file=sys.stderr)
    if args.output:
        buf = io.BytesIO()
        np.save(buf, outputs["probabilities"])
        atomic_write_bytes(args.output, buf.getvalue())
        print(f"wrote {args.output}: probabilities {outputs['probabilities'].shape}")
    else:
        print("predicted classes:", " ".join(str(c) for c in np.argmax(outputs["probabilities"], axis=-1)))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe an export without running it; exit 1 when it holds ops off the allowlist."""
    from tfperf.deploy.inspection import format_report, inspect_model

    try:
        report = inspect_model(args.model_dir)
    except _model_errors() as exc:
        raise UserError(str(exc)) from None
    print(format_report(report))
    return 0 if report.safe else 1


def add_format_flags(p: argparse.ArgumentParser) -> None:
    """--format, --quantize, --select-tf-ops, and --dataset for int8 calibration."""
    from tfperf.deploy.formats import FORMATS, QUANTIZATIONS

    p.add_argument("--format", default="savedmodel", choices=list(FORMATS),
                   help="; ".join(f"{f.name}: {f.describe}" for f in FORMATS.values()))
    p.add_argument("--quantize", default="none", choices=QUANTIZATIONS,
                   help="litert only: dynamic (int8 weights) or int8 (weights and activations, calibrated on "
                        "--dataset's training rows)")
    p.add_argument("--select-tf-ops", action="store_true",
                   help="litert only: run ops LiteRT lacks as TensorFlow ops (the runtime must link the Flex delegate)")


def add_commands(sub) -> None:
    """Add train, export, predict and inspect to the `tfperf` subcommands."""
    train = sub.add_parser("train", help="train a model with checkpoints; a rerun resumes from the latest")
    flags.add_model_flag(train, "cnn")
    flags.add_dataset_flag(train, "mnist-5k")
    train.add_argument("--steps", type=flags.positive_int, default=300, help="total training steps")
    train.add_argument("--batch-size", type=flags.positive_int, default=64)
    train.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--checkpoint-dir", help="default: checkpoints/<model>-<dataset>")
    train.add_argument("--checkpoint-every", type=flags.positive_int, default=50, help="steps between checkpoints")
    train.add_argument("--keep", type=flags.positive_int, default=3, help="checkpoints kept")
    train.add_argument("--export", action="store_true", help="export the trained model when done")
    train.add_argument("--name", help="export name (default <model>-<dataset>)")
    train.add_argument("--root", default="saved_models", help="folder of exports")
    add_format_flags(train)
    train.set_defaults(func=cmd_train)

    exp = sub.add_parser("export", help="write saved_models/<name>/<version>/ (TF Serving layout) in a format")
    flags.add_model_flag(exp, "cnn")
    exp.add_argument("--weights", help="checkpoint folder or prefix from `tfperf train` (default: fresh weights)")
    exp.add_argument("--name", help="export name (default: the model's name)")
    exp.add_argument("--version", type=flags.positive_int, help="version number (default: the next free one)")
    exp.add_argument("--input-shape", type=flags.positive_int, nargs="+", help="one example's shape")
    exp.add_argument("--num-classes", type=flags.positive_int)
    exp.add_argument("--root", default="saved_models", help="folder of exports")
    add_format_flags(exp)
    flags.add_dataset_flag(exp, "mnist-5k")
    exp.set_defaults(func=cmd_export)

    pred = sub.add_parser("predict", help="run an export (any format) on a .npy input")
    pred.add_argument("model_dir", help="saved_models/<name>/<version>")
    pred.add_argument("--input", required=True, help=".npy array shaped like the model's input")
    pred.add_argument("--output", help="write the probabilities here (.npy); default: print the classes")
    pred.add_argument("--trust", action="store_true",
                      help="load a model even though `tfperf inspect` finds ops off its allowlist")
    pred.set_defaults(func=cmd_predict)

    insp = sub.add_parser("inspect", help="describe an export's inputs, outputs and ops without running it")
    insp.add_argument("model_dir")
    insp.set_defaults(func=cmd_inspect)
