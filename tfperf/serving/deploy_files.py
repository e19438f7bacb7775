"""The files that deploy a measured configuration on the serving systems people run: TF Serving's models.config,
batching_parameters.txt and command line; Triton's model repository (config.pbtxt beside the model file); a
KServe InferenceService; and how many replicas carry a target rate within the budget. Each is checked in the
tests by the system's own schema (TF Serving's model_server_config.proto, Triton's model_config.proto)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tfperf.serving.configs import ServingConfig
from tfperf.serving.runtimes import PLATFORMS
from tfperf.serving.protocols.tensors import Tensor

# Triton's data types (model_config.proto) by NumPy's names.
TRITON_TYPES = {"bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
                "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
                "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
                "string": "TYPE_STRING"}
# The formats Triton serves, with the file its model repository expects each in.
TRITON_PLATFORMS = {fmt: (PLATFORMS[fmt], file)
                    for fmt, file in (("savedmodel", "model.savedmodel"), ("onnx", "model.onnx"))}
# The headroom a replica count keeps: capacity measured at the budget times this is what one replica is given.
HEADROOM = 0.7


def triton_model_config(name: str, fmt: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor],
                        config: ServingConfig) -> dict[str, Any]:
    """The configuration as Triton's ModelConfig (its JSON form): platform, batch size, inputs and outputs
    without the batch axis, the dynamic batcher, instances and the runtime's threads."""
    platform = TRITON_PLATFORMS.get(fmt, (fmt, ""))[0]
    batching = config.batching
    found: dict[str, Any] = {
        "name": name, "platform": platform, "max_batch_size": batching.max_batch_size if batching else 1,
        "input": [{"name": t.name, "data_type": TRITON_TYPES[t.dtype], "dims": [-1 if d is None else d for d in t.shape[1:]]}
                  for t in inputs],
        "output": [{"name": t.name, "data_type": TRITON_TYPES[t.dtype],
                    "dims": [-1 if d is None else d for d in t.shape[1:]]} for t in outputs],
        "instance_group": [{"count": config.instances, "kind": "KIND_CPU"}],
    }
    if batching is not None:
        found["dynamic_batching"] = {
            # Triton's batcher runs what is queued as soon as an instance is free unless told to wait.
            "max_queue_delay_microseconds": 0 if batching.idle_runs_now else batching.batch_timeout_micros,
            **({"preferred_batch_size": list(batching.allowed_batch_sizes)} if batching.allowed_batch_sizes else {})}
    if config.threads is not None:
        keys = {"onnx": ("intra_op_thread_count", "inter_op_thread_count"),
                "savedmodel": ("TF_NUM_INTRA_THREADS", "TF_NUM_INTER_THREADS")}.get(fmt)
        if keys:
            found["parameters"] = {keys[0]: {"string_value": str(config.threads)}, keys[1]: {"string_value": "1"}}
    return found


def config_pbtxt(config: dict[str, Any]) -> str:
    """A Triton ModelConfig as the config.pbtxt text Triton reads (through its own proto)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.MessageToString(json_format.ParseDict(config, model_config_pb2.ModelConfig()))


def tfserving_threads(config: ServingConfig, concurrency: int | None) -> tuple[dict[str, int], list[str]]:
    """TF Serving's thread flags as measured, each with where its value came from: the intra-op threads of the
    SavedModel configuration (0, TensorFlow's own choice, where its default pools were what ran), the inter-op
    threads as they ran (tfperf serve sets one pool of 1 where it sets the intra-op threads, else TensorFlow's own),
    and REST threads for the requests in flight at the best level within the budget."""
    flags, why = {}, []
    if config.threads is None:
        flags["tensorflow_intra_op_parallelism"] = flags["tensorflow_inter_op_parallelism"] = 0
        why.append("intra- and inter-op 0: TensorFlow's own pools, the ones this configuration ran with when it was "
                   "measured (with --server-process, tfperf load also measures counts of its own)")
    else:
        flags["tensorflow_intra_op_parallelism"] = config.threads
        flags["tensorflow_inter_op_parallelism"] = 1
        why.append(f"intra-op {config.threads}, inter-op 1: the pools the measured server process ran with")
    if concurrency:
        flags["rest_api_num_threads"] = concurrency
        why.append(f"REST threads {concurrency}: the requests in flight at the best level within the budget")
    return flags, why


def tfserving_files(name: str, base_path: str, config: ServingConfig, concurrency: int | None = None,
                    port: int = 8500, rest_port: int = 8501) -> dict[str, str]:
    """TF Serving's models.config, batching_parameters.txt (when the configuration batches) and the
    tensorflow_model_server command line that serves them with the threads that were measured (`tfserving_threads`),
    each flag's source said in a comment."""
    models = (f"model_config_list {{\n  config {{\n    name: \"{name}\"\n    base_path: \"{base_path}\"\n"
              f"    model_platform: \"tensorflow\"\n  }}\n}}\n")
    files = {"models.config": models}
    threads, why = tfserving_threads(config, concurrency)
    command = ["tensorflow_model_server", f"--port={port}", f"--rest_api_port={rest_port}",
               "--model_config_file=models.config", *[f"--{k}={v}" for k, v in threads.items()]]
    batching = config.batching
    if batching is not None:
        sizes = "".join(f"allowed_batch_sizes {{ value: {s} }}\n" for s in batching.allowed_batch_sizes)
        files["batching_parameters.txt"] = (
            f"max_batch_size {{ value: {batching.max_batch_size} }}\n"
            f"batch_timeout_micros {{ value: {0 if batching.idle_runs_now else batching.batch_timeout_micros} }}\n"
            f"num_batch_threads {{ value: {config.instances} }}\n"
            f"max_enqueued_batches {{ value: {batching.max_enqueued_batches} }}\n{sizes}")
        command += ["--enable_batching", "--batching_parameters_file=batching_parameters.txt"]
    files["command.sh"] = "".join(f"# {line}\n" for line in why) + " \\\n  ".join(command) + "\n"
    return files


def kserve_inference_service(name: str, fmt: str, storage_uri: str, cores: int, memory: str = "2Gi") -> str:
    """A KServe InferenceService for the format's runtime (TF Serving for a SavedModel, Triton for ONNX), its
    CPU requests and limits the cores the configuration was measured on."""
    model_format = {"savedmodel": "tensorflow", "onnx": "onnx"}[fmt]
    runtime = {"savedmodel": "kserve-tensorflow-serving", "onnx": "kserve-tritonserver"}[fmt]
    return (f"apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\nmetadata:\n  name: {name}\nspec:\n"
            f"  predictor:\n    model:\n      modelFormat:\n        name: {model_format}\n      runtime: {runtime}\n"
            f"      protocolVersion: {'v1' if fmt == 'savedmodel' else 'v2'}\n"
            f"      storageUri: {storage_uri}\n      resources:\n        requests:\n          cpu: \"{cores}\"\n"
            f"          memory: {memory}\n        limits:\n          cpu: \"{cores}\"\n          memory: {memory}\n")


def replicas_for(target_rate: float, capacity: float, headroom: float = HEADROOM) -> int:
    """How many replicas carry `target_rate` requests/s when one carried `capacity` within the budget, each
    given only `headroom` of it (queues grow without bound near capacity)."""
    if capacity <= 0:
        raise ValueError("a replica that serves nothing within the budget cannot carry any rate")
    return max(1, math.ceil(target_rate / (capacity * headroom)))


def triton_config(repository, version) -> dict[str, Any]:
    """A served version's configuration as Triton's /config answers it (tritonclient's get_model_config)."""
    return triton_model_config(repository.name, version.format, version.inputs, version.outputs, repository.config)



def best_of(found, runtimes: Sequence[str]):
    """The configuration of one of `runtimes` that served the most within the budget (a Swept), or None."""
    budget = found.budget
    usable = [s for s in found.swept if not s.dropped and s.config.runtime in runtimes and s.rate_within(budget) > 0]
    return max(usable, key=lambda s: s.rate_within(budget), default=None)


def write_deploy(found, winner, exports: dict, out, *, name: str, cores: int, rate: float, measured: str = "",
                 target_rate: float | None = None) -> list[str]:
    """serve.json (the winner, for `tfperf serve --config`) and deploy/: TF Serving's files for the best SavedModel
    configuration, Triton's model repository for the best ONNX or SavedModel one, a KServe InferenceService, and
    a README saying which configuration each file carries, its measured rate, and (with `target_rate`) the
    replicas (from `rate`, what the winner carried within the budget, `measured` saying how); the lines of that
    README."""
    import json
    import shutil
    from pathlib import Path

    from tfperf.records.jsonl import atomic_write_text

    out, budget = Path(out), found.budget
    folder = out / "deploy"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "serve.json", json.dumps(winner.config.to_json(), indent=1) + "\n")
    readme = [f"# Deploying {name}", "", f"Measured by `tfperf load` within {budget} on {cores} core(s). The winner, "
              f"{winner.config.name}{measured}, is in ../serve.json: `tfperf serve MODEL --config serve.json`.", ""]
    saved = best_of(found, ("savedmodel",))
    if saved is not None and "savedmodel" in exports:
        best = saved.best_level(budget)
        in_flight = int(best.label.split()[-1]) if best is not None and best.label.startswith("concurrency") else None
        files = tfserving_files(name, str(Path(exports["savedmodel"]).resolve().parent), saved.config, in_flight)
        for file, text in files.items():
            atomic_write_text(folder / "tfserving" / file, text)
        other = "" if saved is winner else f" (the winner is {winner.config.name}: TF Serving runs SavedModels only)"
        readme.append(f"- tfserving/: TF Serving for {saved.config.name}, {saved.rate_within(budget):.0f} requests/s "
                      f"within the budget{other}; `sh command.sh` beside models.config.")
    triton = winner if winner.config.runtime in TRITON_PLATFORMS else best_of(found, tuple(TRITON_PLATFORMS))
    if triton is not None and triton.config.runtime in exports:
        from tfperf.deploy.layout import load
        from tfperf.serving.protocols.tensors import Tensor

        fmt = triton.config.runtime
        runner = load(exports[fmt])
        outputs = runner({s.name: _zeros(s) for s in runner.inputs})
        inputs = [Tensor(s.name, s.dtype, tuple(s.shape)) for s in runner.inputs]
        answered = [Tensor(k, v.dtype.name, (None, *v.shape[1:])) for k, v in sorted(outputs.items())]
        repo = folder / "triton" / "model_repository" / name
        atomic_write_text(repo / "config.pbtxt", config_pbtxt(triton_model_config(name, fmt, inputs, answered,
                                                                                  triton.config)))
        target = repo / "1" / TRITON_PLATFORMS[fmt][1]
        shutil.rmtree(target, ignore_errors=True)
        source = Path(exports[fmt])
        if fmt == "onnx":
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / "model.onnx", target)
        else:
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("tfperf.json", "check.npz"))
        other = "" if triton is winner else f" (the winner is {winner.config.name}: Triton has no LiteRT backend)"
        readme.append(f"- triton/model_repository/: Triton for {triton.config.name}, {triton.rate_within(budget):.0f} "
                      f"requests/s within the budget{other}; `tritonserver --model-repository=model_repository`.")
        atomic_write_text(folder / "kserve" / "inferenceservice.yaml", kserve_inference_service(
            name.lower().replace("_", "-"), fmt, f"s3://YOUR-BUCKET/{name}", cores))
        readme.append(f"- kserve/inferenceservice.yaml: the same {fmt} model on KServe ({'TF Serving' if fmt == 'savedmodel' else 'Triton'} "
                      f"runtime), {cores} CPU(s) requested and limited, as measured; upload the model to storageUri.")
    if target_rate:
        replicas = replicas_for(target_rate, rate)
        readme += ["", f"For {target_rate:.0f} requests/s within {budget}: **{replicas} replica(s)** of the winner, "
                       f"each measured at {rate:.0f} requests/s and given {HEADROOM:.0%} of it (queues grow without "
                       f"bound near capacity), on machines like this one ({cores} core(s))."]
    atomic_write_text(folder / "README.md", "\n".join(readme) + "\n")
    return readme


def _zeros(spec):
    import numpy as np

    return np.zeros((1, *[d or 8 for d in spec.shape[1:]]), dtype=spec.dtype if spec.dtype != "string" else object)
