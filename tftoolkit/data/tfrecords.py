"""Image datasets stored as TFRecord shards plus a manifest.json (data/manifest.py): writing and reading.

A dataset folder holds ``<split>-<i>-of-<n>.tfrecord`` shards of ``tf.train.Example`` records with the
features ``image`` (bytes: raw uint8 HWC, or PNG/JPEG when the manifest says so), ``label``, ``id``,
``height``, ``width`` and ``channels`` (int64), and a ``manifest.json`` that lists every shard with its
record count and sha256 (data/README.md documents the format, so other tools can write it too).

Before a dataset is used its shards are checked against the manifest (manifest.verify); then one pass over the
records checks labels (in range, and more than one class), ids and image sizes. Anything wrong is a DataError
naming the file. Only then is the tf.data reader built; a set whose pixels fit ``--data-memory-gb`` is read through
it once, into memory (data/store.py), so the epochs never touch the files; a larger one streams from its shards while it
trains like every other file dataset (``stream_split``, data/stream.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..fileio import ensure_dir, remove_stale_temps, replacing, write_json
from .functions import plain
from .manifest import FORMAT, FORMAT_VERSION, MANIFEST, VERIFIED, passed_entry, read_manifest, sha256
from .stream import StreamSplit

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

log = logging.getLogger("tftoolkit")

PARSE_BATCH = 256  # records parsed per parse_example call: batched parsing is several times faster


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


# --- writing -----------------------------------------------------------------------------------------
class DatasetWriter:
    """Writes shards and, last, the manifest, so a manifest only ever names shards that are complete."""

    def __init__(self, out, name: str, class_names: list[str], image_shape: tuple[int, int, int]):
        self.out = Path(out)
        ensure_dir(self.out, "dataset folder")  # a file or a broken link there: one line
        self.name, self.class_names, self.image_shape = name, list(class_names), tuple(int(x) for x in image_shape)
        self.splits: dict[str, list[dict]] = {}
        old = self.out / MANIFEST
        self.old_files: set[str] = set()
        if old.exists():
            try:  # the shards it names go at finish(): only ever inside this folder (read_manifest's rule)
                splits = read_manifest(self.out)["splits"].values()
                self.old_files = {s["file"] for sp in splits for s in sp["shards"]}
            except DataError:
                pass
            # The old manifest goes before any shard is replaced: from here until finish() there is none.
            old.unlink()
        remove_stale_temps(self.out)

    def write_shard(self, split: str, index: int, count: int, images: np.ndarray, labels: np.ndarray,
                    first_id: int) -> dict:
        import tensorflow as tf

        name = shard_name(split, index, count)
        h, w, c = self.image_shape
        if images.shape[1:] != (h, w, c) or images.dtype != np.uint8:
            raise AssertionError(f"images {images.shape} {images.dtype} do not match {self.image_shape} uint8")
        fixed = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
                 for k, v in (("height", h), ("width", w), ("channels", c))}
        with replacing(self.out / name) as tmp:
            with tf.io.TFRecordWriter(str(tmp)) as writer:
                for k, (img, label) in enumerate(zip(images, labels)):
                    feats = dict(fixed)
                    feats["image"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[img.tobytes()]))
                    feats["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))
                    feats["id"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[first_id + k]))
                    example = tf.train.Example(features=tf.train.Features(feature=feats))
                    # deterministic: features is a protobuf map, whose order otherwise follows the
                    # per-process string hash seed, and the same seed must give the same bytes.
                    writer.write(example.SerializeToString(deterministic=True))
            entry = {"file": name, "records": int(len(images)), "first_id": int(first_id), "sha256": sha256(tmp)}
        self.splits.setdefault(split, []).append(entry)
        return entry

    def finish(self, per_class: dict[str, dict[str, int]], generator: dict | None = None) -> dict:
        h, w, c = self.image_shape
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "image_shape": [h, w, c],
            "image_encoding": "raw",
            "num_classes": len(self.class_names),
            "class_names": self.class_names,
            "splits": {split: {"examples": sum(s["records"] for s in shards), "per_class": per_class.get(split, {}),
                               "shards": shards} for split, shards in self.splits.items()},
            "generator": generator or {},
        }
        write_json(self.out / MANIFEST, manifest)  # atomic: temp file + rename
        keep = {s["file"] for shards in self.splits.values() for s in shards}
        # The shards were hashed as they were written: record that, so the first use does not hash them again.
        write_json(self.out / VERIFIED, {s["file"]: passed_entry(self.out / s["file"], s["records"], s["sha256"])
                                         for shards in self.splits.values() for s in shards})
        for name in self.old_files - keep:
            (self.out / name).unlink(missing_ok=True)
        return manifest


# --- the tf.data source --------------------------------------------------------------------------------
def _meta_features(tf):
    return {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        "height": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        "width": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        "channels": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }


def _scan(files: list[Path], counts: list[int], manifest: dict, split: str, subset: bool = False) -> bool:
    """One pass over the records of a split checking labels, sizes and ids; returns whether ids are stored.
    ``subset``: the files are some of the split's shards (a worker's), so their ids need only be unique.

    Done before training so bad records are one clear error now, not a failed step halfway through.
    ``counts`` (records per file, already verified) map a record's position back to its file.
    """
    import tensorflow as tf

    h, w, c = manifest["image_shape"]
    k = int(manifest["num_classes"])
    raw = manifest.get("image_encoding", "raw") == "raw"
    feats = _meta_features(tf)
    starts = np.cumsum([0] + list(counts))

    def where(pos: int) -> str:
        i = int(np.searchsorted(starts, pos, side="right") - 1)
        return f"{files[i]}: record {pos - starts[i]}"

    def meta(serialized):
        p = tf.io.parse_example(serialized, feats)
        return p["label"], p["id"], tf.stack([p["height"], p["width"], p["channels"]], 1), tf.strings.length(p["image"])

    # One dataset over all files, read in order: a dataset per file would trace ``meta`` once per file.
    ds = tf.data.TFRecordDataset([str(f) for f in files]).batch(4096)
    ds = ds.map(plain(meta), num_parallel_calls=tf.data.AUTOTUNE)
    all_ids, offset, seen = [], 0, set()
    try:
        for labels, ids, hwc, nbytes in ds.as_numpy_iterator():
            if len(seen) < 2:  # one class only is refused below, as a folder of one class is
                seen.update(np.unique(labels).tolist())
            bad = np.flatnonzero((labels < 0) | (labels >= k))
            if len(bad):
                i = bad[0]
                raise DataError(f"label out of range in {where(offset + i)} has label {labels[i]} but the manifest "
                                f"has {k} classes (0..{k - 1}); fix the labels or num_classes")
            known = hwc[:, 0] >= 0
            bad = np.flatnonzero(known & np.any(hwc != (h, w, c), axis=1))
            if raw:
                bad = np.union1d(bad, np.flatnonzero(nbytes != h * w * c))
            if len(bad):
                i = bad[0]
                got = "x".join(str(x) for x in hwc[i]) if known[i] else f"{nbytes[i]} raw bytes"
                raise DataError(f"image size mismatch in {where(offset + i)} is {got} but the manifest says "
                                f"{h}x{w}x{c}; re-create the dataset or fix image_shape in the manifest")
            all_ids.append(ids)
            offset += len(labels)
    except tf.errors.OpError as e:
        bad = _unreadable(files)
        where_ = f"{bad}" if bad is not None else f"the {split} shards of {files[0].parent}"
        raise DataError(f"cannot read {where_}: {e.message.splitlines()[0]}; re-create or re-copy the dataset") from None
    if split == "train" and not subset and len(seen) == 1:
        names = manifest.get("class_names") or []
        label = int(next(iter(seen)))
        name = f" ({names[label]!r})" if 0 <= label < len(names) else ""
        raise DataError(f"the training records in {files[0].parent} all have label {label}{name}; a classifier needs "
                        "at least two classes: fix the labels, or re-create the dataset with images of each class")
    ids = np.concatenate(all_ids) if all_ids else np.zeros(0, np.int64)
    if len(ids) and (ids < 0).all():
        return False  # no ids stored: examples are numbered by their position in the (deterministic) read order
    if subset:
        if len(np.unique(ids)) != len(ids):
            raise DataError(f"the {split} records' ids in {files[0].parent} repeat; every record needs a unique id")
        return True
    if not np.array_equal(np.sort(ids), np.arange(len(ids))):
        raise DataError(f"the {split} records' ids in {files[0].parent} are not 0..{len(ids) - 1}, each once; every "
                        "record needs a unique id (or none at all, and they are numbered in file order)")
    return True


def _unreadable(files: list[Path]) -> Path | None:
    """The first file TensorFlow cannot read through (a corrupted record: bad CRC), found after a failed scan."""
    import tensorflow as tf

    for f in files:
        try:
            for _ in tf.data.TFRecordDataset([str(f)]).batch(4096):
                pass
        except tf.errors.OpError:
            return f
    return None


def worker_shards(manifest: dict, split: str, workers: int) -> list[list[dict]]:
    """The shards each of ``workers`` reads under file sharding: worker w gets shards w, w + W, w + 2W, ..."""
    shards = manifest["splits"][split]["shards"]
    return [shards[w::workers] for w in range(workers)]


def split_dataset(path, manifest: dict, split: str, cache: bool = True, shards: list[dict] | None = None):
    """(tf.data.Dataset of (image uint8 HWC, label int32, id int64), number of examples, number of files).

    ``shards``: read only these (a worker's under ``--input-sharding file``), in this order."""
    import tensorflow as tf

    path = Path(path)
    spec = dict(manifest["splits"][split])
    if shards is not None:
        spec["shards"] = shards
    files = [path / s["file"] for s in spec["shards"]]
    has_ids = _scan(files, [int(s["records"]) for s in spec["shards"]], manifest, split, subset=shards is not None)
    h, w, c = (int(x) for x in manifest["image_shape"])
    raw = manifest.get("image_encoding", "raw") == "raw"
    feats = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64),
             "id": tf.io.FixedLenFeature([], tf.int64, default_value=-1)}

    def parse(serialized):
        p = tf.io.parse_example(serialized, feats)
        images = tf.reshape(tf.io.decode_raw(p["image"], tf.uint8), [-1, h, w, c]) if raw else p["image"]
        return images, tf.cast(p["label"], tf.int32), p["id"]

    def decode(image, label, ex_id):
        image = tf.io.decode_image(image, channels=c, expand_animations=False)
        return tf.ensure_shape(image, [h, w, c]), label, ex_id

    # Several files read at once (deterministic round-robin), records parsed in batches, then one example
    # at a time again: the per-epoch shuffle and batching happen later, in data.train_dataset.
    ds = tf.data.TFRecordDataset([str(f) for f in files], num_parallel_reads=min(len(files), 4))
    ds = ds.batch(PARSE_BATCH).map(plain(parse), num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    if not raw:
        ds = ds.map(plain(decode), num_parallel_calls=tf.data.AUTOTUNE)
    if not has_ids:
        ds = ds.enumerate().map(plain(lambda i, ex: (ex[0], ex[1], tf.cast(i, tf.int64))))
    if cache:
        ds = ds.cache()  # decoded once; later epochs are served from memory
    n = sum(int(s["records"]) for s in spec["shards"])
    return ds, n, len(files)


def stream_split(path, manifest: dict, split: str, size: int, shards: list[dict] | None = None,
                 skip_bad: bool = False):
    """A split as a stream.StreamSplit (read from its shards while training), its images resized to ``size`` x
    ``size`` ("fixed": decoded whole, as in memory). Examples are numbered by their place in the files, which is
    what ``DatasetWriter`` stores as their ids; call after ``split_dataset`` has scanned the records."""
    import tensorflow as tf

    path = Path(path)
    spec = manifest["splits"][split]
    shards = spec["shards"] if shards is None else shards
    h, w, c = (int(x) for x in manifest["image_shape"])
    raw = manifest.get("image_encoding", "raw") == "raw"
    feats = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(serialized):
        p = tf.io.parse_single_example(serialized, feats)
        return p["image"], p["label"]

    return StreamSplit(manifest.get("name") or path.name, [str(path / s["file"]) for s in shards], size,
                       int(manifest["num_classes"]), counts=[int(s["records"]) for s in shards], parse=parse,
                       mode="fixed", raw_shape=(h, w, c) if raw else None, color_channels=c, skip_bad=skip_bad)
