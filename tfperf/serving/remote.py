"""The server in a process of its own, so that the load generator's Python threads never wait for the
server's GIL (and the server's never wait for theirs): what `tfperf load --server-process` measures.

One child process (started with `spawn`: forking a process that runs TensorFlow is unsafe) serves one
configuration at a time (a SavedModel at a set number of intra-op threads gets a child of its own: TensorFlow
fixes its thread pools when a process starts); requests and answers travel over a pipe, as they would over a
socket to a real server, so the figures include that hop. The child answers each request from its server's own
threads (the batcher's, or a thread per request) and reports its CPU time, so that the clients' share of the
machine is still known.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from tfperf.serving.batcher import Arrays
from tfperf.serving.runtimes import BATCH_FUNCTION


def _serve(connection, intra_op_threads: int | None = None) -> None:
    """The child: build the server it is asked for, answer requests, say its CPU time, until told to quit.
    `intra_op_threads`: TensorFlow's, set before anything runs (they are fixed for a process once it starts)."""
    sending = threading.Lock()
    server = None
    if intra_op_threads is not None:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)

    def send(message: tuple) -> None:
        with sending:
            connection.send(message)

    def answer(request_id: int, future: Future) -> None:
        try:
            send(("answer", request_id, future.result(), None))
        except Exception as exc:  # noqa: BLE001  (a failing request is the client's result, named)
            send(("answer", request_id, None, f"{type(exc).__name__}: {exc}"[:300]))

    while True:
        try:
            message = connection.recv()
        except EOFError:  # the parent went away
            break
        kind = message[0]
        if kind == "request":
            _, request_id, inputs = message
            try:
                server.submit(inputs).add_done_callback(lambda f, i=request_id: answer(i, f))
            except Exception as exc:  # noqa: BLE001
                send(("answer", request_id, None, f"{type(exc).__name__}: {exc}"[:300]))
        elif kind == "open":
            _, config, export, example, signature = message
            try:
                if config.runtime == BATCH_FUNCTION:
                    from tfperf.serving.configs import batch_function_server

                    server = batch_function_server(export, config.batching, example, signature=signature)
                elif config.runtime == "savedmodel" and config.threads is not None:
                    import tensorflow as tf

                    running = tf.config.threading.get_intra_op_parallelism_threads()
                    if running != config.threads:
                        raise ValueError(f"TensorFlow runs {running or 'its default'} intra-op threads in this "
                                         f"process, not {config.threads}: serve it from ServerProcess(intra_op_"
                                         f"threads={config.threads})")
                    server = dataclasses.replace(config, threads=None).server(export)  # the process's pool has them
                else:
                    server = config.server(export)
                send(("opened", None))
            except Exception as exc:  # noqa: BLE001  (the parent names the configuration and drops it)
                send(("opened", f"{type(exc).__name__}: {str(exc)[:200]}"))
        elif kind == "close":
            if server is not None:
                server.close()
                server = None
            send(("closed",))
        elif kind == "cpu":
            send(("cpu", time.process_time()))
        elif kind == "quit":
            break
    if server is not None:
        server.close()


class ServerProcess:
    """A child process that serves one configuration at a time (open one, close it, open the next);
    `intra_op_threads` fixes TensorFlow's pool there, for SavedModel configurations of that many threads."""

    def __init__(self, intra_op_threads: int | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, intra_op_threads), daemon=True,
                                        name="tfperf-server")
        self._process.start()
        child.close()
        self._sending = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._replies: dict[str, list] = {}
        self._reply_ready = threading.Condition()
        self._ids = itertools.count()
        self._reader = threading.Thread(target=self._read, daemon=True, name="tfperf-server-reader")
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                message = self._connection.recv()
            except (EOFError, OSError):
                break
            if message[0] == "answer":
                _, request_id, outputs, error = message
                future = self._pending.pop(request_id)
                if error is None:
                    future.set_result(outputs)
                else:
                    future.set_exception(RuntimeError(f"the server process: {error}"))
            else:
                with self._reply_ready:
                    self._replies.setdefault(message[0], []).append(message[1:])
                    self._reply_ready.notify_all()
        for request_id in list(self._pending):  # the child died: nobody answers these
            self._pending.pop(request_id).set_exception(RuntimeError("the server process ended"))
        with self._reply_ready:
            self._replies.setdefault("ended", []).append(())
            self._reply_ready.notify_all()

    def _send(self, message: tuple) -> None:
        with self._sending:
            self._connection.send(message)

    def _ask(self, message: tuple, reply: str, timeout_s: float = 600.0) -> tuple:
        self._send(message)
        deadline = time.monotonic() + timeout_s
        with self._reply_ready:
            while not self._replies.get(reply):
                if self._replies.get("ended"):
                    raise RuntimeError("the server process ended")
                if not self._reply_ready.wait(max(deadline - time.monotonic(), 0.0)):
                    raise TimeoutError(f"the server process did not answer {message[0]!r} in {timeout_s:.0f} s")
            return self._replies[reply].pop(0)

    def open(self, config: Any, export: Path | str, example: Arrays, signature: str | None = None) -> RemoteServer:
        """The configuration served in the child (a RemoteServer: submit, call, close)."""
        (error,) = self._ask(("open", config, str(export), example, signature), "opened")
        if error:
            raise RuntimeError(error)
        return RemoteServer(self)

    def submit(self, inputs: Arrays) -> Future:
        """Send one request; its Future holds the answer, or why there is none."""
        future: Future = Future()
        request_id = next(self._ids)
        self._pending[request_id] = future
        try:
            self._send(("request", request_id, inputs))
        except (OSError, ValueError):  # the child is gone: the pipe is broken or closed
            # The reader thread may have failed every pending future on the same EOF: whoever pops it answers it.
            if self._pending.pop(request_id, None) is not None:
                future.set_exception(RuntimeError("the server process ended"))
        return future

    def cpu_s(self) -> float:
        """The child's CPU time so far."""
        return self._ask(("cpu",), "cpu")[0]

    def close_server(self) -> None:
        self._ask(("close",), "closed")

    def close(self) -> None:
        """End the child."""
        try:
            self._send(("quit",))
        except (OSError, ValueError):
            pass
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
        self._connection.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteServer:
    """A configuration served by a ServerProcess, with a server's face: submit, call, close."""

    def __init__(self, process: ServerProcess):
        self._process = process

    def submit(self, inputs: Arrays) -> Future:
        return self._process.submit(inputs)

    def __call__(self, inputs: Arrays) -> Arrays:
        return self.submit(inputs).result()

    def cpu_s(self) -> float:
        """The server process's CPU time so far."""
        return self._process.cpu_s()

    def close(self) -> None:
        self._process.close_server()

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
