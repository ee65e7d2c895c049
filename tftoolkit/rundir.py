"""The run directory: the interface between training and everything that reads results.

RUN_DIR/ config.json  summary.json  steps.csv  evals.csv  env.json  monitor.csv  checkpoints/

Every file is written atomically (temp file in the same folder, then rename), so a killed run never
leaves a half-written summary; readers see the old file or the new one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .config import NON_IDENTITY_KEYS
from .errors import RunDirError


def _atomic_write(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path, obj: Any) -> None:
    _atomic_write(path, lambda f: json.dump(_jsonable(obj), f, indent=2, sort_keys=True, allow_nan=True))


def read_json(path) -> Any:
    with open(path) as f:
        return json.load(f)


def write_csv(path, frame) -> None:
    """Write a pandas DataFrame as CSV, atomically."""
    _atomic_write(path, lambda f: frame.to_csv(f, index=False))


def _jsonable(obj):
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


def identity(config_dict: dict) -> dict:
    return {k: v for k, v in config_dict.items() if k not in NON_IDENTITY_KEYS}


def _config_defaults() -> dict:
    import dataclasses

    from .config import RunConfig

    return {f.name: f.default for f in dataclasses.fields(RunConfig)}


def prepare(out, config_dict: dict, force: bool = False) -> tuple[Path, bool]:
    """Create or reopen ``out`` for this config; returns (path, resuming).

    A directory holding a different run is refused (naming the keys that differ) unless ``force``, which
    clears it. The same config means: resume from its last checkpoint.
    """
    out = Path(out)
    cfg_path = out / "config.json"
    if cfg_path.exists():
        try:
            old = read_json(cfg_path).get("config", {})
            # A run directory written before a config field existed ran with that field's default.
            old = {**_config_defaults(), **old}
        except (OSError, ValueError):
            old = None
        if old is not None and identity(old) == identity(config_dict):
            return out, True
        if not force:
            if old is None:
                why = "its config.json is unreadable"
            else:
                diff = sorted(k for k in set(old) | set(config_dict) if old.get(k) != config_dict.get(k))
                why = "it differs in " + ", ".join(f"{k} ({old.get(k)!r} there, {config_dict.get(k)!r} now)" for k in diff)
            raise RunDirError(f"{out} holds a different run ({why}); choose another --out or pass --force to overwrite it")
        shutil.rmtree(out)
    elif out.exists() and any(out.iterdir()) and not force:
        raise RunDirError(f"{out} exists and is not a tftoolkit run directory; choose another --out or pass --force")
    elif out.exists() and force:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out, False
