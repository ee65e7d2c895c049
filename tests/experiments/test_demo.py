"""tftoolkit.demo and the example sweeps in sweeps/: the specs match the notebooks they run.

The demo itself (several minutes) is `make demo`; here only what decides what it runs.
"""


import pytest

from tftoolkit.experiments import demo
from tftoolkit.experiments.sweep.spec import load as load_spec

from helpers import ROOT

SWEEPS = ROOT / "sweeps"


@pytest.mark.parametrize("gpus, counts", [(0, [1, 2, 4]), (1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])])
def test_replica_counts(gpus, counts):
    assert demo.replica_counts(gpus) == counts


@pytest.mark.parametrize("path", sorted(SWEEPS.glob("*.yaml")), ids=lambda p: p.name)
def test_example_sweeps_validate_against_their_notebooks(path):
    spec = load_spec(path)  # every parameter declared by the notebook, every value of the declared type
    assert spec.points and spec.report is not None and spec.report.name == "04_report.ipynb"


@pytest.mark.parametrize("gpus", [0, 8])
def test_demo_specs_on_cpu_and_on_gpus(gpus):
    specs = demo.specs(gpus)
    scaling = load_spec(specs["scaling"], SWEEPS)
    batch = load_spec(specs["batch_lr"], SWEEPS)
    assert [p.params["replicas"] for p in scaling.points] == demo.replica_counts(gpus)
    assert len(batch.points) == 7 and scaling.report is None and batch.report is None  # one report at the end
    assert batch.points[0].inject["replicas"] == (gpus or 2)
    # The study Goyal et al. ran: momentum SGD, an 8x range of batch, the rules none / linear / sqrt, warmup on
    # and off, on shapes16k; the largest batch has linear with and without warmup, and no scaling to compare.
    points = [(p.params["global_batches"], p.params["lr_rules"], p.params["warmup_epochs"]) for p in batch.points]
    batches = sorted({b for b, _, _ in points})
    assert batches[0] * 8 in batches and {"none", "linear", "sqrt"} <= {r for _, r, _ in points}
    assert batches[-1] == batches[0] * 8
    assert {(batches[-1], "linear", 0.5), (batches[-1], "linear", 0.0), (batches[-1], "none", 0.0)} <= set(points)
    fixed = batch.fixed
    assert fixed["optimizer"] == "momentum" and fixed["dataset"] == "shapes16k" and fixed["base_batch"] == batches[0]
