"""A folder of images, one sub-folder per class (the Keras ``image_dataset_from_directory`` layout, and ImageNet's
``train/<synset>/*.JPEG``).

    PATH/<class>/<image>.jpg|.jpeg|.png|.bmp|.gif        classes = sub-folder names, sorted
    PATH/train/<class>/... and PATH/val/<class>/...       the same, with a held-out split

Loading lists the files and reads nothing else but the headers of HEADER_SAMPLE images, to see whether the
images share one size: then that size (the shorter side) is the default ``--image-size`` and they are decoded
whole ("fixed"); images of mixed sizes default to their median shorter side, at most 224
(decode.choose_image_size; the log says which), and, streamed, are read with Inception-style crops
("inception", data/stream.py). Decoding is tf.data's, in parallel, no Python per image: once into memory when the
decoded pixels fit ``--data-memory-gb`` (default: a quarter of the RAM available), else while training.

Files whose extension is not an image's are left out and counted. A file that does not decode stops the load (in
memory) or the run (streamed), naming it, unless ``--skip-bad-images``: then it is skipped, counted and named in
summary.json.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import DataError
from .decode import choose_image_size
from .file_source import from_streams
from .stream import StreamSplit

log = logging.getLogger("tftoolkit")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")  # what image_dataset_from_directory accepts
VAL_NAMES = ("val", "validation")
SHOW_SKIPPED = 5  # skipped files named in the warning; all of them are counted
HEADER_SAMPLE = 32  # headers read to tell a folder of one image size from one of mixed sizes


def class_dirs(root: Path) -> list[Path]:
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


def has_class_folders(path: Path) -> bool:
    """Whether ``path`` (or its train/ sub-folder) has a sub-folder holding an image file."""
    root = path / "train" if (path / "train").is_dir() else path
    for d in class_dirs(root):
        for _, _, filenames in os.walk(d):
            if any(Path(fn).suffix.lower() in IMAGE_EXTENSIONS for fn in filenames):
                return True
    return False


def sizes(files: list[Path], n: int = HEADER_SAMPLE) -> list[tuple[int, int]]:
    """(width, height) of up to ``n`` files spread over the list, from their headers (unreadable ones left out)."""
    picks = files if len(files) <= n else [files[i] for i in np.linspace(0, len(files) - 1, n).astype(int)]
    out = []
    for p in picks:
        try:
            with Image.open(p) as im:
                out.append(tuple(im.size))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
            continue
    return out


def _names(path: Path, files: list[Path]) -> str:
    shown = ", ".join(str(p.relative_to(path)) for p in files[:SHOW_SKIPPED])
    return shown + (", ..." if len(files) > SHOW_SKIPPED else "")


def load(path, config):
    """A DataSource from an image folder; see the module docstring."""
    path = Path(path)
    split_layout = (path / "train").is_dir() and any((path / v).is_dir() for v in VAL_NAMES)
    train_root = path / "train" if split_layout else path
    val_root = next((path / v for v in VAL_NAMES if (path / v).is_dir()), None) if split_layout else None
    classes = [p.name for p in class_dirs(train_root)]
    if not classes:
        raise DataError(f"{train_root} has no class sub-folders; put the images in {train_root}/<class name>/ "
                        "(one sub-folder per class)")
    files, labels, not_images = _list(train_root, classes)
    if not files:
        raise DataError(f"found no images ({', '.join(IMAGE_EXTENSIONS)}) in the class sub-folders of {train_root}; "
                        f"expected {train_root}/<class>/<image>")
    present = sorted(set(labels))
    if len(present) < 2:
        raise DataError(f"{train_root} has images in only one class sub-folder ({classes[present[0]]!r}); "
                        "a classifier needs at least two classes, one sub-folder each")
    empty = [c for k, c in enumerate(classes) if k not in present]
    if empty:
        log.warning("class sub-folder(s) with no images in %s: %s", train_root, ", ".join(empty))
    val = None
    if val_root is not None:
        extra = sorted({p.name for p in class_dirs(val_root)} - set(classes))
        if extra:
            raise DataError(f"{val_root} has class sub-folder(s) {', '.join(extra)} that {train_root} lacks; "
                            "train and val need the same classes")
        vfiles, vlabels, v_not = _list(val_root, classes)
        not_images += v_not
        val = (vfiles, vlabels) if vfiles else None
    seen = sizes(files)
    uniform = len(set(seen)) == 1
    size, why = choose_image_size(config.image_size, seen)
    log.info("%s: images decoded at %s", path.name, why)
    mode = "fixed" if uniform else "inception"

    def split(fs, ls):
        return StreamSplit(path.name, [str(f) for f in fs], size, len(classes), labels=np.asarray(ls, np.int64),
                           mode=mode, skip_bad=config.skip_bad_images, what="file")

    info = {"path": str(path), "format": "image folder", "shards": 1, "val_shards": 1 if val is not None else 0,
            "per_class": {c: int(n) for c, n in zip(classes, np.bincount(labels, minlength=len(classes)))},
            "image_sizes_sampled": sorted(set(seen))[:SHOW_SKIPPED], "skipped_not_image": len(not_images),
            "skipped_not_image_examples": [str(p.relative_to(path)) for p in not_images[:SHOW_SKIPPED]]}
    if not_images:
        log.warning("left out %d file(s) in %s that are not images by their extension: %s", len(not_images), path,
                    _names(path, not_images))
    if val is None:
        info["note"] = "no validation split (add train/ and val/ sub-folders to get one)"
    return from_streams(path.name, split(files, labels), split(*val) if val is not None else None, classes, info,
                        config.data_memory_gb, limit=config.train_images)
