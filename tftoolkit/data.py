"""Input pipeline: a source of (image, label, id) examples -> tf.data -> per-replica batches.

A source yields unbatched examples; ``train_dataset`` builds one epoch of global batches from it with a
seeded shuffle, so the batch at any step is a pure function of (seed, epoch, position). That is what
makes resuming from a checkpoint exact: the data position is the step number.

Each example carries an integer ``id`` so that the split across replicas can be audited (every example
seen exactly once per epoch) and counted from what really went through each replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import DataError


@dataclass
class DataSource:
    name: str
    train: Any                 # tf.data.Dataset of (image uint8|float32 HWC, label int32, id int64), unbatched
    val: Any | None            # same, or None
    train_examples: int
    val_examples: int
    input_shape: tuple[int, int, int]
    num_classes: int
    class_names: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # provenance for the summary (path, manifest version, skipped files)


# Synthetic data: in memory, no I/O, like tf_cnn_benchmarks' synthetic mode. Class-conditional so that it
# is also learnable: each class is a fixed random 4x4 colour texture tiled over the image, plus noise, so
# a convolutional model with global pooling separates the classes within an epoch or two.
SYNTHETIC_TRAIN = 16000
SYNTHETIC_VAL = 4000


def synthetic_arrays(n: int, image_size: int, num_classes: int, seed: int, noise: float = 0.35):
    rng = np.random.default_rng(seed)
    tiles = np.random.default_rng(12345).uniform(0, 1, (num_classes, 4, 4, 3))
    reps = -(-image_size // 4)
    protos = np.tile(tiles, (1, reps, reps, 1))[:, :image_size, :image_size]
    y = rng.integers(0, num_classes, n).astype(np.int32)
    x = protos[y] + noise * rng.standard_normal((n, image_size, image_size, 3))
    x = np.clip(x * 255.0, 0, 255).astype(np.uint8)
    return x, y


def from_arrays(x, y, name="arrays", val: tuple | None = None, num_classes: int | None = None) -> DataSource:
    """A source from NumPy arrays: images (N, H, W, C) uint8 or float, integer labels (N,)."""
    import tensorflow as tf

    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 4:
        raise DataError(f"images must have shape (N, height, width, channels), got {x.shape}")
    if y.shape != (x.shape[0],):
        raise DataError(f"labels must have shape ({x.shape[0]},) to match the images, got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"labels must be integers, got {y.dtype}")
    k = int(num_classes if num_classes is not None else y.max() + 1)
    if y.min() < 0 or y.max() >= k:
        raise DataError(f"label out of range: labels span [{y.min()}, {y.max()}] but there are {k} classes")

    def ds(xa, ya, offset=0):
        ids = np.arange(offset, offset + len(xa), dtype=np.int64)
        return tf.data.Dataset.from_tensor_slices((xa, ya.astype(np.int32), ids))

    val_ds, n_val = None, 0
    if val is not None:
        vx, vy = np.asarray(val[0]), np.asarray(val[1])
        val_ds, n_val = ds(vx, vy), len(vx)
    return DataSource(name, ds(x, y), val_ds, len(x), n_val, tuple(x.shape[1:]), k)


def load_source(config, arrays=None) -> DataSource:
    """The examples a config names. ``arrays`` = (x, y) or (x, y, x_val, y_val) from the Python API."""
    if arrays is not None:
        x, y, *rest = arrays
        return from_arrays(x, y, val=tuple(rest) if rest else None, num_classes=config.num_classes)
    if config.dataset == "synthetic":
        x, y = synthetic_arrays(SYNTHETIC_TRAIN, config.image_size, config.num_classes, config.seed)
        vx, vy = synthetic_arrays(SYNTHETIC_VAL, config.image_size, config.num_classes, config.seed + 1)
        src = from_arrays(x, y, name="synthetic", val=(vx, vy), num_classes=config.num_classes)
        return src
    from . import datasets  # file-backed sources (shapes16k, image folders, TFRecords)

    return datasets.load(config)


def limit(source: DataSource, n: int | None) -> DataSource:
    if n is None or n >= source.train_examples:
        return source
    source.train = source.train.take(n)
    source.train_examples = n
    return source


def _to_float(image):
    import tensorflow as tf

    if image.dtype == tf.uint8:
        return tf.cast(image, tf.float32) / 255.0
    return tf.cast(image, tf.float32)


def _augment(image, seed):
    """Random horizontal flip and 4-pixel pad-and-crop, stateless so the result depends only on the seed."""
    import tensorflow as tf

    h, w = image.shape[0], image.shape[1]
    image = tf.image.stateless_random_flip_left_right(image, seed)
    padded = tf.pad(image, [[4, 4], [4, 4], [0, 0]], mode="REFLECT")
    return tf.image.stateless_random_crop(padded, [h, w, image.shape[2]], seed + 1)


def _options():
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = True  # the data order is part of what a seed reproduces
    return options


def train_dataset(source: DataSource, config, epoch: int, skip_batches: int = 0):
    """One epoch of global batches of (image float32, label, id); starts ``skip_batches`` into the epoch."""
    import tensorflow as tf

    ds = source.train
    # A fresh, seeded permutation per epoch: same (seed, epoch) -> same order on every run and after resume.
    epoch_seed = config.seed * 100003 + epoch
    ds = ds.shuffle(max(source.train_examples, 1), seed=epoch_seed, reshuffle_each_iteration=False)
    if config.augment:
        def aug(image, label, ex_id):
            seed = tf.stack([tf.cast(epoch_seed, tf.int64), ex_id])
            return _augment(_to_float(image), seed), label, ex_id

        ds = ds.map(aug, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    # Batch by the *global* batch; the strategy then splits each batch into per-replica slices.
    ds = ds.batch(config.global_batch_size, drop_remainder=(config.last_batch == "drop"))
    if skip_batches:
        ds = ds.skip(skip_batches)
    if not config.augment:
        # Converting whole batches costs one op per batch instead of one per image (same values, same order).
        ds = ds.map(lambda i, l, e: (_to_float(i), l, e), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return ds.with_options(_options())


def eval_dataset(source: DataSource, config):
    import tensorflow as tf

    if source.val is None:
        return None
    ds = source.val.batch(config.global_batch_size)
    ds = ds.map(lambda i, l, e: (_to_float(i), l, e), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    return ds.with_options(_options())


def distribute(strategy, dataset):
    """Per-replica batches from a dataset of global batches.

    Every global batch of n examples is cut into ``replicas`` consecutive slices whose sizes differ by at
    most one (slice r = examples [r*n//R, (r+1)*n//R)), so a short last batch is split as evenly as possible
    and full batches give every replica exactly n/R examples. Replica r always gets slice r, on one host or
    across workers (worker w's local replica j is global replica w*R_local + j), which is what makes N
    replicas on any number of workers compute exactly what one device computes on the same global batch.
    TensorFlow's own ``experimental_distribute_dataset`` splits a short batch as ceil(n/R) per replica
    (e.g. 14, 14, 12 for 40 over 3) and shards differently across workers, so it is not used.
    """
    import tensorflow as tf

    def dataset_fn(ctx):
        total = ctx.num_replicas_in_sync
        local = total // ctx.num_input_pipelines
        first = ctx.input_pipeline_id * local

        def split(images, labels, ids):
            n = tf.shape(labels)[0]
            bounds = (tf.range(total + 1) * n) // total

            def piece(r):
                lo, hi = bounds[first + r], bounds[first + r + 1]
                return images[lo:hi], labels[lo:hi], ids[lo:hi]

            return tf.data.Dataset.range(local).map(piece)

        # Slicing here replaces auto-sharding; say so explicitly so TensorFlow never shards (or warns) itself.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return dataset.flat_map(split).with_options(options)

    return strategy.distribute_datasets_from_function(dataset_fn)


def dropped_per_epoch(config, train_examples: int) -> int:
    return 0 if config.last_batch == "partial" else train_examples % config.global_batch_size
