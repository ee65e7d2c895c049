"""What ``config.dataset`` names, as a DataSource:

    synthetic          class-conditional random tensors in memory (source.synthetic)
    shapes16k          the generated set, in the data home (data/home.py: $TFTOOLKIT_DATA_DIR, else ~/.cache),
                       made on first use by any command
    cifar10 cifar100 mnist fashion_mnist      keras.datasets, fetched once into Keras' cache (keras_sets.py)
    PATH               one of these layouts (a folder holding two of them is refused, naming both):
                       TFRecord shards with a manifest.json (tfrecords.py);
                       ImageNet-layout TFRecords, train-00000-of-01024 ... (imagenet.py);
                       a TFDS-prepared directory, dataset_info.json (tfds_dir.py);
                       CIFAR's python folder, cifar-10-batches-py or cifar-100-python (cifar.py);
                       one sub-folder of images per class, optionally under train/ and val/ (folders.py)

``load_source`` is the one entry; the per-epoch shuffle, batching and distribution happen in pipeline.py, or, for
a split streamed from its files, in stream.py.
"""

from __future__ import annotations

import fcntl
import logging
import time
from pathlib import Path

from ..errors import DataError
from . import cifar, folders, imagenet, keras_sets, manifest as manifest_mod, shapes, tfds_dir, tfrecords
from .home import SHAPES16K, data_root, default_dir
from .file_source import from_streams, memory_budget
from .functions import plain
from .source import (DataSource, from_arrays, from_dataset, from_structures, is_dataset, is_images_and_labels, limit,
                     synthetic)

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

log = logging.getLogger("tftoolkit")


def load_source(config, data=None, cache: bool = True, worker: tuple[int, int] | None = None) -> DataSource:
    """The examples a config names, limited to ``config.train_images``.

    ``data`` replaces ``config.dataset`` (the Python API): NumPy arrays (x, y) or (x, y, x_val, y_val), a
    tf.data.Dataset of unbatched (image, label) pairs, or a (train, validation) pair of such datasets.
    ``cache`` is recorded in the source's info only: the pipeline reads a split into memory once either way
    (data/store.py); the input benchmark re-reads it itself to time the cold path.
    ``worker``: (this worker, workers) of a multi-worker run, for ``--input-sharding file``.
    """
    sharded = config.input_sharding == "file" and worker is not None and worker[1] > 1
    if sharded:
        check_sharding(config, data, workers=worker[1])
    if data is not None:
        source = _from_python(data, config)
    elif config.dataset == "synthetic":
        source = synthetic(config)
    else:
        source = load(config, cache=cache, worker=worker if sharded else None)
    if source.streams and not sharded:
        return source  # its loader took the first train_images before decoding anything (file_source.from_streams)
    return limit(source, config.train_images)


def _from_python(data, config) -> DataSource:
    if is_dataset(data):
        return from_dataset(data, num_classes=config.num_classes)
    if not isinstance(data, (tuple, list)):
        raise DataError(f"data= takes NumPy arrays (x, y) or (x, y, x_val, y_val), or tf.data datasets, got "
                        f"{type(data).__name__}")
    if len(data) == 2 and all(is_dataset(d) for d in data):
        return from_dataset(data[0], data[1], num_classes=config.num_classes)
    if len(data) not in (2, 4):
        raise DataError(f"data= takes (x, y) or (x, y, x_val, y_val) arrays, or (train, val) datasets; got "
                        f"{len(data)} items")
    x, y, *rest = data
    if not is_images_and_labels(x, y) or (rest and not is_images_and_labels(*rest)):
        return from_structures(x, y, val=tuple(rest) if rest else None, num_classes=config.num_classes)
    return from_arrays(x, y, val=tuple(rest) if rest else None, num_classes=config.num_classes)


def check_sharding(config, data=None, workers: int | None = None) -> None:
    """Every refusal of ``--input-sharding file``, in one place: the launcher calls it before any worker starts
    (each would fail alike), and every worker before it loads its shards."""
    workers = config.workers if workers is None else workers
    if config.input_sharding != "file" or workers <= 1:
        return
    if data is not None or config.dataset == "synthetic":
        raise DataError("--input-sharding file divides a dataset's TFRecord shards among the workers; in-memory "
                        "and synthetic data have none: use --input-sharding exact")
    if config.train_images:
        raise DataError("--input-sharding file with --train-images: each worker reads whole shards, so a prefix of "
                        "the set cannot be taken; use --input-sharding exact, or a smaller dataset")
    path = default_dir() if config.dataset == SHAPES16K else Path(config.dataset).expanduser()
    if not path.is_dir():
        return  # not prepared, or no such folder: load says so, as for any run
    if (path / manifest_mod.MANIFEST).exists():
        n = len(manifest_mod.read_manifest(path)["splits"]["train"]["shards"])
    elif imagenet.is_layout(path):
        n = len(imagenet.shards(path).get("train", []))
    else:
        raise DataError(f"--input-sharding file divides TFRecord shards among the workers, and {path} has none (an "
                        "image folder, TFDS or CIFAR folder); use --input-sharding exact")
    if n < workers:
        raise DataError(f"--input-sharding file: {path} has {n} training shard(s) for {workers} workers; every "
                        f"worker needs at least one: use --input-sharding exact, or re-write the dataset in at least "
                        f"{workers} shards")


def ensure_shapes16k(out=None, **kwargs) -> Path:
    """Prepare shapes16k unless ``out`` (default: ``default_dir()``) already holds it; returns the folder.

    The notebooks and the demo call this, so the first run on a new machine makes the data (~10 s).
    """
    out = Path(out) if out is not None else default_dir()
    shapes.prepare(out, **kwargs)
    return out


def prepared_shapes16k() -> Path:
    """shapes16k's folder, made first if it is not there yet (~10 s), under a lock so that processes starting at
    once (workers, sweep points) make it once."""
    path = default_dir()
    if (path / manifest_mod.MANIFEST).exists():
        return path
    root = data_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".shapes16k.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / manifest_mod.MANIFEST).exists():
            log.info("shapes16k is not in the data home yet: making it in %s (once; `tftoolkit data prepare` does "
                     "the same)", path)
            shapes.prepare(path)
    return path


def layouts(path: Path) -> list[tuple[str, str]]:
    """(layout, what shows it) for every dataset layout ``path`` holds; more than one is refused by ``load``."""
    found = []
    if (path / manifest_mod.MANIFEST).exists():
        found.append(("manifest", manifest_mod.MANIFEST))
    shard_names = sorted(f.name for f in path.iterdir() if f.is_file() and imagenet.SHARD.match(f.name))
    if shard_names and not (path / manifest_mod.MANIFEST).exists():
        found.append(("imagenet", f"ImageNet-layout shards ({shard_names[0]}, ...)"))
    if tfds_dir.version_dir(path) is not None:
        found.append(("tfds", f"a TFDS directory ({tfds_dir.INFO})"))
    name = cifar.kind(path)
    if name:
        found.append(("cifar", f"CIFAR's python files ({cifar.LAYOUTS[name][2]}, ...)"))
    if folders.has_class_folders(path) and not found:
        found.append(("folders", "class sub-folders of images"))
    elif folders.has_class_folders(path):
        subs = [d.name + "/" for d in folders.class_dirs(path)][:3]
        found.append(("folders", f"class sub-folders of images ({', '.join(subs)})"))
    return found


def load(config, cache: bool = True, worker: tuple[int, int] | None = None) -> DataSource:
    """The source ``config.dataset`` names (``cache``: see load_source)."""
    name = config.dataset
    if name == SHAPES16K:
        path = prepared_shapes16k()
    elif name in keras_sets.NAMES:
        return keras_sets.load(name, config)
    else:
        path = Path(name).expanduser()
        if not path.exists():
            raise DataError(f"dataset {name!r} is not 'synthetic', '{SHAPES16K}', one of {', '.join(keras_sets.NAMES)} "
                            "or an existing folder; give one of those (ImageNet-layout TFRecords, a TFDS directory, "
                            "CIFAR's python folder, a folder of class sub-folders of images, or TFRecords with a "
                            "manifest.json)")
        if not path.is_dir():
            raise DataError(f"dataset {name!r} is a file; give the folder that holds the images or the TFRecords")
    found = layouts(path)
    if len(found) > 1:
        raise DataError(f"{path} mixes dataset layouts: {' and '.join(what for _, what in found)}; keep one dataset "
                        "per folder")
    kind = found[0][0] if found else None
    partial = cifar.missing(path) if kind is None else None
    if partial:
        raise DataError(f"{path} holds part of CIFAR's python folder ({partial[0]}) but lacks "
                        f"{', '.join(partial[1])}; unpack the archive from the CIFAR site again")
    if kind == "manifest":
        return load_tfrecords(path, config.image_size, cache=cache, verify=config.verify, worker=worker,
                              memory_gb=config.data_memory_gb, skip_bad=config.skip_bad_images,
                              limit=config.train_images)
    if kind == "imagenet":
        return imagenet.load(path, config, worker=worker)
    if kind == "tfds":
        return tfds_dir.load(path, config)
    if kind == "cifar":
        return cifar.load(path, config)
    tfds_sets = tfds_dir.datasets_in_root(path) if kind is None else []
    if tfds_sets:
        shown = ", ".join(tfds_sets[:5]) + (f" and {len(tfds_sets) - 5} more" if len(tfds_sets) > 5 else "")
        raise DataError(f"{path} is a TFDS data root holding {shown}; give one of them: --dataset "
                        f"{path / tfds_sets[0]}")
    if any(path.glob("*.tfrecord")):
        raise DataError(f"{path} holds .tfrecord files but no {manifest_mod.MANIFEST}; add one (format in "
                        "data/README.md) so the shards can be checked, or name them as ImageNet's "
                        "(train-00000-of-00004 ...)")
    return folders.load(path, config)


def load_tfrecords(path, image_size: int | None = None, cache: bool = True, verify: str = "cached",
                   worker: tuple[int, int] | None = None, memory_gb: float | None = None, skip_bad: bool = False,
                   limit: int | None = None) -> DataSource:
    """A verified TFRecord dataset (``verify``: full, cached or off, see manifest_mod.verify); images are resized to
    ``image_size`` if that differs from the manifest's. Held in memory when its pixels fit ``memory_gb``
    (file_source.memory_budget), else streamed from its shards (file_source.from_streams; ``skip_bad``: --skip-bad-images,
    ``limit``: --train-images, taken before anything is read)."""
    import tensorflow as tf

    path = Path(path)
    manifest = manifest_mod.read_manifest(path)
    verify_s = manifest_mod.verify(path, manifest, verify)
    t0 = time.perf_counter()
    h, w, c = (int(v) for v in manifest["image_shape"])
    sharding = None
    if worker is not None:
        me, workers = worker
        per_worker = tfrecords.worker_shards(manifest, "train", workers)  # each non-empty: check_sharding
        counts = [sum(int(s["records"]) for s in shards) for shards in per_worker]
        # Every worker trains the same number of steps: each keeps the smallest worker's count per epoch.
        sharding = {"policy": "file", "worker": me, "workers": workers, "shards": [s["file"] for s in per_worker[me]],
                    "examples_per_worker": min(counts), "left_out_per_epoch": sum(counts) - workers * min(counts)}
    train, n_train, shards = tfrecords.split_dataset(path, manifest, "train", cache=False,
                                                     shards=per_worker[me] if worker is not None else None)
    val, n_val, val_shards = None, 0, 0
    if "val" in manifest["splits"]:
        val, n_val, val_shards = tfrecords.split_dataset(path, manifest, "val", cache=False)
    scan_s = time.perf_counter() - t0
    if image_size is not None and (h, w) != (image_size, image_size):
        log.warning("%s holds %dx%d images; resizing them to %dx%d (image_size)", path, h, w, image_size, image_size)

        def resize(image, label, ex_id):
            out = tf.image.resize(image, [image_size, image_size], antialias=True)
            return tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8), label, ex_id

        train = train.map(plain(resize), num_parallel_calls=tf.data.AUTOTUNE)
        val = val.map(plain(resize), num_parallel_calls=tf.data.AUTOTUNE) if val is not None else None
        h = w = image_size
    # No tf.data cache: the pipeline reads the split once into a store (data/store.py) and gathers from that.
    gen = manifest.get("generator") or {}
    info = {
        "path": str(path), "format": "tfrecord", "image_encoding": manifest.get("image_encoding", "raw"),
        "shards": shards, "val_shards": val_shards, "sha256_verified": verify != "off", "verify": verify,
        "verify_s": round(verify_s, 3), "scan_s": round(scan_s, 3), "cached": cache,
        "generator": {k: gen[k] for k in ("name", "version", "seed") if k in gen},
    }
    k = int(manifest["num_classes"])
    names = list(manifest.get("class_names") or [str(i) for i in range(k)])
    name = manifest.get("name") or path.name
    used = min(n_train, limit) if limit is not None and worker is None else n_train
    over = (used + n_val) * h * w * c > memory_budget(memory_gb)
    if over and h != w:
        log.warning("%s holds %dx%d images, over the memory budget, but a split streams square images only: reading "
                    "it into memory (give --image-size to stream it)", path, h, w)
    elif over:
        def stream(split, only=None):
            return tfrecords.stream_split(path, manifest, split, h, shards=only, skip_bad=skip_bad)

        source = from_streams(name, stream("train", per_worker[me] if worker is not None else None),
                              stream("val") if "val" in manifest["splits"] else None, names, info, memory_gb,
                              limit=None if worker is not None else limit)
        return source.shard_for_worker(sharding) if sharding is not None else source
    info.update({"input_source": "memory", "streamed": False})
    source = DataSource(name, train, val, n_train, n_val, (h, w, c), k, names, info)
    return source.shard_for_worker(sharding) if sharding is not None else source
