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
from ..measure.parts import Part
from ..measure.stats import NOISE_SIGMAS
from .theme import IDEAL_STYLE, device_note, footnote, new_figure, replica_colours, replicas_axis, require, themed

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
    footnote(fig, "percentages: scaling efficiency = speed-up / (N/N₀)" + device_note(data))
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
        # Each point's standard error: both rates' relative errors, added in quadrature (the base point is exact).
        rel = np.sqrt((agg["err"] / agg["ips"]) ** 2 + (float(agg["err"].iloc[0]) / base) ** 2)
        err = (eff * rel).where(agg["replicas"] != base_n, 0.0)
        if err.notna().any():
            ax.errorbar(agg["replicas"], eff.values, yerr=err.fillna(0.0).values, fmt="none", color=f"C{k}",
                        capsize=3, lw=1.0)
    ax.axhline(100, **IDEAL_STYLE, label="ideal (100%)")
    replicas_axis(ax, data["replicas"])
    ax.set_ylim(0, max(110, ax.get_ylim()[1]))
    ax.set_xlabel("replicas (N)")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_title("Scaling efficiency = speed-up / N")
    ax.legend(loc="lower left")
    note = device_note(data).strip(" ()")
    footnote(fig, "error bars: 1 standard error of the throughput ratio" + (f"; {note}" if note else ""))
    return fig


PART_STATUS = {"compute": "compute_time_status", "gradient all-reduce": "allreduce_time_status",
               "input wait": "input_wait_status"}


def training_step_ms(g: pd.DataFrame) -> float:
    """Training's step as the throughput figure has it: global batch / images_per_sec (the mean step of the timed
    calls, stats.throughput), so that the breakdown's tick and the throughput describe the same steps; where the
    batch is not in the frame, training's median step (step_time_s)."""
    if {"global_batch", "images_per_sec"} <= set(g.columns):
        ms = float((g["global_batch"].astype(float) / g["images_per_sec"].astype(float)).mean()) * 1e3
        if ms == ms:
            return ms
    return float(g["step_time_s"].astype(float).mean()) * 1e3 if "step_time_s" in g.columns else math.nan


def breakdown_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Long frame (group, replicas, part, ms, err_ms, status, step_ms, step_err_ms, training_step_ms) of compute /
    all-reduce / input wait per step, averaged over the runs of one configuration (``configurations``: its label is
    ``group``) at one replica count. ``status``: measured, within noise or failed, by the runs' own rule
    (measure.parts.Part: within 2 errors above 0 or 3 below it is within noise), failed too where a run's part failed; ``step_ms`` is the step the parts split, ``training_step_ms``
    training's own, as the throughput has it (``training_step_ms``)."""
    require(df, ["replicas", "compute_time_s", "allreduce_time_s"], "step-time breakdown")
    data = df.copy()
    if "input_wait_s" not in data.columns:
        if {"input_wait_fraction", "step_time_s"} <= set(data.columns):
            data["input_wait_s"] = data["input_wait_fraction"] * data["step_time_s"]
        else:
            data["input_wait_s"] = 0.0

    def mean_ms(g, col):  # (mean, its standard error from the runs' own errors) in ms
        v = g[col].astype(float) if col in g.columns else pd.Series(np.nan, index=g.index)
        e_col = col[:-2] + "_uncertainty_s"
        e = g[e_col].astype(float) if e_col in g.columns else pd.Series(np.nan, index=g.index)
        return float(v.mean()) * 1e3, float(np.sqrt((e ** 2).sum(min_count=1)) / len(g)) * 1e3

    rows = []
    for name, runs in configurations(data):
        for n, g in runs.groupby("replicas"):
            step, step_err = mean_ms(g, "breakdown_step_time_s")
            train = training_step_ms(g)
            for col, part in BREAKDOWN_PARTS:
                ms, err = mean_ms(g, col)
                statuses = set(g[PART_STATUS[part]].dropna()) if PART_STATUS[part] in g.columns else set()
                if "failed" in statuses or (ms != ms and statuses):
                    status = "failed"
                else:  # the runs' own rule (measure.parts.Part): a negative mean is never measured
                    status = Part(ms, err).status if err == err and ms == ms else "measured"
                rows.append({"group": name, "replicas": int(n), "part": part, "ms": ms, "err_ms": err,
                             "status": status, "step_ms": step, "step_err_ms": step_err, "training_step_ms": train})
    out = pd.DataFrame(rows, columns=["group", "replicas", "part", "ms", "err_ms", "status", "step_ms", "step_err_ms",
                                      "training_step_ms"])
    if out.loc[out["part"] != "input wait", "ms"].isna().all() and not (out["status"] == "failed").any():
        raise DataError("step-time breakdown: compute_time_s / allreduce_time_s are empty (runs made with measure off?)")
    return out


@themed
def plot_step_breakdown(df: pd.DataFrame) -> Figure:
    """Stacked bars: milliseconds per step spent computing, all-reducing gradients and waiting for input, each with its
    error bar; a part within noise is drawn hollow and hatched (its size is not known, only that it is small), a
    failed part is written "failed" and not drawn. A black tick marks the step the parts split (with its error), a
    dashed one training's own step where it differs. One set of bars per configuration."""
    long = breakdown_frame(df)
    keys = list(dict.fromkeys(zip(long["group"], long["replicas"])))
    groups = list(dict.fromkeys(long["group"]))
    keys = [(g, n) for g in groups for n in sorted(n for gg, n in keys if gg == g)]
    # A gap of one bar between configurations, so that each one's bars read as a set.
    x = np.array([i + groups.index(g) for i, (g, _) in enumerate(keys)], dtype=float)
    fig, ax = new_figure(width=max(6.0, 0.9 * len(x) + 2.0), height=4.2)
    top = np.zeros(len(keys))
    labelled = set()
    for i, key in enumerate(keys):
        at = long[(long["group"] == key[0]) & (long["replicas"] == key[1])].set_index("part")
        bottom, failed = 0.0, []
        for _, part in BREAKDOWN_PARTS:
            if part not in at.index:
                continue
            r = at.loc[part]
            if r["status"] == "failed":
                failed.append(part)
                continue
            h = max(float(r["ms"]), 0.0) if r["ms"] == r["ms"] else 0.0
            noisy = r["status"] == "within noise"
            label = part + (" (within noise: hollow)" if noisy else "")
            if h == 0 and not noisy:  # a zero bar (one replica's all-reduce): no legend entry for what is not drawn
                label = "zero"
            colour = BREAKDOWN_COLOURS[part]
            ax.bar(x[i], h, bottom=bottom, width=0.6, color="none" if noisy else colour, edgecolor=colour,
                   hatch="//" if noisy else None, lw=1.2, label=None if label in labelled | {"zero"} else label)
            labelled.add(label)
            if r["err_ms"] == r["err_ms"] and r["err_ms"] > 0:
                ax.errorbar(x[i] + 0.18, bottom + h, yerr=r["err_ms"], color="#333333", capsize=2, lw=0.9, fmt="none")
            bottom += h
        step, step_err, train = (float(at[c].iloc[0]) for c in ("step_ms", "step_err_ms", "training_step_ms"))
        if step == step:
            ax.errorbar(x[i] - 0.34, step, yerr=step_err if step_err == step_err else None, fmt="_", color="black",
                        ms=12, capsize=2, label=None if "step" in labelled else "the step the parts split")
            labelled.add("step")
        if train == train and step == step and abs(train - step) > NOISE_SIGMAS * (step_err if step_err == step_err
                                                                                    else 0.0):
            ax.plot([x[i] - 0.34], [train], marker="_", ms=12, color="black", ls="none", alpha=0.5,
                    label=None if "train" in labelled else "training's step (batch / images/sec)")
            labelled.add("train")
        timed = step == step or at["ms"].notna().any()
        text = (f"step {step:.1f}" + (f" ± {step_err:.1f}" if step_err == step_err else "") + " ms" if step == step
                else f"{bottom:.1f} ms" if timed else "not measured")  # a run left its breakdown out (its budget)
        text += "\n" + ", ".join(failed) + " failed" if failed else ""
        ax.annotate(text, (x[i], bottom), textcoords="offset points", xytext=(0, 4), ha="center",
                    fontsize=8, color="#b22222" if failed else "black")
        total = step if step == step else bottom
        top[i] = max(bottom, total, train if train == train else 0.0)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{n}" for _, n in keys])
    if len(groups) > 1:
        for g in groups:
            at = x[[k for k, (gg, _) in enumerate(keys) if gg == g]]
            ax.annotate(g, (float(at.mean()), 0), xycoords=("data", "axes fraction"), xytext=(0, -28),
                        textcoords="offset points", ha="center", va="top", fontsize=8)
        ax.xaxis.labelpad = 18
    ax.set_xlabel("replicas (N)")
    ax.set_ylabel("time per training step (ms)")
    ax.set_ylim(0, top.max() * 1.25 if top.max() > 0 else 1)
    ax.set_title("Where each step's time goes")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(axis="x", visible=False)
    note = device_note(df).strip(" ()")
    footnote(fig, "error bars: 1 standard error (bootstrap over interleaved rounds)" + (f"; {note}" if note else ""))
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
