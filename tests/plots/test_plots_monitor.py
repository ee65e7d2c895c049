"""tftoolkit.plots.monitor: figures from a monitor frame, rendered headless."""

import io

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from tftoolkit.errors import DataError
from tftoolkit.measure.monitor.metrics import COLUMNS
from tftoolkit.plots import monitor as plots

matplotlib.use("Agg")


def _frame(gpus: bool = True) -> pd.DataFrame:
    rows = []
    for k in range(30):
        t = k * 0.5
        phase = "warmup" if k < 5 else "train" if k < 25 else "eval"
        rows += [(t, "host", "cpu_util_pct", 50.0, phase), (t, "host", "rss_bytes", 2.0 * 2**30, phase),
                 (t, "cpu0", "cpu_util_pct", 40.0, phase), (t, "cpu1", "cpu_util_pct", 60.0, phase)]
        if gpus:
            for g, u in (("gpu0", 95.0), ("gpu1", 3.0 if phase == "train" else 90.0)):
                rows += [(t, g, "util_gpu_pct", u, phase), (t, g, "mem_used_bytes", 40 * 2**30, phase),
                         (t, g, "power_w", 300.0, phase), (t, g, "temp_c", 70.0, phase)]
    return pd.DataFrame(rows, columns=COLUMNS)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def test_phase_spans_are_contiguous():
    spans = plots.phase_spans(_frame())
    assert [p for p, _, _ in spans] == ["warmup", "train", "eval"]
    assert spans[0][1] == 0.0 and spans[0][2] == spans[1][1] == 2.5 and spans[-1][2] == 14.5


def test_timeseries_defaults_to_gpu_metrics_with_units_and_phase_shading():
    fig = plots.plot_monitor_timeseries(_frame())
    assert isinstance(fig, Figure)
    axes = fig.axes
    assert [a.get_ylabel() for a in axes] == ["GPU utilisation (%)",
                                              "GPU memory used (GiB)", "power draw (W)", "GPU temperature (°C)"]
    assert all(a.get_xlabel() == "time since monitor start (s)" for a in axes)
    assert all(len(a.patches) == 3 for a in axes)  # one shaded span per phase
    mem_line = axes[1].get_lines()[0]
    assert mem_line.get_ydata().max() == pytest.approx(40.0)  # bytes shown in GiB
    assert {t.get_text() for t in fig.legends[0].get_texts()} == {"warmup", "train", "eval"}
    assert _png(fig)[:4] == b"\x89PNG"


def test_timeseries_on_a_cpu_only_run_falls_back_to_host_metrics():
    fig = plots.plot_monitor_timeseries(_frame(gpus=False))
    assert [a.get_ylabel() for a in fig.axes] == ["CPU utilisation (%)",
                                                  "process RSS (GiB)"]
    assert len(fig.axes[0].get_lines()) >= 1
    with_cores = plots.plot_monitor_timeseries(_frame(gpus=False), metrics="cpu_util_pct", include_cores=True)
    labels = {t.get_text() for t in with_cores.axes[0].get_legend().get_texts()}
    assert {"host", "cpu0", "cpu1"} <= labels


def test_timeseries_rejects_absent_metric_and_empty_frame():
    with pytest.raises(DataError, match="power_w"):
        plots.plot_monitor_timeseries(_frame(gpus=False), metrics=["power_w"])
    with pytest.raises(DataError, match="empty"):
        plots.plot_monitor_timeseries(pd.DataFrame(columns=COLUMNS))


def test_heatmap_gpus_by_time():
    fig = plots.plot_utilisation_heatmap(_frame())
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu0", "gpu1"]
    assert ax.get_xlabel() == "time since monitor start (s)"
    assert fig.axes[1].get_ylabel() == "GPU utilisation (%)"  # the colour bar
    mesh = ax.collections[0].get_array().reshape(2, -1)
    assert mesh[0].min() == 95.0 and mesh[1].min() == 3.0  # the idle replica shows as a pale stretch
    assert len(ax.get_lines()) == 2  # the warmup->train and train->eval boundaries
    assert _png(fig)[:4] == b"\x89PNG"


def test_heatmap_of_cpu_only_run_shows_cores():
    fig = plots.plot_utilisation_heatmap(_frame(gpus=False))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["cpu0", "cpu1"]
    assert fig.axes[1].get_ylabel() == "CPU core utilisation (%)"
    with pytest.raises(DataError):
        plots.plot_utilisation_heatmap(_frame(gpus=False).query("metric != 'cpu_util_pct'"))


def test_heatmap_phase_names_never_run_into_each_other_and_no_column_is_blank():
    # The end of a run: a long train, a short eval, train again for one sample, and a stop sample 1 ms after the
    # last one. Names used to overlap ("evtrain") and the stop sample left an empty column.
    rows = []
    times = [k * 0.5 for k in range(40)] + [19.501]
    for k, t in enumerate(times):
        phase = "train" if k < 36 else "eval" if k < 39 else "train"
        rows += [(t, g, "util_gpu_pct", 80.0, phase) for g in ("gpu0", "gpu1")]
    fig = plots.plot_utilisation_heatmap(pd.DataFrame(rows, columns=COLUMNS))
    ax = fig.axes[0]
    mesh = ax.collections[0].get_array()
    assert not np.isnan(np.asarray(mesh, dtype=float)).any()
    fig.canvas.draw()
    labels = [t for t in ax.texts if t.get_text() in ("train", "eval")]
    assert [t.get_text() for t in labels] == ["train", "eval", "train"]
    boxes = [t.get_window_extent() for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
