"""What `tfperf load` found, as report.md and a chart of throughput against the percentile."""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
from pathlib import Path

from tfperf import extras
from tfperf.measure.load import LoadLevel
from tfperf.records import units
from tfperf.serving.configs import ServingConfig
from tfperf.serving.loadgen import LoadGenResult
from tfperf.serving.runtimes import BATCH_FUNCTION, export_of
from tfperf.serving.search import Budget, Swept

GENERATOR_LIMIT = 0.25  # clients using more than this share of the process's CPU compete with the server


@dataclasses.dataclass
class Found:
    """Everything one `tfperf load` run found; filled as it goes, so that an interrupted run still reports."""

    model: str
    budget: Budget
    swept: list[Swept] = dataclasses.field(default_factory=list)
    open_loop: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)  # config name -> bracket
    validations: list[LoadGenResult] = dataclasses.field(default_factory=list)  # each attempt, the last decides
    not_validated: str = ""  # why a validation run was not started (its queries would take too long), if one was not
    validated: ServingConfig | None = None
    overhead: LoadGenResult | None = None
    ceiling: LoadGenResult | None = None
    export_commands: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # runtime -> tfperf export argv
    not_exported: dict[str, str] = dataclasses.field(default_factory=dict)
    partial: str | None = None  # why the run stopped early
    seconds: float = 0.0
    server_process: bool = False  # the servers ran in a process of their own, the clients in this one
    deploy: list[str] = dataclasses.field(default_factory=list)  # deploy/README.md's lines, when written
    requests_note: str = ""  # what the requests were, when it needs saying (lengths, roles of inputs)
    sockets: list = dataclasses.field(default_factory=list)  # through_socket.Through: served by tfperf serve
    through: object = None  # the through_socket.Through that answers (validated through its socket), if any
    client_ceiling: Swept | None = None  # an echo of the answers measured the same way: the client's ceiling
    json_requests: bool = False  # an endpoint's requests travel as JSON text (REST, v2 with --json-tensors)

    @property
    def outputs_vary(self) -> bool | None:
        """False when the model answered every request alike (its answers' agreement then shows nothing)."""
        seen = [s.outputs_vary for s in self.swept if s.outputs_vary is not None]
        return None if not seen else any(seen)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}" if math.isfinite(seconds) else "inf"


def _offered(bracket: tuple[float, float] | None) -> str:
    """What the open-loop probe found: the highest Poisson rate within the budget and the next that missed, or
    that none it tried met the budget ('' when none was probed)."""
    if not bracket:
        return ""
    met, missed = bracket
    if met <= 0:
        return (f"no rate offered as Poisson arrivals met the budget (LoadGen Server; the lowest tried, "
                f"{units.rate(missed)}/s, missed)" if math.isfinite(missed) else "")
    return f"{units.rate(met)} requests/s offered as Poisson arrivals (LoadGen Server" + (
        f"; the next rate tried, {units.rate(missed)}/s, missed)" if math.isfinite(missed) else ")")


def _bracket_cell(bracket: tuple[float, float], unbounded: str = "") -> str:
    """'950 (950-1,100)': the highest rate found within the budget and the bracket up to the next that missed."""
    met, missed = bracket
    if not math.isfinite(missed):
        return f"{units.rate(met)}{unbounded}"
    return f"{units.rate(met)} ({units.rate(met)}-{units.rate(missed)})"


def _ci(level: LoadLevel, p: float) -> str:
    """'3.03 (2.91-3.20)', or the interval said to need more requests than the level answered (a p99 needs about
    300 for its upper end: below that the sample's largest latency does not bound it at 95%)."""
    if not level.latencies_s:
        return "none answered"
    low, high = level.percentile_ci_s(p)
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{_ms(level.percentile_s(p))} (too few requests for an interval)"
    return f"{_ms(level.percentile_s(p))} ({_ms(low)}-{_ms(high)})"


def winner(found: Found, usable: list[Swept]) -> Swept:
    """The answer: the configuration LoadGen validated, else the best open-loop rate, else the best closed-loop."""
    for s in usable:
        if found.validated is not None and s.config == found.validated:
            return s
    searched = [s for s in usable if s.config.name in found.open_loop]
    if searched:
        return max(searched, key=lambda s: found.open_loop[s.config.name][0])
    return usable[0]


def serve_command(config: ServingConfig, export_command: list[str] | None) -> list[str]:
    """How to serve the winner: the export line and the batcher's settings in code."""
    lines = []
    if export_command:
        lines.append("tfperf " + shlex.join(export_command))
    if config.runtime == BATCH_FUNCTION:
        b = config.batching
        lines.append(f"tf.nondifferentiable_batch_function(num_batch_threads={b.num_batch_threads}, max_batch_size="
                     f"{b.max_batch_size}, batch_timeout_micros={b.batch_timeout_micros}) around the signature, "
                     f"inside a tf.function")
        return lines
    if config.runtime == "savedmodel" and config.threads:
        lines.append(f"tf.config.threading.set_intra_op_parallelism_threads({config.threads})  # before TensorFlow "
                     f"runs anything")
    threads = f", threads={config.threads}" if config.threads and config.runtime != "savedmodel" else ""
    load = f"tfperf.deploy.load(EXPORT{threads})"
    if config.batching is None:
        lines.append(f"{config.instances} serving thread(s), each calling {load} one request at a time "
                     f"(tfperf.serving.batcher.unbatched)")
    else:
        b = config.batching
        lines.append(f"Batcher(lambda size: {load}, BatchingOptions(max_batch_size={b.max_batch_size}, "
                     f"batch_timeout_micros={b.batch_timeout_micros}, num_batch_threads={config.instances}, "
                     f"idle_runs_now={b.idle_runs_now}))  # tfperf.serving.batcher; TF Serving's names")
    return lines


def write_report(found: Found, out: Path) -> Path:
    """report.md (and throughput_vs_latency.png) in `out`."""
    from tfperf.records.jsonl import atomic_write_text

    budget, p = found.budget, found.budget.percentile
    lines = [f"# tfperf load: {found.model}", ""]
    if found.partial:
        lines += [f"**PARTIAL: {found.partial}.** What follows is what was measured before it stopped.", ""]
    lines += [f"Budget: {budget}. The run took {found.seconds:.0f} s.", ""]
    usable = sorted((s for s in found.swept if not s.dropped and s.rate_within(budget) > 0),
                    key=lambda s: -s.rate_within(budget))
    lines += ["## Answer", ""]
    if not usable:
        seen = [(lv.percentile_s(p), s.config.name) for s in found.swept for lv in s.levels[:1]]
        lowest = min(seen) if seen else None
        lines.append(f"No configuration meets {budget}, not even one request at a time" + (
            f": the lowest p{p:g} seen was {_ms(lowest[0])} ms ({lowest[1]}, concurrency 1)."
            if lowest and math.isfinite(lowest[0]) else ": no request was answered one at a time within the "
            "level's time." if lowest else "."))
    elif found.through is not None:
        lines += _answer_through_socket(found, usable)
    else:
        best = winner(found, usable)
        offered = _offered(found.open_loop.get(best.config.name))
        offered = f", {offered}" if offered else ""
        lines.append(f"Best within the budget: **{best.config.name}**{offered}; {units.rate(best.rate_within(budget))} "
                     f"requests/s in closed loop.")
        lines += _validation(found, f"of {found.validated.name}" if found.validated else "", "")
        if best.config.runtime == "endpoint":
            lines += [""] + _client_ceiling(found, best) + _around_the_model(best, found.json_requests)
        else:
            lines += ["", "Serve it:", "", "```"] + serve_command(best.config, found.export_commands.get(
                export_of(best.config.runtime))) + ["```", ""]
            lines += _anchors(found, usable)
    if found.deploy:
        lines += ["## Deploy it", "", "In this folder: serve.json (`tfperf serve MODEL --config serve.json`) and deploy/:",
                  "", *[line for line in found.deploy[2:] if line], ""]
    lines += ["## Every configuration tried", ""]
    if found.outputs_vary is False:
        from tfperf.deploy.formats import NOT_EVIDENCE

        lines += [f"Each configuration's answers were checked against the runtime's own unbatched call, but "
                  f"{NOT_EVIDENCE}: the model answered every request alike.", ""]
    if found.requests_note:
        lines += [found.requests_note[0].upper() + found.requests_note[1:] + ".", ""]
    padded = any(s.padding is not None for s in found.swept)
    lines += [f"| configuration | requests/s within budget | p{p:g} at concurrency 1 (95% CI), ms | "
              + ("useful tokens / computed | " if padded else "") + "dropped because |",
              "|---|---|---|" + ("---|" if padded else "") + "---|"]
    for s in found.swept:
        first = _ci(s.levels[0], p) if s.levels else "-"
        why = s.dropped or ("" if s.rate_within(budget) > 0 else "misses the budget even one request at a time")
        share = ("-" if s.padding is None else f"{s.padding:.0%}") + " | " if padded else ""
        lines.append(f"| {s.config.name} | {units.rate(s.rate_within(budget))} | {first} | {share}{why} |")
    for runtime, why in found.not_exported.items():
        lines.append(f"| {runtime} | - | - | not exported: {why} |")
    lines += ["", "## Closed loop, level by level", ""]
    for s in _measured(found):
        if not s.levels:
            continue
        split = any(s.splits.get(lv.label) for lv in s.levels)
        lines += [f"**{s.config.name}**", "", "| clients | requests/s | p50 ms (95% CI) | p90 ms (95% CI) | "
                  "p99 ms (95% CI) | stable | clients' CPU (who, CPU a request, cores left) | "
                  "server's cores busy |"
                  + (f" {SPLIT_HEADER} |" if split else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" if split else "")]
        for lv in s.levels:
            cores = "-" if lv.server_cores is None else f"{lv.server_cores:.2f}"
            lines.append(f"| {lv.label.split()[-1]} | {units.rate(lv.throughput)} | {_ci(lv, 50)} | {_ci(lv, 90)} | "
                         f"{_ci(lv, 99)} | {'yes' if lv.stable else 'unstable'} | {client_cell(lv)} | {cores} |"
                         + (f" {_split(s.splits.get(lv.label), lv)} |" if split else ""))
        lines.append("")
    lines += _generator(found)
    chart = _chart(found, out)
    if chart:
        lines += ["", f"![throughput against p{p:g}]({chart.name})", ""]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def client_cell(level: LoadLevel) -> str:
    """The cores the clients kept busy, who they were, their CPU a request and the cores they left the server (the
    machine's cores less theirs: client and server share this machine when the endpoint is local); their share of
    the CPU only where the server's is seen too (an endpoint elsewhere left it "100%" of this process alone)."""
    per_request = level.client_cpu_per_request_s
    share = [f"{level.client_share:.0%} of the CPU"] if level.server_seen else []
    if per_request is None or not (sum(w.seconds for w in level.windows) or level.seconds) > 0:
        return share[0] if share else "-"
    cores, used = os.cpu_count() or 1, level.client_cores
    left = max(cores - used, 0.0)
    return ", ".join([f"{used:.2f} cores", *share]) + (f" ({level.client}, {per_request * 1e6:.0f} us; "
                                                      f"{left:.1f} of {cores} left)")


SPLIT_HEADER = "the server's own means (tfperf.serving.scrape): queue / model per batch / rows per batch / server"


def _measured(found: Found) -> list[Swept]:
    """Every closed-loop sweep: in process, through a socket, and the client's ceiling."""
    return [*found.swept, *(t.swept for t in found.sockets), *([found.client_ceiling] if found.client_ceiling else [])]


def _split(split: dict | None, level: LoadLevel) -> str:
    """The server's own account of a level's time beside the client's mean (the rest is the hop)."""
    if not split:
        return "-"
    parts = [f"{split[k]:.2f} ms" if k in split else "-" for k in ("server_queue_ms", "server_model_ms")]
    rows = f"{split['server_batch_rows']:.1f}" if "server_batch_rows" in split else "-"
    server = split.get("server_latency_ms")
    mean = sum(level.latencies_s) / len(level.latencies_s) * 1e3 if level.latencies_s else math.nan
    # The server's means count every request its metrics saw while the level ran, the warm-up's and the last
    # in flight included: where they exceed the client's own mean, no hop can be read off the difference.
    hop = "" if server is None or not math.isfinite(mean) else (
        f" (client's mean {mean:.2f} ms: the hop {mean - server:.2f} ms)" if mean >= server else
        f" (client's mean {mean:.2f} ms, below the server's, whose mean counts requests outside the level's windows)")
    return f"{parts[0]} / {parts[1]} / {rows} / {server:.2f} ms{hop}" if server is not None else \
        f"{parts[0]} / {parts[1]} / {rows} / -"


def serve_line(found: Found, config: str) -> str:
    """The `tfperf serve` command line that serves the answer: the model as `load` was given it, with the flags
    that loaded it (the export command's), and `config` (serve.json's path)."""
    command = found.export_commands.get(found.through.config.runtime if found.through else "savedmodel") or []
    kept, words = [], iter(command[4:])  # after: export MODEL --format RUNTIME
    for word in words:
        if word in ("--input-shape", "--signature"):
            kept += [word, next(words, "")]
        elif word == "--trust":
            kept.append(word)
    return shlex.join(["tfperf", "serve", command[1] if command else found.model, "--config", config, *kept])


def _validation(found: Found, what: str, where: str) -> list[str]:
    """Each LoadGen validation run of the answer (`what` it validated) and, when the last was VALID, the claim."""
    p = found.budget.percentile
    lines = []
    for v in found.validations:
        word = "VALID" if v.valid else "INVALID (" + "; ".join(v.reasons) + ")"
        lines.append(f"LoadGen Server validation {what} at {units.rate(v.target_qps)} requests/s: **{word}**, p{p:g} "
                     f"{v.percentiles_ms.get(f'{p:.2f}', math.nan):.2f} ms from scheduled time over "
                     f"{v.query_count} queries.")
    if found.validations and found.validations[-1].valid:
        claimed = units.rate(found.validations[-1].target_qps)
        lines.append(f"The claim: **{claimed} requests/s within {found.budget}**{where}, VALID by LoadGen.")
    elif found.validations and not any(v.valid for v in found.validations):
        lines.append(no_valid_rate(found))
    if found.not_validated:
        lines.append(not_validated(found))
    return lines


def not_validated(found: Found) -> str:
    """Why LoadGen's validation stopped short (or never ran), said with the claim it leaves out."""
    from tfperf.serving.measure import Sizes

    return (f"Not validated further: {found.not_validated}; no rate is claimed VALID. Without --quick, validation "
            f"is given {Sizes().validation_cap_s / 60:.0f} minutes.")


def no_valid_rate(found: Found) -> str:
    """What is said when LoadGen validated none of the rates it was given: no rate is claimed."""
    rates = ", ".join(f"{units.rate(v.target_qps)}" for v in found.validations)
    return (f"**None of the rates tried was VALID** ({rates} requests/s): no rate is claimed within {found.budget}. "
            f"The closed-loop figures above held the budget only with a fixed number of clients waiting for each "
            f"answer; Poisson arrivals at those rates did not.")


def _answer_through_socket(found: Found, usable: list[Swept]) -> list[str]:
    """The answer measured through a socket, the in-process best beside it as the ceiling, what each protocol
    cost, the client's own ceiling, and how to serve it."""
    budget, p, best = found.budget, found.budget.percentile, found.through
    offered = _offered(found.open_loop.get(best.swept.config.name))
    offered = f"{offered}, " if offered else ""
    lines = [f"Best through a socket, what a deployment gets: **{best.config.name}**, served by `tfperf serve` and "
             f"called over {best.swept.config.name.rpartition(', through ')[2]}: "
             f"{offered}{units.rate(best.rate_within(budget))} "
             f"requests/s in closed loop."]
    lines += _validation(found, "through the socket", " through a socket")
    ceiling = winner(found, usable) if usable else None
    if ceiling is not None:
        inside = ceiling.rate_within(budget)
        share = best.rate_within(budget) / inside
        client = best.swept.levels[-1].client if best.swept.levels else "python"
        lines += ["", f"In process, no socket{' (the ceiling)' if share <= 1 else ''}: **{ceiling.config.name}**, "
                      f"{units.rate(inside)} requests/s in closed loop. Through the socket the best served "
                      f"{share:.2f}x of it: "
                  + ("the rest is what the protocol, the socket and the client cost here." if share <= 1 else
                     f"more, because in process the clients are Python threads in the server's process (its GIL, "
                     f"its cores), where through the socket they were {client}'s and the server had processes of "
                     f"its own.")]
    lines += ["", "| served by tfperf serve, called over | requests/s within budget | "
              f"p50 ms (95% CI) | p{p:g} ms (95% CI) | vs in process | clients' CPU (who, "
              f"CPU a request, cores left) | "
              f"dropped because |", "|---|---|---|---|---|---|---|"]
    for t in found.sockets:
        level = t.swept.best_level(budget)
        rate = t.rate_within(budget)
        ratio = f"{rate / ceiling.rate_within(budget):.2f}x" if ceiling is not None and level else "-"
        why = t.swept.dropped or ("" if level else "misses the budget even one request at a time")
        lines.append(f"| {t.swept.config.name} | {units.rate(rate)} | {_ci(level, 50) if level else '-'} | "
                     f"{_ci(level, p) if level else '-'} | {ratio} | "
                     f"{client_cell(level) if level else '-'} | {why} |")
    lines += ["", "The server's own split of each level's time is under \"Closed loop, level by level\"."]
    lines += [""] + _client_ceiling(found, best.swept)
    lines += ["Serve it:", "", "```", serve_line(found, "serve.json"), "```", "",
              "In process, the same configuration in code:", "",
              "```", *serve_command(best.config, None), "```", ""]
    return lines + _anchors(found, usable) if usable else lines


def _client_ceiling(found: Found, endpoint: Swept) -> list[str]:
    """The endpoint beside an echo of its answers measured the same way: what the client could see at most."""
    echo = found.client_ceiling
    if echo is None or echo.dropped:
        return ["The client's ceiling was not measured" + (f" ({echo.dropped})." if echo else ".")]
    budget = found.budget
    rows = [("the endpoint", endpoint), ("an echo of its answers: the client's ceiling", echo)]
    lines = ["| measured | requests/s within budget, closed loop | offered within budget, LoadGen (bracket) | "
             "clients' CPU at the top level (who, CPU a request, cores left) |", "|---|---|---|---|"]
    for label, s in rows:
        bracket = found.open_loop.get(s.config.name)
        offered = _bracket_cell(bracket) if bracket else "-"
        lines.append(f"| {label} | {units.rate(s.rate_within(budget))} | {offered} | {client_cell(s.levels[-1])} |")
    mine, ceiling = endpoint.rate_within(budget), echo.rate_within(budget)
    share = mine / ceiling if ceiling > 0 else math.inf
    lines += ["", f"The endpoint reached {share:.0%} of what this client answers itself at most within the budget "
                  "(an echo that does no work, in a process of its own, the same requests and rules). "
              + ("Near the ceiling: the client, not the server, may be the limit here; "
                 + ("a client on another machine would see more." if echo.levels[-1].client != "python" else
                    "h2load (`--client h2load`, Debian's nghttp2-client: a tenth of the CPU a request) or a client "
                    "on another machine would see more.") if share > 0.7 else
                 "Well below it: the server, not the client, is the limit."),
              "LoadGen's open loop sends through tfperf's Python client whichever client ran the closed loop: "
              "its offered rates are bounded by that client's ceiling.", ""]
    return lines


def _around_the_model(endpoint: Swept, as_json: bool) -> list[str]:
    """Where the endpoint's own metrics say a request's time went at its first level (the fewest clients)."""
    from tfperf.serving.scrape import around_the_model

    first = endpoint.levels[0] if endpoint.levels else None
    split, clients = (endpoint.splits.get(first.label), first.label.split()[-1]) if first else (None, "")
    mean = sum(first.latencies_s) / len(first.latencies_s) * 1e3 if first and first.latencies_s else None
    said = around_the_model(split, int(clients), as_json, mean) if split and clients.isdigit() else None
    return [said, ""] if said else []


def _anchors(found: Found, usable: list[Swept]) -> list[str]:
    """The best against what a TensorFlow user has today: the signature one request at a time, and BatchFunction.
    An offered rate's interval is the bracket the LoadGen probes found: the highest rate within the budget and
    the next rate tried, which missed it."""
    budget = found.budget
    anchor = next((s for s in found.swept if s.config.runtime == "savedmodel" and s.config.instances == 1
                   and s.config.batching is None and s.config.threads is None), None)
    tf_batch = next((s for s in found.swept if s.config.runtime == BATCH_FUNCTION), None)
    best = winner(found, usable)
    rows = [("the SavedModel signature, one request at a time", anchor),
            ("TensorFlow's BatchFunction (TF Serving's kernel)", tf_batch), (f"best: {best.config.name}", best)]
    lines = ["| served as | requests/s within budget, closed loop | offered within budget, LoadGen (bracket) | "
             "vs the signature one at a time, offered (bracket) |", "|---|---|---|---|"]
    base = found.open_loop.get(anchor.config.name) if anchor else None
    for label, s in rows:
        if s is None:
            continue
        bracket = found.open_loop.get(s.config.name)
        offered = _bracket_cell(bracket, " (its closed-loop capacity: not probed above)") if bracket else (
            "not searched" if s.rate_within(budget) > 0 else "misses the budget one request at a time")
        ratio = ("1x (the baseline)" if base else "misses the budget alone") if s is anchor else "-"
        if bracket and base and base[0] > 0 and s is not anchor:
            ratio = f"{bracket[0] / base[0]:.2f}x ({bracket[0] / base[1]:.2f}-{bracket[1] / base[0]:.2f}x)" \
                if math.isfinite(bracket[1]) and math.isfinite(base[1]) else f"{bracket[0] / base[0]:.2f}x"
        lines.append(f"| {label} | {units.rate(s.rate_within(budget))} | {offered} | {ratio} |")
    return lines + [""]


def _generator(found: Found) -> list[str]:
    """Whether the load generator, not the model, is the limit."""
    lines = ["## The load generator", ""]
    shares = [lv.client_share for s in found.swept for lv in s.levels if lv.server_seen]
    elsewhere = [lv for s in found.swept for lv in s.levels if not lv.server_seen]
    if shares:
        worst, apart = max(shares), found.server_process
        lines.append(("The servers ran in a process of their own (--server-process), each request crossing a pipe: "
                      "no client waited for the server's GIL. Clients" if apart else
                      "Clients (Python threads in this process)")
                     + f" used up to {worst:.0%} of the CPU {'both processes' if apart else 'this process'} used "
                     f"while they ran" + (f": over {GENERATOR_LIMIT:.0%}, so at the highest rates the generator "
                                          f"competes with the server for the same cores"
                                          + ("" if apart else " and Python's GIL")
                                          + ", and the rates above are a floor of what the model can do"
                                          + ("." if apart else " (`--server-process` takes the GIL out of it).")
                                          if worst > GENERATOR_LIMIT else ": the server, not the generator, is the "
                                                                         "limit."))
    elif elsewhere:
        busiest = max(elsewhere, key=lambda level: level.client_cores)
        lines.append(f"The endpoint's own CPU is not seen from here. The clients ({busiest.client}) kept up to "
                     f"{busiest.client_cores:.2f} of this machine's {os.cpu_count() or 1} cores busy "
                     f"({busiest.label}); where the server runs on this machine too, that is what they took from it.")
    if found.overhead is not None and found.overhead.qps_without_overhead:
        o = found.overhead
        lines.append(f"LoadGen SingleStream: {units.rate(o.completed_qps)} queries/s with LoadGen's own overhead, "
                     f"{units.rate(o.qps_without_overhead)} without it.")
    if found.ceiling is not None:
        lines.append(f"LoadGen Offline (every request at once, the ceiling): {units.rate(found.ceiling.completed_qps)} "
                     f"requests/s.")
    return lines


def _chart(found: Found, out: Path) -> Path | None:
    """Throughput against the percentile, a line per configuration measured."""
    measured = [s for s in _measured(found) if s.levels]
    if not measured or not extras.installed("matplotlib"):  # tfperf[report] draws it; the tables say the same
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tfperf.records.report import save_figure

    p = found.budget.percentile
    fig, ax = plt.subplots(figsize=(8, 5))
    for s in measured:
        ax.plot([lv.throughput for lv in s.levels], [lv.percentile_s(p) * 1e3 for lv in s.levels], marker="o",
                label=s.config.name, linewidth=1)
    ax.axhline(found.budget.latency_s * 1e3, color="red", linestyle="--", label=str(found.budget))
    ax.set_xlabel("requests/s (closed loop)")
    ax.set_ylabel(f"p{p:g} latency, ms")
    ax.set_yscale("log")
    ax.legend(fontsize=6, loc="upper left")
    ax.set_title("throughput against latency")
    return save_figure(fig, out / "throughput_vs_latency.png")


def describe(found: Found, reproduce: str, report: Path) -> str:
    """The serving answer in a paragraph, for the doctor's advice."""
    budget = found.budget
    usable = sorted((s for s in found.swept if not s.dropped and s.rate_within(budget) > 0),
                    key=lambda s: -s.rate_within(budget))
    if not usable:
        seen = [(lv.percentile_s(budget.percentile), s.config.name) for s in found.swept for lv in s.levels[:1]]
        lowest = min(seen) if seen else None
        text = f"No configuration meets {budget}, not even one request at a time" + (
            f" (lowest p{budget.percentile:g} {_ms(lowest[0])} ms, {lowest[1]})" if lowest and math.isfinite(lowest[0])
            else " (no request answered one at a time within the level's time)" if lowest else "") + "."
    else:
        best = winner(found, usable)
        offered = _offered(found.open_loop.get(best.config.name))
        valid = [v for v in found.validations if v.valid]
        text = (f"Best within {budget}: **{best.config.name}**, " + (f"{offered}, " if offered else "") +
                f"{units.rate(best.rate_within(budget))} in closed loop" +
                (f"; LoadGen says VALID at {units.rate(valid[-1].target_qps)} requests/s" if valid else
                 "; LoadGen did not validate it (see the report)" if found.validations or found.not_validated
                 else "") + ".")
        anchor = next((s for s in found.swept if s.config.runtime == "savedmodel" and s.config.batching is None
                       and s.config.instances == 1), None)
        if anchor is not None and anchor.config.name in found.open_loop and found.open_loop[anchor.config.name][0]:
            text += (f" The SavedModel signature one request at a time: "
                     f"{units.rate(found.open_loop[anchor.config.name][0])} requests/s offered.")
        text += (" Measured in process, no socket: the ceiling; the figure through a socket, which a deployment gets,"
                 " is tfperf load's answer (below).")
    partial = f" (PARTIAL: {found.partial})" if found.partial else ""
    return f"{text}{partial} Reproduce: `{reproduce}`. Every configuration and level: {report}."
