"""Figures of a monitor frame (``tftoolkit.measure.monitor.read_monitor``): metrics over time, utilisation heatmap.

Figures are built on ``matplotlib.figure.Figure`` directly, not pyplot, so they work under Agg on a headless
server, keep no global state, and still display when a notebook cell returns them.
"""

from __future__ import annotations

import re

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..errors import DataError
from ..measure.monitor.metrics import METRICS

GPU_METRICS = ("util_gpu_pct", "mem_used_bytes", "power_w", "temp_c")
HOST_METRICS = ("cpu_util_pct", "rss_bytes")

# Bytes read better in GiB; every other metric is plotted in its own unit.
_SCALE = {"bytes": (2**-30, "GiB")}
_PHASE_ALPHA = 0.12
_MAX_HEATMAP_COLUMNS = 240  # wider than this and cells are thinner than a pixel on a notebook page


def _label(metric: str) -> str:
    what, unit = METRICS.get(metric, (metric, ""))
    unit = _SCALE.get(unit, (1.0, unit))[1]
    return f"{what} ({unit})" if unit and unit != "bitmask" else what


def _scale(metric: str) -> float:
    return _SCALE.get(METRICS.get(metric, ("", ""))[1], (1.0, ""))[0]


def _device_order(devices) -> list[str]:
    def key(d):
        m = re.fullmatch(r"([a-z]+)(\d+)", d)
        return ({"gpu": 0, "host": 1, "cpu": 2}.get(m.group(1) if m else d, 3), int(m.group(2)) if m else -1)
    return sorted(devices, key=key)


def phase_spans(df: pd.DataFrame) -> list[tuple[str, float, float]]:
    """(phase, start_s, end_s) for each run of consecutive samples in the same phase, in time order."""
    if df.empty:
        return []
    per_time = df.groupby("time_s")["phase"].first().sort_index()
    spans: list[tuple[str, float, float]] = []
    for t, ph in per_time.items():
        if spans and spans[-1][0] == ph:
            spans[-1] = (ph, spans[-1][1], float(t))
        else:
            if spans:  # a phase ends where the next one starts, so the shading has no gaps
                spans[-1] = (spans[-1][0], spans[-1][1], float(t))
            spans.append((ph, float(t), float(t)))
    return spans


def _shade_phases(ax, spans, colours: dict) -> None:
    for ph, start, end in spans:
        if end > start:
            ax.axvspan(start, end, color=colours[ph], alpha=_PHASE_ALPHA, lw=0)


def plot_monitor_timeseries(df: pd.DataFrame, metrics=None, *, include_cores: bool = False) -> Figure:
    """One panel per metric over time, one line per device, phases shaded.

    ``metrics`` defaults to GPU utilisation, memory, power and temperature when the run had GPUs, else host
    CPU utilisation and RSS. Per-core ``cpu<N>`` lines are left out unless ``include_cores``.
    """
    if df.empty:
        raise DataError("the monitor frame is empty: nothing to plot (did the run record any samples?)")
    if metrics is None:
        present = set(df["metric"])
        metrics = [m for m in GPU_METRICS if m in present] or [m for m in HOST_METRICS if m in present]
    elif isinstance(metrics, str):
        metrics = [metrics]
    metrics = list(metrics)
    absent = [m for m in metrics if m not in set(df["metric"])]
    if absent or not metrics:
        raise DataError(f"no rows for metric(s) {absent or metrics}; this frame has {sorted(set(df['metric']))}")
    spans = phase_spans(df)
    phases = list(dict.fromkeys(ph for ph, _, _ in spans))
    colours = dict(zip(phases, sns.color_palette("pastel", max(len(phases), 1))))

    fig = Figure(figsize=(9, 2.3 * len(metrics) + 0.6), layout="constrained")
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, metrics):
        rows = df[df["metric"] == metric]
        if not include_cores:
            rows = rows[~rows["device"].str.fullmatch(r"cpu\d+")]
        rows = rows.assign(value=rows["value"] * _scale(metric))
        _shade_phases(ax, spans, colours)
        sns.lineplot(data=rows, x="time_s", y="value", hue="device", hue_order=_device_order(rows["device"].unique()),
                     ax=ax, lw=1.2, estimator=None, legend=True)
        ax.set_ylabel(_label(metric))
        ax.set_xlabel("time since monitor start (s)")
        if METRICS.get(metric, ("", ""))[1] == "%":
            ax.set_ylim(-2, 102)
        leg = ax.get_legend()
        if leg is not None:
            if ax is axes[0]:
                leg.set_title("device")
            else:
                leg.remove()  # the same devices in the same colours: one legend is enough
    if phases:
        fig.legend(handles=[Patch(color=colours[p], alpha=0.5, label=p) for p in phases], title="phase",
                   loc="outside upper center", ncols=min(len(phases), 6), frameon=False)
    return fig


def plot_utilisation_heatmap(df: pd.DataFrame) -> Figure:
    """Utilisation per device (rows) over time (columns): GPUs when the run had any, else CPU cores.

    A GPU row that stays pale while the others are dark is the idle-replica pattern; phase boundaries are
    drawn as vertical lines.
    """
    gpu = df[(df["metric"] == "util_gpu_pct") & df["device"].str.startswith("gpu")]
    rows = gpu if not gpu.empty else df[(df["metric"] == "cpu_util_pct") & df["device"].str.fullmatch(r"cpu\d+")]
    if rows.empty:
        raise DataError("no utilisation rows (util_gpu_pct for GPUs, cpu_util_pct per core) to draw a heatmap from")
    what = "GPU" if not gpu.empty else "CPU core"
    t0, t1 = float(rows["time_s"].min()), float(rows["time_s"].max())
    bins = min(int(rows["time_s"].nunique()), _MAX_HEATMAP_COLUMNS)
    # Column k is centred on t0 + k * width, so with regular samples each sample gets its own column.
    width = (t1 - t0) / (bins - 1) if bins > 1 and t1 > t0 else 1.0
    binned = rows.assign(t_bin=((rows["time_s"] - t0) / width).round().astype(int).clip(0, bins - 1))
    wide = binned.pivot_table(index="device", columns="t_bin", values="value", aggfunc="mean")
    wide = wide.reindex(index=_device_order(wide.index), columns=range(bins))
    # Irregular sampling (the sample taken at stop, a slow one) can leave a column with no sample: it shows the
    # utilisation last read rather than a blank stripe.
    wide = wide.ffill(axis=1).bfill(axis=1)

    fig = Figure(figsize=(9, 0.45 * len(wide) + 1.8), layout="constrained")
    ax = fig.subplots()
    sns.heatmap(wide, ax=ax, vmin=0, vmax=100, cmap="viridis", cbar_kws={"label": f"{what} utilisation (%)"},
                xticklabels=False)
    ticks = [t for t in MaxNLocator(nbins=8).tick_values(t0, t1) if t0 <= t <= t1]
    ax.set_xticks([(t - t0) / width + 0.5 for t in ticks])
    ax.set_xticklabels([f"{t:g}" for t in ticks], rotation=0)
    ax.set_xlabel("time since monitor start (s)")
    ax.set_ylabel(what.lower())
    # Phase names above the map; one too close to the previous name to fit beside it goes a line higher, so
    # short phases ("eval" just before "train") never run into each other.
    columns_per_char = bins / (9.0 * 72 / (8 * 0.62))  # 8 pt characters across the 9-inch figure
    ends = []  # per label line: the column where its last name ends
    for k, (ph, start, _) in enumerate(phase_spans(df)):
        x = max(0.0, (start - t0) / width)  # the left edge of the phase's first column
        if k:
            ax.axvline(x, color="white", lw=1.2, ls="--")
        line = next((i for i, end in enumerate(ends) if x >= end), len(ends))
        if line == len(ends):
            ends.append(0.0)
        ends[line] = x + (len(ph) + 1) * columns_per_char
        ax.text(x, -0.1 - 0.75 * line, ph, fontsize=8, ha="left", va="bottom", clip_on=False)
    return fig
