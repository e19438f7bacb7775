"""The user's input over a long run, and the sources the same examples can come from (`--data`).

People see a pipeline start fast and then crawl (interleave over many files, a shuffle buffer or a cache that
grows), and ask whether from_generator can match from_tensor_slices. The pipeline alone (no model) is read for a
long run, its throughput kept in windows, and the run's last third judged against its first (after a warm-up), so
that a decline is measured or said not to be seen. Then one epoch of the same examples, read once into memory, is
served the ways tf.data offers (tensors, a Python generator, TFRecord files written once) and raced against the
user's own pipeline.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from tfperf.deploy.errors import first_line
from tfperf.deploy.loader import import_callable
from tfperf.doctor.options import MIN_GAIN, Finding, Options
from tfperf.measure.stats import FASTER, SLOWER, Comparison, compare_times

LONG_RUN_TABLE = "input over a long run"
SOURCES_TABLE = "input sources for the same examples"
YOURS = "your pipeline (one epoch)"
DECLINE = 0.10  # a last third this much slower than the first is a decline: less is the noise of a shared machine
WARMUP_SHARE = 0.1  # the run's first tenth (files opened, buffers and caches filled) is left out of the thirds
WINDOWS = 10
CHUNKS = 30  # the run after its warm-up, as this many samples of consecutive batches
MIN_BATCHES = 30  # fewer batches after the warm-up cannot show a trend: each third would be a handful
FRESH_SHARE = 0.2  # after the run, a new pipeline is read this share of its length: does rebuilding recover it?


@dataclasses.dataclass(frozen=True)
class LongRun:
    """The pipeline alone read for `seconds`: its batches per second in windows, and last third against first."""

    source: str
    seconds: float
    batches: int
    windows: tuple[tuple[float, float], ...]  # (end of the window in seconds, batches/s in it)
    comparison: Comparison  # the last third's seconds per batch against the first third's (after the warm-up)
    # A new pipeline read right after, against the last third: a pipeline whose own state slows it (a growing
    # buffer, a generator's Python state) is fast again when rebuilt; a machine that slowed (a neighbour's load,
    # a lower clock) is not. None where the last third was not slower.
    fresh: Comparison | None = None
    judged: int = MIN_BATCHES  # batches after the warm-up

    @property
    def declined(self) -> bool:
        return (self.judged >= MIN_BATCHES and self.comparison.verdict == SLOWER
                and (self.fresh is None or self.fresh.verdict == FASTER))

    def describe(self) -> str:
        c = self.comparison
        rates = [rate for _, rate in self.windows]
        span = f"{rates[0]:,.0f} batches/s in its first window, {rates[-1]:,.0f} in its last" if rates else ""
        run = f"a {self.seconds:.0f} s run of `{self.source}` alone ({self.batches} batches; {span})"
        slower = f"{1 / c.ratio:.2f}x as slow as its first (95% CI {1 / c.ci95[1]:.2f}-{1 / c.ci95[0]:.2f}x)"
        if self.judged < MIN_BATCHES:
            return (f"Over {run}, too few batches after the warm-up ({self.judged}, fewer than {MIN_BATCHES}) to "
                    f"tell a decline from noise: a longer run (--long-run SECONDS) can.")
        if self.declined:
            fresh = (f" A new pipeline read right after ran {self.fresh.ratio:.2f}x as fast as that last third: what "
                     f"slows it is the pipeline's own state, not the machine." if self.fresh else "")
            return (f"Over {run}, its last third ran **{slower}**: it declines as it goes.{fresh} Look for what "
                    f"grows with the run: interleave moving to larger or remote files, a shuffle buffer or cache() "
                    f"filling memory, a generator's Python state.")
        if c.verdict == SLOWER:
            return (f"Over {run}, its last third ran {slower}, but a new pipeline read right after was no faster "
                    f"({self.fresh.describe() if self.fresh else 'not measured'}): the machine slowed during the "
                    f"run (another process's load, a lower clock), not the pipeline. No decline of its own is "
                    f"shown; a quieter machine tells.")
        if c.ci95[1] < 1.0:
            return (f"Over {run}, its last third ran {slower}: slower, but not shown to pass the {DECLINE:.0%} "
                    f"that makes a decline here; a longer run (--long-run SECONDS) tells a trend from a drift.")
        return (f"No decline seen over {run}: last third against first {c.describe()}, judged at {DECLINE:.0%}. A "
                f"decline that starts later than this needs a longer run (--long-run SECONDS).")


def long_run(source: str, seconds: float, rec) -> LongRun:
    """Read the user's pipeline, built anew and repeated, for `seconds`, timing each batch; record the windows.
    Where its last third was slower than its first, a new pipeline is read too, to tell its own decline from the
    machine's."""
    ends_s = _read(source, seconds)
    after = _after_warmup(ends_s)
    # Samples of consecutive batches (about CHUNKS of them): a second's worth of fast batches is one sample, not
    # thousands, which the bootstrap behind the interval would draw thousands of times each.
    chunks = _chunked(after, max(len(after) // CHUNKS, 1))
    third = max(len(chunks) // 3, 1)
    comparison = compare_times(chunks[:third], chunks[-third:], names=("first third", "last third"),
                               threshold=DECLINE)
    fresh = None
    if comparison.verdict == SLOWER and len(after) >= MIN_BATCHES:
        again = _after_warmup(_read(source, FRESH_SHARE * seconds))
        fresh = compare_times(chunks[-third:], _chunked(again, max(len(again) // max(third, 3), 1)),
                              names=("last third", "a new pipeline"), threshold=DECLINE)
    windows = []
    edges = np.linspace(0.0, ends_s[-1], WINDOWS + 1)
    for low, high in zip(edges[:-1], edges[1:]):
        count = int(np.sum((ends_s > low) & (ends_s <= high)))
        windows.append((float(high), count / (high - low)))
        rec.add(LONG_RUN_TABLE, f"{low:.1f}-{high:.1f} s", {"batches_per_s": count / (high - low)},
                primary="batches_per_s", lower_is_better=False, versus_first=False)
    return LongRun(source, float(ends_s[-1]), len(ends_s), tuple(windows), comparison, fresh, len(after))


def _read(source: str, seconds: float) -> np.ndarray:
    """When each batch of the pipeline `source` builds (repeated) came, in seconds from the first request, over
    `seconds`."""
    import tensorflow as tf

    dataset = import_callable(source, "function")()
    if int(dataset.cardinality()) != int(tf.data.INFINITE_CARDINALITY):
        dataset = dataset.repeat()
    iterator = iter(dataset)
    ends, started = [], time.perf_counter()
    while not ends or ends[-1] - started < seconds:
        next(iterator)
        ends.append(time.perf_counter())
    return np.asarray(ends) - started


def _after_warmup(ends_s: np.ndarray) -> np.ndarray:
    """Seconds per batch, the run's first tenth (files opened, buffers and caches filled) left out."""
    per_batch = np.diff(np.concatenate([[0.0], ends_s]))
    return per_batch[ends_s > WARMUP_SHARE * ends_s[-1]]


def _chunked(per_batch: np.ndarray, size: int) -> np.ndarray:
    """Means of consecutive runs of `size` batches: samples that are not thousands of near-equal tiny ones."""
    return per_batch[:len(per_batch) // size * size].reshape(-1, size).mean(axis=1)


def in_memory(dataset) -> Any:
    """One epoch of the dataset's batches as NumPy arrays of all its examples, in the element's structure;
    ValueError when the batches cannot be stacked (ragged or sparse parts)."""
    import tensorflow as tf

    batches = [[np.asarray(t) for t in tf.nest.flatten(b)] for b in dataset]
    try:
        leaves = [np.concatenate([b[i] for b in batches]) for i in range(len(batches[0]))]
    except (ValueError, IndexError) as exc:
        raise ValueError(f"its batches do not stack into arrays ({first_line(exc)})") from None
    return tf.nest.pack_sequence_as(dataset.element_spec, leaves)


def write_tfrecords(examples: Any, folder: Path, shards: int = 4) -> list[str]:
    """The examples as TFRecord files, each leaf of an example a serialized tensor: written once, read many."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    leaves = tf.nest.flatten(examples)
    count = len(leaves[0])
    paths = [str(folder / f"examples-{i:02d}-of-{shards:02d}.tfrecord") for i in range(shards)]
    for shard, path in enumerate(paths):
        with tf.io.TFRecordWriter(path) as writer:
            for row in range(shard, count, shards):
                feature = {f"leaf{i}": tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[tf.io.serialize_tensor(leaf[row]).numpy()])) for i, leaf in enumerate(leaves)}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return paths


def source_variants(examples: Any, batch: int, folder: Path) -> dict[str, tuple[Any, str]]:
    """The same examples from each source tf.data offers, batched and prefetched alike: (dataset, code)."""
    import tensorflow as tf

    autotune = tf.data.AUTOTUNE
    spec = tf.nest.map_structure(lambda a: tf.TensorSpec(a.shape[1:], tf.as_dtype(a.dtype)), examples)
    leaves = tf.nest.flatten(examples)
    count = len(leaves[0])

    def rows():
        for i in range(count):
            yield tf.nest.pack_sequence_as(examples, [leaf[i] for leaf in leaves])

    specs = tf.nest.flatten(spec)
    features = {f"leaf{i}": tf.io.FixedLenFeature([], tf.string) for i in range(len(specs))}

    def parse(record):
        found = tf.io.parse_single_example(record, features)
        return tf.nest.pack_sequence_as(spec, [tf.ensure_shape(tf.io.parse_tensor(found[f"leaf{i}"], s.dtype), s.shape)
                                               for i, s in enumerate(specs)])

    files = write_tfrecords(examples, folder)
    return {
        "from_tensor_slices (arrays in memory)": (
            tf.data.Dataset.from_tensor_slices(examples).batch(batch).prefetch(autotune),
            "tf.data.Dataset.from_tensor_slices((x, y)).batch(B).prefetch(tf.data.AUTOTUNE)"),
        "from_generator (a Python generator)": (
            tf.data.Dataset.from_generator(rows, output_signature=spec).batch(batch).prefetch(autotune),
            "tf.data.Dataset.from_generator(gen, output_signature=...).batch(B).prefetch(tf.data.AUTOTUNE)"),
        "TFRecord files, written once": (
            tf.data.TFRecordDataset(files, num_parallel_reads=autotune).map(parse, num_parallel_calls=autotune)
            .batch(batch).prefetch(autotune),
            "tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).map(parse, "
            "num_parallel_calls=tf.data.AUTOTUNE).batch(B).prefetch(tf.data.AUTOTUNE)"),
    }


def input_sources(data, rec, options: Options, folder: Path) -> tuple[list[Finding], dict, LongRun | None]:
    """The long run, then the sources raced against the user's pipeline: (findings, skipped, the long run)."""
    from tfperf.measure import Timer
    from tfperf.records.jsonl import race_table

    skipped = {}
    found = long_run(data.source, options.long_run_s, rec) if options.long_run_s > 0 else None
    if found is None:
        skipped[LONG_RUN_TABLE] = "not run: --long-run 0"
    try:
        variants = source_variants(in_memory(data.dataset), data.batch, folder)
    except ValueError as exc:
        skipped[SOURCES_TABLE] = f"not measured: {exc}"
        return [], skipped, found

    def reader(dataset):
        def read_epoch() -> None:
            for _ in dataset:
                pass
        return read_epoch

    timers = [Timer(reader(data.dataset), name=YOURS, items_per_call=data.examples)]
    timers += [Timer(reader(dataset), name=row, items_per_call=data.examples) for row, (dataset, _) in variants.items()]
    raced = race_table(rec, SOURCES_TABLE, timers, metrics=lambda m, _: {"samples_per_s": m.items_per_s,
                                                                         "first_epoch_s": m.first_call_s},
                       primary="samples_per_s", lower_is_better=False, rounds=options.rounds, samples=options.rounds,
                       threshold=MIN_GAIN, max_extensions=options.max_extensions, warmup=0, seed=options.seed)
    # Advice only where the user's pipeline is what limits training (the input check's verdict decides that).
    findings = [Finding(SOURCES_TABLE, row, YOURS, raced.comparisons[row], code,
                        "the examples read once into memory or written to files once; an epoch of them here")
                for row, (_, code) in variants.items()]
    return findings, skipped, found
