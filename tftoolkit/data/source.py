"""Where examples come from: a ``DataSource`` of unbatched (image, label, id) examples.

Every source, whatever its origin (NumPy arrays, the synthetic set, shapes16k's TFRecords, a folder of
images), is a ``DataSource``; ``registry.load_source`` picks one from a config, and ``pipeline`` turns it into
per-replica batches. Each example carries an integer ``id`` so that the split across replicas can be audited
(every example seen exactly once per epoch) and counted from what really went through each replica.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DataError
from . import store as store_mod
from .functions import plain

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

log = logging.getLogger("tftoolkit")
SHOW_SKIPPED = 5  # skipped images named in a warning and in summary.json; all of them are counted


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
    stores: dict = field(default_factory=dict)  # split -> store.Store: what the pipeline gathers batches from
    worker_shard: tuple | None = None  # (worker, workers) when each worker holds only its own shards (file sharding)
    local_examples: int | None = None  # then: the examples this worker holds (train_examples counts all workers')
    streams: dict = field(default_factory=dict)  # split -> stream.StreamSplit: the files a split is read from
    streamed: bool = False  # the splits stream from their files while training (over --data-memory-gb)

    def shard_for_worker(self, sharding: dict) -> "DataSource":
        """Mark this source as one worker's shards (``--input-sharding file``): it holds ``train_examples`` of
        them, and one epoch trains on every worker's ``examples_per_worker`` (the steps per epoch follow)."""
        self.info["input_sharding"] = sharding
        self.worker_shard = (sharding["worker"], sharding["workers"])
        self.local_examples = self.train_examples
        self.train_examples = sharding["workers"] * sharding["examples_per_worker"]
        return self

    @property
    def structured(self) -> bool:
        """Another task's data (engine/losses.py): inputs and targets of any structure, not images and class labels."""
        return self.info.get("task_data") == "structured"

    def store(self, split: str = "train"):
        """The split as a ``store.Store`` (None for a missing validation split); a file dataset is read into
        memory on the first call (its one cold read, timed into ``info['read_s']``), then kept. A streamed
        split's store is its ``stream.StreamSplit`` (``in_memory`` False)."""
        if split not in self.stores and split in self.streams:
            self.stores[split] = self.streams[split]
        if split not in self.stores:
            ds = self.train if split == "train" else self.val
            if ds is None:
                return None
            n = (self.local_examples or self.train_examples) if split == "train" else self.val_examples
            t0 = time.perf_counter()
            self.stores[split] = store_mod.materialize(ds, n, self.input_shape)
            self.info[f"{split}_read_s"] = round(time.perf_counter() - t0, 3)
        return self.stores[split]


# Synthetic data: in memory, no I/O, like tf_cnn_benchmarks' synthetic mode. Class-conditional so that it
# is also learnable: each class is a fixed random 4x4 colour texture tiled over the image, plus noise, so
# a convolutional model with global pooling separates the classes within an epoch or two.
SYNTHETIC_TRAIN = 16000
SYNTHETIC_VAL = 4000
SYNTHETIC_CLASSES = 10  # synthetic data's classes unless num_classes says otherwise
SYNTHETIC_SIZE = 32     # synthetic images' side unless image_size says otherwise
# Examples are drawn in blocks, each from its own seeded stream: example i depends on (seed, i) only, so the
# first n of the set are the same whatever n, and a run with --train-images n draws just those n (drawing all
# 16000 at 32 px took 2 s of every run's set-up, most of a short run's).
SYNTHETIC_BLOCK = 1024


def synthetic_arrays(n: int, image_size: int, num_classes: int, seed: int, noise: float = 0.35):
    """``n`` class-conditional images (uint8, (n, image_size, image_size, 3)) and their labels (int32)."""
    tiles = np.random.default_rng(12345).uniform(0, 1, (num_classes, 4, 4, 3)).astype(np.float32)
    reps = -(-image_size // 4)
    protos = np.tile(tiles, (1, reps, reps, 1))[:, :image_size, :image_size]
    x = np.empty((n, image_size, image_size, 3), np.uint8)
    y = np.empty((n,), np.int32)
    for start in range(0, n, SYNTHETIC_BLOCK):
        block = slice(start, min(start + SYNTHETIC_BLOCK, n))
        m = block.stop - start
        # Labels and noise from separate streams: a block cut short draws a prefix of each, the same values
        # the whole block would start with.
        labels, pixels = (np.random.default_rng([seed, start // SYNTHETIC_BLOCK, part]) for part in (0, 1))
        y[block] = labels.integers(0, num_classes, m)
        img = protos[y[block]] + np.float32(noise) * pixels.standard_normal((m, image_size, image_size, 3),
                                                                           dtype=np.float32)
        x[block] = np.clip(img * 255.0, 0, 255)
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
    if val is not None:
        # Checked now, before anything trains: a validation split of another shape used to fail in Keras after
        # the first epoch.
        vx, vy = np.asarray(val[0]), np.asarray(val[1])
        if vx.ndim != 4 or vx.shape[1:] != x.shape[1:]:
            raise DataError(f"validation images must have the training images' shape (N, {', '.join(map(str, x.shape[1:]))}),"
                            f" got {vx.shape}; resize them alike")
        if vy.shape != (vx.shape[0],) or not np.issubdtype(vy.dtype, np.integer):
            raise DataError(f"validation labels must be {vx.shape[0]} integers to match the validation images, got "
                            f"{vy.dtype} {vy.shape}")
        if vx.dtype != x.dtype:
            raise DataError(f"validation images are {vx.dtype} but training images {x.dtype}: give both the same dtype "
                            "(uint8 0-255, or float in [0, 1])")
    labels = np.concatenate([y, np.asarray(val[1])]) if val is not None else y
    # The class count comes from the labels (training and validation) unless it is given.
    k = int(num_classes if num_classes is not None else labels.max() + 1)
    if labels.min() < 0 or labels.max() >= k:
        raise DataError(f"label out of range: labels span [{labels.min()}, {labels.max()}] but there are {k} classes")

    def ds(xa, ya, offset=0):
        ids = np.arange(offset, offset + len(xa), dtype=np.int64)
        return tf.data.Dataset.from_tensor_slices((xa, ya.astype(np.int32), ids))

    val_ds, n_val = None, 0
    stores = {"train": store_mod.from_arrays(x, y)}  # arrays already: the pipeline gathers from them, no copy
    if val is not None:
        vx, vy = np.asarray(val[0]), np.asarray(val[1])
        val_ds, n_val = ds(vx, vy), len(vx)
        stores["val"] = store_mod.from_arrays(vx, vy)
    return DataSource(name, ds(x, y), val_ds, len(x), n_val, tuple(x.shape[1:]), k, stores=stores)


def is_images_and_labels(x, y) -> bool:
    """Whether (x, y) is the default task's data: one image array (N, H, W, C) and integer class labels (N,)."""
    return (not isinstance(x, (dict, list, tuple)) and not isinstance(y, (dict, list, tuple))
            and np.asarray(x).ndim == 4 and np.asarray(y).ndim == 1 and np.issubdtype(np.asarray(y).dtype, np.integer))


def from_structures(x, y, name="arrays", val: tuple | None = None, num_classes: int | None = None) -> DataSource:
    """A source for any task (engine/losses.py): ``x`` what the model takes, ``y`` what the loss compares its output
    with, each an array or a dict / tuple of arrays (several inputs or outputs), first axis the example: float
    targets, per-pixel masks, multi-hot vectors, token ids, tabular rows. uint8 arrays of rank 4 are images and are
    made float on the replicas as always; other inputs go to the model as they are.

    ``num_classes`` (what a model builder is told): given, or for integer targets in one array (labels, masks,
    token labels) the largest + 1, else None."""
    import tensorflow as tf

    x, y = tf.nest.map_structure(np.asarray, (x, y))
    n = _rows(x, y, "")
    if val is not None:
        vx, vy = tf.nest.map_structure(np.asarray, (val[0], val[1]))
        _rows(vx, vy, "validation ")
        for what, a, b in (("inputs", x, vx), ("targets", y, vy)):
            try:
                tf.nest.assert_same_structure(a, b)
            except (ValueError, TypeError):
                raise DataError(f"validation {what} are structured differently from the training {what}") from None
            for ta, tb in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
                if ta.shape[1:] != tb.shape[1:] or ta.dtype != tb.dtype:
                    raise DataError(f"validation {what}: an array of {tb.dtype} {tb.shape[1:]} per example where the "
                                    f"training {what} have {ta.dtype} {ta.shape[1:]}; give both alike")
    k = num_classes
    if k is None and not isinstance(y, (dict, list, tuple)) and np.issubdtype(y.dtype, np.integer):
        top = int(max(y.max(), val[1].max() if val is not None else 0)) + 1
        k = top if top >= 2 else None
    stores = {"train": store_mod.Store(x, y, np.arange(n, dtype=np.int64))}
    n_val = 0
    if val is not None:
        n_val = len(tf.nest.flatten(vx)[0])
        stores["val"] = store_mod.Store(vx, vy, np.arange(n_val, dtype=np.int64))

    def ds(st):
        return tf.data.Dataset.from_tensor_slices((st.images, st.labels, st.ids))

    shape = tf.nest.map_structure(lambda a: tuple(a.shape[1:]), x)
    return DataSource(name, ds(stores["train"]), ds(stores["val"]) if val is not None else None, n, n_val, shape, k,
                      stores=stores, info={"task_data": "structured"})


def _rows(x, y, what: str) -> int:
    """The examples in (x, y): every array's first axis, which must agree."""
    import tensorflow as tf

    sizes = {len(a) if a.ndim else -1 for a in tf.nest.flatten((x, y))}
    if len(sizes) != 1 or -1 in sizes:
        raise DataError(f"{what}inputs and targets must have one row per example, the same number in every array; "
                        f"got first axes of {sorted(sizes)}")
    n = sizes.pop()
    if n == 0:
        raise DataError(f"{what}data: no examples")
    return n


def dataset_arrays(ds, what: str = "data"):
    """(x, y) as NumPy structures from an unbatched dataset of (inputs, targets): the whole of it, read once."""
    import tensorflow as tf

    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise DataError(f"{what}: a tf.data.Dataset of (inputs, targets) pairs is needed ((image, label) pairs, or any "
                        f"task's), got elements {spec}")
    parts = [b for b in ds.batch(4096).as_numpy_iterator()]
    if not parts:
        raise DataError(f"{what}: the dataset is empty")
    x = tf.nest.map_structure(lambda *a: np.concatenate(a), *[p[0] for p in parts])
    y = tf.nest.map_structure(lambda *a: np.concatenate(a), *[p[1] for p in parts])
    return x, y


def is_dataset(obj) -> bool:
    return type(obj).__module__.startswith("tensorflow") and hasattr(obj, "element_spec")


def from_dataset(ds, val=None, name: str = "dataset", num_classes: int | None = None) -> DataSource:
    """A source from a tf.data.Dataset of unbatched (image, label) pairs (and an optional validation one).

    The dataset is read here, to count its examples and check its labels and image shapes, and once more into
    memory when training starts (``DataSource.store``), so a user's pipeline does not run once per epoch, and
    every epoch shuffles the same examples. One that is batched, holds other than (image, label) pairs, non-integer
    labels or images of different shapes is refused with what to do about it.
    """
    import tensorflow as tf

    if not _image_pairs(ds) or (val is not None and not _image_pairs(val)):
        return from_structures(*dataset_arrays(ds), name=name, num_classes=num_classes,
                               val=dataset_arrays(val, "validation data") if val is not None else None)
    ds, n, k = _checked(ds, "data", num_classes)
    shape = tuple(int(d) for d in ds.element_spec[0].shape)
    if val is not None:
        val, n_val, k_val = _checked(val, "validation data", None)
        if num_classes is None and k_val > k:
            k = k_val  # a class seen in validation only still has an output
        elif k_val > k:
            raise DataError(f"validation data: labels up to {k_val - 1} but there are {k} classes")
        val_shape = tuple(int(d) for d in val.element_spec[0].shape)
        if val_shape != shape:
            raise DataError(f"validation data: images of shape {val_shape}, but the training images are {shape}; "
                            "resize them alike")
    else:
        n_val = 0

    def with_ids(d):
        # (image, label, id): the id lets a test audit the split across replicas, as for every other source.
        return d.enumerate().map(plain(lambda i, xy: (xy[0], tf.cast(xy[1], tf.int32), i)))

    return DataSource(name, with_ids(ds), with_ids(val) if val is not None else None, n, n_val,
                      shape if len(shape) == 3 else (*shape, 1), k)


def _image_pairs(ds) -> bool:
    """Whether a dataset holds the default task's examples: (image, integer class label) pairs."""
    import tensorflow as tf

    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(s, tf.TensorSpec) for s in spec)):
        return False
    image, label = spec[0].shape.rank, spec[1].shape.rank
    # (image, label) pairs, or what looks like them batched (which _checked refuses, saying so).
    return spec[1].dtype.is_integer and ((image in (2, 3, None) and label in (0, None)) or (image == 4 and label == 1))


def _checked(ds, what: str, num_classes: int | None):
    import tensorflow as tf

    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(s, tf.TensorSpec) for s in spec)):
        raise DataError(f"{what}: a tf.data.Dataset of (image, label) pairs is needed, got elements {spec}")
    image, label = spec
    if image.shape.rank == 4 or label.shape.rank not in (0, None):
        raise DataError(f"{what} looks batched (images {image.shape}, labels {label.shape}): pass it unbatched, "
                        "e.g. ds.unbatch(); the toolkit batches by the global batch and splits it across replicas")
    if image.shape.rank not in (2, 3, None):
        raise DataError(f"{what}: images must be (height, width) or (height, width, channels), got {image.shape}")
    if not (label.dtype.is_integer):
        raise DataError(f"{what}: labels must be integers (class indices), got {label.dtype.name}")
    if image.shape.rank == 2:
        ds = ds.map(plain(lambda x, y: (x[..., None], y)))
    # One pass: how many, the label range, and the image shapes (a spec with unknown sizes can still hold
    # images of one size, from a decoder say; a real mix of sizes cannot be batched).
    count, lo, hi, shapes = 0, None, None, set()
    for x, y in ds.map(plain(lambda x, y: (tf.shape(x), y))).batch(4096).as_numpy_iterator():
        count += len(y)
        lo = int(y.min()) if lo is None else min(lo, int(y.min()))
        hi = int(y.max()) if hi is None else max(hi, int(y.max()))
        shapes |= {tuple(int(v) for v in row) for row in x}
    if count == 0:
        raise DataError(f"{what}: the dataset is empty")
    if len(shapes) > 1:
        a, b = sorted(shapes)[:2]
        raise DataError(f"{what}: images of different shapes ({a} and {b}, {len(shapes)} in all); resize them to one "
                        "size first, e.g. ds.map(lambda x, y: (tf.image.resize(x, [32, 32]), y))")
    k = int(num_classes if num_classes is not None else hi + 1)
    if lo < 0 or hi >= k:
        raise DataError(f"{what}: label out of range: labels span [{lo}, {hi}] but there are {k} classes")
    shape = next(iter(shapes))
    ds = ds.map(plain(lambda x, y: (tf.ensure_shape(x, shape), y)))
    return ds, count, k


def resized(images: np.ndarray, size: int | None, name: str) -> np.ndarray:
    """uint8 images (N, H, W, C) at ``size`` x ``size`` (antialiased bilinear), or as they are when ``size`` is None
    or theirs; a warning says so when they change."""
    if size is None or images.shape[1:3] == (size, size):
        return images
    import tensorflow as tf

    log.warning("%s holds %dx%d images; resizing them to %dx%d (--image-size)", name, images.shape[1],
                images.shape[2], size, size)
    out = np.empty((len(images), size, size, images.shape[3]), np.uint8)
    for i in range(0, len(images), 1024):
        r = tf.image.resize(images[i:i + 1024], [size, size], antialias=True)
        out[i:i + 1024] = tf.cast(tf.clip_by_value(tf.round(r), 0, 255), tf.uint8).numpy()
    return out


def synthetic(config) -> DataSource:
    """The synthetic set a config describes (image_size, num_classes, seed)."""
    n = min(SYNTHETIC_TRAIN, config.train_images or SYNTHETIC_TRAIN)  # the first n: what limit() would keep
    k = config.num_classes or SYNTHETIC_CLASSES
    size = config.image_size or SYNTHETIC_SIZE
    x, y = synthetic_arrays(n, size, k, config.seed)
    vx, vy = synthetic_arrays(SYNTHETIC_VAL, size, k, config.seed + 1)
    return from_arrays(x, y, name="synthetic", val=(vx, vy), num_classes=k)


def limit(source: DataSource, n: int | None) -> DataSource:
    """The first ``n`` training examples of ``source`` (all of them when ``n`` is None); more than it has is refused
    (it would train on fewer than asked, without a word)."""
    if n is not None and n > source.train_examples:
        raise DataError(f"--train-images {n}: {source.name} has {source.train_examples} training images; give at most "
                        f"{source.train_examples}, or leave it out to use them all")
    if n is None or n == source.train_examples:
        return source
    source.train = source.train.take(n)
    source.train_examples = n
    if "train" in source.streams:
        source.streams["train"] = source.streams["train"].head(n)
        if source.streamed:
            source.stores["train"] = source.streams["train"]
    if "train" in source.stores:
        source.stores["train"] = source.stores["train"].head(n)
    return source
