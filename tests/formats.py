"""Writers of the dataset formats users bring, written from those formats' own definitions, never from the
toolkit's code (so a test that reads them checks the toolkit against the format, not against itself).

    imagenet_tfrecords   tensorflow/models research/inception/inception/data/build_imagenet_data.py:
                         ``_convert_to_example`` and ``_process_image_files_batch`` (feature keys, 1-based labels,
                         ``train-00000-of-01024`` file names without an extension)
    cifar_python         the CIFAR-10/100 "python version" pickles (https://www.cs.toronto.edu/~kriz/cifar.html)
    image_folder         ImageNet's train/<synset>/<name>.JPEG layout, JPEG and PNG of mixed sizes
    tfds_directory       a TFDS-prepared directory, written by tensorflow-datasets itself
    jpeg                 one JPEG of smooth random content (natural images decode at a realistic rate; noise
                         does not compress and decodes several times slower)

The benchmarks import this module too (benchmarks/bench_stream.py), so it depends on NumPy, Pillow and
TensorFlow only.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np


def image_array(rng, height: int, width: int, texture: float = 0.0) -> np.ndarray:
    """An RGB image: a colour gradient with a few filled rectangles, uint8 (height, width, 3). ``texture``: the
    standard deviation of added pixel noise (about 15 gives ImageNet's ~110 kB per 500x375 JPEG at quality 90)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(0, 255, 3) + rng.uniform(-1, 1, 3) * (x[..., None] / width * 120) \
        + rng.uniform(-1, 1, 3) * (y[..., None] / height * 120)
    img = np.clip(base, 0, 255)
    for _ in range(3):
        y0, x0 = rng.integers(0, height // 2), rng.integers(0, width // 2)
        img[y0:y0 + rng.integers(8, height // 2), x0:x0 + rng.integers(8, width // 2)] = rng.uniform(0, 255, 3)
    if texture:
        img = np.clip(img + rng.normal(0, texture, img.shape).astype(np.float32), 0, 255)
    return img.astype(np.uint8)


def encode(array: np.ndarray, fmt: str = "JPEG", quality: int = 90) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return buf.getvalue()


def jpeg(rng, height: int, width: int, quality: int = 90) -> bytes:
    return encode(image_array(rng, height, width), "JPEG", quality)


# --- ImageNet as build_imagenet_data.py writes it --------------------------------------------------------
def synsets(k: int) -> list[str]:
    return [f"n{1440764 + 1000 * i:08d}" for i in range(k)]


def _int64(v):
    import tensorflow as tf

    return tf.train.Feature(int64_list=tf.train.Int64List(value=v if isinstance(v, list) else [v]))


def _float(v):
    import tensorflow as tf

    return tf.train.Feature(float_list=tf.train.FloatList(value=v if isinstance(v, list) else [v]))


def _bytes(v):
    import tensorflow as tf

    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v if isinstance(v, bytes) else v.encode()]))


def imagenet_example(filename: str, image_buffer: bytes, label: int, synset: str, human: str, bbox: list,
                     height: int, width: int, image_format: bytes = b"JPEG"):
    """build_imagenet_data.py's ``_convert_to_example``, field for field (bbox: [xmin, ymin, xmax, ymax] lists)."""
    import tensorflow as tf

    xmin, ymin, xmax, ymax = ([b[i] for b in bbox] for i in range(4))
    return tf.train.Example(features=tf.train.Features(feature={
        "image/height": _int64(height),
        "image/width": _int64(width),
        "image/colorspace": _bytes(b"RGB"),
        "image/channels": _int64(3),
        "image/class/label": _int64(label),
        "image/class/synset": _bytes(synset),
        "image/class/text": _bytes(human),
        "image/object/bbox/xmin": _float(xmin),
        "image/object/bbox/xmax": _float(xmax),
        "image/object/bbox/ymin": _float(ymin),
        "image/object/bbox/ymax": _float(ymax),
        "image/object/bbox/label": _int64([label] * len(xmin)),
        "image/format": _bytes(image_format),
        "image/filename": _bytes(os.path.basename(filename)),
        "image/encoded": _bytes(image_buffer)}))


def imagenet_tfrecords(out, classes: int = 4, train: int = 64, validation: int = 16, train_shards: int = 4,
                       validation_shards: int = 2, sizes=(40, 90), seed: int = 0, png_every: int = 0,
                       boxes: bool = True, texture: float = 0.0) -> dict:
    """An ImageNet-layout folder: ``train-0000i-of-0000n`` and ``validation-...`` shards of JPEGs of random sizes
    in ``sizes`` (each side), labels 1..classes (0 is the background class build_imagenet_data.py reserves).
    ``png_every``: every k-th image is a PNG (the one ImageNet file that is, converted by the script; here kept
    as PNG to test the decoder's fallback). Returns {"labels": {split: [labels in file order]}, ...}."""
    import tensorflow as tf

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = synsets(classes)
    written = {}
    for split, n, shards in (("train", train, train_shards), ("validation", validation, validation_shards)):
        labels = []
        bounds = np.linspace(0, n, shards + 1).astype(int)
        for s in range(shards):
            path = out / f"{split}-{s:05d}-of-{shards:05d}"
            with tf.io.TFRecordWriter(str(path)) as w:
                for i in range(bounds[s], bounds[s + 1]):
                    k = int(rng.integers(0, classes))
                    h, wd = (int(v) for v in rng.integers(sizes[0], sizes[1] + 1, 2))
                    png = png_every and i % png_every == png_every - 1
                    buf = encode(image_array(rng, h, wd, texture), "PNG" if png else "JPEG")
                    bbox = [[0.1, 0.1, 0.9, 0.8]] if boxes else []
                    ex = imagenet_example(f"{names[k]}_{i}.JPEG", buf, k + 1, names[k], f"class {k} thing", bbox,
                                          h, wd, b"PNG" if png else b"JPEG")
                    w.write(ex.SerializeToString())
                    labels.append(k + 1)
        written[split] = labels
    return {"labels": written, "synsets": names}


def write_records(path, examples) -> None:
    """Raw tf.train.Example records (or any bytes) into one TFRecord file."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as w:
        for ex in examples:
            w.write(ex if isinstance(ex, bytes) else ex.SerializeToString())


# --- CIFAR's python version -------------------------------------------------------------------------------
def cifar_python(out, kind: str = "cifar10", train_per_batch: int = 20, test: int = 20, seed: int = 0) -> Path:
    """``cifar-10-batches-py/`` (data_batch_1..5, test_batch, batches.meta) or ``cifar-100-python/`` (train, test,
    meta): dicts with bytes keys, 'data' a uint8 (N, 3072) array in channel-major (R plane, G plane, B plane)
    order, labels as lists of ints, pickled as the originals are (protocol 2, read with encoding='bytes')."""
    rng = np.random.default_rng(seed)
    out = Path(out)

    def batch(n, classes, coarse=None):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        d = {b"batch_label": b"batch", b"data": data, b"filenames": [f"img_{i}.png".encode() for i in range(n)]}
        labels = [int(v) for v in rng.integers(0, classes, n)]
        if kind == "cifar10":
            d[b"labels"] = labels
        else:
            d[b"fine_labels"] = labels
            d[b"coarse_labels"] = [int(v) for v in rng.integers(0, coarse, n)]
        return d

    def dump(path, obj):
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)

    if kind == "cifar10":
        root = out / "cifar-10-batches-py"
        root.mkdir(parents=True, exist_ok=True)
        for i in range(1, 6):
            dump(root / f"data_batch_{i}", batch(train_per_batch, 10))
        dump(root / "test_batch", batch(test, 10))
        dump(root / "batches.meta", {b"label_names": [n.encode() for n in (
            "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")],
            b"num_cases_per_batch": train_per_batch, b"num_vis": 3072})
    else:
        root = out / "cifar-100-python"
        root.mkdir(parents=True, exist_ok=True)
        dump(root / "train", batch(5 * train_per_batch, 100, 20))
        dump(root / "test", batch(test, 100, 20))
        dump(root / "meta", {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
                             b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]})
    return root


# --- an ImageNet-style folder of JPEGs and PNGs ------------------------------------------------------------
def image_folder(out, classes: int = 3, train: int = 10, val: int = 3, sizes=(20, 70), seed: int = 0,
                 png_every: int = 3) -> Path:
    """out/train/<synset>/<synset>_<i>.JPEG (and .png every ``png_every``) and out/val/<synset>/..., mixed sizes."""
    rng = np.random.default_rng(seed)
    out = Path(out)
    for split, n in (("train", train), ("val", val)):
        for name in synsets(classes):
            d = out / split / name
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                h, w = (int(v) for v in rng.integers(sizes[0], sizes[1] + 1, 2))
                png = png_every and i % png_every == png_every - 1
                (d / f"{name}_{i}.{'png' if png else 'JPEG'}").write_bytes(
                    encode(image_array(rng, h, w), "PNG" if png else "JPEG"))
    return out


# --- a TFDS-prepared directory ---------------------------------------------------------------------------
def tfds_directory(data_dir, name: str = "tiny_images", train: int = 40, test: int = 12, size: int = 16,
                   classes: int = 3, seed: int = 0) -> Path:
    """A dataset prepared by tensorflow-datasets itself (store_as_tfds_dataset), as `tfds build` leaves it:
    data_dir/name/1.0.0/{dataset_info.json, features.json, name-train.tfrecord-00000-of-00001, ...}."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    rng = np.random.default_rng(seed)

    def split(n):
        x = rng.integers(0, 255, (n, size, size, 3), dtype=np.uint8)
        y = rng.integers(0, classes, n)
        return tf.data.Dataset.from_tensor_slices({"image": x, "label": y})

    features = tfds.features.FeaturesDict({"image": tfds.features.Image(shape=(size, size, 3)),
                                           "label": tfds.features.ClassLabel(names=[f"c{i}" for i in range(classes)])})
    tfds.dataset_builders.store_as_tfds_dataset(name=name, version="1.0.0", features=features,
                                                split_datasets={"train": split(train), "test": split(test)},
                                                data_dir=str(data_dir))
    return Path(data_dir) / name / "1.0.0"
