"""Figures of the scaling model (``tftoolkit.predict``): efficiency vs replicas per interconnect, and
predicted vs measured step time.

Inputs are the tidy frames ``predict.predict`` (prediction.csv) and ``predict.compare``
(prediction_vs_measured.csv) return.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .theme import IDEAL_STYLE, new_figure, replicas_axis, require, themed


@themed
def efficiency(frame: pd.DataFrame) -> Figure:
    """Predicted scaling efficiency against replicas, one line per interconnect scenario; a marker where
    the all-reduce first takes longer than the compute; hosts boundaries shaded."""
    if frame is not None and len(frame) == 0 and frame.attrs.get("why"):
        # predict refused the forecast: say why instead of an empty plot.
        fig, ax = new_figure(1, width=11.0, height=2.2)
        ax.axis("off")
        ax.text(0.5, 0.5, "No forecast: " + frame.attrs["why"], ha="center", va="center", wrap=True, fontsize=9)
        return fig
    require(frame, ["scenario", "replicas", "efficiency", "comm_exceeds_compute"], "efficiency vs replicas")
    fig, (ax, ax2) = new_figure(2, width=11.0, height=4.2)
    for name, g in frame.groupby("scenario", sort=False):
        g = g.sort_values("replicas")
        line, = ax.plot(g["replicas"], g["efficiency"], marker=".", label=name)
        over = g[g["comm_exceeds_compute"]]
        if len(over):
            first = over.iloc[0]
            ax.plot([first["replicas"]], [first["efficiency"]], marker="o", ms=9, mfc="none", color=line.get_color())
        ax2.plot(g["replicas"], g["speedup"], marker=".", color=line.get_color(), label=name)
    reps = sorted(frame["replicas"].unique())
    ax2.plot(reps, reps, label="ideal (linear)", **IDEAL_STYLE)
    ticks = [r for r in reps if r in (1, 2, 4, 8, 16, 32, 64, 128)] or reps
    for a in (ax, ax2):
        replicas_axis(a, ticks)
        a.set_xlabel("replicas (GPUs)")
    multi = frame[frame["hosts"] > 1] if "hosts" in frame.columns else frame.iloc[0:0]
    if len(multi):
        first_multi = multi["replicas"].min()
        single = frame.loc[frame["hosts"] == 1, "replicas"]
        edge = (single.max() * first_multi) ** 0.5 if len(single) else first_multi / 2**0.15
        for a in (ax, ax2):
            a.axvspan(edge, max(reps) * 2**0.3, color="0.9", zorder=0, lw=0)
        ax.text(first_multi, 0.02, " several hosts", va="bottom", ha="left", fontsize=8, color="0.35")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("scaling efficiency (speedup / N)")
    ax.set_title("Predicted efficiency (circle: all-reduce > compute)")
    ax2.set_yscale("log", base=2)
    ax2.set_ylabel("speedup over 1 replica")
    ax2.set_title("Predicted speedup")
    ax.legend(fontsize=8, loc="lower left")
    ax2.legend(fontsize=8, loc="upper left")
    return fig


@themed
def predicted_vs_measured(frame: pd.DataFrame) -> Figure:
    """Measured step time (with its uncertainty) and the model's prediction, split into compute and
    all-reduce, at each measured replica count; the relative error printed above each point."""
    require(frame, ["replicas", "step_time_s", "predicted_step_time_s", "predicted_compute_s", "error"],
            "predicted vs measured")
    df = frame.sort_values("replicas")
    fig, ax = new_figure(width=6.4, height=4.2)
    x = df["replicas"].to_numpy()
    ms = 1e3
    ax.plot(x, df["predicted_step_time_s"] * ms, marker="s", color="#dd8452", label="predicted step")
    ax.plot(x, df["predicted_compute_s"] * ms, ls=":", color="#4c72b0", label="predicted compute part")
    yerr = df["step_time_uncertainty_s"].to_numpy() * ms if "step_time_uncertainty_s" in df.columns else None
    if yerr is not None and not np.isfinite(yerr).any():
        yerr = None
    # A step time tftoolkit did not measure (a hand-written summary.json, a table) is drawn hollow and labelled so.
    ours = (df["measured_by_tftoolkit"].fillna(False).astype(bool).to_numpy() if "measured_by_tftoolkit" in df.columns
            else np.ones(len(df), dtype=bool))
    for mask, face, label in ((ours, "black", "measured step"),
                              (~ours, "none", "reported step (not measured by tftoolkit)")):
        if mask.any():
            ax.errorbar(x[mask], (df["step_time_s"] * ms).to_numpy()[mask],
                        yerr=None if yerr is None else yerr[mask], fmt="o", color="black", mfc=face, capsize=3,
                        label=label)
    if "compute_time_s" in df.columns and np.isfinite(df["compute_time_s"]).any():
        ax.plot(x, df["compute_time_s"] * ms, "x", color="#4c72b0",
                label="measured compute part" if ours.all() else "compute part (as recorded)")
    for xi, yi, e in zip(x, df["step_time_s"] * ms, df["error"]):
        ax.annotate(f"{e:+.0%}", (xi, yi), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    replicas_axis(ax, x)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("replicas")
    ax.set_ylabel("time per step (ms)")
    ax.set_title("Scaling model: predicted vs measured")
    ax.legend(fontsize=8)
    return fig


@themed
def hardware_choice(frame: pd.DataFrame) -> Figure:
    """Throughput, efficiency, time and energy per epoch (and cost, where prices are given) against GPU count, one
    line per candidate server, with the forecast's interval as a band (``candidates.compare``'s frame)."""
    require(frame, ["candidate", "replicas", "images_per_sec", "efficiency", "epoch_s"], "hardware choice")
    panels = [("images_per_sec", "images/s"), ("efficiency", "scaling efficiency"), ("epoch_s", "time per epoch (s)")]
    if "energy_kwh_per_epoch" in frame.columns and frame["energy_kwh_per_epoch"].notna().any():
        panels.append(("energy_kwh_per_epoch", "GPU energy per epoch (kWh, at TDP)"))
    if "cost_per_epoch" in frame.columns and frame["cost_per_epoch"].notna().any():
        panels.append(("cost_per_epoch", "cost per epoch (price x GPU-hours)"))
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = new_figure(ncols, nrows, width=4.7 * ncols, height=3.8 * nrows)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes = axes[:len(panels)]
    for name, g in frame.groupby("candidate", sort=False):
        g = g.sort_values("replicas")
        for ax, (col, label) in zip(axes, panels):
            line, = ax.plot(g["replicas"], g[col], marker=".", label=name)
            lo, hi = f"{col}_low", f"{col}_high"
            if lo in g.columns and g[lo].notna().any():
                ax.fill_between(g["replicas"], g[lo], g[hi], color=line.get_color(), alpha=0.2, lw=0)
            ax.set_ylabel(label)
    for ax in axes:
        replicas_axis(ax, sorted(frame["replicas"].unique()))
        ax.set_xlabel("GPUs")
    axes[0].legend(fontsize=8)
    fig.suptitle("Candidate servers: forecast with its interval (band)")
    return fig
