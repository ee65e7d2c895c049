"""The report's tables: the overview a reader scans, points.csv (every column), runs.csv, scaling.csv, and what each
sweep point's notebook recorded; written atomically by ``save_tables``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ... import fileio
from ...measure import scaling, stats
from ... import summary as summary_schema
from .results import Results, scaling_frame, scaling_runs

# Summary fields points.csv puts first, in this order, where present (every other column follows them).
KEY_FIGURES = ["replicas", "global_batch", "lr_rule", "learning_rate", "images_per_sec", "images_per_sec_uncertainty",
               "final_loss", "val_accuracy", "communication_fraction", "mfu", "input_headroom",
               "input_headroom_uncertainty", "input_verdict",
               "wall_time_s"]
summary_schema.names(*KEY_FIGURES)
# The summary fields the overview shows of each point besides what varied and its status (what a reader compares),
# declared so that a renamed field fails here rather than leaving a blank column.
COMPARED = summary_schema.names("images_per_sec", "images_per_sec_uncertainty", "val_accuracy", "input_headroom",
                                "input_headroom_uncertainty", "input_verdict")


# --- tables ----------------------------------------------------------------------------------------------
def swept(res: Results) -> dict:
    """source -> the parameters that varied across its points (a sweep's), or across its runs' configs (run
    folders): what tells one row from another. A parameter every point shares is not a comparison."""
    out = {}
    for src, g in (res.points.groupby("source", sort=False) if not res.points.empty else []):
        out[src] = [p for p in res.point_params.get(src, []) if p in g.columns and g[p].nunique(dropna=False) > 1]
    for src, g in (res.runs.groupby("source", sort=False) if not res.runs.empty else []):
        if src not in out:
            out[src] = [c[len("config."):] for c in g.columns
                        if c.startswith("config.") and g[c].astype(str).nunique() > 1]
    return out


def run_labels(res: Results) -> pd.Series:
    """Each run's name in a sentence (index as res.runs): its swept parameters ("replicas=4"), and its source
    ("replicas=4 in scaling") when there are several; the run's folder when nothing varied."""
    if res.runs.empty:
        return pd.Series(dtype=str)
    varied, several = swept(res), res.runs["source"].nunique() > 1
    labels = []
    for _, r in res.runs.iterrows():
        params = json.loads(r["point_params"]) if isinstance(r.get("point_params"), str) else {}
        values = params if params else {k: r.get(f"config.{k}") for k in varied.get(r["source"], [])}
        text = ", ".join(f"{k}={scaling.one_value(values[k])}" for k in varied.get(r["source"], []) if k in values) \
            or str(r["run"])
        labels.append(f"{text} in {r['source']}" if several else text)
    return pd.Series(labels, index=res.runs.index)


def points_frame(res: Results) -> pd.DataFrame:
    """Every sweep point with every column its results.csv has, empty ones too (or every run with its key figures
    when the sources are not sweeps: runs.csv has the rest): the full table behind the overview, written to
    points.csv."""
    if not res.points.empty:
        df = res.points
        params = [c for src in df["source"].unique() for c in res.point_params.get(src, [])]
        results = [c for src in df["source"].unique() for c in res.recorded.get(src, [])]
        cols = ["source", "id"] + params + ["status", "error"] + results + [c for c in KEY_FIGURES if c in df.columns]
        cols += list(df.columns)
        out = df[[c for c in dict.fromkeys(cols) if c in df.columns]]
    elif res.runs.empty:
        return pd.DataFrame(columns=["source", "run", "status", "error"])
    else:
        # and another task's validation loss and given metrics (val_<name>), which the overview shows
        given = ["val_loss"] + [c for c in res.runs.columns if summary_schema.is_metric(c)]
        cols = ["source", "run", "status", "error"] + KEY_FIGURES + given
        out = res.runs[[c for c in dict.fromkeys(cols) if c in res.runs.columns]]
    out = out.copy()
    if "error" in out.columns:
        out["error"] = out["error"].astype(object).fillna("")  # a finished point has no error (not "NaN")
    return out


def _finite(v) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, bool) and math.isfinite(v)


def _cell(v):
    """A value as the overview shows it: blank when missing, a whole number without ".0" (a column with a blank
    in it is float in pandas, so 4 would read 4.0)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return int(v)
    return v


def _rate(r) -> str:
    ips, se = r.get("images_per_sec"), r.get("images_per_sec_uncertainty")
    if not _finite(ips):
        return ""
    return stats.plus_minus(ips, se, ",.0f")


def _headroom(r) -> str:
    h, se, verdict = r.get("input_headroom"), r.get("input_headroom_uncertainty"), r.get("input_verdict")
    if not _finite(h):
        return ""
    text = stats.plus_minus(h, se)
    return f"{text} ({verdict})" if isinstance(verdict, str) and verdict else text


def near_chance(val_accuracy, num_classes) -> bool:
    """Whether a validation accuracy is at chance level: under twice 1/classes, and under halfway from 1/classes to
    1 (for few classes). A scaling run trains a few dozen steps to time them; it is expected to end there."""
    try:
        acc, c = float(val_accuracy), float(num_classes)
    except (TypeError, ValueError):
        return False
    return acc == acc and c >= 2 and acc < min(2 / c, (1 + 1 / c) / 2)


CHANCE_LABEL = " (chance: expected of a throughput run)"


def overview(res: Results) -> pd.DataFrame:
    """One row per sweep point (or per run when the sources are not sweeps) with what a reader compares: the
    parameters that varied, status, the error where there is one, images/sec (± its standard error), validation
    accuracy, the input headroom and its verdict, and what a sweep's own notebook recorded. Every other column is in
    points.csv and runs.csv (points_frame, save_tables).

    Failed, timed-out and diverged points are listed with their errors, never dropped.
    """
    full = points_frame(res)
    if full.empty:
        return full
    name = "id" if "id" in full.columns else "run"
    by_source = swept(res)
    out = pd.DataFrame(index=full.index)
    if full["source"].nunique() > 1:
        out["source"] = full["source"]
    out[name] = full[name]
    for p in dict.fromkeys(p for ps in by_source.values() for p in ps):
        values = full[p] if p in full.columns else res.runs.get(f"config.{p}", pd.Series(index=full.index))
        # Blank where the point's own sweep did not vary it (another sweep's parameter, or a summary figure of the
        # same name).
        mine = full["source"].map(lambda src: p in by_source.get(src, []))
        out[p] = [_cell(v) if m else "" for v, m in zip(values, mine)]
    out["status"] = full["status"] if "status" in full.columns else ""
    if "error" in full.columns and (full["error"].astype(str) != "").any():
        out["error"] = full["error"]
    for c in dict.fromkeys(c for src in full["source"].unique() for c in res.recorded.get(src, [])):
        out[c] = [_cell(v) for v in full[c]]
    rows = [r for _, r in full.iterrows()]
    for col, fmt in (("images/sec", _rate), ("input headroom", _headroom)):
        out[col] = [fmt(r) for r in rows]
    if "val_accuracy" in full.columns:
        # A scaling study's runs train a few dozen steps to time them: chance-level accuracy is expected, and said.
        timing = set(scaling_runs(res).get("source", pd.Series(dtype=str)))
        classes = full["num_classes"] if "num_classes" in full.columns else pd.Series(math.nan, index=full.index)
        out.insert(len(out.columns) - 1, "val accuracy",
                   [f"{v:.1%}" + (CHANCE_LABEL if src in timing and near_chance(v, c) else "") if _finite(v) else ""
                    for v, c, src in zip(full["val_accuracy"], classes, full["source"])])
    # Another task's figures (engine/losses.py): its validation loss and its given metrics, val_<name>.
    given = [c for c in full.columns if c.startswith("val_") and c not in ("val_accuracy", "val_examples")
             and pd.to_numeric(full[c], errors="coerce").notna().any()]
    if given and ("val accuracy" not in out.columns or (out["val accuracy"] == "").any()):
        for c in given:
            out.insert(len(out.columns) - 1, c.replace("_", " ", 1),
                       [f"{v:.4g}" if _finite(v) else "" for v in pd.to_numeric(full[c], errors="coerce")])
    empty = [c for c in ("images/sec", "input headroom", "val accuracy") if c in out.columns and (out[c] == "").all()]
    return out.drop(columns=empty).reset_index(drop=True)


def status_counts(res: Results) -> pd.DataFrame:
    """Points (or runs) per source and status: how much of the study actually produced results."""
    df = res.points if not res.points.empty else res.runs
    if df.empty:
        return pd.DataFrame(columns=["source", "status", "count"])
    return df.groupby(["source", "status"]).size().rename("count").reset_index()


class Written(dict):
    """{table name: path} of what save_tables wrote; in a notebook it shows as one line naming the files (a report
    never prints a Python object)."""

    def _repr_markdown_(self) -> str:
        if not self:
            return "*No tables: nothing to report.*"
        folder = Path(next(iter(self.values()))).parent
        return f"Written to `{folder}`: " + ", ".join(f"`{p.name}`" for p in self.values())

    def __repr__(self) -> str:
        return self._repr_markdown_().replace("`", "").replace("*", "")


def recorded(res: Results) -> pd.DataFrame:
    """One row per sweep point with its parameters, status and what its notebook recorded (results.json)."""
    if res.points.empty or not any(res.recorded.values()):
        return pd.DataFrame()
    rows = []
    for src, g in res.points.groupby("source", sort=False):
        cols = res.recorded.get(src, [])
        if cols:
            keep = ["source", "id"] + res.point_params.get(src, []) + ["status"] + cols
            rows.append(g[[c for c in dict.fromkeys(keep) if c in g.columns]])
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def save_tables(res: Results, out_dir) -> Written:
    """runs.csv, points.csv, scaling.csv (when there are scaling runs) into ``out_dir``, atomically."""
    out = Path(out_dir)
    written = Written()
    runs = res.runs.drop(columns=[c for c in ("examples_per_replica",) if c in res.runs.columns]) if not res.runs.empty else res.runs
    tables = {"runs": runs, "points": points_frame(res), "scaling": scaling_frame(res)}
    for name, frame in tables.items():
        if frame is None or frame.empty:
            continue
        path = out / f"{name}.csv"
        fileio.write_csv(path, frame)
        written[name] = path
    return written
