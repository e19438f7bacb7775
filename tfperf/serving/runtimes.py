"""The runtimes tfperf exports a model to, serves and searches, and the anchor that serves a SavedModel under
TensorFlow's own batching: each named once, here."""

RUNTIMES = ("savedmodel", "litert", "onnx")  # what `tfperf serve` runs and `tfperf load` exports to and searches
BATCH_FUNCTION = "tf-batch-function"  # the SavedModel's signature under TensorFlow's BatchFunction: an anchor of load


def export_of(runtime: str) -> str:
    """The export a runtime serves: TensorFlow's BatchFunction serves the SavedModel."""
    return "savedmodel" if runtime == BATCH_FUNCTION else runtime
