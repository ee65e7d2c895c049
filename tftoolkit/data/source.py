"""Where examples come from: a ``DataSource`` of unbatched (image, label, id) examples.

Every source, whatever its origin (NumPy arrays, the synthetic set, shapes16k's TFRecords, a folder of
images), is a ``DataSource``; ``catalog.load_source`` picks one from a config, and ``pipeline`` turns it into
per-replica batches. Each example carries an integer ``id`` so that the split across replicas can be audited
(every example seen exactly once per epoch) and counted from what really went through each replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DataError


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


def synthetic(config) -> DataSource:
    """The synthetic set a config describes (image_size, num_classes, seed)."""
    x, y = synthetic_arrays(SYNTHETIC_TRAIN, config.image_size, config.num_classes, config.seed)
    vx, vy = synthetic_arrays(SYNTHETIC_VAL, config.image_size, config.num_classes, config.seed + 1)
    return from_arrays(x, y, name="synthetic", val=(vx, vy), num_classes=config.num_classes)


def limit(source: DataSource, n: int | None) -> DataSource:
    """The first ``n`` training examples of ``source`` (all of them when ``n`` is None or larger)."""
    if n is None or n >= source.train_examples:
        return source
    source.train = source.train.take(n)
    source.train_examples = n
    return source
