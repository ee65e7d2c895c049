"""Does it fit: one GPU's training memory at a per-GPU batch against the catalogue's memory, and the largest batch
that fits (planner.memory, on the batch finder's estimate)."""

import pytest

from tftoolkit.cli import main
from tftoolkit.planner import memory, predict
from tftoolkit.planner.plan import Plan

# planner.modelsize.memory("resnet50", 224, "float32"): the batch finder's estimate on keras.applications ResNet50.
RESNET50_FIXED, RESNET50_PER_EXAMPLE = 307_215_584.0, 296_969_696.0


def test_resnet50_at_256_in_fp32_does_not_fit_a_12_gb_k80_and_the_largest_batch_is_said():
    m = memory.usage("k80", 256, fixed=RESNET50_FIXED, per_example=RESNET50_PER_EXAMPLE)
    assert m["gpu_memory_gb"] == 12 and m["fits"] is False
    largest = int((12e9 - RESNET50_FIXED) // (memory.ACTIVATION_SCALE * RESNET50_PER_EXAMPLE))
    assert m["largest_batch"] == largest == 106
    assert memory.usage("k80", largest, fixed=RESNET50_FIXED, per_example=RESNET50_PER_EXAMPLE)["fits"]
    assert not memory.usage("k80", largest + 1, fixed=RESNET50_FIXED, per_example=RESNET50_PER_EXAMPLE)["fits"]
    assert "DOES NOT FIT" in memory.text(m) and "largest per-GPU batch that fits is 106" in memory.text(m)


def test_the_published_rows_that_ran_fit_where_they_ran():
    # K80 with ResNet-50 at 64 (TensorFlow's 2017 page), V100 16 GB at 128 in fp32 (NVIDIA's ResNet-50 v1.5 tables)
    assert memory.usage("k80", 64, fixed=RESNET50_FIXED, per_example=RESNET50_PER_EXAMPLE)["fits"]
    assert memory.usage("v100-sxm2-16", 128, fixed=RESNET50_FIXED, per_example=RESNET50_PER_EXAMPLE)["fits"]


def test_without_a_model_only_weights_gradients_and_slots_are_counted():
    m = memory.usage("rtx-2080-ti", 64, params=1_000_000_000)
    assert m["fixed_gb"] == pytest.approx(1e9 * 4 * 3 / 1e9)  # fp32 weights, gradients, one momentum slot
    assert m["fits"] is False and m["largest_batch"] is None
    assert "activations not counted" in memory.text(m) and "weights alone do not fit" in memory.text(m)
    assert memory.usage("h100-sxm", 64, params=25_000_000)["fits"] is True


def test_a_forecast_says_when_its_configuration_does_not_fit(capsys):
    plan = Plan(gpu="k80", per_replica_batch=256, params=25_636_712, model="resnet50", forward_flops=7.755e9,
                images_per_sec=50, replica_counts=(1, 2))
    result = predict.run_plan(plan, counted={"fixed": RESNET50_FIXED, "per_example": RESNET50_PER_EXAMPLE})
    assert result["memory"]["fits"] is False and result["memory"]["largest_batch"] == 106
    text = predict.plan_text(result)
    assert "DOES NOT FIT" in text and "25.6M parameters" in text and "7.75 GFLOPs" in text


@pytest.mark.slow
def test_the_cli_counts_resnet50_and_flags_256_on_a_k80(capsys):
    assert main(["predict", "--gpu", "k80", "--model", "resnet50", "--per-replica-batch", "256",
                 "--replica-counts", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "25.6M parameters" in out and "DOES NOT FIT" in out and "largest per-GPU batch that fits is 106" in out


def test_notebook_07s_candidates_are_marked_when_they_cannot_hold_the_batch():
    from tftoolkit.planner import candidates
    choice = candidates.compare(
        [{"name": "K80 box", "gpu": "k80", "interconnect": "pcie3", "images_per_sec": 50},
         {"name": "H200 box", "gpu": "h200-sxm", "interconnect": "pcie5", "images_per_sec": 3000}],
        model="big", params=2_000_000_000, forward_flops=1e9, per_replica_batch=8, replica_counts=(1, 2))
    fits = choice.groupby("candidate")["fits"].first()
    assert not fits["K80 box"] and fits["H200 box"]  # 24 GB of fp32 weights, gradients and momentum: not on 12 GB
