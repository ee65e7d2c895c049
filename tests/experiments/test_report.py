"""tftoolkit.experiments.report: reads sweep folders and run directories (files only, no TensorFlow) into tidy frames and
figures. The folders here are written by hand in the layout sweeps and notebooks produce.
"""

import json
import socket
from pathlib import Path

import pandas as pd
import pytest

from tftoolkit.experiments.report import figures, results, sections, tables
from tftoolkit.errors import DataError

from helpers import assert_no_tensorflow


def _run(d: Path, summary: dict, config: dict, steps: int = 10):
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "config.json").write_text(json.dumps({"config": config}))
    b, n = summary["global_batch"], summary["train_examples"]
    done = summary.get("steps", steps)
    pd.DataFrame({"step": range(1, done + 1), "epoch": [(s - 1) * b // n for s in range(1, done + 1)],
                  "loss": [2.3 / s for s in range(1, done + 1)], "learning_rate": 0.1,
                  "step_time_s": 0.01}).to_csv(d / "steps.csv", index=False)
    pd.DataFrame({"epoch": [0], "step": [done], "val_loss": [1.0], "val_accuracy": [summary.get("val_accuracy", 0.5)],
                  "val_examples": [100]}).to_csv(d / "evals.csv", index=False)


def _sweep(root: Path, notebook: str, points: list[tuple[str, dict, dict]]) -> Path:
    """A sweep folder: sweep.json, results.csv, runs/<id>/parameters.json and one run directory per point."""
    root.mkdir(parents=True)
    (root / "sweep.json").write_text(json.dumps({"identity": {"notebook": notebook, "points": []}}))
    rows = []
    for pid, params, summary in points:
        pdir = root / "runs" / pid
        pdir.mkdir(parents=True)
        (pdir / "parameters.json").write_text(json.dumps({**params, "out_dir": str(pdir)}))
        if summary is not None:
            _run(pdir / "runs" / "r", summary, {"warmup_epochs": 0.0, "seed": 0, **params})
        row = {"id": pid, **params, "status": summary["status"] if summary else "failed",
               "error": None if summary else "ValueError: boom"}
        # As sweep.results_frame writes it: then the run summary's scalars, a parameter's name taken as run_<name>.
        for k, v in (summary or {}).items():
            if not isinstance(v, (list, dict)) and k not in ("status", "error"):
                row[k if k not in row else f"run_{k}"] = v
        rows.append(row)
    pd.DataFrame(rows).to_csv(root / "results.csv", index=False)
    return root


@pytest.fixture
def sweeps(tmp_path):
    scaling = _sweep(tmp_path / "scaling", "01_data_parallel_scaling.ipynb", [
        (f"0{i}_replicas-{n}", {"replicas": n, "mode": "weak"},
         {"status": "ok", "replicas": n, "global_batch": 64 * n, "per_replica_batch": 64, "train_examples": 6400,
          "images_per_sec": 1000.0 * n * (1 - 0.1 * i), "images_per_sec_uncertainty": 5.0, "device_kind": "GPU",
          "compute_time_s": 0.05, "allreduce_time_s": 0.005 * i, "input_wait_s": 0.0,
          "examples_per_replica": [640 * 64 // n] * n, "lr_rule": "linear",
          # The input verdict every run now carries (runs.py): fed, near, then input-bound as replicas grow.
          "input_capacity_images_per_sec": 2880.0, "input_headroom": 2880.0 / (1000.0 * n * (1 - 0.1 * i)),
          "input_verdict": verdict, "input_cores": 8, "input_capacity_per_core": 360.0})
        for (i, n), verdict in zip(enumerate([1, 2, 4]), ["fed", "near", "input-bound"])])
    batch = _sweep(tmp_path / "batch_lr", "02_batch_and_lr_scaling.ipynb", [
        (f"0{i}_b-{b}_r-{r}", {"global_batches": b, "lr_rules": r},
         None if (b, r) == (512, "sqrt") else
         {"status": "diverged" if (b, r) == (512, "linear") else "ok", "error": None, "replicas": 4, "global_batch": b,
          "per_replica_batch": b // 4, "train_examples": 3200, "lr_rule": r, "val_accuracy": 0.6, "epochs": 1.0,
          "steps": 4 if (b, r) == (512, "linear") else 10, "images_per_sec": 900.0})
        for i, (b, r) in enumerate([(64, "none"), (64, "linear"), (512, "linear"), (512, "sqrt")])])
    return scaling, batch


def test_load_reads_points_runs_and_curves(sweeps):
    res = results.load(list(sweeps))
    assert len(res.points) == 3 + 4
    assert len(res.runs) == 3 + 3  # the failed point wrote no run directory; it is still in the points
    assert res.point_params == {"scaling": ["replicas", "mode"], "batch_lr": ["global_batches", "lr_rules"]}
    diverged = res.steps[res.steps["status"] == "diverged"]
    assert diverged["step"].max() == 4
    # Epochs on the x axis: step x global batch / training-set size.
    row = res.steps[(res.steps["global_batch"] == 512)].iloc[-1]
    assert row["epoch_frac"] == pytest.approx(4 * 512 / 3200)
    assert set(res.runs.loc[res.runs["source"] == "scaling", "mode"]) == {"weak"}


def test_scaling_frame_uses_only_sources_that_vary_replicas(sweeps):
    res = results.load(list(sweeps))
    df = results.scaling_frame(res)
    assert df["replicas"].tolist() == [1, 2, 4] and set(df["source"]) == {"scaling"}
    assert df["speedup"].tolist() == pytest.approx([1.0, 1.8, 3.2])
    assert df["efficiency"].tolist() == pytest.approx([1.0, 0.9, 0.8])


def _two_axis_sweep(root: Path, rates: dict) -> Path:
    """A scaling sweep over replicas x seed x model: rates[(model, seed, replicas)] images/sec."""
    return _sweep(root, "01_data_parallel_scaling.ipynb", [
        (f"{i:02d}_{m}-{seed}-{n}", {"replicas": [n], "seed": seed, "model": m, "mode": "weak"},
         {"status": "ok", "replicas": n, "global_batch": 64 * n, "per_replica_batch": 64, "train_examples": 6400,
          "images_per_sec": ips, "images_per_sec_uncertainty": 2.0, "device_kind": "GPU"})
        for i, ((m, seed, n), ips) in enumerate(rates.items())])


def test_scaling_is_computed_within_each_group_of_points_that_differ_only_in_replicas(tmp_path):
    # A second grid axis (model) makes two configurations; seeds are repeats of one. Sorting every row by replicas
    # and taking the first as the baseline compared small_vgg's 1-replica rate with small_cnn's.
    rates = {("small_cnn", 0, 1): 1000.0, ("small_cnn", 1, 1): 1100.0, ("small_cnn", 0, 2): 1900.0,
             ("small_cnn", 1, 2): 2100.0, ("small_vgg", 0, 1): 400.0, ("small_vgg", 1, 1): 420.0,
             ("small_vgg", 0, 2): 600.0, ("small_vgg", 1, 2): 660.0}
    res = results.load([_two_axis_sweep(tmp_path / "sc", rates)])
    df = results.scaling_frame(res)
    vgg = df[df["point_params"].str.contains("small_vgg")].sort_values("replicas")
    assert vgg["speedup"].tolist() == pytest.approx([1.0, 1.0] + [630 / 410] * 2)
    assert set(df["group"]) == {"model=small_cnn", "model=small_vgg"}
    by = {(g, n): r for (g, n), r in df.groupby(["group", "replicas"])}
    cnn1, cnn2, vgg1, vgg2 = (by[k] for k in (("model=small_cnn", 1), ("model=small_cnn", 2),
                                                ("model=small_vgg", 1), ("model=small_vgg", 2)))
    # Every group's smallest count has speed-up 1.0, in every one of its rows (both seeds).
    assert cnn1["speedup"].tolist() == [1.0, 1.0] and vgg1["speedup"].tolist() == [1.0, 1.0]
    assert cnn2["speedup"].tolist() == pytest.approx([2000 / 1050] * 2)
    assert vgg2["speedup"].tolist() == pytest.approx([630 / 410] * 2)
    assert vgg2["efficiency"].tolist() == pytest.approx([630 / 410 / 2] * 2)
    assert cnn2["repeats"].tolist() == [2, 2] and cnn2["group_images_per_sec"].tolist() == pytest.approx([2000.0] * 2)
    assert cnn2["images_per_sec_spread"].iloc[0] == pytest.approx(pd.Series([1900.0, 2100.0]).std())
    # The speed-up's uncertainty comes from the repeats' spread (std / sqrt(2) of each mean), not the runs' 2 img/s.
    assert cnn2["speedup_uncertainty"].iloc[0] == pytest.approx(
        2000 / 1050 * ((100 / 2000) ** 2 + (50 / 1050) ** 2) ** 0.5, rel=1e-6)
    assert (df["baseline_replicas"] == 1).all()

    from tftoolkit.experiments import findings

    text = " ".join(findings.scaling(res))
    assert ("**Scaling (weak, model=small_cnn):** 2 replicas ran at 2000 images/s (mean of 2 runs, spread ±141), "
            "1.90x ± 0.13 the 1-replica rate (mean of 2): 95% scaling efficiency") in text
    assert "**Scaling (weak, model=small_vgg):** 2 replicas ran at 630 images/s" in text and "77% scaling" in text

    # scaling.csv says the same; and the figures draw one line per group, at the group's mean.
    written = tables.save_tables(res, tmp_path / "out")
    csv = pd.read_csv(written["scaling"])
    assert csv.groupby("group")["speedup"].min().tolist() == [1.0, 1.0]
    from tftoolkit.plots import scaling as scaling_plots

    fig = scaling_plots.plot_throughput(df)
    lines = {c.get_label(): c for c in fig.axes[0].containers}
    assert set(lines) == {"measured (weak scaling, model=small_cnn)", "measured (weak scaling, model=small_vgg)"}
    ys = lines["measured (weak scaling, model=small_vgg)"].lines[0].get_ydata()
    assert list(ys) == pytest.approx([410.0, 630.0])
    fig = scaling_plots.plot_efficiency(df)
    effs = {ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[0].lines if ln.get_label().startswith("weak")}
    assert effs["weak scaling, model=small_vgg"] == pytest.approx([100.0, 630 / 410 / 2 * 100])


def test_seeds_alone_are_repeats_of_one_configuration(tmp_path):
    rates = {("small_cnn", 0, 1): 1000.0, ("small_cnn", 1, 1): 1100.0, ("small_cnn", 0, 2): 1900.0,
             ("small_cnn", 1, 2): 2100.0}
    df = results.scaling_frame(results.load([_two_axis_sweep(tmp_path / "sc", rates)]))
    # The second seed's 1-replica point is the baseline's repeat, not a 1.1x "speed-up" over the first seed's.
    assert df.loc[df["replicas"] == 1, "speedup"].tolist() == [1.0, 1.0]
    assert df.loc[df["replicas"] == 2, "speedup"].tolist() == pytest.approx([2000 / 1050] * 2)
    assert set(df["group"]) == {""}


def test_step_breakdown_and_communication_are_drawn_per_group(tmp_path):
    # replicas x model x seed: each model is a configuration with its own step breakdown; seeds are its repeats.
    # Averaging every run at one replica count mixed small_vgg's 90 ms compute with small_cnn's 10 ms.
    times = {"small_cnn": (0.010, 0.002), "small_vgg": (0.090, 0.030)}   # (compute, all-reduce) at 2 replicas
    points = []
    for m, (compute, allreduce) in times.items():
        for seed in (0, 1):
            for n in (1, 2):
                points.append((f"{len(points):02d}_{m}-{seed}-{n}", {"replicas": [n], "seed": seed, "model": m,
                                                                        "mode": "weak"},
                               {"status": "ok", "replicas": n, "global_batch": 64 * n, "per_replica_batch": 64,
                                "train_examples": 6400, "images_per_sec": 1000.0 * n, "device_kind": "GPU",
                                "images_per_sec_uncertainty": 2.0, "input_wait_s": 0.0,
                                # the seeds' repeats differ by +-1 ms of compute: their mean is the time above
                                "compute_time_s": compute + (0.001 if seed else -0.001),
                                "allreduce_time_s": allreduce * (n - 1),
                                "allreduce_direct_time_s": allreduce * (n - 1)}))
    res = results.load([_sweep(tmp_path / "sc", "01_data_parallel_scaling.ipynb", points)])
    df = results.scaling_frame(res)
    from tftoolkit.plots import comm, scaling as scaling_plots

    long = scaling_plots.breakdown_frame(df)
    ms = long.set_index(["group", "replicas", "part"])["ms"]
    assert set(long["group"]) == {"weak scaling, model=small_cnn", "weak scaling, model=small_vgg"}
    assert ms[("weak scaling, model=small_vgg", 2, "compute")] == pytest.approx(90.0)
    assert ms[("weak scaling, model=small_cnn", 2, "compute")] == pytest.approx(10.0)
    assert ms[("weak scaling, model=small_vgg", 2, "gradient all-reduce")] == pytest.approx(30.0)
    fig = scaling_plots.plot_step_breakdown(df)
    ax = fig.axes[0]
    assert len(ax.patches) == 3 * 2 * 2                       # 3 parts x 2 counts x 2 configurations
    tops = sorted(round(p.get_y() + p.get_height(), 6) for p in ax.patches)
    assert tops[-1] == pytest.approx(120.0)                  # small_vgg at 2 replicas: 90 + 30 + 0 ms
    texts = {t.get_text() for t in ax.texts}
    assert {"weak scaling, model=small_cnn", "weak scaling, model=small_vgg"} <= texts

    table = comm.comm_frame(df)
    vgg = table[table["group"] == "weak scaling, model=small_vgg"].set_index("replicas")
    assert vgg.loc[2, "compute_time_s"] == pytest.approx(0.090)
    assert vgg.loc[2, "communication_share"] == pytest.approx(30 / 120 * 100)
    fig = comm.plot_comm_vs_compute(df)
    left, right = fig.axes
    shares = {ln.get_label(): list(ln.get_ydata()) for ln in right.get_lines() if "model=" in ln.get_label()}
    assert shares == {"weak scaling, model=small_cnn": pytest.approx([0.0, 2 / 12 * 100]),
                      "weak scaling, model=small_vgg": pytest.approx([0.0, 30 / 120 * 100])}
    assert "compute (no all-reduce) (weak scaling, model=small_vgg)" in {ln.get_label() for ln in left.get_lines()}

    # The findings say it per group too: small_cnn's all-reduce is 2 of 12 ms, small_vgg's 30 of 120 ms.
    from tftoolkit.experiments import findings

    assert findings.communication(res) == [
        "**Communication (weak, model=small_cnn):** the all-reduce never overtakes the compute in these runs; its "
        "largest share is 17% of the step, at 2 replicas (2.00 ms against 10.00 ms of compute). These runs recorded "
        "no uncertainty for the parts, so the comparison is not checked against noise.",
        "**Communication (weak, model=small_vgg):** the all-reduce never overtakes the compute in these runs; its "
        "largest share is 25% of the step, at 2 replicas (30.00 ms against 90.00 ms of compute). These runs recorded "
        "no uncertainty for the parts, so the comparison is not checked against noise."]


# The overview's columns for the two sweeps: what varied (mode did not: every scaling point is weak), status, the
# error, and the figures a reader compares.
COMPARED = ["source", "id", "replicas", "global_batches", "lr_rules", "status", "error", "images/sec", "val accuracy",
            "input headroom"]


def test_overview_lists_every_point_with_status_and_error(sweeps):
    res = results.load(list(sweeps))
    ov = tables.overview(res)
    assert list(ov.columns) == COMPARED
    failed = ov[ov["status"] == "failed"]
    assert len(failed) == 1 and failed["error"].iloc[0] == "ValueError: boom"
    counts = tables.status_counts(res)
    assert counts.set_index(["source", "status"])["count"].to_dict() == {
        ("batch_lr", "diverged"): 1, ("batch_lr", "failed"): 1, ("batch_lr", "ok"): 2, ("scaling", "ok"): 3}


def test_figures_come_from_the_right_sources_and_are_saved(sweeps, tmp_path):
    res = results.load(list(sweeps))
    figs = figures.all_figures(res, tmp_path / "figures")
    assert {"throughput", "efficiency", "step_breakdown", "images_per_replica", "comm_vs_compute", "loss_curves",
            "val_accuracy", "final_accuracy"} <= set(figs)
    assert "allreduce_time" not in figs and "monitor" not in figs  # no allreduce.csv, no monitor.csv: skipped
    assert (tmp_path / "figures" / "throughput.png").exists() and (tmp_path / "figures" / "loss_curves.svg").exists()
    # A weak-scaling study's global batch grows with its replicas: it is not a batch-size study.
    assert set(results.batch_frames(res)[2]["source"]) == {"batch_lr"}
    assert {t.get_text() for t in figs["loss_curves"].legends[0].get_texts()} == {
        "global batch 64", "global batch 512", "diverged / failed (run stopped)"}
    # The batch/LR runs (4 replicas each) do not leak into the scaling figure.
    measured = [ln for ln in figs["throughput"].axes[0].get_lines() if ln.get_linestyle() == "-"][0]
    assert list(measured.get_xdata()) == [1, 2, 4]


def test_show_displays_the_saved_png_at_inline_size_then_the_caption(sweeps, tmp_path, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    sections.show(results.load(list(sweeps)), "throughput", tmp_path)
    image, caption = shown
    png = (tmp_path / "throughput.png").read_bytes()
    assert image.data == png and (tmp_path / "throughput.svg").exists()
    from PIL import Image

    with Image.open(tmp_path / "throughput.png") as saved:
        assert image.width == round(saved.width * 100 / 150)  # savefig.dpi 150, shown at figure.dpi 100
    assert figures.CAPTIONS["throughput"] in caption.data
    shown.clear()
    sections.show(results.load(list(sweeps)), "allreduce_time", tmp_path)  # no allreduce.csv here
    assert len(shown) == 1 and "not in these results" in shown[0].data


def test_the_points_table_shows_what_a_reader_compares_not_every_column(sweeps):
    import re

    res = results.load(list(sweeps))
    assert len(res.points.columns) > 25  # results.csv: parameters, status, error and every summary scalar
    ov = tables.overview(res).fillna("")  # as notebook 04 shows it
    # The HTML table the report page shows: exactly these headers (pandas adds an empty one over the index).
    head = re.search(r"<thead>(.*?)</thead>", ov._repr_html_(), re.S).group(1)
    assert re.findall(r"<th(?:\s[^>]*)?>(.*?)</th>", head, re.S) == [""] + COMPARED
    rows = ov.set_index("id")
    assert rows.loc["00_replicas-1", "images/sec"] == "1,000 ± 5"
    assert rows.loc["00_replicas-1", "input headroom"] == "2.88 (fed)"
    assert rows.loc["01_replicas-2", "input headroom"] == "1.60 (near)"
    assert rows.loc["02_replicas-4", "input headroom"] == "0.90 (input-bound)"
    # with the error runs now record beside it
    assert tables._headroom({"input_headroom": 1.6, "input_headroom_uncertainty": 0.05,
                             "input_verdict": "near"}) == "1.60 ± 0.05 (near)"
    assert rows.loc["00_b-64_r-none", "val accuracy"] == "60.0%"
    # Each sweep's own parameters, whole numbers as such; blank in the other sweep's rows (the batch runs had 4
    # replicas, but replicas was not what that sweep varied).
    assert rows["replicas"].tolist() == [1, 2, 4, "", "", "", ""]
    assert rows["global_batches"].tolist() == ["", "", "", 64, 64, 512, 512]
    # A run from before runs measured their input: blank, not an error and not NaN.
    assert rows.loc["00_b-64_r-none", "input headroom"] == ""
    assert rows.loc["03_b-512_r-sqrt", "images/sec"] == ""  # failed: no run


def test_overview_of_run_folders_shows_the_config_that_varied(tmp_path):
    for n in (1, 2):
        _run(tmp_path / "nb01" / f"r{n}", {"status": "ok", "replicas": n, "global_batch": 64 * n, "train_examples": 640,
                                           "images_per_sec": 100.0 * n}, {"replicas": n, "seed": 0, "steps": 10})
    ov = tables.overview(results.load([tmp_path / "nb01"]))
    assert list(ov.columns) == ["run", "replicas", "status", "images/sec"]
    assert ov["replicas"].tolist() == [1, 2] and ov["images/sec"].tolist() == ["100", "200"]


def test_another_tasks_runs_show_their_loss_and_given_metrics_by_name(tmp_path):
    for n in (1, 2):
        _run(tmp_path / "reg" / f"r{n}", {"status": "ok", "replicas": n, "global_batch": 64, "train_examples": 640,
                                          "images_per_sec": 100.0 * n, "val_accuracy": float("nan"),
                                          "val_loss": 0.25 * n, "val_mae": 0.5 * n, "loss": "mse", "metrics": ["mae"]},
             {"replicas": n, "seed": 0, "steps": 10})
    ov = tables.overview(results.load([tmp_path / "reg"]))
    assert list(ov.columns) == ["run", "replicas", "status", "images/sec", "val loss", "val mae"]
    assert ov["val mae"].tolist() == ["0.5", "1"] and ov["val loss"].tolist() == ["0.25", "0.5"]


def test_save_tables(sweeps, tmp_path):
    res = results.load(list(sweeps))
    written = tables.save_tables(res, tmp_path / "tables")
    assert set(written) == {"runs", "points", "scaling"}
    assert len(pd.read_csv(written["runs"])) == 6
    # The CSVs keep the full tables the overview leaves out: every column of every results.csv, every point.
    points = pd.read_csv(written["points"])
    assert list(points.columns[:2]) == ["source", "id"]
    assert set(points.columns) == set(res.points.columns) and len(points) == 7
    assert {"mode", "input_headroom", "input_capacity_per_core", "allreduce_time_s"} <= set(points.columns)
    assert {"input_verdict", "input_capacity_images_per_sec", "compute_time_s"} <= set(pd.read_csv(written["runs"]).columns)


def test_missing_folder_and_unknown_figure_are_clear_errors(sweeps, tmp_path):
    with pytest.raises(DataError, match="not found"):
        results.load([tmp_path / "nope"])
    with pytest.raises(DataError, match="unknown figure"):
        figures.figure(results.load(list(sweeps)), "pie_chart")


@pytest.mark.slow
def test_report_never_imports_tensorflow(sweeps):
    assert_no_tensorflow("""
        import sys
        from tftoolkit.experiments.report import figures, results
        figures.all_figures(results.load(sys.argv[1:]))
    """, *map(str, sweeps))


def test_every_figure_has_a_caption():
    assert set(figures.CAPTIONS) == set(figures.FIGURES)


def test_discover_finds_result_folders_next_to_the_output(tmp_path):
    (tmp_path / "runs" / "01_scaling" / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "01_scaling" / "runs" / "r1" / "summary.json").write_text("{}")
    (tmp_path / "runs" / "sweep").mkdir()
    (tmp_path / "runs" / "sweep" / "sweep.json").write_text("{}")
    (tmp_path / "runs" / "notes").mkdir()
    (tmp_path / "runs" / "04_report").mkdir()
    found = results.discover([], tmp_path / "runs" / "04_report")
    assert [p.name for p in found] == ["01_scaling", "sweep"]
    assert results.discover(["a", "b"], tmp_path) == [Path("a"), Path("b")]
    assert results.discover([], tmp_path / "nowhere" / "x") == []


def _foreign_sweep(root: Path) -> Path:
    """A sweep of a user's own notebook: no training runs, each point wrote results.json (score, loss)."""
    root.mkdir(parents=True)
    (root / "sweep.json").write_text(json.dumps({"identity": {"notebook": "mine.ipynb", "points": []}}))
    rows = []
    for i, (lr, batch) in enumerate([(0.1, 32), (0.1, 64), (0.01, 32), (0.01, 64)]):
        pid = f"0{i}_lr-{lr}_batch-{batch}"
        pdir = root / "runs" / pid
        pdir.mkdir(parents=True)
        ok = i != 3
        (pdir / "point.json").write_text(json.dumps({"id": pid, "status": "ok" if ok else "failed",
                                                     "recorded": ["score", "loss"] if ok else []}))
        rows.append({"id": pid, "lr": lr, "batch": batch, "status": "ok" if ok else "failed",
                     "error": None if ok else "ValueError: boom", "wall_s": 3.0,
                     "score": 0.5 + 0.1 * i if ok else None, "loss": 1.0 - 0.1 * i if ok else None})
    pd.DataFrame(rows).to_csv(root / "results.csv", index=False)
    return root


def test_a_sweep_of_a_user_notebook_reports_what_it_recorded(tmp_path, monkeypatch):
    from tftoolkit.experiments import findings

    res = results.load([_foreign_sweep(tmp_path / "mine")])
    table = tables.overview(res)
    assert {"lr", "batch", "status", "error", "score", "loss"} <= set(table.columns)
    assert table.loc[table["status"] == "ok", "error"].tolist() == ["", "", ""]  # no NaN where nothing went wrong
    text = findings.markdown(res)
    assert "**score** (mine, 3 finished point(s)): from 0.5 (lr=0.1, batch=32) to 0.7 (lr=0.01, batch=32)" in text
    assert "1 of 4 did not finish normally" in text and "Scaling" not in text
    # Sections: only the one the results have data for; each figure saved; nothing printed as a Python object.
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    for name in sections.SECTIONS:
        sections.section(res, name, tmp_path / "figures")
    headings = [o.data for o in shown if hasattr(o, "data") and isinstance(o.data, str) and o.data.startswith("## ")]
    assert headings == ["## Recorded results\n\nWhat each point's notebook recorded in `results.json`, by parameter."]
    assert (tmp_path / "figures" / "recorded.png").stat().st_size > 5000
    written = tables.save_tables(res, tmp_path / "tables")
    assert "PosixPath" not in written._repr_markdown_() and "points.csv" in written._repr_markdown_()
    assert "score" in pd.read_csv(written["points"]).columns


def test_a_tie_is_not_called_a_best_rule(tmp_path):
    from tftoolkit.experiments import findings

    runs = pd.DataFrame({"global_batch": [32, 32, 32, 256, 256], "lr_rule": ["none", "linear", "sqrt", "none", "linear"],
                         "warmup_epochs": 0.0, "val_accuracy": [0.33, 0.33, 0.33, 0.40, 0.90], "status": "ok"})
    res = results.Results([], pd.DataFrame(), runs.assign(source="s", run=[f"r{i}" for i in range(5)]))
    monkey = findings.results.batch_frames
    try:
        findings.results.batch_frames = lambda r: (pd.DataFrame(), pd.DataFrame(), runs)
        line = findings.batch_and_lr(res)[0]
    finally:
        findings.results.batch_frames = monkey
    assert "32: no rule better than another (all 33%)" in line and "256: linear (90%)" in line


def test_a_list_parameter_with_one_value_per_point_is_named_by_its_value(tmp_path):
    # Notebook 01 takes `replicas` as a list; its sweep gives each point one value, [1] or [2]: "replicas=2".
    _sweep(tmp_path / "scaling", "01_data_parallel_scaling.ipynb", [
        (f"0{i}_replicas-{n}", {"replicas": [n]}, {"status": "ok", "replicas": n, "global_batch": 64 * n,
                                                  "train_examples": 640, "images_per_sec": 100.0 * n})
        for i, n in enumerate((1, 2))])
    labels = tables.run_labels(results.load([tmp_path / "scaling"]))
    assert sorted(labels) == ["replicas=1", "replicas=2"]


def test_a_point_left_running_by_a_killed_sweep_reads_interrupted_and_a_live_one_running(tmp_path):
    from tftoolkit import rundir

    root = _sweep(tmp_path / "s", "nb.ipynb", [("p0", {"x": 1}, None), ("p1", {"x": 2}, None)])
    table = pd.read_csv(root / "results.csv")
    table.loc[1, "status"] = "running"  # as the sweep wrote it while p1 ran, before it was killed
    table.to_csv(root / "results.csv", index=False)
    (root / rundir.LOCK_FILE).write_text(json.dumps({"pid": 1, "host": socket.gethostname()}))  # a dead one's record
    assert results.load(root).points["status"].tolist() == ["failed", "interrupted"]
    with rundir.lock(root, "sweep folder"):  # a sweep works there now: its point does run
        assert results.load(root).points["status"].tolist() == ["failed", "running"]


BAD_SUMMARIES = ["[]", '{"status": "ok", "replicas": "two", "global_batch": 128}', '{"status": "o']


def test_one_unreadable_run_is_listed_as_such_and_the_others_reported(sweeps, tmp_path):
    folder = tmp_path / "scaling" / "runs" / "02_replicas-4" / "runs" / "r"
    loaded = []
    for bad in BAD_SUMMARIES:  # not JSON of a summary, a field of the wrong type, cut short
        (folder / "summary.json").write_text(bad)
        res = results.load(list(sweeps))
        row = res.runs.set_index("run_dir").loc[str(folder.resolve())]
        assert row["status"] == "unreadable" and "summary.json" in row["error"], bad
        assert (res.runs["status"] == "ok").sum() == 4, bad  # the other runs are all there
        loaded.append(res)
    # Nothing of an unreadable summary is kept (results._run_row), so every bad one gives the same runs but for the
    # error: the figures, drawn once, are drawn for each.
    for res in loaded[1:]:
        pd.testing.assert_frame_equal(res.runs.drop(columns="error"), loaded[0].runs.drop(columns="error"))
    figs = figures.all_figures(loaded[-1], tmp_path / "figures")
    assert {"throughput", "loss_curves"} <= set(figs)


@pytest.mark.parametrize("bad", BAD_SUMMARIES)
def test_an_unreadable_run_in_a_plain_folder_is_in_its_overview_with_why(tmp_path, bad):
    # A folder of run directories (no sweep): its overview lists the run as unreadable, with why.
    plain = tmp_path / "plain"
    good = {"status": "ok", "replicas": 1, "global_batch": 64, "train_examples": 640, "images_per_sec": 100.0}
    _run(plain / "a", good, {"seed": 0})
    _run(plain / "b", {**good, "replicas": 2}, {"seed": 1})
    (plain / "b" / "summary.json").write_text(bad)
    ov = tables.overview(results.load([plain])).set_index("run")
    assert ov.loc["a", "status"] == "ok" and ov.loc["b", "status"] == "unreadable" and "summary.json" in ov.loc["b", "error"]


def test_the_report_opens_with_what_ran_where_and_when(sweeps):
    from tftoolkit.experiments.report import header

    scaling, batch = sweeps
    run = scaling / "runs" / "00_replicas-1" / "runs" / "r"
    (run / "env.json").write_text(json.dumps({
        "collected_at": "2026-12-04T17:26:50+00:00", "host": {"hostname": "gpu-box", "cpu_model": "Xeon",
                                                              "cpu_logical_cores": 32},
        "gpus": [{"name": "NVIDIA H200"}], "tensorflow": {"version": "2.21.0"},
        "tftoolkit": {"device_kind": "GPU", "version": "0.1.0"}}))
    text = header.markdown(results.load([scaling, batch]))
    for part in ("**What was measured:** data-parallel scaling (3 runs at 1, 2, 4 replicas); batch size and "
                 "learning rate (3 runs)", "**Devices:** GPU (NVIDIA H200)", "gpu-box (Xeon, 32 logical cores)",
                 "2026-12-04 17:26 UTC", "tftoolkit 0.1.0 measured", "TensorFlow 2.21.0", "scaling, batch_lr"):
        assert part in text, part
    bare = header.facts(results.load([batch]))  # runs without env.json: said, not invented
    assert bare["machines"] == "not recorded" and bare["toolkit"] == "not recorded by these runs"


def test_chance_level_accuracy_of_a_throughput_run_is_labelled_expected(tmp_path):
    points = [(f"0{i}_replicas-{n}", {"replicas": n},
               {"status": "ok", "replicas": n, "global_batch": 64 * n, "train_examples": 6400, "steps": 60,
                "images_per_sec": 1000.0 * n, "device_kind": "CPU-simulated", "num_classes": 10, "val_accuracy": acc})
              for i, (n, acc) in enumerate([(1, 0.098), (2, 0.158), (4, 0.62)])]
    res = results.load([_sweep(tmp_path / "scaling", "01_data_parallel_scaling.ipynb", points)])
    cells = tables.overview(res)["val accuracy"].tolist()
    assert cells == ["9.8%" + tables.CHANCE_LABEL, "15.8%" + tables.CHANCE_LABEL, "62.0%"]
    notes = " ".join(sections._section_notes(res, "scaling"))
    assert "2 scaling run(s) ended at chance-level validation accuracy (9.8%-15.8%; chance is 10.0%) after 60 steps" \
        in notes and "expected of a throughput run" in notes
    assert tables.near_chance(0.55, 2) and not tables.near_chance(0.8, 2) and not tables.near_chance(float("nan"), 10)


def test_a_breakdown_of_another_step_than_training_s_is_said_in_the_report(tmp_path):
    points = [(f"0{i}_replicas-{n}", {"replicas": n},
               {"status": "ok", "replicas": n, "global_batch": 64 * n, "train_examples": 6400, "steps": 60,
                "images_per_sec": 1000.0 * n, "device_kind": "CPU-simulated", "step_time_s": 0.020,
                "breakdown_step_time_s": step, "breakdown_step_matches_training": step == 0.020})
              for i, (n, step) in enumerate([(1, 0.020), (2, 0.040)])]
    res = results.load([_sweep(tmp_path / "scaling", "01_data_parallel_scaling.ipynb", points)])
    notes = " ".join(sections._section_notes(res, "scaling"))
    assert "In 1 run(s) the step-time breakdown timed a step other than training's (2.00-2.00x" in notes
