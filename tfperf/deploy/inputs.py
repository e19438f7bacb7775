"""Inputs for any model: arrays read safely from .npy and .npz files, fitted to the model's inputs, or
synthetic ones that respect what the model declares; and its outputs by name."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from tfperf.deploy.errors import InputError, first_line, listed
from tfperf.deploy.loader import Subject

TARGETS = "y"  # the array of a sample file that holds training targets, not an input
_FIX = "save arrays with numpy.save (.npy) or numpy.savez (.npz, one array per input, named after it)"


def input_limit() -> int:
    """How many bytes of arrays an input file may hold by default: half the memory available now (8 GB where
    the OS does not say), so that a file which inflates to more is refused before it is read."""
    from tfperf.flags import available_memory

    free = available_memory()
    return free // 2 if free else 8 * 2**30


def _checked_header(f: IO[bytes], size: int, where: str) -> int:
    """Read a .npy header and refuse, before anything is allocated, arrays that hold Python objects
    (pickles, which could run code) or claim more bytes than the file holds (truncated or forged); the
    array's bytes."""
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    except Exception as exc:  # noqa: BLE001  (a forged header can raise ValueError, SyntaxError, tokenize.TokenError ...)
        raise InputError(f"cannot read {where} as a .npy array ({type(exc).__name__}: {first_line(exc)}); "
                         f"{_FIX}") from None
    if dtype.hasobject:
        raise InputError(f"{where} holds Python objects (pickled), which could run code when read; {_FIX} on a "
                         f"numeric array")
    needed = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    held = size - f.tell()
    if needed > held:
        raise InputError(f"{where}: its header claims shape {list(shape)} of {dtype} ({needed:,} bytes), but the "
                         f"file holds {held:,} bytes after the header; it is truncated or forged: {_FIX}")
    return needed


def read_arrays(path: Path | str, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of a .npz file by name, or of a .npy file under the name '' (any one input), each header
    checked against the bytes it holds before it is read, and all of them against `max_bytes` (default
    `input_limit()`): an .npz of a few MB that inflates to gigabytes is refused before it inflates (its
    members' real sizes are held to the sizes they declare as they are read: zipfile checks both).
    InputError says what is wrong."""
    path = Path(path)
    limit = max_bytes if max_bytes is not None else input_limit()
    if not path.is_file():
        raise InputError(f"no such input file: {path}")
    try:
        if zipfile.is_zipfile(path):
            total = 0
            with zipfile.ZipFile(path) as archive:
                for member in archive.infolist():
                    with archive.open(member) as f:
                        total += _checked_header(f, member.file_size, f"{path}:{member.filename}")
            _within(total, limit, path, max_bytes is None)
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        with path.open("rb") as f:
            _within(_checked_header(f, path.stat().st_size, str(path)), limit, path, max_bytes is None)
        return {"": np.load(path, allow_pickle=False)}
    except InputError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError) as exc:
        raise InputError(f"cannot read {path} as NumPy arrays ({first_line(exc)}); {_FIX}") from None


def npz_bytes(arrays: dict) -> bytes:
    """Arrays as an .npz file (np.load reads it) with every array under its own name. np.savez(file, **arrays)
    cannot: a name such as `file` or `allow_pickle` collides with its own parameters."""
    bad = [k for k in arrays if not k or not k.isprintable() or k.startswith("/") or ".." in k.split("/")]
    if bad:
        raise InputError(f"the export names outputs {listed(map(repr, bad))}, which cannot be array names in a "
                         f".npz file: write one output with --output FILE.npy")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)
    with np.load(io.BytesIO(buf.getvalue()), allow_pickle=False) as back:  # every output reads back by its name
        if sorted(back.files) != sorted(arrays):
            raise InputError(f"the outputs {sorted(arrays)} do not read back from .npz by name: write one with "
                             f"--output FILE.npy")
    return buf.getvalue()


def _within(needed: int, limit: int, path: Path, default: bool) -> None:
    if needed > limit:
        why = "half the memory this process can still take" if default else "--max-input-size"
        raise InputError(f"{path} holds {needed / 2**20:,.0f} MB of arrays once read, more than the "
                         f"{limit / 2**20:,.0f} MB allowed ({why}): split the input" +
                         (", or pass --max-input-size to allow more" if default else ""))


def fit_inputs(arrays: Mapping[str, np.ndarray], specs: Sequence[tuple[str, str, Sequence[int | None]]],
               where: str = "the input") -> dict[str, np.ndarray]:
    """The arrays fitted to the inputs (name, dtype, shape without the batch axis, None for any size): one
    per input by name (a lone array for a one-input model), numbers converted to the input's dtype, every
    shape checked; InputError naming what the model takes otherwise."""
    names = [name for name, _, _ in specs]
    given = {k: v for k, v in arrays.items() if k != TARGETS}
    takes = "; ".join(f"{n}: {d}[N, {', '.join('?' if s is None else str(s) for s in shape)}]".replace(", ]", "]")
                      for n, d, shape in specs)
    if len(names) == 1 and names[0] not in given and len(given) == 1:
        given = {names[0]: next(iter(given.values()))}
    missing = [n for n in names if n not in given]
    if missing:
        held = listed(sorted(k or "one unnamed array" for k in given)) or "nothing"
        raise InputError(f"{where} lacks {listed(missing)} (it holds {held}); the model takes {takes}")
    fitted = {}
    for name, dtype, shape in specs:
        a = np.asarray(given[name])
        want_kind = "U" if dtype == "string" else np.dtype(dtype).kind
        if a.ndim != len(shape) + 1 or any(s is not None and s != d for s, d in zip(shape, a.shape[1:])):
            raise InputError(f"{where}: {name!r} has shape {list(a.shape)}; the model takes {takes}")
        if len(a) == 0:
            raise InputError(f"{where}: {name!r} has no rows; the model takes {takes}")
        if (want_kind in "US") != (a.dtype.kind in "US") or a.dtype.kind not in "biufUS":
            raise InputError(f"{where}: {name!r} holds {a.dtype}, the model takes {takes}")
        if want_kind in "iub" and a.dtype.kind == "f":
            raise InputError(f"{where}: {name!r} holds floats where the model takes {dtype} (token ids or flags): "
                             f"save it as integers")
        fitted[name] = a if want_kind in "US" else np.ascontiguousarray(a, dtype=dtype)
    if len({len(a) for a in fitted.values()}) > 1:
        raise InputError(f"{where}: the inputs have different numbers of rows "
                         f"({', '.join(f'{n}: {len(a)}' for n, a in fitted.items())})")
    return fitted


def read_sample(path: Path | str, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Arrays from a sample file: inputs by name (or one array for a one-input model), optionally `y`, targets."""
    return read_arrays(path, max_bytes)


def sample_inputs(subject: Subject, sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The sample's arrays for each input, checked against the input's shape and dtype."""
    return fit_inputs(sample, [(i.name, i.dtype, i.declared) for i in subject.inputs], "the sample")


# What an integer or boolean input of a Transformer holds, by its name: KerasHub's token_ids, padding_mask and
# segment_ids, Hugging Face's input_ids, attention_mask and token_type_ids. Anything else is "values".
ROLES = (("mask", "mask"), ("segment", "segments"), ("token_type", "segments"), ("type_ids", "segments"))
PAD = 0  # what padding holds: a padding mask's "masked", a tokenizer's pad id, segment 0


def input_roles(subject: Subject) -> dict[str, str]:
    """Each input's role in synthetic rows: 'mask' (1 where a token is, 0 where padding is), 'segments' (0),
    'tokens' (integers below the token vocabulary) or 'values' (floats, or booleans)."""
    roles = {}
    for spec in subject.inputs:
        kind = np.dtype(spec.dtype).kind if spec.dtype != "string" else "U"
        named = next((role for word, role in ROLES if word in spec.name.lower()), None)
        roles[spec.name] = named if named and kind in "iub" else "tokens" if kind in "iu" else "values"
    return roles


def token_vocabulary(subject: Subject) -> int:
    """The vocabulary token ids stay below: the smallest embedding larger than a segment embedding (2 in BERT),
    else the smallest there is, else 2."""
    larger = [v for v in subject.vocabularies if v > 2]
    return min(larger) if larger else (subject.vocabulary or 2)


def make_inputs(subject: Subject, batch: int, *, seed: int = 0, sample: Mapping[str, np.ndarray] | None = None,
                lengths: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """`batch` rows for every input, by name: rows of the sample repeated, or synthetic values that respect
    the model's dtypes, vocabulary and masking (`input_roles`): each row holds tokens up to its length and
    padding after it, where the model masks (a mask input, or an embedding that masks 0); `lengths` gives the
    rows' lengths (default: random, where the model masks)."""
    if sample is not None:
        arrays = sample_inputs(subject, sample)
        rows = np.resize(np.arange(len(next(iter(arrays.values())))), batch)
        return {n: a[rows] for n, a in arrays.items()}
    rng = np.random.default_rng(seed)
    roles = input_roles(subject)
    masks = "mask" in roles.values() or subject.mask_zero
    longest = max((spec.shape[0] for spec in subject.inputs if len(spec.shape) >= 1), default=1)
    # One length per row for every input (a row's tokens and its mask must end at the same place).
    drawn = np.asarray(lengths if lengths is not None else rng.integers(1, longest + 1, size=batch))
    found = {}
    for spec in subject.inputs:
        shape = (batch, *spec.shape)
        kind = np.dtype(spec.dtype).kind if spec.dtype != "string" else "U"
        if kind in "US":
            raise InputError(f"input {spec.name!r} takes strings, which tfperf cannot invent: pass real inputs "
                             f"with --sample FILE.npz (an array named {spec.name!r})")
        sequence = len(spec.shape) >= 1 and spec.shape[0] > 1
        if sequence and (masks or lengths is not None):
            padding = np.arange(spec.shape[0])[None, :] >= np.minimum(drawn, spec.shape[0])[:, None]
            padding = padding.reshape(batch, spec.shape[0], *[1] * (len(spec.shape) - 1))
        else:
            padding = np.zeros(shape, bool)
        role = roles[spec.name]
        if role == "mask":
            values = np.broadcast_to(~padding, shape).copy()
        elif role == "segments":
            values = np.zeros(shape, spec.dtype)
        elif kind == "b":
            values = rng.random(shape) < 0.5
        elif kind in "iu":
            high = token_vocabulary(subject)
            low = 1 if masks and high > 1 else 0
            values = np.where(padding, PAD, rng.integers(low, high, size=shape))
        else:
            values = np.where(padding & masks, 0.0, rng.normal(size=shape))
        found[spec.name] = np.asarray(values).astype(spec.dtype)
    return found


def to_tensors(flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The arrays as TensorFlow constants (what a served model receives)."""
    import tensorflow as tf

    return {k: tf.constant(v) for k, v in flat.items()}


def to_numpy(outputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Outputs by name as NumPy arrays."""
    return {k: np.asarray(v) for k, v in outputs.items()}


def check_runs(subject: Subject, flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs by name on these inputs; InputError saying what to do when it fails on them."""
    try:
        return to_numpy(subject.named(to_tensors(flat)))
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"the model fails on these inputs ({type(exc).__name__}: {first_line(exc)}): pass real "
                         f"inputs with --sample FILE.npz, or --input-shape if a size is wrong") from None


def non_finite(arrays: Mapping[str, np.ndarray]) -> int:
    """How many values of numeric arrays are NaN or infinite."""
    return sum(int(a.size - np.count_nonzero(np.isfinite(a))) for a in arrays.values() if a.dtype.kind in "fc")
