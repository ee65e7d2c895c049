"""tftoolkit.plots (scaling, training, comm, theme): each figure from a tidy frame, rendered headless.

Checks what a reader relies on: axis labels with units, the ideal-scaling line where it belongs, legends
naming replicas / rules / implementations, diverged runs marked rather than dropped.
"""

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from tftoolkit.errors import DataError
from tftoolkit.plots import comm, scaling, theme, training

matplotlib.use("Agg")


def _texts(fig: Figure) -> set[str]:
    out = set()
    for leg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]:
        out |= {t.get_text() for t in leg.get_texts()}
    return out


def _render(fig: Figure) -> None:
    fig.canvas.draw()  # raises on a broken artist; also makes tick labels available


@pytest.fixture
def runs() -> pd.DataFrame:
    return pd.DataFrame({
        "replicas": [1, 2, 4], "images_per_sec": [1000.0, 1800.0, 3000.0], "images_per_sec_uncertainty": [10.0, 20, 40],
        "mode": "weak", "device_kind": "GPU", "status": "ok",
        "compute_time_s": [0.050, 0.050, 0.050], "allreduce_time_s": [0.0, 0.010, 0.030], "input_wait_s": [0.002] * 3,
        "allreduce_direct_time_s": [0.0, 0.012, 0.035],
        "examples_per_replica": [[16000], [8000, 8000], [4000, 4000, 4000, 4000]],
    })


def test_throughput_has_units_ideal_line_and_efficiency_labels(runs):
    fig = scaling.plot_throughput(runs)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "replicas (N)" and ax.get_ylabel() == "throughput (images/s)"
    ideal = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(ideal) == 1
    np.testing.assert_allclose(ideal[0].get_ydata(), [1000, 2000, 4000])  # N x the 1-replica rate
    labels = _texts(fig)
    assert "measured (weak scaling)" in labels and "ideal: N x 1-replica rate" in labels
    notes = {t.get_text() for t in ax.texts}
    assert notes == {"90%", "75%"}  # efficiency of 2 and 4 replicas
    _render(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]


def test_throughput_leaves_failed_runs_out_and_says_when_replicas_are_simulated(runs):
    data = runs.assign(device_kind="CPU-simulated", status=["ok", "ok", "failed"])
    fig = scaling.plot_throughput(data)
    measured = [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "-"][0]
    assert list(measured.get_xdata()) == [1, 2]
    assert "CPU-simulated" in fig._supxlabel.get_text()


def test_efficiency_is_speedup_over_n(runs):
    fig = scaling.plot_efficiency(runs)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "scaling efficiency (%)"
    line = ax.get_lines()[0]
    np.testing.assert_allclose(line.get_ydata(), [100, 90, 75])
    assert "ideal (100%)" in _texts(fig)
    # error bars: each rate's relative error and the base's, in quadrature (1000 ± 10, 1800 ± 20, 3000 ± 40)
    bars = ax.containers[0].lines[2][0].get_segments()
    spans = [seg[1][1] - seg[0][1] for seg in bars]
    np.testing.assert_allclose(spans, [0, 2 * 90 * math.hypot(20 / 1800, 0.01), 2 * 75 * math.hypot(40 / 3000, 0.01)])
    assert "standard error" in fig._supxlabel.get_text()


def test_step_breakdown_stacks_milliseconds(runs):
    fig = scaling.plot_step_breakdown(runs)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "time per training step (ms)"
    assert _texts(fig) == {"compute", "gradient all-reduce", "input wait"}
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    # 3 parts x 3 replica counts; the top of the stack for 4 replicas is 50 + 30 + 2 ms.
    assert max(tops) == pytest.approx(82.0)
    with pytest.raises(DataError, match="measure off"):
        scaling.plot_step_breakdown(runs.assign(compute_time_s=math.nan, allreduce_time_s=math.nan))


def test_step_breakdown_draws_errors_noise_and_failures_as_measured(runs):
    data = runs.assign(device_kind="CPU-simulated", compute_time_uncertainty_s=0.002,
                       allreduce_time_s=[0.0, 0.001, math.nan], allreduce_time_uncertainty_s=[0.0, 0.002, 0.004],
                       allreduce_time_status=["measured", "within noise", "failed"], input_wait_uncertainty_s=0.0005,
                       breakdown_step_time_s=[0.052, 0.053, 0.060], breakdown_step_time_uncertainty_s=0.001,
                       step_time_s=[0.040, 0.041, 0.020], global_batch=[52.0, 95.4, 90.0])
    long = scaling.breakdown_frame(data)
    at = long.set_index(["replicas", "part"])
    # training's tick is the throughput's step (global batch / images/sec: 52, 53, 30 ms), not the median step
    assert list(long.groupby("replicas")["training_step_ms"].first()) == pytest.approx([52.0, 53.0, 30.0])
    assert at.loc[(2, "gradient all-reduce"), "status"] == "within noise"
    assert at.loc[(4, "gradient all-reduce"), "status"] == "failed"
    assert at.loc[(2, "compute"), "err_ms"] == pytest.approx(2.0)
    fig = scaling.plot_step_breakdown(data)
    ax = fig.axes[0]
    hollow = [p for p in ax.patches if p.get_hatch() == "//"]
    assert len(hollow) == 1 and hollow[0].get_facecolor()[3] == 0  # never a solid bar
    assert "gradient all-reduce (within noise: hollow)" in _texts(fig)
    assert any("failed" in t.get_text() for t in ax.texts)  # the failed part is said, not drawn
    assert len(ax.patches) == 3 + 3 + 2  # compute and input wait everywhere, the all-reduce where it did not fail
    assert len(ax.containers) >= 6  # error bars on the parts and on the step
    assert {"the step the parts split", "training's step (batch / images/sec)"} <= _texts(fig)
    assert "CPU-simulated" in fig._supxlabel.get_text() and "standard error" in fig._supxlabel.get_text()
    _render(fig)


def test_a_part_below_zero_within_three_errors_is_drawn_within_noise_never_as_a_measured_bar(runs):
    # 2.5 errors below zero: within noise in its run (measure.parts.Part) and so in the figure; 3.5 below: failed
    data = runs.assign(allreduce_time_s=[0.0, -0.005, -0.007], allreduce_time_uncertainty_s=[0.0, 0.002, 0.002],
                       allreduce_time_status=["measured", "within noise", "within noise"])
    at = scaling.breakdown_frame(data).set_index(["replicas", "part"])["status"]
    assert at.loc[(2, "gradient all-reduce")] == "within noise" and at.loc[(4, "gradient all-reduce")] == "failed"
    ax = scaling.plot_step_breakdown(data).axes[0]
    assert [p.get_hatch() for p in ax.patches].count("//") == 1 and any("failed" in t.get_text() for t in ax.texts)


def test_a_run_that_left_its_breakdown_out_is_said_not_measured_not_drawn_as_zero(runs):
    # The 4-replica run's rounds did not fit its measuring budget: its parts and step are NaN, with no status.
    data = runs.assign(compute_time_s=[0.050, 0.050, math.nan], allreduce_time_s=[0.0, 0.010, math.nan],
                       input_wait_s=[0.002, 0.002, math.nan])
    ax = scaling.plot_step_breakdown(data).axes[0]
    said = [t.get_text() for t in ax.texts]
    assert said.count("not measured") == 1 and not any(t == "0.0 ms" for t in said), said


def test_images_per_replica_draws_one_bar_per_replica(runs):
    long = scaling.replica_examples_frame(runs)
    assert len(long) == 1 + 2 + 4
    fig = scaling.plot_images_per_replica(long)
    ax = fig.axes[0]
    assert sorted(p.get_height() for p in ax.patches) == sorted([16000, 8000, 8000] + [4000] * 4)
    _render(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["N = 1", "N = 2", "N = 4"]
    assert ax.get_ylabel() == "examples trained per replica"


def _training_frames():
    steps, evals, finals = [], [], []
    for rule in ("none", "linear", "sqrt"):
        for batch in (64, 512):
            run = f"{rule}-{batch}"
            diverged = rule == "linear" and batch == 512
            n = 6 if diverged else 30
            for s in range(1, n + 1):
                loss = 2.3 * math.exp(-s / 20) if not diverged or s < 5 else float("inf" if s == n else 40.0)
                steps.append({"run": run, "global_batch": batch, "lr_rule": rule, "step": s, "loss": loss,
                              "epoch_frac": s * batch / 3200, "status": "diverged" if diverged else "ok"})
            if not diverged:
                evals += [{"run": run, "global_batch": batch, "lr_rule": rule, "epoch": e, "val_accuracy": 0.5 + 0.1 * e}
                          for e in range(3)]
            finals.append({"run": run, "global_batch": batch, "lr_rule": rule, "status": "diverged" if diverged else "ok",
                           "val_accuracy": math.nan if diverged else 0.7, "epochs": n * batch / 3200})
    return pd.DataFrame(steps), pd.DataFrame(evals), pd.DataFrame(finals)


def test_loss_curves_one_panel_per_rule_and_a_marked_divergence():
    steps, _, _ = _training_frames()
    fig = training.plot_loss_curves(steps)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["LR rule: none", "LR rule: linear", "LR rule: sqrt"]
    assert axes[0].get_ylabel().startswith("training loss")
    assert axes[0].get_xlabel().startswith("epochs")
    assert {"global batch 64", "global batch 512", "diverged / failed (run stopped)"} <= _texts(fig)
    marks = [ln for ax in axes for ln in ax.get_lines() if ln.get_marker() == "X"]
    assert len(marks) == 1 and marks[0].axes is axes[1]
    # The blow-up (40, then inf) is pinned inside the panel, not allowed to stretch the y axis.
    assert axes[1].get_ylim()[1] < 4 and marks[0].get_ydata()[0] <= axes[1].get_ylim()[1]
    _render(fig)


def test_val_accuracy_curves_in_percent_with_diverged_runs_at_the_bottom():
    _, evals, finals = _training_frames()
    fig = training.plot_val_accuracy_curves(evals, finals)
    assert fig.axes[0].get_ylabel() == "validation accuracy (%)"
    line = fig.axes[0].get_lines()[0]
    np.testing.assert_allclose(line.get_xdata(), [1, 2, 3])  # evaluated at the end of epochs 1..3
    np.testing.assert_allclose(line.get_ydata(), [50, 60, 70])
    marks = [ln for ln in fig.axes[1].get_lines() if ln.get_marker() == "X"]
    assert len(marks) == 1 and marks[0].get_ydata()[0] == 0


def test_final_accuracy_vs_batch_has_a_line_per_rule_and_diverged_marks():
    _, _, finals = _training_frames()
    fig = training.plot_final_accuracy_vs_batch(finals)
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("global batch") and ax.get_ylabel() == "final validation accuracy (%)"
    assert {"none", "linear", "sqrt", "diverged / failed"} <= _texts(fig)
    linear = [ln for ln in ax.get_lines() if ln.get_label() == "linear"][0]
    assert list(linear.get_xdata()) == [64]  # its diverged batch is not on the line...
    assert any(t.get_text() == "linear: diverged" for t in ax.texts)  # ...but marked and named


def test_final_accuracy_carries_its_standard_error():
    _, _, finals = _training_frames()
    finals = finals.assign(val_examples=1000)
    # one run a point: the binomial error of its evaluation; two seeds at one point: their spread / sqrt(2)
    seeds = pd.concat([finals, finals.iloc[[0]].assign(val_accuracy=0.74)], ignore_index=True)
    err = training.accuracy_errors(seeds[seeds["lr_rule"] == "none"])
    assert err[64] == pytest.approx(np.std([0.7, 0.74], ddof=1) / math.sqrt(2))
    assert err[512] == pytest.approx(math.sqrt(0.7 * 0.3 / 1000))
    fig = training.plot_final_accuracy_vs_batch(finals)
    assert len(fig.axes[0].containers) == 3  # one set of error bars per rule line
    assert "standard error" in fig._supxlabel.get_text()


@pytest.fixture
def allreduce_table() -> pd.DataFrame:
    rows = []
    for impl, bw in (("reduce_to_one", 4.0), ("hierarchical_copy", 6.0)):
        for size in (4096, 65536, 1048576, 16777216):
            t = 2e-5 + size / (bw * 1e9)
            rows.append({"impl": impl, "replicas": 4, "payload": "buffer", "tensors": 1, "size_bytes": size, "time_s": t,
                         "busbw_GBps": size / t / 1e9 * 1.5, "status": "ok", "reason": ""})
        rows.append({"impl": impl, "replicas": 4, "payload": "grads:small_cnn", "tensors": 8, "size_bytes": 244520,
                     "time_s": 1e-4, "busbw_GBps": 3.6, "status": "ok", "reason": ""})
    rows.append({"impl": "nccl", "replicas": 4, "payload": "", "tensors": None, "size_bytes": None, "time_s": math.nan,
                 "busbw_GBps": math.nan, "status": "skipped", "reason": "needs GPUs"})
    return pd.DataFrame(rows)


def test_allreduce_time_per_implementation_with_the_models_gradients(allreduce_table):
    fig = comm.plot_allreduce_time(allreduce_table)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_ylabel() == "time per all-reduce (µs)" and ax.get_xlabel().startswith("message size")
    labels = _texts(fig)
    assert {"reduce to one device", "hierarchical copy"} <= labels
    assert any(lab.startswith("small_cnn's gradient set (245 kB, 8 tensors)") for lab in labels)
    assert "NCCL: skipped (needs GPUs)" in fig._supxlabel.get_text()
    _render(fig)
    assert "4 KiB" in [t.get_text() for t in ax.get_xticklabels()]


def test_busbw_with_rated_bandwidth(allreduce_table):
    fig = comm.plot_busbw(allreduce_table, rated_GBps=12.5)
    ax = fig.axes[0]
    assert ax.get_ylabel().startswith("bus bandwidth (GB/s)")
    assert "rated link bandwidth 12.5 GB/s" in _texts(fig)
    assert ax.get_ylim()[1] > 12.5


def test_comm_vs_compute_has_both_panels_and_the_crossover_line(runs):
    fig = comm.plot_comm_vs_compute(runs)
    left, right = fig.axes
    assert left.get_ylabel() == "time per training step (ms)" and right.get_ylabel() == "communication share of the step (%)"
    share = right.get_lines()[0]
    np.testing.assert_allclose(share.get_ydata(), [0, 100 * 10 / 60, 100 * 30 / 80])
    assert "communication = compute" in _texts(fig)
    assert {"compute (no all-reduce)", "all-reduce paid in the step", "gradient all-reduce timed alone"} <= _texts(fig)


def test_comm_vs_compute_carries_errors_noise_and_the_simulated_note(runs):
    data = runs.assign(device_kind="CPU-simulated", compute_time_uncertainty_s=0.002,
                       allreduce_time_uncertainty_s=[0.0, 0.008, 0.004])  # the 2-replica all-reduce: 10 ± 8 ms
    table = comm.comm_frame(data)
    assert table["allreduce_within_noise"].tolist() == [False, True, False]
    assert table["compute_time_err_s"].tolist() == pytest.approx([0.002] * 3)
    # 2.5 errors below zero (within noise by the runs' rule, measure.parts.Part) and 3.5 below (failed): neither is a
    # measured all-reduce, so neither is drawn solid
    below = comm.comm_frame(runs.assign(allreduce_time_s=[0.0, -0.005, -0.007],
                                        allreduce_time_uncertainty_s=[0.0, 0.002, 0.002]))
    assert below["allreduce_within_noise"].tolist() == [False, True, True]
    fig = comm.plot_comm_vs_compute(data)
    left, right = fig.axes
    assert len(left.containers) >= 2  # error bars on compute and on the all-reduce
    assert "within noise (hollow)" in _texts(fig)
    hollow = [ln for ln in right.get_lines() if ln.get_markerfacecolor() == "white"]
    assert len(hollow) == 1 and list(hollow[0].get_xdata()) == [2]
    assert "CPU-simulated" in fig._supxlabel.get_text()
    _render(fig)


def test_save_figure_writes_png_and_svg_atomically(tmp_path, runs):
    paths = theme.save_figure(scaling.plot_throughput(runs), tmp_path / "figs", "throughput")
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in paths["svg"].read_bytes()[:500]
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["throughput.png", "throughput.svg"]
    with pytest.raises(DataError):
        theme.save_figure(Figure(), tmp_path, "../escape")


def test_missing_columns_are_named(runs):
    with pytest.raises(DataError, match="lacks column.*images_per_sec"):
        scaling.plot_throughput(runs.drop(columns=["images_per_sec"]))
    with pytest.raises(DataError, match="empty"):
        training.plot_loss_curves(pd.DataFrame())


@pytest.mark.parametrize("n, text", [(4096, "4 KiB"), (2**20, "1 MiB"), (256 * 2**20, "256 MiB"), (4000, "4 kB"),
                                     (244520, "245 kB"), (100, "100 B")])
def test_format_bytes(n, text):
    assert theme.format_bytes(n) == text


def test_themed_figures_do_not_change_global_style():
    before = dict(matplotlib.rcParams)
    scaling.plot_efficiency(pd.DataFrame({"replicas": [1, 2], "images_per_sec": [1.0, 1.5]}))
    assert dict(matplotlib.rcParams) == before


def test_predicted_vs_measured_never_calls_a_reported_step_measured():
    from tftoolkit.plots import predict as predict_plots
    frame = pd.DataFrame({"replicas": [1, 2, 4], "step_time_s": [0.1, 0.11, 0.12],
                          "predicted_step_time_s": [0.1, 0.105, 0.125], "predicted_compute_s": [0.1, 0.1, 0.1],
                          "error": [0.0, -0.05, 0.04], "measured_by_tftoolkit": [True, False, False]})
    fig = predict_plots.predicted_vs_measured(frame)
    _render(fig)
    labels = set(fig.axes[0].get_legend_handles_labels()[1])
    assert {"measured step", "reported step (not measured by tftoolkit)"} <= labels
    hand = predict_plots.predicted_vs_measured(frame.assign(measured_by_tftoolkit=False))
    assert "measured step" not in set(hand.axes[0].get_legend_handles_labels()[1])


def test_allreduce_figures_carry_each_size_s_error(allreduce_table):
    table = allreduce_table.assign(time_err_s=allreduce_table["time_s"] * 0.1, device_kind="CPU-simulated")
    for fig in (comm.plot_allreduce_time(table), comm.plot_busbw(table)):
        assert "CPU-simulated" in fig._supxlabel.get_text() and "nccl" in fig._supxlabel.get_text().lower()
        bars = fig.axes[0].containers
        assert len(bars) == 2  # one set per implementation measured
        seg = bars[0].lines[2][0].get_segments()[0]
        assert seg[1][1] - seg[0][1] == pytest.approx(2 * 0.1 * seg[:, 1].mean(), rel=1e-6)  # ±10% of the value
        _render(fig)
