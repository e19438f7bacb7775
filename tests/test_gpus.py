"""GPU decisions on fake device lists (no GPU here): 0, 1, 2 and 8 GPUs, compute capability 6.1 to 9.0, a
driver whose GPUs TensorFlow does not register. `pytest -k gpu` selects them."""

import subprocess

import pytest

from tfperf import gpus
from tfperf.gpus import Gpu, child_gpu_env, missing_gpus, mixed_policy, plan_devices, tf32_default, worker_gpus

A100 = Gpu("NVIDIA A100-SXM4-40GB", (8, 0), 40960)
V100 = Gpu("Tesla V100-SXM2-16GB", (7, 0), 16160)
P4 = Gpu("Tesla P4", (6, 1), 7680)
H100 = Gpu("NVIDIA H100 80GB HBM3", (9, 0), 81559)


@pytest.mark.parametrize("count, have, kind, per_gpu", [
    (2, [], "cpu", 1), (2, [A100], "logical-gpu", 2), (2, [A100, A100], "gpu", 1), (2, [A100] * 8, "gpu", 1),
    (4, [V100, V100], "logical-gpu", 2), (1, [A100], "gpu", 1), (3, [A100, A100], "logical-gpu", 2)])
def test_gpu_device_plans_on_fake_hosts(count, have, kind, per_gpu):
    plan = plan_devices(count, have)
    assert plan.kind == kind and plan.per_gpu == per_gpu and len(plan.names) == count and plan.note
    assert all(n.startswith("/GPU:" if have else "/CPU:") for n in plan.names)
    if kind == "logical-gpu":  # a one-GPU host runs the multi-device recipes on logical GPUs instead of failing
        assert plan.memory_limit_mb * per_gpu <= min(g.memory_mb for g in have) and "not scaling" in plan.note


def test_gpu_logical_split_without_known_memory_uses_the_guides_limit():
    assert plan_devices(2, [Gpu("GPU", (8, 0), None)]).memory_limit_mb == gpus.DEFAULT_LOGICAL_MB
    with pytest.raises(ValueError, match="at least one device"):
        plan_devices(0, [A100])


def test_gpu_driver_without_tensorflow_gpus_is_one_line():
    problem = missing_gpus([A100, A100], [])
    assert "nvidia-smi sees 2 GPU(s)" in problem and "tensorflow[and-cuda]" in problem and "\n" not in problem
    assert missing_gpus([A100], [A100]) is None and missing_gpus(None, []) is None and missing_gpus([], []) is None


@pytest.mark.parametrize("have, policy, tf32", [
    ([P4], None, False), ([V100], "mixed_float16", False), ([A100], "mixed_bfloat16", True),
    ([H100], "mixed_bfloat16", True), ([A100, V100], "mixed_float16", True), ([], None, False)])
def test_gpu_mixed_policy_and_tf32_follow_compute_capability(have, policy, tf32):
    assert mixed_policy(have) == policy and tf32_default(have) == tf32


def test_gpu_children_see_their_gpus_with_memory_growth():
    assert child_gpu_env([]) == {"CUDA_VISIBLE_DEVICES": "", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert child_gpu_env([1, 2])["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert [worker_gpus(i, 8) for i in range(2)] == [[0], [1]]  # one replica per worker
    assert [worker_gpus(i, 2) for i in range(4)] == [[0], [1], [0], [1]]  # round-robin
    assert worker_gpus(0, 0) == []
    from tfperf.measure.processes import child_env

    assert child_env({"PATH": "/bin"})["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert child_env({"TF_FORCE_GPU_ALLOW_GROWTH": "false"})["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"


def test_gpu_ranks_beyond_gpus_warn():
    assert "4 ranks on this host share 2 GPU(s)" in gpus.ranks_per_gpu_warning(4, 2)
    assert gpus.ranks_per_gpu_warning(2, 2) is None and gpus.ranks_per_gpu_warning(4, 0) is None


def test_gpu_nvidia_smi_answers_are_parsed_and_its_absence_is_none(monkeypatch):
    text = "NVIDIA A100-SXM4-40GB, 40960, 8.0\nTesla P4, 7680, 6.1\n"
    assert gpus.parse_nvidia_smi(text) == [A100, P4]
    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    fake = lambda argv, **kw: subprocess.CompletedProcess(argv, 0, stdout=text, stderr="")  # noqa: E731
    assert gpus.driver_gpus(run=fake) == [A100, P4]
    failed = lambda argv, **kw: subprocess.CompletedProcess(argv, 9, stdout="", stderr="no devices")  # noqa: E731
    assert gpus.driver_gpus(run=failed) == []
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    assert gpus.driver_gpus() is None  # no driver: a CPU host, nothing to diagnose


def test_gpu_diagnosis_is_in_the_environment_records_carry(monkeypatch):
    import tensorflow  # noqa: F401  (environment() reads TensorFlow's devices only once it is loaded)

    from tfperf.records.environment import environment

    found = environment()["gpu"]
    assert set(found) >= {"driver_gpus", "tensorflow_gpus", "compute_capability", "tf32_by_default",
                          "memory_growth", "horovod_gpu_operations", "problem"}
    d = gpus.diagnosis([A100], [], memory_growth=True)
    assert d["problem"] and d["tensorflow_gpus"] == [] and d["driver_gpus"] == [A100.name]


def test_gpu_one_gpu_host_splits_it_into_logical_gpus_instead_of_failing(monkeypatch):
    import tensorflow as tf

    from tfperf import devices

    fake = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    listed = tf.config.list_physical_devices
    made = []
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [fake] if kind == "GPU" else listed(kind))
    monkeypatch.setattr(tf.config, "set_logical_device_configuration", lambda dev, cfg: made.append((dev, cfg)))
    monkeypatch.setattr(devices, "driver_gpus", lambda: [A100])
    monkeypatch.setattr(devices, "tensorflow_gpus", lambda driver: driver)
    plan = devices.device_plan(2)  # what auto_parallelism, mirrored_resnet and multi_device_scratch call
    assert plan.kind == "logical-gpu" and list(plan.names) == ["/GPU:0", "/GPU:1"]
    (device, configs), = made
    assert device is fake and len(configs) == 2 and configs[0].memory_limit == plan.memory_limit_mb


def test_gpu_doctor_mixed_model_keeps_its_outputs_float32(tmp_path):
    import keras
    import numpy as np

    from tfperf.deploy.loader import load_subject

    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="scores")(hidden)).save(tmp_path / "m.keras")
    mixed = load_subject(str(tmp_path / "m.keras")).fresh("mixed_float16")
    assert mixed.get_layer("hidden").dtype_policy.name == "mixed_float16"
    assert mixed.get_layer("scores").dtype_policy.name == "float32"
    assert mixed(np.ones((2, 6), np.float32)).dtype == "float32"


def test_gpu_keras_auto_jit_means_xla_with_a_gpu_and_the_custom_loop_keeps_it(monkeypatch):
    import keras
    import numpy as np
    import tensorflow as tf

    from tfperf.data import Arrays
    from tfperf.models import get_net
    from test_recipes import load_recipe

    trainer = load_recipe("training_ladder").measure.__globals__
    data = Arrays("zeros", np.zeros((8, 28, 28, 1), np.float32), np.zeros(8, np.int32),
                  np.zeros((4, 28, 28, 1), np.float32), np.zeros(4, np.int32), 10)
    assert not get_net("mlp").jit_compile  # a CPU-only host: Keras' "auto" is no XLA
    assert not trainer["Trainer"](trainer["Config"](custom_loop=True), "mlp", data, 1e-3, 0).xla
    listed = tf.config.list_physical_devices
    fake = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [*listed(kind), fake] if kind in (None, "GPU") else listed(kind))
    keras.utils.set_random_seed(0)
    assert get_net("mlp").jit_compile  # with a GPU listed, Keras resolves "auto" to XLA: the ladder asks it
    assert trainer["Trainer"](trainer["Config"](custom_loop=True), "mlp", data, 1e-3, 0).xla


def test_gpu_agreement_checks_run_in_exact_float32_and_restore_tf32():
    import tensorflow as tf

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(True)
    try:
        with gpus.exact_float32():
            assert not tf.config.experimental.tensor_float_32_execution_enabled()
        assert tf.config.experimental.tensor_float_32_execution_enabled()  # as it was
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)
    d = gpus.diagnosis(None, [A100], tf32_enabled=True)
    assert d["tf32_by_default"] and d["tf32_enabled"] and d["mixed_policy"] == "mixed_bfloat16"


def test_gpu_rows_name_their_device_here_the_cpu():
    import keras

    from tfperf.doctor.facts import tensorflow_device
    from test_recipes import load_recipe

    assert tensorflow_device() == "CPU"
    assert load_recipe("keras_backends").measure.__globals__["backend_device"](keras) == "cpu"


def test_gpu_rates_are_timed_in_blocks_of_calls(monkeypatch):
    import tensorflow as tf

    from tfperf.measure import timer

    assert gpus.rate_block_size(True) == "auto" and gpus.rate_block_size(False) == 1
    made = []
    real = timer.Timer

    def recording(*args, **kwargs):
        made.append(kwargs.get("block_size", 1))
        return real(*args, **kwargs)

    monkeypatch.setattr(timer, "Timer", recording)
    assert timer.matmul_flops_per_s(64, steps=5) > 0 and made == [1]  # a CPU: one call per sample, as before
    listed = tf.config.list_physical_devices
    fake = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [*listed(kind), fake] if kind in (None, "GPU") else listed(kind))
    assert timer.matmul_flops_per_s(64, steps=5) > 0 and made == [1, "auto"]


def test_gpu_env_prints_the_diagnosis_and_stops_when_tensorflow_misses_the_drivers_gpus(monkeypatch, capsys):
    import json

    from tfperf.cli import main

    assert main(["env"]) == 0
    found = json.loads(capsys.readouterr().out)["gpu"]
    assert found["problem"] is None and found["tensorflow_gpus"] == []
    assert found["horovod_gpu_operations"]["gloo"]  # the Horovod build make install made: Gloo, no NCCL on a CPU host
    monkeypatch.setattr(gpus, "driver_gpus", lambda: [A100])  # a driver that sees an A100 TensorFlow does not
    assert main(["env"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tfperf env: error: nvidia-smi sees 1 GPU(s)")


def test_gpu_recipes_stop_in_one_line_when_tensorflow_misses_the_drivers_gpus(monkeypatch, capsys, tmp_path):
    from tfperf.recipe import Conclusion, Recipe

    ran = []
    recipe = Recipe(name="stub", doc="A stub.", order=1, measure=lambda args, rec: ran.append(1),
                    conclude=lambda args, rec, found: Conclusion("done"))
    monkeypatch.setattr(gpus, "driver_gpus", lambda: [A100, A100])
    assert recipe.main(["--out", str(tmp_path)]) == 2 and not ran
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stub: error: nvidia-smi sees 2 GPU(s)")
    monkeypatch.setattr(gpus, "driver_gpus", lambda: None)  # a CPU host: the recipe runs as before
    assert recipe.main(["--out", str(tmp_path)]) == 0 and ran


def test_gpu_tf32_rows_run_with_tf32_off_and_tensorflow_rows_get_a_tolerance_that_says_why():
    import tensorflow as tf

    assert gpus.tf32_in_effect(True, [A100]) and gpus.tf32_in_effect(True, [H100])
    assert not gpus.tf32_in_effect(True, [V100]) and not gpus.tf32_in_effect(False, [A100])
    assert not gpus.tf32_in_effect(True, [])
    assert gpus.float32_tolerance(1e-4, False) == (1e-4, "")
    loose, why = gpus.float32_tolerance(1e-4, True)
    assert loose == gpus.TF32_TOLERANCE and "TF32" in why and "0.0001" in why
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(True)
    try:
        read = gpus.in_exact_float32(lambda: tf.config.experimental.tensor_float_32_execution_enabled())
        assert read() is False and tf.config.experimental.tensor_float_32_execution_enabled()
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)
    assert gpus.device_memory("/CPU:0") is None and not gpus.tf32_here()  # this CPU host
