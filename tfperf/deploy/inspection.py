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

How the list was chosen: the op types TensorFlow's math, neural-network, array, variable, control
flow, random and in-memory string/lookup APIs emit, reviewed one by one (each computes from its
inputs and resource handles, and touches no file, process or stream), beginning with those every
model the cookbook exports reaches. It is kept here and nowhere else; an op a legitimate model needs
and this list lacks is reported as "not on the allowlist", and is added after the same review.

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

from tfperf.deploy.formats import check_model_dir, format_of
from tfperf.deploy.errors import ModelError

_ALLOWED_BY_KIND: dict[str, str] = {
    "arithmetic and comparison": """
        Abs Acos Acosh Add AddN AddV2 Angle ApproximateEqual Asin Asinh Atan Atan2 Atanh BesselI0e BesselI1e
        Betainc BitwiseAnd BitwiseOr BitwiseXor Cast Ceil ClipByValue Complex ComplexAbs Conj Cos Cosh Cumprod
        Cumsum CumulativeLogsumexp Digamma Div DivNoNan Equal Erf Erfc Erfinv Exp Expm1 Floor FloorDiv FloorMod
        Greater GreaterEqual Igamma Igammac Imag Inv Invert IsFinite IsInf IsNan LeftShift Less LessEqual Lgamma
        Log Log1p LogicalAnd LogicalNot LogicalOr Maximum Minimum Mod Mul MulNoNan Ndtri Neg NextAfter
        NotEqual Polygamma Pow Real RealDiv Reciprocal RightShift Rint Round Rsqrt Select SelectV2 Sign Sin
        Sinh Sqrt Square SquaredDifference Sub Tan Tanh TruncateDiv TruncateMod Xdivy Xlog1py Xlogy Zeta""",
    "reductions and linear algebra": """
        All Any ArgMax ArgMin BatchMatMul BatchMatMulV2 BatchMatMulV3 Cholesky Cross EuclideanNorm Einsum
        InTopKV2 LogMatrixDeterminant MatMul MatrixBandPart MatrixDeterminant MatrixDiagPartV3 MatrixDiagV3
        MatrixInverse MatrixSetDiagV3 MatrixSolve MatrixTriangularSolve Max Mean Min Prod Qr SegmentMax
        SegmentMean SegmentMin SegmentProd SegmentSum SelfAdjointEigV2 SparseSegmentMean
        SparseSegmentMeanWithNumSegments SparseSegmentSqrtN SparseSegmentSqrtNWithNumSegments SparseSegmentSum
        SparseSegmentSumWithNumSegments Sum Svd TopKV2 UnsortedSegmentMax UnsortedSegmentMin UnsortedSegmentProd
        UnsortedSegmentSum""",
    "neural-network layers": """
        AvgPool AvgPool3D BatchToSpaceND BiasAdd Conv2D Conv2DBackpropInput Conv3D Conv3DBackpropInputV2
        CropAndResize DepthToSpace DepthwiseConv2dNative DepthwiseConv2dNativeBackpropInput Dilation2D Elu
        ExtractImagePatches FusedBatchNorm FusedBatchNormV2 FusedBatchNormV3 LRN LeakyRelu LogSoftmax MaxPool
        MaxPool3D MaxPoolV2 MaxPoolWithArgmax NonMaxSuppressionV3 NonMaxSuppressionV4 NonMaxSuppressionV5 Relu
        Relu6 ResizeArea ResizeBicubic ResizeBilinear ResizeNearestNeighbor ScaleAndTranslate Selu Sigmoid
        Softmax SoftmaxCrossEntropyWithLogits Softplus Softsign SpaceToBatchND SpaceToDepth
        SparseSoftmaxCrossEntropyWithLogits BlockLSTM BlockLSTMV2 GRUBlockCell LSTMBlockCell CudnnRNN
        CudnnRNNV2 CudnnRNNV3 CudnnRNNCanonicalToParams CudnnRNNCanonicalToParamsV2 CudnnRNNParamsSize""",
    "array and shape": """
        Bitcast BroadcastArgs BroadcastGradientArgs BroadcastTo Bucketize CheckNumerics CheckNumericsV2 Concat
        ConcatOffset ConcatV2 ConjugateTranspose Const DeepCopy Diag DiagPart DynamicPartition DynamicStitch
        Empty EnsureShape ExpandDims Fill Gather GatherNd GatherV2 Identity IdentityN InvertPermutation LinSpace
        ListDiff LowerBound MirrorPad NoOp OneHot OnesLike Pack Pad PadV2 ParallelConcat ParallelDynamicStitch
        Placeholder PlaceholderWithDefault PreventGradient Range Rank Reshape ReverseSequence ReverseV2 Roll
        ScatterNd Shape ShapeN Size Slice Snapshot SparseFillEmptyRows SparseReorder SparseReshape SparseSlice
        SparseTensorDenseMatMul SparseToDense Split SplitV Squeeze StopGradient StridedSlice
        TensorScatterAdd TensorScatterMax TensorScatterMin TensorScatterSub TensorScatterUpdate Tile Transpose
        Unique UniqueV2 UnravelIndex Unpack UpperBound Where ZerosLike Assert""",
    "variables and resources": """
        AssignAddVariableOp AssignSubVariableOp AssignVariableOp DestroyResourceOp ReadVariableOp
        ResourceGather ResourceGatherNd ResourceScatterAdd ResourceScatterDiv ResourceScatterMax
        ResourceScatterMin ResourceScatterMul ResourceScatterNdAdd ResourceScatterNdUpdate ResourceScatterSub
        ResourceScatterUpdate ResourceStridedSliceAssign VarHandleOp VarIsInitializedOp VariableShape DisableCopyOnRead
        Variable VariableV2 Assign AssignAdd AssignSub""",
    "control flow and function calls": """
        Case If PartitionedCall StatefulPartitionedCall StatelessCase StatelessIf StatelessWhile While
        Enter Exit LoopCond Merge NextIteration Switch ControlTrigger EmptyTensorList TensorListConcatV2
        TensorListElementShape TensorListFromTensor TensorListGather TensorListGetItem TensorListLength
        TensorListPopBack TensorListPushBack TensorListReserve TensorListResize TensorListScatterIntoExistingList
        TensorListSetItem TensorListSplit TensorListStack TensorArrayV3 TensorArrayCloseV3 TensorArrayConcatV3
        TensorArrayGatherV3 TensorArrayReadV3 TensorArrayScatterV3 TensorArraySizeV3 TensorArraySplitV3
        TensorArrayWriteV3 TensorArrayGradV3 OptionalFromValue OptionalGetValue OptionalHasValue OptionalNone""",
    "random numbers": """
        Multinomial RandomGamma RandomShuffle RandomStandardNormal RandomUniform RandomUniformInt RngReadAndSkip
        RngSkip StatefulStandardNormalV2 StatefulTruncatedNormal StatefulUniform StatefulUniformFullInt
        StatefulUniformInt StatelessMultinomial StatelessRandomGetAlg StatelessRandomGetKeyCounter
        StatelessRandomGetKeyCounterAlg StatelessRandomNormal StatelessRandomNormalV2 StatelessRandomUniform
        StatelessRandomUniformFullInt StatelessRandomUniformFullIntV2 StatelessRandomUniformInt
        StatelessRandomUniformIntV2 StatelessRandomUniformV2 StatelessTruncatedNormal StatelessTruncatedNormalV2
        TruncatedNormal""",
    "strings, lookups and ragged tensors in memory": """
        AsString RegexFullMatch RegexReplace StaticRegexFullMatch StaticRegexReplace StringFormat StringJoin
        StringLength StringLower StringNGrams StringSplitV2 StringStrip StringToHashBucketFast
        StringToHashBucketStrong StringToNumber StringUpper Substr UnicodeDecode UnicodeDecodeWithOffsets
        UnicodeEncode UnicodeTranscode HashTableV2 MutableHashTableV2 MutableDenseHashTableV2 AnonymousHashTable
        LookupTableFindV2 LookupTableImportV2 LookupTableInsertV2 LookupTableRemoveV2 LookupTableSizeV2
        LookupTableExportV2 InitializeTableV2 RaggedGather RaggedRange RaggedTensorFromVariant
        RaggedTensorToSparse RaggedTensorToTensor RaggedTensorToVariant""",
    "quantization": """
        Dequantize FakeQuantWithMinMaxArgs FakeQuantWithMinMaxVars FakeQuantWithMinMaxVarsPerChannel QuantizeV2
        QuantizeAndDequantizeV2 QuantizeAndDequantizeV4""",
}
ALLOWED_OPS: frozenset[str] = frozenset(op for ops in _ALLOWED_BY_KIND.values() for op in ops.split())

# Why the best-known ops off the list are dangerous; any other op off the list is "not reviewed".
RISKY_OPS: dict[str, str] = {
    **{op: "runs Python code" for op in ("PyFunc", "PyFuncStateless", "EagerPyFunc")},
    **{op: "touches the file system" for op in (
        "ReadFile", "WriteFile", "MatchingFiles", "ImmutableConst",
        "Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2", "RestoreSlice", "MergeV2Checkpoints",
        "TextLineDataset", "TFRecordDataset", "TFRecordDatasetV2", "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2", "TextLineReader", "TextLineReaderV2", "TFRecordReader", "TFRecordReaderV2",
        "WholeFileReader", "WholeFileReaderV2", "SaveDataset", "SaveDatasetV2", "LoadDataset", "SnapshotDataset",
        "SnapshotDatasetV2", "InitializeTableFromTextFile", "InitializeTableFromTextFileV2",
        "CreateSummaryFileWriter", "CreateSummaryDbWriter", "DebugIdentity", "DebugIdentityV2", "DebugIdentityV3")},
    **{op: "writes summaries (to a file, through a writer)" for op in (
        "WriteAudioSummary", "WriteGraphSummary", "WriteHistogramSummary", "WriteImageSummary",
        "WriteRawProtoSummary", "WriteScalarSummary", "WriteSummary", "SummaryWriter", "FlushSummaryWriter",
        "CloseSummaryWriter", "ImportEvent")},
    **{op: "writes outside the computation (log, stream or file)" for op in ("Print", "PrintV2")},
}
NOT_REVIEWED = "not on the allowlist of in-memory ops (tfperf.deploy.inspection.ALLOWED_OPS)"


def why_not_allowed(op: str) -> str | None:
    """None for an allowed op type; otherwise why a model reaching it is not safe to load."""
    if op in ALLOWED_OPS:
        return None
    return RISKY_OPS.get(op, NOT_REVIEWED)


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


# The saver's own ops. Its restore op runs while the model loads and may only read the checkpoint it is
# handed; its save op runs when a loaded model is saved again and writes the checkpoint it is handed.
RESTORE_OPS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})
SAVE_OPS = RESTORE_OPS | {"SaveV2", "Save", "SaveSlices", "MergeV2Checkpoints", "ShardedFilename", "ShardedFilespec"}
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
    reader = tf.train.load_checkpoint(str(path / "variables" / "variables"))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
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

    from tfperf.deploy.converters import litert_ops
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
    for op in ops:
        if op.startswith("Flex"):
            why = why_not_allowed(op[len("Flex"):])
            if why:
                flagged[op] = f"a TensorFlow op run by the Flex delegate that {why}" if why != NOT_REVIEWED \
                    else f"a TensorFlow op run by the Flex delegate, {NOT_REVIEWED}"
        elif op.upper() != op:  # builtin names are upper case; anything else is a custom op's code
            flagged[op] = "a custom operator: its kernel is code the interpreter must be given; not reviewed"
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

    ops, flagged, graphs, outside = set(), {}, [model.graph], escapes(folder)
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            name = f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
            ops.add(name)
            if node.domain not in ONNX_STANDARD_DOMAINS:
                flagged[name] = f"an operator of the custom domain {node.domain!r}: code the runtime must be " \
                                f"given; not reviewed"
            graphs += [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]
        tensors = [*graph.initializer, *(a.t for n in graph.node for a in n.attribute if a.HasField("t"))]
        for tensor in tensors:  # weights kept in other files: ONNX Runtime opens whatever path they name
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            location = {e.key: e.value for e in tensor.external_data}.get("location", "")
            target = (folder / location).resolve()
            if Path(location).is_absolute() or not target.is_relative_to(folder.resolve()):
                outside[f"external data of {tensor.name}"] = (f"reads {location}, outside the model's folder "
                                                              f"({target}): a loader would open that file")
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


def check_safe(path: Path | str, trust: bool = False) -> Report:
    """The report of a model that is safe to load; a ModelError naming the ops off the allowlist otherwise.
    `trust` accepts ops off the allowlist, never files from outside the model's folder."""
    report = inspect_model(path)
    if report.escapes:
        found = "; ".join(f"{what} {why}" for what, why in report.escapes.items())
        raise ModelError(f"{report.path} reads files from outside its folder: {found}; refused even with --trust "
                         f"(a model's files belong in its folder)")
    if not report.safe and not trust:
        ops = ", ".join(f"{op} ({why})" for op, why in report.flagged.items())
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
                     "(tfperf.deploy.inspection.ALLOWED_OPS)" if report.format == "savedmodel" else
                     "  safe: the runtime's standard operators" + (
                         ", and Flex ops whose TensorFlow ops are on the allowlist (tfperf.deploy.inspection.ALLOWED_OPS)"
                         if any(op.startswith("Flex") for op in report.op_types) else ""))
    return "\n".join(lines)
