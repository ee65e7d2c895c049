"""The report: read sweep folders and run directories, build tidy frames, draw the figures.

    res = report.load(["runs/demo/scaling", "runs/demo/batch_lr"])
    report.overview(res)                               # every sweep point: what varied, status, images/sec, ...
    report.save_tables(res, "out")                     # runs.csv, points.csv (every column), scaling.csv
    report.figure(res, "throughput", "out/figures")    # a Figure (also saved as PNG + SVG), or None

Only files are read (results.csv, summary.json, config.json, steps.csv, evals.csv, scaling.csv, allreduce.csv,
monitor.csv): no TensorFlow, so a report renders on a laptop from results copied off a GPU server.

Which runs feed which figure is decided by the data, per source folder: a folder whose runs differ in replica
count feeds the scaling figures; one whose runs differ in LR rule, or in global batch at one replica count,
feeds the training-curve figures. A folder with both (or a single study) feeds whatever it can. Figures without data are skipped with
a log line saying why, never drawn empty.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .. import fileio, rundir, scaling
from .. import summary as summary_schema
from ..errors import DataError

log = logging.getLogger("tftoolkit")

# Summary fields points.csv puts first, in this order, where present (every other column follows them).
KEY_FIGURES = ["replicas", "global_batch", "lr_rule", "learning_rate", "images_per_sec", "images_per_sec_uncertainty",
               "final_loss", "val_accuracy", "communication_fraction", "mfu", "input_headroom", "input_verdict",
               "wall_time_s"]
summary_schema.names(*KEY_FIGURES)
# The summary fields the overview shows of each point besides what varied and its status (what a reader compares),
# declared so that a renamed field fails here rather than leaving a blank column.
COMPARED = summary_schema.names("images_per_sec", "images_per_sec_uncertainty", "val_accuracy", "input_headroom",
                                "input_verdict")


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
        return fileio.read_json(path)
    except (OSError, ValueError):
        return {}


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
        summary = summary_schema.read(run_dir)
    except (OSError, ValueError):
        summary = {}
    config = _read_json(run_dir / "config.json").get("config", {})
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
        elif not isinstance(v, (list, dict)):
            row[k] = v
    row.setdefault("status", "failed" if not summary else "ok")
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
                allreduce.append(t.assign(source=src.name, file=str(ar)))
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
def _varies(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and df[col].dropna().nunique() > 1


def scaling_runs(res: Results) -> pd.DataFrame:
    """Runs from the sources that compare replica counts."""
    if res.runs.empty or "replicas" not in res.runs.columns:
        return pd.DataFrame()
    keep = [s for s, g in res.runs.groupby("source") if _varies(g, "replicas")]
    if not keep:
        return pd.DataFrame()
    return res.runs[res.runs["source"].isin(keep)]


def batch_runs(res: Results) -> pd.DataFrame:
    """Runs from the sources that compare LR rules, or global batches at a fixed replica count (in a weak
    scaling study the global batch grows with the replicas too: that is not a batch-size study)."""
    if res.runs.empty:
        return pd.DataFrame()
    keep = [s for s, g in res.runs.groupby("source")
            if _varies(g, "lr_rule") or (_varies(g, "global_batch") and not _varies(g, "replicas"))]
    if not keep:
        return pd.DataFrame()
    return res.runs[res.runs["source"].isin(keep)]


def scaling_frame(res: Results) -> pd.DataFrame:
    """One row per scaling run with speed-up and efficiency within its group of points that differ only in the
    replica count: the columns of ``scaling.csv`` (see ``tftoolkit.scaling.speedups``)."""
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

    return pick(res.steps), pick(res.evals), runs


# --- figures ------------------------------------------------------------------------------------------------
def _scaling(res) -> pd.DataFrame:
    df = scaling_frame(res)
    if df.empty:
        raise DataError("no runs comparing replica counts in these folders (a scaling sweep or notebook 01 makes them)")
    return df


def _batch(res):
    steps, evals, runs = batch_frames(res)
    if runs.empty:
        raise DataError("no runs comparing global batches or LR rules in these folders (a batch/LR sweep or "
                        "notebook 02 makes them)")
    return steps, evals, runs


def _allreduce(res) -> pd.DataFrame:
    if res.allreduce.empty:
        raise DataError("no allreduce.csv in these folders (`tftoolkit bench allreduce --out DIR`, notebook 00 or "
                        "03 makes one; add its folder)")
    return res.allreduce


def _fig_throughput(res):
    from ..plots import scaling

    return scaling.plot_throughput(_scaling(res))


def _fig_efficiency(res):
    from ..plots import scaling

    return scaling.plot_efficiency(_scaling(res))


def _fig_breakdown(res):
    from ..plots import scaling

    return scaling.plot_step_breakdown(_scaling(res))


def _fig_per_replica(res):
    from ..plots import scaling

    return scaling.plot_images_per_replica(scaling.replica_examples_frame(_scaling(res)))


def _fig_monitor(res):
    from ..measure.monitor import read_monitor
    from ..plots.monitor import plot_monitor_timeseries

    runs = scaling_frame(res)
    if runs.empty:
        runs = res.runs
    if runs.empty:
        raise DataError("no runs")
    import matplotlib

    from ..plots.theme import rc_params

    biggest = runs.sort_values("replicas").iloc[-1]
    with matplotlib.rc_context(rc_params()):  # the report's look, for a figure drawn by plots.monitor
        fig = plot_monitor_timeseries(read_monitor(Path(biggest["run_dir"])))
        fig.axes[0].set_title(f"the {int(biggest['replicas'])}-replica run ({biggest['run']})", loc="left", fontsize=9)
    return fig


def _fig_comm_vs_compute(res):
    from ..plots import comm

    return comm.plot_comm_vs_compute(_scaling(res))


def _fig_loss(res):
    from ..plots import training

    steps, _, _ = _batch(res)
    return training.plot_loss_curves(steps)


def _fig_val_accuracy(res):
    from ..plots import training

    _, evals, runs = _batch(res)
    return training.plot_val_accuracy_curves(evals, runs)


def _fig_final_accuracy(res):
    from ..plots import training

    _, _, runs = _batch(res)
    return training.plot_final_accuracy_vs_batch(runs)


def _fig_allreduce_time(res):
    from ..plots import comm

    return comm.plot_allreduce_time(_allreduce(res))


def _fig_busbw(res):
    from ..plots import comm

    return comm.plot_busbw(_allreduce(res))


FIGURES = {
    "throughput": _fig_throughput,
    "efficiency": _fig_efficiency,
    "step_breakdown": _fig_breakdown,
    "images_per_replica": _fig_per_replica,
    "monitor": _fig_monitor,
    "comm_vs_compute": _fig_comm_vs_compute,
    "loss_curves": _fig_loss,
    "val_accuracy": _fig_val_accuracy,
    "final_accuracy": _fig_final_accuracy,
    "allreduce_time": _fig_allreduce_time,
    "busbw": _fig_busbw,
}


# One sentence under each figure in the report: what it shows and how to read it.
CAPTIONS = {
    "throughput": "Images per second against replicas, with the ideal line (N x the smallest count's rate); error "
                  "bars are the standard error over timed loops, labels the scaling efficiency.",
    "efficiency": "Scaling efficiency: speed-up over the ideal speed-up. 100% is perfect data parallelism.",
    "step_breakdown": "Where each step's time goes: compute (the step without the all-reduce), the gradient "
                      "all-reduce the step pays, and waiting for input.",
    "images_per_replica": "Images each replica trained on: equal bars mean the split was even.",
    "monitor": "The hardware monitor over the largest run: GPU utilisation and memory, or the host's CPU when the "
               "replicas are simulated.",
    "comm_vs_compute": "Compute and all-reduce time per step as replicas grow: where the all-reduce passes the "
                       "compute, adding replicas stops paying.",
    "loss_curves": "Training loss against epochs, one panel per LR rule, one colour per global batch; a red x marks "
                   "a run that diverged or failed where it stopped.",
    "val_accuracy": "Validation accuracy after each epoch, per LR rule and global batch (dashed: with warmup).",
    "final_accuracy": "Final validation accuracy against global batch, one line per LR rule and warmup: the "
                      "batch-size study's result at one glance.",
    "allreduce_time": "All-reduce time against message size, per implementation; stars are the models' own "
                      "gradient sets.",
    "busbw": "Bus bandwidth (nccl-tests' busbw = algbw x 2(n-1)/n) against message size: comparable to a link's "
             "rated bandwidth.",
}


# The report's sections, in order: a title and the figures that belong to it. A section whose figures have no data
# in these results is left out entirely (no heading, no "not in these results" lines).
SECTIONS = {
    "scaling": ("Data-parallel scaling", ["throughput", "efficiency", "step_breakdown", "images_per_replica", "monitor"]),
    "communication": ("Communication", ["comm_vs_compute", "allreduce_time", "busbw"]),
    "batch": ("Batch size and learning rate", ["loss_curves", "val_accuracy", "final_accuracy"]),
    "recorded": ("Recorded results", []),  # what a sweep's own notebook wrote to results.json
}


def _section_notes(res: Results, name: str) -> list[str]:
    """Paragraphs a section needs for these results only (none when they do not apply)."""
    notes = []
    if name == "scaling":
        runs = scaling_runs(res)
        if not runs.empty and (runs.get("device_kind") == "CPU-simulated").any():
            notes.append("These replicas were simulated on CPU and share the host's cores, so no speed-up is "
                         "expected: the figures show the method; run the scaling sweep on GPUs for the real curve.")
    if name == "batch":
        runs = batch_runs(res)
        if not runs.empty and {"final_loss_mean10", "num_classes"} <= set(runs.columns):
            chance = runs[runs["final_loss_mean10"] >= 0.9 * np.log(runs["num_classes"].clip(lower=2))]
            if len(chance):
                notes.append(f"{len(chance)} run(s) ended with the loss near ln(classes) (chance): they learned "
                             "nothing; their learning rate was too large to train without warmup, yet not so large "
                             "that the loss blew up.")
    return notes


def section(res: Results, name: str, save_to=None) -> None:
    """Display one section of the report (in a notebook): its title, what applies to these results, and each figure
    with its caption; nothing at all when the results hold no data for it."""
    from IPython.display import Markdown, display

    if name not in SECTIONS:
        raise DataError(f"unknown section {name!r}; choose one of {', '.join(SECTIONS)}")
    title, names = SECTIONS[name]
    if name == "recorded":
        table = recorded(res)
        if table.empty:
            return
        display(Markdown(f"## {title}\n\nWhat each point's notebook recorded in `results.json`, by parameter."))
        display(table)
        fig = _recorded_figure(res, table, save_to)
        if fig is not None:
            _display_figure(fig, "recorded", save_to)
            display(Markdown("*Figure: each numeric result against each swept parameter; a red x is a point that did "
                             "not finish.*"))
        return
    figs = [(n, figure(res, n, save_to)) for n in names]
    figs = [(n, f) for n, f in figs if f is not None]
    if not figs:
        return
    display(Markdown("\n\n".join([f"## {title}"] + _section_notes(res, name))))
    for n, fig in figs:
        _display_figure(fig, n, save_to)
        display(Markdown(f"*Figure: {CAPTIONS[n]}*"))


def _recorded_figure(res: Results, table: pd.DataFrame, save_to=None):
    from ..plots import results as results_plots

    params = [c for src in table["source"].unique() for c in res.point_params.get(src, [])]
    cols = [c for src in table["source"].unique() for c in res.recorded.get(src, [])]
    try:
        fig = results_plots.recorded(table, list(dict.fromkeys(params)), list(dict.fromkeys(cols)))
    except DataError as e:
        log.info("figure recorded skipped: %s", e)
        return None
    if save_to is not None:
        from ..plots.theme import save_figure

        save_figure(fig, save_to, "recorded")
    return fig


def _display_figure(fig, name: str, save_to=None) -> None:
    from IPython.display import display
    import matplotlib.pyplot as plt

    display(_saved_png(Path(save_to) / f"{name}.png") if save_to is not None else fig)
    plt.close(fig)


def show(res: Results, name: str, save_to=None) -> None:
    """Display figure ``name`` with its caption below it (in a notebook), or a line saying why it is not there."""
    from IPython.display import Markdown, display

    fig = figure(res, name, save_to)
    if fig is None:
        display(Markdown(f"*{name.replace('_', ' ')}: not in these results.*"))
        return
    if save_to is not None:
        display(_saved_png(Path(save_to) / f"{name}.png"))
    else:
        display(fig)
    display(Markdown(f"*Figure: {CAPTIONS[name]}*"))
    import matplotlib.pyplot as plt

    plt.close(fig)


def _saved_png(path: Path):
    """The PNG just saved, to display instead of the figure: the inline backend would render it a third time
    (after PNG and SVG), a third of a report's time. Shown at the size inline figures have (figure.dpi), so
    the page looks the same, only sharper (the file is at savefig.dpi)."""
    from IPython.display import Image

    from ..plots.theme import rc_params

    data = path.read_bytes()
    width_px = int.from_bytes(data[16:20], "big")  # the IHDR chunk: width, then height, big-endian
    rc = rc_params()
    return Image(data=data, format="png", width=round(width_px * rc["figure.dpi"] / rc["savefig.dpi"]))


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


def figure(res: Results, name: str, save_to=None):
    """Figure ``name`` (one of FIGURES) from ``res``, saved as PNG + SVG into ``save_to`` when given.

    Returns None, with a log line saying why, when the results hold no data for it.
    """
    if name not in FIGURES:
        raise DataError(f"unknown figure {name!r}; choose one of {', '.join(FIGURES)}")
    try:
        fig = FIGURES[name](res)
    except DataError as e:
        log.info("figure %s skipped: %s", name, e)
        return None
    except (KeyError, ValueError) as e:
        log.info("figure %s skipped: the results lack what it needs (%s: %s)", name, type(e).__name__, e)
        return None
    if save_to is not None:
        from ..plots.theme import save_figure

        save_figure(fig, save_to, name)
    return fig


def all_figures(res: Results, save_to=None) -> dict:
    """Every figure the results have data for: {name: Figure}."""
    out = {}
    for name in FIGURES:
        fig = figure(res, name, save_to)
        if fig is not None:
            out[name] = fig
    return out


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
    return f"{ips:,.0f} ± {se:,.0f}" if _finite(se) else f"{ips:,.0f}"


def _headroom(r) -> str:
    h, verdict = r.get("input_headroom"), r.get("input_verdict")
    if not _finite(h):
        return ""
    return f"{h:.2f} ({verdict})" if isinstance(verdict, str) and verdict else f"{h:.2f}"


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
        out.insert(len(out.columns) - 1, "val accuracy",
                   [f"{v:.1%}" if _finite(v) else "" for v in full["val_accuracy"]])
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
