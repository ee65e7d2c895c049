"""Communication figures: all-reduce time and bus bandwidth against message size, communication vs compute.

Inputs are tidy frames:

    allreduce.csv (``tftoolkit bench allreduce``): impl, replicas, payload, size_bytes, time_s, busbw_GBps, status
        payload "buffer" rows are the size sweep; "grads:<model>" rows are that model's own gradient set,
        drawn as stars at their total size so they can be read against the sweep.
    runs (``tftoolkit.experiments.report.results.scaling_frame``): replicas, compute_time_s, allreduce_time_s,
        [allreduce_direct_time_s], [communication_fraction]

Bandwidths follow nccl-tests (busbw = algbw x 2(n-1)/n), so a busbw curve compares directly with a link's
rated bandwidth, given as ``rated_GBps``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..errors import DataError
from ..measure.parts import MEASURED, Part
from .scaling import configurations
from .theme import IDEAL_STYLE, bytes_axis, device_note, footnote, format_bytes, new_figure, replicas_axis, require, themed

IMPL_LABELS = {
    "nccl": "NCCL",
    "hierarchical_copy": "hierarchical copy",
    "reduce_to_one": "reduce to one device",
    "collective": "collective (ring)",
    "tf_default": "TensorFlow default",
}
IMPL_MARKERS = {"nccl": "o", "hierarchical_copy": "s", "reduce_to_one": "^", "collective": "D", "tf_default": "v"}


def _ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    rows = df
    if "status" in rows.columns:
        rows = rows[rows["status"].fillna("ok") == "ok"]
    return rows[rows["time_s"].astype(float) > 0]


def _label(impl: str, replicas, many_replicas: bool) -> str:
    name = IMPL_LABELS.get(impl, impl)
    return f"{name}, {replicas} replicas" if many_replicas else name


def _series(df: pd.DataFrame):
    """(impl, replicas, buffer rows, gradient rows) per implementation and replica count, in a stable order."""
    order = [i for i in IMPL_LABELS if i in set(df["impl"])] + sorted(set(df["impl"]) - set(IMPL_LABELS))
    for k, impl in enumerate(order):
        for n in sorted(df.loc[df["impl"] == impl, "replicas"].unique()):
            sel = df[(df["impl"] == impl) & (df["replicas"] == n)]
            payload = sel["payload"].fillna("buffer").astype(str) if "payload" in sel.columns else pd.Series("buffer", index=sel.index)
            yield k, impl, n, sel[payload == "buffer"].sort_values("size_bytes"), sel[payload.str.startswith("grads:")]


def _skipped_note(fig, df: pd.DataFrame) -> None:
    """A footnote for what the figure leaves out: implementations not measured (with the reason) and sizes whose
    time the call's noise swallowed (unresolved rows, with the bound they set); and, when the rows' ``device_kind``
    says so, that the replicas were CPU-simulated."""
    note = device_note(df).strip(" ()")
    if "status" not in df.columns:
        if note:
            footnote(fig, note)
        return
    status = df["status"].fillna("ok")
    skipped = df[~status.isin(["ok", "unresolved"])].drop_duplicates("impl")
    parts = [f"{IMPL_LABELS.get(r['impl'], r['impl'])}: {r['status']}" + (f" ({r['reason']})" if isinstance(r.get("reason"), str) and r.get("reason") else "")
             for _, r in skipped.iterrows()]
    text = "not measured here: " + "; ".join(parts) if parts else ""
    loose = df[status == "unresolved"]
    if not loose.empty:
        sizes = ", ".join(f"{IMPL_LABELS.get(i, i)} {_sizes(g)}" for i, g in loose.groupby("impl", sort=False))
        text += ("; " if text else "") + f"within the call's noise, not drawn: {sizes}"
    text = text[:200] + ("..." if len(text) > 200 else "")
    text = "; ".join(t for t in (text, note) if t)
    if text:
        footnote(fig, text)


def _sizes(rows: pd.DataFrame) -> str:
    names = []
    for _, r in rows.iterrows():
        payload = str(r.get("payload") or "buffer")
        names.append(payload.split(":", 1)[1] + "'s gradients" if payload.startswith("grads:")
                     else format_bytes(r["size_bytes"]))
    return "(" + ", ".join(names) + ")"


def _time_unit(seconds: pd.Series) -> tuple[float, str]:
    med = float(np.nanmedian(seconds)) if len(seconds) else 0.0
    return (1e3, "ms") if med >= 1e-3 else (1e6, "µs")


@themed
def plot_allreduce_time(df: pd.DataFrame) -> Figure:
    """All-reduce time per call against message size (log-log), one line per implementation."""
    require(df, ["impl", "replicas", "size_bytes", "time_s"], "all-reduce time plot")
    ok = _ok_rows(df)
    if ok.empty:
        raise DataError("all-reduce time plot: no implementation was measured (all skipped or failed)")
    scale, unit = _time_unit(ok["time_s"].astype(float))
    many = ok["replicas"].nunique() > 1
    fig, ax = new_figure(width=6.6, height=4.3)
    grad_sets = {}
    for k, impl, n, buf, grads in _series(ok):
        colour = f"C{k}"
        if not buf.empty:
            ax.plot(buf["size_bytes"], buf["time_s"] * scale, marker=IMPL_MARKERS.get(impl, "o"), ms=4, lw=1.6,
                    color=colour, label=_label(impl, n, many))
            if "time_err_s" in buf.columns and buf["time_err_s"].notna().any():  # each size's standard error
                ax.errorbar(buf["size_bytes"], buf["time_s"] * scale, yerr=buf["time_err_s"].fillna(0.0) * scale,
                            fmt="none", color=colour, capsize=2, lw=0.9)
        for _, g in grads.iterrows():
            ax.plot([g["size_bytes"]], [g["time_s"] * scale], marker="*", ms=13, color=colour, mec="black", mew=0.5,
                    ls="")
            grad_sets[str(g["payload"]).split(":", 1)[1]] = g
    bytes_axis(ax, ok["size_bytes"])
    ax.set_yscale("log")
    ax.set_xlabel("message size (float32 buffer)")
    ax.set_ylabel(f"time per all-reduce ({unit})")
    replicas = sorted(ok["replicas"].unique())
    ax.set_title(f"All-reduce time vs size ({', '.join(map(str, replicas))} replicas)")
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + _grad_handles(grad_sets), loc="upper left", fontsize=8)
    _skipped_note(fig, df)
    return fig


def _grad_handles(grad_sets: dict) -> list:
    """Legend entries for the gradient-set stars, in neutral grey (their colour is the implementation's)."""
    out = []
    for model, g in grad_sets.items():
        tensors = g.get("tensors")
        detail = f"{format_bytes(g['size_bytes'])}" + (f", {int(tensors)} tensors" if tensors == tensors and tensors is not None else "")
        out.append(Line2D([], [], marker="*", ms=12, color="0.6", mec="black", mew=0.5, ls="",
                          label=f"{model}'s gradient set ({detail})"))
    return out


@themed
def plot_busbw(df: pd.DataFrame, rated_GBps: float | None = None) -> Figure:
    """Bus bandwidth (nccl-tests definition) against message size, one line per implementation.

    ``rated_GBps`` draws the link's rated bandwidth as a dashed line: the ceiling a good implementation
    approaches at large sizes.
    """
    require(df, ["impl", "replicas", "size_bytes", "busbw_GBps"], "bus-bandwidth plot")
    ok = _ok_rows(df) if "time_s" in df.columns else df
    ok = ok[ok["busbw_GBps"].astype(float) > 0]
    if ok.empty:
        raise DataError("bus-bandwidth plot: no bandwidth to plot (1 replica has busbw 0, or nothing was measured)")
    many = ok["replicas"].nunique() > 1
    fig, ax = new_figure(width=6.6, height=4.3)
    grad_sets = {}
    for k, impl, n, buf, grads in _series(ok):
        if not buf.empty:
            ax.plot(buf["size_bytes"], buf["busbw_GBps"], marker=IMPL_MARKERS.get(impl, "o"), ms=4, lw=1.6,
                    color=f"C{k}", label=_label(impl, n, many))
            if {"time_err_s", "time_s"} <= set(buf.columns) and buf["time_err_s"].notna().any():
                # bandwidth = size / time: its relative error is the time's
                rel = (buf["time_err_s"] / buf["time_s"]).fillna(0.0)
                ax.errorbar(buf["size_bytes"], buf["busbw_GBps"], yerr=buf["busbw_GBps"] * rel, fmt="none",
                            color=f"C{k}", capsize=2, lw=0.9)
        for _, g in grads.iterrows():
            ax.plot([g["size_bytes"]], [g["busbw_GBps"]], marker="*", ms=13, color=f"C{k}", mec="black", mew=0.5, ls="")
            grad_sets[str(g["payload"]).split(":", 1)[1]] = g
    top = float(ok["busbw_GBps"].max())
    if rated_GBps:
        ax.axhline(rated_GBps, **IDEAL_STYLE, label=f"rated link bandwidth {rated_GBps:g} GB/s")
        top = max(top, rated_GBps)
    bytes_axis(ax, ok["size_bytes"])
    ax.set_ylim(0, top * 1.45)  # headroom for the legend above the curves
    ax.set_xlabel("message size (float32 buffer)")
    ax.set_ylabel("bus bandwidth (GB/s) = algbw x 2(n-1)/n")
    replicas = sorted(ok["replicas"].unique())
    ax.set_title(f"All-reduce bus bandwidth vs size ({', '.join(map(str, replicas))} replicas)")
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + _grad_handles(grad_sets), loc="upper left", fontsize=8, ncols=2)
    _skipped_note(fig, df)
    return fig


COMM_COLUMNS = ("compute_time_s", "allreduce_time_s", "allreduce_direct_time_s")


def comm_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (``group``, as ``plots.scaling.configurations`` labels it) and replica count: the
    mean compute, all-reduce paid in the step and (when measured) all-reduce timed alone, in seconds, each with its
    standard error (``*_err_s``, from the runs' own uncertainties), ``communication_share`` = all-reduce / (compute +
    all-reduce) in percent, and ``allreduce_within_noise``: the all-reduce not measured above its noise by the runs' own
    rule (measure.parts.Part: under 2 errors above zero, or below it), drawn hollow, never a solid figure."""
    require(df, ["replicas", "compute_time_s", "allreduce_time_s"], "communication vs compute plot")
    cols = [c for c in COMM_COLUMNS if c in df.columns]
    parts = []
    for name, runs in configurations(df):
        rows = []
        for n, g in runs.groupby("replicas"):
            row = {"group": name, "replicas": n}
            for c in cols:
                e = c[:-2] + "_uncertainty_s"
                row[c] = float(g[c].astype(float).mean())
                row[c[:-2] + "_err_s"] = (float(np.sqrt((g[e].astype(float) ** 2).sum(min_count=1))) / len(g)
                                          if e in g.columns else math.nan)
            rows.append(row)
        parts.append(pd.DataFrame(rows).sort_values("replicas"))
    out = pd.concat(parts, ignore_index=True)
    if out[["compute_time_s", "allreduce_time_s"]].isna().all().all():
        raise DataError("communication vs compute plot: compute_time_s / allreduce_time_s are empty (measure off?)")
    out["communication_share"] = out["allreduce_time_s"] / (out["compute_time_s"] + out["allreduce_time_s"]) * 100
    out["allreduce_within_noise"] = [e == e and v == v and Part(v, e).status != MEASURED for v, e in
                                     zip(out["allreduce_time_s"], out["allreduce_time_err_s"])]
    return out


@themed
def plot_comm_vs_compute(df: pd.DataFrame) -> Figure:
    """Per-step compute and gradient all-reduce time as replicas grow (left), and communication's share (right);
    one set of lines per configuration (``comm_frame``), coloured by configuration when there are several.

    Where the all-reduce line crosses the compute line (share above 50%), adding replicas stops paying off.
    """
    table = comm_frame(df)
    groups = list(dict.fromkeys(table["group"]))
    many = len(groups) > 1
    fig, (ax, ax2) = new_figure(ncols=2, width=10.5, height=4.0)
    styles = (("compute_time_s", "o", "-", 1.8, "compute (no all-reduce)"),
              ("allreduce_time_s", "s", "-." if many else "-", 1.8, "all-reduce paid in the step"),
              ("allreduce_direct_time_s", "^", "--", 1.2, "gradient all-reduce timed alone"))
    drawn = set()
    for k, name in enumerate(groups):
        agg = table[table["group"] == name]
        n = agg["replicas"].to_numpy()
        for col, marker, ls, lw, label in styles:
            if col not in agg.columns or agg[col].isna().all():
                continue
            # One colour per configuration when there are several (named in the right panel's legend); else the
            # compute and all-reduce colours of the step breakdown.
            colour = f"C{k}" if many else ("#4c72b0" if col == "compute_time_s" else "#dd8452")
            err = agg[col[:-2] + "_err_s"] * 1e3 if col[:-2] + "_err_s" in agg.columns else None
            ax.plot(n, agg[col] * 1e3, marker=marker, lw=lw, ls=ls, color=colour,
                    label=f"{label} ({name})" if many else label)
            if err is not None and err.notna().any():
                ax.errorbar(n, agg[col] * 1e3, yerr=err.fillna(0.0), fmt="none", color=colour, capsize=3, lw=1.0)
            drawn.add(col)
        noisy = agg["allreduce_within_noise"].to_numpy()
        if noisy.any():  # hollow: within noise of zero, its size not known
            ax.plot(n[noisy], agg["allreduce_time_s"].to_numpy()[noisy] * 1e3, "s", mfc="white", ms=7,
                    color=f"C{k}" if many else "#dd8452", label=None if "noisy" in drawn else "within noise (hollow)")
            drawn.add("noisy")
        colour = f"C{k}" if many else "#dd8452"
        ax2.plot(n, agg["communication_share"].values, lw=1.8, color=colour,
                 label=name if many else "all-reduce / (compute + all-reduce)")
        ax2.plot(n[~noisy], agg["communication_share"].to_numpy()[~noisy], "o", color=colour)
        ax2.plot(n[noisy], agg["communication_share"].to_numpy()[noisy], "o", mfc="white", color=colour)
    replicas_axis(ax, table["replicas"])
    peak = float(np.nanmax(table[[c for c in COMM_COLUMNS if c in table.columns]].to_numpy(dtype=float))) * 1e3
    ax.set_ylim(0, peak * 1.4 if peak > 0 else 1)  # headroom for the legend above the lines
    ax.set_xlabel("replicas (N)")
    ax.set_ylabel("time per training step (ms)")
    ax.set_title("Compute vs communication per step")
    if many:  # the parts by line style, in grey: the colours are the configurations, named on the right
        ax.legend(handles=[Line2D([], [], marker=marker, ls=ls, lw=lw, color="0.45", label=label)
                           for col, marker, ls, lw, label in styles if col in drawn], loc="upper left", fontsize=8)
    else:
        ax.legend(loc="upper left", fontsize=8)
    ax2.axhline(50, **IDEAL_STYLE, label="communication = compute")
    replicas_axis(ax2, table["replicas"])
    ax2.set_ylim(0, 100)
    ax2.set_xlabel("replicas (N)")
    ax2.set_ylabel("communication share of the step (%)")
    ax2.set_title("Communication fraction")
    ax2.legend(loc="upper left", fontsize=8)
    note = device_note(df).strip(" ()")
    footnote(fig, "error bars: 1 standard error; hollow: the all-reduce is not above its noise (under 2 errors above "
             "zero)"
             + (f"; {note}" if note else ""))
    return fig
