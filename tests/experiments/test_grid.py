"""tftoolkit.grid: a grid of configs trained in one process; refused and failing combinations are recorded."""

import json

import pandas as pd

from tftoolkit.experiments import grid


def test_run_names_name_what_varies():
    points = [{"global_batch": 64, "lr_rule": "none"}, {"global_batch": 512, "lr_rule": "none"}]
    assert grid.run_names(points, ["global_batch", "lr_rule"]) == ["global_batch-64", "global_batch-512"]
    assert grid.run_names([{"a": 1}], ["a"]) == ["run"]


def test_a_refused_combination_is_recorded_and_the_grid_goes_on(tmp_path):
    # 3 replicas do not divide either global batch: both combinations are refused before any training,
    # and each is recorded where the report looks for runs.
    frame = grid.train_grid({"replicas": 3, "dataset": "synthetic"}, {"global_batch": [64, 128]}, tmp_path)
    assert frame["status"].tolist() == ["failed", "failed"]
    assert frame["error"].str.contains("does not divide by replicas=3").all()
    assert pd.read_csv(tmp_path / "results.csv")["global_batch"].tolist() == [64, 128]
    summary = json.loads((tmp_path / "runs" / "global_batch-64" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["global_batch"] == 64 and summary["replicas"] == 3
