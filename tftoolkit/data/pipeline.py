"""Input pipeline: a source of (image, label, id) examples -> tf.data -> per-replica batches.

A source yields unbatched examples; ``train_dataset`` builds one epoch of global batches from it with a
seeded shuffle, so the batch at any step is a pure function of (seed, epoch, position). That is what
makes resuming from a checkpoint exact: the data position is the step number.
"""

from __future__ import annotations

from .source import DataSource


def to_float(image):
    """uint8 pixels to [0, 1] floats; float images are kept as they are."""
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
            return _augment(to_float(image), seed), label, ex_id

        ds = ds.map(aug, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    # Batch by the *global* batch; the strategy then splits each batch into per-replica slices.
    ds = ds.batch(config.global_batch_size, drop_remainder=(config.last_batch == "drop"))
    if skip_batches:
        ds = ds.skip(skip_batches)
    if not config.augment:
        # Converting whole batches costs one op per batch instead of one per image (same values, same order).
        ds = ds.map(lambda i, l, e: (to_float(i), l, e), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return ds.with_options(_options())


def eval_dataset(source: DataSource, config):
    import tensorflow as tf

    if source.val is None:
        return None
    ds = source.val.batch(config.global_batch_size)
    ds = ds.map(lambda i, l, e: (to_float(i), l, e), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
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


def first_batch(source: DataSource, global_batch: int):
    """The first ``global_batch`` training examples as float32 images (as ``train_dataset`` converts them,
    without shuffling or augmentation: no pass over the whole dataset to fill a shuffle buffer)."""
    import tensorflow as tf

    options = tf.data.Options()
    # No autotuning thread to wait for when the iterator goes (measure.breakdown's replayed batch).
    options.autotune.enabled = False
    ds = source.train.take(global_batch).batch(global_batch).map(lambda i, l, e: (to_float(i), l, e))
    return next(iter(ds.with_options(options)))
