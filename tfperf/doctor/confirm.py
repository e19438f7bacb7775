"""The best configuration, confirmed: "does the code block the doctor printed give, applied as I apply it, what it
claimed?"

The search's recommendation (tfperf/doctor/search.py) is written as the lines a user changes; `applied` runs them as
printed, in a fresh process (tfperf/doctor/apart.py starts it), on the model built or loaded as the user's code does
(a policy set before building, or a loaded model rebuilt under it), to be raced against plain fit's lines on the same
rows; `confirmation_text` says what that race found beside the claim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfperf.measure.stats import Comparison

LEARNING_RATE = 1e-3  # Adam's default, the doctor's optimizer everywhere


def confirmation_text(confirmed: dict[str, Any] | None, how: str, figures: Callable[[dict[str, Any]], str],
                      claimed: Comparison, apart: bool = False) -> str:
    """The sentence a recommendation's confirmation gives (`how`: where the code ran and what it was raced against):
    its figure beside the claim, or why there is none; and where the two intervals do not overlap, that they disagree
    and which is the one like the user's own run. `apart`: the claim too was raced in fresh processes (the training
    headline), not in the doctor's."""
    if confirmed is None:
        return "Not confirmed in a fresh process."
    if "error" in confirmed:
        return f"Not confirmed in a fresh process: {confirmed['error']}."
    claim = "claimed" if apart else "claimed here"
    said = (f"Confirmed as applied: {how}: {confirmed['describe']} "
            f"({figures(confirmed)}; {claim}: {claimed.ratio:.2f}x).")
    low, high = confirmed.get("ci95") or (confirmed.get("ratio", math.nan),) * 2  # NaN: nothing to compare
    if high < claimed.ci95[0] or low > claimed.ci95[1]:
        # On MobileNetV2 the doctor's race said 1.86x (1.77-1.91x) and the fresh process 1.45x (1.35-1.58x): the
        # doctor's process had built and trained a dozen configurations, XLA's among them, before its race.
        which, like_yours = (("claimed", "as printed"), "the code above, as printed, is what your script runs") \
            if apart else (("here", "there"), "the fresh process, which ran only the code above, is the one like yours")
        said += (f" The two disagree beyond their intervals ({which[0]} {claimed.ci95[0]:.2f}-{claimed.ci95[1]:.2f}x, "
                 f"{which[1]} {low:.2f}-{high:.2f}x): {like_yours}, so expect "
                 f"{'less' if high < claimed.ci95[0] else 'more'} than {claim}.")
    return said


def applied(code: Sequence[str], spec: dict[str, Any], work: Path, name: str):
    """In a child: the model built and the code block run on it as the user runs it (the user's optimizer and loss
    stand in as Adam and the doctor's loss; fit() is read for its keywords, then timed an epoch a call): (a Timer
    called `name`, the losses it appends)."""
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
    epoch, losses = fit_epochs(model, x, y, shuffle=False, **said)
    timer = Timer(epoch, name=name, items_per_call=len(y))
    timer.start(warmup=0)
    return timer, losses
