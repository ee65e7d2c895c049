"""The report's figures: one function per figure, on the runs ``results`` picks, each with the caption the report
shows under it. A figure without data is skipped with a log line saying why, never drawn empty.
"""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib
import pandas as pd

from ...errors import DataError
from ...measure.monitor.analysis import read_monitor
from ...plots import comm, training
from ...plots import sweep as sweep_plots
from ...plots import scaling as scaling_plots
from ...plots.monitor import plot_monitor_timeseries
from ...plots.theme import rc_params, save_figure
from .results import Results, batch_frames, scaling_frame

log = logging.getLogger("tftoolkit")


# --- one function per figure ---------------------------------------------------------------------------
def _scaling(res) -> pd.DataFrame:
    df = scaling_frame(res)
    if df.empty:
        raise DataError("no runs comparing replica counts in these folders (a scaling sweep or notebook 01 makes them)")
    return df


def _batch(res):
    steps, evals, runs = batch_frames(res)
    if runs.empty:
        raise DataError("no runs comparing global batches or LR rules in these folders (a batch/LR sweep or "
                        "notebook 02 makes them)")
    return steps, evals, runs


def _allreduce(res) -> pd.DataFrame:
    if res.allreduce.empty:
        raise DataError("no allreduce.csv in these folders (`tftoolkit bench allreduce --out DIR`, notebook 00 or "
                        "03 makes one; add its folder)")
    return res.allreduce


def _fig_throughput(res):
    return scaling_plots.plot_throughput(_scaling(res))


def _fig_efficiency(res):
    return scaling_plots.plot_efficiency(_scaling(res))


def _fig_breakdown(res):
    return scaling_plots.plot_step_breakdown(_scaling(res))


def _fig_per_replica(res):
    return scaling_plots.plot_images_per_replica(scaling_plots.replica_examples_frame(_scaling(res)))


def _fig_monitor(res):
    runs = scaling_frame(res)
    if runs.empty:
        runs = res.runs
    if runs.empty:
        raise DataError("no runs")
    biggest = runs.sort_values("replicas").iloc[-1]
    with matplotlib.rc_context(rc_params()):  # the report's look, for a figure drawn by plots.monitor
        fig = plot_monitor_timeseries(read_monitor(Path(biggest["run_dir"])))
        fig.axes[0].set_title(f"the {int(biggest['replicas'])}-replica run ({biggest['run']})", loc="left", fontsize=9)
    return fig


def _fig_comm_vs_compute(res):
    return comm.plot_comm_vs_compute(_scaling(res))


def _fig_loss(res):
    steps, _, _ = _batch(res)
    return training.plot_loss_curves(steps)


def _fig_val_accuracy(res):
    _, evals, runs = _batch(res)
    return training.plot_val_accuracy_curves(evals, runs)


def _fig_final_accuracy(res):
    _, _, runs = _batch(res)
    return training.plot_final_accuracy_vs_batch(runs)


def _fig_allreduce_time(res):
    return comm.plot_allreduce_time(_allreduce(res))


def _fig_busbw(res):
    return comm.plot_busbw(_allreduce(res))


FIGURES = {
    "throughput": _fig_throughput,
    "efficiency": _fig_efficiency,
    "step_breakdown": _fig_breakdown,
    "images_per_replica": _fig_per_replica,
    "monitor": _fig_monitor,
    "comm_vs_compute": _fig_comm_vs_compute,
    "loss_curves": _fig_loss,
    "val_accuracy": _fig_val_accuracy,
    "final_accuracy": _fig_final_accuracy,
    "allreduce_time": _fig_allreduce_time,
    "busbw": _fig_busbw,
}


# One sentence under each figure in the report: what it shows and how to read it.
CAPTIONS = {
    "throughput": "Images per second against replicas, with the ideal line (N x the smallest count's rate); error "
                  "bars are the standard error over timed loops, labels the scaling efficiency.",
    "efficiency": "Scaling efficiency: speed-up over the ideal speed-up. 100% is perfect data parallelism.",
    "step_breakdown": "Where each step's time goes: compute (the step without the all-reduce), the gradient "
                      "all-reduce the step pays, and waiting for input.",
    "images_per_replica": "Images each replica trained on: equal bars mean the split was even.",
    "monitor": "The hardware monitor over the largest run: GPU utilisation and memory, or the host's CPU when the "
               "replicas are simulated.",
    "comm_vs_compute": "Compute and all-reduce time per step as replicas grow: where the all-reduce passes the "
                       "compute, adding replicas stops paying.",
    "loss_curves": "Training loss against epochs, one panel per LR rule, one colour per global batch; a red x marks "
                   "a run that diverged or failed where it stopped.",
    "val_accuracy": "Validation accuracy after each epoch, per LR rule and global batch (dashed: with warmup).",
    "final_accuracy": "Final validation accuracy against global batch, one line per LR rule and warmup: the "
                      "batch-size study's result at one glance.",
    "allreduce_time": "All-reduce time against message size, per implementation; stars are the models' own "
                      "gradient sets.",
    "busbw": "Bus bandwidth (nccl-tests' busbw = algbw x 2(n-1)/n) against message size: comparable to a link's "
             "rated bandwidth.",
}


def figure(res: Results, name: str, save_to=None):
    """Figure ``name`` (one of FIGURES) from ``res``, saved as PNG + SVG into ``save_to`` when given.

    Returns None, with a log line saying why, when the results hold no data for it.
    """
    if name not in FIGURES:
        raise DataError(f"unknown figure {name!r}; choose one of {', '.join(FIGURES)}")
    try:
        fig = FIGURES[name](res)
    except DataError as e:
        log.info("figure %s skipped: %s", name, e)
        return None
    except (KeyError, ValueError) as e:
        log.info("figure %s skipped: the results lack what it needs (%s: %s)", name, type(e).__name__, e)
        return None
    if save_to is not None:
        save_figure(fig, save_to, name)
    return fig


def all_figures(res: Results, save_to=None) -> dict:
    """Every figure the results have data for: {name: Figure}."""
    out = {}
    for name in FIGURES:
        fig = figure(res, name, save_to)
        if fig is not None:
            out[name] = fig
    return out


def recorded_figure(res: Results, table: pd.DataFrame, save_to=None):
    """Each numeric result of ``table`` (``tables.recorded``) against each swept parameter, or None."""
    params = [c for src in table["source"].unique() for c in res.point_params.get(src, [])]
    cols = [c for src in table["source"].unique() for c in res.recorded.get(src, [])]
    try:
        fig = sweep_plots.recorded(table, list(dict.fromkeys(params)), list(dict.fromkeys(cols)))
    except DataError as e:
        log.info("figure recorded skipped: %s", e)
        return None
    if save_to is not None:
        save_figure(fig, save_to, "recorded")
    return fig
