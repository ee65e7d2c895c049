"""Splits read from their files while they train: tf.data reads, parses and decodes in the graph, no Python per
image. A split streams when its decoded pixels exceed ``--data-memory-gb``; one that fits is decoded once through
the same reader (``decoded``) and held in memory (data/store.py).

    StreamSplit   one split's files: TFRecord shards (ImageNet layout, a TFDS directory, the toolkit's manifest
                  layout: tfrecords.stream_split), each record an encoded image (or raw pixels) and its label; or
                  image files (a folder), each with its label. (A manifest set that fits keeps the in-memory path
                  of data/tfrecords.py; CIFAR and keras.datasets are arrays already.)

Reading, per input pipeline (one per worker):

    training     epoch e: the shards in the order (seed, e) draws (image files: the whole list, permuted), read
                 ``interleave_cycle`` at a time, records permuted in blocks of SHUFFLE_RECORDS keyed by (seed, e),
                 cut to the epoch's whole batches, then decoded ``decode_threads`` at a time;
                 per-replica batches go round-robin to the worker's replicas, so a global batch is the same
                 examples in the same order on any replica count
    evaluation   the files in reading order (shards interleaved), every example once; a short last batch leaves
                 replicas empty (weight 0)

Memory, whatever the dataset's size (benchmarks/stream_memory.py: 8,000 and 32,000 records peak within 41 MB):
per open shard READ_BUFFER bytes read ahead (at most MAX_CYCLE shards: 16 MB); per shuffle block SHUFFLE_RECORDS
encoded records, about four blocks in flight (the one filling, the prefetched one, the one consumed and its permuted
copy); then ``decode_threads`` images decoding and two batches per replica prefetched. Nothing is kept per record or
per shard beyond the file list and the record counts (one path and one int64 per shard).

Decoding (the transforms ``mode`` names, and the check of a JPEG's structure) is data/decode.py's.

What stays exact:
    - the order: a function of (seed, epoch) when ``deterministic`` (the run's --deterministic, on by default on
      CPU); with it off the shards' records interleave in arrival order (faster on slow storage);
    - N replicas equal one device on the same global batch (per-replica batches are consecutive slices of one
      ordered stream);
    - resuming at step s of epoch e re-reads (without decoding) the s x global batch records of epoch e that came
      before, and carries on with the same examples, order and crops as an uninterrupted run;
    - multi-worker ``--input-sharding exact``: every worker reads the epoch's records and decodes only those of its
      own replicas' slices (bit-equal to one process); ``file``: each worker reads only its own shards.

A record or file that does not parse or decode (or whose label is out of range) fails the run, naming the shard
and record or the file, unless ``skip_bad`` is set: then it is skipped, counted and named (data/bad_records.py).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import DataError
from . import bad_records
from .decode import decode_fn, fit_fn, load_fn, pixels_fn
from .functions import plain
from .pixels import augment_keys, to_float

# TensorFlow is imported inside the functions that build datasets: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

SHUFFLE_RECORDS = 4096   # training records shuffled together (a TFRecord split; encoded ~0.45 GB on ImageNet)
READ_BUFFER = 1 << 20     # bytes each open shard reads ahead (TFRecordDataset buffer_size): at most MAX_CYCLE x this;
                          # 4 or 8 MB held 16 x more and read no faster (docs/benchmarks/streaming.md's curve)
MAX_CYCLE = 16            # shards open at once while training


def cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class StreamSplit:
    """One split's files and how to read them; see the module docstring."""

    name: str
    units: list[str]                      # TFRecord shards, or image files
    size: int                             # the side images are decoded to
    num_classes: int
    counts: list[int] | None = None       # records per shard; None: one image per file
    labels: np.ndarray | None = None      # image files: each file's label (0-based)
    parse: Callable | None = None         # records: serialized tf.train.Example -> (encoded image, stored label)
    label_offset: int = 0                 # subtracted from stored labels (ImageNet's 1-based labels -> 0-based)
    mode: str = "inception"               # "inception" or "fixed" (data/decode.py)
    raw_shape: tuple | None = None        # records hold raw uint8 pixels of this (h, w, c), not an image file
    color_channels: int = 3               # channels an image file decodes to ("fixed" mode: 1 for greyscale sets)
    skip_bad: bool = False
    what: str = "record"                  # how a unit's element is named in messages
    threads: dict = field(default_factory=dict)
    skip_log: str | None = None           # skipped-<split>.tsv: one row per example --skip-bad-images skipped
    raw_log: str | None = None            # what the pipeline appends to as it skips (bad_records.raw_log)
    in_memory_skips: list = field(default_factory=list)  # read into memory: the names of those left out
    in_memory = False

    def __post_init__(self):
        self.units = [str(u) for u in self.units]
        if self.counts is not None:
            self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        n_units = len(self.units)
        c = cores()
        cycle = max(1, min(n_units, MAX_CYCLE))
        self.threads = {"cores": c, "interleave_cycle": cycle if self.counts is not None else 0,
                        "read_threads": min(cycle, c) if self.counts is not None else 0, "decode_threads": c}

    # --- sizes ---------------------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return int(self.offsets[-1]) if self.counts is not None else len(self.units)

    @property
    def channels(self) -> int:
        if self.raw_shape is not None:
            return int(self.raw_shape[2])
        return self.color_channels if self.mode == "fixed" else 3

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.size, self.size, self.channels)

    @property
    def nbytes(self) -> int:
        """What the split takes decoded at ``size`` (what --data-memory-gb is compared with)."""
        return int(self.n * int(np.prod(self.shape)))

    def head(self, n: int) -> "StreamSplit":
        """The first ``n`` examples by id (the files' order: whole shards, the last cut short)."""
        if n >= self.n:
            return self
        if self.counts is None:
            return dataclasses.replace(self, units=self.units[:n], labels=self.labels[:n])
        k = int(np.searchsorted(self.offsets, n, side="left"))  # shards 0..k-1 hold the first n
        counts = list(self.counts[:k])
        counts[-1] -= int(self.offsets[k] - n)
        return dataclasses.replace(self, units=self.units[:k], counts=counts)

    def where(self, unit: int, rec: int) -> str:
        if self.counts is None:
            return self.units[unit]
        return f"{self.units[unit]}: {self.what} {rec}"

    def locate(self, where: str) -> tuple[int, int] | None:
        """The (unit, record) ``where`` names, or None when it is not one of this split's."""
        if self.counts is None:
            return (self.units.index(where), 0) if where in self.units else None
        path, sep, rest = where.rpartition(f": {self.what} ")
        if not sep or path not in self.units or not rest.strip().isdigit():
            return None
        return self.units.index(path), int(rest)

    # --- reading: (unit, record, data) before decoding ------------------------------------------------------
    def _files(self):
        import tensorflow as tf

        return tf.constant(self.units)

    def _unit_records(self, files, deterministic: bool, order=None, cycle: int | None = None):
        """(unit, record index, serialized) of the shards ``order`` names (default: all, in order)."""
        import tensorflow as tf

        n_units = len(self.units)
        order = tf.range(n_units, dtype=tf.int64) if order is None else order
        cycle = cycle or self.threads["interleave_cycle"]

        def shard(u):
            return tf.data.TFRecordDataset(tf.gather(files, u), buffer_size=READ_BUFFER).enumerate().map(
                plain(lambda i, r: (u, i, r)))

        return tf.data.Dataset.from_tensor_slices(order).interleave(
            plain(shard), cycle_length=cycle, block_length=1, num_parallel_calls=min(cycle, self.threads["cores"]),
            deterministic=deterministic)

    def _in_order(self, deterministic: bool = True):
        import tensorflow as tf

        files = self._files()
        if self.counts is not None:
            return self._unit_records(files, deterministic)
        return tf.data.Dataset.range(len(self.units)).map(plain(lambda u: (u, tf.constant(0, tf.int64),
                                                                         tf.gather(files, u))))

    def _epoch(self, epoch, seed: int, deterministic: bool):
        """Epoch ``epoch``'s (unit, record, data) in training order, before decoding."""
        import tensorflow as tf

        files = self._files()
        seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
        order = tf.random.experimental.stateless_shuffle(tf.range(len(self.units), dtype=tf.int64), seed=seeds)
        if self.counts is None:  # image files: the whole list permuted, no buffer needed
            return tf.data.Dataset.from_tensor_slices(order).map(
                plain(lambda u: (u, tf.constant(0, tf.int64), tf.gather(files, u))))
        recs = self._unit_records(files, deterministic, order)
        return _block_shuffle(recs, tf.constant(seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64))

    # --- decoding (data/decode.py) --------------------------------------------------------------------------
    def ids(self, unit, rec):
        """The position in the files (the example's id) of record ``rec`` of unit ``unit``."""
        import tensorflow as tf

        if self.counts is None:
            return unit
        return tf.gather(tf.constant(self.offsets), unit) + rec

    def decode_only(self, train: bool, augment: bool, seed: int = 0):
        """The files read, parsed and decoded as training decodes them (the same windows), with nothing after: no
        resize, flip, batching, ordering, bad-example check or distribution. Its rate is the ceiling of the
        pipeline on these cores (measure/input/bench.py)."""
        import tensorflow as tf

        load, pixels = load_fn(self), pixels_fn(self, train, augment, seed)

        def one(unit, rec, data):
            encoded, _ = load(unit, rec, data)
            image = pixels(encoded, augment_keys(self.ids(unit, rec), tf.constant(0, tf.int64), seed))
            return tf.reduce_prod(tf.shape(image, out_type=tf.int64))

        ds = self._in_order(deterministic=False).repeat()
        ds = ds.map(plain(one), num_parallel_calls=self.threads["decode_threads"], deterministic=False)
        return ds.batch(64).prefetch(2).with_options(_options(self.threads))

    # --- what the toolkit reads -----------------------------------------------------------------------------
    def decoded(self, evaluate: bool = False):
        """Every example in reading order (the shards interleaved record by record; ids say where each is in the
        files) as (uint8 image, int32 label, int64 id), resized whole (``fit_fn``: what in-memory training augments),
        or, ``evaluate``, as evaluation sees it (the centre crop of mixed-size images, as the streamed evaluation
        takes it, so validation figures do not depend on the memory budget). An example that does not decode is
        left out (bad_records.missing names them)."""
        import tensorflow as tf

        fit = fit_fn(self)
        view = decode_fn(self, train=False, augment=False)

        def one(unit, rec, data):
            if evaluate:
                image, label = view(unit, rec, data, tf.constant(0, tf.int64))
            else:
                image, label = fit(unit, rec, data)
            return image, label, self.ids(unit, rec)

        ds = self._in_order().map(plain(one), num_parallel_calls=self.threads["decode_threads"], deterministic=True)
        return ds.ignore_errors().with_options(_options(self.threads))

    def first_batch(self, n: int):
        """The first ``n`` examples in reading order, evaluation transform, as (float32 images, int32 labels)."""
        import tensorflow as tf

        decode = decode_fn(self, train=False, augment=False)
        ds = self._in_order().take(n).map(plain(lambda u, r, d: decode(u, r, d, tf.constant(0, tf.int64))),
                                          num_parallel_calls=self.threads["decode_threads"], deterministic=True)
        images, labels = next(iter(ds.batch(n)))
        return to_float(images), labels

    # --- training and evaluation datasets -------------------------------------------------------------------
    def train_dataset(self, config, ctx_layout, start_step: int, examples: int, deterministic: bool,
                      worker_shard: tuple | None = None):
        """This input pipeline's per-replica training batches from ``start_step`` on, across epochs without end.

        ``ctx_layout``: (total replicas, this pipeline's replicas, its first global replica). ``examples``: the
        split's examples per epoch (all workers'; under file sharding, what each worker keeps x workers)."""
        import tensorflow as tf

        total, local, first = ctx_layout
        # A replica's element is its share of one pass: the global batch, or with --accumulate one micro-batch of it
        # (K elements a step). Consecutive chunks of ``per`` records go to the replicas in turn, so micro-batch k of
        # all replicas is the step's k-th slice of records, as in memory (data.pipeline).
        per = config.micro_batch_size // total
        batch, seed = config.global_batch_size, config.seed
        if worker_shard is not None:  # this worker's shards only: its own order, its share of every batch
            w, workers = worker_shard
            batch, total, first, seed = batch // workers, local, 0, seed * 1009 + w
            examples //= workers
        steps = examples // batch
        if steps < 1:
            raise DataError(f"{self.name}: {examples} examples make no batch of {batch}")
        first_epoch, pos = divmod(start_step, steps)
        skip = pos * batch
        decode = decode_fn(self, train=True, augment=config.augment, seed=seed)

        def one_epoch(epoch):
            ds = self._epoch(epoch, seed, deterministic).take(steps * batch)
            ds = ds.skip(tf.where(epoch == first_epoch, tf.constant(skip, tf.int64), tf.constant(0, tf.int64)))
            if local != total:  # keep the records of this pipeline's replicas' slices (exact sharding)
                start = tf.where(epoch == first_epoch, tf.constant(skip, tf.int64), tf.constant(0, tf.int64))
                ds = ds.enumerate(start).filter(plain(lambda p, el: tf.logical_and(
                    (p // per) % total >= first, (p // per) % total < first + local))).map(plain(lambda p, el: el))
            return ds.map(plain(lambda u, r, d: (u, r, d, epoch)))

        ds = tf.data.Dataset.range(first_epoch, 2**62).flat_map(plain(one_epoch))
        ds = bad_records.checked(self, ds, decode, per, sentinel=False)
        return ds.prefetch(2 * local).with_options(_options(self.threads))

    def eval_dataset(self, config, ctx_layout):
        """This input pipeline's per-replica evaluation batches: every example once, in reading order (the shards
        interleaved)."""
        import tensorflow as tf

        total, local, first = ctx_layout
        per = config.micro_batch_size // total  # one pass of the replicas (--accumulate does not grow it)
        decode = decode_fn(self, train=False, augment=False)
        ds = self._in_order()
        if local != total:
            ds = ds.enumerate().filter(plain(lambda p, el: tf.logical_and(
                (p // per) % total >= first, (p // per) % total < first + local))).map(plain(lambda p, el: el))
        ds = ds.map(plain(lambda u, r, d: (u, r, d, tf.constant(0, tf.int64))))
        ds = bad_records.checked(self, ds, decode, per, sentinel=True)
        return ds.prefetch(2 * local).with_options(_options(self.threads))
    def skipped(self) -> tuple[int, list[str]]:
        """(how many, their names) of the examples --skip-bad-images skipped (bad_records.skipped)."""
        return bad_records.skipped(self)


def _block_shuffle(ds, key):
    """``ds`` shuffled in blocks of SHUFFLE_RECORDS consecutive elements, each permuted by a stateless shuffle keyed
    by (key, block): the order is a function of the key alone (tf.data's shuffle buffer draws from the global seed
    as well). The next block is read while one is consumed, so about three blocks are held at a time.

    Not ``Dataset.shuffle`` with a seed either: its seed generator is a stateful op, and under op determinism (on
    by default on CPU replicas) tf.data runs every parallel map and interleave of a pipeline holding one serially
    (tf.config.experimental.enable_op_determinism's docs, "Determinism and tf.data"). Tried, with op determinism
    on: 943 images/sec on 1.2 cores against 1865 on 1.9 with these blocks (benchmarks/bench_stream.py's data and
    pull; BENCHMARKS.md). tests/data/test_imagenet.py checks the pipeline holds no stateful op."""
    import tensorflow as tf

    def permuted(i, block):
        n = tf.shape(block[0], out_type=tf.int64)[0]
        perm = tf.random.experimental.stateless_shuffle(tf.range(n), seed=tf.stack([key, i]))
        return tf.data.Dataset.from_tensor_slices(tuple(tf.gather(t, perm) for t in block))

    return ds.batch(SHUFFLE_RECORDS).prefetch(1).enumerate().flat_map(plain(permuted))


def _options(threads: dict):
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = True  # the decode keeps order (the bad-example check needs it); see _unit_records
    options.autotune.enabled = False  # explicit parallelism: the autotuner's thread stalls iterator deletion
    options.threading.private_threadpool_size = threads["cores"]
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def as_examples(split, evaluate: bool = False):
    """A split as unbatched (image, label, id) examples in reading order, decoded as ``decoded`` says (for
    inspection; training reads ``train_dataset``, evaluation ``eval_dataset``)."""
    return split.decoded(evaluate)
