"""Where named datasets (shapes16k) live on this machine: one home, whatever the working directory.

    $TFTOOLKIT_DATA_DIR                     when set
    ./data/<name>                           when it already holds the dataset (older checkouts made it there)
    $XDG_CACHE_HOME/tftoolkit/datasets      else (~/.cache/tftoolkit/datasets), as Keras keeps ~/.keras/datasets

So the CLI at the repository root, a notebook that JupyterLab runs in notebooks/, a sweep point in its own
folder and ``tftoolkit data prepare`` all find the same copy.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("tftoolkit")

SHAPES16K = "shapes16k"
DATA_DIR_ENV = "TFTOOLKIT_DATA_DIR"
MANIFEST = "manifest.json"  # what makes a folder a prepared dataset (data/tfrecords.py)
_noted: set[str] = set()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tftoolkit" / "datasets"


def data_root() -> Path:
    """The folder named datasets are made in: $TFTOOLKIT_DATA_DIR, else the per-user cache."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else cache_root()


def dataset_dir(name: str = SHAPES16K) -> Path:
    """Where dataset ``name`` is (or will be made): see the module docstring for the order."""
    if os.environ.get(DATA_DIR_ENV):
        return data_root() / name
    local = Path("data") / name
    if (local / MANIFEST).exists():
        if str(local.resolve()) not in _noted:
            _noted.add(str(local.resolve()))
            log.info("using %s found in the working directory (the data home is %s; set %s to choose)",
                     local, data_root(), DATA_DIR_ENV)
        return local
    return data_root() / name


def default_dir() -> Path:
    return dataset_dir(SHAPES16K)


def describe_home() -> dict:
    """The data home as ``tftoolkit env`` reports it."""
    shapes = default_dir()
    return {"data_home": str(data_root().resolve()), "set_by": DATA_DIR_ENV if os.environ.get(DATA_DIR_ENV) else
            "default (per-user cache)", "shapes16k": str(shapes.resolve()),
            "shapes16k_prepared": (shapes / MANIFEST).exists()}
