"""Batch-size science figures: the steps-vs-examples trade-off, the noise scale during training, the LR
finder's sweep and the batch finder's trials.

Inputs are the tidy frames ``tftoolkit.advise`` (tradeoff.csv), ``steps.csv`` and ``tftoolkit.finders``
(lr_find.csv, batch_find.csv) write.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .theme import new_figure, require, themed

_REC = "#c44e52"
_CUR = "black"


@themed
def tradeoff(frame: pd.DataFrame) -> Figure:
    """Left: the predicted (S/S_min − 1)(E/E_min − 1) = 1 curve with each replica count's global batch on
    it. Right: steps and examples relative to their minimum against global batch, B_crit marked."""
    if frame is not None and len(frame) == 0 and frame.attrs.get("why"):
        # advise made no recommendation (no positive noise scale): say why instead of an empty plot.
        fig, ax = new_figure(1, width=11.0, height=2.2)
        ax.axis("off")
        ax.text(0.5, 0.5, "No steps-vs-examples trade-off to draw: " + frame.attrs["why"], ha="center",
                va="center", wrap=True, fontsize=10)
        return fig
    require(frame, ["global_batch", "replicas", "steps_ratio", "examples_ratio", "b_crit"], "steps vs examples")
    b_crit = float(frame["b_crit"].iloc[0])
    fig, (ax, ax2) = new_figure(2, width=11.0, height=4.4)
    lo = min(frame["global_batch"].min(), b_crit) / 8
    hi = max(frame["global_batch"].max(), b_crit) * 8
    bs = np.geomspace(lo, hi, 400)
    e, s = 1 + bs / b_crit, 1 + b_crit / bs
    ax.plot(e, s, color="0.4", lw=1.5, label="(S/S_min − 1)(E/E_min − 1) = 1")
    ax.plot(2, 2, marker="*", ms=14, color="#dd8452", ls="none", label=f"B = B_crit ≈ {b_crit:.3g}")
    ax.scatter(frame["examples_ratio"], frame["steps_ratio"], color="#4c72b0", zorder=3, s=22)
    for _, r in frame.iterrows():
        k = int(r["accumulate"]) if "accumulate" in frame.columns and r["accumulate"] == r["accumulate"] else 1
        label = (f"{int(r['replicas'])}×{r['global_batch'] / r['replicas'] / k:g}" + (f"×{k}" if k > 1 else ""))
        ax.annotate(label, (r["examples_ratio"], r["steps_ratio"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    for flag, colour, label in (("current", _CUR, "current run"), ("recommended", _REC, "recommended")):
        if flag in frame.columns and frame[flag].any():
            r = frame[frame[flag]].iloc[0]
            ax.plot(r["examples_ratio"], r["steps_ratio"], "o", ms=11, mfc="none", mew=2, color=colour,
                    label=f"{label}: {int(r['replicas'])} GPU(s), B = {int(r['global_batch'])}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1, **{"color": "0.6", "ls": ":", "lw": 1})
    ax.axvline(1, **{"color": "0.6", "ls": ":", "lw": 1})
    ax.set_xlabel("examples processed  E / E_min")
    ax.set_ylabel("optimizer steps  S / S_min")
    ax.set_title("Steps vs examples to the same loss (GPUs × per-replica batch [× micro-batches])")
    ax.legend(fontsize=8, loc="upper right")

    ax2.plot(bs, s, color="#4c72b0", label="steps  S/S_min = 1 + B_crit/B")
    ax2.plot(bs, e, color="#55a868", label="examples  E/E_min = 1 + B/B_crit")
    ax2.axvline(b_crit, color="#dd8452", ls="--", lw=1.2, label=f"B_crit ≈ B_simple = {b_crit:.3g}")
    b_lo, b_hi = (float(frame[c].iloc[0]) if c in frame.columns else np.nan for c in ("b_crit_lo", "b_crit_hi"))
    if 0 < b_lo <= b_hi < np.inf:
        # The noise scale's 90% interval carried into both curves: S/S_min rises with B_crit, E/E_min falls.
        ax2.axvspan(b_lo, b_hi, color="#dd8452", alpha=0.12, lw=0, label=f"B_simple 90% interval {b_lo:.3g}-{b_hi:.3g}")
        ax2.fill_between(bs, 1 + b_lo / bs, 1 + b_hi / bs, color="#4c72b0", alpha=0.15, lw=0)
        ax2.fill_between(bs, 1 + bs / b_hi, 1 + bs / b_lo, color="#55a868", alpha=0.15, lw=0)
    for flag, colour in (("current", _CUR), ("recommended", _REC)):
        if flag in frame.columns and frame[flag].any():
            ax2.axvline(float(frame.loc[frame[flag], "global_batch"].iloc[0]), color=colour, lw=1, ls=":")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("global batch B (dotted: current black, recommended red)")
    ax2.set_ylabel("relative to the minimum")
    ax2.set_title("Cost of a global batch")
    ax2.legend(fontsize=8, loc="upper center")
    return fig


@themed
def noise_scale_trace(steps: pd.DataFrame, estimate: dict | None = None) -> Figure:
    """B_simple (ratio of the EMAs) over training steps, with the loss on a second axis; with ``estimate`` (advise's:
    the run's figure, its 90% interval and the first step of its window), the figure and its interval over the steps
    it averages."""
    require(steps, ["step", "noise_scale"], "noise scale over training")
    df = steps.dropna(subset=["noise_scale"])
    fig, ax = new_figure(width=6.4, height=3.8)
    ax.plot(df["step"], df["noise_scale"], color="#dd8452", label="B_simple (EMA ratio)")
    if estimate and estimate.get("from_step") is not None and np.isfinite(estimate.get("noise_scale", np.nan)):
        x = [estimate["from_step"], float(steps["step"].max())]
        lo, hi = estimate.get("interval") or [np.nan, np.nan]
        ax.plot(x, [estimate["noise_scale"]] * 2, color="#c44e52", lw=1.8,
                label=f"the run's B_simple {estimate['noise_scale']:.3g} (over these steps)")
        if np.isfinite(lo) and np.isfinite(hi):
            ax.fill_between(x, lo, hi, color="#c44e52", alpha=0.15, lw=0, label=f"90% interval {lo:.3g}-{hi:.3g}")
    ax.set_xlabel("step")
    ax.set_ylabel("noise scale B_simple")
    positive = df["noise_scale"][df["noise_scale"] > 0]
    if len(positive) and positive.max() / positive.min() > 20:
        ax.set_yscale("log")
    if "loss" in steps.columns:
        ax_l = ax.twinx()
        ax_l.plot(steps["step"], steps["loss"], color="0.6", lw=0.8, label="loss")
        ax_l.set_ylabel("training loss", color="0.4")
        ax_l.grid(False)
    ax.set_title("Gradient noise scale during training")
    ax.legend(fontsize=8, loc="upper left")
    return fig


@themed
def lr_finder(frame: pd.DataFrame, suggestion: float | None = None) -> Figure:
    """Loss (raw and smoothed) against learning rate, log x; the suggested LR (steepest descent) marked."""
    require(frame, ["learning_rate", "loss", "smoothed_loss"], "LR finder")
    fig, ax = new_figure(width=6.4, height=4.0)
    ax.plot(frame["learning_rate"], frame["loss"], color="0.75", lw=0.8, label="loss")
    ax.plot(frame["learning_rate"], frame["smoothed_loss"], color="#4c72b0", lw=1.8, label="smoothed loss")
    if suggestion is not None and np.isfinite(suggestion):
        y = np.interp(np.log(suggestion), np.log(frame["learning_rate"]), frame["smoothed_loss"])
        ax.axvline(suggestion, color=_REC, ls="--", lw=1.2)
        ax.plot([suggestion], [y], "o", color=_REC, label=f"steepest descent: {suggestion:.3g}")
    ax.set_xscale("log")
    finite = frame["smoothed_loss"][np.isfinite(frame["smoothed_loss"])]
    if len(finite):
        lo, first = float(finite.min()), float(finite.iloc[0])
        ax.set_ylim(lo - 0.1 * abs(first - lo) - 1e-6, first + 1.5 * abs(first - lo) + 1e-6)
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title("LR range test")
    ax.legend(fontsize=8)
    return fig


@themed
def batch_finder(frame: pd.DataFrame, limit_bytes: float | None = None) -> Figure:
    """Each trial of the batch finder in order: per-replica batch, coloured by fit / out of memory, with the
    memory it took (measured peak or estimate) against the limit."""
    require(frame, ["trial", "per_replica_batch", "fits", "memory_bytes"], "batch finder")
    fig, (ax, ax2) = new_figure(2, width=10.0, height=3.8)
    colours = np.where(frame["fits"].astype(bool), "#55a868", _REC)
    ax.scatter(frame["trial"], frame["per_replica_batch"], c=colours, s=40, zorder=3)
    ax.plot(frame["trial"], frame["per_replica_batch"], color="0.7", lw=0.8)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("trial")
    ax.set_ylabel("per-replica batch (green: fits, red: out of memory)")
    ax.set_title("Doubling, then bisecting")
    ok = frame[np.isfinite(frame["memory_bytes"].astype(float))]
    ax2.scatter(ok["per_replica_batch"], ok["memory_bytes"] / 2**20,
                c=np.where(ok["fits"].astype(bool), "#55a868", _REC), s=30)
    if limit_bytes:
        ax2.axhline(limit_bytes / 2**20, color=_REC, ls="--", lw=1.2, label=f"limit {limit_bytes / 2**20:.0f} MiB")
        ax2.legend(fontsize=8)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("per-replica batch")
    ax2.set_ylabel("memory per replica (MiB)")
    ax2.set_title("Memory per replica")
    return fig
