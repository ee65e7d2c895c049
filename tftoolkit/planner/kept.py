"""The planner's validation results kept on disk between commands.

``predict`` gives every forecast an interval from leave-one-source-out errors (planner.intervals), which refits the
model once per published source: about 2 s of pandas arithmetic on 2 cores, the same every time until the
validation tables, the catalogue or the planner's code change. ``kept`` computes such a result once and keeps it in
the user's cache folder under a key that hashes exactly those inputs (KEY_FILES), so a changed row, a new catalogue
entry or an edited planner module computes it again, and an unreadable or unwritable cache only costs the time.

Folder: ``$TFTOOLKIT_CACHE``, else ``$XDG_CACHE_HOME/tftoolkit``, else ``~/.cache/tftoolkit``. The files are pickles
written by this user's own earlier commands, read as joblib.Memory and matplotlib's font cache read theirs.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
from pathlib import Path

import numpy as np
import pandas as pd

from .. import fileio
from ..errors import ToolkitError

PACKAGE = Path(__file__).resolve().parents[1]
VALIDATION = PACKAGE.parent / "validation"


def key_files() -> list[Path]:
    """What a kept result depends on: the validation tables, the catalogue, and the code that forecasts from them
    (the planner, the catalogue reader, the config's constants)."""
    return sorted([*VALIDATION.glob("*.csv"), *(PACKAGE / "catalogue").glob("*.toml"),
                   *(PACKAGE / "catalogue").glob("*.py"), *(PACKAGE / "planner").glob("*.py"), PACKAGE / "config.py"])


def key(files) -> str:
    h = hashlib.sha256(f"pandas {pd.__version__} numpy {np.__version__}".encode())
    for p in files:
        h.update(str(p.name).encode())
        h.update(p.read_bytes() if p.exists() else b"(absent)")
    return h.hexdigest()[:20]


def folder() -> Path:
    return fileio.cache_folder()


def kept(fn=None, *, files=key_files):
    """Decorate a function of no arguments whose result depends only on ``files()``: computed once per process
    (functools.cache) and, across processes, read back from the cache folder while those files are unchanged."""
    if fn is None:
        return functools.partial(kept, files=files)

    @functools.cache
    @functools.wraps(fn)
    def wrapper():
        try:
            path = folder() / f"{fn.__module__}.{fn.__qualname__}-{key(files())}.pkl"
        except OSError:
            return fn()
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except Exception:  # absent, truncated, written by another pandas: compute it again
            pass
        value = fn()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fileio.atomic_write(path, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), public=False)
            for old in path.parent.glob(f"{fn.__module__}.{fn.__qualname__}-*.pkl"):
                if old != path:
                    old.unlink(missing_ok=True)
        except (OSError, ToolkitError):
            pass  # a read-only home, a full disk: the result is still right, only not kept
        return value

    return wrapper
