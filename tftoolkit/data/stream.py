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

Transforms (``mode``):

    inception    images of any size (ImageNet, folders of photos): training crops a random box of 8-100% of the
                 area and aspect 3/4-4/3 (Szegedy et al. 2015), decoding only that box of a JPEG
                 (``decode_and_crop_jpeg``), resizes it to ``size`` and flips at random; evaluation takes the
                 centre 87.5% square and resizes it. Without --augment training uses the evaluation transform.
    fixed        images of one size (a TFDS set of one declared shape, a folder of one size): decoded whole and
                 resized to ``size`` if they differ; --augment adds the in-memory path's flip and pad-and-crop
                 (pixels.augment)

Randomness is keyed, never drawn from a global state: every example's crop and flip come from a hash of (seed,
epoch, its position in the files), as in data/pipeline.py (data/pixels.py), so they do not depend on thread timing.

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
and record or the file (``explain`` re-reads that one to say why), unless ``skip_bad`` is set: then it is skipped,
counted and named in summary.json (``skipped_images``) and in the run's skipped-<split>.tsv, one row per example
however many passes met it. Both work the same way: decoding keeps the stream's order, each element carries its
position and its TAG_HISTORY predecessors' (shard, record), and after ``ignore_errors`` a gap in the positions names
what was dropped.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import DataError, first_line
from .functions import plain
from .pixels import augment as augment_batch, augment_keys, to_float

AREA = (0.08, 1.0)
ASPECT = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10    # boxes tried before the whole image is taken (tf.image.sample_distorted_bounding_box)
EVAL_CROP = 0.875     # the centre square's side over the shorter side (224 of 256)
SHUFFLE_RECORDS = 4096   # training records shuffled together (a TFRecord split; encoded ~0.45 GB on ImageNet)
READ_BUFFER = 1 << 20     # bytes each open shard reads ahead (TFRecordDataset buffer_size): at most MAX_CYCLE x this
DEFAULT_IMAGE_SIZE = 224  # --image-size for images of mixed sizes larger than it (ImageNet's)
MAX_CYCLE = 16            # shards open at once while training
TAG_CHUNK = 64            # elements tagged per step of the bad-example check's bookkeeping
TAG_HISTORY = 8           # predecessors each element names: that many failing in a row are each named
MARK = "tftoolkit-bad-example"  # in the error a bad record raises: data.stream.explain_error finds it


def choose_image_size(given: int | None, sizes) -> tuple[int, str]:
    """The side images are decoded to, and why (logged, so a user who gave no --image-size sees what was picked).

    ``given`` when set; else, from the (width, height) of a sample of the images: the shorter side when they share
    one size; else the median shorter side, at most DEFAULT_IMAGE_SIZE (a folder of 20-60 px images is not blown up
    to 224); DEFAULT_IMAGE_SIZE when nothing could be sampled."""
    sizes = [tuple(int(v) for v in s) for s in sizes]
    if given:
        return given, f"{given} px (--image-size)"
    if not sizes:
        return DEFAULT_IMAGE_SIZE, f"{DEFAULT_IMAGE_SIZE} px (no image size could be sampled; set --image-size)"
    if len(set(sizes)) == 1:
        w, h = sizes[0]
        return min(sizes[0]), f"{min(sizes[0])} px (the images' shorter side: all {len(sizes)} sampled are {w}x{h})"
    shorter = [min(s) for s in sizes]
    median = int(np.median(shorter))
    size = min(DEFAULT_IMAGE_SIZE, median)
    cap = f", capped at {DEFAULT_IMAGE_SIZE}" if median > DEFAULT_IMAGE_SIZE else ""
    return size, (f"{size} px (the median shorter side of {len(sizes)} sampled images of mixed sizes, "
                  f"{min(shorter)}-{max(shorter)} px{cap}; set --image-size to choose)")


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
    mode: str = "inception"               # "inception" or "fixed" (module docstring)
    raw_shape: tuple | None = None        # records hold raw uint8 pixels of this (h, w, c), not an image file
    color_channels: int = 3               # channels an image file decodes to ("fixed" mode: 1 for greyscale sets)
    skip_bad: bool = False
    what: str = "record"                  # how a unit's element is named in messages
    threads: dict = field(default_factory=dict)
    skip_log: str | None = None           # skipped-<split>.tsv: one row per example --skip-bad-images skipped
    raw_log: str | None = None            # what the pipeline appends to as it skips (``_raw_log``)
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
        import dataclasses

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

    # --- decoding -------------------------------------------------------------------------------------------
    def _load(self):
        """(unit, record, data) -> (encoded image or raw pixels, 0-based label), checked against the classes."""
        import tensorflow as tf

        labels = tf.constant(self.labels if self.labels is not None else np.zeros(0, np.int64), tf.int64)
        k, offset = self.num_classes, self.label_offset

        def load(unit, rec, data):
            if self.counts is None:
                encoded, label = tf.io.read_file(data), tf.gather(labels, unit)
            else:
                encoded, label = self.parse(data)
            label = tf.cast(label, tf.int64) - offset
            # Raised here, dropped by ignore_errors, named by the position check (explain says which label).
            check = tf.debugging.Assert(tf.logical_and(label >= 0, label < k), [MARK, "label out of range", label + offset])
            with tf.control_dependencies([check]):
                return tf.identity(encoded), tf.cast(label, tf.int32)

        return load

    def _ids(self, unit, rec):
        import tensorflow as tf

        if self.counts is None:
            return unit
        return tf.gather(tf.constant(self.offsets), unit) + rec

    def decode_fn(self, train: bool, augment: bool, seed: int = 0):
        """(unit, record, data, epoch) -> (uint8 image (size, size, c), int32 label): the transform ``mode`` and
        ``train`` say, keyed by (seed, epoch, the example's position in the files)."""
        import tensorflow as tf

        load, size, pixels = self._load(), self.size, self.pixels_fn(train, augment, seed)

        def decode(unit, rec, data, epoch):
            encoded, label = load(unit, rec, data)
            key = augment_keys(self._ids(unit, rec), epoch, seed)
            image = _resize(pixels(encoded, key), size, exact=self.mode == "fixed")
            if train and augment:
                if self.mode == "inception":
                    image = tf.image.stateless_random_flip_left_right(image, seed=tf.stack([key, tf.constant(1, tf.int64)]))
                else:
                    image = augment_batch(image[None], key[None])[0]
            return tf.ensure_shape(image, self.shape), label

        return decode

    def pixels_fn(self, train: bool, augment: bool, seed: int = 0):
        """(encoded, key) -> the decoded pixels the transform starts from, before resizing: the random box of a
        JPEG (decoded alone) for Inception-style training, the centre square to evaluate, the whole image when
        fixed. What ``decode_only`` times."""
        import tensorflow as tf

        random_crop = train and augment and self.mode == "inception"

        def pixels(encoded, key):
            if self.raw_shape is not None:
                return tf.reshape(tf.io.decode_raw(encoded, tf.uint8), self.raw_shape)
            if self.mode == "fixed":
                return tf.io.decode_image(encoded, channels=self.channels, expand_animations=False)
            return _decode_window(encoded, _random_box(key) if random_crop else _centre_box)

        return pixels

    def decode_only(self, train: bool, augment: bool, seed: int = 0):
        """The files read, parsed and decoded as training decodes them (the same windows), with nothing after: no
        resize, flip, batching, ordering, bad-example check or distribution. Its rate is the ceiling of the
        pipeline on these cores (measure/inputbench.py)."""
        import tensorflow as tf

        load, pixels = self._load(), self.pixels_fn(train, augment, seed)

        def one(unit, rec, data):
            encoded, _ = load(unit, rec, data)
            image = pixels(encoded, augment_keys(self._ids(unit, rec), tf.constant(0, tf.int64), seed))
            return tf.reduce_prod(tf.shape(image, out_type=tf.int64))

        ds = self._in_order(deterministic=False).repeat()
        ds = ds.map(plain(one), num_parallel_calls=self.threads["decode_threads"], deterministic=False)
        return ds.batch(64).prefetch(2).with_options(_options(self.threads))

    def fit_fn(self):
        """(unit, record, data) -> (uint8 image, label): the whole image resized to ``size`` (squashed, not
        cropped): what a split held in memory stores, and what its pad-and-crop augmentation then works on."""
        import tensorflow as tf

        load = self._load()

        def fit(unit, rec, data):
            encoded, label = load(unit, rec, data)
            if self.raw_shape is not None:
                image = tf.reshape(tf.io.decode_raw(encoded, tf.uint8), self.raw_shape)
            else:
                image = tf.io.decode_image(encoded, channels=self.channels, expand_animations=False)
            return tf.ensure_shape(_resize(image, self.size, exact=True), self.shape), label

        return fit

    # --- what the toolkit reads -----------------------------------------------------------------------------
    def decoded(self, evaluate: bool = False):
        """Every example in reading order (the shards interleaved record by record; ids say where each is in the
        files) as (uint8 image, int32 label, int64 id), resized whole (``fit_fn``: what in-memory training augments),
        or, ``evaluate``, as evaluation sees it (the centre crop of mixed-size images, as the streamed evaluation
        takes it, so validation figures do not depend on the memory budget). An example that does not decode is
        left out (``missing`` names them)."""
        import tensorflow as tf

        fit = self.fit_fn()
        view = self.decode_fn(train=False, augment=False)

        def one(unit, rec, data):
            if evaluate:
                image, label = view(unit, rec, data, tf.constant(0, tf.int64))
            else:
                image, label = fit(unit, rec, data)
            return image, label, self._ids(unit, rec)

        ds = self._in_order().map(plain(one), num_parallel_calls=self.threads["decode_threads"], deterministic=True)
        return ds.ignore_errors().with_options(_options(self.threads))

    def missing(self, ids) -> list[tuple[int, int]]:
        """(unit, record) of every example whose id is not in ``ids`` (those ``decoded`` left out)."""
        gone = np.setdiff1d(np.arange(self.n, dtype=np.int64), np.asarray(ids, np.int64))
        if self.counts is None:
            return [(int(i), 0) for i in gone]
        units = np.searchsorted(self.offsets, gone, side="right") - 1
        return [(int(u), int(i - self.offsets[u])) for u, i in zip(units, gone)]

    def explain(self, unit: int, rec: int) -> str:
        """Why example (unit, rec) cannot be used: its record or file read again, alone, eagerly."""
        import tensorflow as tf

        try:
            if self.counts is None:
                data = tf.constant(self.units[unit])
            else:
                data = next(iter(tf.data.TFRecordDataset(self.units[unit]).skip(rec).take(1)), None)
                if data is None:
                    return f"it has no {self.what} {rec}"
            image, _ = self.fit_fn()(tf.constant(unit, tf.int64), tf.constant(rec, tf.int64), data)
            return "it decodes when read alone (a read error at the time?)"
        except tf.errors.OpError as e:
            import re

            # An eager Assert puts its data (the mark, the label) on the lines after its first.
            full = " ".join(line.strip() for line in e.message.splitlines())
            if MARK in full and "label out of range" in full:
                value = re.findall(r"-?\d+", full.split("label out of range", 1)[1])
                stored = f"{value[0]} " if value else ""
                shift = f", less {self.label_offset}" if self.label_offset else ""
                return f"its label {stored}is out of range (0..{self.num_classes - 1}{shift})"
            return first_line(e).rstrip(".")
        except Exception as e:  # noqa: BLE001 - a reason, whatever it is
            return f"{type(e).__name__}: {e}"

    def first_batch(self, n: int):
        """The first ``n`` examples in reading order, evaluation transform, as (float32 images, int32 labels)."""
        import tensorflow as tf

        decode = self.decode_fn(train=False, augment=False)
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
        decode = self.decode_fn(train=True, augment=config.augment, seed=seed)

        def one_epoch(epoch):
            ds = self._epoch(epoch, seed, deterministic).take(steps * batch)
            ds = ds.skip(tf.where(epoch == first_epoch, tf.constant(skip, tf.int64), tf.constant(0, tf.int64)))
            if local != total:  # keep the records of this pipeline's replicas' slices (exact sharding)
                start = tf.where(epoch == first_epoch, tf.constant(skip, tf.int64), tf.constant(0, tf.int64))
                ds = ds.enumerate(start).filter(plain(lambda p, el: tf.logical_and(
                    (p // per) % total >= first, (p // per) % total < first + local))).map(plain(lambda p, el: el))
            return ds.map(plain(lambda u, r, d: (u, r, d, epoch)))

        ds = tf.data.Dataset.range(first_epoch, 2**62).flat_map(plain(one_epoch))
        ds = self._checked(ds, decode, per, sentinel=False)
        return ds.prefetch(2 * local).with_options(_options(self.threads))

    def eval_dataset(self, config, ctx_layout):
        """This input pipeline's per-replica evaluation batches: every example once, in reading order (the shards
        interleaved)."""
        import tensorflow as tf

        total, local, first = ctx_layout
        per = config.micro_batch_size // total  # one pass of the replicas (--accumulate does not grow it)
        decode = self.decode_fn(train=False, augment=False)
        ds = self._in_order()
        if local != total:
            ds = ds.enumerate().filter(plain(lambda p, el: tf.logical_and(
                (p // per) % total >= first, (p // per) % total < first + local))).map(plain(lambda p, el: el))
        ds = ds.map(plain(lambda u, r, d: (u, r, d, tf.constant(0, tf.int64))))
        ds = self._checked(ds, decode, per, sentinel=True)
        return ds.prefetch(2 * local).with_options(_options(self.threads))

    def _checked(self, ds, decode, per: int, sentinel: bool):
        """Decode in order, drop what fails, name it (strict: fail the run; ``skip_bad``: log it and go on), and
        batch ``per`` examples (a finite dataset keeps its short last batch; an endless one has none).

        Before decoding, each element is tagged with its position and its TAG_HISTORY predecessors' (unit, record),
        a chunk at a time; after ``ignore_errors`` a gap of g between consecutive positions in a batch means the g
        elements before the survivor failed, and the survivor's history names them (the last TAG_HISTORY of them,
        when more failed in a row). A finite dataset ends with a sentinel that always decodes (and is dropped from
        its batch), so a failure at its very end is caught too. The tagging and the check run once per chunk and
        once per batch, not per image."""
        import tensorflow as tf

        files = self._files()
        if sentinel:
            ds = ds.concatenate(tf.data.Dataset.from_tensors(
                (tf.constant(-1, tf.int64), tf.constant(-1, tf.int64), tf.constant(""), tf.constant(0, tf.int64))))
        k = TAG_HISTORY

        def tag(state, chunk):
            pos, hist_u, hist_r = state
            u, r = chunk[0], chunk[1]
            n = tf.shape(u, out_type=tf.int64)[0]
            all_u, all_r = tf.concat([hist_u, u], 0), tf.concat([hist_r, r], 0)
            window = tf.range(n)[:, None] + tf.range(k, dtype=tf.int64)[None, :]  # element i: the k before it
            prev_u, prev_r = tf.gather(all_u, window), tf.gather(all_r, window)
            return (pos + n, all_u[-k:], all_r[-k:]), (pos + tf.range(n), prev_u, prev_r) + tuple(chunk)

        none = tf.fill([k], tf.constant(-1, tf.int64))
        start = (tf.constant(0, tf.int64), none, none)
        ds = ds.batch(TAG_CHUNK).scan(start, plain(tag)).unbatch()

        def dec(pos, pu, pr, u, r, d, epoch):
            if not sentinel:
                image, label = decode(u, r, d, epoch)
            else:
                image, label = tf.cond(u < 0, lambda: (tf.zeros(self.shape, tf.uint8), tf.constant(-1, tf.int32)),
                                       lambda: decode(u, r, d, epoch))
            return pos, pu, pr, image, label

        ds = ds.map(plain(dec), num_parallel_calls=self.threads["decode_threads"], deterministic=True)
        ds = ds.ignore_errors().batch(per, drop_remainder=not sentinel)
        skip_log = self._raw_log() if self.skip_bad else None

        def names(pu, pr):
            where = tf.gather(files, tf.maximum(pu, 0))
            if self.counts is None:
                return where
            return tf.strings.join([where, tf.fill(tf.shape(where), f": {self.what} "), tf.strings.as_string(pr)])

        def check(last, batch):
            """(the batch, the first gap's name and size): the state moves on whatever the batch holds, so a batch
            after a failed one is judged on its own."""
            pos, pu, pr, images, labels = batch
            gaps = pos - tf.concat([[last], pos[:-1]], 0) - 1
            bad = tf.where(gaps > 0)[:, 0]
            bad_u, bad_r, bad_gaps = tf.gather(pu, bad), tf.gather(pr, bad), tf.gather(gaps, bad)
            who, how_many = names(bad_u[:, -1], bad_r[:, -1]), bad_gaps  # each gap's last: its survivor's predecessor
            if skip_log is not None:
                # One row per failed element the history names: (name, 1); the oldest of a longer run of failures
                # also counts the unnamed ones before it.
                column = tf.range(k, dtype=tf.int64)[None, :]
                dropped = column >= k - bad_gaps[:, None]
                counts = tf.where(column == 0, tf.maximum(bad_gaps[:, None] - k + 1, 1), 1)
                rows = tf.strings.join([tf.boolean_mask(names(bad_u, bad_r), dropped),
                                        tf.strings.as_string(tf.boolean_mask(counts, dropped))], "\t")
                logged = tf.cond(tf.size(bad) > 0, lambda: tf.print(tf.strings.reduce_join(rows, separator="\n"),
                                                                    output_stream="file://" + skip_log),
                                 lambda: tf.no_op())
                with tf.control_dependencies([logged]):
                    images = tf.identity(images)
            if sentinel:
                keep = labels >= 0
                images, labels = tf.boolean_mask(images, keep), tf.boolean_mask(labels, keep)
            first = tf.concat([who, [""]], 0)[0], tf.concat([how_many, [0]], 0)[0]
            return pos[-1], (images, labels) + first

        def fail(images, labels, who, how_many):
            # Raised here, after the scan: its state has moved past this batch, so whatever pulls next (another
            # replica's prefetch) does not report the same loss again as a larger gap.
            ok = tf.debugging.Assert(how_many <= 0, [MARK, "does not parse or decode", who, how_many])
            with tf.control_dependencies([ok]):
                return tf.identity(images), tf.identity(labels)

        ds = ds.scan(tf.constant(-1, tf.int64), plain(check))
        if skip_log is not None:
            return ds.map(plain(lambda images, labels, who, how_many: (images, labels)))
        return ds.map(plain(fail))

    def _raw_log(self) -> str:
        """Where the pipeline appends what it skips, a row each time it meets one (every pass, every pull): beside
        ``skip_log``, hidden; a temporary file when there is none. ``skipped`` makes ``skip_log`` from it."""
        if self.raw_log is None:
            if self.skip_log is not None:
                log_path = Path(self.skip_log)
                self.raw_log = str(log_path.with_name(f".{log_path.stem}.log"))
            else:
                fd, self.raw_log = tempfile.mkstemp(prefix="tftoolkit-skipped-", suffix=".log")
                os.close(fd)
        return self.raw_log

    def skipped(self) -> tuple[int, list[str]]:
        """(how many, their names in the order met) of the examples --skip-bad-images skipped, each counted once
        however many epochs (and pulls) met it, and written to ``skip_log`` (when set), one row per example:
        its name, a tab, and how many were skipped ending with it (1; more where over TAG_HISTORY failed in a row
        and the first of them are not named). In memory: those ``read_stream`` left out; streamed: what the
        pipeline logged, with what ``skip_log`` already held (a resumed run's earlier processes)."""
        rows: list[str] = []
        for where in ([self.raw_log] if not self.in_memory_skips else []) + [self.skip_log]:
            if where and Path(where).exists():
                rows += Path(where).read_text().splitlines()
        gaps: dict[str, int] = {name: 1 for name in self.in_memory_skips}
        for line in rows:
            where, _, gap = line.rpartition("\t")
            where = where.strip().strip('"')
            if where:
                gaps[where] = max(gaps.get(where, 0), int(gap) if gap.isdigit() else 1)
        if self.skip_log is not None and (gaps or Path(self.skip_log).exists()):
            from ..fileio import atomic_write

            atomic_write(Path(self.skip_log), "".join(f"{name}\t{n}\n" for name, n in gaps.items()))
        return sum(gaps.values()), list(gaps)


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


def _centre_box(shape):
    """The centre square of EVAL_CROP of the shorter side: (y, x, h, w)."""
    import tensorflow as tf

    side = tf.cast(tf.cast(tf.minimum(shape[0], shape[1]), tf.float32) * EVAL_CROP, tf.int32)
    side = tf.maximum(side, 1)
    return (shape[0] - side) // 2, (shape[1] - side) // 2, side, side


def _random_box(key):
    """A box of AREA of the image with aspect ASPECT, drawn from ``key``: (y, x, h, w)."""
    import tensorflow as tf

    def box(shape):
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.concat([shape, [3]], 0), tf.zeros([1, 0, 4], tf.float32), seed=tf.stack([key, tf.constant(0, tf.int64)]),
            min_object_covered=0.0, aspect_ratio_range=ASPECT, area_range=AREA, max_attempts=CROP_ATTEMPTS,
            use_image_if_no_bounding_boxes=True)
        return begin[0], begin[1], size[0], size[1]

    return box


def _decode_window(encoded, box):
    """The box ``box(shape)`` picks of an encoded image: JPEGs decode only that window (decode_and_crop_jpeg);
    PNG, GIF and BMP decode whole and are sliced."""
    import tensorflow as tf

    def jpeg():
        y, x, h, w = box(tf.image.extract_jpeg_shape(encoded, output_type=tf.int32)[:2])
        return tf.io.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=3)

    def other():
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        y, x, h, w = box(tf.shape(image, out_type=tf.int32)[:2])
        return image[y:y + h, x:x + w]

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def _resize(image, size: int, exact: bool):
    """``image`` (uint8 h x w x c) resized to size x size, uint8. ``exact``: an image already that size is left as
    it is (the fixed-size path keeps its pixels), and shrinking is antialiased."""
    import tensorflow as tf

    def resized():
        out = tf.image.resize(image, [size, size], method="bilinear", antialias=exact)
        return tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8)

    if not exact:
        return resized()
    same = tf.logical_and(tf.equal(tf.shape(image)[0], size), tf.equal(tf.shape(image)[1], size))
    return tf.cond(same, lambda: tf.identity(image), resized)


def explain_error(error: BaseException, splits) -> str | None:
    """The error a bad example raised while streaming (``MARK``), as one line naming its file (and record) and
    why; None for any other error."""
    import re

    text = str(error)
    if MARK not in text:
        return None
    m = re.search(re.escape(MARK) + r"\]?\s*\[?does not parse or decode\]?\s*\[(.+?)\]\s*\[?(\d+)", text, re.S)
    if not m:
        return "a bad example stopped the run: " + text.split(MARK, 1)[1].splitlines()[0].strip(" ,[]")
    where, gap = m.group(1).strip(" '\""), int(m.group(2))
    reason = "it does not parse or decode"
    for split in splits:
        found = split.locate(where)
        if found is not None:
            reason = split.explain(*found)
            break
    more = f" (and {gap - 1} just before it)" if gap > 1 else ""
    return (f"cannot use {where}{more}: {reason}; --skip-bad-images skips such images, counts them and names them "
            "in summary.json")


def as_examples(split, evaluate: bool = False):
    """A split as unbatched (image, label, id) examples in reading order, decoded as ``decoded`` says (for
    inspection; training reads ``train_dataset``, evaluation ``eval_dataset``)."""
    return split.decoded(evaluate)
