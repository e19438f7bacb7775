"""tfperf watch: each finding's rule on made-up records (every branch that picks a sentence), then the command
itself on a real script in one process of its own (output, argv, exit code and files left as the program's)."""

from __future__ import annotations

import json
import re
import shutil
import os
import signal
import subprocess
import sys
import time

import pytest

from tfperf.watch import command as watch_command
from tfperf.watch import findings as f
from tfperf.watch.analysis import analyse
from tfperf.watch.report import doctor_lines, markdown

MB = 1024 * 1024


def epoch(i, seconds=1.0, steps_s=0.8, steps=100, validation_s=0.0, callbacks=None, traces=0, trace_s=0.0,
          sample=None, first=None, rss=500 * MB, first_trace=0.0):
    sample = sample if sample is not None else [steps_s / steps] * min(steps, 50)
    return {"epoch": i, "seconds": seconds, "steps_s": steps_s, "steps": steps, "batches": steps,
            "step_sample": sample, "first_step_s": first if first is not None else sample[0],
            "first_step_trace_s": first_trace, "callbacks": callbacks or {}, "validation_s": validation_s,
            "traces": traces, "trace_s": trace_s, "rss": rss}


def fit(epochs, seconds=None, site="train.py:10", **extra):
    total = seconds if seconds is not None else sum(e["seconds"] for e in epochs) + 0.1
    return {"site": site, "seconds": total, "epochs_run": epochs, "callbacks_outside_epochs": {}, "batch_size": 32,
            "jit_compile": False, **extra}


def process(fits=(), traces=(), calls=None, complete=True):
    return {"pid": 1, "fits": list(fits), "traces": list(traces), "calls": calls or {}, "complete": complete,
            "imports": {"tensorflow": {"at_s": 0.1, "seconds": 3.0}, "keras": {"at_s": 2.0, "seconds": 1.0}}}


def keys(found):
    return [x.key for x in found]


def test_the_split_adds_up_and_imports_are_counted_once():
    p = process([fit([epoch(0, seconds=2.0, steps_s=1.0, validation_s=0.5, callbacks={"ProgbarLogger": 0.3})],
                     seconds=2.4)])
    split = f.fit_split(p["fits"])
    assert (split.steps, split.validation, split.callbacks["ProgbarLogger"]) == (1.0, 0.5, 0.3)
    assert split.set_up == pytest.approx(0.4) and split.rest == pytest.approx(0.2)
    assert f.import_seconds(p) == pytest.approx(3.0)  # keras (2.0-3.0) inside tensorflow's (0.1-3.1): the union


def test_a_costly_callback_is_named_with_its_fix_and_a_cheap_one_is_not():
    split = f.fit_split([fit([epoch(0, seconds=10, callbacks={"ProgbarLogger": 2.0, "Cheap": 0.1})])])
    found = f.callback_findings(split)
    assert len(found) == 1 and "ProgbarLogger took 2.0 s" in found[0].text and "verbose=2" in found[0].fix
    own = f.callback_findings(f.fit_split([fit([epoch(0, seconds=10, callbacks={"Saver": 1.0})])]))
    assert "on_epoch_end" in own[0].fix
    threaded = f.fit_split([fit([epoch(0, seconds=10, callbacks={"Saver": 1.0})], callbacks_async=True)])
    assert "in a thread" in f.callback_findings(threaded)[0].text


def test_validation_gets_the_frequency_that_brings_it_under_ten_percent():
    fits = [fit([epoch(i, seconds=2.0, steps_s=1.0, validation_s=1.0) for i in range(4)])]
    found = f.validation_finding(fits, f.fit_split(fits))
    assert keys(found) == ["validation"]
    # 1 s of validation against ~1.03 s of training an epoch: every 9 epochs keeps it under 10%
    assert "validation_freq=9" in found[0].fix and "4 runs of 1.0 s" in found[0].text
    light = [fit([epoch(i, seconds=2.0, steps_s=1.9, validation_s=0.1) for i in range(4)])]
    assert f.validation_finding(light, f.fit_split(light)) == []


def test_a_slow_first_epoch_is_split_into_its_first_step_and_tracing():
    first = epoch(0, seconds=5.0, traces=3, trace_s=1.5, first=3.0, first_trace=1.2)
    found = f.first_epoch_findings([fit([first] + [epoch(i) for i in range(1, 4)])])
    assert keys(found) == ["first epoch"] and "5.0x the others' median 1.0 s" in found[0].text
    assert "tracing 1.2 s of it" in found[0].text and "tracing 300 ms outside the first step" in found[0].text
    assert f.first_epoch_findings([fit([epoch(0, seconds=1.2)] + [epoch(i) for i in range(1, 4)])]) == []
    one_step = epoch(0, seconds=5.0, steps=1, sample=[3.0], traces=2, trace_s=1.5, first_trace=1.2)
    found = f.first_epoch_findings([fit([one_step] + [epoch(i) for i in range(1, 4)])])
    assert "1 step(s) an epoch, so its first step cannot be told" in found[0].text and "tracing 1.5 s" in found[0].text
    assert f.first_epoch_findings([fit([epoch(0, seconds=9.0)])]) == []  # one epoch: nothing to compare with
    assert "again" not in found[0].text and "optimizer" not in found[0].fix


def test_a_step_traced_twice_in_the_first_epoch_is_named_with_its_cause_and_what_it_cost():
    """Keras 3 on TensorFlow builds an optimizer not yet built inside fit's first trace; TensorFlow then traces the
    step again. Recorded in a real fit (its optimizer built first: nothing traced again), then each branch said."""
    import keras
    import numpy as np

    from tfperf.train import build_optimizer
    from tfperf.watch import session

    x, y = np.zeros((64, 4), "float32"), np.zeros((64, 2), "float32")
    recorded = []
    for built in (False, True):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("adam", "mse")
        if built:
            build_optimizer(model)
        with session() as seen:
            model.fit(x, y, epochs=2, verbose=0)
        (fitted,) = seen.record["fits"]
        recorded.append((fitted["optimizer_unbuilt"], fitted["epochs_run"][0]["retraced_inside_s"]))
    (unbuilt, again), (unbuilt_after, again_after) = recorded
    assert unbuilt and again > 0 and not unbuilt_after and again_after == 0.0, recorded

    def first_epoch(retraced_inside_s: float, optimizer_unbuilt: bool = False):
        first = {**epoch(0, seconds=5.0, traces=1, trace_s=1.5, first=3.0, first_trace=1.4),
                 "retraced_inside_s": retraced_inside_s}
        return f.first_epoch_findings([fit([first] + [epoch(i) for i in range(1, 4)],
                                           optimizer_unbuilt=optimizer_unbuilt)])[0]

    said = first_epoch(retraced_inside_s=0.6, optimizer_unbuilt=True)
    assert "traced fit's step again inside that trace (600 ms)" in said.text
    assert "model.optimizer.build(model.trainable_variables)" in said.fix and "at least 600 ms" in said.fix
    other = first_epoch(retraced_inside_s=0.6)
    assert "its first trace made variables" in other.text and "optimizer" not in other.fix
    assert "build the model before fit()" in other.fix
    assert "again" not in first_epoch(retraced_inside_s=0.01, optimizer_unbuilt=True).text  # under RETRACED_MIN_S


def trace(fn, signature, site="train.py:20", seconds=0.2, own=True, defined_at="train.py:5"):
    return {"name": "step", "function": fn, "defined_at": defined_at, "own": own, "site": site,
            "seconds": seconds, "signature": signature, "at_s": 1.0}


@pytest.mark.parametrize("signatures, same_function, why, fix", [
    ([[["lr", f"Literal[{v}]"]] for v in (0.1, 0.2, 0.3)], True, "a new Python value for `lr`", "tf.Variable"),
    ([[["x", f"TensorSpec(shape=({n}, 4), dtype=tf.float32, name=None)"]] for n in (1, 2, 3)], True,
     "a new shape for `x`", "reduce_retracing"),
    ([[["x", "TensorSpec(shape=(1, 4), dtype=tf.float32, name=None)"]]] * 3, False, "a new function object",
     "once, outside the loop"),
])
def test_retraces_say_why_from_the_signatures(signatures, same_function, why, fix):
    traces = [trace(1 if same_function else i, s) for i, s in enumerate(signatures)]
    found = f.retrace_findings(traces)
    assert keys(found) == ["retrace"] and why in found[0].text and fix in found[0].fix
    assert "traced 3 times" in found[0].text and "train.py:20" in found[0].text


def test_library_traces_and_a_function_traced_once_are_not_retraces():
    assert f.retrace_findings([trace(1, [], own=False, defined_at="site-packages/x.py:1")] * 5) == []
    assert f.retrace_findings([trace(1, [["x", "Literal[1]"]])]) == []


def call(kind, calls, seconds, batches, rss=None, site="eval.py:7"):
    return {f"{kind} {site}": {"kind": kind, "site": site, "calls": calls, "seconds": seconds, "batches": batches,
                               "rss": rss or [], "first_s": 0.1}}


def test_predict_in_a_loop_and_memory_that_grows_per_call():
    grows = [500 * MB + i * 2 * MB for i in range(40)]
    found = f.call_findings(process(calls=call("predict", 40, 4.0, 40, rss=grows)))
    assert keys(found) == ["predict loop", "memory"]
    assert "40 times at eval.py:7" in found[0].text and "model(x, training=False)" in found[0].fix
    assert "2 MB per predict() call" in found[1].text
    assert f.call_findings(process(calls=call("predict", 40, 4.0, 4000))) == []  # big calls: not a loop
    assert f.call_findings(process(calls=call("predict", 3, 1.0, 3))) == []


class _Keeper:
    def __init__(self):
        self.history = []


def test_the_census_names_the_containers_that_grew_by_what_holds_them(monkeypatch):
    """Issue 72: memory that grows is named by the object that grows where it is a Python container: a local of a
    running function, a module's global, an object's attribute, with its length before and after."""
    import types

    import numpy as np

    from tfperf.watch.census import Census

    module = types.ModuleType("users_module")
    module.__file__ = "users_module.py"
    module.seen = []
    monkeypatch.setitem(sys.modules, "users_module", module)
    keeper, kept, steady = _Keeper(), [], list(range(5000))
    census = Census(growth=10 * MB, spacing=50, first=4 * MB)
    assert not census.due(500 * MB, 0.0) and not census.due(490 * MB, 0.0)  # flat or falling: nothing counted
    assert census.due(496 * MB, 0.0) and census.take(496 * MB, 0.0) is None  # risen: the first count, a baseline
    for i in range(1500):
        kept.append(np.zeros(16, "float32"))
        module.seen.append(i)
        keeper.history.append({"step": i, "loss": [float(i)]})
    assert not census.due(501 * MB, 100.0)  # grew 5 MB since: not yet
    assert not census.due(600 * MB, census.cost * 10)  # grew enough, but a count now would cost over 2%
    assert census.due(600 * MB, 100.0)
    grown = census.take(600 * MB, 100.0)
    holders = {c["holder"]: c for c in grown["containers"]}
    local = next(c for h, c in holders.items() if h.startswith("`kept` in test_the_census_names"))
    assert (local["from"], local["to"], local["item"], local["item_bytes"]) == (None, 1500, "ndarray", 64)
    assert "the global `seen` of users_module.py" in holders and "`history` of a _Keeper" in holders
    assert all(h != "`steady`" for h in holders) and len(steady) == 5000  # a long list that did not grow

    class Hostile:  # the program's own objects: a property and a size that raise
        @property
        def nbytes(self):
            raise RuntimeError("no")

        def __sizeof__(self):
            raise RuntimeError("no")

    again, odd = Census(growth=0, spacing=0, first=0), []
    again.take(700 * MB, 0.0)
    odd.extend(Hostile() for _ in range(1200))
    (found,) = again.take(700 * MB, 1.0)["containers"]
    assert found["holder"].startswith("`odd` in test_the_census") and found["item_bytes"] is None


def test_what_grew_is_said_from_the_census_or_not_at_all():
    named = {"census": {"counts": 2, "first_at_s": 3.0, "first_rss": 800 * MB, "last": {
        "at_s": 60.0, "rss": 1600 * MB, "containers": [
            {"kind": "list", "holder": "`kept` in main() (running at train.py:30)", "from": None, "to": 3000,
             "item": "EagerTensor", "item_bytes": 262144, "grew_bytes": 3000 * 262144}]}}}
    said = f.what_grew(named, memory_found=False)  # a container named is said with or without a finding
    assert said == ("What grew over the run (the census of Python objects at 3.0 s and 60.0 s, memory 800 MB -> "
                    "1.56 GB): the list `kept` in main() (running at train.py:30): under 16 -> 3,000 items, the last "
                    "an EagerTensor of 256 KB (about 750 MB more if all are alike).")
    named["census"]["last"]["containers"] = []
    assert f.what_grew(named, memory_found=False) == ""  # nothing named and no finding: nothing to say
    assert "no Python list, dict, set or deque grew" in f.what_grew(named, True)
    assert f.what_grew({"census": {"counts": 1, "first_at_s": 3.0}}, True) == "" and f.what_grew({}, True) == ""
    assert "Counting Python objects as memory grew failed (MemoryError" in f.what_grew(
        {"census": {"counts": 2, "first_at_s": 3.0, "last": {"error": "MemoryError: "}}}, True)
    rising = process([fit([epoch(i, rss=(400 + 40 * i) * MB) for i in range(6)])])
    rising["census"] = named["census"]
    analysis = analyse([rising], 30.0)
    assert "memory" in keys(analysis.findings) and analysis.memory_line.endswith("graphs of functions traced anew).")
    assert analysis.memory_line in markdown(analysis, "python train.py", "exit 0")


def test_a_watched_loop_that_keeps_its_results_is_counted_at_its_calls(tmp_path):
    import keras
    import numpy as np

    from tfperf.watch import probe, session
    from tfperf.watch.census import Census

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    x = np.zeros((4, 4), "float32")
    results = []
    with session() as seen:
        probe.RECORDER.census = Census(growth=0, spacing=0, first=0)  # a count at every call (by default: as
        # memory grows)
        for _ in range(3):  # counted at each call, after it: 0, 601 and 1,202 results held
            results.append(model.predict_on_batch(x[:1]))
            results.extend(np.zeros(4) for _ in range(600))
    held = seen.record["census"]
    assert held["counts"] == 3 and held["last"]["containers"][0]["holder"].startswith("`results` in test_a_watched")
    assert held["last"]["containers"][0]["to"] == 1202 and held["last"]["seconds"] < 5


def test_memory_growth_and_a_decline_over_epochs_are_said_only_from_the_numbers():
    rising = [epoch(i, rss=(400 + 40 * i) * MB) for i in range(6)]
    assert keys(f.epoch_findings([fit(rising)])) == ["memory"]
    flat = [epoch(i, rss=(400 + i) * MB) for i in range(6)]
    assert f.epoch_findings([fit(flat)]) == []
    steady = [epoch(i, sample=[0.01 + 0.0001 * (j % 7) for j in range(50)]) for i in range(5)]
    assert f.epoch_findings([fit(steady)]) == []
    slowing = steady[:-1] + [epoch(4, sample=[0.02 + 0.0001 * (j % 7) for j in range(50)], steps_s=2.0)]
    found = f.epoch_findings([fit(slowing)])
    assert keys(found) == ["decline"] and "epoch 5's ran 1.97x" in found[0].text
    assert f.epoch_findings([fit(slowing[2:])]) == []  # three epochs: too few to say a decline


def test_a_generator_is_named_when_making_batches_took_a_share_of_the_steps():
    slow = fit([epoch(0, steps_s=2.0), epoch(1, steps_s=2.0)], input="a Python generator", input_s=3.6,
               input_batches=200)
    found = f.input_findings([slow])
    assert keys(found) == ["input"] and "200 batches (18 ms a batch), 90% of the steps' 4.0 s" in found[0].text
    assert "can go no faster than it" in found[0].text and "PyDataset with workers" in found[0].fix
    quick = fit([epoch(0, steps_s=2.0), epoch(1, steps_s=2.0)], input="a Python generator", input_s=0.4,
                input_batches=200)
    assert f.input_findings([quick]) == []
    assert not any("waiting for input" in n for n in analyse([process([slow])], 9.0).not_measured)


def test_a_pydataset_is_named_by_its_workers_with_the_fix_that_fits_them():
    def slow(**extra):
        return fit([epoch(0, steps_s=2.0), epoch(1, steps_s=2.0)], input="a keras.utils.PyDataset", input_s=3.6,
                   input_batches=200, **extra)

    (one,) = f.input_findings([slow(input_workers=1, input_processes=False)])
    assert "the PyDataset (one worker) given to fit() at train.py:10 took 3.6 s to make 200 batches" in one.text
    assert "workers=4, use_multiprocessing=True" in one.fix
    (threads,) = f.input_findings([slow(input_workers=4, input_processes=False)])
    assert "the PyDataset (4 worker threads) given to fit() at train.py:10 took 3.6 s to hand over" in threads.text
    assert threads.fix.startswith("use_multiprocessing=True") and "more workers than 4" in threads.fix
    (processes,) = f.input_findings([slow(input_workers=4, input_processes=True)])
    assert "(4 worker processes)" in processes.text and processes.fix.startswith("more workers than 4")


def test_a_pydatasets_batches_are_timed_in_a_watched_fit(tmp_path):
    """Keras iterates a PyDataset through its own generator (tf.data's from_generator on TensorFlow): each batch
    made is timed where it is made, without --profile-steps, and the finding names it."""
    import keras
    import numpy as np

    from tfperf.watch import session

    class Slow(keras.utils.PyDataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            time.sleep(0.05)  # decoding a batch in Python
            return np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32")

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    with session() as seen:
        model.fit(Slow(), epochs=2, verbose=0)
    (fitted,) = seen.record["fits"]
    assert fitted["input"] == "a keras.utils.PyDataset" and fitted["input_workers"] == 1
    assert fitted["input_batches"] >= 24 and fitted["input_s"] >= 24 * 0.05
    (found,) = [x for x in seen.findings if x.key == "input"]
    assert "the PyDataset (one worker) given to fit() at" in found.text and "test_watch.py" in found.text


def test_an_epochs_last_execution_counts_only_the_batches_it_held():
    # Records from before the probe capped them: 36 batches an epoch (4,500 rows at 128), steps_per_execution 64
    old = fit([epoch(0, steps=1, sample=[0.5]), epoch(1, steps=1, sample=[0.5])], batch_size=128,
              batches_per_epoch=36, steps_per_execution=64, rows=4500, validation_split=0.0)
    for e in old["epochs_run"]:
        e["batches"] = 64
    assert f.epoch_batches(old, old["epochs_run"][1]) == (36, [36])
    assert f.epoch_examples(old, old["epochs_run"][1]) == 4500  # not 64 x 128, nor 36 x 128


def test_fit_in_a_loop_is_named_once():
    fits = [fit([epoch(0, trace_s=0.3)], seconds=1.5) for _ in range(5)]
    found = f.fit_loop_findings(fits)
    assert keys(found) == ["fit loop"] and "called 5 times" in found[0].text
    assert f.fit_loop_findings(fits[:2]) == []


def test_a_run_with_no_keras_says_so_and_a_killed_one_says_it_is_partial():
    empty = analyse([], 3.0)
    assert empty.findings == [] and "only its wall time" in empty.not_measured[0]
    assert "no Keras or TensorFlow work" in markdown(empty, ["bash", "run.sh"], "exit 0")
    cut = analyse([process([fit([epoch(0)])], complete=False)], 5.0)
    assert any("before its exit handlers" in n for n in cut.not_measured)
    quiet = markdown(analyse([process([fit([epoch(i) for i in range(3)])])], 5.0), ["python", "t.py"], "exit 0")
    assert "Nothing in this run crossed a finding's bar" in quiet and "Epochs (3 in 1 fit() call)" in quiet


def test_under_a_launcher_the_report_reads_rank_0_and_says_so():
    ranks = [{**process([fit([epoch(i) for i in range(3)])]), "pid": 10 + r, "rank": r} for r in (1, 0)]
    ranks[0]["fits"][0]["seconds"] = 99.0  # rank 1 worked longer: rank 0 is still the one read
    analysis = analyse(ranks, 20.0)
    assert analysis.process["rank"] == 0 and analysis.ranks == 2
    assert "this report reads rank 0 of 2 ranks (pid 10)" in markdown(analysis, ["horovodrun"], "exit 0")


def test_command_helpers():
    assert watch_command.program_name(["python", "-u", "train.py", "--epochs", "3"]) == "train"
    assert watch_command.program_name(["python3", "-m", "pkg.train"]) == "pkg-train"
    assert watch_command.program_name(["./run.sh"]) == "run"
    env = watch_command.child_environment({"PYTHONPATH": "/theirs"}, "/tmp/x")
    assert env["PYTHONPATH"] == watch_command.BOOT + os.pathsep + "/theirs" and env["TFPERF_WATCH_DIR"] == "/tmp/x"
    assert watch_command.ending(143, "SIGTERM") == "stopped by SIGTERM, exit 143"
    assert watch_command.ending(137, None) == "killed by SIGKILL" and watch_command.ending(3, None) == "exit 3"


def test_the_doctor_command_from_what_was_kept_or_why_not(tmp_path):
    kept = {"model": "model.keras", "loss": "mean_squared_error", "from_logits": False, "sample": "sample.npz",
            "sample_rows": 2048, "batch_size": 64, "epoch_examples": 60_000}
    cmd, why = watch_command.doctor_command(kept, tmp_path / "capture", tmp_path)
    assert cmd[:13] == ["tfperf", "doctor", str(tmp_path / "capture" / "model.keras"), "--quick", "--train",
                        "--loss", "mean_squared_error", "--no-threads", "--train-batch", "64", "--epoch-examples",
                        "60000", "--sample"]
    assert "2,048 of your rows and targets" in why
    no_rows = {**kept, "sample": None, "sample_error": "TypeError: fit() was given generator"}
    del no_rows["sample"]
    cmd, why = watch_command.doctor_command(no_rows, tmp_path, tmp_path)
    assert "--sample" not in cmd and "rows the doctor makes up (yours could not be kept: TypeError" in why
    assert watch_command.doctor_command(None, tmp_path, tmp_path)[0] is None
    assert "could not be saved" in watch_command.doctor_command({"model_error": "x"}, tmp_path, tmp_path)[1]
    assert "--loss NAME" in watch_command.doctor_command({"model": "m", "loss": None}, tmp_path, tmp_path)[1]
    analysis = analyse([process([fit([epoch(0)])])], 5.0)
    said = "Model ...\n\n**Best configuration for training**: batch 256: 2.0x\n```python\ncode\n```\nAdvice, ...\n1. x"
    ran = markdown(analysis, ["python", "t.py"], "exit 0", doctor_lines(
        {"command": cmd, "why": why, "captured": kept, "exit_code": 0, "said": said}))
    assert "searched on your model and rows the doctor makes up" in ran
    assert "**Best configuration for training**: batch 256: 2.0x\n```python\ncode\n```\n" in ran
    assert "Advice, " not in ran and "Model ..." not in ran
    failed = doctor_lines({"command": cmd, "why": why, "captured": kept, "exit_code": 2, "said": "error: x\n"})
    assert "```text" in failed and "error: x" in failed
    told = markdown(analysis, ["python", "t.py"], "exit 0", doctor_lines({"command": cmd, "why": why,
                                                                          "captured": kept}))
    assert "To search the best configuration" in told and "```bash\ntfperf doctor" in told


def test_doctor_from_a_watch_folder_searches_what_it_kept_or_says_what_to_run(tmp_path, capsys):
    """`tfperf doctor --from DIR` (issue 72): the kept model, loss, logits and rows in place of MODEL and its flags."""
    import argparse

    from tfperf.cli import main
    from tfperf.doctor.command import from_watch

    (tmp_path / "capture").mkdir()
    (tmp_path / "capture" / "capture.json").write_text(json.dumps(
        {"model": "model.keras", "loss": "sparse_categorical_crossentropy", "from_logits": True,
         "sample": "sample.npz", "sample_rows": 256, "batch_size": 64, "epoch_examples": 6400}))
    args = argparse.Namespace(model=None, from_watch=str(tmp_path), train=False, loss=None, from_logits=False,
                              sample=None, out=None, train_batch=None, epoch_examples=None)
    from_watch(args)
    assert (args.model, args.train, args.loss, args.from_logits, args.train_batch, args.epoch_examples) == (
        str(tmp_path / "capture" / "model.keras"), True, "sparse_categorical_crossentropy", True, 64, 6400)
    assert args.sample == str(tmp_path / "capture" / "sample.npz") and args.out == str(tmp_path / "doctor")
    # The flags the user gives win over what was kept; the capture folder itself may be given.
    args = argparse.Namespace(model=None, from_watch=str(tmp_path / "capture"), train=False, loss="mse",
                              from_logits=False, sample="mine.npz", out="elsewhere", train_batch=None,
                              epoch_examples=None)
    from_watch(args)
    assert (args.loss, args.sample, args.out) == ("mse", "mine.npz", "elsewhere")
    # Each refusal one line, exit 2, before anything loads.
    (tmp_path / "nothing").mkdir()
    (tmp_path / "unsaved" / "capture").mkdir(parents=True)
    (tmp_path / "unsaved" / "capture" / "capture.json").write_text(json.dumps({"model_error": "TypeError: x"}))
    for argv, said in [(["doctor", "--from", str(tmp_path / "nothing")], "no capture.json there"),
                       (["doctor", "m.keras", "--from", str(tmp_path)], "give a model or --from"),
                       (["doctor", "--from", str(tmp_path / "unsaved")], "could not be saved as a .keras file"),
                       (["doctor"], "give the model to diagnose"),
                       (["doctor", "cnn", "--epoch-examples", "600"], "--epoch-examples is for --train")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def doctor_records(folder, best_metrics, label="steps_per_execution=16, batch 128"):
    (folder / "doctor").mkdir(parents=True)
    rows = [{"table": "best configuration against plain fit", "row": "plain fit (batch 32)",
             "metrics": {"batch": 32, "steps_per_execution": 1, "jit_compile": False, "policy": "float32"}},
            {"table": "best configuration against plain fit", "row": label, "ratio": 2.4, "metrics": best_metrics}]
    (folder / "doctor" / "doctor.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def test_apply_reads_the_doctors_best_and_refuses_what_it_cannot_use(tmp_path):
    from tfperf.flags import UserError
    from tfperf.watch import confirm

    with pytest.raises(UserError, match="no doctor's records there"):
        confirm.best_configuration(tmp_path)
    doctor_records(tmp_path, {"batch": 128, "steps_per_execution": 16, "jit_compile": False, "policy": "float32"})
    best = confirm.best_configuration(tmp_path)
    assert (best["label"], best["claim"], best["batch"], best["steps_per_execution"]) == (
        "steps_per_execution=16, batch 128", 2.4, 128, 16)
    assert json.loads(confirm.apply_environment(best)) == {"steps_per_execution": 16, "jit_compile": False,
                                                           "policy": "float32", "batch": 128}
    with pytest.raises(UserError, match="no watch.json there"):
        confirm.earlier_run(tmp_path)
    # Where the doctor recommends the best at the user's batch (its larger batch did not pay apart), that one applies.
    records = tmp_path / "doctor" / "doctor.jsonl"
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    yours = {"table": rows[0]["table"], "row": "steps_per_execution=16", "ratio": 2.1,
             "metrics": {"batch": 32, "steps_per_execution": 16, "jit_compile": False, "policy": "float32",
                         "recommended": True}}
    records.write_text("\n".join(json.dumps(r) for r in [rows[0], yours, rows[1]]))
    assert confirm.best_configuration(tmp_path)["label"] == "steps_per_execution=16"


def test_the_confirmation_compares_epoch_for_epoch_and_says_what_did_not_apply(tmp_path):
    from tfperf.watch import confirm

    before = fit([epoch(i, seconds=2.0, steps_s=1.5, steps=100, sample=[0.015] * 50) for i in range(3)],
                 steps_per_execution=1, dtype_policy="float32")
    faster = fit([epoch(i, seconds=0.5, steps_s=0.3, steps=25, sample=[0.012] * 25) for i in range(2)],
                 batch_size=128, steps_per_execution=1, dtype_policy="float32")
    for e, loss in zip(before["epochs_run"] + faster["epochs_run"], (0.9, 0.8, 0.7, 0.95, 0.85)):
        e["loss"] = loss
    after = {**process([faster]), "applied": {"not_applied": ["policy: kept float32"], "learning_rate": 0.002,
                                              "batch_size": 128}}
    best = {"label": "batch 128", "claim": 2.4}
    lines = "\n".join(confirm.confirmation_lines(before, [after], best, tmp_path))
    # epoch 2 only (the shorter run's count): 100 x 32 examples in 2.0 s against 25 x 128 in 0.5 s
    assert "1,600 examples/s over epoch 2" in lines and "6,400 examples/s, **4.00x**" in lines
    assert "The steps alone, per example: 5.00x" in lines and "Not applied: policy: kept float32." in lines
    assert "Its epochs took 6.0 s in all as configured (3 epochs) and 1.0 s with the change (2 epochs)" in lines
    assert "learning rate scaled to 0.002" in lines
    assert "Loss after epoch 2: 0.8 as configured, 0.85 with the change (a larger batch" in lines
    missing = confirm.confirmation_lines(before, [process()], best, tmp_path)
    assert "Not confirmed: this run ran no fit()" in "\n".join(missing)


def test_apply_puts_the_knobs_on_the_first_fit():
    import inspect as inspect_

    import keras
    import numpy as np

    from tfperf.watch.keras_hooks import apply_to_fit

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    bound = inspect_.signature(keras.Model.fit).bind(model, np.zeros((64, 4)), np.zeros((64, 2)), batch_size=32)
    done = apply_to_fit(model, bound, {"steps_per_execution": 16, "jit_compile": False, "batch": 128})
    assert model.steps_per_execution == 16 and bound.arguments["batch_size"] == 128 and done["batch_size"] == 128
    assert done["not_applied"] == []
    mixed = apply_to_fit(model, bound, {"policy": "mixed_bfloat16"})  # set when Keras loads: this model predates it
    assert "mixed_bfloat16: the model runs float32" in mixed["not_applied"][0]
    assert done["learning_rate"] == pytest.approx(2e-3) and float(model.optimizer.learning_rate) == pytest.approx(2e-3)
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((np.zeros((64, 4)), np.zeros((64, 2)))).batch(32)
    bound = inspect_.signature(keras.Model.fit).bind(model, data)
    done = apply_to_fit(model, bound, {"steps_per_execution": 16, "jit_compile": False, "batch": 128})
    assert "batch 128: fit() was given" in done["not_applied"][0] and "batch_size" not in done


def test_a_session_watches_a_block_in_this_process_and_puts_everything_back(tmp_path):
    import keras
    import numpy as np
    from tensorflow.python.eager.polymorphic_function import polymorphic_function, tracing_compilation

    from tfperf.watch import probe, session

    patched = (keras.Model.fit, keras.Model.predict, tracing_compilation._create_concrete_function,
               polymorphic_function.Function.__call__, keras.callbacks.CallbackList.on_epoch_end)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    x, y = np.zeros((64, 4), "float32"), np.zeros((64, 2), "float32")
    with session(out=tmp_path / "w") as seen:
        model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        for _ in range(12):
            model.predict(x[:2], verbose=0)
    assert [len(f["epochs_run"]) for f in seen.record["fits"]] == [2] and seen.record["fits"][0]["batch_size"] == 16
    assert "predict loop" in keys(seen.findings) and "test_watch.py" in seen.record["fits"][0]["site"]
    assert "`with tfperf.watch.session()` ran" in (tmp_path / "w" / "report.md").read_text()
    assert probe.RECORDER is None and patched == (
        keras.Model.fit, keras.Model.predict, tracing_compilation._create_concrete_function,
        polymorphic_function.Function.__call__, keras.callbacks.CallbackList.on_epoch_end)
    model.compile("adam", "mse", steps_per_execution=3)
    with session() as again:  # a second session patches again
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert len(again.record["fits"]) == 1 and again.report is None
    (e,) = again.record["fits"][0]["epochs_run"]  # 4 batches: Keras names 0-2 and 3-5, the second holds one
    assert (e["batches"], e["step_batches"]) == (4, [3, 1])


def test_a_keras_callback_watches_its_fit_and_gives_everything_back(tmp_path):
    """`tfperf.keras.Watch()` (issue 72): one fit watched from inside it, its slow callback named with its share,
    the other callbacks' hooks and Keras' classes given back; a fit that raised is closed by the next one."""
    import keras
    import numpy as np

    import tfperf
    from tfperf.watch import probe

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.01)

    patched = (keras.Model.fit, keras.Model.evaluate, keras.callbacks.CallbackList.on_train_batch_end)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    x, y = np.zeros((256, 4), "float32"), np.zeros((256, 2), "float32")
    slow, watch = Slow(), tfperf.keras.Watch(out=tmp_path / "w")
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_split=0.25, callbacks=[slow, watch])
    (fitted,) = watch.record["fits"]
    assert fitted["batch_size"] == 16 and fitted["batches_per_epoch"] == 12 and fitted["validation"]
    assert [e["batches"] for e in fitted["epochs_run"]] == [12, 12] and "test_watch.py" in fitted["site"]
    assert all(e["validation_s"] > 0 for e in fitted["epochs_run"])
    timed = [e["callbacks"].get("Slow", 0.0) for e in fitted["epochs_run"]]
    assert all(t >= 12 * 0.01 for t in timed), timed  # 12 batches of 10 ms each, in every epoch
    callback = next(f for f in watch.findings if f.key.startswith("callback"))
    assert "Slow" in callback.text and "%" in callback.text
    assert "tfperf.keras.Watch()" in (tmp_path / "w" / "report.md").read_text()
    assert probe.RECORDER is None and "on_train_batch_end" not in vars(slow)
    assert patched == (keras.Model.fit, keras.Model.evaluate, keras.callbacks.CallbackList.on_train_batch_end)
    # A fit that raises never calls on_train_end: the next Watch ends that one first.
    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("the user's callback failed")

    broken, again = tfperf.keras.Watch(), tfperf.keras.Watch()
    with pytest.raises(RuntimeError):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[broken, Boom()])
    assert probe.RECORDER is not None and broken.record is None
    model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[again])
    assert broken.record is not None and len(again.record["fits"]) == 1 and probe.RECORDER is None
    # Under another watch (a session here; `tfperf watch --`'s probe alike) the callback steps aside, the fit runs.
    from tfperf.watch import session

    inside = tfperf.keras.Watch()
    with session() as outer:
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[inside])
    assert inside.record is None and "another tfperf watch" in inside.skipped and len(outer.record["fits"]) == 1


def test_under_a_launcher_each_ranks_watch_writes_its_own_report(tmp_path, monkeypatch):
    """Under `horovodrun -np 2` each rank runs the same script with the same `out`: rank 0 writes there, as alone,
    and rank 1 in out/rank1, each report naming its rank (both had written one report.md, the last one kept)."""
    import keras
    import numpy as np

    import tfperf.keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    x, y = np.zeros((64, 4), "float32"), np.zeros((64, 2), "float32")
    for rank in ("1", "0"):
        monkeypatch.setenv("HOROVOD_RANK", rank)
        watch = tfperf.keras.Watch(out=tmp_path / "w")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[watch])
        assert watch.record["rank"] == int(rank)
    assert sorted(p.relative_to(tmp_path / "w").as_posix() for p in (tmp_path / "w").rglob("*.md")) == [
        "rank1/report.md", "report.md"]
    assert "reads the process of rank 1 alone" in (tmp_path / "w" / "rank1" / "report.md").read_text()
    assert "reads the process of rank 0 alone" in (tmp_path / "w" / "report.md").read_text()


def test_traced_steps_say_how_much_of_a_step_waits_for_input(tmp_path):
    """--profile-steps (issue 72): a few steps of the first fit traced, and XProf's share of a step waiting for input
    read: a pipeline that sleeps for each batch is named with the fix; a cached, prefetched one is said not to be;
    the traced steps stay out of the sample a typical step is read from."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfperf.watch import session

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    x, y = np.zeros((320, 4), "float32"), np.zeros((320, 2), "float32")

    def slow(a, b):
        time.sleep(0.02)
        return a, b

    def load(a, b):  # a batch read from somewhere slow, 20 ms each, without prefetch
        a, b = tf.numpy_function(slow, [a, b], (tf.float32, tf.float32))
        return tf.ensure_shape(a, [None, 4]), tf.ensure_shape(b, [None, 2])

    waits = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).map(load)
    with session(out=tmp_path / "slow", profile_steps=6) as seen:
        model.fit(waits, epochs=2, verbose=0)
    traced = seen.record["profile"]
    assert (traced["steps"], traced["epoch"]) == (6, 1) and traced["input"]["steps"] >= 3, traced
    (finding,) = [f for f in seen.findings if f.key == "input"]
    assert traced["input"]["share"] >= 0.5 and "waited for input" in finding.text and "prefetch" in finding.fix
    epoch2 = seen.record["fits"][0]["epochs_run"][1]
    assert epoch2["profiled_steps"] == 6 and len(epoch2["step_sample"]) == epoch2["steps"] - 6
    assert (tmp_path / "slow" / "traces").is_dir() and "(6 under the profiler)" in (tmp_path / "slow" /
                                                                                     "report.md").read_text()
    quick = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).cache().prefetch(tf.data.AUTOTUNE)
    with session(profile_steps=6) as seen:
        model.fit(quick, epochs=1, verbose=0)  # one epoch: traced after its first 5 steps
    assert seen.record["profile"]["epoch"] == 0 and not [f for f in seen.findings if f.key == "input"]
    assert seen.analysis.input_line.startswith("Waiting for input: the steps traced in epoch 1 (XProf read ")
    assert seen.analysis.input_line.endswith("not input-bound.") and not any(
        "waiting for input is inside" in n for n in seen.analysis.not_measured)
    # The fix fits what fit() was given: a PyDataset makes its batches in workers, not in a tf.data map.
    from tfperf.watch.findings import traced_input
    from tfperf.watch.keras_hooks import _input_kind

    class Rows(keras.utils.PyDataset):
        def __len__(self):
            return 1

    assert [_input_kind(v) for v in (quick, Rows(), iter([1]), x)] == ["tf.data", "PyDataset", "generator", "arrays"]
    record = {"profile": {"fit": 0, "epoch": 1, "steps": 10, "input": {"share": 0.85, "steps": 8}}}
    (found,), _ = traced_input(record, [{"input_kind": "PyDataset", "epochs_run": [{"steps_s": 2.0}]}])
    assert "workers=4, use_multiprocessing=True" in found.fix and found.seconds == pytest.approx(1.7)


def test_a_capture_of_a_batched_dataset_says_its_batch(tmp_path):
    """fit(dataset) gives Keras no batch size: the capture reads it from the dataset's first batch (it said None)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfperf.watch.keras_hooks import capture

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((100, 4), "float32"), np.zeros((100, 2), "float32"))).batch(24)
    said = capture(model, {"x": ds}, None, str(tmp_path))
    assert said["batch_size"] == 24 and said["sample_rows"] == 100 and said["loss"] == "mse"
    # An epoch's examples, for the doctor's gain in seconds an epoch: 5 batches of 24 (the last one counted whole).
    assert said["epoch_examples"] == 120
    from tfperf.watch.keras_hooks import epoch_rows

    x = np.zeros((100, 4), "float32")
    assert epoch_rows({"x": x, "validation_split": 0.2}, 32) == 80 and epoch_rows({"x": {"a": x}}, None) == 100
    assert epoch_rows({"x": ds, "steps_per_epoch": 3}, 24) == 72 and epoch_rows({"x": ds.repeat()}, 24) is None

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 7

        def __getitem__(self, index):
            return x[:10], x[:10]

    assert epoch_rows({"x": Batches()}, None) is None  # its len() counts batches, not examples


def test_the_loss_is_named_as_the_doctor_takes_it():
    import keras

    from tfperf.watch.keras_hooks import _loss_name

    assert _loss_name(keras.losses.SparseCategoricalCrossentropy(from_logits=True)) == (
        "sparse_categorical_crossentropy", True)
    assert _loss_name("mse") == ("mse", False)
    assert _loss_name(keras.losses.mean_squared_error) == ("mean_squared_error", False)


def test_the_programs_own_sitecustomize_still_runs_and_without_the_watch_nothing_is_loaded(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    check = ("import os, sys; print(os.environ.get('THEIRS'), "
             "getattr(sys.modules.get('_tfperf_watch_probe'), 'RECORDER', None) is not None)")
    env = watch_command.child_environment({**os.environ, "PYTHONPATH": str(theirs)}, str(tmp_path))
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["ran", "True"], done.stderr
    env = watch_command.child_environment({**os.environ, "PYTHONPATH": str(theirs)}, str(tmp_path / "gone"))
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["ran", "False"], done.stderr  # no folder to record into: nothing recorded


def test_apply_refuses_to_write_over_the_run_it_compares_with(tmp_path, capsys):
    from tfperf.cli import main

    assert main(["watch", "--apply", str(tmp_path), "--out", str(tmp_path), "--", "python", "t.py"]) == 2
    assert "its watch.json would be overwritten" in capsys.readouterr().err


def test_a_record_cut_midway_is_skipped(tmp_path):
    (tmp_path / "process-1.json").write_text(json.dumps({"pid": 1}))
    (tmp_path / "process-2.json").write_text('{"pid": 2, "fi')
    assert [r["pid"] for r in watch_command.read_records(tmp_path)] == [1]


def test_what_runs_inside_the_watched_program_imports_the_standard_library_alone():
    """The probe and the siblings it loads by path run in the user's interpreter, which may not have tfperf (or
    NumPy) installed: they import nothing else (Keras and TensorFlow are read from sys.modules, once loaded)."""
    import ast
    from pathlib import Path

    import tfperf.watch

    def imported(nodes):
        names = {a.name.split(".")[0] for n in nodes if isinstance(n, ast.Import) for a in n.names}
        return names | {n.module.split(".")[0] for n in nodes if isinstance(n, ast.ImportFrom) and n.module}

    folder = Path(tfperf.watch.__file__).parent
    stdlib = sys.stdlib_module_names | {"__future__"}
    for name in ("probe.py", "keras_hooks.py", "tracing_hooks.py", "census.py", "boot/sitecustomize.py"):
        tree = ast.parse((folder / name).read_text())
        assert imported(tree.body) <= stdlib, (name, imported(tree.body) - stdlib)  # at load: nothing else
        # inside the Keras hooks, once the program has loaded Keras (and so NumPy)
        assert imported(ast.walk(tree)) <= stdlib | {"keras", "numpy"}, name


def test_bad_command_lines_are_one_line_errors(capsys):
    from tfperf.cli import main

    assert main(["watch"]) == 2 and "give the command to watch after --" in capsys.readouterr().err
    assert main(["watch", "--out", __file__, "--", "true"]) == 2
    assert capsys.readouterr().err.startswith("tfperf watch: error: --out ")  # the command's name, not its argv
    assert main(["watch", "--", "/no/such/program"]) == 2
    err = capsys.readouterr().err
    assert "cannot run '/no/such/program'" in err and len(err.strip().splitlines()) == 1


SCRIPT = """
import sys
import time
import numpy as np
import keras
import tensorflow as tf

class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        sum(range(20000))

x = np.random.rand(256, 8).astype("float32"); y = np.random.randint(0, 2, 256)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs=int(sys.argv[1]), validation_split=0.25, callbacks=[Slow()], verbose=0)

@tf.function
def scaled(t, k):
    return t * k

for i in range(4):
    scaled(tf.constant(x[:2]), float(i))
for _ in range(12):
    model.predict(x[:4], verbose=0)
for i in range(4):  # a new tf.function each time round
    tf.function(lambda t: t + 1)(tf.constant(1.0))


class OwnStep(keras.Model):  # its own train_step, fed by a Python generator that takes its time
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


def batches():
    while True:
        time.sleep(0.006)  # reading and decoding, one batch at a time
        yield x[:32], y[:32]


inputs = keras.Input((8,))
own = OwnStep(inputs, keras.layers.Dense(2)(inputs))
own.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
own.fit(batches(), steps_per_epoch=60, epochs=2, verbose=0)
open("made_by_the_script.txt", "w").write("ok")
print("script says", sys.argv[1:])
sys.exit(3)
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """One watched run of SCRIPT with --capture (the smoke test reads it; the --apply test compares with it)."""
    folder = tmp_path_factory.mktemp("watched")
    (folder / "train.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "tfperf", "watch", "--capture", "--out", "report", "--",
                           sys.executable, "train.py", "3", "--flag"], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300)
    listing = sorted(p.name for p in folder.iterdir())
    return folder, done, listing


@pytest.mark.slow
@pytest.mark.xdist_group("watch")  # the two tests of the captured run on one worker: it runs once
def test_the_watched_script_runs_as_its_own_and_the_report_names_what_it_did(captured):
    tmp_path, done, listing = captured
    out = tmp_path / "report"
    assert done.returncode == 3, done.stderr[-2000:]  # the script's exit code, its output, its files, its cwd
    assert "script says ['3', '--flag']" in done.stdout and "tfperf" not in done.stdout
    assert (tmp_path / "made_by_the_script.txt").read_text() == "ok"
    assert listing == ["made_by_the_script.txt", "report", "train.py"]
    record = json.loads((out / "watch.json").read_text())
    (p,) = [p for p in record["processes"] if p["fits"]]
    assert [f["model"] for f in p["fits"]] == ["Sequential", "OwnStep"]
    assert len(p["fits"][0]["epochs_run"]) == 3 and p["fits"][0]["batch_size"] == 32
    assert p["fits"][0]["epochs_run"][1]["callbacks"]["Slow"] > 0 and p["fits"][0]["site"] == "train.py:15"
    report = (out / "report.md").read_text()
    assert "(exit 3)" in report and "`scaled` (train.py:17) was traced 4 times" in report
    assert "a new Python value for `k`" in report and "predict() was called 12 times at train.py:24" in report
    assert "was traced 4 times" in report and "a new function object 3 times" in report  # the lambda's line
    (scaled,) = [fn for fn in p["functions"].values() if fn["name"] == "scaled"]
    assert scaled["calls"] == 4 and scaled["defined_at"] == "train.py:17" and scaled["site"] == "train.py:22"
    assert "the program's own tf.functions (their tracing included)" in report
    own_fit = next(f for f in p["fits"] if f["model"] == "OwnStep")
    assert [e["batches"] for e in own_fit["epochs_run"]] == [60, 60] and own_fit["site"] == "train.py:47"
    assert "the Python generator given to fit() at train.py:47 took" in report
    assert re.search(r"\d+ batches \(\d+ ms a batch\)", report)
    assert "tfperf watch: `" in done.stderr and "report: report/report.md" in done.stderr
    # --capture: the first fit's model, 192 training rows (256 less the validation split) and its settings
    assert json.loads((out / "capture" / "capture.json").read_text())["sample_rows"] == 256
    assert ("tfperf doctor report/capture/model.keras --quick --train --loss sparse_categorical_crossentropy "
            "--no-threads --from-logits --train-batch 32 --epoch-examples 192 --sample report/capture/sample.npz "
            "--out report/doctor") in report
    assert "Your first fit() ran at batch 32, steps_per_execution 1, jit_compile False, float32" in report


@pytest.mark.slow
@pytest.mark.xdist_group("watch")
def test_apply_runs_the_doctors_best_in_the_users_own_fit_and_compares(captured, tmp_path):
    first, _, _ = captured
    shutil.copytree(first / "report", tmp_path / "run")  # the earlier run, as --doctor would have left it
    (tmp_path / "train.py").write_text(SCRIPT)
    doctor_records(tmp_path / "run", {"batch": 64, "steps_per_execution": 4, "jit_compile": False,
                                      "policy": "float32"}, label="steps_per_execution=4, batch 64")
    applied = subprocess.run([sys.executable, "-m", "tfperf", "watch", "--apply", "run", "--", sys.executable,
                              "train.py", "3"], cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300)
    assert applied.returncode == 3, applied.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "applied" / "watch.json").read_text())
    (p,) = [p for p in record["processes"] if p["fits"]]
    assert p["fits"][0]["steps_per_execution"] == 4 and p["fits"][0]["batch_size"] == 64  # the first fit only:
    assert p["fits"][1]["steps_per_execution"] == 1  # the program's other models are left as they are
    report = (tmp_path / "run" / "applied" / "report.md").read_text()
    assert "## The doctor's best configuration, confirmed in your run" in report
    assert "it ran at batch 64, steps_per_execution 4" in report and re.search(r"\*\*\d+\.\d\dx\*\*", report)
    assert "Loss after epoch 3:" in report


@pytest.mark.slow
def test_sigterm_leaves_a_partial_report_and_the_signal_exit_code(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT.replace("epochs=int(sys.argv[1])", "epochs=10_000"))
    out, scratch = tmp_path / "report", tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(scratch)}  # where the probe's records go
    watch = subprocess.Popen([sys.executable, "-m", "tfperf", "watch", "--out", str(out), "--", sys.executable,
                              "train.py", "1"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any('"epochs_run": [{' in p.read_text(errors="ignore")
                                                   for p in scratch.glob("tfperf-watch-*/process-*.json")):
        time.sleep(0.2)
    watch.send_signal(signal.SIGTERM)
    _, err = watch.communicate(timeout=60)
    assert watch.returncode == 143, err[-2000:]
    report = (out / "report.md").read_text()
    assert "stopped by SIGTERM" in report and "fit()" in report
    assert json.loads((out / "watch.json").read_text())["stopped_by"] == "SIGTERM"
