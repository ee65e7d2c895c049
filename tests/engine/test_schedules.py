import pytest

from tftoolkit.config import RunConfig

from helpers import lazy

schedules = lazy("tftoolkit.engine.schedules")  # imports Keras: collected without it (tests/helpers.py)


def test_linear_warmup_from_base_to_scaled_then_constant():
    # 4 replicas x 128 = 512 = 2 x base batch: linear rule doubles 0.1 to 0.2; 100 steps/epoch, 1 warmup epoch.
    c = RunConfig(replicas=4, per_replica_batch=128, base_lr=0.1, base_batch=256, lr_rule="linear", warmup_epochs=1,
                  schedule="constant", epochs=3)
    s = schedules.from_config(c, 51200)
    assert schedules.lr_at(s, 0) == pytest.approx(0.1)
    assert schedules.lr_at(s, 50) == pytest.approx(0.15)
    assert schedules.lr_at(s, 100) == pytest.approx(0.2)
    assert schedules.lr_at(s, 299) == pytest.approx(0.2)


def test_cosine_decays_to_zero_after_warmup():
    s = schedules.WarmupSchedule(peak_lr=1.0, start_lr=0.1, warmup_steps=10, total_steps=110, decay="cosine")
    assert schedules.lr_at(s, 5) == pytest.approx(0.55)
    assert schedules.lr_at(s, 10) == pytest.approx(1.0)
    assert schedules.lr_at(s, 60) == pytest.approx(0.5, abs=1e-6)
    assert schedules.lr_at(s, 110) == pytest.approx(0.0, abs=1e-6)


def test_step_decay_milestones():
    s = schedules.WarmupSchedule(peak_lr=0.4, start_lr=0.4, warmup_steps=0, total_steps=100, decay="step")
    assert schedules.lr_at(s, 49) == pytest.approx(0.4)
    assert schedules.lr_at(s, 50) == pytest.approx(0.04)
    assert schedules.lr_at(s, 75) == pytest.approx(0.004)


def test_sqrt_rule_peak_and_no_warmup():
    c = RunConfig(replicas=4, per_replica_batch=256, base_lr=0.001, base_batch=256, lr_rule="sqrt", optimizer="adam",
                  warmup_epochs=0, schedule="constant")
    s = schedules.from_config(c, 10240)
    assert schedules.lr_at(s, 0) == pytest.approx(0.002)
    assert schedules.lr_at(s, 9) == pytest.approx(0.002)
