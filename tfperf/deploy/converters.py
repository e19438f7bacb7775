"""The converters' own calls: a SavedModel signature to a LiteRT flatbuffer, a tf.function to ONNX, and the ops a
.tflite file uses; each failure named in one line (the op a converter lacks)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.errors import ExportError, first_line

SIGNATURE = "serving_default"
ONNX_OPSET = 17  # supported by tf2onnx 1.17 and every onnxruntime since 1.13


# The converter's words for an op with no LiteRT kernel: 'tf.MatrixInverse' op is neither a custom op nor a
# flex op; or, for a TensorList op it could not lower: failed to legalize operation 'tf.TensorListReserve'
_NOT_IN_LITERT = re.compile(r"'tf\.(\w+)' op is neither a custom op nor a flex op"
                            r"|failed to legalize operation 'tf\.(\w+)'")


def litert_from_saved_model(saved: Path, *, signature: str = SIGNATURE, quantize: str = "none",
                            representative: Mapping[str, np.ndarray] | None = None,
                            select_tf_ops: bool = False) -> bytes:
    """A SavedModel signature converted to a LiteRT flatbuffer; ExportError naming the ops LiteRT lacks."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved), signature_keys=[signature])
    ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize != "none":
        # Quantization: int8 weights; with int8, activations too, ranges taken from real inputs
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "int8":
        rows = {name: np.asarray(a) for name, a in representative.items()}
        count = min(len(a) for a in rows.values())
        converter.representative_dataset = lambda: ({n: a[i:i + 1] for n, a in rows.items()} for i in range(count))
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if select_tf_ops:
        ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
    converter.target_spec.supported_ops = ops
    try:
        return converter.convert()
    except Exception as exc:  # ConverterError; its text names the ops LiteRT lacks
        missing = sorted({op for ops in _NOT_IN_LITERT.findall(str(exc)) for op in ops if op})
        if missing:
            raise ExportError(
                f"LiteRT has no kernel for {', '.join(missing)}: export --format litert --select-tf-ops to run "
                f"them as TensorFlow ops (the runtime must then link the Flex delegate), or use --format onnx "
                f"or savedmodel") from None
        raise ExportError(f"the LiteRT converter failed: {first_line(exc)}") from None


def litert_ops(path: Path) -> list[str]:
    """The op names a .tflite file uses (builtin names; custom ops by their code, Flex ops as FlexX)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(Path(path).read_bytes(), 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    found = []
    for code in model.operatorCodes or []:
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        if builtin == schema.BuiltinOperator.CUSTOM:
            found.append((code.customCode or b"").decode() or "CUSTOM")
        else:
            found.append(names.get(builtin, f"BUILTIN_{builtin}"))
    return sorted(set(found))


def litert_custom_ops(path: Path) -> list[str]:
    """The custom codes of a .tflite file's custom operators, as written (Flex ops among them; '' for none):
    a custom operator is known by its builtin code, CUSTOM, not by how its name is spelled."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(Path(path).read_bytes(), 0)
    return sorted({(code.customCode or b"").decode(errors="replace") for code in model.operatorCodes or []
                   if max(code.builtinCode, code.deprecatedBuiltinCode) == schema.BuiltinOperator.CUSTOM})


def litert_flex_ops(path: Path) -> list[str]:
    """The TensorFlow ops a .tflite file runs through the Flex delegate (Select TF ops)."""
    return [op[len("Flex"):] for op in litert_ops(path) if op.startswith("Flex")]


_NOT_IN_ONNX = re.compile(r"Unsupported ops: Counter\(\{(.*?)\}\)")


def onnx_from_function(function, input_signature) -> Any:
    """A tf.function returning a dict converted to a checked ONNX model whose outputs carry the dict's
    keys; ExportError naming the ops tf2onnx cannot convert."""
    import logging

    import onnx
    import tf2onnx

    # The function's output names are the contract; map any tensor name tf2onnx gives back to them.
    concrete = function.get_concrete_function(*input_signature)
    tensor_to_key = {t.name: key for key, t in concrete.structured_outputs.items()}
    # tf2onnx reports ops it cannot convert in its log, not in an exception: listen to it while converting
    # (and keep it off the terminal: the error below says the same in one line).
    log = logging.getLogger("tf2onnx")
    captured: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: captured.append(record.getMessage())
    log.addHandler(handler)
    propagate, log.propagate = log.propagate, False
    failure = None
    try:
        proto = _tf2onnx_convert(function, input_signature)
    except Exception as exc:
        failure = exc
    finally:
        log.removeHandler(handler)
        log.propagate = propagate
    missing = sorted({op for text in _NOT_IN_ONNX.findall(" ".join(captured) + str(failure or ""))
                      for op in re.findall(r"'(\w+)'", text)})
    if missing:
        raise ExportError(f"ONNX (tf2onnx {tf2onnx.__version__}, opset {ONNX_OPSET}) has no conversion for "
                          f"{', '.join(missing)}: use --format savedmodel, or litert if LiteRT has it")
    if failure is not None:
        raise ExportError(f"the ONNX converter failed: {first_line(failure)}") from None
    renamed = {}
    for out in proto.graph.output:
        key = tensor_to_key.get(out.name, out.name)
        renamed[out.name] = key
        out.name = key
    for node in proto.graph.node:
        node.output[:] = [renamed.get(o, o) for o in node.output]
    onnx.checker.check_model(proto)
    return proto


def erfc_as_one_minus_erf(ctx, node, name, args) -> None:
    """tf2onnx's handler for TensorFlow's Erfc, which it lacks (Keras' exact GELU, `tf.nn.gelu`, computes
    0.5 x erfc(-x / sqrt 2)): ONNX has Erf, and erfc(x) = 1 - erf(x). The node arrives as a Sub."""
    from tf2onnx import utils

    x = node.input[0]
    erf = ctx.make_node("Erf", [x], op_name_scope=name)
    one = ctx.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype=utils.map_onnx_to_numpy_type(
        ctx.get_dtype(x))))
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])


# TensorFlow ops tf2onnx cannot convert by itself, converted per call (its custom_op_handlers: nothing is
# registered in tf2onnx for the rest of the process): {op: (handler, [the ONNX op the node becomes])}.
ONNX_HANDLERS = {"Erfc": (erfc_as_one_minus_erf, ["Sub"])}


def _tf2onnx_convert(function, input_signature):
    """tf2onnx's from_function, without the copy of the whole graph (weights included) it makes before each
    optimizer pass so as to roll back a pass that fails: that copy is half of a large model's conversion
    time. Should a pass fail, the conversion runs again with tf2onnx's rollback."""
    import os

    import tf2onnx

    variable = tf2onnx.constants.ENV_TF2ONNX_CATCH_ERRORS  # read by tf2onnx when it converts, not at import
    before = os.environ.get(variable)
    os.environ[variable] = "FALSE"
    try:
        proto, _ = tf2onnx.convert.from_function(function, input_signature=list(input_signature), opset=ONNX_OPSET,
                                                 custom_op_handlers=dict(ONNX_HANDLERS))
    except Exception:
        os.environ[variable] = "TRUE"
        proto, _ = tf2onnx.convert.from_function(function, input_signature=list(input_signature), opset=ONNX_OPSET,
                                                 custom_op_handlers=dict(ONNX_HANDLERS))
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before
    return proto
