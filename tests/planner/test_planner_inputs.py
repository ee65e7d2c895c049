"""The planner's inputs cannot be wrong silently: each bad one is one line on stderr and exit code 2."""

import pytest

from tftoolkit.cli import main
from tftoolkit.planner import plan as planner

BASE = ["predict", "--gpu", "v100", "--params", "25000000", "--per-replica-batch", "64", "--images-per-sec", "300"]


def _refused(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("value", ["2", "-0.1", "nan", "inf"])
def test_an_overlap_outside_zero_to_one_is_refused(capsys, value):
    _refused(capsys, BASE + ["--overlap", value], "--overlap", "[0, 1]")


@pytest.mark.parametrize("flag", ["--max-replicas", "--nics-per-host", "--gpus-per-host"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_zero_or_negative_counts_are_refused(capsys, flag, value):
    _refused(capsys, BASE + [flag, value], flag, ">= 1")


def test_a_model_and_a_parameter_count_together_are_refused(capsys):
    # FLOPs from one and gradient bytes from the other would describe no model at all.
    _refused(capsys, ["predict", "--gpu", "v100", "--model", "resnet50", "--params", "1000",
                      "--per-replica-batch", "8"], "--model", "--params")


@pytest.mark.parametrize("size", ["100000", "0", "-5"])
def test_an_image_size_no_model_can_be_built_at_is_refused_before_tensorflow_builds_it(capsys, size):
    _refused(capsys, ["predict", "--gpu", "v100", "--model", "resnet50", "--per-replica-batch", "8",
                      "--image-size", size], "--image-size")


def test_a_link_of_your_own_between_hosts_is_taken_as_inside_one():
    plan = planner.Plan(gpu="v100", per_replica_batch=64, params=25_000_000, images_per_sec=300,
                        replica_counts=(8, 16), inter_host="mynet=12.5:4", nics_per_host=2)
    frame, assumed = planner.forecast(plan)
    assert assumed["inter_host"] == "mynet"
    two = frame[frame["replicas"] == 16].iloc[0]
    one = frame[frame["replicas"] == 8].iloc[0]
    assert two["allreduce_s"] > one["allreduce_s"]


def test_a_link_of_your_own_between_hosts_through_the_cli(capsys):
    assert main(BASE + ["--inter-host", "mynet=12.5", "--replica-counts", "8,16"]) == 0
    assert "16 GPU(s) (2 host(s))" in capsys.readouterr().out
