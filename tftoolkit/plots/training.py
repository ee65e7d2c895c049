"""Training-curve figures for batch-size and learning-rate studies; diverged runs are marked, never dropped.

Inputs are tidy frames (``tftoolkit.experiments.report`` builds them from run directories):

    steps:  run, global_batch, lr_rule, step, loss, [epoch_frac], [status], [warmup_epochs]
    evals:  run, global_batch, lr_rule, epoch_frac | epoch, val_accuracy, [status], [warmup_epochs]
    finals: run, global_batch, lr_rule, val_accuracy, status, [warmup_epochs]

Curves are drawn against epochs (examples seen / training-set size), not steps: a batch 4x larger takes 4x
fewer steps per epoch, and only epochs compare runs that saw the same data. One panel per LR rule, one
colour per global batch, line style per warmup length.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..errors import DataError
from .theme import DIVERGED_COLOUR, batch_axis, footnote, new_figure, ordered_colours, require, rule_colour, themed

RULE_ORDER = ("none", "linear", "sqrt")
WARMUP_STYLES = ("-", "--", ":", "-.")
BAD = ("diverged", "failed", "timeout")


def _rules(df: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(df["lr_rule"].astype(str)))
    return [r for r in RULE_ORDER if r in present] + [r for r in present if r not in RULE_ORDER]


def _warmups(df: pd.DataFrame) -> list[float]:
    if "warmup_epochs" not in df.columns:
        return [0.0]
    return sorted(set(df["warmup_epochs"].fillna(0.0).astype(float)))


def _warmup_style(w: float, warmups: list[float]) -> str:
    return WARMUP_STYLES[warmups.index(w) % len(WARMUP_STYLES)] if w in warmups else "-"


def _status(df: pd.DataFrame) -> pd.Series:
    return df["status"].fillna("ok").astype(str) if "status" in df.columns else pd.Series("ok", index=df.index)


def _x(df: pd.DataFrame) -> tuple[pd.Series, str]:
    if "epoch_frac" in df.columns:
        return df["epoch_frac"].astype(float), "epochs (examples seen / training-set size)"
    return df["step"].astype(float), "optimizer step"


def _smooth(y: np.ndarray) -> np.ndarray:
    """Trailing moving average over ~1/30 of the run: per-step loss is noisy at small batches."""
    k = max(1, len(y) // 30)
    if k == 1:
        return y
    s = pd.Series(y).rolling(k, min_periods=1).mean().to_numpy()
    return s


def _legend(fig, batches, colours, warmups, has_bad: bool) -> None:
    handles = [Line2D([], [], color=colours[b], lw=2, label=f"global batch {b:g}") for b in batches]
    if len(warmups) > 1:
        handles += [Line2D([], [], color="0.3", ls=_warmup_style(w, warmups), label=f"warmup {w:g} epochs") for w in warmups]
    if has_bad:
        handles.append(Line2D([], [], color=DIVERGED_COLOUR, marker="X", ls="", ms=9, label="diverged / failed (run stopped)"))
    fig.legend(handles=handles, loc="outside right upper", frameon=False)


def _panels(n: int, height: float = 3.6):
    fig, axes = new_figure(ncols=n, width=3.6 * n + 2.2, height=height, sharey=True)
    return fig, (axes if isinstance(axes, list) else [axes])


@themed
def plot_loss_curves(steps: pd.DataFrame, *, smooth: bool = True) -> Figure:
    """Training loss against epochs, one panel per LR rule, one colour per global batch.

    A diverged run's curve ends with a red X where it stopped; losses above the plotted range (a blow-up)
    are pinned to the top edge so the other curves stay readable.
    """
    require(steps, ["run", "global_batch", "lr_rule", "step", "loss"], "loss curves")
    steps = steps.assign(_status=_status(steps))
    rules = _rules(steps)
    batches = sorted(steps["global_batch"].unique())
    colours = ordered_colours(batches)
    warmups = _warmups(steps)
    finite = steps[np.isfinite(steps["loss"].astype(float))]
    healthy = finite[~finite["_status"].isin(BAD)]
    ref = healthy if not healthy.empty else finite
    if ref.empty:
        raise DataError("loss curves: no finite loss values to plot")
    first = ref.sort_values("step").groupby("run")["loss"].first()
    top = float(max(ref["loss"].quantile(0.99), first.max()) * 1.25)
    fig, axes = _panels(len(rules))
    has_bad = False
    xlabel = _x(steps)[1]
    for ax, rule in zip(axes, rules):
        for run, g in steps[steps["lr_rule"].astype(str) == rule].groupby("run", sort=False):
            g = g.sort_values("step")
            x = _x(g)[0].to_numpy()
            y = g["loss"].astype(float).to_numpy()
            ok = np.isfinite(y)
            yc = np.minimum(np.where(ok, y, top), top)
            b = g["global_batch"].iloc[0]
            w = float(g["warmup_epochs"].iloc[0]) if "warmup_epochs" in g.columns else 0.0
            ax.plot(x, _smooth(yc) if smooth else yc, color=colours[b], ls=_warmup_style(w, warmups), lw=1.6)
            if g["_status"].iloc[0] in BAD:
                has_bad = True
                # A blown-up loss is pinned just inside the top edge, where the title cannot hide it.
                ax.plot([x[-1]], [min(yc[-1], top * 0.96)], marker="X", color=DIVERGED_COLOUR, ms=10, ls="", zorder=5)
        ax.set_title(f"LR rule: {rule}", color=rule_colour(rule))
        ax.set_xlabel(xlabel)
        ax.set_ylim(0, top)
        ax.set_xlim(left=0)
    axes[0].set_ylabel("training loss" + (" (moving average)" if smooth else ""))
    _legend(fig, batches, colours, warmups, has_bad)
    fig.suptitle("Training loss by global batch and LR-scaling rule")
    return fig


@themed
def plot_val_accuracy_curves(evals: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """Validation accuracy after each epoch, one panel per LR rule, one colour per global batch.

    ``runs`` (optional: run, status, epochs) places a red X at the bottom of the panel at the epoch where a
    diverged or failed run stopped, so a run with no curve is still visible.
    """
    require(evals, ["run", "global_batch", "lr_rule", "val_accuracy"], "validation-accuracy curves")
    ev = evals.copy()
    if "epoch_frac" not in ev.columns:
        if "epoch" not in ev.columns:
            raise DataError("validation-accuracy curves: need an epoch_frac or epoch column")
        ev["epoch_frac"] = ev["epoch"].astype(float) + 1.0  # evals.csv's epoch is 0-based, measured at its end
    rules = _rules(ev if runs is None else pd.concat([ev[["lr_rule"]], runs[["lr_rule"]]]))
    batches = sorted(set(ev["global_batch"]) | (set(runs["global_batch"]) if runs is not None else set()))
    colours = ordered_colours(batches)
    warmups = _warmups(ev)
    fig, axes = _panels(len(rules))
    has_bad = False
    for ax, rule in zip(axes, rules):
        for run, g in ev[ev["lr_rule"].astype(str) == rule].groupby("run", sort=False):
            g = g.sort_values("epoch_frac")
            b = g["global_batch"].iloc[0]
            w = float(g["warmup_epochs"].iloc[0]) if "warmup_epochs" in g.columns else 0.0
            ax.plot(g["epoch_frac"], g["val_accuracy"].astype(float) * 100, marker="o", ms=4, color=colours[b],
                    ls=_warmup_style(w, warmups), lw=1.6)
        if runs is not None and {"status", "epochs"} <= set(runs.columns):
            bad = runs[(runs["lr_rule"].astype(str) == rule) & runs["status"].isin(BAD)]
            for _, r in bad.iterrows():
                has_bad = True
                ax.plot([float(r["epochs"])], [0], marker="X", color=DIVERGED_COLOUR, ms=10, ls="", clip_on=False, zorder=5)
                ax.annotate(f"batch {r['global_batch']:g}", (float(r["epochs"]), 0), textcoords="offset points",
                            xytext=(4, 6), fontsize=7, color=DIVERGED_COLOUR)
        ax.set_title(f"LR rule: {rule}", color=rule_colour(rule))
        ax.set_xlabel("epochs trained")
        ax.set_ylim(0, 103)  # room for markers at 100%
        ax.set_xlim(left=0)
    axes[0].set_ylabel("validation accuracy (%)")
    _legend(fig, batches, colours, warmups, has_bad)
    fig.suptitle("Validation accuracy by global batch and LR-scaling rule")
    return fig


@themed
def accuracy_errors(runs: pd.DataFrame) -> pd.Series:
    """Per global batch, the standard error of the mean final accuracy: the runs' spread / sqrt(n) when there are
    several (seeds), else the binomial error of one evaluation, sqrt(p (1 - p) / val_examples), when it is known."""
    out = {}
    for batch, g in runs.groupby("global_batch"):
        acc = g["val_accuracy"].astype(float).dropna()
        if len(acc) > 1:
            out[batch] = float(acc.std(ddof=1) / math.sqrt(len(acc)))
        elif len(acc) == 1 and "val_examples" in g.columns and float(g["val_examples"].iloc[0]) > 0:
            p = float(acc.iloc[0])
            out[batch] = math.sqrt(p * (1 - p) / float(g["val_examples"].iloc[0]))
        else:
            out[batch] = math.nan
    return pd.Series(out, dtype=float)


def plot_final_accuracy_vs_batch(finals: pd.DataFrame) -> Figure:
    """Final validation accuracy against global batch, one line per LR rule (and warmup length).

    Diverged and failed runs have no trustworthy accuracy: they are drawn as red X on the batch axis (at 0%)
    and left out of the lines, so a rule that breaks at large batch shows it plainly.
    """
    require(finals, ["global_batch", "lr_rule", "val_accuracy"], "final accuracy vs batch")
    df = finals.assign(_status=_status(finals))
    warmups = _warmups(df)
    fig, ax = new_figure(width=6.6, height=4.2)
    handles = []
    for rule in _rules(df):
        for w in warmups:
            sel = df[(df["lr_rule"].astype(str) == rule)]
            if "warmup_epochs" in df.columns:
                sel = sel[sel["warmup_epochs"].fillna(0.0).astype(float) == w]
            if sel.empty:
                continue
            ok = sel[~sel["_status"].isin(BAD)]
            good = ok.groupby("global_batch")["val_accuracy"].mean().sort_index()
            label = f"{rule}" + (f", warmup {w:g} ep" if len(warmups) > 1 else "")
            (line,) = ax.plot(good.index, good.values * 100, marker="o", color=rule_colour(rule),
                              ls=_warmup_style(w, warmups), lw=1.8, label=label)
            handles.append(line)
            err = accuracy_errors(ok).reindex(good.index) * 100
            if err.notna().any():
                ax.errorbar(good.index, good.values * 100, yerr=err.fillna(0.0).values, fmt="none",
                            color=rule_colour(rule), capsize=3, lw=1.0)
    bad = df[df["_status"].isin(BAD)]
    if not bad.empty:
        ax.scatter(bad["global_batch"], np.zeros(len(bad)), marker="X", s=90, color=DIVERGED_COLOUR, zorder=5,
                   clip_on=False)
        biggest = df["global_batch"].max()
        for k, (_, r) in enumerate(bad.sort_values(["global_batch", "lr_rule"]).iterrows()):
            # Stack the labels of runs at the same batch; the largest batch gets its label on the left.
            same = bad[(bad["global_batch"] == r["global_batch"])]
            level = list(same["lr_rule"].astype(str)).index(str(r["lr_rule"]))
            right = r["global_batch"] == biggest
            ax.annotate(f"{r['lr_rule']}: {r['_status']}", (r["global_batch"], 0), textcoords="offset points",
                        xytext=(-6 if right else 6, 6 + 11 * level), ha="right" if right else "left",
                        fontsize=7.5, color=DIVERGED_COLOUR)
        handles.append(Line2D([], [], marker="X", color=DIVERGED_COLOUR, ls="", ms=9, label="diverged / failed"))
    batch_axis(ax, df["global_batch"])
    ax.set_ylim(0, 103)  # room for markers at 100%
    ax.set_xlabel("global batch (examples per step, all replicas)")
    ax.set_ylabel("final validation accuracy (%)")
    ax.set_title("Final accuracy vs global batch, per LR-scaling rule")
    ax.legend(handles=handles, title="LR rule", loc="lower left")
    footnote(fig, "error bars: 1 standard error (the seeds' spread, or one evaluation's binomial error)")
    if math.isnan(df["val_accuracy"].astype(float).max()) and bad.empty:
        raise DataError("final accuracy vs batch: no run has a validation accuracy (evaluation off?)")
    return fig
