"""Where the training split lives while a run trains, and the batch each replica computes on.

``--data-placement``:
    host     tf.data gathers each replica's batch on the CPU (data.pipeline) and the step receives it;
    device   the split is copied once to every replica's device as uint8, and each step gathers that replica's
             slice of the shuffled index vector there (augmentation too): only a few hundred indices a step
             cross from the host;
    auto     device on GPUs when the split takes at most DEVICE_SHARE of the smallest GPU's memory (NVML's total),
             host otherwise, on CPU replicas, and where NVML cannot say; the choice and why are logged and
             recorded in the summary (``data_placement``, ``data_placement_reason``).

Both placements feed the same examples to the same replica at the same step (the indices come from the same
``pipeline.epoch_order``) and augment them with the same keyed function, so they train identically;
tests/engine/test_feed.py checks that the weights agree bit for bit.

On a GPU every tensor of the device path must live in device memory, and TensorFlow keeps some dtypes in host
memory whatever device an op is placed on. Its kernel registry says which
(``tensorflow.python.framework.kernels``; tests/engine/test_feed.py reads it for every op of this path):
- int32 is a host-memory type on GPUs: ``Identity``, ``Reshape`` and arithmetic on int32 keep their inputs and
  outputs in host memory (identity_op.cc; tensorflow#16106). A split held as int32 and "placed" with
  ``tf.identity`` would stay on the host and cross to the GPU at every step's gather.
- ``GatherV2`` has no GPU kernel for uint8, and ``MirrorPad`` (the augmentation's padding) only float ones.
So uint8 images are packed into int64 words, 8 pixels each (each image's bytes padded to a whole word), the
labels are int64, the gather and the bitcast back to uint8 run on the device, and augmentation runs on the float
batch (it is pure indexing: float or uint8, the same pixels move, so host and device placement still agree
bit for bit).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import nvml as nvml_api
from ..data import pipeline
from ..errors import ConfigError

log = logging.getLogger("tftoolkit")

PLACEMENTS = ("host", "device", "auto")
DEVICE_SHARE = 0.25      # auto: at most a quarter of a GPU's memory goes to the data; the rest is the model's
DEVICE_MAX_SHARE = 0.9   # device: refused above this share of a GPU's memory (or of the host's free RAM on CPU)


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def gpu_memory_bytes(setup) -> int | None:
    """The smallest total memory of the run's GPUs (NVML), or None where NVML cannot say."""
    if setup.kind != "GPU" or not setup.gpu_indices:
        return None
    try:
        with nvml_api.session() as nvml:
            return min(int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).total)
                       for i in setup.gpu_indices)
    except Exception:  # noqa: BLE001 - no NVML, no driver: auto then keeps the data on the host
        return None


def host_available_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001
        return None


def choose(placement: str, setup, nbytes: int, gpu_memory: int | None = None,
           host_available: int | None = None, in_memory: bool = True, service: bool = False) -> tuple[str, str]:
    """(placement, why) for a split of ``nbytes``; raises ConfigError for ``device`` when it does not fit.
    ``in_memory=False``: the split streams from disk (an image folder over the memory budget). ``service``: the
    batches come from a tf.data service (--data-service), which delivers them to the host."""
    if placement not in PLACEMENTS:
        raise ConfigError(f"data_placement: unknown value {placement!r}; choose one of {', '.join(PLACEMENTS)}")
    replicas = setup.replicas
    if placement == "host":
        return "host", "asked for (--data-placement host)"
    if service:
        if placement == "device":
            raise ConfigError("--data-placement device cannot go with --data-service: the service's workers make "
                              "the batches and send them to this host; use --data-placement host (or auto)")
        return "host", "auto: the batches come from the tf.data service (--data-service)"
    if not in_memory:
        if placement == "device":
            raise ConfigError(f"--data-placement device: the training split streams from disk (its {_gb(nbytes)} of "
                              "pixels exceed the memory budget, --data-memory-gb); use --data-placement host, or "
                              "raise the budget")
        return "host", "auto: the split streams from disk (larger than the memory budget)"
    if placement == "device":
        if setup.kind == "GPU":
            if gpu_memory is not None and nbytes > DEVICE_MAX_SHARE * gpu_memory:
                raise ConfigError(f"--data-placement device: the training split takes {_gb(nbytes)} but each GPU has "
                                  f"{_gb(gpu_memory)} (at most {DEVICE_MAX_SHARE:.0%} may go to data); use "
                                  "--data-placement host")
            return "device", "asked for (--data-placement device)"
        # Simulated replicas: every copy lives in host RAM.
        if host_available is not None and replicas * nbytes > DEVICE_MAX_SHARE * host_available:
            raise ConfigError(f"--data-placement device: {replicas} copies of the training split take "
                              f"{_gb(replicas * nbytes)} but the host has {_gb(host_available)} free; use "
                              "--data-placement host")
        return "device", "asked for (--data-placement device; simulated replicas keep their copies in host RAM)"
    if setup.kind != "GPU":
        return "host", "auto: CPU replicas (the host is the device)"
    if gpu_memory is None:
        return "host", "auto: GPU memory unknown (NVML unavailable)"
    if nbytes <= DEVICE_SHARE * gpu_memory:
        return "device", (f"auto: the split ({_gb(nbytes)}) fits in {DEVICE_SHARE:.0%} of each GPU's "
                          f"{_gb(gpu_memory)}")
    return "host", f"auto: the split ({_gb(nbytes)}) exceeds {DEVICE_SHARE:.0%} of each GPU's {_gb(gpu_memory)}"


@dataclass
class Feed:
    """The input side of the compiled step: what the iterator yields and how a replica turns it into a batch."""

    placement: str = "host"
    reason: str = "default"
    resident: Any = None     # device placement: per-replica (images, labels) on each replica's device
    shape: tuple = ()
    words: bool = False      # images held as int64 words (8 uint8 pixels each, each image padded to whole words)
    augment: bool = False
    seed: int = 0

    def args(self, element):
        """strategy.run's arguments for one step."""
        return (element,) if self.resident is None else (element, self.resident)

    def batch(self, element, resident=None):
        """(images float32, labels) for this replica, inside the replica function."""
        import tensorflow as tf  # deferred: the placement rule and the host sizes import without TensorFlow

        if resident is None:
            return pipeline.to_float(element[0]), element[1]
        indices, epoch = element
        images, labels = resident
        rows = tf.gather(images, indices)
        if self.words:
            rows = unpack_words(rows, self.shape)
        images = pipeline.to_float(rows)
        if self.augment:  # on float: MirrorPad has GPU kernels for float types only
            images = pipeline.augment(images, pipeline.augment_keys(indices, epoch, self.seed))
        return images, tf.gather(labels, indices)

    def train_input(self, strategy, source, config, start_step: int = 0, replay: bool = False):
        return pipeline.train_input(strategy, source, config, start_step, placement=self.placement, replay=replay)

    def replay(self, strategy, source, config):
        """One element per replica already on the devices (measure.breakdown's input-free step): the first examples
        of one pass (the global batch, or one micro-batch of it with --accumulate), sliced as the pipeline slices
        them."""
        import tensorflow as tf  # deferred: the placement rule and the host sizes import without TensorFlow

        total, n = strategy.num_replicas_in_sync, config.micro_batch_size
        if self.resident is None:
            batch = pipeline.first_batch(source, n)
        else:
            batch = (tf.range(n, dtype=tf.int64), None)

        def piece(ctx):
            r = ctx.replica_id_in_sync_group
            lo, hi = r * n // total, (r + 1) * n // total
            if batch[1] is None:
                return tf.identity(batch[0][lo:hi]), tf.constant(0, tf.int64)
            return tf.nest.map_structure(lambda t: tf.identity(t[lo:hi]), batch)

        return strategy.experimental_distribute_values_from_function(piece)


def host() -> Feed:
    return Feed()


WORD_BYTES = 8  # int64


def pack_words(images):
    """uint8 images [n, ...] -> int64 words [n, ceil(bytes / 8)], each image's bytes zero-padded to whole words."""
    flat = np.ascontiguousarray(images).reshape(len(images), -1)
    pad = -flat.shape[1] % WORD_BYTES
    if pad:
        flat = np.pad(flat, ((0, 0), (0, pad)))
    return flat.view(np.int64)


def unpack_words(words, shape):
    """The inverse of ``pack_words`` for a gathered batch, on the device: a bitcast, a slice and a reshape."""
    import tensorflow as tf  # deferred: the placement rule and the host sizes import without TensorFlow

    nbytes = int(np.prod(shape))
    flat = tf.reshape(tf.bitcast(words, tf.uint8), [-1, words.shape[1] * WORD_BYTES])
    if flat.shape[1] != nbytes:
        flat = flat[:, :nbytes]
    return tf.reshape(flat, [-1, *shape])


def make(config, setup, strategy, source) -> Feed:
    """The feed ``config.data_placement`` asks for on these devices; device placement copies the split now."""
    import tensorflow as tf  # deferred: the placement rule and the host sizes import without TensorFlow

    store = source.store("train")
    need_gpu = setup.kind == "GPU" and config.data_placement != "host" and config.data_service is None
    placement, reason = choose(config.data_placement, setup, store.nbytes,
                               gpu_memory=gpu_memory_bytes(setup) if need_gpu else None,
                               host_available=host_available_bytes() if config.data_placement == "device" else None,
                               in_memory=store.in_memory, service=config.data_service is not None)
    if placement == "device" and store.structured:
        if config.data_placement == "device":
            raise ConfigError("--data-placement device holds one image array and its class labels on each device; "
                              "this data is another task's (several inputs, or other targets): use --data-placement "
                              "host (or auto)")
        placement, reason = "host", "auto: the data is not one image array with class labels (device holds those only)"
    log.info("data placement: %s (%s)", placement, reason)
    if placement == "host":
        return Feed("host", reason)  # the host pipeline augments itself (data.pipeline.host_gather)
    images, labels, words = resident_arrays(store.images, store.labels)
    with tf.device("/cpu:0"):
        host_images, host_labels = tf.constant(images), tf.constant(labels)
    # One copy per replica, on its device (value_fn runs under each replica's device scope).
    resident = strategy.experimental_distribute_values_from_function(lambda ctx: place(host_images, host_labels))
    return Feed("device", reason, resident, tuple(store.images.shape[1:]), words, config.augment, config.seed)


def resident_arrays(images, labels):
    """(images, labels, words) as the devices hold them: uint8 images packed into int64 words, int64 labels
    (int32 would stay in host memory on a GPU); float images as they are."""
    words = images.dtype == np.uint8
    return (pack_words(images) if words else images), np.asarray(labels).astype(np.int64), words


def place(host_images, host_labels):
    """This replica's copy of the split, on the device of the enclosing scope (Identity: for int64 and float the
    GPU kernel keeps its output in device memory)."""
    import tensorflow as tf  # deferred: the placement rule and the host sizes import without TensorFlow

    return tf.identity(host_images), tf.identity(host_labels)


def device_path_graph(shape=(32, 32, 3), augment: bool = True, dtype: str = "uint8"):
    """The graph of one replica's device-placement path (placement, gather, unpacking, float conversion,
    augmentation), traced with the dtypes ``make`` uses: what engine.kernels.gpu_problems checks against the
    GPU kernel registry."""
    import tensorflow as tf  # deferred: the placement rule and the host sizes import without TensorFlow

    images, labels, words = resident_arrays(np.zeros((2, *shape), dtype), np.zeros(2, np.int32))
    f = Feed("device", "check", None, tuple(shape), words, augment, 0)

    @tf.function(autograph=False)
    def path(host_images, host_labels, indices, epoch):
        return f.batch((indices, epoch), place(host_images, host_labels))

    spec = [tf.TensorSpec([None, *images.shape[1:]], tf.as_dtype(images.dtype)),
            tf.TensorSpec([None], tf.as_dtype(labels.dtype)),
            tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)]  # pipeline.epoch_order's int64 indices
    return path.get_concrete_function(*spec).graph


def pad_empty(images, labels):
    """(images, labels, weights): a replica's batch, with one zero example of weight 0 when it has none.

    A short batch (the last of a validation split, ``--last-batch partial``) with fewer examples than replicas
    leaves some replicas an empty slice (data.pipeline splits every batch, short or not, the same way). A model
    cannot run on a zero-size batch: TensorFlow's Conv2D returns its input's shape for an empty batch ("input
    depth must be evenly divisible by filter depth: 3 vs 32" at the next layer), and batch norm's moments are
    undefined. Such a replica computes on one zero example instead, weighted 0: in the loss, the accuracy and
    synchronized batch norm's statistics (models.example_weights), so it adds nothing and still takes part in
    every collective. Per-replica batch norm (keras.applications) does see it in that replica's statistics for
    that step. A non-empty batch goes through untouched (a cond, not a copy).
    """
    import tensorflow as tf  # deferred: session.start times TensorFlow's import

    n = tf.shape(tf.nest.flatten(labels)[0])[0]

    def dummy():  # every input and target of the structure, one zero example
        return tf.nest.map_structure(lambda t: tf.zeros(tf.concat([[1], tf.shape(t)[1:]], 0), t.dtype),
                                     (images, labels))

    images, labels = tf.cond(n > 0, lambda: (images, labels), dummy)
    weights = tf.cast(tf.range(tf.maximum(n, 1)) < n, tf.float32)
    return images, labels, weights
