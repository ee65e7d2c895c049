"""Small helpers the notebooks call, so that notebooks stay a list of package calls (no def/class in them).

- ``as_list``: papermill's ``-p replicas '[1, 2]'`` arrives as the text "[1, 2]" (its CLI only converts
  numbers, booleans and None); sweeps and the Python API pass real lists. Both become a list here.
- ``start``: working directory and output folder, the same from JupyterLab (which starts kernels in
  notebooks/) and from papermill run at the repository root.
- ``SMOKE``: what ``smoke=True`` changes in a training config: synthetic data, a few steps, no extra
  measurement loops, so that every notebook runs in well under a minute on 2 CPU cores.

Nothing here imports TensorFlow: ``init_devices`` must still come first in a notebook.
"""

from __future__ import annotations

import ast
import logging
import os
from pathlib import Path

from .. import logs
from ..config import accumulation_plan
from ..data.registry import ensure_shapes16k
from ..data.home import SHAPES16K
from ..errors import ConfigError
from ..fileio import ensure_dir

log = logging.getLogger("tftoolkit")

# Training-config changes for smoke mode (checks that a notebook runs end to end; measures nothing useful).
SMOKE = {
    "dataset": "synthetic",
    "train_images": 512,
    "image_size": 16,
    "steps": 6,                 # one warm-up loop and two timed loops of two steps
    "steps_per_loop": 2,
    "timing_warmup_steps": 2,
    "measure": False,
    "measure_budget": 1.0,      # where a notebook keeps measuring on (01, 03), its 6 steps may all go to it: a check
}                               # that the breakdown is taken, not a cost (the full runs keep the 10% default)
SMOKE_MAX_VALUES = 2  # smoke keeps the first two values of each list a notebook compares


def smoke_values(values: list, smoke: bool, name: str = "values") -> list:
    """``values`` unchanged, or its first SMOKE_MAX_VALUES in smoke mode (one TensorFlow trace per run is
    what makes a notebook slow on 2 cores, so smoke runs fewer of them)."""
    if smoke and len(values) > SMOKE_MAX_VALUES:
        log.info("smoke: %s %s of %s", name, values[:SMOKE_MAX_VALUES], values)
        return values[:SMOKE_MAX_VALUES]
    return values


def as_list(value, item=int, name: str = "value") -> list:
    """``[1, 2]``, ``"[1, 2]"``, ``"1,2"`` or ``2`` -> ``[1, 2]`` / ``[2]``, each item converted to ``item``."""
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = ast.literal_eval(text) if text.startswith(("[", "(")) else None
        except (ValueError, SyntaxError):
            raise ConfigError(f"{name}: cannot read {value!r} as a list; write it like [1, 2, 4]") from None
        value = list(parsed) if parsed is not None else [v.strip() for v in text.split(",") if v.strip()]
    elif not isinstance(value, (list, tuple)):
        value = [value]
    out = []
    for v in value:
        if (isinstance(v, bool) and item is not bool) or (item is int and isinstance(v, float) and not v.is_integer()):
            raise ConfigError(f"{name}: {v!r} is not of type {item.__name__} (in {value!r})")
        try:
            out.append(item(v))
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: {v!r} is not of type {item.__name__} (in {value!r})") from None
    if not out:
        raise ConfigError(f"{name}: the list is empty; give at least one value")
    return out


def project_root(start: Path | None = None) -> Path | None:
    """The repository root (the folder with pyproject.toml and notebooks/) at or above ``start``."""
    here = (start or Path.cwd()).resolve()
    for d in [here, *here.parents][:3]:
        if (d / "pyproject.toml").exists() and (d / "notebooks").is_dir() and (d / "tftoolkit").is_dir():
            return d
    return None


def start(out_dir: str, quiet: bool = False) -> Path:
    """Work from the repository root (so data/ and runs/ mean the same everywhere), create ``out_dir``,
    and show the toolkit's log lines in the notebook; returns the output folder."""
    logs.ensure_logging(quiet)
    root = project_root()
    if root is not None and Path.cwd().resolve() != root:
        os.chdir(root)
        log.info("working directory: %s (the repository root)", root)
    return ensure_dir(out_dir, "out_dir")


def training_config(smoke: bool, **config) -> dict:
    """A training config dict: the notebook's parameters, with ``SMOKE`` applied when ``smoke``.

    ``global_batch=0``, ``train_images=0`` and ``""`` for data_service, loss and metrics mean "not set" (papermill parameters cannot be
    None-typed and still document their type).
    """
    for key, unset in (("global_batch", 0), ("train_images", 0), ("data_service", ""), ("loss", ""), ("metrics", "")):
        if key in config and config[key] == unset:
            config[key] = None
    if smoke:
        config.update(SMOKE)
    return config


def batch_points(global_batches: list, replicas: int, accumulate: int = 1, max_per_replica_batch: int = 0) -> dict:
    """Notebook 02's batches as paired grid values: {"global_batch": [...]} and, where a batch accumulates,
    "accumulate": the K of each (config.accumulation_plan: the fewest micro-batches, at least ``accumulate``, whose
    per-replica batch is at most ``max_per_replica_batch``, the most a replica holds; 0: no cap). A batch that does
    not divide among the replicas keeps ``accumulate``: its run is refused and recorded like any other."""
    ks = []
    for g in global_batches:
        per_replica = g // replicas
        cap = max_per_replica_batch if max_per_replica_batch > 0 else max(1, per_replica)
        try:
            ks.append(accumulation_plan(g, replicas, cap, fits=lambda b, k: k >= accumulate)["accumulate"])
        except ConfigError:
            ks.append(accumulate)
    points = {"global_batch": list(global_batches)}
    if any(k != 1 for k in ks):
        points["accumulate"] = ks
    return points


def prepare_data(dataset: str) -> None:
    """Make shapes16k on first use (about 20 s on 2 cores); nothing for other datasets."""
    if dataset == SHAPES16K:
        ensure_shapes16k()
