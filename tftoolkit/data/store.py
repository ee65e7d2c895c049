"""One split held for random access: the arrays the input pipeline gathers whole batches from.

A ``Store`` is a split's examples as arrays indexed 0..n-1: images (uint8, or float32 for float sources), labels
(int32) and ids (int64, what the audit of the split across replicas reads). For a task other than image
classification (engine/losses.py) ``images`` is whatever the model takes and ``labels`` whatever the loss compares
with: each an array, or a dict or tuple of arrays (several inputs or outputs), first axis the example. The pipeline never walks a dataset
example by example: each step it gathers a replica's batch by index, one op per batch, on the host or, with
``--data-placement device``, from a copy on the device itself.

Sources that are arrays already (NumPy input, the synthetic set, keras.datasets, CIFAR) become a Store without a
copy. File datasets (TFRecords, image folders, a user's tf.data pipeline) are read once into one, with parallel
reads and decoding (``materialize``): that single pass is the "cold" read, every epoch after it is served from
memory. A split too large for memory is not a Store: it streams from its files (data/stream.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

READ_BATCH = 1024  # examples per batch when a dataset is read into a store (one op per batch, not per image)


@dataclass
class Store:
    images: Any          # (n, H, W, C) uint8 or float32; or the model's inputs, an array or a dict/tuple of them
    labels: Any          # (n,) int32; or the loss's targets, likewise
    ids: np.ndarray      # (n,) int64

    @property
    def n(self) -> int:
        return int(len(self.ids))

    @property
    def structured(self) -> bool:
        """Whether this is another task's data (not one image array with one class label each)."""
        return not (isinstance(self.images, np.ndarray) and isinstance(self.labels, np.ndarray)
                    and self.images.ndim == 4 and self.labels.ndim == 1 and self.labels.dtype == np.int32)

    @property
    def nbytes(self) -> int:
        """What a copy of the split takes: images, labels and ids."""
        import tensorflow as tf

        return int(sum(a.nbytes for a in tf.nest.flatten((self.images, self.labels))) + self.ids.nbytes)

    def head(self, n: int) -> "Store":
        """The first ``n`` examples (views, no copy)."""
        import tensorflow as tf

        images, labels = tf.nest.map_structure(lambda a: a[:n], (self.images, self.labels))
        return Store(images, labels, self.ids[:n])

    in_memory = True

    def tensors(self):
        """(images, labels, ids) as host tensors, made once per store: every pipeline built on it shares them."""
        import tensorflow as tf

        if getattr(self, "_tensors", None) is None:
            with tf.device("/cpu:0"):
                self._tensors = tf.nest.map_structure(tf.constant, (self.images, self.labels, self.ids))
        return self._tensors

    def gather_images(self, indices):
        """The images at ``indices`` (a tensor), uint8 or float32 as stored: one gather (one per input)."""
        return gather(self.tensors()[0], indices)

    def gather_labels(self, indices):
        return gather(self.tensors()[1], indices)


def gather(tree, indices):
    """Rows ``indices`` of every tensor of a structure: one gather each."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: tf.gather(t, indices), tree)


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
