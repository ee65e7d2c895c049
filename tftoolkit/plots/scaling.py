"""Scaling figures: throughput against the ideal line, efficiency, where each step's time goes, images per replica.

Input is a tidy frame with one row per training run (``tftoolkit.experiments.report.results.scaling_frame`` builds it from run
directories; ``scaling.csv`` from ``tftoolkit scale`` has the same columns):

    replicas, images_per_sec, [images_per_sec_uncertainty | uncertainty], [mode], [device_kind],
    [compute_time_s, allreduce_time_s, input_wait_s | input_wait_fraction + step_time_s]

The ideal line is the smallest replica count's throughput times the replica ratio, per mode: weak scaling
(fixed per-replica batch) should multiply images/sec by N; strong scaling (fixed global batch) too, until
each replica's slice gets too small to keep a device busy.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..errors import DataError
from .theme import IDEAL_STYLE, footnote, new_figure, replica_colours, replicas_axis, require, themed

BREAKDOWN_PARTS = (("compute_time_s", "compute"), ("allreduce_time_s", "gradient all-reduce"),
                   ("input_wait_s", "input wait"))
BREAKDOWN_COLOURS = {"compute": "#4c72b0", "gradient all-reduce": "#dd8452", "input wait": "#8c8c8c"}


def _uncertainty(df: pd.DataFrame) -> pd.Series:
    for col in ("images_per_sec_uncertainty", "uncertainty"):
        if col in df.columns:
            return df[col].astype(float)
    return pd.Series(np.nan, index=df.index)


def configurations(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """One (label, rows) per line or bar set to draw: per scaling mode and, where a frame has them, per group of runs
    that differ only in replica count (``tftoolkit.measure.scaling``'s ``group``): configurations are never averaged
    together. The label ("weak scaling, model=small_cnn") is "" for a frame without mode or group."""
    keys = [c for c in ("mode", "group") if c in df.columns]
    if not keys:
        return [("", df)]
    out = []
    for key, rows in df.groupby([df[c].fillna("").astype(str) for c in keys], sort=False):
        key = key if isinstance(key, tuple) else (key,)
        out.append((", ".join(f"{k} scaling" if c == "mode" else k for c, k in zip(keys, key) if k), rows))
    return out


def _means(rows: pd.DataFrame) -> pd.DataFrame:
    """Per replica count: the mean rate of the runs there (repeats, e.g. seeds) and its standard error (the repeats'
    spread / sqrt(n) when there are several, else the run's own uncertainty)."""
    err = _uncertainty(rows)
    out = []
    for n, at in rows.groupby("replicas"):
        ips = at["images_per_sec"].astype(float)
        e = float(ips.std(ddof=1) / math.sqrt(len(ips))) if len(ips) > 1 else float(err.loc[at.index].iloc[0])
        out.append({"replicas": n, "ips": float(ips.mean()), "err": e})
    return pd.DataFrame(out).sort_values("replicas").reset_index(drop=True)


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    """Runs with a usable throughput (failed runs have none; diverged runs still measured their speed)."""
    keep = df["images_per_sec"].astype(float).gt(0)
    if "status" in df.columns:
        keep &= df["status"].isin(["ok", "diverged"])
    return df[keep]


def _device_note(df: pd.DataFrame) -> str:
    kinds = sorted(set(df["device_kind"].dropna().astype(str))) if "device_kind" in df.columns else []
    if kinds == ["CPU-simulated"]:
        return " (CPU-simulated replicas share the host's cores: no speed-up is expected)"
    return f" ({', '.join(kinds)})" if kinds else ""


@themed
def plot_throughput(df: pd.DataFrame) -> Figure:
    """Images/sec against replicas, with error bars, the ideal-scaling line and each point's efficiency."""
    require(df, ["replicas", "images_per_sec"], "throughput plot")
    data = _ok(df)
    if data.empty:
        raise DataError("throughput plot: no run finished with a throughput (all failed?)")
    fig, ax = new_figure(width=6.4, height=4.2)
    series = configurations(data)
    markers = ["o", "s", "^", "D"]
    for k, (name, rows) in enumerate(series):
        if rows.empty:
            continue
        agg = _means(rows)
        agg["err"] = agg["err"].fillna(0.0)
        label = f"measured ({name})" if name else "measured"
        colour = f"C{k}"
        ax.errorbar(agg["replicas"], agg["ips"], yerr=agg["err"], marker=markers[k % 4], color=colour, capsize=3,
                    lw=1.8, label=label)
        base_n, base = float(agg["replicas"].iloc[0]), float(agg["ips"].iloc[0])
        xs = np.array(sorted(agg["replicas"]), dtype=float)
        ideal = "ideal: N x 1-replica rate" if base_n == 1 else f"ideal: N/{base_n:g} x {base_n:g}-replica rate"
        ax.plot(xs, base * xs / base_n, **{**IDEAL_STYLE, "color": colour if len(series) > 1 else IDEAL_STYLE["color"]},
                label=ideal + (f" ({name})" if name and len(series) > 1 else ""))
        for n, ips in zip(agg["replicas"], agg["ips"]):
            if n == base_n:
                continue
            eff = ips / (base * n / base_n)
            ax.annotate(f"{eff:.0%}", (n, ips), textcoords="offset points", xytext=(6, -12), fontsize=8, color=colour)
    replicas_axis(ax, data["replicas"])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("replicas (N)")
    ax.set_ylabel("throughput (images/s)")
    ax.set_title("Training throughput vs replicas")
    footnote(fig, "percentages: scaling efficiency = speed-up / (N/N₀)" + _device_note(data))
    ax.legend(loc="upper left")
    return fig


@themed
def plot_efficiency(df: pd.DataFrame) -> Figure:
    """Scaling efficiency (speed-up / N) against replicas; 100% is perfect scaling."""
    require(df, ["replicas", "images_per_sec"], "efficiency plot")
    data = _ok(df)
    if data.empty:
        raise DataError("efficiency plot: no run finished with a throughput")
    fig, ax = new_figure(width=6.0, height=3.8)
    for k, (name, rows) in enumerate(configurations(data)):
        agg = _means(rows)
        if agg.empty:
            continue
        base_n, base = float(agg["replicas"].iloc[0]), float(agg["ips"].iloc[0])
        eff = agg["ips"] / (base * agg["replicas"].to_numpy(dtype=float) / base_n) * 100
        ax.plot(agg["replicas"], eff.values, marker="o", color=f"C{k}", lw=1.8, label=name or "measured")
    ax.axhline(100, **IDEAL_STYLE, label="ideal (100%)")
    replicas_axis(ax, data["replicas"])
    ax.set_ylim(0, max(110, ax.get_ylim()[1]))
    ax.set_xlabel("replicas (N)")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_title("Scaling efficiency = speed-up / N")
    ax.legend(loc="lower left")
    note = _device_note(data)
    if note:
        footnote(fig, note.strip(" ()"))
    return fig


def breakdown_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Long frame (group, replicas, part, ms) of compute / all-reduce / input wait per step, averaged over the runs
    of one configuration (``configurations``: its label is ``group``) at one replica count."""
    require(df, ["replicas", "compute_time_s", "allreduce_time_s"], "step-time breakdown")
    data = df.copy()
    if "input_wait_s" not in data.columns:
        if {"input_wait_fraction", "step_time_s"} <= set(data.columns):
            data["input_wait_s"] = data["input_wait_fraction"] * data["step_time_s"]
        else:
            data["input_wait_s"] = 0.0
    rows = []
    for name, runs in configurations(data):
        for n, g in runs.groupby("replicas"):
            for col, part in BREAKDOWN_PARTS:
                v = g[col].astype(float).mean()
                rows.append({"group": name, "replicas": int(n), "part": part,
                             "ms": float(v) * 1e3 if v == v else math.nan})
    out = pd.DataFrame(rows, columns=["group", "replicas", "part", "ms"])
    if out.loc[out["part"] != "input wait", "ms"].isna().all():
        raise DataError("step-time breakdown: compute_time_s / allreduce_time_s are empty (runs made with measure off?)")
    return out


@themed
def plot_step_breakdown(df: pd.DataFrame) -> Figure:
    """Stacked bars: milliseconds per step spent computing, all-reducing gradients and waiting for input; one set of
    bars per configuration (named under its bars when there are several)."""
    long = breakdown_frame(df)
    wide = long.pivot_table(index=["group", "replicas"], columns="part", values="ms", sort=False).fillna(0.0)
    groups = list(dict.fromkeys(long["group"]))
    wide = wide.reindex(pd.MultiIndex.from_tuples(
        [(g, n) for g in groups for n in sorted(wide.loc[g].index)], names=["group", "replicas"]))
    # A gap of one bar between configurations, so that each one's bars read as a set.
    x = np.array([i + groups.index(g) for i, (g, _) in enumerate(wide.index)], dtype=float)
    fig, ax = new_figure(width=max(6.0, 0.9 * len(x) + 2.0), height=4.0)
    bottom = np.zeros(len(wide))
    for _, part in BREAKDOWN_PARTS:
        vals = wide[part].to_numpy() if part in wide.columns else np.zeros(len(wide))
        ax.bar(x, vals, bottom=bottom, width=0.6, label=part, color=BREAKDOWN_COLOURS[part])
        bottom += vals
    for xi, total in zip(x, bottom):
        ax.annotate(f"{total:.1f} ms", (xi, total), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{n}" for _, n in wide.index])
    if len(groups) > 1:
        for g in groups:
            at = x[[k for k, (gg, _) in enumerate(wide.index) if gg == g]]
            ax.annotate(g, (float(at.mean()), 0), xycoords=("data", "axes fraction"), xytext=(0, -28),
                        textcoords="offset points", ha="center", va="top", fontsize=8)
        ax.xaxis.labelpad = 18
    ax.set_xlabel("replicas (N)")
    ax.set_ylabel("time per training step (ms)")
    ax.set_ylim(0, bottom.max() * 1.15 if bottom.max() > 0 else 1)
    ax.set_title("Where each step's time goes")
    ax.legend(loc="upper left")
    ax.grid(axis="x", visible=False)
    return fig


def replica_examples_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Long frame (replicas, replica, examples) from runs with an ``examples_per_replica`` list column."""
    require(runs, ["replicas", "examples_per_replica"], "images per replica")
    rows = []
    for _, r in runs.iterrows():
        counts = r["examples_per_replica"]
        if isinstance(counts, str):
            counts = json.loads(counts)
        if counts is None or (isinstance(counts, float) and math.isnan(counts)):
            continue
        for i, c in enumerate(counts):
            rows.append({"replicas": int(r["replicas"]), "replica": i, "examples": int(c)})
    return pd.DataFrame(rows, columns=["replicas", "replica", "examples"])


@themed
def plot_images_per_replica(df: pd.DataFrame) -> Figure:
    """Examples each replica trained on, one group of bars per replica count: equal bars = balanced split.

    ``df``: long frame (replicas, replica, examples) as ``replica_examples_frame`` returns.
    """
    require(df, ["replicas", "replica", "examples"], "images per replica")
    counts = sorted(df["replicas"].unique())
    colours = replica_colours(counts)
    fig, ax = new_figure(width=6.4, height=3.8)
    ticks, labels = [], []
    x0 = 0.0
    for n in counts:
        g = df[df["replicas"] == n].groupby("replica")["examples"].mean().sort_index()
        width = 0.8 / max(len(g), 1)
        xs = x0 + (np.arange(len(g)) - (len(g) - 1) / 2) * width
        ax.bar(xs, g.values, width=width * 0.9, color=colours[n])
        for xi, v in zip(xs, g.values):
            ax.annotate(f"{v:,.0f}", (xi, v), textcoords="offset points", xytext=(0, 2), ha="center", va="bottom",
                        fontsize=7, rotation=90 if len(g) > 2 else 0)
        ticks.append(x0)
        labels.append(f"N = {n}")
        x0 += 1.0
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels)
    ax.set_xlabel("run (bars: one per replica, left to right)")
    ax.set_ylabel("examples trained per replica")
    ax.set_ylim(0, df["examples"].max() * 1.25)
    ax.set_title("Images per replica (equal bars = balanced split)")
    ax.grid(axis="x", visible=False)
    return fig
