"""The report in a notebook: its sections (a title, what applies to these results, each figure with its caption),
or one figure with its caption. IPython is imported where a figure is shown, not at the top: everything else
in the report (reading, tables, figures) works without it, on a machine that only renders files.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...errors import DataError
from ...plots.theme import rc_params
from .figures import CAPTIONS, figure, recorded_figure
from .results import Results, batch_runs, scaling_runs
from .tables import near_chance, recorded


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
        if not runs.empty and {"val_accuracy", "num_classes"} <= set(runs.columns):
            chance = runs[[near_chance(v, c) for v, c in zip(runs["val_accuracy"], runs["num_classes"])]]
            if len(chance):
                steps = sorted({int(s) for s in chance.get("steps", pd.Series(dtype=float)).dropna()})
                acc = chance["val_accuracy"].astype(float)
                notes.append(f"{len(chance)} scaling run(s) ended at chance-level validation accuracy "
                             f"({acc.min():.1%}-{acc.max():.1%}; chance is {1 / chance['num_classes'].max():.1%})"
                             + (f" after {'-'.join(map(str, steps[::max(1, len(steps) - 1)]))} steps" if steps
                                else "") + ": expected of a throughput run, which trains only long enough to time "
                             "its steps. Their accuracy says nothing about the method; the batch-size runs do.")
        if not runs.empty and "breakdown_step_matches_training" in runs.columns:
            off = runs[runs["breakdown_step_matches_training"].eq(False)]
            if len(off):
                ratio = (off["breakdown_step_time_s"] / off["step_time_s"]).astype(float)
                notes.append(f"In {len(off)} run(s) the step-time breakdown timed a step other than training's "
                             f"({ratio.min():.2f}-{ratio.max():.2f}x the step behind the throughput figures): its "
                             "rounds ran after training, at another moment of a shared machine. Its bars are the "
                             "shares of that step (black tick); the faint tick is training's.")
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
    from IPython.display import Markdown, display  # deferred: see the module's docstring

    if name not in SECTIONS:
        raise DataError(f"unknown section {name!r}; choose one of {', '.join(SECTIONS)}")
    title, names = SECTIONS[name]
    if name == "recorded":
        table = recorded(res)
        if table.empty:
            return
        display(Markdown(f"## {title}\n\nWhat each point's notebook recorded in `results.json`, by parameter."))
        display(table)
        fig = recorded_figure(res, table, save_to)
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


def _display_figure(fig, name: str, save_to=None) -> None:
    from IPython.display import display  # deferred: see the module's docstring

    display(_saved_png(Path(save_to) / f"{name}.png") if save_to is not None else fig)
    plt.close(fig)


def show(res: Results, name: str, save_to=None) -> None:
    """Display figure ``name`` with its caption below it (in a notebook), or a line saying why it is not there."""
    from IPython.display import Markdown, display  # deferred: see the module's docstring

    fig = figure(res, name, save_to)
    if fig is None:
        display(Markdown(f"*{name.replace('_', ' ')}: not in these results.*"))
        return
    if save_to is not None:
        display(_saved_png(Path(save_to) / f"{name}.png"))
    else:
        display(fig)
    display(Markdown(f"*Figure: {CAPTIONS[name]}*"))
    plt.close(fig)


def _saved_png(path: Path):
    """The PNG just saved, to display instead of the figure: the inline backend would render it a third time
    (after PNG and SVG), a third of a report's time. Shown at the size inline figures have (figure.dpi), so
    the page looks the same, only sharper (the file is at savefig.dpi)."""
    from IPython.display import Image  # deferred: see the module's docstring

    data = path.read_bytes()
    width_px = int.from_bytes(data[16:20], "big")  # the IHDR chunk: width, then height, big-endian
    rc = rc_params()
    return Image(data=data, format="png", width=round(width_px * rc["figure.dpi"] / rc["savefig.dpi"]))
