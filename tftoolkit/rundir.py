"""The run directory: the interface between training and everything that reads results.

RUN_DIR/ config.json  summary.json  steps.csv  evals.csv  env.json  monitor.csv  checkpoints/

Every file is written atomically (``fileio``: temp file in the same folder, then rename), so a killed run
never leaves a half-written summary; readers see the old file or the new one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .config import NON_IDENTITY_KEYS
from .errors import RunDirError
from .fileio import read_json


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
