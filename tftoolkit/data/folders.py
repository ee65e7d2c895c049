"""A folder of images, one sub-folder per class (the Keras ``image_dataset_from_directory`` layout).

    PATH/<class>/<image>.jpg|.jpeg|.png|.bmp|.gif        classes = sub-folder names, sorted
    PATH/train/<class>/... and PATH/val/<class>/...       the same, with a held-out split

Every image is decoded once, when the dataset is loaded (Pillow, in threads), converted to RGB and resized
to ``image_size`` x ``image_size``, and held in memory as uint8: training never meets a bad file halfway
through an epoch. Files that are not images, or that cannot be decoded, are skipped; how many and which
ones are logged as a warning and kept in the source's ``info``.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..errors import DataError

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


def _read_split(root: Path, classes: list[str], size: int):
    files, labels, not_images = _list(root, classes)
    workers = min(32, 2 * (os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:  # Pillow releases the GIL while decoding
        decoded = list(pool.map(lambda p: _decode(p, size), files))
    ok = [i for i, a in enumerate(decoded) if a is not None]
    unreadable = [files[i] for i, a in enumerate(decoded) if a is None]
    x = np.stack([decoded[i] for i in ok]) if ok else np.zeros((0, size, size, 3), np.uint8)
    y = np.asarray([labels[i] for i in ok], np.int32)
    return x, y, not_images, unreadable


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


def load(path, image_size: int):
    """A DataSource from an image folder; see the module docstring for the layout."""
    from .source import from_arrays

    path = Path(path)
    split_layout = (path / "train").is_dir() and any((path / v).is_dir() for v in VAL_NAMES)
    train_root = path / "train" if split_layout else path
    val_root = next((path / v for v in VAL_NAMES if (path / v).is_dir()), None) if split_layout else None
    classes = [p.name for p in _class_dirs(train_root)]
    if not classes:
        raise DataError(f"{train_root} has no class sub-folders; put the images in {train_root}/<class name>/ "
                        "(one sub-folder per class)")
    x, y, not_images, unreadable = _read_split(train_root, classes, image_size)
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
        vx, vy, v_not, v_bad = _read_split(val_root, classes, image_size)
        not_images += v_not
        unreadable += v_bad
        val = (vx, vy) if len(vx) else None
    info = {"path": str(path), "format": "image folder", "shards": 1, "val_shards": 1,
            "per_class": {c: int(n) for c, n in zip(classes, np.bincount(y, minlength=len(classes)))},
            **_report_skipped(path, not_images, unreadable)}
    if val is None:
        info["note"] = "no validation split (add train/ and val/ sub-folders to get one)"
    source = from_arrays(x, y, name=path.name, val=val, num_classes=len(classes))
    source.class_names = classes
    source.info = info
    return source
