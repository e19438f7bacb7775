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
import shutil
import sys
import time
from pathlib import Path

from tfperf import extras, flags
from tfperf.flags import UserError, int_list, latency, length_range, percentile
from tfperf.records import units
from tfperf.serving.pipeline import RECIPE, answer, export_runtimes, variable_length_requests
from tfperf.serving.runtimes import RUNTIMES, export_of

QUICK_GOAL_S = 180


def runtime_list(text: str) -> list[str]:
    """Comma-separated runtimes, each one of RUNTIMES."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in values if v not in RUNTIMES]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"choose from {','.join(RUNTIMES)}, got {text!r}")
    return list(dict.fromkeys(values))


def add_command(sub) -> None:
    """Add `load` to the `tfperf` subcommands."""
    from tfperf.serving import h2load

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
    h2load.add_client_flag(p)
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


def cmd_load(args: argparse.Namespace) -> int:
    """Serve the model under load, search the configurations, write the report."""
    from tfperf.serving import h2load
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
        return (143 if 'SIGTERM' in found.partial else 130) if found.partial else 0
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
                   trust=args.trust, client=h2load.client_for(args.client))
    report = out / "report.md"
    _print_summary(found, report, out)
    return (143 if 'SIGTERM' in found.partial else 130) if found.partial else 0


def _print_summary(found, report: Path, out: Path) -> None:
    import shlex

    from tfperf.serving.report import no_valid_rate, not_validated, serve_command, serve_line, winner
    from tfperf.serving.search import ranked

    budget = found.budget
    best = ranked(found.swept, budget)
    if found.partial:
        print(f"load: PARTIAL ({found.partial})")
    through = found.through
    if through is not None:
        bracket = found.open_loop.get(through.swept.config.name)
        print(f"best within {budget} through a socket: {through.swept.config.name}: "
              f"{units.rate(through.rate_within(budget))} requests/s closed loop"
              + (f", {units.rate(bracket[0])}/s offered (LoadGen Server)" if bracket and bracket[0] else ""))
    if best:
        b = winner(found, best)
        bracket = found.open_loop.get(b.config.name)
        print(("in process, no socket (the ceiling)" if through is not None else f"best within {budget}")
              + f": {b.config.name}: {units.rate(b.rate_within(budget))} requests/s closed loop"
              + (f", {units.rate(bracket[0])}/s offered (LoadGen Server)" if bracket and bracket[0] else ""))
    for v in found.validations:
        verdict = "VALID" if v.valid else "INVALID: " + "; ".join(v.reasons)
        print(f"LoadGen Server at {units.rate(v.target_qps)}/s: {verdict}")
    if found.validations and not any(v.valid for v in found.validations):
        print(no_valid_rate(found).replace("**", ""))
    if found.not_validated:
        print(not_validated(found))
    echo = found.client_ceiling
    if echo is not None and not echo.dropped:
        print(f"the client's ceiling (an echo of the answers, measured the same way): "
              f"{units.rate(echo.rate_within(budget))} requests/s closed loop")
    if through is not None:  # the export, for TF Serving or Triton; and tfperf serve, which exports by itself
        command = found.export_commands.get(through.config.runtime)
        for line in ([f"tfperf {shlex.join(command)}"] if command else []) + [serve_line(found, str(out / "serve.json"))]:
            print(f"  {line}")
    elif best and best[0].config.runtime != "endpoint":
        b = winner(found, best)
        for line in serve_command(b.config, found.export_commands.get(export_of(b.config.runtime))):
            print(f"  {line}")
    if not best and through is None and not found.partial:
        print(f"no configuration meets {budget}: see {report}")
    print(f"report: {report}\nrecords: {out / (RECIPE + '.jsonl')}")
