"""The load pipeline: a model's exports to each runtime, its requests, and `answer`, the whole serving question
measured and written (report.md, load.jsonl, serve.json, deploy/). `tfperf load` (tfperf.serving.command) turns
its flags into a call here; the doctor's serving question and the recipes call it directly."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from tfperf import flags
from tfperf.serving.runtimes import RUNTIMES

RECIPE = "load"


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
           through_socket: bool = False, trust: bool = False, client: str = "python"):
    """The whole serving question on exported runtimes: the anchors, the search, the best re-searched in open loop,
    the winner validated, LoadGen's ceiling and overhead; report.md, load.jsonl and the chart in `out`. Ctrl-C or
    SIGTERM stops the measuring and still writes them, marked partial. `server_process`: the servers run in a
    process of their own, the clients (closed loop and LoadGen) in this one. `through_socket`: the best are then
    served by `tfperf serve` and measured through sockets (`tfperf.serving.through_socket`), and the best of those
    is the answer, validated through its socket; `client` sends their closed loops ("python" or "h2load"). Returns
    the `Found`."""
    from tfperf.records.jsonl import Recorder
    from tfperf.serving.measure import ANCHOR, Bench, Sizes, batch_function_config
    from tfperf.serving.report import Found, write_report
    from tfperf.serving.remote import ServerProcess
    from tfperf.serving.search import Space, Swept, ranked, search

    started = time.perf_counter()
    sizes = Sizes.quick() if quick else Sizes()
    rec = Recorder(RECIPE, {k: v for k, v in (record_args or {"model": model}).items() if k != "func"})
    process = ServerProcess() if server_process else None
    bench = Bench(exports, requests, budget, sizes, rec, out / "loadgen", server_process=process, client=client)
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
                bracket, validation, found.client_ceiling, echo = socket_phase.open_and_validate(
                    bench, through, best_server, name, say=say)
                found.validations, found.not_validated = validation
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
                found.validations, found.not_validated = bench.validate(winner.config, rate)
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
            found.overhead = bench.generator_overhead(winner.config, winner.levels[0].throughput)
            from tfperf.serving.deploy_files import write_deploy

            say("the files that deploy it: serve.json and deploy/")
            valid = [v for v in found.validations if v.valid]
            found.deploy = write_deploy(found, deployed, exports, out, name=name, cores=cores, measured=measured,
                                        rate=valid[-1].target_qps if valid else offered, target_rate=target_rate)
    except (KeyboardInterrupt, flags.Stopped) as exc:  # SIGTERM raises Stopped through the command line's handler
        found.partial = f"stopped by {'Ctrl-C' if isinstance(exc, KeyboardInterrupt) else 'SIGTERM'}"
    finally:
        bench.close()
        if process is not None:
            process.close()
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
