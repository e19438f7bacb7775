"""tfperf serve, called by clients nobody here wrote: plain HTTP in TF Serving's two REST formats, TF Serving's own
gRPC stubs (tensorflow-serving-api), and tritonclient over HTTP (JSON and binary tensors) and gRPC. Each answer is
the model's own within 1e-4 of its scale; bad requests are 4xx and the server goes on; a full queue is 503 at
once; a gRPC deadline drops the request; new versions swap in under load without a failed request, broken ones
are refused. One server per module, in this process; test_serve_command_drains_on_sigterm runs the command."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import keras
import tensorflow as tf
import numpy as np
import pytest

from conftest import BIN

# On one xdist worker (`make test` runs two): its module fixture exports once.
pytestmark = pytest.mark.xdist_group("serve")

ROWS = 5


def tiny_model(seed: int):
    """Two named inputs, two outputs whose values depend on the input (a model with constant outputs would
    make every agreement below prove nothing)."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((6,), name="features")
    ids = keras.Input((3,), dtype="int32", name="ids")
    h = keras.layers.Dense(8, activation="tanh")(x) + keras.layers.Flatten()(keras.layers.Embedding(10, 8)(ids))[:, :8]
    return keras.Model([x, ids], {"scores": keras.layers.Dense(4)(h), "value": keras.layers.Dense(1)(h)},
                       name="tiny")


def export_version(root, model, version, fmt="savedmodel"):
    from tfperf.deploy.layout import export_subject
    from tfperf.deploy.loader import keras_subject

    return export_subject(keras_subject(model, "tiny", factory=None), root, name="tiny", version=version,
                          format=fmt).path


def inputs(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    return {"features": rng.normal(size=(rows, 6)).astype(np.float32),
            "ids": rng.integers(0, 10, size=(rows, 3)).astype(np.int32)}


def close_to(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Version 1 of the tiny model in a folder of versions, served with batching and a small body limit."""
    from tfperf.serving.batcher import BatchingOptions
    from tfperf.serving.configs import ServingConfig
    from tfperf.serving.repository import Repository
    from tfperf.serving.server import ServerOptions, ServerThread

    root = tmp_path_factory.mktemp("serve")
    model = tiny_model(0)
    export_version(root, model, 1)
    log = []
    config = ServingConfig("savedmodel", instances=1, batching=BatchingOptions(max_batch_size=16,
                                                                               batch_timeout_micros=500))
    repository = Repository("tiny", root / "tiny", config, log=log.append)
    repository.start()
    running = ServerThread(repository, ServerOptions(port=0, grpc_port=0, max_request_bytes=256 * 1024,
                                                     drain_timeout_s=5))
    yield {"root": root / "tiny", "model": model, "rest": running.ports[0], "grpc": running.ports[1],
           "repository": repository, "log": log, "server": running.server}
    running.close()
    repository.close()


def post(port, path, body, headers=None):
    """(status, parsed JSON body) of a POST, 4xx and 5xx included; (None, why) when no server took it."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", body if isinstance(body, bytes)
                                     else json.dumps(body).encode(), headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (urllib.error.URLError, ConnectionError) as exc:
        return None, str(exc)


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_tf_serving_rest_in_row_and_columnar_format_answers_as_the_model(served):
    x = inputs()
    want = {k: v.numpy() for k, v in served["model"](x).items()}
    status, rows = post(served["rest"], "/v1/models/tiny:predict", {
        "signature_name": "serving_default",
        "instances": [{"features": x["features"][i].tolist(), "ids": x["ids"][i].tolist()} for i in range(ROWS)]})
    assert status == 200 and len(rows["predictions"]) == ROWS
    close_to([r["scores"] for r in rows["predictions"]], want["scores"])
    status, columns = post(served["rest"], "/v1/models/tiny/versions/1:predict",
                           {"inputs": {k: v.tolist() for k, v in x.items()}})
    assert status == 200
    close_to(columns["outputs"]["scores"], want["scores"])
    close_to(columns["outputs"]["value"], want["value"])
    status, body = get(served["rest"], "/v1/models/tiny")
    assert status == 200 and json.loads(body)["model_version_status"][0]["state"] == "AVAILABLE"
    status, body = get(served["rest"], "/v1/models/tiny/metadata")
    signature = json.loads(body)["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"]["ids"]["dtype"] == "DT_INT32" and signature["outputs"]["scores"]["tensor_shape"][
        "dim"][1]["size"] == "4"


def test_tf_serving_grpc_stubs_predict_and_read_metadata_and_status(served):
    import grpc
    from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                         predict_pb2, prediction_service_pb2_grpc)

    x = inputs(seed=1)
    want = served["model"](x)["scores"].numpy()
    with grpc.insecure_channel(f"127.0.0.1:{served['grpc']}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tiny"
        for name, array in x.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(array))
        response = stub.Predict(request, timeout=30)
        close_to(tf.make_ndarray(response.outputs["scores"]), want)
        assert response.model_spec.version.value == 1
        request.output_filter.append("value")
        assert list(stub.Predict(request, timeout=30).outputs) == ["value"]
        metadata = stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec={"name": "tiny"}, metadata_field=["signature_def"]), timeout=30)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        metadata.metadata["signature_def"].Unpack(signatures)
        assert sorted(signatures.signature_def["serving_default"].inputs) == ["features", "ids"]
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "tiny"}), timeout=30)
        assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
        request.model_spec.name = "nope"
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        request.model_spec.name, request.model_spec.version.value = "tiny", 7  # the repository's NotServed, mapped
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert "version 7 is not being served" in refused.value.details()


def test_tritonclient_over_http_json_and_binary_and_over_grpc(served):
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    x = inputs(seed=2)
    want = served["model"](x)["scores"].numpy()
    client = triton_http.InferenceServerClient(f"127.0.0.1:{served['rest']}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tiny")
    assert client.get_model_metadata("tiny")["platform"] == "tensorflow_savedmodel"
    assert client.get_model_config("tiny")["max_batch_size"] == 16
    for binary in (False, True):
        sent = []
        for name, datatype in (("features", "FP32"), ("ids", "INT32")):
            sent.append(triton_http.InferInput(name, list(x[name].shape), datatype))
            sent[-1].set_data_from_numpy(x[name], binary_data=binary)
        result = client.infer("tiny", sent, outputs=[triton_http.InferRequestedOutput("scores", binary_data=binary)])
        close_to(result.as_numpy("scores"), want)
    client.close()
    grpc_client = triton_grpc.InferenceServerClient(f"127.0.0.1:{served['grpc']}")
    assert grpc_client.is_model_ready("tiny") and grpc_client.get_model_metadata("tiny").platform == \
        "tensorflow_savedmodel"
    sent = []
    for name, datatype in (("features", "FP32"), ("ids", "INT32")):
        sent.append(triton_grpc.InferInput(name, list(x[name].shape), datatype))
        sent[-1].set_data_from_numpy(x[name])
    close_to(grpc_client.infer("tiny", sent).as_numpy("scores"), want)
    grpc_client.close()


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "not valid JSON"),
    ({"instances": [[1.0, 2.0]]}, 400, "model takes 2 named inputs"),
    ({"inputs": {"features": [[1.0] * 5], "ids": [[1, 2, 3]]}}, 400, "'features' has shape [1, 5]"),
    ({"inputs": {"features": [["a"] * 6], "ids": [[1, 2, 3]]}}, 400, "holds strings where the model takes float32"),
    ({"inputs": {"features": [[1.0] * 6], "ids": [[1.5, 2, 3]]}}, 400, "holds fractions where the model takes int32"),
    ({"inputs": {"features": [[1.0] * 6, [1.0]], "ids": [[1, 2, 3]]}}, 400, "is ragged"),
    ({"inputs": {"features": [[1.0] * 6], "ids": [[1, 2, 2 ** 64]]}}, 400, "a number out of the range of int32"),
    ({"signature_name": "other", "inputs": {"features": [[1.0] * 6], "ids": [[1, 2, 3]]}}, 400,
     "serving signature name 'other' not found"),
    (b"[" * 5000, 400, "nests 5000 levels deep"),
])
def test_a_bad_rest_request_is_a_400_that_says_what_and_the_server_goes_on(served, body, status, message):
    got, answer = post(served["rest"], "/v1/models/tiny:predict", body)
    assert got == status and message in answer["error"], answer
    ok, _ = post(served["rest"], "/v1/models/tiny:predict", {"inputs": {k: v.tolist() for k, v in inputs().items()}})
    assert ok == 200


def test_unknown_models_versions_and_paths_are_404_and_a_body_over_the_limit_413(served):
    assert post(served["rest"], "/v1/models/nope:predict", {"instances": []})[0] == 404
    status, answer = post(served["rest"], "/v1/models/tiny/versions/7:predict", {"instances": []})
    assert status == 404 and "version 7 is not being served" in answer["error"]
    assert get(served["rest"], "/v1/nothing/here")[0] == 404
    assert get(served["rest"], "/v2/models/nope")[0] == 404
    big = json.dumps({"inputs": {"features": [[0.5] * 6] * 8000, "ids": [[1, 2, 3]] * 8000}}).encode()
    status, answer = post(served["rest"], "/v1/models/tiny:predict", big)
    assert status == 413 and "more than the 262,144" in answer["error"]
    bad_v2 = {"inputs": [{"name": "features", "shape": [1, 6], "datatype": "FP32", "data": [1.0] * 5}]}
    status, answer = post(served["rest"], "/v2/models/tiny/infer", bad_v2)
    assert status == 400 and "5 values for shape [1, 6]" in answer["error"]
    assert post(served["rest"], "/v1/models/tiny:predict", {"inputs": {k: v.tolist() for k, v in
                                                                        inputs().items()}})[0] == 200


def test_a_client_that_hangs_up_mid_body_is_counted_and_logs_no_traceback(served, caplog):
    """A load run stopped mid-request left the server's log full of aiohttp tracebacks (ConnectionResetError)."""
    import logging
    import socket

    caplog.set_level(logging.DEBUG)
    with socket.create_connection(("127.0.0.1", served["rest"]), timeout=10) as conn:
        conn.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"inst")
    deadline = time.time() + 10
    while time.time() < deadline and '499"' not in get(served["rest"], "/monitoring/prometheus/metrics")[1].decode():
        time.sleep(0.1)
    assert 'code="499"' in get(served["rest"], "/monitoring/prometheus/metrics")[1].decode()
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    assert post(served["rest"], "/v1/models/tiny:predict", {"inputs": {k: v.tolist() for k, v in
                                                                        inputs().items()}})[0] == 200


def test_metrics_count_requests_by_code_and_batches_at_tf_servings_path(served):
    post(served["rest"], "/v1/models/tiny:predict", {"inputs": {k: v.tolist() for k, v in inputs().items()}})
    post(served["rest"], "/v1/models/tiny:predict", {"instances": []})  # a 400 of its own, whatever ran before
    status, text = get(served["rest"], "/monitoring/prometheus/metrics")
    text = text.decode()
    assert status == 200 and 'tfperf_requests_total{code="200",model="tiny",protocol="rest"}' in text
    assert 'tfperf_requests_total{code="400",model="tiny",protocol="rest"}' in text
    assert "tfperf_batch_size_count" in text and "tfperf_queue_depth" in text and "tfperf_compute_latency" in text


def test_answers_finished_together_wake_the_event_loop_once_and_a_cancelled_wait_cancels_the_request():
    """Issue 49: the batcher's answers reach the event loop a group at a time (asyncio.wrap_future wrote to the
    loop's self-pipe once per request); results, errors and cancellation still reach each side."""
    import asyncio
    from concurrent.futures import Future

    from tfperf.serving.server import Handback

    loop = asyncio.new_event_loop()
    wakes = []
    real = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *args: (wakes.append(args), real(*args))[1]
    handback = Handback(loop)
    batch = [Future() for _ in range(16)]
    waiters = [handback.wrap(f) for f in batch]
    failed, dropped = Future(), Future()
    failed_waiter, dropped_waiter = handback.wrap(failed), handback.wrap(dropped)

    def one_batch():  # as the batch thread ends a batch: every request's answer, one after another
        for i, future in enumerate(batch):
            future.set_result(i)
        failed.set_exception(ValueError("the model failed"))

    thread = threading.Thread(target=one_batch)
    thread.start()
    thread.join()
    try:
        assert loop.run_until_complete(asyncio.gather(*waiters)) == list(range(16)) and len(wakes) == 1
        with pytest.raises(ValueError, match="the model failed"):
            loop.run_until_complete(failed_waiter)
        dropped_waiter.cancel()  # a deadline passed: the batcher must drop the request, not run it
        loop.run_until_complete(asyncio.sleep(0))  # the waiter's callbacks run on the loop
        assert dropped.cancelled() and not dropped.set_running_or_notify_cancel()
    finally:
        loop.close()


def test_a_full_queue_answers_503_at_once_and_a_passed_deadline_drops_the_request():
    """A model that takes 0.2 s a call, one request at a time, two allowed to wait: the next is refused at
    once; a gRPC-like deadline shorter than the wait is a 504 and the request never runs."""
    import asyncio

    from tfperf.serving.batcher import Batcher, BatchingOptions
    from tfperf.serving.repository import Version
    from tfperf.serving.server import Server, ServerOptions
    from tfperf.serving.protocols.tensors import RequestError

    ran = []

    def make_call(size):
        def call(arrays):
            ran.append(arrays["x"][0, 0])
            time.sleep(0.2)
            return {"y": arrays["x"]}
        return call

    batcher = Batcher(make_call, BatchingOptions(max_batch_size=1, batch_timeout_micros=0, max_enqueued_batches=2))
    version = Version(1, None, "onnx", "model", (), (), batcher)

    class Repository:
        name, current = "slow", version

    server = Server(Repository, ServerOptions())

    async def scenario():
        first = asyncio.ensure_future(server.infer(version, {"x": np.full((1, 1), 1.0)}))
        await asyncio.sleep(0.05)  # running now; two may wait
        waiting = [asyncio.ensure_future(server.infer(version, {"x": np.full((1, 1), v)})) for v in (2.0, 3.0)]
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        with pytest.raises(RequestError) as full:
            await server.infer(version, {"x": np.full((1, 1), 4.0)})
        refused_in = time.perf_counter() - started
        await asyncio.gather(first, *waiting)
        with pytest.raises(RequestError) as late:
            blocker = asyncio.ensure_future(server.infer(version, {"x": np.full((1, 1), 5.0)}))
            await asyncio.sleep(0.01)
            await server.infer(version, {"x": np.full((1, 1), 6.0)}, deadline_s=0.05)
        await blocker
        return full.value, refused_in, late.value

    full, refused_in, late = asyncio.run(scenario())
    batcher.close()
    assert full.status == 503 and "queue is full" in str(full) and refused_in < 0.05
    assert late.status == 504 and 6.0 not in ran and ran == [1.0, 2.0, 3.0, 5.0]


def test_a_new_version_swaps_in_under_load_without_a_failed_request_and_a_broken_one_is_refused(served):
    repository, root = served["repository"], served["root"]
    x = inputs(seed=3)
    body = {"inputs": {k: v.tolist() for k, v in x.items()}}
    failures, answers, stop = [], [], threading.Event()

    def load():
        while not stop.is_set():
            status, answer = post(served["rest"], "/v1/models/tiny:predict", body)
            (answers if status == 200 else failures).append(answer)

    with ThreadPoolExecutor(4) as pool:
        for _ in range(4):
            pool.submit(load)
        time.sleep(0.3)
        broken = root / "3"
        export_version(root.parent, tiny_model(3), 3)  # then broken: its weights replaced by nonsense
        for variables in broken.glob("variables/variables.data*"):
            variables.write_bytes(b"\0" * variables.stat().st_size)
        repository.poll()
        assert repository.current.number == 1 and "version 3 refused" in served["log"][-1]
        shutil.rmtree(broken)
        second = tiny_model(2)
        export_version(root.parent, second, 2)
        repository.poll()
        time.sleep(0.3)
        stop.set()
    assert failures == [] and repository.current.number == 2 and len(answers) > 20
    close_to(answers[-1]["outputs"]["scores"], second(x)["scores"].numpy())
    served["model"] = second  # what the server answers with from now on
    assert get(served["rest"], "/v1/models/tiny/versions/1")[0] == 200  # its state: END
    status, body = get(served["rest"], "/v1/models/tiny")
    states = {s["version"]: s["state"] for s in json.loads(body)["model_version_status"]}
    assert states == {"2": "AVAILABLE", "1": "END", "3": "END"}


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_command_answers_then_drains_on_sigterm_losing_no_accepted_request(tmp_path, workers):
    """The real command: a cookbook net exported and served by one process, or by two worker processes sharing
    free ports, their metrics counted together whichever worker is scraped; requests in flight when SIGTERM
    arrives are all answered, and the process exits 0."""
    proc = subprocess.Popen([sys.executable, "-m", "tfperf", "serve", "mlp", "--port", "0", "--grpc-port", "0",
                             "--workers", str(workers), "--max-batch-size", "16", "--batch-timeout-micros", "400000",
                             "--drain-timeout", "20"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
                                 "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        lines = [proc.stdout.readline() for _ in range(workers)]  # one per worker, the same ports
        assert all(line.startswith("serving mlp version 1") for line in lines), (lines, proc.poll())
        ports = {int(line.split("http://127.0.0.1:")[1].split(" ")[0]) for line in lines}
        assert len(ports) == 1 and ("2 worker processes" in lines[0]) == (workers == 2)
        port = ports.pop()
        body = {"instances": [[0.25] * 512]}
        # Each request on a connection of its own: the serve process deals them to the workers in turn.
        for _ in range(12):
            assert post(port, "/v1/models/mlp:predict", {"instances": [[0.5] * 512]})[0] == 200
        status, text = get(port, "/monitoring/prometheus/metrics")
        counted = re.search(rb'tfperf_requests_total\{code="200",model="mlp",protocol="rest"\} ([\d.]+)', text)
        assert status == 200 and counted and float(counted[1]) == 12.0, text[-1500:]
        if workers == 2:  # 8 connections held open: 4 on each worker (SO_REUSEPORT's hash split them unevenly)
            import http.client

            import psutil

            held = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(8)]
            for connection in held:
                connection.request("GET", "/v1/models/mlp")
                assert connection.getresponse().status == 200
            served_by = [sum(c.laddr.port == port and c.status == "ESTABLISHED" for c in child.net_connections("tcp"))
                         for child in psutil.Process(proc.pid).children()
                         if "resource_tracker" not in " ".join(child.cmdline())]
            for connection in held:
                connection.close()
            assert sorted(served_by) == [4, 4], served_by

        def timed():
            status, answer = post(port, "/v1/models/mlp:predict", body)
            return status, answer, time.perf_counter()

        with ThreadPoolExecutor(8) as pool:  # 8 requests wait 0.4 s for their batch to fill: SIGTERM finds them
            futures = [pool.submit(timed) for _ in range(8)]
            time.sleep(0.15)
            proc.send_signal(signal.SIGTERM)
            signalled = time.perf_counter()
            results = [f.result() for f in futures]
        assert [r[0] for r in results] == [200] * 8 and all(done > signalled for _, _, done in results)
        assert all(len(answer["predictions"]) == 1 for _, answer, _ in results)
        assert post(port, "/v1/models/mlp:predict", body)[0] is None  # not accepted any more
        assert proc.wait(60) == 0
        stderr = proc.stderr.read()
        assert "stopping: no new requests" in stderr and "Traceback" not in stderr
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("url, options", [
    ("http://127.0.0.1:{rest}/v1/models/tiny", {}), ("http://127.0.0.1:{rest}/v1/models/tiny", {"columnar": True}),
    ("http://127.0.0.1:{rest}/v2/models/tiny", {}), ("http://127.0.0.1:{rest}/v2/models/tiny", {"json": True}),
    ("grpc://127.0.0.1:{grpc}/tiny", {}), ("grpc+v2://127.0.0.1:{grpc}/tiny", {}),
])
def test_load_url_clients_read_the_metadata_and_get_the_models_answers_in_every_protocol(served, url, options):
    from tfperf.serving.endpoint import RemoteServer, parse_url

    endpoint = parse_url(url.format(**served), **options)
    x = inputs(seed=4)
    with RemoteServer(endpoint, connections=4) as remote:
        assert [t.name for t in remote.inputs] == ["features", "ids"] and remote.inputs[1].dtype == "int32"
        answered = remote.answer(x)
        futures = [remote.submit(x) for _ in range(8)]
        assert [f.result(30) for f in futures] == [None] * 8
    close_to(answered["scores"], served["model"](x)["scores"].numpy())


def test_sigterm_mid_load_url_writes_the_partial_report_and_exits_143(served, tmp_path, monkeypatch):
    """Issue 73: SIGTERM to `load --url` ended "terminated by signal 11" with no report. Stopped as the SIGTERM
    handler stops it (flags.Stopped) once the closed loop has run, it writes what it measured, marked PARTIAL."""
    from test_deploy import tfperf

    from tfperf import flags
    from tfperf.serving.measure import Bench

    def stopped(self, *args, **kwargs):
        raise flags.Stopped()

    monkeypatch.setattr(Bench, "open_loop_of", stopped)
    out = tmp_path / "run"
    code, printed, err = tfperf("load", "--url", f"http://127.0.0.1:{served['rest']}/v1/models/tiny", "--quick",
                                "--concurrency", "1", "--out", out)
    report = (out / "report.md").read_text()
    assert code == 143 and "load: PARTIAL (stopped by SIGTERM)" in printed, (code, printed, err[-2000:])
    assert report.splitlines()[2] == "**PARTIAL: stopped by SIGTERM.** What follows is what was measured before it " \
                                     "stopped."
    assert "| 1 |" in report and (out / "load.jsonl").exists()  # the closed loop's level, measured before the stop


def every_dtype() -> dict[str, np.ndarray]:
    """Two rows of each dtype TF Serving and KServe v2 name, at the ends of their ranges (uint64 past 2**63, float16
    halves, UTF-8 text and an empty string): what a client reads back must be these values, as these dtypes."""
    from tfperf.serving.protocols.tfserving_rest import TF_TYPES

    found = {}
    for dtype in TF_TYPES:
        if dtype == "string":
            found[dtype] = np.array([["h\u00e9llo".encode(), b"", b"a b"]] * 2, dtype=object)
        elif dtype == "bool":
            found[dtype] = np.array([[True, False, True]] * 2)
        elif np.dtype(dtype).kind in "iu":
            info = np.iinfo(dtype)
            found[dtype] = np.array([[info.min, info.max, 7]] * 2, dtype=dtype)
        else:
            found[dtype] = np.array([[-1.5, 0.25, 65504.0 if dtype == "float16" else 1e30]] * 2, dtype=dtype)
    return found


@pytest.fixture(scope="module")
def echo_of_every_dtype(tmp_path_factory):
    """A SavedModel that answers each of its 13 inputs (one per dtype) as an output, served in this process."""

    from tfperf.serving.configs import ServingConfig
    from tfperf.serving.repository import Repository
    from tfperf.serving.server import ServerOptions, ServerThread

    specs = {f"x_{d}": tf.TensorSpec((None, 3), tf.as_dtype(d), name=f"x_{d}") for d in every_dtype()}
    echo = tf.Module()
    echo.serve = tf.function(lambda x: {f"y_{k[2:]}": tf.identity(v) for k, v in x.items()}, input_signature=[specs])
    root = tmp_path_factory.mktemp("dtypes") / "echo"
    tf.saved_model.save(echo, str(root / "1"), signatures={"serving_default": echo.serve.get_concrete_function()})
    repository = Repository("echo", root, ServingConfig("savedmodel"), log=lambda line: None)
    repository.start()  # an export made elsewhere: run once on zeros, and on empty strings for its string input
    running = ServerThread(repository, ServerOptions(port=0, grpc_port=0))
    yield {"rest": running.ports[0], "grpc": running.ports[1]}
    running.close()
    repository.close()


@pytest.mark.parametrize("url, options", [
    ("http://127.0.0.1:{rest}/v1/models/echo", {}), ("http://127.0.0.1:{rest}/v1/models/echo", {"columnar": True}),
    ("http://127.0.0.1:{rest}/v2/models/echo", {}), ("http://127.0.0.1:{rest}/v2/models/echo", {"json": True}),
    ("grpc://127.0.0.1:{grpc}/echo", {}), ("grpc+v2://127.0.0.1:{grpc}/echo", {}),
])
def test_every_dtype_goes_through_the_server_and_load_urls_client_and_comes_back_as_itself(
        echo_of_every_dtype, url, options):
    """Sent by `load --url`'s client, answered by tfperf serve, read back by the client: each of the 13 dtypes as
    itself in every protocol (the client sent strings as JSON it could not write, and as a KServe datatype it did
    not know; it read TF Serving's JSON answers as int64 and float64 whatever the model's dtype; the server could
    not load a SavedModel with a string input that no tfperf export had checked)."""
    from tfperf.serving.endpoint import RemoteServer, parse_url

    sent = {f"x_{d}": a for d, a in every_dtype().items()}
    with RemoteServer(parse_url(url.format(**echo_of_every_dtype), **options), connections=1) as remote:
        assert {t.name: t.dtype for t in remote.inputs} == {f"x_{d}": d for d in every_dtype()}
        got = remote.answer(sent)
    for dtype, array in every_dtype().items():
        back = np.asarray(got[f"y_{dtype}"])
        assert back.dtype == array.dtype and np.array_equal(back, array), (dtype, back.dtype, back.tolist())


def test_a_url_that_names_no_endpoint_is_one_line():
    from tfperf.serving.endpoint import EndpointError, RemoteServer, parse_url

    for url, message in (("ftp://x:1/v1/models/m", "not an endpoint URL"), ("http://x:1/models/m", "names no model"),
                         ("https://x:1/v1/models/m", "https is not measured")):
        with pytest.raises(EndpointError, match=message):
            parse_url(url)
    with pytest.raises(EndpointError, match="did not answer its metadata"):
        RemoteServer(parse_url("http://127.0.0.1:9/v1/models/m"), timeout_s=2)


def test_the_ready_line_is_read_back_by_the_function_beside_the_one_that_writes_it():
    from tfperf.serving.ready import ready_line, ready_ports

    line = ready_line("cnn", 3, "onnx, 2 workers", "127.0.0.1", (8501, 8500), "[4242]")
    assert line.startswith("serving cnn version 3 (onnx, 2 workers) on http://127.0.0.1:8501 ") and line.endswith("\n")
    assert ready_ports(line) == (8501, 8500) and ready_ports(ready_line("m", 1, "savedmodel", "::1", (1, 2))) == (1, 2)
    assert ready_ports("tfperf serve: loading cnn version 3") is None


MESSAGES = """
import json, sys
import numpy as np
from tfperf.serving import endpoint, grpc_services  # the server's services and load --url's client
from tfperf.serving.protocols import tfserving_grpc as g
from tfperf.serving.protocols.tensors import Tensor

made = [g.encode_request("m", 3, {"x": np.arange(6, dtype=np.int64).reshape(2, 3)}),
        g.metadata_response("m", 3, "serving_default", [Tensor("x", "int64", (None, 3))], [Tensor("y", "float32", (None,))]),
        g.status_response({3: "AVAILABLE"})]
print(json.dumps({"tensorflow": "tensorflow" in sys.modules, "made": [m.SerializeToString().hex() for m in made]}))
"""


def test_tf_servings_messages_are_made_without_tensorflow_and_read_by_its_own_classes():
    """A server of an ONNX or LiteRT export, and load --url's client, make TF Serving's messages without starting
    TensorFlow (5 s of CPU and 640 MB a process here); what they make parses with tensorflow-serving-api's classes."""
    from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, predict_pb2

    found = json.loads(subprocess.run([sys.executable, "-c", MESSAGES], capture_output=True, text=True,
                                      check=True).stdout)
    assert found["tensorflow"] is False
    request, metadata, status = (bytes.fromhex(h) for h in found["made"])
    request = predict_pb2.PredictRequest.FromString(request)
    assert request.model_spec.name == "m" and request.model_spec.version.value == 3
    np.testing.assert_array_equal(tf.make_ndarray(request.inputs["x"]), np.arange(6).reshape(2, 3))
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert get_model_metadata_pb2.GetModelMetadataResponse.FromString(metadata).metadata["signature_def"].Unpack(
        signatures)
    x = signatures.signature_def["serving_default"].inputs["x"]
    assert x.dtype == tf.int64.as_datatype_enum and [d.size for d in x.tensor_shape.dim] == [-1, 3]
    versions = get_model_status_pb2.GetModelStatusResponse.FromString(status).model_version_status
    assert [(v.version, v.state) for v in versions] == [(3, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]


def test_every_dtype_tf_servings_metadata_names_is_read_as_itself_and_an_unknown_one_refused():
    """Read back what tfperf serve's TF Serving metadata writes: each of its 13 dtypes comes back as itself (the
    client kept a table of 10, and read a uint16, uint32 or uint64 input as float32, silently)."""
    from tfperf.serving.protocols import tfserving_rest
    from tfperf.serving.protocols.tensors import EndpointError, Tensor

    inputs = [Tensor(f"x_{dtype}", dtype, (None, 3)) for dtype in tfserving_rest.TF_TYPES]
    found = tfserving_rest.metadata("m", 1, "serving_default", inputs, [Tensor("y", "float32", (None,))])
    read, outputs = tfserving_rest.metadata_tensors(found)
    assert [(t.name, t.dtype, t.shape) for t in read] == sorted((t.name, t.dtype, (None, 3)) for t in inputs)
    assert [t.dtype for t in outputs] == ["float32"]
    found["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]["x_uint16"]["dtype"] = "DT_COMPLEX64"
    with pytest.raises(EndpointError, match="tensor 'x_uint16' has type DT_COMPLEX64, which tfperf cannot send"):
        tfserving_rest.metadata_tensors(found)


def test_the_deploy_files_parse_with_each_serving_systems_own_schema(served, tmp_path):
    """serve.json, TF Serving's models.config (its ModelServerConfig proto) and batching parameters, Triton's
    config.pbtxt (its ModelConfig proto, as tritonclient ships it) beside the model, a KServe InferenceService,
    and the replicas for a target rate, from a measured winner (ONNX) and the best SavedModel configuration."""
    import yaml
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2
    from tritonclient.grpc import model_config_pb2

    from tfperf.measure.load import LoadLevel
    from tfperf.serving.batcher import BatchingOptions
    from tfperf.serving.configs import ServingConfig
    from tfperf.serving.deploy_files import write_deploy
    from tfperf.serving.report import Found
    from tfperf.serving.search import Budget, Swept

    exports = {"savedmodel": served["root"] / "1",
               "onnx": export_version(tmp_path / "exports", served["model"], 1, fmt="onnx")}
    level = lambda rate: LoadLevel("concurrency 4", (0.002,) * rate, 1.0)  # noqa: E731  (rate requests in 1 s)
    onnx = Swept(ServingConfig("onnx", 2, 2, BatchingOptions(max_batch_size=16, batch_timeout_micros=500)), (level(900),))
    saved = Swept(ServingConfig("savedmodel", None, 1, BatchingOptions(max_batch_size=8, idle_runs_now=True)),
                  (level(500),))
    found = Found("tiny", Budget(), swept=[saved, onnx], open_loop={onnx.config.name: (800.0, 900.0)})
    readme = write_deploy(found, onnx, exports, tmp_path / "out", name="tiny", cores=2, rate=800.0, target_rate=5000)
    out = tmp_path / "out"
    assert json.loads((out / "serve.json").read_text())["runtime"] == "onnx"
    config = text_format.Parse((out / "deploy/tfserving/models.config").read_text(),
                               model_server_config_pb2.ModelServerConfig())
    assert config.model_config_list.config[0].name == "tiny" and config.model_config_list.config[0].base_path
    batching = (out / "deploy/tfserving/batching_parameters.txt").read_text()
    assert "max_batch_size { value: 8 }" in batching and "batch_timeout_micros { value: 0 }" in batching
    command = (out / "deploy/tfserving/command.sh").read_text()
    # The thread flags as measured: this SavedModel configuration ran TensorFlow's own pools (0: its own choice),
    # and its best level within the budget had 4 requests in flight.
    assert "--enable_batching" in command and "--tensorflow_intra_op_parallelism=0" in command
    assert "--tensorflow_inter_op_parallelism=0" in command and "--rest_api_num_threads=4" in command
    assert "# intra- and inter-op 0: TensorFlow's own pools" in command
    triton = text_format.Parse((out / "deploy/triton/model_repository/tiny/config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert triton.platform == "onnxruntime_onnx" and triton.max_batch_size == 16
    assert triton.instance_group[0].count == 2 and triton.dynamic_batching.max_queue_delay_microseconds == 500
    assert {i.name: list(i.dims) for i in triton.input} == {"features": [6], "ids": [3]}
    assert triton.parameters["intra_op_thread_count"].string_value == "2"
    assert (out / "deploy/triton/model_repository/tiny/1/model.onnx").stat().st_size > 1000
    service = yaml.safe_load((out / "deploy/kserve/inferenceservice.yaml").read_text())
    assert service["kind"] == "InferenceService" and service["spec"]["predictor"]["model"]["resources"][
        "requests"]["cpu"] == "2"
    assert any("**9 replica(s)**" in line for line in readme)  # 5000 / (800 * 0.7) = 8.9, rounded up


def independent_loadgen(port: int, body: bytes, rate: float, seconds: float, budget_s: float, out) -> tuple[str, float]:
    """LoadGen's Server scenario driving plain http.client connections from a thread pool, written apart from
    tfperf's client: (LoadGen's verdict, its p50 in ms), read from its own summary."""
    import http.client
    import re
    import threading

    import mlperf_loadgen as lg

    pool, local = ThreadPoolExecutor(16), threading.local()

    def send(query):
        if not hasattr(local, "connection"):
            local.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        local.connection.request("POST", "/v1/models/tiny:predict", body, {"Content-Type": "application/json"})
        answer = local.connection.getresponse()
        answer.read()
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query.id, 0, 0)])

    sut = lg.ConstructSUT(lambda queries: [pool.submit(send, q) for q in queries], lambda: None)
    qsl = lg.ConstructQSL(16, 16, lambda samples: None, lambda samples: None)
    settings = lg.TestSettings()
    settings.scenario, settings.mode = lg.TestScenario.Server, lg.TestMode.PerformanceOnly
    settings.server_target_qps, settings.server_target_latency_ns = rate, int(budget_s * 1e9)
    settings.server_target_latency_percentile = 0.9
    settings.min_duration_ms, settings.min_query_count = int(seconds * 1e3), int(rate * seconds)
    logs = lg.LogSettings()
    logs.log_output.outdir, logs.log_output.copy_summary_to_stdout = str(out), False
    lg.StartTestWithLogSettings(sut, qsl, settings, logs)
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    pool.shutdown()
    summary = (out / "mlperf_log_summary.txt").read_text()
    return re.search(r"Result is : (\w+)", summary)[1], int(re.search(r"50.00 percentile latency \(ns\)\s*: (\d+)",
                                                                      summary)[1]) / 1e6


def test_load_url_reports_p99_with_its_interval_and_a_verdict_and_agrees_with_an_independent_loadgen_client(
        served, tmp_path):
    """answer_endpoint (what `tfperf load --url` runs) on the running server over REST and gRPC: p99 with its
    interval, LoadGen's verdict, the server's own split of the time read from its metrics, the client's ceiling.
    Then LoadGen at one rate through tfperf's client and through plain http.client: the same verdict and p50."""
    from tfperf.serving import h2load, loadgen
    from tfperf.serving.endpoint import RemoteServer, parse_url
    from tfperf.serving.measure import Sizes
    from tfperf.serving.search import Budget
    from tfperf.serving.report import SPLIT_HEADER
    from tfperf.serving.url_load import answer_endpoint, metrics_url_of

    tiny = Sizes(window_s=0.1, max_windows=3, warmup_s=0.05, probe_s=0.4, probes=2, validation_s=0.6,
                 max_concurrency=4, concurrency_factor=4)
    x = inputs(rows=16, seed=5)
    requests = [{k: v[i:i + 1] for k, v in x.items()} for i in range(16)]
    metrics = f"http://127.0.0.1:{served['rest']}/monitoring/prometheus/metrics"
    # One protocol through tfperf's Python client, the other through h2load (C) where it is installed.
    clients = {"rest": "python", "grpc": "h2load" if h2load.available() else "python"}
    for url in (f"http://127.0.0.1:{served['rest']}/v1/models/tiny", f"grpc://127.0.0.1:{served['grpc']}/tiny"):
        endpoint = parse_url(url)
        assert metrics_url_of(endpoint, None) == (metrics if endpoint.protocol == "rest" else None)
        out = tmp_path / endpoint.protocol
        out.mkdir()
        found = answer_endpoint(endpoint, requests, out, budget=Budget(0.05), quick=False, sizes=tiny,
                                metrics_url=metrics, client=clients[endpoint.protocol])
        report = (out / "report.md").read_text()
        assert found.validations and re.search(r"LoadGen Server validation of .* \*\*(VALID|INVALID)", report), report
        assert re.search(r"\| 1 \| \d+ \| [\d.]+ \([\d.]+-[\d.]+\) \|", report)  # p50 with its interval
        assert found.client_ceiling is not None and "an echo of its answers: the client's ceiling" in report
        records = [json.loads(line) for line in (out / "load.jsonl").read_text().splitlines()]
        levels = [r for r in records if r["table"] == f"closed loop: {endpoint.name}"]
        assert levels and all(r["metrics"]["p99_ci95_ms"] and r["metrics"]["server_latency_ms"] > 0 for r in levels)
        # Who sent the requests, and what each cost them, beside every level (the echo's too).
        sent = [r["metrics"] for r in records if r["table"].startswith("closed loop")]
        assert all(m["client"] == clients[endpoint.protocol] and m["client_cpu_us_per_request"] > 0 for m in sent)
        assert f"({clients[endpoint.protocol]}, " in report and " left) |" in report
        assert SPLIT_HEADER in report  # the server's split, returned with its sweep, is in the level table too
    rate, budget = 150.0, Budget(0.05, 90.0)
    body = json.dumps({"instances": [{k: v[0].tolist() for k, v in requests[0].items()}]}).encode()
    # The two clients take turns beside the other worker's load, and a verdict is a threshold: a burst on the other
    # worker during one turn flips it (CI once: ours VALID at p99 33 ms, the independent INVALID). One pair that
    # disagrees is run again; a client that reads differently fails both pairs.
    for turn in range(2):
        with RemoteServer(parse_url(f"http://127.0.0.1:{served['rest']}/v1/models/tiny"), connections=16) as remote:
            ours = loadgen.run(lambda i: remote.submit(requests[i % 16]), 16, rate=rate, latency_s=budget.latency_s,
                               percentile=budget.percentile, duration_s=2.0, min_queries=300)
        (tmp_path / f"independent{turn}").mkdir()
        verdict, p50_ms = independent_loadgen(served["rest"], body, rate, 2.0, budget.latency_s,
                                              tmp_path / f"independent{turn}")
        if (verdict == "VALID") == ours.valid:
            break
    assert (verdict == "VALID") == ours.valid, (verdict, ours, (tmp_path / "independent1/mlperf_log_summary.txt")
                                                 .read_text()[:1500])
    # The medians agree at the resolution the verdict is judged at (a fifth of the 50 ms budget): the two runs take
    # turns, not rounds, beside the other worker's load, and a ratio of medians moved with it (7.3 ms against 3.6 ms
    # once, a fresh clone's run, where both verdicts agreed).
    assert abs(ours.percentiles_ms["50.00"] - p50_ms) <= budget.latency_s * 1e3 / 5, (ours.percentiles_ms, p50_ms)


def test_h2loads_level_names_why_requests_failed_and_a_server_that_is_gone_is_a_result_not_a_crash():
    from tfperf.serving import h2load
    from tfperf.serving.endpoint import parse_url
    from tfperf.serving.measure import Bench, Sizes
    from tfperf.serving.search import Budget

    said = ("requests: 40 total, 40 started, 40 done, 37 succeeded, 3 failed, 0 errored, 0 timeout\n"
            "status codes: 37 2xx, 0 3xx, 0 4xx, 3 5xx\n")
    assert h2load.failures(said, [200] * 37 + [503] * 3) == "h2load: 3 failed, 0 errored, 0 timed out; 3 answered 503"
    assert h2load.failures(said.replace("37 succeeded, 3 failed", "40 succeeded, 0 failed"), [200] * 40) is None
    # gRPC goes framed (no compression, big-endian length) to the service's path, over HTTP/2.
    endpoint = parse_url("grpc://127.0.0.1:9/tiny")
    url, headers, body, http1 = h2load.wire_request(endpoint, SimpleNamespace(SerializeToString=lambda: b"abc"))
    assert url.endswith("/tensorflow.serving.PredictionService/Predict") and not http1
    assert body == b"\x00\x00\x00\x00\x03abc" and headers["content-type"] == "application/grpc"
    # Requests of several shapes keep the Python client, which cycles through them; h2load sends one body.
    one = {"x": np.zeros((1, 4), np.float32)}
    bench = Bench({}, [one, {"x": np.zeros((1, 6), np.float32)}], Budget(0.05), Sizes(), None, Path("."))
    assert not bench.one_shape and Bench({}, [one, one], Budget(0.05), Sizes(), None, Path(".")).one_shape
    if not h2load.available():
        pytest.skip("h2load is not installed (apt-get install nghttp2-client): its run is not tried")
    gone = parse_url("http://127.0.0.1:9/v1/models/tiny")
    level = h2load.closed_loop(gone, (b"{}", {}), 2, window_s=0.05, max_windows=2, warmup_s=0.02, timeout_s=5)
    assert level.errors and "h2load" in level.errors[0] and level.count == 0 and level.client == "h2load"


def test_the_dealer_opens_the_port_when_a_worker_is_ready_and_deals_connections_in_turn_to_those_alive():
    import socket

    from tfperf.serving import handoff

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    channels = [handoff.pair() for _ in range(3)]
    dealer = handoff.Dealer(listener, [ours for ours, _ in channels])
    try:
        with pytest.raises(ConnectionRefusedError):  # no worker ready: the port is not open
            socket.create_connection(("127.0.0.1", port), timeout=5)
        for _, theirs in channels[:2]:
            handoff.say_ready(theirs)
        clients = []
        for _ in range(50):  # the dealer opens the port on its own thread
            try:
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                break
            except ConnectionRefusedError:
                time.sleep(0.02)
        clients += [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]

        def take(channel, count):
            got = []
            while len(got) < count:
                got += handoff.receive(channel) or []
            return got

        first, second = take(channels[0][1], 3), take(channels[1][1], 3)
        first[0].sendall(b"ping")  # a connection handed over is the client's own
        peer = next(c for c in clients if c.getsockname() == first[0].getpeername())
        assert peer.recv(4) == b"ping"
        channels[0][1].close()  # the first worker is gone: the next connections all go to the second
        more = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        assert len(take(channels[1][1], 2)) == 2
        deadline = time.monotonic() + 5  # the dealer's thread counts a connection just after handing it over
        while dealer.dealt < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dealer.dealt == 8
        channels[2][1].setblocking(False)
        assert handoff.receive(channels[2][1]) == []  # never ready: dealt nothing
        for sock in first + second + clients + more:
            sock.close()
    finally:
        dealer.close()
        dealer.close()  # twice: nothing more
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
