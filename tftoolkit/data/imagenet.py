"""ImageNet as TensorFlow's scripts write it: TFRecord shards of tf.train.Example, read with no conversion.

    PATH/train-00000-of-01024 ... train-01023-of-01024       (a ``.tfrecord`` suffix is accepted too)
    PATH/validation-00000-of-00128 ...

tensorflow/models' ``build_imagenet_data.py`` (and Model Garden's ``imagenet_to_gcs.py``) write these features:
``image/encoded`` (JPEG bytes, of every size), ``image/class/label`` (1..1000: 0 is a background class the
script reserves), ``image/class/synset`` (n01440764 ...), ``image/class/text``, ``image/format``,
``image/height``/``width``, and optional ``image/object/bbox/*``. Only the encoded image and the label are
required; the synset (or text) names the classes where present; boxes are not used.

Labels: stored 1-based, they are shifted to 0..K-1 (``--imagenet-labels shift``, K outputs) or kept as they are
(``keep``: K+1 outputs, output 0 never a target, as TF-slim and tf_cnn_benchmarks train); labels stored from 0
are read as they are. config.json records which (``imagenet_labels``) and summary.json's dataset info the result.

Before training, without reading the images: every shard listed against its ``-of-N`` count, its records counted
from their length headers, and the first SAMPLE_RECORDS records of each shard parsed (features present, labels,
class names). The class count is the largest label seen in that sample (give ``--num-classes`` if a class is too
rare to appear in it); a label beyond it met later stops the run, naming its record. The index is kept beside the
shards (``.tftoolkit-index.json``, else in the data home) and rebuilt for a shard whose size or mtime changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from pathlib import Path

from ..errors import DataError, RunDirError
from ..fileio import write_json
from .decode import choose_image_size
from .home import data_root
from .file_source import from_streams
from .stream import StreamSplit
from .manifest import check_framing

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

log = logging.getLogger("tftoolkit")

SHARD = re.compile(r"^(train|validation)-(\d+)-of-(\d+)(\.tfrecords?)?$")
SPLITS = {"train": "train", "validation": "val"}
SAMPLE_RECORDS = 16     # records parsed per shard before training
INDEX = ".tftoolkit-index.json"
INDEX_VERSION = 2  # 2: the sampled images' sizes
ENCODED, LABEL = "image/encoded", "image/class/label"


def shards(path: Path) -> dict[str, list[Path]]:
    """{"train": [...], "validation": [...]}: the ImageNet-layout shards in ``path``, in index order."""
    found: dict[str, dict[int, Path]] = {}
    totals: dict[str, set[int]] = {}
    for f in sorted(path.iterdir()):
        m = SHARD.match(f.name)
        if m and f.is_file():
            split, i, n = m.group(1), int(m.group(2)), int(m.group(3))
            found.setdefault(split, {})[i] = f
            totals.setdefault(split, set()).add(n)
    out = {}
    for split, files in found.items():
        if len(totals[split]) > 1:
            raise DataError(f"{path} mixes {split} shards of {' and '.join(str(n) for n in sorted(totals[split]))} "
                            f"(the -of-N in their names); keep one set of {split} shards per folder")
        n = totals[split].pop()
        missing = [i for i in range(n) if i not in files]
        extra = [i for i in files if i >= n]
        if missing or extra:
            name = f"{split}-{(missing or extra)[0]:05d}-of-{n:05d}"
            count = len(missing) or len(extra)
            verb = ("is" if count == 1 else "are") + (" missing" if missing else " beyond it")
            raise DataError(f"{path}: the {split} shards say -of-{n:05d} but {count} {verb} (first: {name}); copy "
                            "the whole set")
        out[split] = [files[i] for i in range(n)]
    return out


def is_layout(path: Path) -> bool:
    return any(SHARD.match(f.name) for f in path.iterdir() if f.is_file())


# --- the index: record counts and a sample of each shard ----------------------------------------------------
def _sample_features(tf):
    return {ENCODED: tf.io.FixedLenFeature([], tf.string, default_value=""),
            LABEL: tf.io.FixedLenFeature([], tf.int64, default_value=-1),
            "image/class/synset": tf.io.FixedLenFeature([], tf.string, default_value=""),
            "image/class/text": tf.io.FixedLenFeature([], tf.string, default_value=""),
            "image/format": tf.io.FixedLenFeature([], tf.string, default_value=""),
            "image/height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
            "image/width": tf.io.FixedLenFeature([], tf.int64, default_value=0)}


def _index_shard(f: Path) -> dict:
    """Records (from the length headers), and the first SAMPLE_RECORDS records parsed: labels, names, formats."""
    import tensorflow as tf

    # The framing first: a shard cut short is named as truncated, however few records it holds. One whose very
    # first record does not fit is not a TFRecord file at all, as TensorFlow says when it reads it.
    try:
        records, cut = check_framing(f), None
    except DataError as e:
        if "record 0 " not in str(e):
            raise
        records, cut = 0, e
    try:
        sample = [r.numpy() for r in tf.data.TFRecordDataset(str(f)).take(SAMPLE_RECORDS)]
    except tf.errors.OpError as e:
        raise DataError(f"{f} is not a TFRecord file ({e.message.splitlines()[0].strip()}); keep only shards in "
                        "the folder") from None
    if cut is not None:
        raise cut
    labels, synsets, texts, formats, shapes = [], {}, {}, set(), []
    for i, raw in enumerate(sample):
        try:
            p = tf.io.parse_single_example(raw, _sample_features(tf))
        except tf.errors.OpError as e:
            raise DataError(f"{f}: record {i} is not a tf.train.Example with ImageNet's features "
                            f"({e.message.splitlines()[0].strip()})") from None
        if not p[ENCODED].numpy():
            keys = sorted(tf.train.Example.FromString(raw).features.feature.keys())
            raise DataError(f"{f}: record {i} has no {ENCODED} (its features: {', '.join(keys[:8]) or 'none'}); "
                            "an ImageNet-layout record needs the encoded image and image/class/label")
        label = int(p[LABEL].numpy())
        if label < 0:
            raise DataError(f"{f}: record {i} has no {LABEL}; an ImageNet-layout record needs one")
        labels.append(label)
        if p["image/class/synset"].numpy():
            synsets[label] = p["image/class/synset"].numpy().decode(errors="replace")
        if p["image/class/text"].numpy():
            texts[label] = p["image/class/text"].numpy().decode(errors="replace")
        formats.add(p["image/format"].numpy().decode(errors="replace") or "?")
        w, h = int(p["image/width"].numpy()), int(p["image/height"].numpy())
        if (w <= 0 or h <= 0) and bool(tf.io.is_jpeg(p[ENCODED]).numpy()):  # not recorded: the JPEG header says
            h, w = (int(v) for v in tf.image.extract_jpeg_shape(p[ENCODED]).numpy()[:2])
        if w > 0 and h > 0:
            shapes.append([w, h])
    st = f.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "records": records, "labels": labels,
            "synsets": synsets, "texts": texts, "formats": sorted(formats), "image_sizes": shapes}


def _index_path(path: Path) -> tuple[Path, Path]:
    """(beside the shards, in the data home): where the index is kept, the first where it can be written."""
    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    return path / INDEX, data_root() / "indexes" / f"imagenet-{key}.json"


def index(path: Path, files: list[Path]) -> tuple[dict, float]:
    """{file name: its entry} for ``files``, reusing the kept index for shards whose size and mtime match;
    returns (index, seconds)."""
    t0 = time.perf_counter()
    kept = {}
    for where in _index_path(path):
        try:
            data = json.loads(where.read_text())
            if data.get("version") == INDEX_VERSION and data.get("sample_records") == SAMPLE_RECORDS:
                kept = data["shards"]
                break
        except (OSError, ValueError, KeyError):
            continue
    out, changed = {}, False
    for f in files:
        st = f.stat()
        entry = kept.get(f.name)
        if entry and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
            entry["synsets"] = {int(k): v for k, v in entry.get("synsets", {}).items()}
            entry["texts"] = {int(k): v for k, v in entry.get("texts", {}).items()}
            out[f.name] = entry
        else:
            out[f.name] = _index_shard(f)
            changed = True
    if changed:
        payload = {"version": INDEX_VERSION, "sample_records": SAMPLE_RECORDS,
                   "shards": {k: {**v, "synsets": {str(a): b for a, b in v["synsets"].items()},
                                  "texts": {str(a): b for a, b in v["texts"].items()}} for k, v in out.items()}}
        for where in _index_path(path):
            try:
                write_json(where, payload)
                break
            except (OSError, RunDirError):  # a read-only dataset folder (fileio names EROFS as RunDirError)
                continue
    return out, time.perf_counter() - t0


def _parse(tf):
    feats = {ENCODED: tf.io.FixedLenFeature([], tf.string), LABEL: tf.io.FixedLenFeature([], tf.int64)}

    def parse(serialized):
        p = tf.io.parse_single_example(serialized, feats)
        return p[ENCODED], p[LABEL]

    return parse


def load(path, config, worker: tuple[int, int] | None = None):
    """The DataSource of an ImageNet-layout folder (see the module docstring)."""
    import tensorflow as tf

    path = Path(path)
    found = shards(path)
    if "train" not in found:
        raise DataError(f"{path} has validation shards but no train-*-of-* shards; the training split is needed")
    idx, index_s = index(path, [f for files in found.values() for f in files])
    sample = [lab for files in found.values() for f in files for lab in idx[f.name]["labels"]]
    if not sample:
        first = next(f.name for files in found.values() for f in files)
        raise DataError(f"{path}: its shards ({first}, ...) hold no records; copy them again")
    lo, hi = min(sample), max(sample)
    base = 0 if lo == 0 else 1
    offset = 1 if base == 1 and config.imagenet_labels == "shift" else 0
    k = hi + 1 - offset
    if config.num_classes is not None:
        if config.num_classes < k:
            raise DataError(f"--num-classes {config.num_classes}, but {path} has label {hi} "
                            f"({'shifted by 1: ' if offset else ''}class {hi - offset}); give at least {k}")
        k = config.num_classes
    names = [str(i) for i in range(k)]
    for files in found.values():
        for f in files:
            for label, synset in idx[f.name]["synsets"].items():
                if 0 <= label - offset < k:
                    names[label - offset] = synset
    if base == 1 and offset == 0:
        names[0] = "(background: no example)"
    size, why = choose_image_size(config.image_size, [tuple(wh) for files in found.values() for f in files
                                                      for wh in idx[f.name].get("image_sizes", [])])
    log.info("%s: images decoded at %s", path.name, why)
    parse = _parse(tf)
    skip = config.skip_bad_images

    def split(files):
        return StreamSplit(path.name, [str(f) for f in files], size, k, counts=[idx[f.name]["records"] for f in files],
                           parse=parse, label_offset=offset, mode="inception", skip_bad=skip)

    train_files = found["train"]
    sharding = None
    if worker is not None:
        me, workers = worker
        per_worker = [train_files[w::workers] for w in range(workers)]
        counts = [sum(idx[f.name]["records"] for f in fs) for fs in per_worker]
        sharding = {"policy": "file", "worker": me, "workers": workers, "shards": [f.name for f in per_worker[me]],
                    "examples_per_worker": min(counts), "left_out_per_epoch": sum(counts) - workers * min(counts)}
        train_files = per_worker[me]
    labels = ("0-based: read as stored" if base == 0 else
              f"1-based, shifted to 0..{k - 1}" if offset else f"1-based, kept: {k} outputs, output 0 never a target")
    formats = sorted({x for files in found.values() for f in files for x in idx[f.name]["formats"]})
    info = {"path": str(path), "format": "imagenet tfrecord", "shards": len(found["train"]),
            "val_shards": len(found.get("validation", [])), "labels": labels, "image_formats_sampled": formats,
            "index_s": round(index_s, 3), "sampled_records": len(sample),
            "class_text": {names[lab - offset]: t for files in found.values() for f in files
                           for lab, t in idx[f.name]["texts"].items() if 0 <= lab - offset < k}}
    if "validation" not in found:
        info["note"] = "no validation split (no validation-*-of-* shards)"
    train = split(train_files)
    limit = None if worker is not None else config.train_images
    source = from_streams(path.name, train, split(found["validation"]) if "validation" in found else None, names,
                          info, config.data_memory_gb, limit=limit)
    return source.shard_for_worker(sharding) if sharding is not None else source
