"""The models people ship now: a KerasHub BERT classifier built from its config (no download; 2 layers, hidden 64),
three int32 inputs of any length. Exported to all three formats without --input-shape, it answers requests of
17, 64 and 128 tokens as Keras does; the doctor counts attention in its FLOPs (within 25% of the count by hand)
and sweeps the length; `tfperf load --lengths` pads batches (or buckets them) and checks every padded answer
against the request alone, and the export command it prints runs as printed."""

import shlex

import keras
import numpy as np
import pytest

from test_deploy import tfperf

# On one xdist worker (`make test` runs two): its module fixture exports once.
pytestmark = pytest.mark.xdist_group("transformers")

VOCAB, LAYERS, HEADS, HIDDEN, INTERMEDIATE, CLASSES = 500, 2, 2, 64, 128, 3


def bert():
    """KerasHub's BERT classifier with random weights, built from its config."""
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=LAYERS, num_heads=HEADS,
                                             hidden_dim=HIDDEN, intermediate_dim=INTERMEDIATE, max_sequence_length=128)
    return keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def requests(length, rows=3, seed=0):
    """Rows of `length` tokens, the last row padded from the middle on (its mask says where)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(rows, length)).astype(np.int32)
    mask = np.ones((rows, length), np.int32)
    mask[-1, length // 2:] = 0
    ids[-1, length // 2:] = 0
    return {"token_ids": ids, "padding_mask": mask, "segment_ids": np.zeros((rows, length), np.int32)}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    model = bert()
    model.save(root / "bert.keras")
    return {"root": root, "model": model, "file": root / "bert.keras"}


def test_bert_exports_to_every_format_without_input_shape_and_answers_at_any_length(classifier):
    from tfperf.deploy.layout import export_subject, load, predict
    from tfperf.deploy.loader import keras_subject

    subject = keras_subject(classifier["model"], "bert", factory=None)
    assert subject.free and {i.name: i.declared for i in subject.inputs}["token_ids"] == (None,)
    for fmt in ("savedmodel", "onnx", "litert"):
        exported = export_subject(subject, classifier["root"] / "exports", name=fmt, format=fmt)
        runner = load(exported.path)
        lengths = (17, 64, 128) if not exported.metadata.get("fixed_sizes") else (32,)
        for length in lengths:
            x = requests(length, seed=length)
            want = classifier["model"](x).numpy()
            got = predict(runner, x)["output_0"]
            assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), (fmt, length)
        assert np.ptp(want, axis=0).max() > 1e-3  # the answers vary with the input: agreement means something


def test_the_doctor_counts_attention_in_the_flops_and_sweeps_the_length(classifier):
    from tfperf.deploy.loader import keras_subject
    from tfperf.doctor.lengths import length_sweep
    from tfperf.doctor.options import Options
    from tfperf.models import function_flops
    from tfperf.records.jsonl import Recorder

    subject = keras_subject(classifier["model"], "bert", factory=None)
    for length in (32, 128):
        counted = function_flops(subject.at(length).fixed().function(batch=1).get_concrete_function())
        # By hand, per layer: the Q, K, V and output projections (8 L H^2), QK^T and the weighted V (4 L^2 H),
        # the feed-forward block (4 L H I); then the pooler and the classifier.
        by_hand = LAYERS * (8 * length * HIDDEN ** 2 + 4 * length ** 2 * HIDDEN + 4 * length * HIDDEN * INTERMEDIATE) \
            + 2 * HIDDEN ** 2 + 2 * HIDDEN * CLASSES
        assert abs(counted / by_hand - 1) < 0.25, (length, counted, by_hand)
    rec = Recorder("doctor", {})
    _, skipped, sweep = length_sweep(subject, rec, Options(rounds=2, min_time_s=0.05), lambda step: None)
    assert sweep.lengths == (16, 32, 64, 128) and not skipped
    assert list(sweep.quadratic) == sorted(sweep.quadratic) and sweep.quadratic[-1] > sweep.quadratic[0]
    # 4 L^2 H against 8 L H^2 + 4 L H I: the square term reaches half at L = 2H + I = 256 tokens.
    assert sweep.crossing == pytest.approx(2 * HIDDEN + INTERMEDIATE, rel=0.25)
    assert "--length-buckets 16,32,64,128" in sweep.advice()
    assert [r["row"] for r in rec.table("sequence length (batch 1)")] == [f"{n} tokens" for n in sweep.lengths]


@pytest.mark.slow
def test_load_with_mixed_lengths_pads_or_buckets_checks_each_answer_and_prints_a_command_that_runs(
        classifier, tmp_path, monkeypatch):
    """`tfperf load --lengths 8:64 --quick`, at sizes that test the command's path: the batched configurations
    pad to the longest and by bucket, each answer checked against the request alone, the padding cost
    reported; the export command it prints carries what it needs and runs as printed."""
    from tfperf.serving.measure import Sizes

    tiny = Sizes(window_s=0.05, max_windows=3, warmup_s=0.02, probe_s=0.3, probes=2, validation_s=0.5,
                 max_concurrency=4, concurrency_factor=4, instances=(1,), batch_sizes=(4,), all_thread_counts=False)
    monkeypatch.setattr(Sizes, "quick", classmethod(lambda cls: tiny))
    # A budget no configuration misses here: the test is of the path (padding, buckets, each answer checked), and
    # under the other worker's load ONNX unbatched once missed 10 ms at one request at a time (p99 10.5 ms), which
    # pruned the batched configurations this test is about.
    code, out, err = tfperf("load", classifier["file"], "--quick", "--runtimes", "onnx", "--lengths", "8:64",
                            "--length-buckets", "16,32,64", "--latency-budget", "1s", "--out", tmp_path / "run")
    assert code == 0, err[-2000:]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "8-64 tokens drawn uniformly" in report and "padding_mask (mask)" in report and "padding holds 0" in report
    assert "padded to the longest" in report and "length buckets 16,32,64" in report
    assert "useful tokens / computed" in report and "disagree" not in report
    printed = next(line.strip() for line in out.splitlines() if line.strip().startswith("tfperf export"))
    argv = shlex.split(printed)[1:] + ["--root", str(tmp_path / "again")]
    code, out, err = tfperf(*argv)
    assert code == 0, (printed, err[-1000:])
