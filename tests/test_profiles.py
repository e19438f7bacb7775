"""Profiler traces read through XProf: a small real trace converts to op times that are XProf's own
framework_op_stats, the profiler calls a loop that sleeps in its input pipeline input-bound and the
same pipeline cached and prefetched not, and the recipes' --profile prints the top operations."""

import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tfperf.measure import Timer
from tfperf.measure.profiles import (KINDS, OpTime, TraceError, by_type, input_analysis, op_times, ops_table,
                                     peak_memory, time_by_kind, tool, trace_files, traces_by_run)
from tfperf.recipe import where_the_time_went

# Alone on the machine (`make test` runs these after its two workers): the profiler's verdicts and shares are of a
# trace taken here, which another test's load changes. The tests of what a trace holds, not of its times, run beside.
alone = pytest.mark.whole_machine


@pytest.fixture(scope="module")
def matmul_trace(tmp_path_factory):
    """A trace of 5 calls of a tf.function: two matmuls and a softmax on a 256x256 matrix."""
    root = tmp_path_factory.mktemp("traces")
    x = tf.random.normal([256, 256], seed=0)
    w = tf.random.normal([256, 256], seed=1)
    layer = tf.function(lambda: tf.nn.softmax(tf.matmul(tf.nn.relu(tf.matmul(x, w)), w)))
    timer = Timer(layer, name="two matmuls")
    timer.start(warmup=1)
    return root, timer.profile(root, steps=5)


@alone
def test_a_small_trace_converts_to_xprofs_own_op_stats(matmul_trace):
    root, where = matmul_trace
    assert where.parent == root and where.name == "two-matmuls"
    paths = trace_files(where)
    ops = op_times(paths)
    # The ranking is XProf's framework_op_stats, idle time left out, read here without our parser.
    table = tool(paths, "framework_op_stats")[0]
    ids = [c["id"] for c in table["cols"]]
    raw = sorted(([cell["v"] for cell in row["c"]] for row in table["rows"]),
                 key=lambda r: -r[ids.index("total_self_time")])
    raw = [r for r in raw if r[ids.index("type")] != "IDLE"]
    assert [(o.type, o.name) for o in ops] == [(r[ids.index("type")], r[ids.index("operation")]) for r in raw]
    assert np.isclose(sum(o.share for o in ops), 1.0)
    matmuls = [o for o in ops if "MatMul" in o.type]
    assert len(matmuls) == 2 and all(o.occurrences >= 5 for o in matmuls)  # each at least once per call
    top_type, seconds, share = by_type(ops)[0]
    assert "MatMul" in top_type and share > 0.5 and seconds > 0
    assert ops_table(ops, limit=2).count("\n") == 3  # a header, a rule, two rows
    kinds = time_by_kind(ops)
    assert list(kinds) == list(KINDS) and np.isclose(sum(kinds.values()), 1.0) and kinds[KINDS[0]] > 0.5
    # TensorFlow's CPU memory profile comes from oneDNN's allocator, which is off by default on CPUs without AVX-512
    # VNNI or AMX (this project's AMD machines): there the trace holds no allocator, and peak_memory says so by an
    # empty answer. The profile itself is read in a process with oneDNN on (the next test).
    peaks = peak_memory(paths)
    assert peaks == {} or any(b > 256 * 256 * 4 for b in peaks.values())  # at least one 256x256 float32 result
    assert traces_by_run(root) == {"two-matmuls": paths}
    with pytest.raises(TraceError, match="no profiler trace"):
        trace_files(root / "nothing-here")


def test_the_peak_memory_of_a_trace_with_onednns_allocator_is_read(tmp_path):
    from conftest import run

    code = ("import sys, tensorflow as tf; from tfperf.measure import Timer; "
            "x = tf.random.normal([256, 256]); f = tf.function(lambda: tf.nn.relu(tf.matmul(x, x))); "
            "t = Timer(f, name='mm'); t.start(warmup=1); print(t.profile(sys.argv[1], steps=3))")
    where = run([sys.executable, "-c", code, tmp_path], env={"TF_ENABLE_ONEDNN_OPTS": "1"}).stdout.strip().splitlines()[-1]
    peaks = peak_memory(trace_files(where))
    assert "mklcpu" in peaks and peaks["mklcpu"] >= 256 * 256 * 4  # one 256x256 float32 result at least


@alone
def test_the_recipes_profile_flag_prints_the_top_operations_of_its_own_traces(matmul_trace):
    root, where = matmul_trace
    text = where_the_time_went(root)
    assert "## where the time went: two-matmuls" in text and "| MatMul" in text.replace("_Mkl", "").replace(
        "Fused", "")
    assert "By kind: matmuls and convolutions" in text
    assert "no trace written" in where_the_time_went(root, since=time.time() + 60)  # older traces are not this run's


def loop_trace(root, dataset, name):
    """A profiled training-like loop over `dataset`: each step reads a batch and computes for a few ms."""
    w = tf.Variable(tf.random.normal([64, 64], seed=0))
    work = tf.random.normal([384, 384], seed=1)

    @tf.function
    def step(x):
        y = work
        for _ in range(4):  # about a GFLOP: the step, not the read of a prefetched batch, takes the time
            y = tf.matmul(y, work) * 1e-3
        w.assign_sub(1e-6 * tf.matmul(x, tf.matmul(x, w), transpose_a=True) + tf.reduce_mean(y) * 0)

    it = iter(dataset)
    timer = Timer(lambda: step(next(it)), name=name)
    timer.start(warmup=1)
    return input_analysis(trace_files(timer.profile(root, steps=8, mark_steps=True)))


@alone
def test_the_profilers_input_verdict_both_ways(tmp_path):
    def load(x):  # stands in for a read that waits: 60 ms a batch, several steps' time (a step took 10 ms here)
        time.sleep(0.06)
        return x

    batches = tf.data.Dataset.from_tensor_slices(np.ones((4, 32, 64), np.float32))
    slow = batches.map(lambda x: tf.ensure_shape(tf.py_function(load, [x], tf.float32), [32, 64])).repeat()
    fast = batches.map(lambda x: tf.ensure_shape(tf.py_function(load, [x], tf.float32), [32, 64])).cache() \
        .repeat().prefetch(tf.data.AUTOTUNE)
    for _ in fast.take(4):  # the cache's first pass
        pass
    waiting = loop_trace(tmp_path, slow, "slow")
    assert waiting.input_bound and waiting.input_share > 0.5 and "input-bound" in waiting.conclusion
    assert waiting.steps >= 6 and waiting.slowest_stage
    # Each step's busy time is its time less its wait: a few ms of compute here, far under the 60 ms wait.
    assert len(waiting.step_busy_ms) == len(waiting.step_input_shares) and 0 < waiting.median_busy_ms < 60
    fed = loop_trace(tmp_path, fast, "fast")
    assert not fed.input_bound and fed.input_share < 0.2


def test_the_profiler_is_the_one_of_the_framework_the_process_runs(monkeypatch):
    """Keras 3 on JAX loads TensorFlow to seed its random numbers: TensorFlow's profiler would then trace none of
    the JAX work (seen: empty traces), so Keras' backend decides, then which framework is loaded."""
    import types

    from tfperf.measure.timer import profiler_framework

    def keras_on(backend):
        return types.SimpleNamespace(backend=types.SimpleNamespace(backend=lambda: backend))

    jax_module = types.ModuleType("jax")
    assert profiler_framework() == "tensorflow"  # this process: TensorFlow, Keras on TensorFlow
    monkeypatch.setitem(sys.modules, "jax", jax_module)
    assert profiler_framework() == "tensorflow"
    monkeypatch.setitem(sys.modules, "keras", keras_on("jax"))
    assert profiler_framework() == "jax"
    monkeypatch.delitem(sys.modules, "keras")
    monkeypatch.delitem(sys.modules, "tensorflow")
    assert profiler_framework() == "jax"
    monkeypatch.delitem(sys.modules, "jax")
    assert profiler_framework() == "tensorflow"  # neither loaded: TensorFlow's, imported when needed


def test_op_time_is_split_into_arithmetic_the_optimizer_input_and_the_rest():
    """What a low MFU is spent on: a training step's ops by kind, as the recipes' --profile prints it."""
    ops = [OpTime("Host", "MaxPoolGrad", "gradient_tape/cnn/max_pooling2d/MaxPoolGrad", 32, 0.3, 0.3),
           OpTime("Host", "Conv2DBackpropFilter", "gradient_tape/cnn/conv2d/Conv2DBackpropFilter", 32, 0.2, 0.2),
           OpTime("Host", "_FusedMatMul", "cnn/dense/Relu", 32, 0.2, 0.2),
           OpTime("Host", "Sqrt", "while/StatefulPartitionedCall/adam_1/Sqrt_5", 32, 0.1, 0.1),
           OpTime("Host", "Dataset", "Iterator::Root::Prefetch", 32, 0.1, 0.1),
           OpTime("Host", "Mul", "cnn/gradam/Mul", 32, 0.1, 0.1)]  # not an optimizer's scope
    arithmetic, optimizer, data, rest = time_by_kind(ops).values()
    assert np.allclose([arithmetic, optimizer, data, rest], [0.4, 0.1, 0.1, 0.4])
