"""The runtimes tfperf exports a model to, serves and searches, and the anchor that serves a SavedModel under
TensorFlow's own batching: each named once, here."""

RUNTIMES = ("savedmodel", "litert", "onnx")  # what `tfperf serve` runs and `tfperf load` exports to and searches
# The platform each export format is in KServe v2 metadata and Triton's model config (Triton's own names).
PLATFORMS = {"savedmodel": "tensorflow_savedmodel", "onnx": "onnxruntime_onnx", "litert": "tflite"}
BATCH_FUNCTION = "tf-batch-function"  # the SavedModel's signature under TensorFlow's BatchFunction: an anchor of load


def export_of(runtime: str) -> str:
    """The export a runtime serves: TensorFlow's BatchFunction serves the SavedModel."""
    return "savedmodel" if runtime == BATCH_FUNCTION else runtime
