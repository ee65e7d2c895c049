"""Reading sweep folders and run directories into ``Results``, and the runs each study compares.

Which runs feed which figure is decided by the data, per source folder: a folder whose runs differ in replica
count feeds the scaling figures; one whose runs differ in LR rule, or in global batch at one replica count,
feeds the training-curve figures. A folder with both (or a single study) feeds whatever it can.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ... import fileio, rundir
from ...measure import scaling
from ... import summary as summary_schema
from ...errors import DataError

log = logging.getLogger("tftoolkit")


@dataclass
class Results:
    sources: list[Path]
    points: pd.DataFrame                 # rows of every results.csv (column 'source' = the sweep folder)
    runs: pd.DataFrame                   # one row per run directory: summary scalars + config + point params
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    evals: pd.DataFrame = field(default_factory=pd.DataFrame)
    allreduce: pd.DataFrame = field(default_factory=pd.DataFrame)
    point_params: dict = field(default_factory=dict)   # source -> the parameter columns its sweep set
    recorded: dict = field(default_factory=dict)       # source -> the result columns its notebook wrote (results.json)

    def __repr__(self) -> str:
        return (f"Results({len(self.sources)} source(s), {len(self.points)} sweep point(s), {len(self.runs)} run(s), "
                f"{len(self.allreduce)} all-reduce row(s))")


# --- loading ------------------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict:
    try:
        data = fileio.read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}  # a file that is not an object holds nothing a reader can use


def _point_params(run_dir: Path, source: Path) -> tuple[str | None, dict]:
    """The sweep point a run belongs to (nearest folder up with parameters.json) and its parameters."""
    d = run_dir
    while d != source and source in d.parents:
        if (d / "parameters.json").exists():
            params = _read_json(d / "parameters.json")
            params.pop("out_dir", None)
            return d.name, params
        d = d.parent
    return None, {}


def _mode(run_dir: Path, params: dict) -> str | None:
    if isinstance(params.get("mode"), str):
        return params["mode"]
    for d in list(run_dir.parents)[:3]:
        if (d / "scaling.csv").exists():
            try:
                modes = pd.read_csv(d / "scaling.csv")["mode"].dropna().unique()
                return str(modes[0]) if len(modes) else None
            except (OSError, ValueError, KeyError):
                return None
    return None


def _run_row(run_dir: Path, source: Path) -> dict:
    try:
        summary, unreadable = summary_schema.read(run_dir), None
    except (OSError, ValueError) as e:  # one bad run is listed as unreadable; the others are reported
        summary, unreadable = {}, str(e)
    config = _read_json(run_dir / "config.json").get("config", {})
    config = config if isinstance(config, dict) else {}
    point, params = _point_params(run_dir, source)
    row = {"source": source.name, "run": str(run_dir.relative_to(source)), "run_dir": str(run_dir), "point": point}
    for k, v in config.items():
        if not isinstance(v, (list, dict)):
            row[f"config.{k}"] = v
    for k in ("warmup_epochs", "base_lr", "base_batch", "optimizer", "model"):
        if k in config:
            row[k] = config[k]
    for k, v in summary.items():
        if k == "examples_per_replica":
            row[k] = v
        elif k.endswith("_interval") and isinstance(v, list) and len(v) == 2:  # [lo, hi] -> two columns
            row[f"{k}_lo"], row[f"{k}_hi"] = (math.nan if x is None else x for x in v)
        elif not isinstance(v, (list, dict)):
            row[k] = v
    monitor = summary.get("monitor") if isinstance(summary.get("monitor"), dict) else {}
    for k in ("flags", "notes"):  # the monitor's findings (faults; the power cap, which is not one)
        row[f"monitor_{k}"] = "\n".join(monitor.get(k) or []) or None
    row.setdefault("status", "failed" if not summary else "ok")
    if unreadable:
        row["status"], row["error"] = "unreadable", unreadable
    row["mode"] = _mode(run_dir, params)
    row["point_params"] = json.dumps(params) if params else None
    return row


def _csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def load(paths) -> Results:
    """Everything under the given sweep folders / folders of run directories / run directories."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    sources = [Path(p) for p in paths]  # none: an empty Results, which every figure and table skips
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        raise DataError(f"nothing to report: {', '.join(missing)} not found (run a sweep or a notebook first)")
    points, runs, steps, evals, allreduce = [], [], [], [], []
    point_params, recorded = {}, {}
    for src in sources:
        src = src.resolve()
        if (src / "results.csv").exists() and (src / "sweep.json").exists():
            p = _csv(src / "results.csv")
            if "status" in p and not rundir.held(src):
                # A point the sweep was running when it was killed: nothing runs it now (the rerun will).
                p["status"] = p["status"].replace("running", "interrupted")
            if not p.empty:
                cols = list(p.columns)
                # results.csv puts the point's parameters between 'id' and 'status'.
                point_params[src.name] = cols[cols.index("id") + 1:cols.index("status")] \
                    if {"id", "status"} <= set(cols) else []
                # What each point's notebook wrote to results.json (its point.json names the columns).
                names = set()
                for pid in p.get("id", pd.Series(dtype=str)).astype(str):
                    names |= set(_read_json(src / "runs" / pid / "point.json").get("recorded") or [])
                recorded[src.name] = [c for c in cols if c in names]
                points.append(p.assign(source=src.name))
        run_dirs = sorted({s.parent for s in src.rglob("summary.json") if ".ipynb_checkpoints" not in s.parts})
        for rd in run_dirs:
            row = _run_row(rd, src.parent if rd == src else src)
            runs.append(row)
            for name, bucket in (("steps.csv", steps), ("evals.csv", evals)):
                t = _csv(rd / name)
                if not t.empty:
                    bucket.append(t.assign(run=row["run"], source=row["source"]))
        for ar in sorted(src.rglob("allreduce.csv")):
            t = _csv(ar)
            if not t.empty:
                # bench.json beside it says what the replicas were: the figures say so when they were simulated
                kind = _read_json(ar.parent / "bench.json").get("device_kind")
                allreduce.append(t.assign(source=src.name, file=str(ar), device_kind=kind))
    runs_df = pd.DataFrame(runs)
    res = Results(sources, pd.concat(points, ignore_index=True) if points else pd.DataFrame(), runs_df,
                  _with_run_info(pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(), runs_df),
                  _with_run_info(pd.concat(evals, ignore_index=True) if evals else pd.DataFrame(), runs_df),
                  pd.concat(allreduce, ignore_index=True) if allreduce else pd.DataFrame(), point_params, recorded)
    log.info("report: %r", res)
    return res


def _with_run_info(frame: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Attach each run's batch, rule, warmup and status, and the epoch each step/eval falls at."""
    if frame.empty or runs.empty:
        return frame
    cols = [c for c in ("run", "source", "global_batch", "lr_rule", "warmup_epochs", "status", "train_examples",
                        "replicas") if c in runs.columns]
    out = frame.merge(runs[cols], on=["run", "source"], how="left")
    if {"step", "global_batch", "train_examples"} <= set(out.columns):
        # Epochs = examples seen / training-set size: the axis on which runs with different batches compare.
        out["epoch_frac"] = out["step"] * out["global_batch"] / out["train_examples"]
    return out


# --- tidy frames for the figures ----------------------------------------------------------------------------
def finished(df: pd.DataFrame) -> pd.DataFrame:
    """The rows whose run finished normally (status "ok"); every row when the frame records no status."""
    return df[df["status"] == "ok"] if "status" in df.columns else df


def _varies(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and df[col].dropna().nunique() > 1


def readable(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs whose summary.json could be read: an unreadable one is listed (overview, status counts), not drawn."""
    return runs[runs["status"] != "unreadable"] if "status" in runs.columns else runs


def scaling_runs(res: Results) -> pd.DataFrame:
    """Runs from the sources that compare replica counts."""
    runs = readable(res.runs)
    if runs.empty or "replicas" not in runs.columns:
        return pd.DataFrame()
    keep = [s for s, g in runs.groupby("source") if _varies(g, "replicas")]
    if not keep:
        return pd.DataFrame()
    return runs[runs["source"].isin(keep)]


def batch_runs(res: Results) -> pd.DataFrame:
    """Runs from the sources that compare LR rules, or global batches at a fixed replica count (in a weak
    scaling study the global batch grows with the replicas too: that is not a batch-size study)."""
    runs = readable(res.runs)
    if runs.empty:
        return pd.DataFrame()
    keep = [s for s, g in runs.groupby("source")
            if _varies(g, "lr_rule") or (_varies(g, "global_batch") and not _varies(g, "replicas"))]
    if not keep:
        return pd.DataFrame()
    return runs[runs["source"].isin(keep)]


def scaling_frame(res: Results) -> pd.DataFrame:
    """One row per scaling run with speed-up and efficiency within its group of points that differ only in the
    replica count: the columns of ``scaling.csv`` (see ``tftoolkit.measure.scaling.speedups``)."""
    runs = scaling_runs(res)
    if runs.empty:
        return runs
    return scaling.speedups(runs)


def batch_frames(res: Results) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(steps, evals, finals) of the batch/LR runs."""
    runs = batch_runs(res)
    if runs.empty:
        return pd.DataFrame(), pd.DataFrame(), pd.DataFrame()
    keys = set(zip(runs["source"], runs["run"]))

    def pick(frame):
        if frame.empty:
            return frame
        return frame[[(s, r) in keys for s, r in zip(frame["source"], frame["run"])]]

    evals = pick(res.evals)
    if not evals.empty and {"val_examples", "step"} <= set(evals.columns):
        # The examples the last evaluation counted: what a final accuracy's binomial error needs.
        last = (evals.sort_values("step").groupby(["source", "run"], as_index=False)["val_examples"].last())
        runs = runs.drop(columns=["val_examples"], errors="ignore").merge(last, on=["source", "run"], how="left")
    return pick(res.steps), evals, runs


def discover(paths, out_dir) -> list[Path]:
    """What to report on: ``paths`` when given, else every folder next to ``out_dir`` that holds results.

    A folder holds results when it is a sweep folder (sweep.json), has run directories (summary.json) or an
    all-reduce bench (allreduce.csv) in it; ``out_dir`` itself is left out. So 04_report with no arguments
    reports on notebooks 01-03 run before it in the same ``runs/`` folder, or on every sweep there.
    """
    paths = [Path(p) for p in (paths or [])]
    if paths:
        return paths
    out_dir = Path(out_dir).resolve()
    parent = out_dir.parent
    if not parent.is_dir():
        return []
    found = []
    for d in sorted(p for p in parent.iterdir() if p.is_dir() and p.resolve() != out_dir):
        if (d / "sweep.json").exists() or next(d.rglob("summary.json"), None) or next(d.rglob("allreduce.csv"), None):
            found.append(d)
    return found
