"""notebooks/05_batch_science.ipynb runs end to end through papermill in smoke mode and writes every result of the
finders, the noise-scale run, advise and predict. (tests/test_notebooks.py checks that it is committed clean,
thin and generated from notebooks/make_notebooks.py, and leaves executing it to this module.)"""

import json
import math

import nbformat
import pandas as pd
import pytest

from helpers import ROOT

NOTEBOOK = ROOT / "notebooks" / "05_batch_science.ipynb"


@pytest.mark.slow
def test_05_batch_science_runs_in_smoke_mode_exactly_as_its_command_says(tmp_path):
    # README's command, `papermill notebooks/05_batch_science.ipynb out.ipynb -p smoke True`, with the notebook's
    # own defaults (4 replicas); only out_dir is added. It used to fail there: 30 smoke steps at chance leave no
    # positive noise scale, and advise raised. Now the advice says why it cannot recommend, and the notebook ends.
    import subprocess
    import sys
    from pathlib import Path

    from test_notebooks import hint_args

    assert hint_args("05_batch_science") == ["-p", "smoke", "True", "-p", "compute_ms", "50"]
    out = tmp_path / "results"
    executed = tmp_path / "executed.ipynb"
    done = subprocess.run([str(Path(sys.executable).parent / "papermill"), "notebooks/05_batch_science.ipynb",
                           str(executed), *hint_args("05_batch_science"), "-p", "out_dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "train" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["replicas"] == 4 and summary["noise_scale_steps"] > 0
    advice = json.loads((out / "advice.json").read_text())
    assert advice["noise_scale"] == summary["noise_scale"] or (math.isnan(advice["noise_scale"])
                                                               and math.isnan(summary["noise_scale"]))
    if advice["recommended"] is None:  # what smoke's short run at chance gives: said, with the reasons
        assert advice["reliable"] is False and advice["warnings"]
    else:
        assert pd.read_csv(out / "tradeoff.csv")["recommended"].sum() == 1
    assert summary["noise_scale_reliable"] is False  # 30 steps at chance cannot be trusted, and the run says so
    assert json.loads((out / "find_batch" / "batch_find.json").read_text())["max_per_replica_batch"] > 0
    assert len(pd.read_csv(out / "find_lr" / "lr_find.csv")) > 0
    # Compute measured on simulated CPU replicas is no basis for a GPU forecast (without compute_ms it is refused:
    # tests/planner/test_predict.py); the smoke command gives one, so the page shows a forecast, not a refusal.
    prediction = json.loads((out / "prediction.json").read_text())
    assert not prediction.get("refused") and len(pd.read_csv(out / "prediction.csv")) > 0
    for name in ("lr_find", "batch_find", "noise_scale", "tradeoff", "efficiency_vs_replicas"):
        for ext in ("png", "svg"):
            assert (out / "figures" / f"{name}.{ext}").stat().st_size > 1000, f"{name}.{ext}"
    nb = nbformat.read(str(executed), as_version=4)
    shown = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                if "image/png" in o.get("data", {}))
    assert shown == 5  # every figure also renders inline
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "NOT RELIABLE" in text  # advise's reasons are printed, before any recommendation
    assert "no forecast" not in text
