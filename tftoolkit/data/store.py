"""One split held for random access: the arrays the input pipeline gathers whole batches from.

A ``Store`` is a split's examples as arrays indexed 0..n-1: images (uint8, or float32 for float sources), labels
(int32) and ids (int64, what the audit of the split across replicas reads). The pipeline never walks a dataset
example by example: each step it gathers a replica's batch by index, one op per batch, on the host or, with
``--data-placement device``, from a copy on the device itself.

Sources that are arrays already (NumPy input, the synthetic set, decoded image folders) become a Store without a
copy. File datasets (TFRecords, a user's tf.data pipeline) are read once into one, with parallel reads and
batched decoding (``materialize``): that single pass is the "cold" read, every epoch after it is served from
memory.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

READ_BATCH = 1024  # examples per batch when a dataset is read into a store (one op per batch, not per image)


@dataclass
class Store:
    images: np.ndarray   # (n, H, W, C) uint8 or float32
    labels: np.ndarray   # (n,) int32
    ids: np.ndarray      # (n,) int64

    @property
    def n(self) -> int:
        return int(len(self.labels))

    @property
    def nbytes(self) -> int:
        """What a copy of the split takes: images, labels and ids."""
        return int(self.images.nbytes + self.labels.nbytes + self.ids.nbytes)

    def head(self, n: int) -> "Store":
        """The first ``n`` examples (views, no copy)."""
        return Store(self.images[:n], self.labels[:n], self.ids[:n])

    in_memory = True

    def tensors(self):
        """(images, labels, ids) as host tensors, made once per store: every pipeline built on it shares them."""
        import tensorflow as tf

        if getattr(self, "_tensors", None) is None:
            with tf.device("/cpu:0"):
                self._tensors = (tf.constant(self.images), tf.constant(self.labels), tf.constant(self.ids))
        return self._tensors

    def gather_images(self, indices):
        """The images at ``indices`` (a tensor), uint8 or float32 as stored: one gather."""
        import tensorflow as tf

        return tf.gather(self.tensors()[0], indices)


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:  # one pool for every streaming store of the process; Pillow releases the GIL while decoding
        _POOL = ThreadPoolExecutor(min(16, 2 * (os.cpu_count() or 1)), thread_name_prefix="tftoolkit-decode")
    return _POOL


@dataclass
class FileStore:
    """A split that stays on disk: image paths and labels in memory, pixels decoded when a batch is gathered."""

    paths: np.ndarray    # (n,) str
    labels: np.ndarray   # (n,) int32
    ids: np.ndarray      # (n,) int64
    shape: tuple         # (H, W, C) of every decoded image
    decode: Callable     # path -> uint8 (H, W, C) array, or None when the file cannot be decoded

    in_memory = False

    @property
    def n(self) -> int:
        return int(len(self.labels))

    @property
    def nbytes(self) -> int:
        """What the decoded split would take in memory."""
        return int(self.n * int(np.prod(self.shape)) + self.labels.nbytes + self.ids.nbytes)

    def head(self, n: int) -> "FileStore":
        return FileStore(self.paths[:n], self.labels[:n], self.ids[:n], self.shape, self.decode)

    def tensors(self):
        import tensorflow as tf

        if getattr(self, "_tensors", None) is None:
            with tf.device("/cpu:0"):
                self._tensors = (None, tf.constant(self.labels), tf.constant(self.ids))
        return self._tensors

    def _decode_batch(self, indices: np.ndarray) -> np.ndarray:
        paths = self.paths[indices]
        images = list(_pool().map(self.decode, paths))
        for path, image in zip(paths, images):
            if image is None:
                # Named here, inside the input pipeline: the step fails with this message in the summary.
                raise ValueError(f"cannot decode {path}: the file changed or is damaged since the folder was listed")
        return np.stack(images) if images else np.zeros((0, *self.shape), np.uint8)

    def gather_images(self, indices):
        """The images at ``indices``, read and decoded now (tf.numpy_function over a thread pool)."""
        import tensorflow as tf

        images = tf.numpy_function(self._decode_batch, [indices], tf.uint8, stateful=False)
        return tf.ensure_shape(images, [None, *self.shape])


def from_arrays(images, labels, ids=None) -> Store:
    images = np.ascontiguousarray(images)
    labels = np.ascontiguousarray(labels, dtype=np.int32)
    ids = np.arange(len(labels), dtype=np.int64) if ids is None else np.ascontiguousarray(ids, dtype=np.int64)
    return Store(images, labels, ids)


def materialize(ds, n: int, shape: tuple[int, int, int]) -> Store:
    """Read an unbatched dataset of (image, label, id) into a Store of ``n`` examples, in its (deterministic) order.

    The arrays are allocated once and filled batch by batch, so the peak memory is the split plus one batch.
    """
    import tensorflow as tf

    spec = ds.element_spec[0]
    dtype = np.uint8 if spec.dtype == tf.uint8 else np.float32
    images = np.empty((n, *shape), dtype)
    labels = np.empty(n, np.int32)
    ids = np.empty(n, np.int64)
    at = 0
    for x, y, i in ds.batch(READ_BATCH).prefetch(2).as_numpy_iterator():
        k = min(len(y), n - at)
        images[at:at + k], labels[at:at + k], ids[at:at + k] = x[:k], y[:k], i[:k]
        at += k
        if at >= n:
            break
    if at < n:
        return Store(images[:at], labels[:at], ids[:at])
    return Store(images, labels, ids)
