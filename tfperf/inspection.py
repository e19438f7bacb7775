"""Look inside a SavedModel without running it: signatures, ops, variable sizes, and risky ops.

A SavedModel is a program. Ops that read or write files, run Python, or write outside the
computation are flagged when a signature or a restored function can reach them; the checkpoint
ops of the model's own saver (SaveV2, RestoreV2, ...) are in every SavedModel and are only
flagged if something other than the saver reaches them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from tfperf.serving import check_model_dir

RISKY_OPS: dict[str, str] = {
    **{op: "runs Python code" for op in ("PyFunc", "PyFuncStateless", "EagerPyFunc")},
    **{op: "touches the file system" for op in (
        "ReadFile", "WriteFile", "MatchingFiles", "FileExists", "DeleteFile", "ImmutableConst",
        "Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2", "RestoreSlice", "MergeV2Checkpoints",
        "TextLineDataset", "TFRecordDataset", "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2",
        "TextLineReader", "TextLineReaderV2", "TFRecordReader", "TFRecordReaderV2", "WholeFileReader",
        "WholeFileReaderV2", "SaveDataset", "SaveDatasetV2", "LoadDataset", "SnapshotDataset",
        "SnapshotDatasetV2", "CreateSummaryFileWriter", "CreateSummaryDbWriter", "WriteAudioSummary",
        "WriteGraphSummary", "WriteHistogramSummary", "WriteImageSummary", "WriteRawProtoSummary",
        "WriteScalarSummary", "WriteSummary", "DebugIdentity", "DebugIdentityV2", "DebugIdentityV3")},
    **{op: "writes outside the computation (log, stream or file)" for op in ("Print", "PrintV2")},
}


@dataclasses.dataclass(frozen=True)
class Report:
    """What a SavedModel holds, read from its files without executing it."""

    path: str
    signatures: dict[str, dict[str, dict[str, dict[str, str]]]]
    op_types: tuple[str, ...]
    variable_count: int
    variable_bytes: int
    flagged: dict[str, str]  # op type -> why it is risky, for ops the model's own code can reach

    @property
    def safe(self) -> bool:
        """True when no reachable op acts outside the computation."""
        return not self.flagged


def _tensor_info(info) -> dict[str, str]:
    import tensorflow as tf

    dims = "unknown" if info.tensor_shape.unknown_rank else \
        "[" + ", ".join("None" if d.size < 0 else str(d.size) for d in info.tensor_shape.dim) + "]"
    return {"dtype": tf.dtypes.as_dtype(info.dtype).name, "shape": dims}


def _called_functions(node) -> Iterable[str]:
    # PartitionedCall's `f`, While's `body`/`cond`, If's branches, dataset map `f`s, ...
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        for f in value.list.func:
            yield f.name


def _reachable_ops(graph_def, roots: Iterable, library: dict) -> set[str]:
    ops, seen, stack = set(), set(), [list(roots)]
    while stack:
        for node in stack.pop():
            ops.add(node.op)
            for name in [node.op, *_called_functions(node)]:
                if name in library and name not in seen:
                    seen.add(name)
                    stack.append(list(library[name].node_def))
    return ops


def _saver_nodes(meta) -> set[str]:
    saver = meta.saver_def
    return {t.split(":")[0].lstrip("^") for t in (saver.filename_tensor_name, saver.save_tensor_name,
                                                  saver.restore_op_name) if t}


def _variables(path: Path) -> tuple[int, int]:
    import numpy as np
    import tensorflow as tf

    index = path / "variables" / "variables.index"
    if not index.exists():
        return 0, 0
    reader = tf.train.load_checkpoint(str(path / "variables" / "variables"))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    names = [n for n in shapes if not n.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")]
    size = sum(int(np.prod(shapes[n])) * dtypes[n].size for n in names)
    return len(names), size


def inspect_saved_model(path: Path | str) -> Report:
    """Read a SavedModel's protobuf and variable index; nothing in it is loaded for execution."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    from tfperf.serving import ModelError

    path = check_model_dir(path)
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString((path / "saved_model.pb").read_bytes())
    except DecodeError:
        raise ModelError(f"{path}/saved_model.pb is corrupt: it does not parse as a SavedModel") from None
    if not proto.meta_graphs:
        raise ModelError(f"{path}/saved_model.pb holds no MetaGraph")
    signatures, all_ops, flagged = {}, set(), {}
    for meta in proto.meta_graphs:
        graph = meta.graph_def
        library = {f.signature.name: f for f in graph.library.function}
        all_ops |= {n.op for n in graph.node} | {n.op for f in library.values() for n in f.node_def}
        for key, sig in meta.signature_def.items():
            if key.startswith("__"):
                continue
            signatures[key] = {"inputs": {k: _tensor_info(v) for k, v in sig.inputs.items()},
                               "outputs": {k: _tensor_info(v) for k, v in sig.outputs.items()}}
        # Roots: every graph node but the saver's, and every function the object graph can restore
        # as a callable (loaded.some_function(...)); the saver's own functions are reached only through it.
        saver = _saver_nodes(meta)
        roots = [n for n in graph.node if n.name not in saver]
        restorable = {fn for fn in meta.object_graph_def.concrete_functions}
        roots += [node for name in restorable if name in library for node in library[name].node_def]
        for op in _reachable_ops(graph, roots, library):
            if op in RISKY_OPS:
                flagged[op] = RISKY_OPS[op]
    count, size = _variables(path)
    return Report(str(path), signatures, tuple(sorted(all_ops)), count, size, dict(sorted(flagged.items())))


def format_report(report: Report) -> str:
    """The report as text for the terminal."""
    lines = [f"SavedModel {report.path}"]
    for key, sig in report.signatures.items():
        lines.append(f"  signature {key!r}:")
        for direction in ("inputs", "outputs"):
            for name, info in sig[direction].items():
                lines.append(f"    {direction[:-1]:<6} {name}: {info['dtype']}{info['shape']}")
    lines.append(f"  variables: {report.variable_count} holding {report.variable_bytes:,} bytes")
    lines.append(f"  op types ({len(report.op_types)}): {', '.join(report.op_types)}")
    if report.flagged:
        lines.append("  RISKY: ops reachable from the model's own functions that act outside the computation:")
        lines += [f"    {op}: {why}" for op, why in report.flagged.items()]
    else:
        lines.append("  no risky ops: nothing reachable reads or writes files or runs Python")
    return "\n".join(lines)
