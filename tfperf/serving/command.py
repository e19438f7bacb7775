"""`tfperf load MODEL`: how many requests per second this machine answers within a latency budget, and how.

MODEL is what `export` and `doctor` take (exported here to each runtime asked, with the one conversion
path and its check) or an export folder of any format. The run: the two anchors a TensorFlow user
has today (the SavedModel signature one request at a time, and TensorFlow's BatchFunction), then the
search (`tfperf.serving.search`) over runtime x threads x instances x batching, the best three
searched again in open loop with LoadGen; then the best served by `tfperf serve` and measured through
sockets (`tfperf.serving.through_socket`), the best of those validated by a LoadGen Server run through
its socket (the answer; without sockets, `--in-process`, the in-process winner is validated); LoadGen's
Offline ceiling and its own overhead; then report.md, load.jsonl (`tfperf compare` reads it), serve.json,
deploy/ and a chart in --out. Ctrl-C or SIGTERM stops the measuring and still writes the report, marked
partial.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

from tfperf import extras, flags
from tfperf.flags import UserError

RECIPE = "load"
QUICK_GOAL_S = 180
RUNTIMES = ("savedmodel", "litert", "onnx")


def latency(text: str) -> float:
    """A latency budget in seconds, from `10ms`, `500us`, `0.01s` or a bare number of milliseconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|us|s)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"must be a latency such as 10ms, 500us or 0.01s, got {text!r}")
    value = float(match[1]) * {"ms": 1e-3, "us": 1e-6, "s": 1.0, None: 1e-3}[match[2]]
    if not 1e-6 <= value <= 60:
        raise argparse.ArgumentTypeError(f"must be between 1us and 60s, got {text!r}")
    return value


def percentile(text: str) -> float:
    """A percentile between 50 and 99.99."""
    value = flags.positive_float(text)
    if not 50 <= value <= 99.99:
        raise argparse.ArgumentTypeError(f"must be a percentile between 50 and 99.99, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """Comma-separated whole numbers, each at least 1 (concurrency levels)."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1 or values[-1] > 1024:
        raise argparse.ArgumentTypeError(f"must be numbers from 1 to 1024 such as 1,2,4,8, got {text!r}")
    return values


def length_range(text: str) -> tuple[int, int]:
    """LO:HI, two lengths with 1 <= LO <= HI."""
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise argparse.ArgumentTypeError(f"must be LO:HI token lengths such as 16:128, got {text!r}")
    return int(match[1]), int(match[2])


def runtime_list(text: str) -> list[str]:
    """Comma-separated runtimes, each one of RUNTIMES."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in RUNTIMES]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"choose from {','.join(RUNTIMES)}, got {text!r}")
    return list(dict.fromkeys(values))


def add_command(sub) -> None:
    """Add `load` to the `tfperf` subcommands."""
    p = sub.add_parser("load", help="serving under load: requests/s within a latency budget, and the configuration "
                                    "(runtime, threads, instances, batching) that gives the most",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="a .keras or .h5 file, a SavedModel folder, module:factory, a cookbook "
                                            "net, or an export folder (SavedModel, LiteRT or ONNX); or --url")
    p.add_argument("--url", help="measure a running endpoint instead: http://HOST:PORT/v1/models/NAME (TF Serving "
                                 "REST), grpc://HOST:PORT/NAME (TF Serving gRPC), http://HOST:PORT/v2/models/NAME "
                                 "(KServe v2, Triton), grpc+v2://HOST:PORT/NAME")
    p.add_argument("--columnar", action="store_true", help="with a TF Serving REST --url: send {\"inputs\": ...} "
                                                           "(columnar) instead of {\"instances\": [...]}")
    p.add_argument("--json-tensors", action="store_true",
                   help="with a KServe v2 HTTP --url: JSON tensors instead of binary ones")
    p.add_argument("--metrics-url", metavar="URL",
                   help="with --url: the endpoint's Prometheus metrics, to split latency into queue and model (default: "
                        "tfperf serve's path on an HTTP endpoint's port; Triton's: http://HOST:8002/metrics)")
    p.add_argument("--latency-budget", type=latency, default=0.010, metavar="TIME",
                   help="the latency the percentile must stay within (default 10ms)")
    p.add_argument("--percentile", type=percentile, default=99.0, help="which percentile (default 99)")
    p.add_argument("--concurrency", type=int_list, metavar="N,N",
                   help="closed-loop levels for the anchors and the winner (default: doubling while within budget)")
    p.add_argument("--target-rate", type=flags.positive_float, metavar="R",
                   help="how many replicas of the winner carry R requests/s within the budget (in deploy/README.md)")
    p.add_argument("--rate", type=flags.positive_float, action="append", metavar="R",
                   help="also run the winner at this LoadGen Server rate (requests/s); repeat for a sweep")
    p.add_argument("--runtimes", type=runtime_list, default=list(RUNTIMES), metavar="R,R",
                   help=f"runtimes to export to and search ({','.join(RUNTIMES)})")
    p.add_argument("--input", metavar="FILE.npz", help="requests: rows of real inputs (arrays named after the "
                                                       "inputs); default: synthetic rows as the doctor makes them")
    p.add_argument("--input-shape", action="append", metavar="[NAME=]D,D",
                   help="sizes (without the batch axis) to make requests at where the model leaves them free "
                        "(default 32)")
    p.add_argument("--lengths", type=length_range, metavar="LO:HI",
                   help="requests of a Transformer at lengths drawn uniformly from LO to HI tokens (the batcher then "
                        "pads a batch to its longest, or to --length-buckets)")
    p.add_argument("--length-buckets", type=int_list, metavar="N,N",
                   help="also try batching requests by length bucket, each padded to its bucket (e.g. 32,64,128)")
    p.add_argument("--signature", help="the SavedModel signature to serve")
    p.add_argument("--trust", action="store_true", help="load a model whose ops are off the inspection allowlist")
    p.add_argument("--quick", action="store_true", help="short windows and probes, a smaller space: a small model "
                                                        f"in under {QUICK_GOAL_S // 60} minutes on 2 cores")
    p.add_argument("--out", help="folder for report.md, load.jsonl and the chart (default load/<model name>/)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--in-process", action="store_true",
                   help="answer in process only: the best are not then served by tfperf serve and measured through "
                        "sockets (faster; the figure is then the ceiling, not what a deployment gets)")
    p.add_argument("--server-process", action="store_true",
                   help="serve from a process of its own, the clients staying in this one: no client thread waits for "
                        "the server's GIL (requests then cross a pipe, as they would a socket); the SavedModel is "
                        "then searched over TensorFlow's intra-op threads too, a process per count")
    p.set_defaults(func=cmd_load)


def _requests(args, out: Path, say):
    """(exports by runtime, one-row requests, export commands, runtimes not exported and why, what the requests
    are when it needs saying)."""
    from tfperf.deploy.errors import InputError
    from tfperf.deploy.formats import format_of
    from tfperf.deploy.inputs import fit_inputs, input_roles, make_inputs, read_sample, sample_inputs
    from tfperf.deploy.inspection import check_safe
    from tfperf.deploy.layout import load
    from tfperf.deploy.loader import load_subject, parse_input_shapes
    from tfperf.serving.configs import one_row_requests

    rows = 64
    sample = read_sample(args.input) if args.input else None
    path = Path(args.model)
    if path.is_dir() and format_of(path) is not None and format_of(path).name != "savedmodel":
        # A LiteRT or ONNX export is served as it is, in its own runtime (a SavedModel is a model: exported to each).
        check_safe(path, trust=args.trust)
        runtime = format_of(path).name
        runner = load(path, signature=args.signature)
        specs = [(s.name, s.dtype, s.shape[1:]) for s in runner.inputs]
        if sample is None:
            if any(d is None for _, _, shape in specs for d in shape):
                raise InputError("the export leaves input sizes unknown: pass real requests with --input FILE.npz")
            import numpy as np

            rng = np.random.default_rng(args.seed)
            sample = {n: rng.normal(size=(rows, *shape)).astype(dtype) for n, dtype, shape in specs}
        inputs = fit_inputs(sample, specs, "--input")
        return {runtime: path}, one_row_requests(inputs), {}, {}, ""
    subject = load_subject(args.model, input_shapes=parse_input_shapes(args.input_shape or []), trust=args.trust,
                           signature=args.signature)
    if args.lengths and not subject.free:
        raise InputError("--lengths is for a model that leaves its sequence axis free: this one takes fixed sizes")
    how = ""
    if args.lengths or (sample is not None and subject.free and "mask" in input_roles(subject).values()):
        requests, how = variable_length_requests(subject, rows, args.lengths, sample, args.seed)
        say(how)
    else:
        inputs = sample_inputs(subject, sample) if sample is not None else make_inputs(subject, rows, seed=args.seed)
        requests = one_row_requests(inputs)
    from tfperf.deploy.commands import loading_flags

    exports, commands, failed = export_runtimes(subject, out, args.runtimes, sample,
                                                [*(["--sample", args.input] if args.input else []),
                                                 *loading_flags(args)], say)
    return exports, requests, commands, failed, how


def variable_length_requests(subject, count: int, lengths: tuple[int, int] | None, sample, seed: int):
    """Requests of a Transformer, each a row at its own length: drawn uniformly from `lengths` (synthetic rows,
    tokens and an all-ones mask), or the sample's padded rows cut at the length their mask gives; and what
    they are, in a line for the report."""
    import numpy as np

    from tfperf.deploy.inputs import PAD, input_roles, make_inputs, sample_inputs

    roles = input_roles(subject)
    named = ", ".join(f"{n} ({r})" for n, r in roles.items())
    if lengths is None:
        arrays = sample_inputs(subject, sample)
        mask = next(n for n, r in roles.items() if r == "mask")
        found = [int(np.count_nonzero(row)) for row in arrays[mask]]
        requests = [{n: a[i:i + 1, :max(found[i], 1)] if a.ndim >= 2 else a[i:i + 1] for n, a in arrays.items()}
                    for i in range(len(found))]
        return requests, (f"requests: the {len(requests)} rows of --input, each cut at the length its {mask!r} gives "
                          f"({min(found)}-{max(found)} tokens); inputs: {named}; padding holds {PAD}")
    rng = np.random.default_rng(seed)
    drawn = rng.integers(lengths[0], lengths[1] + 1, size=count)
    requests = [make_inputs(subject.at(int(n)), 1, seed=seed + i, lengths=[int(n)]) for i, n in enumerate(drawn)]
    return requests, (f"requests: {count} rows of {lengths[0]}-{lengths[1]} tokens drawn uniformly; inputs: {named}; "
                      f"padding holds {PAD}")


def export_runtimes(subject, out: Path, runtimes, sample=None, flags_after: list[str] = (),
                    say=lambda what: None) -> tuple[dict, dict, dict]:
    """The model exported to the SavedModel (the anchors serve it) and each runtime, with the one conversion path
    and its check: (folders by runtime, the `tfperf export` argv of each, runtimes that failed and why)."""
    from tfperf.deploy.errors import ExportError, ModelError
    from tfperf.deploy.layout import export_subject
    from tfperf.extras import MissingExtra

    exports, commands, failed = {}, {}, {}
    for runtime in dict.fromkeys(["savedmodel", *runtimes]):
        say(f"exporting to {runtime}")
        try:
            exports[runtime] = export_subject(subject, out / "exports", name=runtime, format=runtime,
                                              sample=sample).path
            commands[runtime] = ["export", subject.source, "--format", runtime, *flags_after]
        except (ExportError, ModelError, MissingExtra) as exc:  # a runtime not installed here is skipped, said
            failed[runtime] = str(exc)
    if "savedmodel" not in exports:
        raise ModelError(f"{subject.source} does not export as a SavedModel: {failed['savedmodel']}")
    return exports, commands, failed


def cmd_load(args: argparse.Namespace) -> int:
    """Serve the model under load, search the configurations, write the report."""
    from tfperf.deploy.errors import ExportError, InputError, ModelError

    started = time.perf_counter()
    # Its clients, servers, deploy files (TF Serving's and Triton's protos) and open-loop runs are extras.
    extras.require("serve", "tfperf load")
    extras.require("loadgen", "tfperf load")
    if (args.model is None) == (args.url is None):
        raise UserError("give a MODEL to serve and measure, or --url of a running endpoint (not both)")
    if (args.columnar or args.json_tensors or args.metrics_url) and not args.url:
        raise UserError("--columnar, --json-tensors and --metrics-url are for a --url endpoint")
    if args.url:
        from tfperf.serving.url_load import load_url

        found, out = load_url(args, started, RECIPE)
        _print_summary(found, out / "report.md", out)
        return 130 if found.partial else 0
    out = Path(args.out) if args.out else None
    if out is not None and (out / f"{RECIPE}.jsonl").exists():
        raise UserError(f"{out} already holds a load run: pass another --out, or remove it")
    name = Path(args.model).name if Path(args.model).exists() else args.model.rpartition(":")[2]
    out = out or Path("load") / (name or "model")
    if (out / f"{RECIPE}.jsonl").exists():
        raise UserError(f"{out} already holds a load run: pass another --out, or remove it")
    created = not out.exists()

    def say(what: str) -> None:
        print(f"load: {what} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    try:
        out.mkdir(parents=True, exist_ok=True)
        exports, requests, commands, failed, how = _requests(args, out, say)
    except BaseException as exc:
        if created:  # refused before anything was measured: nothing is left on disk
            shutil.rmtree(out, ignore_errors=True)
        if isinstance(exc, (ModelError, InputError, ExportError)):
            raise UserError(str(exc)) from None
        raise
    from tfperf.serving.search import Budget

    found = answer(args.model, exports, requests, out, budget=Budget(args.latency_budget, args.percentile),
                   quick=args.quick, runtimes=args.runtimes, commands=commands, failed=failed,
                   concurrency=args.concurrency, rates=args.rate or (), record_args=vars(args), say=say,
                   server_process=args.server_process, target_rate=args.target_rate,
                   length_buckets=args.length_buckets, requests_note=how, through_socket=not args.in_process,
                   trust=args.trust)
    report = out / "report.md"
    _print_summary(found, report, out)
    return 130 if found.partial else 0


def searched_threads(runtimes, cores: int, every_count: bool, server_process: bool) -> dict[str, tuple]:
    """The intra-op thread counts searched per runtime: 1 and every core (`every_count`), else every core.
    TensorFlow fixes its pool when a process starts, so the SavedModel is searched over threads only with
    `server_process` (a process per setting); here it runs at TensorFlow's default (None)."""
    counts = tuple(sorted({1, cores})) if every_count else (cores,)
    return {r: counts if r != "savedmodel" or (server_process and every_count) else (None,) for r in runtimes}


def answer(model: str, exports: dict, requests: list, out: Path, *, budget, quick: bool, runtimes=RUNTIMES,
           commands: dict | None = None, failed: dict | None = None, concurrency: list[int] | None = None,
           rates=(), record_args: dict | None = None, say=lambda what: None, server_process: bool = False,
           target_rate: float | None = None, length_buckets=None, requests_note: str = "",
           through_socket: bool = False, trust: bool = False):
    """The whole serving question on exported runtimes: the anchors, the search, the best re-searched in open loop,
    the winner validated, LoadGen's ceiling and overhead; report.md, load.jsonl and the chart in `out`. Ctrl-C or
    SIGTERM stops the measuring and still writes them, marked partial. `server_process`: the servers run in a
    process of their own, the clients (closed loop and LoadGen) in this one. `through_socket`: the best are then
    served by `tfperf serve` and measured through sockets (`tfperf.serving.through_socket`), and the best of those
    is the answer, validated through its socket. Returns the `Found`."""
    from tfperf.records.jsonl import Recorder
    from tfperf.serving.measure import ANCHOR, Bench, Sizes, batch_function_config
    from tfperf.serving.report import Found, write_report
    from tfperf.serving.remote import ServerProcess
    from tfperf.serving.search import Space, Swept, ranked, search

    started = time.perf_counter()
    sizes = Sizes.quick() if quick else Sizes()
    rec = Recorder(RECIPE, {k: v for k, v in (record_args or {"model": model}).items() if k != "func"})
    process = ServerProcess() if server_process else None
    bench = Bench(exports, requests, budget, sizes, rec, out / "loadgen", server_process=process)
    found = Found(model, budget, export_commands=commands or {}, not_exported=failed or {},
                  server_process=server_process, requests_note=requests_note)
    cores = os.cpu_count() or 1
    try:
        runtimes = [r for r in runtimes if r in exports] or list(exports)
        if "savedmodel" in exports:
            say("the anchors: the signature one request at a time, and TensorFlow's BatchFunction")
            found.swept.append(bench.sweep(ANCHOR, concurrency))
            found.swept.append(bench.sweep(batch_function_config(cores), concurrency))
        threads = searched_threads(runtimes, cores, sizes.all_thread_counts, server_process)
        from tfperf.serving.batcher import sequence_length

        varied = len({sequence_length(r) for r in requests}) > 1
        policies = (({"pad_variable_length_inputs": True},) + (({"length_buckets": tuple(length_buckets)},)
                                                                if length_buckets else ())) if varied else ({},)
        space = Space(tuple(runtimes), threads, instances=sizes.instances, batch_sizes=sizes.batch_sizes,
                      timeouts_us=(1000,), length_policies=policies)

        def sweep(config):
            known = next((s for s in found.swept if s.config == config), None)
            if known is not None:
                return known
            say(f"closed loop: {config.name}")
            result = bench.sweep(config)
            found.swept.append(result)
            return result

        search(sweep, space, budget)
        best = ranked(found.swept, budget)
        anchors = [s for s in found.swept[:2] if not s.dropped and s.rate_within(budget) > 0]
        for s in {s.config.name: s for s in [*best[:3], *anchors]}.values():
            say(f"open loop (LoadGen Server): {s.config.name}")
            found.open_loop[s.config.name] = bench.open_loop_of(s)
        if best:
            winner = max(best[:3], key=lambda s: found.open_loop.get(s.config.name, (0.0,))[0])
            name = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(model).stem if Path(model).exists() else
                          model.rpartition(":")[2]).strip("-") or "model"
            if through_socket:
                from tfperf.serving import through_socket as socket_phase

                # The in-process answer first (the open-loop winner), then the rest by closed-loop rate.
                configs = socket_phase.candidates([winner, *[s for s in best if s is not winner]], cores,
                                                  sizes.socket_candidates)
                found.sockets, found.through, best_server = socket_phase.sweep_through(
                    bench, configs, exports, name, out / "servers", budget, trust=trust, say=say)
            if found.through is not None:
                through = found.through
                bracket, found.validations, found.client_ceiling, echo = socket_phase.open_and_validate(
                    bench, through, best_server, name, say=say)
                found.open_loop[through.swept.config.name] = bracket
                if echo is not None:
                    found.open_loop[found.client_ceiling.config.name] = echo
                found.validated = through.swept.config
                deployed = Swept(through.config, through.swept.levels)
                measured = f", measured through a socket over {through.swept.config.name.rpartition(', through ')[2]}"
                offered = bracket[0] or through.rate_within(budget)
            else:
                rate = bench.validation_rate(winner, found.open_loop.get(winner.config.name))
                say(f"validation (LoadGen Server) of {winner.config.name} at {rate:.0f}/s")
                found.validated = winner.config
                found.validations = bench.validate(winner.config, rate)
                deployed, measured = winner, ""
                offered = found.open_loop.get(winner.config.name, (0.0,))[0] or winner.rate_within(budget)
            for extra in rates:
                say(f"LoadGen Server at {extra:.0f}/s")
                with bench.server(winner.config) as server:
                    result = bench.offered(server, extra, seconds=sizes.probe_s, min_queries=100)
                rec.add(f"open loop: {winner.config.name}", f"rate {extra:.0f}/s (--rate)", result.metrics(),
                        primary="completed_qps", lower_is_better=False, versus_first=False)
            say("LoadGen Offline ceiling and SingleStream overhead")
            found.ceiling = bench.ceiling(winner.config, winner.rate_within(budget))
            found.overhead = bench.generator_overhead(winner.config)
            from tfperf.serving.deploy_files import write_deploy

            say("the files that deploy it: serve.json and deploy/")
            valid = [v for v in found.validations if v.valid]
            found.deploy = write_deploy(found, deployed, exports, out, name=name, cores=cores, measured=measured,
                                        rate=valid[-1].target_qps if valid else offered, target_rate=target_rate)
    except (KeyboardInterrupt, flags.Stopped):  # SIGTERM raises Stopped through the command line's handler
        found.partial = "interrupted (Ctrl-C or SIGTERM)"
    finally:
        bench.close()
        if process is not None:
            process.close()
        found.outputs_vary = bench.outputs_vary
        found.splits = bench.splits
        found.seconds = time.perf_counter() - started
        inside = max((s.rate_within(budget) for s in found.swept if not s.dropped), default=0.0)
        for t in found.sockets:  # beside the in-process best, the ceiling
            rec.add("through a socket", t.swept.config.name, {
                **t.config.settings(), "protocol": t.protocol, "requests_per_s_within_budget": t.rate_within(budget),
                "in_process_best_requests_per_s": inside, **({"dropped": t.swept.dropped} if t.swept.dropped else {})},
                primary="requests_per_s_within_budget", lower_is_better=False, versus_first=False)
        for s in found.swept:
            if not s.dropped:
                rec.add("configurations", s.config.name, {**s.config.settings(), "requests_per_s_within_budget":
                        s.rate_within(budget), **({"open_loop_requests_per_s": found.open_loop[s.config.name][0]}
                                                  if s.config.name in found.open_loop else {})},
                        primary="requests_per_s_within_budget", lower_is_better=False, versus_first=False)
        rec.save(out)
        write_report(found, out)
    return found


def _print_summary(found, report: Path, out: Path) -> None:
    import shlex

    from tfperf.serving.report import serve_command, serve_line, winner
    from tfperf.serving.search import ranked

    budget = found.budget
    best = ranked(found.swept, budget)
    if found.partial:
        print(f"load: PARTIAL ({found.partial})")
    through = found.through
    if through is not None:
        bracket = found.open_loop.get(through.swept.config.name)
        print(f"best within {budget} through a socket: {through.swept.config.name}: "
              f"{through.rate_within(budget):.0f} requests/s closed loop"
              + (f", {bracket[0]:.0f}/s offered (LoadGen Server)" if bracket and bracket[0] else ""))
    if best:
        b = winner(found, best)
        bracket = found.open_loop.get(b.config.name)
        print(("in process, no socket (the ceiling)" if through is not None else f"best within {budget}")
              + f": {b.config.name}: {b.rate_within(budget):.0f} requests/s closed loop"
              + (f", {bracket[0]:.0f}/s offered (LoadGen Server)" if bracket and bracket[0] else ""))
    for v in found.validations:
        print(f"LoadGen Server at {v.target_qps:.0f}/s: {'VALID' if v.valid else 'INVALID: ' + '; '.join(v.reasons)}")
    echo = found.client_ceiling
    if echo is not None and not echo.dropped:
        print(f"the client's ceiling (an echo of the answers, measured the same way): "
              f"{echo.rate_within(budget):.0f} requests/s closed loop")
    if through is not None:  # the export, for TF Serving or Triton; and tfperf serve, which exports by itself
        command = found.export_commands.get(through.config.runtime)
        for line in ([f"tfperf {shlex.join(command)}"] if command else []) + [serve_line(found, str(out / "serve.json"))]:
            print(f"  {line}")
    elif best and best[0].config.runtime != "endpoint":
        b = winner(found, best)
        for line in serve_command(b.config, found.export_commands.get(
                "savedmodel" if b.config.runtime == "tf-batch-function" else b.config.runtime)):
            print(f"  {line}")
    if not best and through is None and not found.partial:
        print(f"no configuration meets {budget}: see {report}")
    print(f"report: {report}\nrecords: {out / (RECIPE + '.jsonl')}")
