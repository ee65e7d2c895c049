"""Where named datasets (shapes16k) live on this machine."""

from __future__ import annotations

import os
from pathlib import Path

SHAPES16K = "shapes16k"
DATA_DIR_ENV = "TFTOOLKIT_DATA_DIR"


def data_root() -> Path:
    """Where named datasets live: $TFTOOLKIT_DATA_DIR, else data/ under the current directory."""
    return Path(os.environ.get(DATA_DIR_ENV) or "data")


def default_dir() -> Path:
    return data_root() / SHAPES16K
