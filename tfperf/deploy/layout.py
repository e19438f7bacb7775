"""Exports in the TF Serving layout: written atomically, never overwriting, checked against the model
before they are renamed into place; reloaded in their format's runtime, and run on checked inputs."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfperf import __version__
from tfperf.flags import check_stop, cleaned_up
from tfperf.deploy.formats import (FLOAT_TOLERANCE, FORMATS, METADATA_FILE, NOT_EVIDENCE, SIGNATURE, Runner,
                                   Servable, agreement, constant,
                                   check_model_dir, check_options, format_of, read_metadata, versions)
from tfperf.deploy.errors import ExportError, ModelError, first_line, listed
from tfperf.deploy.inputs import fit_inputs, npz_bytes, read_arrays
from tfperf.gpus import exact_float32
from tfperf.records.units import number



# A staging folder's name says who writes it: .<version>.partial-<host>-<pid>-<random>.
STAGING = re.compile(r"^\.\d+\.partial-(?P<host>.+)-(?P<pid>\d+)-[A-Za-z0-9_]+$")
STALE_AFTER_S = 24 * 3600  # a staging folder of another host (shared storage) is left alone this long


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def clean_stale_staging(model_root: Path | str) -> list[Path]:
    """Remove staging folders that exports killed mid-write left behind; the removed folders.

    A folder is stale when its writer, named in its name, is no longer running on this host, or when
    it is older than a day (another host's, or named before writers were). A running export's folder
    is never touched.
    """
    root = Path(model_root)
    if not root.is_dir():
        return []
    removed = []
    for folder in root.iterdir():
        if not (folder.is_dir() and folder.name.startswith(".") and ".partial-" in folder.name):
            continue
        owner = STAGING.match(folder.name)
        if owner and owner["host"] == socket.gethostname():
            stale = not _process_alive(int(owner["pid"]))
        else:
            stale = time.time() - folder.stat().st_mtime > STALE_AFTER_S
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then every folder, deepest first."""
    for parent, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            with open(os.path.join(parent, name), "rb") as f:
                os.fsync(f.fileno())
        _sync_dir(Path(parent))


def next_version(model_root: Path | str) -> int:
    """The version an export takes when none is asked for: one past the highest."""
    existing = versions(model_root)
    return existing[-1] + 1 if existing else 1


@dataclasses.dataclass(frozen=True)
class Check:
    """What an export is checked against before it is renamed into place: inputs by name, the model's own
    outputs on them, where the inputs came from, and the output holding class scores (for classifiers)."""

    inputs: Mapping[str, np.ndarray]
    reference: Mapping[str, np.ndarray]
    source: str  # "the sample" or "synthetic inputs"
    classifier: str | None = None


def compare_with_model(runner: Runner, checks: Sequence[Check], quantized: bool) -> dict[str, Any]:
    """How the loaded export answers against the model on each check's inputs (several when the model leaves
    a size free: each at another size): per output the largest difference (absolute and relative to the
    output's scale), and for classifiers how often the top class is the same; ExportError when a float32
    export disagrees beyond FLOAT_TOLERANCE."""
    specs = [(s.name, s.dtype, s.shape[1:]) for s in runner.inputs]
    outputs: dict[str, dict[str, float]] = {}
    top, rows = [], 0
    for check in checks:
        got = runner(fit_inputs(check.inputs, specs, "check inputs"))
        missing = sorted(set(check.reference) - set(got))
        if missing:
            raise ExportError(f"the {runner.format} export lacks outputs {listed(missing)} (it has "
                              f"{listed(got)}); nothing was written")
        for name, found in agreement(check.reference, got).items():
            if name not in outputs or found["relative"] > outputs[name]["relative"]:
                outputs[name] = found
        if check.classifier in check.reference:
            ref, out = np.asarray(check.reference[check.classifier]), np.asarray(got[check.classifier])
            top += list(ref.argmax(-1) == out.argmax(-1))
        rows += len(next(iter(check.inputs.values())))
    found = {"on": f"{rows} rows of " + " and ".join(c.source for c in checks), "outputs": outputs,
             "tolerance": FLOAT_TOLERANCE}
    if all(constant(c.reference) for c in checks):
        found["constant"] = NOT_EVIDENCE
    if top:
        found["top_class_agreement"] = float(np.mean(top))
    bad = {n: a for n, a in found["outputs"].items() if a["relative"] > FLOAT_TOLERANCE}
    if bad and not quantized:
        worst = max(bad, key=lambda n: bad[n]["relative"])
        raise ExportError(f"the {runner.format} export disagrees with the model: output {worst!r} differs by up to "
                          f"{number(bad[worst]['max_abs_diff'], 3)} ({number(bad[worst]['relative'], 3)} of "
                          f"its scale, over "
                          f"{FLOAT_TOLERANCE:g}) on {found['on']}; nothing was written")
    return found


VARIES = 1e-3  # a layer whose output moves across rows by this much of its own size can be checked on
CHECK_FILE = "check.npz"  # beside the model: the rows the export was checked on and the model's answers


def _no_space(exc: BaseException) -> bool:
    return (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or "No space left" in str(exc)


@dataclasses.dataclass(frozen=True)
class Exported:
    """A finished export: its folder and the metadata written beside it (tfperf.json)."""

    path: Path
    metadata: Mapping[str, Any]


def export(servable: Servable, root: Path | str = "saved_models", *, name: str, version: int | None = None,
           format: str = "savedmodel", quantize: str = "none", representative: Mapping[str, np.ndarray] | None = None,
           select_tf_ops: bool = False, checks: Sequence[Check] = (),
           metadata: Mapping[str, Any] | None = None) -> Exported:
    """Write root/<name>/<version>/ atomically in `format`, checked against the model before it is renamed
    into place; an asked-for version that exists is an error naming a free one, and a version taken by a
    concurrent export while this one was written moves this one to the next free version.

    Args:
      quantize: LiteRT only: none, dynamic (int8 weights) or int8 (weights and activations).
      representative: input rows by name that int8 quantization calibrates its ranges on.
      select_tf_ops: LiteRT only: run ops LiteRT lacks as TensorFlow ops (needs the Flex delegate).
      checks: the inputs and the model's outputs the export must reproduce (float32 within FLOAT_TOLERANCE),
        several when the model leaves a size free (each at another size).
    """
    import tensorflow as tf

    check_options(format, quantize, select_tf_ops, representative)
    if not name or name.startswith(".") or os.sep in name or (os.altsep and os.altsep in name) or not name.isprintable():
        raise ExportError(f"invalid export name {name!r}: use a plain folder name such as 'mnist-cnn'")
    if version is not None and version < 1:
        raise ExportError(f"version must be a positive integer (TF Serving's layout), got {version}")
    model_root = Path(root) / name
    asked = version is not None
    version = version or next_version(model_root)
    if (model_root / str(version)).exists():
        raise ExportError(f"{model_root / str(version)} exists and is never overwritten; the next free version is "
                          f"{next_version(model_root)} (--version {next_version(model_root)}, or leave it out)")
    made_root = not Path(root).exists()
    try:
        model_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create {model_root}: {exc.strerror or first_line(exc)}") from None
    clean_stale_staging(model_root)
    options: dict[str, Any] = {"quantize": quantize, "representative": representative}
    if select_tf_ops:
        options["select_tf_ops"] = True
    # Written beside the target, then renamed: readers and TF Serving see a whole version or none.
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.partial-{socket.gethostname()}-{os.getpid()}-",
                                    dir=model_root))

    def discard() -> None:
        """Remove the staging folder, and the folders a first export made, if nothing else is in them."""
        shutil.rmtree(staging, ignore_errors=True)
        if model_root.is_dir() and not any(model_root.iterdir()):
            model_root.rmdir()
            if made_root and not any(Path(root).iterdir()):
                Path(root).rmdir()

    with cleaned_up(discard):
        try:
            written = FORMATS[format].write(servable, staging, **options)
        except ExportError:
            raise
        except Exception as exc:
            if _no_space(exc):
                raise ExportError(f"no space left on the device while writing {model_root}: free some and export "
                                  f"again (nothing was kept)") from None
            raise ExportError(f"writing the {format} export failed ({type(exc).__name__}: {first_line(exc)}); "
                              f"nothing was kept") from None
        try:
            runner = FORMATS[format].load(staging)
        except ModelError as exc:
            if not written.get("flex_ops"):
                raise ExportError(f"the {format} export does not load back: {exc}; nothing was kept") from None
            runner = None  # asked for Select TF ops, which the installed interpreter cannot run: kept unchecked
        concrete = servable.function.get_concrete_function()
        meta = {
            "name": name, "format": format, "signature": runner.signature if runner else SIGNATURE,
            "inputs": {s.name: {"dtype": s.dtype, "shape": list(s.shape)} for s in runner.inputs} if runner else {
                s.name: {"dtype": s.dtype.name, "shape": s.shape.as_list()} for s in servable.input_signature},
            "outputs": list(runner.outputs) if runner else sorted(concrete.structured_outputs),
            "classifier": checks[0].classifier if checks else None,
            "tfperf": __version__, "tensorflow": tf.__version__, **written, **dict(metadata or {}),
        }
        if checks and runner is not None:
            with exact_float32():
                meta["agreement"] = compare_with_model(runner, checks, quantized=quantize != "none")
        elif checks:
            meta["agreement"] = {"not_checked": f"the installed LiteRT interpreter cannot run Flex ops "
                                                f"{', '.join(written['flex_ops'])}"}
        if checks:  # what a server checks a new version against before it swaps it in (tfperf serve)
            (staging / CHECK_FILE).write_bytes(check_bytes(checks))
        for _ in range(1000):
            final = model_root / str(version)
            meta["version"] = version
            try:
                (staging / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
                _sync_tree(staging)  # on disk before the rename publishes it: a crash shows a whole version or none
                check_stop()  # a SIGTERM whose exception Python swallowed (in a GC callback) still stops it here
                os.rename(staging, final)  # fails if a concurrent export took this version meanwhile
                _sync_dir(model_root)
                break
            except OSError as exc:
                if _no_space(exc):
                    raise ExportError(f"no space left on the device while writing {model_root}: free some and "
                                      f"export again (nothing was kept)") from None
                if asked or not final.exists():
                    raise ExportError(f"{final} appeared while exporting; the next free version is "
                                      f"{next_version(model_root)}") from None
                version = next_version(model_root)  # another export took it: take the next free one
    return Exported(final, meta)


def load(path: Path | str, threads: int | None = None, signature: str | None = None) -> Runner:
    """An export loaded in its format's runtime (no tfperf model code needed); ModelError if unusable.

    Args:
      threads: the runtime's threads for one call (LiteRT, ONNX Runtime); None leaves its default.
      signature: the SavedModel or LiteRT signature to serve (default serving_default, serve, or the only one).
    """
    path = check_model_dir(path)
    fmt = format_of(path)
    fmt.require()
    return fmt.load(path, threads=threads, signature=signature)


def predict(runner: Runner, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a loaded export on inputs by name, each checked against its spec; outputs as NumPy arrays by name."""
    fitted = fit_inputs(arrays, [(s.name, s.dtype, s.shape[1:]) for s in runner.inputs],
                        f"the input for {runner.format} signature {runner.signature!r}")
    try:
        return {k: np.asarray(v) for k, v in runner(fitted).items()}
    except Exception as exc:  # the runtime's own error types: the model cannot compute on these inputs
        raise ModelError(f"the {runner.format} model failed on the input ({type(exc).__name__}: "
                         f"{first_line(exc)})") from None


def check_bytes(checks: Sequence[Check]) -> bytes:
    """The checks as an .npz: `<k>/inputs/<name>` and `<k>/outputs/<name>` for the k-th set of check rows."""
    arrays = {}
    for k, check in enumerate(checks):
        arrays.update({f"{k}/inputs/{n}": a for n, a in check.inputs.items()})
        arrays.update({f"{k}/outputs/{n}": a for n, a in check.reference.items()})
    return npz_bytes(arrays)


def read_checks(path: Path | str) -> list[Check]:
    """The check rows an export was written with (its check.npz), [] when it has none (an export made
    elsewhere); ModelError when the file is there but unreadable."""
    from tfperf.deploy.errors import InputError

    path = Path(path) / CHECK_FILE
    if not path.is_file():
        return []
    try:
        arrays = read_arrays(path)
    except InputError as exc:
        raise ModelError(str(exc)) from None
    found: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for key, array in arrays.items():
        k, _, rest = key.partition("/")
        kind, _, name = rest.partition("/")
        found.setdefault(k, {"inputs": {}, "outputs": {}}).setdefault(kind, {})[name] = array
    return [Check(v["inputs"], v["outputs"], "the export's own check rows") for _, v in sorted(found.items())
            if v.get("inputs") and v.get("outputs")]


CHECK_ROWS, CALIBRATION_ROWS = 16, 256  # rows an export is checked on; rows int8 quantization calibrates on


def export_subject(subject, root: Path | str = "saved_models", *, name: str | None = None, version: int | None = None,
                   format: str = "savedmodel", quantize: str = "none", sample: Mapping[str, np.ndarray] | None = None,
                   calibration: tuple[Mapping[str, np.ndarray], str] | None = None, select_tf_ops: bool = False,
                   seed: int = 0, metadata: Mapping[str, Any] | None = None) -> Exported:
    """Export a loaded model (`tfperf.deploy.loader.Subject`), checked on rows of `sample` or on synthetic
    inputs, and at a second size where the model leaves one free (exports keep such axes free); int8
    calibrates on `calibration` (rows by input name, and where they came from), else on the sample, else on
    synthetic inputs (said so in the metadata: real rows calibrate better). A LiteRT conversion that fails
    with sizes free is made again at the sizes the inputs are made at, and says so in the metadata."""
    from tfperf.deploy.inputs import check_runs, make_inputs, sample_inputs

    check_options(format, quantize, select_tf_ops, representative=True)

    def attempt(subject, fixed: Mapping[str, Any]) -> Exported:
        if sample is not None:
            checked = [({n: a[:CHECK_ROWS] for n, a in sample_inputs(subject, sample).items()}, "the sample")]
        else:
            checked = [(make_inputs(subject, CHECK_ROWS, seed=seed), "synthetic inputs")]
        if subject.free and all(i.dtype != "string" for i in subject.inputs):
            size = other_size(subject)  # an axis left free stays free: the export must answer at another size
            checked.append((make_inputs(subject.at(size), CHECK_ROWS, seed=seed + 2),
                            f"synthetic inputs {size} long where the model leaves sizes free"))
        with exact_float32():  # the reference is float32 itself, not TF32 (Ampere GPUs' default)
            checks = [Check(inputs, check_runs(subject, inputs), source, subject.classifier)
                      for inputs, source in checked]
        representative, calibrated_on = None, None
        if quantize == "int8":
            if calibration is not None:
                representative, calibrated_on = calibration
            elif sample is not None:
                representative = {n: a[:CALIBRATION_ROWS] for n, a in sample_inputs(subject, sample).items()}
                calibrated_on = f"{len(next(iter(representative.values())))} rows of the sample"
            else:
                representative = make_inputs(subject, CALIBRATION_ROWS // 4, seed=seed + 1)
                calibrated_on = "synthetic inputs: pass --sample FILE.npz of real inputs for ranges that fit your data"
        described = {"model": subject.source, **({"source_signature": subject.signature} if subject.signature else {}),
                     **({"calibrated_on": calibrated_on} if calibrated_on else {}), **dict(fixed),
                     **dict(metadata or {})}
        if constant(checks[0].reference):
            described["probe"] = probe_check(subject, checks[0].inputs, format, quantize, representative)
        return export(subject.servable(), root, name=name or subject.name, version=version, format=format,
                      quantize=quantize, representative=representative, select_tf_ops=select_tf_ops,
                      checks=checks, metadata=described)

    try:
        return attempt(subject, {})
    except ExportError as exc:
        if format != "litert" or not subject.free or "LiteRT" not in str(exc):
            raise
        # LiteRT resizes inputs per call, but its converter lowers some ops (a slice that adds an axis, say)
        # only at known sizes: then the model is exported at the sizes its inputs are made at, and says so.
        sizes = {i.name: list(i.shape) for i in subject.inputs if i.free}
        return attempt(subject.fixed(), {"fixed_sizes": sizes, "why_fixed": f"with sizes free: {exc}"})


def varying_layer(model, inputs: Mapping[str, np.ndarray], last: int = 80):
    """The name and sub-model (the model's inputs to that layer's output, scaled so that its largest value on
    `inputs` is 1) of the last of a functional Keras model's layers whose output moves across the rows of
    `inputs` by a thousandth of its own size, or None: where an export of a model whose outputs do not vary
    can still be checked (scaled, a difference is judged against what the layer itself holds, however small
    its values: dead ReLUs leave MobileNetV2's late activations near 1e-6)."""
    import keras

    if not isinstance(model, keras.Model) or not getattr(model, "inputs", None):
        return None
    packed = [inputs[t.name] for t in model.inputs] if all(t.name in inputs for t in model.inputs) else None
    if packed is None:
        return None
    for layer in reversed(model.layers[-last:]):
        if isinstance(layer, keras.layers.InputLayer):
            continue
        try:
            probe = keras.Model(model.inputs, layer.output, name=f"{model.name}_to_{layer.name}")
            answer = np.asarray(probe(packed if len(packed) > 1 else packed[0], training=False))
        except Exception:  # noqa: BLE001  (a layer used twice, or inside a nested model: not a single output)
            continue
        size = float(np.max(np.abs(answer))) if answer.dtype.kind == "f" and answer.size else 0.0
        if size > 0 and len(answer) > 1 and float(np.max(np.ptp(answer, axis=0))) >= VARIES * size:
            # Named apart from the model's own layers: Keras names a new Rescaling "rescaling", which
            # EfficientNet already has, and a model may not hold two layers of one name.
            taken, scale = {one.name for one in model.layers}, "tfperf_probe_scale"
            while scale in taken:
                scale += "_"
            return layer.name, keras.Model(model.inputs,
                                           keras.layers.Rescaling(1.0 / size, name=scale)(layer.output),
                                           name=f"{model.name}_to_{layer.name}")
    return None


def probe_check(subject, inputs: Mapping[str, np.ndarray], format: str, quantize: str, representative) -> dict:
    """When the model's outputs do not vary, the export's conversion checked where they still do: the same
    format made of the model up to its last varying layer, exported and checked as any export (in a folder
    of its own, removed after). ExportError when it disagrees; else what it found, or that nothing varies."""
    from tfperf.deploy.loader import keras_subject

    found = varying_layer(subject.model, inputs) if subject.model is not None else None
    if found is None:
        return {"layer": None, "why": f"{NOT_EVIDENCE}, and no layer's output varies on them either"}
    layer, probe = found
    with tempfile.TemporaryDirectory(prefix=".probe-") as scratch:
        try:
            checked = export_subject(keras_subject(probe, f"{subject.source} up to {layer}", factory=None), scratch,
                                     name="probe", format=format, quantize=quantize,
                                     calibration=(representative, "the export's own rows") if representative else None)
        except ExportError as exc:
            raise ExportError(f"its outputs do not vary, and up to layer {layer!r}, the last whose output does, the "
                              f"{format} export disagrees with the model: {exc}") from None
    return {"layer": layer, "agreement": checked.metadata.get("agreement")}


def other_size(subject) -> int:
    """A second size for the axes a model leaves free, other than the one its inputs are made at (half of
    it, plus one: odd where the first is even, as a real request's length would be)."""
    sizes = [s for i in subject.inputs for s, d in zip(i.shape, i.declared) if d is None]
    return max(1, min(sizes) // 2 + 1)


def describe_check(meta: Mapping[str, Any]) -> list[str]:
    """What an export's check found, a line per output (and the top class, for classifiers)."""
    found = meta.get("agreement")
    if not found:
        return []
    if "not_checked" in found:
        return [f"not checked against the model: {found['not_checked']}"]
    lines = [f"checked against the model on {found['on']}:"]
    for name, a in found["outputs"].items():
        lines.append(f"  {name}: largest difference {number(a['max_abs_diff'], 2)} "
                     f"({number(a['relative'], 2)} of its scale; "
                     f"float32 exports must stay within {found['tolerance']:g})")
    if "top_class_agreement" in found:
        lines.append(f"  top class the same as the model's on {found['top_class_agreement']:.0%} of rows")
    if found.get("constant"):
        lines.append(f"  {found['constant']}")
        probe = meta.get("probe") or {}
        if probe.get("layer"):
            worst = max((probe.get("agreement") or {}).get("outputs", {}).values(),
                        key=lambda a: a["relative"], default=None)
            lines.append(f"  checked instead up to layer {probe['layer']!r}, the last whose output varies: largest "
                         f"difference {number(worst['relative'], 2)} of that layer's largest value"
                         if worst else f"  checked instead up to layer {probe['layer']!r}")
        elif probe:
            lines.append(f"  {probe['why']}")
    if meta.get("fixed_sizes"):
        sizes = "; ".join(f"{n} {shape}" for n, shape in meta["fixed_sizes"].items())
        lines.append(f"sizes fixed at {sizes}: requests must be padded to them (the converter failed {meta['why_fixed']})")
    return lines
