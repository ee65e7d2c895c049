"""notebooks/05_batch_science.ipynb: committed clean (parameters first, no outputs), and runs end to end through
papermill in smoke mode, writing every result of the finders, the noise-scale run, advise and predict."""

import json
import math
from pathlib import Path

import nbformat
import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "05_batch_science.ipynb"


def test_notebook_is_committed_clean_with_a_typed_parameters_cell():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "code" and "parameters" in first.metadata.get("tags", [])
    lines = [ln for ln in first.source.splitlines() if ln.strip()]
    assert lines[0].startswith("smoke: bool = False")
    assert all(": " in ln.split("=")[0] and "#" in ln for ln in lines)  # name: type = literal  # why
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None
            assert "def " not in cell.source and "class " not in cell.source


@pytest.mark.slow
def test_notebook_runs_in_smoke_mode(tmp_path):
    import papermill

    out = tmp_path / "results"
    papermill.execute_notebook(str(NOTEBOOK), str(tmp_path / "executed.ipynb"), kernel_name="python3",
                               parameters={"smoke": True, "out_dir": str(out), "replicas": 2}, progress_bar=False,
                               cwd=str(tmp_path))
    summary = json.loads((out / "train" / "summary.json").read_text())
    assert summary["status"] == "ok" and math.isfinite(summary["noise_scale"])
    advice = json.loads((out / "advise" / "advice.json").read_text())
    assert advice["noise_scale"] == summary["noise_scale"] and advice["recommended"]["replicas"] >= 1
    assert json.loads((out / "find_batch" / "batch_find.json").read_text())["max_per_replica_batch"] > 0
    assert (out / "find_lr" / "lr_find.csv").exists()
    for png in ("find_lr/lr_find.png", "find_batch/batch_find.png", "advise/tradeoff.png",
                "predict/efficiency_vs_replicas.png"):
        assert (out / png).stat().st_size > 10_000, png
