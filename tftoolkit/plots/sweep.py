"""What a sweep of any notebook recorded: each numeric result against each swept parameter.

Input: a tidy frame, one row per sweep point, with the swept parameters and the results the point's notebook wrote
to ``results.json`` (``tftoolkit.experiments.report.tables.recorded``), plus ``status``. One panel per (result, parameter)
pair; points that did not finish are drawn as red crosses at the bottom of their panel, never dropped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..errors import DataError
from .theme import DIVERGED_COLOUR, new_figure, require, themed

MAX_PANELS = 12


def numeric(frame: pd.DataFrame, columns) -> list[str]:
    """The columns of ``frame`` (in ``columns``) that hold numbers for at least one point."""
    out = []
    for c in columns:
        if c in frame.columns and pd.to_numeric(frame[c], errors="coerce").notna().any():
            out.append(c)
    return out


@themed
def recorded(frame: pd.DataFrame, params: list[str], results: list[str]) -> Figure:
    """Each numeric result (y) against each swept parameter (x): a grid of at most MAX_PANELS panels."""
    require(frame, list(params) + list(results), "recorded results")
    ys = numeric(frame, results)
    if not ys or not params:
        raise DataError("recorded results: no numeric result, or no swept parameter, to plot")
    pairs = [(p, y) for y in ys for p in params][:MAX_PANELS]
    ncols = min(3, len(pairs))
    nrows = int(np.ceil(len(pairs) / ncols))
    fig, axes = new_figure(ncols, nrows, width=3.8 * ncols, height=3.1 * nrows)
    axes = axes if isinstance(axes, list) else [axes]
    ok = frame["status"].eq("ok") if "status" in frame.columns else pd.Series(True, index=frame.index)
    for ax, (p, y) in zip(axes, pairs):
        values = pd.to_numeric(frame[y], errors="coerce")
        x = frame[p]
        categorical = not pd.api.types.is_numeric_dtype(pd.to_numeric(x, errors="coerce").dropna()) or \
            pd.to_numeric(x, errors="coerce").isna().any()
        xs = x.astype(str) if categorical else pd.to_numeric(x)
        good = ok & values.notna()
        order = np.argsort(xs[good].to_numpy(), kind="stable")
        ax.plot(xs[good].to_numpy()[order], values[good].to_numpy()[order], marker="o", lw=1.2)
        bad = ~good
        if bad.any():
            floor = values[good].min() if good.any() else 0.0
            ax.plot(xs[bad], [floor] * int(bad.sum()), "x", color=DIVERGED_COLOUR, ms=8, label="did not finish")
            ax.legend(fontsize=7)
        ax.set_xlabel(p)
        ax.set_ylabel(y)
    for ax in axes[len(pairs):]:
        ax.set_visible(False)
    return fig
