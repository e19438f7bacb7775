"""Deployment: one loader for any model a user brings, exports in three formats, and reading them back.

From the bottom: `errors` (one per thing that goes wrong), `converters` (the LiteRT and ONNX
converters' own calls), `formats` (how SavedModel, LiteRT and ONNX files are written, loaded and
run), `layout` (versioned, atomic exports in TF Serving's layout), `inspection`
(what an export holds, read without running it), `loader` (a cookbook net, a Keras file, a SavedModel
or `module:factory` as one `Subject`), `inputs` (real or synthetic inputs for it) and `commands`
(`tfperf train`, `export`, `predict`, `inspect`).
"""

from tfperf.deploy.formats import FORMATS
from tfperf.deploy.errors import ExportError, InputError, ModelError
from tfperf.deploy.inspection import check_safe, inspect_model
from tfperf.deploy.layout import export, load, predict
from tfperf.deploy.loader import load_subject

__all__ = ["FORMATS", "ExportError", "InputError", "ModelError", "check_safe", "export", "inspect_model", "load",
           "load_subject", "predict"]
