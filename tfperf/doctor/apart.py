"""The best configuration against plain fit, raced apart from the climb: "what will the change give in my script,
which has not trained a dozen other configurations first?"

The doctor's process is not the user's: it has built and trained a dozen configurations by the time the climb ends.
On MobileNetV2 its race said 1.86x (95% CI 1.77-1.91x) where a fresh process said 1.45x (1.35-1.58x): plain fit's
epoch took 0.53 s before and 0.76 s after one XLA configuration had trained there, and a small batch lost more than a
large one. So the headline race runs in a fresh process that builds only plain fit, the best and the best at the
user's batch; and the confirmation in a second one that builds plain fit and the best from the lines the report
prints, as a user applies them. The two processes start side by side and their timers are raced round by round from
here (tfperf.measure.processes.TimerServer): two independent fresh processes, whose agreement says the figure is not
one process's. (Each configuration in a process of its own was tried: an XLA configuration alone in a process ran
2,246 to 2,948 examples a second from one process to the next on a two-block Transformer, a spread no interval drawn
from rounds in one process shows.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfperf.doctor.climbed import Config
from tfperf.doctor.experiment import Context, child_command
from tfperf.doctor.options import MIN_GAIN, load_given, model_flags, model_parser

SPEC = "apart.json"
PLAIN_PRINTED = "plain fit's lines, as printed"
BEST_PRINTED = "the code block, as printed"
# The best at the user's batch, as printed, where the best raised the batch: the recommendation where the larger batch
# does not pay in the fresh race (the climb's process can read it high), confirmed as the best's would be.
AT_YOUR_BATCH_PRINTED = "the code block at your batch, as printed"
PRINTED = (BEST_PRINTED, AT_YOUR_BATCH_PRINTED)


@dataclasses.dataclass
class Apart:
    """The headline race's result: measurements and final losses by timer name (a configuration's label, or one of
    the code blocks'), comparisons against plain fit by label, and the confirmation (the code block against plain
    fit's lines: the figures the report says, or {"error": why}; None where not asked)."""

    measurements: dict[str, Any]
    comparisons: dict[str, Any]
    losses: dict[str, float]
    confirmed: dict[str, Any] | None
    confirmed_at_your_batch: dict[str, Any] | None = None  # where the best at the user's batch's code was built


def processes(plain: Config, at_your_batch: Config, best: Config, code: Sequence[str] | None,
              plain_code: Sequence[str] | None, at_your_batch_code: Sequence[str] | None = None
              ) -> dict[str, dict[str, Any]]:
    """What each process builds, by its name: the configurations built the doctor's way, and the code blocks built as
    printed, [timer name, lines] (where `code` asks for the confirmation; the best at the user's batch's too where
    given)."""
    configs = [plain, *([at_your_batch] if at_your_batch not in (plain, best) else []), best]
    found = {"headline": {"configs": [dataclasses.asdict(c) for c in configs], "printed": []}}
    if code is not None:
        found["confirmation"] = {"configs": [], "printed": [
            [PLAIN_PRINTED, list(plain_code or ())], [BEST_PRINTED, list(code)],
            *([[AT_YOUR_BATCH_PRINTED, list(at_your_batch_code)]] if at_your_batch_code else [])]}
    return found


def race_apart(ctx: Context, plain: Config, at_your_batch: Config, best: Config, rows, rounds: int,
               code: Sequence[str] | None = None, plain_code: Sequence[str] | None = None,
               at_your_batch_code: Sequence[str] | None = None) -> Apart:
    """Plain fit, the best (and the best at the user's batch) trained in a fresh process on the same rows from the
    same weights, and the code blocks (where given) in another, raced `rounds` interleaved rounds from here."""
    from tfperf.doctor.handover import hand_over
    from tfperf.measure.processes import TimerServer
    from tfperf.measure.rounds import race

    options, work = ctx.options, ctx.workdir / "apart"
    hand_over(ctx.subject, options, work, rows.examples)
    plan = processes(plain, at_your_batch, best, code, plain_code, at_your_batch_code)
    (work / SPEC).write_text(json.dumps({
        "model": [ctx.subject.source, *model_flags(ctx.subject, options), "--seed", str(options.seed)],
        "source": ctx.subject.source, "loss": options.loss, "from_logits": options.from_logits, "processes": plan}))
    ctx.progress("best configuration against plain fit, in fresh processes" + (
        " (and its code block, confirmed)" if code is not None else ""))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    with contextlib.ExitStack() as stack:
        # Started together, so that they load and build side by side; asked for their timers once all have begun.
        servers = {name: stack.enter_context(TimerServer(child_command("apart", str(work), name), env=env,
                                                         timeout=1800, name=f"the {name}'s process"))
                   for name in plan}
        refused = {}
        for server in servers.values():
            refused.update(server.next_reply()["refused"])
        names = {name: [Config(**c).label for c in p["configs"]] + [printed for printed, _ in p["printed"]]
                 for name, p in plan.items()}
        timers = [servers[name].timer(timer) for name, timer_names in names.items() for timer in timer_names
                  if timer not in refused]
        against = {label: plain.label for label in (at_your_batch.label, best.label) if label != plain.label}
        against.update({printed: PLAIN_PRINTED for printed in (BEST_PRINTED, AT_YOUR_BATCH_PRINTED)
                        if {printed, PLAIN_PRINTED} <= {t.name for t in timers}})
        taken: dict[str, int] = {}
        ms, comparisons = race(timers, rounds=rounds, samples=rounds, threshold=MIN_GAIN,
                               max_extensions=options.max_extensions, warmup=0, seed=options.seed,
                               on_first_rounds=lambda first: taken.update({m.name: m.n for m in first}),
                               against=against)
    by_name = dict(zip(against, comparisons))
    losses = {}
    for server in servers.values():  # after the same epochs for each: its first, and the first rounds' samples
        losses.update({name: said[min(taken[name], len(said) - 1)]
                       for name, said in (server.result or {}).get("losses", {}).items() if name in taken})
    measured = {m.name: m for m in ms}
    return Apart(measured, {label: by_name[label] for label in by_name if label not in PRINTED}, losses,
                 confirmation(code, refused, by_name, measured),
                 confirmation(at_your_batch_code, refused, by_name, measured, AT_YOUR_BATCH_PRINTED))


def confirmation(code: Sequence[str] | None, refused: dict[str, str], comparisons: dict[str, Any],
                 measurements: dict[str, Any], printed: str = BEST_PRINTED) -> dict[str, Any] | None:
    """What the confirmation says: the code block (`printed`: its timer) against plain fit's lines, or why they were
    not raced."""
    if code is None:
        return None
    if refused:
        return {"error": "; ".join(f"{name}: {why}" for name, why in refused.items())}
    c = comparisons[printed]
    return {"describe": c.describe(), "ratio": c.ratio, "ci95": list(c.ci95), "verdict": c.verdict,
            "plain_samples_per_s": measurements[PLAIN_PRINTED].items_per_s,
            "best_samples_per_s": measurements[printed].items_per_s}


def doctor_built(spec: dict[str, Any], work: Path):
    """In a child: a `train`-ready stand-in for the doctor's subject (its copies from the weights handed over) and
    the rows handed over."""
    from tfperf.doctor.handover import take_over
    from tfperf.doctor.trainers import Rows
    from tfperf.doctor.targets import training_loss

    subject, _ = load_given(model_parser("apart").parse_args(spec["model"]))
    x, y = take_over(work, subject.model)
    weights, fresh = subject.model.get_weights(), subject.fresh

    def weighted(policy: str | None = None):
        copy = fresh(policy)
        copy.set_weights(weights)
        return copy

    return (dataclasses.replace(subject, fresh=weighted),
            Rows(x, y, training_loss(spec["loss"], spec["from_logits"]), len(y), False))


def child(argv: list[str]) -> int:
    """`WORK NAME`: the process NAME of the plan in WORK builds its configurations and its code blocks, replies those
    that did not build, serves the others' timers, then replies their losses, epoch by epoch."""
    from tfperf.deploy.errors import first_line
    from tfperf.doctor.confirm import applied
    from tfperf.doctor.trainers import trainer
    from tfperf.measure import serve_timers
    from tfperf.measure.processes import reply

    work, name = Path(argv[0]), argv[1]
    spec = json.loads((work / SPEC).read_text())
    mine = spec["processes"][name]
    timers, said, refused = [], {}, {}
    if mine["configs"]:
        subject, rows = doctor_built(spec, work)
        for fields in mine["configs"]:  # a configuration that cannot train here ends the process: said by the parent
            timer, said[timer.name] = trainer(subject, Config(**fields), rows)
            timers.append(timer)
    for printed, lines in mine["printed"]:
        try:
            timer, said[printed] = applied(lines, spec, work, printed)
            timers.append(timer)
        except Exception as exc:  # noqa: BLE001  (a block that does not apply is the finding, said in one line)
            refused[printed] = f"{type(exc).__name__}: {first_line(exc)}"
    print(reply({"refused": refused}), flush=True)
    serve_timers(timers, warmup=0)
    print(reply({"losses": said}), flush=True)
    return 0
