"""A directory tensorflow-datasets has prepared, as a PATH: ``<data_dir>/<name>/<version>/`` (or ``<name>/``, whose
newest version is taken), read through tensorflow-datasets (``pip install -e ".[tfds]"``) and never downloaded:
``builder_from_directory`` needs only the files that are there.

The builder says the features, the splits, their shard files and the class names. The image feature (the first
``Image`` feature, or the supervised keys') is read encoded (``SkipDecoding``) and decoded by the toolkit's reader,
in memory or streamed (data/stream.py) like every other file dataset: images of one declared size are decoded
whole ("fixed"), images of any size with Inception-style crops. Validation is the ``validation`` split, else
``test``.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from .decode import DEFAULT_IMAGE_SIZE
from .file_source import from_streams
from .stream import StreamSplit

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

INFO = "dataset_info.json"
VALIDATION_SPLITS = ("validation", "val", "test")


def version_dir(path: Path) -> Path | None:
    """The prepared version folder at or under ``path`` (the newest when several), or None."""
    if (path / INFO).is_file():
        return path
    versions = [d for d in path.iterdir() if d.is_dir() and (d / INFO).is_file()]

    def key(d):
        return tuple(int(x) if x.isdigit() else -1 for x in d.name.split("."))

    return max(versions, key=key) if versions else None


def datasets_in_root(path: Path) -> list[str]:
    """The prepared datasets under a TFDS data root (``~/tensorflow_datasets``: ``<name>/[<config>/]<version>``),
    as the paths to give --dataset, relative to ``path``; empty when ``path`` is not one."""
    found = sorted({str(info.parent.relative_to(path)) for pattern in (f"*/*/{INFO}", f"*/*/*/{INFO}")
                    for info in path.glob(pattern)})
    return found


def _tfds(path: Path):
    try:  # an optional extra (pip install -e ".[tfds]"), needed only for this format
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError(f"{path} is a TFDS-prepared directory; reading it needs tensorflow-datasets: "
                        "pip install -e \".[tfds]\" (or pip install tensorflow-datasets)") from None
    return tfds


def _keys(features, supervised, tfds) -> tuple[str, str]:
    if supervised and len(supervised) == 2 and isinstance(supervised[0], str):
        return supervised
    image = next((k for k, f in features.items() if isinstance(f, tfds.features.Image)), None)
    label = next((k for k, f in features.items() if isinstance(f, tfds.features.ClassLabel)), None)
    if image is None or label is None:
        raise DataError(f"the dataset's features ({', '.join(features)}) have no Image and ClassLabel pair to "
                        "classify; the toolkit trains image classifiers")
    return image, label


def load(path, config):
    import tensorflow as tf

    path = Path(path)
    vdir = version_dir(path)
    tfds = _tfds(path)
    try:
        builder = tfds.builder_from_directory(str(vdir))
    except Exception as e:  # noqa: BLE001 - a damaged dataset_info.json and the like: one line
        raise DataError(f"{vdir}: tensorflow-datasets cannot open it ({type(e).__name__}: {e})") from None
    info = builder.info
    fmt = str(getattr(info, "file_format", "tfrecord")).lower()
    if "tfrecord" not in fmt:
        raise DataError(f"{vdir} is stored as {fmt}; the toolkit reads TFDS datasets stored as TFRecords (prepare it "
                        "with file_format=tfrecord)")
    features = info.features
    image_key, label_key = _keys(features, info.supervised_keys, tfds)
    label = features[label_key]
    k = label.num_classes
    shape = tuple(features[image_key].shape)
    fixed = all(d is not None for d in shape)
    channels = shape[2] if len(shape) == 3 and shape[2] is not None else 3
    if "train" not in info.splits:
        raise DataError(f"{vdir} has no train split (it has {', '.join(info.splits)})")
    val_name = next((s for s in VALIDATION_SPLITS if s in info.splits), None)
    size = config.image_size or (min(shape[0], shape[1]) if fixed else DEFAULT_IMAGE_SIZE)
    decoders = {image_key: tfds.decode.SkipDecoding()}

    def parse(serialized):
        ex = features.deserialize_example(serialized, decoders=decoders)
        return ex[image_key], tf.cast(ex[label_key], tf.int64)

    def split(name):
        instructions = list(info.splits[name].file_instructions)
        partial = [fi for fi in instructions if fi.skip or (fi.take not in (None, -1) and fi.take != fi.examples_in_shard)]
        if partial:
            raise DataError(f"{vdir}: split {name} reads parts of shards ({partial[0]}); the toolkit reads whole shards")
        return StreamSplit(vdir.parent.name, [fi.filename for fi in instructions], size, k,
                           counts=[int(fi.examples_in_shard) for fi in instructions], parse=parse,
                           mode="fixed" if fixed else "inception", skip_bad=config.skip_bad_images,
                           color_channels=channels if fixed else 3)

    names = list(label.names) if getattr(label, "names", None) else [str(i) for i in range(k)]
    meta = {"path": str(vdir), "format": "tfds", "tfds_name": info.name, "tfds_version": str(info.version),
            "splits": {"train": "train", **({"val": val_name} if val_name else {})},
            "shards": len(info.splits["train"].file_instructions),
            "val_shards": len(info.splits[val_name].file_instructions) if val_name else 0}
    if val_name is None:
        meta["note"] = f"no validation split (the splits: {', '.join(info.splits)})"
    return from_streams(info.name, split("train"), split(val_name) if val_name else None, names, meta,
                        config.data_memory_gb, limit=config.train_images)
