"""A folder of images, one sub-folder per class (the Keras ``image_dataset_from_directory`` layout).

    PATH/<class>/<image>.jpg|.jpeg|.png|.bmp|.gif        classes = sub-folder names, sorted
    PATH/train/<class>/... and PATH/val/<class>/...       the same, with a held-out split

Every image is converted to RGB and resized to ``image_size`` x ``image_size`` (Pillow). A folder whose
decoded pixels fit the memory budget (``--data-memory-gb``; default a quarter of the RAM available) is decoded
once, when it is loaded (in threads), and held in memory as uint8: training never meets a bad file halfway
through an epoch. A larger folder streams: only its file list is kept, every file's header is checked at load
time, and each replica's batch is read and decoded when the pipeline gathers it (store.FileStore: parallel
reads and decoding, the same decoder, so the same pixels). Files that are not images, or that cannot be
decoded (at load time; when streaming, a header that cannot be read), are skipped; how many and which ones are
logged as a warning and kept in the source's ``info``. A streamed file that fails to decode later fails the
step with its path.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

from ..errors import DataError
from .functions import plain

log = logging.getLogger("tftoolkit")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")  # what image_dataset_from_directory accepts
VAL_NAMES = ("val", "validation")
SHOW_SKIPPED = 5  # skipped files named in the warning; all of them are counted


def _class_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _list(root: Path, classes: list[str]) -> tuple[list[Path], list[int], list[Path]]:
    """Image files with their class index, and the files skipped as not images (by extension)."""
    files, labels, not_images = [], [], []
    for k, name in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / name):
            dirnames.sort()
            for fn in sorted(filenames):
                p = Path(dirpath) / fn
                if p.suffix.lower() in IMAGE_EXTENSIONS:
                    files.append(p)
                    labels.append(k)
                else:
                    not_images.append(p)
    return files, labels, not_images


def _decode(path: Path, size: int):
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")  # grey, palette and RGBA images become 3-channel
            if im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            return np.asarray(im, dtype=np.uint8)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None  # unreadable: counted and reported by the caller


def _header_ok(path: Path) -> bool:
    """Whether Pillow can read the file's header (the cheap check a streamed folder gets at load time)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.size  # noqa: B018 - the header is parsed on open; size proves it
        return True
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return False


def _workers() -> int:
    return min(32, 2 * (os.cpu_count() or 1))


def _read_split(listing, size: int, stream: bool = False):
    """(images or paths, labels, not images, unreadable) of a split's ``_list``: decoded arrays, or with ``stream``
    the paths whose headers read."""
    files, labels, not_images = listing
    with ThreadPoolExecutor(_workers()) as pool:  # Pillow releases the GIL while decoding
        if stream:
            decoded = [p if ok else None for p, ok in zip(files, pool.map(_header_ok, files))]
        else:
            decoded = list(pool.map(lambda p: _decode(p, size), files))
    ok = [i for i, a in enumerate(decoded) if a is not None]
    unreadable = [files[i] for i, a in enumerate(decoded) if a is None]
    y = np.asarray([labels[i] for i in ok], np.int32)
    if stream:
        return np.asarray([str(files[i]) for i in ok], dtype=object), y, not_images, unreadable
    x = np.stack([decoded[i] for i in ok]) if ok else np.zeros((0, size, size, 3), np.uint8)
    return x, y, not_images, unreadable


def memory_budget(gb: float | None) -> int:
    """Bytes of decoded pixels a folder may take in memory: ``gb``, or a quarter of the RAM available now."""
    if gb:
        return int(gb * 1e9)
    try:
        import psutil

        return int(psutil.virtual_memory().available // 4)
    except Exception:  # noqa: BLE001
        return 4 * 10**9


def _names(path: Path, files: list[Path]) -> str:
    shown = ", ".join(str(p.relative_to(path)) for p in files[:SHOW_SKIPPED])
    return shown + (", ..." if len(files) > SHOW_SKIPPED else "")


def _report_skipped(path: Path, not_images: list[Path], unreadable: list[Path]) -> dict:
    info = {"skipped_files": len(not_images) + len(unreadable), "skipped_not_image": len(not_images),
            "skipped_unreadable": len(unreadable),
            "skipped_examples": [str(p.relative_to(path)) for p in (unreadable + not_images)[:SHOW_SKIPPED]]}
    if info["skipped_files"]:
        parts = []
        if not_images:
            parts.append(f"{len(not_images)} not an image ({_names(path, not_images)})")
        if unreadable:
            parts.append(f"{len(unreadable)} unreadable ({_names(path, unreadable)})")
        log.warning("skipped %d file(s) in %s: %s", info["skipped_files"], path, "; ".join(parts))
    return info


def load(path, image_size: int, memory_gb: float | None = None):
    """A DataSource from an image folder; see the module docstring for the layout and when it streams."""
    from .source import DataSource, from_arrays

    path = Path(path)
    split_layout = (path / "train").is_dir() and any((path / v).is_dir() for v in VAL_NAMES)
    train_root = path / "train" if split_layout else path
    val_root = next((path / v for v in VAL_NAMES if (path / v).is_dir()), None) if split_layout else None
    classes = [p.name for p in _class_dirs(train_root)]
    if not classes:
        raise DataError(f"{train_root} has no class sub-folders; put the images in {train_root}/<class name>/ "
                        "(one sub-folder per class)")
    # Decide from the file count before decoding anything: pixels = files x size x size x 3 bytes.
    listing = _list(train_root, classes)
    val_listing = _list(val_root, classes) if val_root is not None else ([], [], [])
    count = len(listing[0]) + len(val_listing[0])
    pixels, budget = count * image_size * image_size * 3, memory_budget(memory_gb)
    stream = pixels > budget
    if stream:
        log.info("%s: %d images = %.2f GB of pixels at %dx%d, over the memory budget of %.2f GB: streaming them "
                 "from disk (headers are checked now, images decoded as batches are read)", path, count, pixels / 1e9,
                 image_size, image_size, budget / 1e9)
    x, y, not_images, unreadable = _read_split(listing, image_size, stream)
    if len(x) == 0:
        raise DataError(f"found no readable images ({', '.join(IMAGE_EXTENSIONS)}) in the class sub-folders of "
                        f"{train_root}; expected {train_root}/<class>/<image>")
    present = sorted(set(y.tolist()))
    if len(present) < 2:
        raise DataError(f"{train_root} has images in only one class sub-folder ({classes[present[0]]!r}); "
                        "a classifier needs at least two classes, one sub-folder each")
    empty = [c for k, c in enumerate(classes) if k not in present]
    if empty:
        log.warning("class sub-folder(s) with no readable images in %s: %s", train_root, ", ".join(empty))

    val = None
    if val_root is not None:
        extra = sorted({p.name for p in _class_dirs(val_root)} - set(classes))
        if extra:
            raise DataError(f"{val_root} has class sub-folder(s) {', '.join(extra)} that {train_root} lacks; "
                            "train and val need the same classes")
        vx, vy, v_not, v_bad = _read_split(val_listing, image_size, stream)
        not_images += v_not
        unreadable += v_bad
        val = (vx, vy) if len(vx) else None
    info = {"path": str(path), "format": "image folder", "shards": 1, "val_shards": 1 if val is not None else 0,
            "per_class": {c: int(n) for c, n in zip(classes, np.bincount(y, minlength=len(classes)))},
            "streamed": stream, "decoded_bytes": int(pixels), "memory_budget_bytes": int(budget),
            **_report_skipped(path, not_images, unreadable)}
    if val is None:
        info["note"] = "no validation split (add train/ and val/ sub-folders to get one)"
    if not stream:
        source = from_arrays(x, y, name=path.name, val=val, num_classes=len(classes))
        source.class_names = classes
        source.info = info
        return source
    from . import store as store_mod

    decode = partial(_decode, size=image_size)
    shape = (image_size, image_size, 3)

    def file_store(paths, labels):
        return store_mod.FileStore(paths, labels, np.arange(len(labels), dtype=np.int64), shape, decode)

    stores = {"train": file_store(x, y)}
    if val is not None:
        stores["val"] = file_store(*val)
    return DataSource(path.name, _stream_dataset(stores["train"]),
                      _stream_dataset(stores["val"]) if "val" in stores else None, len(y),
                      len(val[1]) if val is not None else 0, shape, len(classes), classes, info, stores)


def _stream_dataset(store):
    """The split as an unbatched tf.data dataset of (image, label, id), decoded as it is read (for inspection)."""
    import tensorflow as tf

    labels, ids = tf.constant(store.labels), tf.constant(store.ids)
    ds = tf.data.Dataset.range(store.n).batch(256)
    ds = ds.map(plain(lambda i: (store.gather_images(i), tf.gather(labels, i), tf.gather(ids, i))))
    return ds.unbatch()
