"""`tfperf serve MODEL`: the model on real sockets, in the protocols existing clients speak (TF Serving's REST and
gRPC APIs, KServe's v2 over HTTP and gRPC), with the runtime, threads, instances and batching `tfperf load`
chose (`--config serve.json`) or that flags give; a folder of versions is watched and new versions swapped in
after their check; SIGTERM stops accepting, answers what was accepted, and exits 0.

MODEL is what `load`, `export` and `doctor` take: a model (exported first, to the runtime the configuration
names, into --root), an export folder of any format, or a saved_models/<name>/ folder of numbered versions.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from tfperf import extras, flags
from tfperf.flags import UserError
from tfperf.serving import handoff
from tfperf.serving.runtimes import RUNTIMES


def add_command(sub) -> None:
    """Add `serve` to the `tfperf` subcommands."""
    p = sub.add_parser("serve", help="serve a model over HTTP and gRPC for TF Serving's, Triton's and KServe's "
                                     "clients, with the configuration tfperf load chose",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a model (.keras, .h5, SavedModel folder, module:factory, cookbook net), an export "
                                 "folder, or a saved_models/<name>/ folder of numbered versions")
    p.add_argument("--config", metavar="serve.json", help="the configuration `tfperf load` wrote (its winner)")
    p.add_argument("--runtime", choices=RUNTIMES, help="for a model: the format to export and serve (default: "
                                                       "the configuration's, else savedmodel)")
    p.add_argument("--threads", type=flags.positive_int, help="intra-op threads of one call")
    p.add_argument("--instances", type=flags.positive_int, help="threads serving requests (batch threads when batching)")
    p.add_argument("--max-batch-size", type=flags.positive_int, help="batch requests up to this many rows")
    p.add_argument("--batch-timeout-micros", type=flags.non_negative_int,
                   help="how long a batch waits to fill (default 1000 when --max-batch-size is given)")
    p.add_argument("--max-enqueued-batches", type=flags.positive_int, default=None,
                   help="full batches that may wait before requests are refused with 503 (default 100)")
    p.add_argument("--pad-variable-length", action="store_true",
                   help="requests of different lengths (a Transformer's tokens) batched by padding each batch to its "
                        "longest, with zeros (needs --max-batch-size)")
    p.add_argument("--length-buckets", type=_lengths, metavar="N,N",
                   help="or batched by length bucket, each padded to its bucket (e.g. 32,64,128)")
    p.add_argument("--name", help="the model name clients ask for (default: the folder's or the model's)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine "
                                                       "only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=flags.non_negative_int, default=8501, help="HTTP port: TF Serving REST and KServe v2 "
                                                                           "(default 8501; 0: any free one)")
    p.add_argument("--grpc-port", type=flags.non_negative_int, default=8500,
                   help="gRPC port: TF Serving's services and KServe v2's (default 8500; 0: any free one)")
    p.add_argument("--max-request-size", type=flags.byte_size, default=64 * 2**20, metavar="SIZE",
                   help="largest request body, refused before it is read whole (default 64MB)")
    p.add_argument("--drain-timeout", type=flags.positive_float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM, how long requests already accepted may take to finish (default 30)")
    p.add_argument("--poll-seconds", type=flags.positive_float, default=1.0,
                   help="how often a folder of versions is read for new ones (default 1)")
    p.add_argument("--workers", type=flags.positive_int,
                   help="server processes, each with the model, REST connections dealt to them in turn: for a "
                        "model where Python's GIL, not the cores, is the limit (default: the configuration's, else 1)")
    p.add_argument("--root", help="where a model given as a model is exported (default: a temporary folder)")
    p.add_argument("--input-shape", action="append", metavar="[NAME=]D,D",
                   help="sizes to check an export at where the model leaves them free (default 32)")
    p.add_argument("--signature", help="the SavedModel signature to serve")
    p.add_argument("--trust", action="store_true", help="serve a model whose ops are off the inspection allowlist")
    p.set_defaults(func=cmd_serve)


def _lengths(text: str) -> list[int]:
    """Rising lengths, each at least 1."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or values != sorted(set(values)) or values[0] < 1:
        raise argparse.ArgumentTypeError(f"must be rising lengths such as 32,64,128, got {text!r}")
    return values


def configuration(args: argparse.Namespace):
    """The serving configuration: serve.json's, with flags over it."""
    import dataclasses

    from tfperf.serving.batcher import BatchingOptions
    from tfperf.serving.configs import ServingConfig

    config = ServingConfig("savedmodel")
    if args.config:
        try:
            config = ServingConfig.from_json(Path(args.config).read_bytes(), args.config)
        except OSError as exc:
            raise UserError(f"cannot read --config {args.config}: {exc.strerror}") from None
        except ValueError as exc:
            raise UserError(str(exc)) from None
    changed = {k: v for k, v in (("runtime", args.runtime), ("threads", args.threads),
                                 ("instances", args.instances), ("workers", args.workers)) if v}
    batching = config.batching
    if args.max_batch_size:
        batching = BatchingOptions(max_batch_size=args.max_batch_size, batch_timeout_micros=1000
                                   if args.batch_timeout_micros is None else args.batch_timeout_micros)
    elif args.batch_timeout_micros is not None:
        if batching is None:
            raise UserError("--batch-timeout-micros is for batching: give --max-batch-size too")
        batching = dataclasses.replace(batching, batch_timeout_micros=args.batch_timeout_micros, idle_runs_now=False)
    if args.max_enqueued_batches:
        if batching is None:
            raise UserError("--max-enqueued-batches is for batching: give --max-batch-size too")
        batching = dataclasses.replace(batching, max_enqueued_batches=args.max_enqueued_batches)
    if args.pad_variable_length or args.length_buckets:
        if batching is None:
            raise UserError("--pad-variable-length and --length-buckets are for batching: give --max-batch-size too")
        batching = dataclasses.replace(batching, pad_variable_length_inputs=args.pad_variable_length,
                                       length_buckets=tuple(args.length_buckets or ()))
    config = dataclasses.replace(config, batching=batching, **changed)
    most = 4 * (os.cpu_count() or 1)  # each worker loads the model: a serve.json from elsewhere must not fork a horde
    if config.workers > most:
        raise UserError(f"{config.workers} workers is more than 4 per core on this machine ({most}): give fewer "
                        f"(--workers, or serve.json's workers)")
    return config


def source_of(args: argparse.Namespace, config, say) -> tuple[Path, str, Path | None]:
    """(the folder to serve, the model name, a temporary folder to remove at exit or None): a folder of versions
    or an export folder as it is (a SavedModel folder is exported first when another runtime is asked for), a
    model exported first to the configuration's runtime."""
    from tfperf.deploy.errors import ExportError, ModelError
    from tfperf.deploy.formats import format_of, versions
    from tfperf.deploy.layout import describe_check, export_subject
    from tfperf.deploy.loader import load_subject, parse_input_shapes

    path = Path(args.model)
    named = args.name or (path.parent.name if path.name.isascii() and path.name.isdigit() else path.name)
    if path.is_dir() and versions(path) and format_of(path) is None:
        return path, named, None
    fmt = format_of(path) if path.is_dir() else None
    if fmt is not None and (fmt.name != "savedmodel" or config.runtime == "savedmodel"):
        return path, named, None
    try:
        subject = load_subject(args.model, input_shapes=parse_input_shapes(args.input_shape or []), trust=args.trust,
                               signature=args.signature)
        root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="tfperf-serve-"))
        say(f"exporting {subject.source} to {config.runtime} in {root}")
        exported = export_subject(subject, root, name=args.name or subject.name, format=config.runtime)
    except (ModelError, ExportError) as exc:
        raise UserError(str(exc)) from None
    for line in describe_check(exported.metadata):
        say(line)
    return exported.path.parent, args.name or subject.name, None if args.root else root


async def serve(repository, options, say, ready) -> None:
    """Run the server until SIGTERM or SIGINT, then drain and stop."""
    from tfperf.serving.server import Server

    server = Server(repository, options, log=say)
    repository.on_batch = server.record_batch
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        ports = await server.start()
        ready(ports)
        await stop.wait()
        say(f"stopping: no new requests; answering those accepted (up to {options.drain_timeout_s:g} s)")
        started = time.perf_counter()
        await server.stop()
        say(f"stopped after {time.perf_counter() - started:.2f} s of draining")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def worker(args: argparse.Namespace, config_json: str, folder: str, name: str, metrics_dir: str | None = None,
           channel=None) -> int:
    """One server process: load, check, warm, listen, serve until told to stop (`metrics_dir`: where the workers
    of one server keep their Prometheus metrics, so that a scrape of any of them counts them all; `channel`: where
    its REST connections arrive from the process that accepts them)."""
    from tfperf.deploy.errors import ModelError
    from tfperf.serving.configs import ServingConfig
    from tfperf.serving.repository import Repository
    from tfperf.serving.server import ServerOptions, new_event_loop
    from tfperf.serving.ready import ready_line

    config = ServingConfig.from_json(config_json.encode(), "the configuration")
    pid = f"[{os.getpid()}] " if config.workers > 1 else ""

    def say(line: str) -> None:
        print(f"tfperf serve: {pid}{line}", file=sys.stderr, flush=True)

    if config.runtime == "savedmodel" and config.threads:
        import tensorflow as tf  # its pools are fixed when it starts: set before anything runs

        tf.config.threading.set_intra_op_parallelism_threads(config.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    repository = Repository(name, Path(folder), config, trust=args.trust, signature=args.signature, log=say)
    try:
        version = repository.start()
    except ModelError as exc:
        raise UserError(str(exc)) from None
    options = ServerOptions(args.host, args.port, args.grpc_port, args.max_request_size, args.drain_timeout,
                            reuse_port=config.workers > 1, handoff=channel, metrics_dir=metrics_dir)

    def ready(ports: tuple[int, int]) -> None:
        # The millions of objects the runtime, the model and the server made at start live as long as the process:
        # frozen out of the collector, whose full passes over them (set off by the lists each JSON request makes)
        # took 100-150 ms, the p99 of every REST request here. Frozen once listening, not before: the server's
        # modules (aiohttp, grpc), imported as it starts, left 24,580 objects for the collector, and a full pass
        # over them took 7-10 ms every 0.3 s under REST rows: the p99 at one connection. (A version swapped in
        # later leaves its objects to the collector as usual; only what exists now is frozen.)
        gc.collect()
        gc.freeze()
        repository.watch(args.poll_seconds)
        # One write, the newline in it: the workers share stdout, and print writes the end apart.
        print(ready_line(name, version.number, version.config.name, args.host, ports, pid.strip()), end="",
              flush=True)

    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(serve(repository, options, say, ready))
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}: {exc.strerror or exc} (is another server on port "
                        f"{args.port} or {args.grpc_port}? --port 0 takes any free one)") from None
    finally:
        repository.close()
    return 0


def _worker_main(args: argparse.Namespace, config_json: str, folder: str, name: str, metrics_dir: str,
                 channel) -> None:
    # prometheus_client reads this when it is first imported, which happens below, in this process only.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        sys.exit(worker(args, config_json, folder, name, metrics_dir, channel))
    except UserError as exc:
        print(f"tfperf serve: error: {flags.one_line(exc)}", file=sys.stderr, flush=True)
        sys.exit(2)


def reserve_port(host: str, port: int, *, shared: bool = True):
    """A socket bound to `port` (0: a free one) and not listening, held while the workers run: `shared`, with
    SO_REUSEPORT, so that they can bind the same port (gRPC's: connections reach only sockets that listen); else
    the REST port, on which the dealer listens once a worker is ready (handoff.py)."""
    import socket

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    held = socket.socket(family, socket.SOCK_STREAM)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT if shared else socket.SO_REUSEADDR, 1)
    try:
        held.bind((host, port))
    except OSError:
        held.close()
        raise
    return held


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve MODEL until SIGTERM; with workers, in that many processes: this one accepts on the REST port and deals
    the connections to them in turn (handoff.py), and they share the gRPC port."""
    import multiprocessing
    import shutil

    def say(line: str) -> None:
        print(f"tfperf serve: {line}", file=sys.stderr, flush=True)

    extras.require("serve", "tfperf serve")
    config = configuration(args)
    folder, name, temporary = source_of(args, config, say)
    config_json = json.dumps(config.to_json())
    held, metrics_dir = [], None
    try:
        if config.workers == 1:
            return worker(args, config_json, str(folder), name)
        try:
            held = [reserve_port(args.host, args.port, shared=False), reserve_port(args.host, args.grpc_port)]
        except OSError as exc:
            raise UserError(f"cannot listen on {args.host}: {exc.strerror or exc} (is another server on port "
                            f"{args.port} or {args.grpc_port}? --port 0 takes any free one)") from None
        ports = argparse.Namespace(**{**vars(args), "port": held[0].getsockname()[1],
                                      "grpc_port": held[1].getsockname()[1]})
        metrics_dir = tempfile.mkdtemp(prefix="tfperf-serve-metrics-")
        context = multiprocessing.get_context("spawn")  # forking a process that has loaded TensorFlow is unsafe
        channels = [handoff.pair() for _ in range(config.workers)]
        children = [context.Process(target=_worker_main, args=(ports, config_json, str(folder), name, metrics_dir,
                                                               theirs)) for _, theirs in channels]
        dealer = handoff.Dealer(held.pop(0), [ours for ours, _ in channels])

        def stop(*_) -> None:
            dealer.close()  # no new connections; the workers drain theirs
            for child in children:
                if child.is_alive():
                    child.terminate()

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            for child in children:
                child.start()
            for _, theirs in channels:
                theirs.close()  # the worker has its own copy
            for child in children:
                child.join()
        except KeyboardInterrupt:
            for child in children:
                child.join()
        finally:
            signal.signal(signal.SIGTERM, previous)
            dealer.close()
        codes = [c.exitcode for c in children]
        return 0 if all(c in (0, -signal.SIGTERM) for c in codes) else max(abs(c or 0) for c in codes) or 1
    finally:
        for sock in held:
            sock.close()
        for removed in (temporary, metrics_dir):
            if removed is not None:
                shutil.rmtree(removed, ignore_errors=True)
