"""The look shared by every toolkit figure, and saving figures atomically as PNG and SVG.

Figures are ``matplotlib.figure.Figure`` objects built without pyplot (no global state, fine under Agg on a
headless server, displayed inline when a notebook cell returns them). The seaborn theme is applied per
figure through ``themed`` (an rc context), so importing the toolkit never changes a user's own plots.

Colours are fixed per meaning, not per call: replica counts and LR rules get the same colour in every
figure of a report, so a reader can match them across panels without re-reading legends.
"""

from __future__ import annotations

import functools
import io
import math
from pathlib import Path

import matplotlib
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ..errors import DataError
from ..fileio import atomic_write

_PALETTE = sns.color_palette("colorblind", 10)

# LR rules and replica counts keep their colour in every figure.
RULE_COLOURS = {"none": _PALETTE[7], "linear": _PALETTE[0], "sqrt": _PALETTE[2]}
DIVERGED_COLOUR = "#c0392b"
IDEAL_STYLE = {"color": "0.35", "ls": "--", "lw": 1.2}


def rc_params() -> dict:
    rc = dict(sns.axes_style("whitegrid"))
    rc.update(sns.plotting_context("notebook", font_scale=0.85))
    rc.update({
        "figure.dpi": 100,
        "savefig.dpi": 150,
        "savefig.bbox": "tight",
        "axes.titleweight": "bold",
        "legend.frameon": False,
        "axes.prop_cycle": matplotlib.cycler(color=_PALETTE),
    })
    return rc


def themed(fn):
    """Decorator: build the figure inside the toolkit's seaborn theme (an rc context, nothing global)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(rc_params()):
            return fn(*args, **kwargs)

    return wrapper


def new_figure(ncols: int = 1, nrows: int = 1, *, width: float = 6.4, height: float = 4.0, **subplot_kw):
    """A constrained-layout Figure and its axes (a flat list when there is more than one)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
    flat = [ax for row in axes for ax in row]
    return fig, (flat[0] if len(flat) == 1 else flat)


def ordered_colours(values) -> dict:
    """A colour per value (replica count, batch size), light to dark so larger values read as 'more'."""
    values = sorted({v for v in values})
    pal = sns.color_palette("viridis_r", max(len(values), 3))
    # Skip the palest end: yellow lines vanish on a white background.
    offset = 1 if len(values) < len(pal) else 0
    return {r: pal[min(i + offset, len(pal) - 1)] for i, r in enumerate(values)}


def replica_colours(replicas) -> dict:
    return ordered_colours(int(r) for r in replicas)


def rule_colour(rule: str):
    return RULE_COLOURS.get(str(rule), _PALETTE[4])


def footnote(fig: Figure, text: str) -> None:
    """A small grey note under the axes; constrained layout makes room for it (a plain fig.text would overlap
    the x label)."""
    fig.supxlabel(text, x=0.01, ha="left", fontsize=7.5, color="0.35")


def device_note(df) -> str:
    """What the figure's rows ran on, for its footnote: " (CPU-simulated replicas ...)" when every row was measured
    on simulated replicas (the figure must say so itself: it is copied out of the report without its text)."""
    kinds = sorted(set(df["device_kind"].dropna().astype(str))) if "device_kind" in df.columns else []
    if kinds == ["CPU-simulated"]:
        return " (CPU-simulated replicas share the host's cores: no speed-up is expected)"
    if "CPU-simulated" in kinds:
        return f" ({', '.join(kinds)}: the CPU-simulated rows share the host's cores)"
    return f" ({', '.join(kinds)})" if kinds else ""


def require(df, columns, what: str) -> None:
    """Raise a DataError naming the missing columns (plots take tidy frames with known column names)."""
    if df is None or len(df) == 0:
        raise DataError(f"{what}: the frame is empty, nothing to plot")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(f"{what}: the frame lacks column(s) {', '.join(missing)}; it has {', '.join(map(str, df.columns))}")


# --- axis helpers -----------------------------------------------------------------------------------------
def format_bytes(n: float) -> str:
    """4096 -> '4 KiB', 4000 -> '4 kB': powers of two in IEC units, anything else in SI units."""
    if not (n == n) or n <= 0:
        return ""
    n = float(n)
    if n.is_integer() and int(n) & (int(n) - 1) == 0:
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if n >= scale:
                return f"{n / scale:g} {unit}"
        return f"{n:g} B"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:g} B"


def bytes_axis(ax, values) -> None:
    """Log2 x axis in bytes with ticks at (every other) power of two in range, labelled 4 KiB, 1 MiB, ..."""
    vals = [float(v) for v in values if v == v and v > 0]
    ax.set_xscale("log", base=2)
    if not vals:
        return
    lo, hi = math.floor(math.log2(min(vals))), math.ceil(math.log2(max(vals)))
    step = max(1, math.ceil((hi - lo + 1) / 8))
    ax.set_xticks([2.0**k for k in range(lo, hi + 1, step)])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def replicas_axis(ax, replicas) -> None:
    """Log2 axis with one tick per replica count actually measured (1, 2, 4, 8 ...), shown as plain numbers."""
    values = sorted({int(r) for r in replicas})
    if len(values) > 1 and values[0] > 0:
        ax.set_xscale("log", base=2)
        lo, hi = values[0], values[-1]
        ax.set_xlim(lo / 2**0.3, hi * 2**0.3)
    ax.set_xticks(values)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def batch_axis(ax, batches) -> None:
    """Log2 axis for batch sizes with a tick at each batch measured."""
    replicas_axis(ax, batches)


# --- saving ----------------------------------------------------------------------------------------------
def save_figure(fig: Figure, directory, name: str, formats=("png", "svg")) -> dict[str, Path]:
    """Write ``directory/name.png`` and ``.svg`` atomically (a killed run never leaves half a PNG).

    Returns {format: path}. The figure is rendered in memory first, so a failing render writes nothing.
    """
    if not name or "/" in name or name.startswith("."):
        raise DataError(f"figure name must be a plain file stem like 'throughput', got {name!r}")
    directory = Path(directory)
    out = {}
    with matplotlib.rc_context(rc_params()):
        rendered = {}
        for fmt in formats:
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt)
            rendered[fmt] = buf.getvalue()
    for fmt, data in rendered.items():
        path = directory / f"{name}.{fmt}"
        atomic_write(path, data)
        out[fmt] = path
    return out
