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

On the device the uint8 images are viewed as int32 words (4 bytes each) for the gather: GatherV2's GPU kernels
cover 32- and 64-bit and float types, and the view is free (a bitcast, same memory).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

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
        import pynvml

        pynvml.nvmlInit()
        try:
            return min(int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                       for i in setup.gpu_indices)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, no driver: auto then keeps the data on the host
        return None


def host_available_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001
        return None


def choose(placement: str, setup, nbytes: int, gpu_memory: int | None = None,
           host_available: int | None = None, in_memory: bool = True) -> tuple[str, str]:
    """(placement, why) for a split of ``nbytes``; raises ConfigError for ``device`` when it does not fit.
    ``in_memory=False``: the split streams from disk (an image folder over the memory budget)."""
    if placement not in PLACEMENTS:
        raise ConfigError(f"data_placement: unknown value {placement!r}; choose one of {', '.join(PLACEMENTS)}")
    replicas = setup.replicas
    if placement == "host":
        return "host", "asked for (--data-placement host)"
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
    words: bool = False      # images held as int32 words (4 uint8 pixels each)
    augment: bool = False
    seed: int = 0

    def args(self, element):
        """strategy.run's arguments for one step."""
        return (element,) if self.resident is None else (element, self.resident)

    def batch(self, element, resident=None):
        """(images float32, labels) for this replica, inside the replica function."""
        import tensorflow as tf

        from ..data import pipeline

        if resident is None:
            return pipeline.to_float(element[0]), element[1]
        indices, epoch = element
        images, labels = resident
        rows = tf.gather(images, indices)
        if self.words:
            rows = tf.reshape(tf.bitcast(rows, tf.uint8), [-1, *self.shape])
        if self.augment:
            rows = pipeline.augment(rows, pipeline.augment_keys(indices, epoch, self.seed))
        return pipeline.to_float(rows), tf.gather(labels, indices)

    def train_input(self, strategy, source, config, start_step: int = 0):
        from ..data import pipeline

        return pipeline.train_input(strategy, source, config, start_step, placement=self.placement)

    def replay(self, strategy, source, config):
        """One global batch as per-replica elements already on the devices (measure.breakdown's input-free
        step): the first ``global_batch`` examples, sliced as the pipeline slices them."""
        import tensorflow as tf

        from ..data import pipeline

        total, n = strategy.num_replicas_in_sync, config.global_batch_size
        if self.resident is None:
            batch = pipeline.first_batch(source, n)
        else:
            batch = (tf.range(n, dtype=tf.int64), None)

        def piece(ctx):
            r = ctx.replica_id_in_sync_group
            lo, hi = r * n // total, (r + 1) * n // total
            if batch[1] is None:
                return tf.identity(batch[0][lo:hi]), tf.constant(0, tf.int64)
            return tuple(tf.identity(t[lo:hi]) for t in batch)

        return strategy.experimental_distribute_values_from_function(piece)


def host() -> Feed:
    return Feed()


def make(config, setup, strategy, source) -> Feed:
    """The feed ``config.data_placement`` asks for on these devices; device placement copies the split now."""
    import numpy as np
    import tensorflow as tf

    store = source.store("train")
    need_gpu = setup.kind == "GPU" and config.data_placement != "host"
    placement, reason = choose(config.data_placement, setup, store.nbytes,
                               gpu_memory=gpu_memory_bytes(setup) if need_gpu else None,
                               host_available=host_available_bytes() if config.data_placement == "device" else None,
                               in_memory=store.in_memory)
    log.info("data placement: %s (%s)", placement, reason)
    if placement == "host":
        return Feed("host", reason)  # the host pipeline augments itself (data.pipeline.host_gather)
    images = store.images
    words = images.dtype == np.uint8 and (int(np.prod(images.shape[1:])) % 4 == 0)
    if words:
        images = images.reshape(len(images), -1, 4).view(np.int32).reshape(len(images), -1)
    with tf.device("/cpu:0"):
        host_images, host_labels = tf.constant(images), tf.constant(store.labels)
    # One copy per replica, on its device (value_fn runs under each replica's device scope).
    resident = strategy.experimental_distribute_values_from_function(
        lambda ctx: (tf.identity(host_images), tf.identity(host_labels)))
    return Feed("device", reason, resident, tuple(store.images.shape[1:]), words, config.augment, config.seed)
