"""The best configuration, confirmed: "does the code block the doctor printed give, applied as I apply it, what it
claimed?"

The search's recommendation (tfperf/doctor/search.py) is written as the lines a user changes; here they are run as
printed, in a fresh process, on the model built or loaded as the user's code does (a policy set before building, or
a loaded model rebuilt under it), and raced against plain fit's lines on the same rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfperf.deploy.errors import first_line
from tfperf.doctor.experiment import Context, child_command
from tfperf.doctor.options import MIN_GAIN

if TYPE_CHECKING:
    from tfperf.measure.stats import Comparison

LEARNING_RATE = 1e-3  # Adam's default, the doctor's optimizer everywhere


def confirmation_text(confirmed: dict[str, Any] | None, against: str, figures: Callable[[dict[str, Any]], str],
                      claimed: Comparison, where: str = "the code above run in a fresh process") -> str:
    """The sentence a recommendation's confirmation gives: its figure beside the claim, or why there is none; and
    where the two intervals do not overlap, that they disagree and which is the one like the user's own process."""
    if confirmed is None:
        return "Not confirmed in a fresh process."
    if "error" in confirmed:
        return f"Not confirmed in a fresh process: {confirmed['error']}."
    said = (f"Confirmed as applied: {where}, raced there against {against}: {confirmed['describe']} "
            f"({figures(confirmed)}; claimed here: {claimed.ratio:.2f}x).")
    low, high = confirmed.get("ci95") or (confirmed.get("ratio", math.nan),) * 2  # NaN: nothing to compare
    if high < claimed.ci95[0] or low > claimed.ci95[1]:
        # On MobileNetV2 this run's race said 1.86x (1.77-1.91x) and the fresh process 1.45x (1.35-1.58x): the
        # doctor's process had built and trained a dozen configurations, XLA's among them, before its race.
        said += (f" The two disagree beyond their intervals (here {claimed.ci95[0]:.2f}-{claimed.ci95[1]:.2f}x, "
                 f"there {low:.2f}-{high:.2f}x): the fresh process, which ran only the code above, is the one like "
                 f"yours, so expect {'less' if high < claimed.ci95[0] else 'more'} than claimed here.")
    return said


def confirm(ctx: Context, code: list[str], plain: list[str], examples: int, rounds: int) -> dict[str, Any]:
    """The code block applied as a user applies it, in a fresh process, and raced there against plain fit's
    (`plain`) on the same rows, `rounds` interleaved rounds: the child's reply, or {"error": why}."""
    import os

    from tfperf.doctor.handover import hand_over
    from tfperf.measure.processes import ChildError, run_child

    subject, options = ctx.subject, ctx.options
    work = ctx.workdir / "search"
    hand_over(subject, options, work, examples)
    (work / "search.json").write_text(json.dumps({
        "source": subject.source, "loss": options.loss, "from_logits": options.from_logits, "code": code,
        "plain": plain, "rounds": rounds,
        "max_extensions": options.max_extensions, "seed": options.seed}))
    ctx.progress("best configuration, confirmed in a fresh process")
    try:
        return run_child(child_command("confirm", str(work)), who="the confirmation process", timeout=1800,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    except ChildError as exc:
        return {"error": str(exc)}


def applied(code: Sequence[str], spec: dict[str, Any], work: Path):
    """In the child: the model built and the code block run on it as the user runs it (the user's optimizer and
    loss stand in as Adam and the doctor's loss; fit() is read for its keywords, then timed an epoch a call)."""
    import types

    import keras

    import tfperf.precision
    from tfperf.doctor.handover import build, loss_function, take_over
    from tfperf.measure import Timer
    from tfperf.train import fit_epochs

    namespace: dict[str, Any] = {"keras": keras, "tfperf": tfperf}
    before = [line for line in code if line.startswith("keras.mixed_precision.set_global_policy")]
    for line in before:  # a policy set before building: for this build only, as a fresh script would
        exec(line, namespace)
    model = build(spec["source"], keras, work)
    keras.config.set_dtype_policy("float32")
    x, y = take_over(work, model)
    namespace.update(model=model, x=x, y=y, optimizer=keras.optimizers.Adam(LEARNING_RATE),
                     loss=loss_function(keras, spec["loss"], spec["from_logits"]))
    *setup, fit = [line for line in code if line not in before]
    for line in setup:
        exec(line, namespace)
    model, said = namespace["model"], {}
    exec(fit, {**namespace, "model": types.SimpleNamespace(fit=lambda *args, **keywords: said.update(keywords))})
    epoch, _ = fit_epochs(model, x, y, shuffle=False, **said)
    timer = Timer(epoch, name="recommended" if code != spec["plain"] else "plain fit", items_per_call=len(y))
    timer.start(warmup=0)
    return timer


def child(argv: list[str]) -> int:
    """`WORK`: plain fit and the recommendation, each built from its code block, raced; the comparison replied."""
    from tfperf.measure.processes import reply
    from tfperf.measure.rounds import race as interleaved

    work = Path(argv[0])
    spec = json.loads((work / "search.json").read_text())
    try:
        timers = [applied(spec["plain"], spec, work), applied(spec["code"], spec, work)]
        (plain, best), (c,) = interleaved(timers, rounds=spec["rounds"], samples=spec["rounds"], threshold=MIN_GAIN,
                                          max_extensions=spec["max_extensions"], warmup=0, seed=spec["seed"])
    except Exception as exc:  # noqa: BLE001  (a block that does not apply is the finding, said in one line)
        print(reply({"error": f"{type(exc).__name__}: {first_line(exc)}"}), flush=True)
        return 0
    print(reply({"describe": c.describe(), "ratio": c.ratio, "ci95": list(c.ci95), "verdict": c.verdict,
                 "plain_samples_per_s": plain.items_per_s, "best_samples_per_s": best.items_per_s}), flush=True)
    return 0
