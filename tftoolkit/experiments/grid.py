"""Train a small grid of configs in this process (a notebook's study), each into its own run directory.

    frame = grid.train_grid({"replicas": 4, "epochs": 3}, {"global_batch": [64, 512], "lr_rule": ["none", "linear"]},
                            out="runs/batch_lr")

``OUT/runs/<id>/`` per config (``<id>`` names the values that vary, like a sweep point) and ``OUT/results.csv``
with one row per run: the grid values, status, error and the run summary's scalar figures. A run that
diverges is recorded as such (its loss curve is kept); a run that fails, including a config the toolkit
refuses, is recorded with its error and the grid goes on. Rerunning reuses finished runs (train resumes).

This is the in-process sibling of ``tftoolkit sweep``: cheaper (one TensorFlow start for the whole grid),
but one crash of the process ends it. Sweeps run each point in its own process.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd

from .. import fileio, logs
from .. import summary as summary_schema
from ..errors import ToolkitError
from .sweep.spec import combinations, slug

log = logging.getLogger("tftoolkit")


def run_names(points: list[dict], keys: list[str]) -> list[str]:
    """Readable, unique names from the values that vary across points (``global_batch-512_lr_rule-linear``)."""
    varying = [k for k in keys if len({repr(p[k]) for p in points}) > 1]
    names = ["_".join(f"{k}-{slug(p[k])}" for k in varying) or "run" for p in points]
    if len(set(names)) < len(names):
        names = [f"{i:02d}_{n}" for i, n in enumerate(names)]
    return names


def train_grid(base: dict, grid: dict, out, *, paired: dict | None = None, force: bool = False,
               quiet: bool = False):
    """Train ``base`` updated with every combination of ``grid`` (crossed) and ``paired`` (zipped); returns the
    results frame (also written to ``out/results.csv`` after every run)."""
    # Deferred: training (TensorFlow's side) starts only when a run does; importing this module must not.
    from ..training import train

    logs.ensure_logging(quiet)
    grid = {k: list(v) for k, v in (grid or {}).items()}
    zipped = {k: list(v) for k, v in (paired or {}).items()}
    points = combinations(grid, zipped)
    names = run_names(points, list(grid) + list(zipped))
    out = Path(out)
    rows = []
    for i, (name, changes) in enumerate(zip(names, points)):
        run_dir = out / "runs" / name
        config = {**base, **changes}
        log.info("[%d/%d] %s", i + 1, len(points), ", ".join(f"{k}={v}" for k, v in changes.items()))
        try:
            summary = train(config, run_dir, force=force, quiet=quiet)
        except ToolkitError as e:
            # A combination the toolkit refuses (say a batch that does not divide by the replicas) is a result
            # too: record it where the report looks for runs, and go on.
            summary = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
            fileio.write_json(run_dir / "summary.json", summary_schema.check({**summary, **_config_figures(config)}))
            log.warning("%s: %s", name, summary["error"])
        except Exception as e:  # noqa: BLE001 - train() recorded the failure in the run's summary.json
            summary = _read(run_dir) or {"status": "failed", "error": f"{type(e).__name__}: {e}"}
            log.warning("%s failed: %s", name, summary.get("error"))
        rows.append({"run": name, **changes, "status": summary.get("status"), "error": summary.get("error"),
                     "run_dir": str(run_dir.relative_to(out)),
                     **{k: v for k, v in summary.items()
                        if k not in ("status", "error") and k not in changes and _scalar(v)}})
        fileio.write_csv(out / "results.csv", pd.DataFrame(rows))
    return pd.DataFrame(rows)


def _scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str)) and not (isinstance(v, float) and math.isinf(v))


def _read(run_dir: Path) -> dict | None:
    try:
        return summary_schema.read(run_dir)
    except (OSError, ValueError):
        return None


def _config_figures(config: dict) -> dict:
    """What a refused config would have been, so the report can still place it (batch, rule, replicas)."""
    keys = ("replicas", "global_batch", "per_replica_batch", "lr_rule", "base_lr", "base_batch", "warmup_epochs")
    return {k: config[k] for k in keys if k in config}
