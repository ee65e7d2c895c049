"""CIFAR's official python folders as a PATH: ``cifar-10-batches-py/`` and ``cifar-100-python/``.

    cifar-10-batches-py/   data_batch_1 .. data_batch_5, test_batch, batches.meta (label_names)
    cifar-100-python/      train, test, meta (fine_label_names)

Each file is a pickle of a dict (bytes keys): ``data`` a uint8 (N, 3072) array, the red, green and blue planes of
each 32x32 image in turn, and ``labels`` (``fine_labels`` for CIFAR-100). Unpickling runs whatever code a pickle
names, so a file from anywhere is read with an unpickler that builds plain data only (dicts, lists, strings,
numbers and NumPy arrays) and refuses anything else, naming what the file asked for.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import numpy as np

from ..errors import DataError
from .source import from_arrays, resized

LAYOUTS = {
    "cifar10": (["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"], "test_batch",
                "batches.meta", b"labels", b"label_names", 10),
    "cifar100": (["train"], "test", "meta", b"fine_labels", b"fine_label_names", 100),
}
# What a NumPy array's pickle calls, and nothing else (numpy 1 and 2 module names).
ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
           ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
           ("numpy", "ndarray"), ("numpy", "dtype")}


FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}


def _latin1(text, encoding="latin1", errors="strict"):
    """How Python 3 pickles bytes at protocol <= 2: ``_codecs.encode(text, "latin1")``. Data, not code: anything
    else asked of _codecs is refused."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r}: not how bytes are pickled")
    return text.encode("latin1", errors)


class PlainData(pickle.Unpickler):
    """An unpickler that rebuilds dicts, lists, strings, numbers and NumPy arrays, and refuses any other global
    (a class, a function: what makes unpickling run code)."""

    def __init__(self, file, where: str):
        super().__init__(file, encoding="bytes")
        self.where = where

    def find_class(self, module, name):
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        if (module, name) in ALLOWED:
            if module.startswith("numpy.core"):
                try:
                    module = module.replace("numpy.core", "numpy._core", 1)
                    return getattr(importlib.import_module(module), name)
                except ImportError:  # numpy 1
                    module = module.replace("numpy._core", "numpy.core", 1)
            return getattr(importlib.import_module(module), name)
        raise DataError(f"{self.where}: refusing to unpickle it: it asks for {module}.{name}, which CIFAR's data "
                        "never does (unpickling would run code); use the files from the CIFAR site")


def read_pickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            data = PlainData(f, str(path)).load()
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file: one line naming it
        raise DataError(f"{path}: not a CIFAR python batch ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: not a CIFAR python batch (a {type(data).__name__}, not a dict)")
    return data


def kind(path: Path) -> str | None:
    """"cifar10" or "cifar100" when ``path`` is one of CIFAR's python folders."""
    for name, (train, test, meta, *_rest) in LAYOUTS.items():
        if all((path / f).is_file() for f in [*train, test, meta]):
            return name
    return None


def missing(path: Path) -> tuple[str, list[str]] | None:
    """(which CIFAR, the files it lacks) when ``path`` holds part of a CIFAR python folder; CIFAR-100's generic
    names (train, test, meta) count only in a folder named as its archive unpacks."""
    for name, (train, test, meta, *_rest) in LAYOUTS.items():
        files = [*train, test, meta]
        have = [f for f in files if (path / f).is_file()]
        if have and len(have) < len(files) and (name == "cifar10" or path.name == FOLDERS[name]):
            return name, [f for f in files if f not in have]
    return None


def _images(batch: dict, path: Path, label_key: bytes, k: int):
    if b"data" not in batch or label_key not in batch:
        raise DataError(f"{path}: a CIFAR batch needs 'data' and {label_key.decode()!r}; it has "
                        f"{', '.join(sorted(str(x) for x in batch))}")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[label_key], np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise DataError(f"{path}: 'data' must be uint8 (N, 3072) with N labels, got {data.dtype} {data.shape} and "
                        f"{len(labels)} labels")
    if len(labels) and (labels.min() < 0 or labels.max() >= k):
        raise DataError(f"{path}: labels span [{labels.min()}, {labels.max()}] but CIFAR has {k} classes")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def load(path, config):
    path = Path(path)
    name = kind(path)
    train_files, test_file, meta_file, label_key, names_key, k = LAYOUTS[name]
    parts = [_images(read_pickle(path / f), path / f, label_key, k) for f in train_files]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    xv, yv = _images(read_pickle(path / test_file), path / test_file, label_key, k)
    meta = read_pickle(path / meta_file)
    names = [n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in meta.get(names_key, [])]
    x, xv = resized(x, config.image_size, name), resized(xv, config.image_size, name)
    source = from_arrays(x, y, name=name, val=(xv, yv), num_classes=config.num_classes or k)
    source.class_names = names if len(names) == source.num_classes else [str(i) for i in range(source.num_classes)]
    source.info = {"path": str(path), "format": f"{name} python folder", "input_source": "memory"}
    return source
