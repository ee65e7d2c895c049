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
def test_05_batch_science_runs_in_smoke_mode(tmp_path):
    import papermill

    out = tmp_path / "results"
    executed = tmp_path / "executed.ipynb"
    papermill.execute_notebook(str(NOTEBOOK), str(executed), parameters={"smoke": True, "out_dir": str(out),
                                                                         "replicas": 2},
                               cwd=str(ROOT), progress_bar=False)
    summary = json.loads((out / "train" / "summary.json").read_text())
    assert summary["status"] == "ok" and math.isfinite(summary["noise_scale"]) and summary["noise_scale_steps"] > 0
    advice = json.loads((out / "advice.json").read_text())
    assert advice["noise_scale"] == summary["noise_scale"] and advice["recommended"]["replicas"] >= 1
    assert pd.read_csv(out / "tradeoff.csv")["recommended"].sum() == 1
    assert json.loads((out / "find_batch" / "batch_find.json").read_text())["max_per_replica_batch"] > 0
    assert len(pd.read_csv(out / "find_lr" / "lr_find.csv")) > 0
    prediction = pd.read_csv(out / "prediction.csv")
    assert prediction["replicas"].max() == 64 and prediction["efficiency"].between(0, 1.0 + 1e-9).all()
    for name in ("lr_find", "batch_find", "noise_scale", "tradeoff", "efficiency_vs_replicas"):
        for ext in ("png", "svg"):
            assert (out / "figures" / f"{name}.{ext}").stat().st_size > 1000, f"{name}.{ext}"
    nb = nbformat.read(str(executed), as_version=4)
    shown = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                if "image/png" in o.get("data", {}))
    assert shown == 5  # every figure also renders inline
