"""The allowlist inspection judges by: op types that compute on tensors in memory, and why others are not.

How the list was chosen: the op types TensorFlow's math, neural-network, array, variable, control
flow, random and in-memory string/lookup APIs emit, reviewed one by one (each computes from its
inputs and resource handles, and touches no file, process or stream), beginning with those every
model the cookbook exports reaches. It is kept here and nowhere else; an op a legitimate model needs
and this list lacks is reported as "not on the allowlist", and is added after the same review.

The saver's own ops are judged apart (`tfperf.deploy.inspection`): RESTORE_OPS may run while a model
loads, to read the checkpoint the loader hands them; SAVE_OPS when a loaded model is saved again.
"""

from __future__ import annotations

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
NOT_REVIEWED = "not on the allowlist of in-memory ops (tfperf.deploy.allowlist.ALLOWED_OPS)"


def why_not_allowed(op: str) -> str | None:
    """None for an allowed op type; otherwise why a model reaching it is not safe to load."""
    if op in ALLOWED_OPS:
        return None
    return RISKY_OPS.get(op, NOT_REVIEWED)


# The saver's own ops. Its restore op runs while the model loads and may only read the checkpoint it is
# handed; its save op runs when a loaded model is saved again and writes the checkpoint it is handed.
RESTORE_OPS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})
SAVE_OPS = RESTORE_OPS | {"SaveV2", "Save", "SaveSlices", "MergeV2Checkpoints", "ShardedFilename", "ShardedFilespec"}
