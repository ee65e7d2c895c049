"""Input pipeline: a split held for random access (store.py) -> per-epoch index order -> per-replica batches.

The work is per batch, never per image. Each epoch is a seeded permutation of the indices 0..n-1
(``epoch_order``: a pure function of (seed, epoch)); the global batch at position p of the epoch is
indices [p*B, (p+1)*B) of it, and global replica r's share of that batch is the consecutive slice
[r*B//R, (r+1)*B//R). A replica's input is then one ``tf.gather`` of its own slice: no shuffle buffer, no
Dataset per batch, no unbatching. Because the batch at any step depends only on (seed, epoch, position),
resuming from a checkpoint is exact (the data position is the step number), and every placement of the data
(host or device, one process or several) trains on the same examples per replica per step.

Even split, and why TensorFlow's own is not used: full batches give every replica exactly B/R examples; a
short last batch (``--last-batch partial``) is split as evenly as possible (slice sizes differ by at most one).
Replica r always gets slice r, on one host or across workers (worker w's local replica j is global replica
w*R_local + j), which is what makes N replicas on any number of workers compute exactly what one device
computes on the same global batch. ``experimental_distribute_dataset`` splits a short batch as ceil(n/R) per
replica (14, 14, 12 for 40 over 3) and shards differently across workers. Each worker computes the (cheap)
permutation and gathers only its own replicas' slices.

One iterator serves a whole run, across epochs (``train_input(..., start_step)``): a new distributed iterator
per epoch cost up to 17 s of idle wall time in its teardown (measured in BENCHMARKS.md).

Elements (what a replica receives each step):
    host placement     (images, labels[, ids])   images uint8 (float32 for float sources), augmented already
    device placement   (indices, epoch)          engine.feed gathers and augments on the device
The uint8 -> float conversion happens on the device, in the step (``to_float``): a quarter of the bytes move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from . import service
from .functions import plain
from .pixels import augment, augment_keys, to_float  # noqa: F401 - the pipeline's transforms, also used from here
from .source import DataSource

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

# Host-side parallelism of the per-batch gather. A fixed, small number instead of AUTOTUNE: the gather is one
# op per batch, and tf.data's autotuning thread is what made deleting an iterator stall (BENCHMARKS.md).
PARALLEL_BATCHES = 2
PREFETCH = 2  # batches per input pipeline prepared ahead of the step


def epoch_order(n: int, seed: int, epoch):
    """The permutation of 0..n-1 that epoch ``epoch`` trains in (int64): same (seed, epoch), same order."""
    import tensorflow as tf

    seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed=seeds)


# --- which indices each replica gets ----------------------------------------------------------------------
def _pieces(order, global_batch: int, total: int, first: int, local: int, partial: bool, skip=0, accumulate: int = 1):
    """This input pipeline's per-replica index vectors for one pass over ``order``, from batch ``skip`` on.

    Full batches: one reshape and a slice (a [steps * local, B/R] matrix, one row per replica-step). A short
    last batch (kept only when ``partial``) is cut into even pieces, the only place a piece has its own dataset.
    With ``accumulate`` K every step is K elements per replica, one per micro-batch (so what is buffered and copied
    ahead does not grow with K), and micro-batch k of all replicas together is the global batch's k-th slice of
    B/K, replica r holding slice r of it as in any batch: R replicas x K micro-batches compute what one device
    computes with K micro-batches of R times the size, batch norm included. Rows go step by step, micro-batch by
    micro-batch, replica by replica: the order a pipeline hands its replicas their elements in turn.
    """
    import tensorflow as tf

    n = int(order.shape[0])
    micro = global_batch // (total * accumulate)
    full = n // global_batch
    grid = tf.reshape(order[:full * global_batch], [full, accumulate, total, micro])[skip:, :, first:first + local]
    ds = tf.data.Dataset.from_tensor_slices(tf.reshape(grid, [-1, micro]))
    rest = n - full * global_batch
    if partial and rest:  # (never with accumulate > 1: config refuses --last-batch partial with it)
        bounds = [(r * rest) // total for r in range(total + 1)]
        tail = order[full * global_batch:]
        for r in range(first, first + local):
            # One element from a [1, k] slice, not Dataset.from_tensors: under op determinism (on by default on
            # CPU replicas) tf.data's make_deterministic rewrite takes a TensorDataset inside a dataset function
            # (one_epoch's flat_map) for a nondeterministic stateful op (TensorSliceDataset is on its allow-list)
            # and then runs the pipeline's parallel map serially and its prefetch at 0: half the input rate, and
            # one "NodeDef mentions attribute use_unbounded_threadpool" line from TensorFlow.
            ds = ds.concatenate(tf.data.Dataset.from_tensor_slices(tail[bounds[r]:bounds[r + 1]][tf.newaxis]))
    return ds


def _layout(ctx):
    total = ctx.num_replicas_in_sync
    local = total // ctx.num_input_pipelines
    return total, local, ctx.input_pipeline_id * local


def _options():
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = True  # the data order is part of what a seed reproduces
    # The per-batch work is fixed and small: no autotuning thread (its shutdown stalled every iterator's deletion).
    options.autotune.enabled = False
    # The slicing replaces auto-sharding; say so, so TensorFlow never shards (or warns) itself.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def on_gpus(strategy) -> bool:
    return all("GPU" in d.upper() for d in strategy.extended.worker_devices)


def input_options(strategy):
    """How the strategy hands a replica its elements: per replica, from the host, where the strategy allows.

    TensorFlow's default (one pipeline per worker feeding a MultiDeviceIterator) builds a dataset per device
    with default options, autotuning included, and deleting such an iterator waits for the autotuner's thread
    to wake: 0.1 to 18 s measured here (py-spy: ~RootDataset::Iterator joining its tf_data_model thread),
    paid once per iterator. With ``PER_REPLICA`` replication each replica reads its own dataset (ours, no
    autotuning). On CPU replicas a plain iterator serves it (the host is the device: nothing to copy, and the
    stall is gone). On GPUs each replica's elements are prefetched into its GPU's memory
    (``experimental_fetch_to_device``, PREFETCH elements ahead), so the host-to-device copy of the next batch
    overlaps the current step instead of starting at the step's first use of the batch. MultiWorkerMirroredStrategy
    refuses PER_REPLICA, so multi-worker runs keep TensorFlow's default (and its teardown stall).
    """
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MirroredStrategy):
        gpus = on_gpus(strategy)
        return tf.distribute.InputOptions(experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
                                          experimental_fetch_to_device=gpus,
                                          experimental_per_replica_buffer_size=PREFETCH if gpus else 1)
    return None


def host_gather(store, config, with_ids: bool = False):
    """The host-side map from (indices, epoch) to a replica's batch: one gather, augmentation on uint8."""
    import tensorflow as tf

    _, _, ids_t = store.tensors()
    if config.augment and store.structured:
        raise ConfigError("--augment flips and shifts images of one array (N, H, W, C) with class labels; this data "
                          "is another task's (several inputs, or targets that are not class labels): train it "
                          "without --augment, or augment it in the data you pass")

    def gather(indices, epoch):
        images = store.gather_images(indices)
        if config.augment:
            images = augment(images, augment_keys(indices, epoch, config.seed))
        out = (images, store.gather_labels(indices))
        return out + (tf.gather(ids_t, indices),) if with_ids else out

    return gather


def train_elements(store, config, ctx, start_step: int = 0, placement: str = "host", with_ids: bool = False,
                   worker_shard: tuple | None = None, examples: int | None = None):
    """The dataset one input pipeline feeds its replicas from ``start_step`` to the end of the run.

    One dataset (and so one iterator) across every remaining epoch: epoch e's order is computed when the
    pipeline reaches it. ``placement="device"`` yields (indices, epoch) for the device to gather itself.
    ``worker_shard`` (worker, workers): the store holds only this worker's shards (``--input-sharding file``);
    each epoch is then a permutation of them, cut to ``examples`` (what every worker keeps, so all train the same
    steps), and this worker's global batch share (global batch / workers) is split over its own replicas.
    """
    import tensorflow as tf

    total, local, first = _layout(ctx)
    n, batch, seed = store.n, config.global_batch_size, config.seed
    if worker_shard is not None:
        w, workers = worker_shard
        n_use, batch, total, first = examples, batch // workers, local, 0
        seed = seed * 1009 + w  # each worker its own order of its own examples
    else:
        n_use = n
    first_epoch, pos = divmod(start_step, config.steps_per_epoch(n_use if worker_shard is None else n_use * workers))
    partial = config.last_batch == "partial"

    def one_epoch(epoch):
        skip = tf.where(epoch == first_epoch, tf.constant(pos, tf.int64), tf.constant(0, tf.int64))
        order = epoch_order(n, seed, epoch)[:n_use]
        ds = _pieces(order, batch, total, first, local, partial, skip, config.accumulate)
        return ds.map(lambda indices: (indices, epoch))

    # Epochs without end: the consumer stops where its run does (an LR sweep may outlast the config's epochs).
    ds = tf.data.Dataset.range(first_epoch, 2**62).flat_map(plain(one_epoch))
    if placement == "host":
        ds = ds.map(plain(host_gather(store, config, with_ids)), num_parallel_calls=PARALLEL_BATCHES,
                    deterministic=True)
    return ds.prefetch(PREFETCH * local).with_options(_options())


def _deterministic(config) -> bool:
    return True if config.deterministic is None else bool(config.deterministic)


def train_input(strategy, source: DataSource, config, start_step: int = 0, placement: str = "host",
                with_ids: bool = False, replay: bool = False):
    """Per-replica training input from ``start_step`` on, over every remaining epoch (a distributed dataset).
    ``replay``: the first step's elements, cached and repeated (``replayed``), for measure.breakdown's step without
    input: the same iterator type as training's, so the training loop's trace serves it."""
    store = source.store("train")
    shard = source.worker_shard
    examples = source.train_examples // shard[1] if shard else None
    wrap = (lambda fn: replayed(config, fn)) if replay else (lambda fn: served(config, endless(fn)))
    if not store.in_memory:
        # Streamed from the files (data/stream.py): one pipeline per worker yields its replicas' per-replica
        # batches in turn, which TensorFlow hands round-robin to the worker's devices (and, on GPUs, prefetches
        # into their memory).
        if with_ids:
            raise ValueError("with_ids: a streamed split carries no ids through training")
        if config.last_batch == "partial":
            raise ConfigError(f"--last-batch partial: {source.name} streams from its files, which trains whole "
                              "batches only; use --last-batch drop (or a --data-memory-gb it fits in)")
        # All workers' examples: train_dataset takes this worker's share itself (under file sharding).
        examples = source.train_examples
        return strategy.distribute_datasets_from_function(wrap(lambda ctx: store.train_dataset(
            config, _layout(ctx), start_step, examples, _deterministic(config), shard)))
    return strategy.distribute_datasets_from_function(
        wrap(lambda ctx: train_elements(store, config, ctx, start_step, placement, with_ids, shard, examples)),
        input_options(strategy))


def endless(dataset_fn):
    """``dataset_fn``, its dataset declared infinite (it is: epochs without end, every replica an element each step).
    tf.distribute reads its cardinality as unknown (a flat_map) and, for an unknown one with a short last batch's
    shapes or between workers, checks before every step that some replica still has an element: a cond and dummy
    values each step, and between workers an all-reduce of those counts each step (TensorFlow's
    distribute/input_lib.py, _enable_get_next_as_optional and _calculate_replicas_with_values). Declared infinite,
    the step takes its elements directly."""
    import tensorflow as tf

    return lambda ctx: dataset_fn(ctx).apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))


def replayed(config, dataset_fn):
    """``dataset_fn``, cut to one step's elements (each local replica's, times --accumulate), cached and repeated:
    after the first step, every step's input is already in memory. Autotuning is off: deleting an iterator waits for
    tf.data's autotuning threads, which took from 0.3 s to over a minute on a loaded 2-core machine."""
    import tensorflow as tf

    def fn(ctx):
        _, local, _ = _layout(ctx)
        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset_fn(ctx).take(local * config.accumulate).cache().repeat().with_options(options)

    return fn


def served(config, dataset_fn):
    """``dataset_fn``, its dataset read through the tf.data service when ``config.data_service`` names one
    (data/service.py says how a step travels and what the processing mode keeps)."""
    if config.data_service is None:
        return dataset_fn
    def fn(ctx):
        _, local, _ = _layout(ctx)
        return service.through(dataset_fn(ctx), config.data_service, local, service.job_name(ctx.input_pipeline_id),
                               config.accumulate)

    return fn


@dataclass
class EvalSplit:
    """The validation split as the engine evaluates it: a distributed dataset and how many batches every replica
    takes from it per evaluation (None: read it to its end, asking before each batch which replicas still have one).
    With ``steps``, the dataset is endless and one iterator (made at the first evaluation) serves every evaluation
    of the run, each a whole pass from the start of one: no iterator to create and delete per evaluation."""

    dataset: Any
    steps: int | None
    iterator: Any = None


def eval_input(strategy, source: DataSource, config, with_ids: bool = False) -> EvalSplit | None:
    """The validation split in order, every example once (a short last batch split evenly), or None."""
    import tensorflow as tf

    store = source.store("val")
    if store is None:
        return None
    if not store.in_memory:
        # Streamed: records go to the replicas in turn as they decode, so the last ones may get one batch fewer.
        return EvalSplit(strategy.distribute_datasets_from_function(
            lambda ctx: store.eval_dataset(config, _layout(ctx))), None)
    gather = host_gather(store, config.replace(augment=False), with_ids)
    # Evaluation batches are one pass of all replicas (without --accumulate, the global batch): what fits. Every
    # replica gets a piece of each, the last one short or empty (_pieces), so each has exactly ``steps`` elements a
    # pass. The dataset repeats them: tf.distribute then takes each element directly (on a dataset of finite length
    # whose batches are not all one size it asks before every element whether each replica still has one: a cond
    # and dummy values per batch, and between workers an all-reduce; its input_lib's get_next_as_optional).
    steps = -(-store.n // config.micro_batch_size)

    def dataset_fn(ctx):
        total, local, first = _layout(ctx)
        ds = _pieces(tf.range(store.n, dtype=tf.int64), config.micro_batch_size, total, first, local, True)
        ds = ds.map(plain(lambda indices: gather(indices, tf.constant(0, tf.int64))),
                    num_parallel_calls=PARALLEL_BATCHES, deterministic=True)
        return ds.repeat().prefetch(PREFETCH * local).with_options(_options())

    return EvalSplit(strategy.distribute_datasets_from_function(dataset_fn, input_options(strategy)), steps)


def dropped_per_epoch(config, train_examples: int) -> int:
    return 0 if config.last_batch == "partial" else train_examples % config.global_batch_size


def first_batch(source: DataSource, global_batch: int):
    """The first ``global_batch`` training examples as (float32 images, labels), unshuffled and unaugmented:
    the batch measure.breakdown replays without the input pipeline."""
    import tensorflow as tf

    store = source.store("train")
    if not store.in_memory:
        return store.first_batch(global_batch)
    first = tf.range(global_batch, dtype=tf.int64)
    return to_float(store.gather_images(first)), store.gather_labels(first)
