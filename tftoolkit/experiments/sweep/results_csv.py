"""results.csv: one row per point in spec order, rebuilt from the points' records (atomically) after every point."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ... import fileio
from .folder import RESULTS_CSV, read_record
from .spec import Spec


def _cell(v):
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return v


def results_frame(spec: Spec, out: Path) -> pd.DataFrame:
    """One row per point in spec order: id, parameters, status, error, wall_s, runs, run_dir, summary figures."""
    rows = []
    for p in spec.points:
        rec = read_record(out, p) or {}
        row = {"id": p.id, **{k: _cell(v) for k, v in p.params.items()}}
        row.update({"status": rec.get("status", "pending") if rec else "pending", "error": rec.get("error"),
                    "wall_s": rec.get("wall_s"), "runs": rec.get("runs"), "run_dir": rec.get("run_dir")})
        for k, v in (rec.get("figures") or {}).items():
            # A summary field named like a parameter (replicas, say) keeps the parameter's column.
            row[k if k not in row else f"run_{k}"] = _cell(v)
        rows.append(row)
    # Object columns: a column with a blank (a point not finished, a figure one run lacks) would otherwise turn
    # to floats, and 48 steps would read 48.0.
    return pd.DataFrame(rows, dtype=object)


def write_results(spec: Spec, out: Path) -> Path:
    path = out / RESULTS_CSV
    fileio.write_csv(path, results_frame(spec, out))
    return path
