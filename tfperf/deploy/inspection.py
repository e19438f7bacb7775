"""Look inside an export without running it: signatures, ops, weight sizes, and ops not allowed.

A SavedModel is a program. Whether it is safe to load is decided by an allowlist: every op type that
a signature or a restored function can reach must be on ALLOWED_OPS, the ops that compute on tensors
in memory. Anything else (file readers and writers, dataset readers, lookup tables filled from files,
summary writers, Python callbacks, printing, and any op type this list has not reviewed) is
reported with the reason and makes the model unsafe.

Loading runs more than the signatures: the saver's restore op (TensorFlow runs it to read the
variables), the init and main ops, table initializers. Each entry point is judged by what it may do:
the restore op may only read the checkpoint it is handed (RestoreV2 of the loader's own file name,
never of a path written into the model), the save op may also write the checkpoint it is handed, and
every other op of the graph, the init ops among them, is held to the allowlist. Files are part of the
model too: an asset whose name leads outside the model's folder (an absolute path, `..`, a link) would
be read by TensorFlow and copied into every re-export, so it is unsafe, and refused even when trusted.

The allowlist and how it was chosen: `tfperf.deploy.allowlist`.

LiteRT and ONNX files are read the same way, from their flatbuffer and protobuf. Their builtin
operators and the standard ONNX domains compute in memory; what is judged is what escapes them: a
LiteRT Flex op runs a TensorFlow op (FlexWriteFile writes files), so its TensorFlow op is checked
against the same allowlist, and a custom LiteRT op or an op from a non-standard ONNX domain runs code
the runtime must be handed from elsewhere, so it is reported as not reviewed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from tfperf.deploy.allowlist import ALLOWED_OPS, NOT_REVIEWED, RESTORE_OPS, SAVE_OPS, why_not_allowed
from tfperf.deploy.formats import check_model_dir, format_of
from tfperf.deploy.errors import ModelError, first_line, listed




@dataclasses.dataclass(frozen=True)
class Report:
    """What an export holds, read from its files without executing it."""

    path: str
    signatures: dict[str, dict[str, dict[str, dict[str, str]]]]
    op_types: tuple[str, ...]
    variable_count: int  # weights: variables of a SavedModel, constant buffers or initializers of a file
    variable_bytes: int
    flagged: dict[str, str]  # op type -> why it is not allowed, for ops the model's own code can reach
    format: str = "savedmodel"
    file_bytes: int = 0  # the export's files on disk
    escapes: dict[str, str] = dataclasses.field(default_factory=dict)  # files it would read from outside its folder

    @property
    def safe(self) -> bool:
        """True when every reachable op is on the allowlist."""
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


_CALLS = ("PartitionedCall", "StatefulPartitionedCall")  # calls whose inputs are their function's arguments, in order


def _producer(name: str) -> str:
    """The node that an input string names: `node`, `node:1`, `^node` (graph) or `node:output:0` (function)."""
    return name.lstrip("^").split(":")[0]


def _upstream(nodes: dict, starts: Iterable[str]) -> set[str]:
    """The names of `starts` and of every graph node they take an input or a control dependency from."""
    seen, stack = set(), [_producer(s) for s in starts if s]
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        stack += [_producer(i) for i in nodes[name].input]
    return seen


def _judge(roots: Iterable, library: dict, allowed: frozenset[str], flagged: dict[str, str], context: str = "",
           prefix_ok: object = None) -> None:
    """Flag every op that `roots` (graph nodes) reach, through the functions they call, that is not in `allowed`.

    `prefix_ok(node, bindings)` says whether a checkpoint op reads the file name it is handed; `bindings`
    maps a function's arguments to what its caller passed (graph node names), so that a restore op inside
    a function is traced to the graph's own file name tensor.
    """
    stack, seen = [(list(roots), {}, None)], set()
    while stack:
        nodes, bindings, body = stack.pop()
        local = {n.name: n for n in nodes}
        for node in nodes:
            why = None if node.op in allowed else (why_not_allowed(node.op) or "not allowed here")
            if why:
                flagged.setdefault(node.op, f"{why} ({context})" if context else why)
            elif prefix_ok is not None and node.op in RESTORE_OPS and not prefix_ok(node, bindings, local, body):
                flagged.setdefault(f"{node.op} {node.name}", f"reads a checkpoint named inside the model, not the "
                                                             f"variables the loader hands it ({context})")
            for name in [node.op, *_called_functions(node)]:
                if name not in library or (name, context) in seen:
                    continue
                seen.add((name, context))
                fn = library[name]
                args = [a.name for a in fn.signature.input_arg]
                passed = {}
                if node.op in _CALLS and name != node.op:
                    passed = {a: bindings.get(_producer(i), _producer(i)) for a, i in zip(args, node.input)}
                stack.append((list(fn.node_def), passed, fn))


def _reads_handed_file(filename_node: str):
    """A check that a restore op's file prefix is the saver's file name tensor (through Identity and calls)."""

    def check(node, bindings: dict, local: dict, body) -> bool:
        source = _producer(node.input[0]) if node.input else ""
        while source in local and local[source].op in ("Identity", "Snapshot") and local[source].input:
            source = _producer(local[source].input[0])
        if body is not None and source in {a.name for a in body.signature.input_arg}:
            source = bindings.get(source, "")
        return source == filename_node

    return check


def _load_time_roots(meta) -> list[str]:
    """The graph nodes TensorFlow runs while loading besides the restore op: init, main and table init ops."""
    names = [sig.outputs[k].name for key, sig in meta.signature_def.items() if key == "__saved_model_init_op"
             for k in sig.outputs]
    for key in ("saved_model_main_op", "legacy_init_op", "saved_model_init_op", "table_initializer", "init_op"):
        if key in meta.collection_def:
            names += list(meta.collection_def[key].node_list.value)
    return names


def _asset_names(meta) -> list[str]:
    """The file names a MetaGraph's assets give (TF2 `asset_file_def`, TF1 collection `saved_model_assets`)."""
    from tensorflow.core.protobuf import meta_graph_pb2

    names = [a.filename for a in meta.asset_file_def]
    if "saved_model_assets" in meta.collection_def:
        for item in meta.collection_def["saved_model_assets"].any_list.value:
            asset = meta_graph_pb2.AssetFileDef()
            if item.Unpack(asset):
                names.append(asset.filename)
    return names


def escapes(folder: Path, assets: Iterable[str] = ()) -> dict[str, str]:
    """Files a model would read from outside its folder: assets named by an absolute path or `..`, and links."""
    import os

    root = folder.resolve()
    found = {}
    for name in assets:
        target = Path(os.path.normpath(folder / "assets" / name)) if "\0" not in name else None
        if target is None or not target.resolve().is_relative_to(root):
            found[f"asset {name}"] = (f"names {target.resolve() if target else repr(name)}, outside the model's folder: "
                                      f"loading would read it and an export would copy it")
    for parent, dirs, files in os.walk(folder):
        for entry in [*dirs, *files]:
            path = Path(parent) / entry
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                found[f"link {path.relative_to(folder)}"] = (f"points to {path.resolve()}, outside the model's folder: "
                                                             f"a loader would read that file")
    return found


def _variables(path: Path) -> tuple[int, int]:
    import numpy as np
    import tensorflow as tf

    index = path / "variables" / "variables.index"
    if not index.exists():
        return 0, 0
    try:
        reader = tf.train.load_checkpoint(str(path / "variables" / "variables"))
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError) as exc:
        raise ModelError(f"{index} is corrupt: it does not read as a checkpoint index ({first_line(exc)})") from None
    names = [n for n in shapes if not n.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")]
    size = sum(int(np.prod(shapes[n])) * dtypes[n].size for n in names)
    return len(names), size


def inspect_saved_model(path: Path | str) -> Report:
    """Read a SavedModel's protobuf and variable index; nothing in it is loaded for execution."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    from tfperf.deploy.errors import ModelError

    path = check_model_dir(path)
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString((path / "saved_model.pb").read_bytes())
    except DecodeError:
        raise ModelError(f"{path}/saved_model.pb is corrupt: it does not parse as a SavedModel") from None
    if not proto.meta_graphs:
        raise ModelError(f"{path}/saved_model.pb holds no MetaGraph")
    signatures, all_ops, flagged, assets = {}, set(), {}, []
    for meta in proto.meta_graphs:
        graph = meta.graph_def
        library = {f.signature.name: f for f in graph.library.function}
        nodes = {n.name: n for n in graph.node}
        all_ops |= {n.op for n in graph.node} | {n.op for f in library.values() for n in f.node_def}
        for key, sig in meta.signature_def.items():
            if key.startswith("__"):
                continue
            signatures[key] = {"inputs": {k: _tensor_info(v) for k, v in sig.inputs.items()},
                               "outputs": {k: _tensor_info(v) for k, v in sig.outputs.items()}}
        saver = meta.saver_def
        restore = _upstream(nodes, [saver.restore_op_name])
        save = _upstream(nodes, [saver.save_tensor_name]) - restore
        # Everything else in the graph (signatures, init and main ops, table initializers) and every function
        # the object graph can restore as a callable is held to the allowlist; so is whatever such a node takes
        # from the saver's region, since it then runs outside the saver.
        general = _upstream(nodes, [n for n in nodes if n not in restore | save] + _load_time_roots(meta))
        roots = [nodes[n] for n in sorted(general)]
        roots += [node for name in meta.object_graph_def.concrete_functions if name in library
                  for node in library[name].node_def]
        _judge(roots, library, ALLOWED_OPS, flagged)
        handed = _reads_handed_file(_producer(saver.filename_tensor_name))
        _judge([nodes[n] for n in sorted(restore - general)], library, ALLOWED_OPS | RESTORE_OPS, flagged,
               "run while the model loads, by its saver's restore op", handed)
        _judge([nodes[n] for n in sorted(save - general)], library, ALLOWED_OPS | SAVE_OPS, flagged,
               "run when the loaded model is saved, by its saver's save op")
        assets += _asset_names(meta)
    outside = escapes(path, assets)
    count, size = _variables(path)
    return Report(str(path), signatures, tuple(sorted(all_ops)), count, size,
                  dict(sorted({**flagged, **outside}.items())), "savedmodel", _folder_bytes(path), outside)


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


LITERT_STANDARD = "a LiteRT builtin operator"
# ONNX's own operator sets; anything else is a custom op whose code the runtime must be given.
ONNX_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def _litert_tensor(tensor) -> dict[str, str]:
    from ai_edge_litert import schema_py_generated as schema

    types = {v: k.lower() for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    shape = tensor.shapeSignature if tensor.shapeSignature is not None else tensor.shape
    dims = "[" + ", ".join("None" if d < 0 else str(d) for d in (shape if shape is not None else [])) + "]"
    return {"dtype": types.get(tensor.type, str(tensor.type)), "shape": dims}


def inspect_litert(path: Path | str) -> Report:
    """Read a .tflite export's flatbuffer: signatures, operators, constant buffers; Flex ops judged as TF ops."""
    from ai_edge_litert import schema_py_generated as schema

    from tfperf.deploy.converters import litert_custom_ops, litert_ops
    from tfperf.deploy.errors import ModelError

    folder = Path(path)
    file = folder / "model.tflite"
    data = file.read_bytes()
    try:
        model = schema.ModelT.InitFromPackedBuf(data, 0)
        ops = litert_ops(file)
    except Exception as exc:  # a flatbuffer that does not parse raises whatever its reader hits
        raise ModelError(f"{file} is corrupt: it does not parse as a LiteRT model ({type(exc).__name__})") from None
    signatures = {}
    for sig in model.signatureDefs or []:
        tensors = model.subgraphs[sig.subgraphIndex].tensors
        signatures[sig.signatureKey.decode()] = {
            direction: {t.name.decode(): _litert_tensor(tensors[t.tensorIndex]) for t in getattr(sig, direction) or []}
            for direction in ("inputs", "outputs")}
    flagged = {}
    for op in litert_custom_ops(file):  # known by the CUSTOM builtin code, whatever the name's spelling
        if op.startswith("Flex"):
            why = why_not_allowed(op[len("Flex"):])
            if why:
                flagged[op] = f"a TensorFlow op run by the Flex delegate that {why}" if why != NOT_REVIEWED \
                    else f"a TensorFlow op run by the Flex delegate, {NOT_REVIEWED}"
        else:
            flagged[op or "custom operator with an empty code"] = ("a custom operator: its kernel is code the "
                                                                    "interpreter must be given; not reviewed")
    for op in ops:
        if op.startswith("BUILTIN_"):
            flagged[op] = "a builtin code this LiteRT schema does not know: not reviewed"
    constants = [b for b in model.buffers or [] if b.data is not None and len(b.data)]
    outside = escapes(folder)
    return Report(str(folder), signatures, tuple(ops), len(constants), sum(len(b.data) for b in constants),
                  dict(sorted({**flagged, **outside}.items())), "litert", _folder_bytes(folder), outside)


def inspect_onnx(path: Path | str) -> Report:
    """Read a .onnx export's protobuf: inputs, outputs, op types (subgraphs too), initializers."""
    import numpy as np
    import onnx
    from google.protobuf.message import DecodeError

    from tfperf.deploy.errors import ModelError

    folder = Path(path)
    file = folder / "model.onnx"
    try:
        model = onnx.load(str(file), load_external_data=False)
    except (DecodeError, ValueError, OSError) as exc:
        raise ModelError(f"{file} is corrupt: it does not parse as an ONNX model ({type(exc).__name__})") from None

    def value_info(v) -> dict[str, str]:
        t = v.type.tensor_type
        dims = "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else "None" for d in t.shape.dim) + "]"
        return {"dtype": np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).name, "shape": dims}

    ops, flagged, outside = set(), {}, escapes(folder)
    local = {(f.domain, f.name) for f in model.functions}  # functions the model defines: their bodies are walked
    graphs, bodies, tensors = [model.graph], [list(f.node) for f in model.functions], []
    while graphs or bodies:
        if graphs:  # the main graph and every subgraph (If, Loop, Scan bodies): nodes and their weights
            graph = graphs.pop()
            nodes = list(graph.node)
            tensors += [*graph.initializer, *(t for s in graph.sparse_initializer for t in (s.values, s.indices))]
        else:
            nodes = bodies.pop()
        for node in nodes:
            name = f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
            ops.add(name)
            if node.domain not in ONNX_STANDARD_DOMAINS and (node.domain, node.op_type) not in local:
                flagged[name] = f"an operator of the custom domain {node.domain!r}: code the runtime must be " \
                                f"given; not reviewed"
            for a in node.attribute:
                graphs += [a.g] if a.HasField("g") else []
                graphs += list(a.graphs)
                tensors += ([a.t] if a.HasField("t") else []) + list(a.tensors)
                tensors += [t for sp in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(
                    a.sparse_tensors) for t in (sp.values, sp.indices)]
    for tensor in tensors:  # weights kept in other files: ONNX Runtime opens whatever path they name
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = {e.key: e.value for e in tensor.external_data}.get("location", "")
        target = (folder / location).resolve()
        if Path(location).is_absolute() or not target.is_relative_to(folder.resolve()):
            outside[f"external data of {tensor.name or 'a tensor'}"] = (
                f"reads {location}, outside the model's folder ({target}): a loader would open that file")
    initializers = model.graph.initializer
    size = sum(int(np.prod(t.dims)) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
               for t in initializers)
    inputs = {v.name: value_info(v) for v in model.graph.input if v.name not in {t.name for t in initializers}}
    signatures = {"model": {"inputs": inputs, "outputs": {v.name: value_info(v) for v in model.graph.output}}}
    return Report(str(folder), signatures, tuple(sorted(ops)), len(initializers), size,
                  dict(sorted({**flagged, **outside}.items())), "onnx", _folder_bytes(folder), outside)


INSPECTORS = {"savedmodel": inspect_saved_model, "litert": inspect_litert, "onnx": inspect_onnx}


def inspect_model(path: Path | str) -> Report:
    """The report of an export of any format, read without running it."""
    path = check_model_dir(path)
    return INSPECTORS[format_of(path).name](path)


def _size(n: int) -> str:
    return f"{n / 2**30:,.1f} GB" if n >= 2**30 else f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n:,} bytes"


def check_safe(path: Path | str, trust: bool = False) -> Report:
    """The report of a model that is safe to load; a ModelError naming the ops off the allowlist otherwise.
    `trust` accepts ops off the allowlist, never files from outside the model's folder nor weights that
    declare more bytes than the memory this process can take (refused before anything is allocated)."""
    report = inspect_model(path)
    if report.escapes:
        found = listed((f"{what} {why}" for what, why in report.escapes.items()), limit=3, width=120)
        raise ModelError(f"{report.path} reads files from outside its folder: {found}; refused even with --trust "
                         f"(a model's files belong in its folder)")
    from tfperf.flags import available_memory

    free = available_memory()
    if free is not None and report.variable_bytes > free:
        raise ModelError(f"{report.path} declares {_size(report.variable_bytes)} of weights, more than the "
                         f"{_size(free)} of memory this process can take: it cannot be loaded here")
    if not report.safe and not trust:
        ops = listed((f"{op} ({why})" for op, why in report.flagged.items()), limit=4, width=100)
        raise ModelError(f"{report.path} reaches ops off the allowlist: {ops}; see `tfperf inspect {report.path}`, "
                         f"and pass --trust only if you trust whoever made it")
    return report


def format_report(report: Report) -> str:
    """The report as text for the terminal."""
    kind = {"savedmodel": "SavedModel", "litert": "LiteRT model", "onnx": "ONNX model"}[report.format]
    lines = [f"{kind} {report.path} ({report.file_bytes:,} bytes on disk)"]
    for key, sig in report.signatures.items():
        lines.append(f"  signature {key!r}:")
        for direction in ("inputs", "outputs"):
            for name, info in sig[direction].items():
                lines.append(f"    {direction[:-1]:<6} {name}: {info['dtype']}{info['shape']}")
    weights = "variables" if report.format == "savedmodel" else "constant tensors"
    lines.append(f"  {weights}: {report.variable_count} holding {report.variable_bytes:,} bytes")
    lines.append(f"  op types ({len(report.op_types)}): {', '.join(report.op_types)}")
    if report.flagged:
        lines.append("  NOT SAFE: what loading or calling it would run or read that is not allowed:")
        lines += [f"    {op}: {why}" for op, why in report.flagged.items()]
    else:
        lines.append("  safe: every op the signatures and restored functions reach computes in memory "
                     "(tfperf.deploy.allowlist.ALLOWED_OPS)" if report.format == "savedmodel" else
                     "  safe: the runtime's standard operators" + (
                         ", and Flex ops whose TensorFlow ops are on the allowlist (tfperf.deploy.allowlist.ALLOWED_OPS)"
                         if any(op.startswith("Flex") for op in report.op_types) else ""))
    return "\n".join(lines)
