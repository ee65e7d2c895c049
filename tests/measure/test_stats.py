"""The throughput formulas, pinned with numbers worked out by hand."""

import math

import numpy as np
import pytest

from tftoolkit.measure import stats


def test_mean_and_uncertainty_is_the_standard_error():
    mean, se = stats.mean_and_uncertainty([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    # sample std (n-1) = sqrt(5/3) = 1.290994; / sqrt(4)
    assert se == pytest.approx(1.2909944 / 2, rel=1e-6)
    assert math.isnan(stats.mean_and_uncertainty([7.0])[1])
    assert all(math.isnan(x) for x in stats.mean_and_uncertainty([]))


def test_jitter_is_scaled_median_absolute_deviation_and_ignores_one_outlier():
    # median 3; |x - 3| = 2, 1, 0, 1, 97 -> median 1 -> 1.4826
    assert stats.jitter([1, 2, 3, 4, 100]) == pytest.approx(1.4826)
    assert stats.jitter([5, 5, 5]) == 0.0
    assert math.isnan(stats.jitter([]))


def test_percentile_interpolates_linearly():
    assert stats.percentile([1, 2, 3, 4, 5], 50) == 3.0
    assert stats.percentile([1, 2, 3, 4, 5], 90) == pytest.approx(4.6)
    assert stats.percentile(range(1, 101), 99) == pytest.approx(99.01)
    assert math.isnan(stats.percentile([], 50))


def test_throughput_from_step_times():
    t = stats.throughput([0.1, 0.1, 0.2, 0.2], examples_per_step=32)
    assert t["images_per_sec"] == pytest.approx(32 / 0.15)  # examples / mean step time, not mean of rates
    # delta method: rate x se(t) / mean(t); se = 0.057735 / 2
    assert t["images_per_sec_uncertainty"] == pytest.approx(32 / 0.15 * (0.0577350 / 2) / 0.15, rel=1e-5)
    assert t["step_time_p50_s"] == pytest.approx(0.15)
    assert t["step_time_p90_s"] == pytest.approx(0.2)
    assert t["step_time_p99_s"] == pytest.approx(0.2)
    assert t["images_per_sec_jitter"] == pytest.approx(1.4826 * 80)  # rates 320, 320, 160, 160: MAD 80
    assert stats.throughput([], 32)["timed_steps"] == 0


def test_speedup_and_scaling_efficiency():
    assert stats.speedup(300.0, 100.0) == 3.0
    assert stats.scaling_efficiency(3.0, 4) == 0.75          # 4 replicas, 3x faster than 1
    assert stats.scaling_efficiency(1.8, 4, 2) == pytest.approx(0.9)  # baseline 2 replicas: ideal speedup is 2
    assert stats.scaling_efficiency(1.0, 1) == 1.0
    assert math.isnan(stats.speedup(100.0, 0.0))
    with pytest.raises(ValueError):
        stats.scaling_efficiency(1.0, 0)


def test_ratio_uncertainty_adds_relative_errors_in_quadrature():
    # 300 ± 30 over 100 ± 10: 3 x sqrt(0.1^2 + 0.1^2)
    assert stats.ratio_uncertainty(300, 30, 100, 10) == pytest.approx(3 * math.sqrt(0.02))
    assert stats.ratio_uncertainty(300, 0, 100, 0) == 0.0
    assert math.isnan(stats.ratio_uncertainty(300, math.nan, 100, 10))


def test_plus_minus_prints_an_error_only_where_one_is_known():
    assert stats.plus_minus(1234.5, 56.7, ",.0f") == "1,234 ± 57"
    assert stats.plus_minus(1.2345, 0.01) == "1.23 ± 0.01"
    assert stats.plus_minus(1.2345, np.float64(0.0)) == "1.23 ± 0.00"  # a measured zero is an error, shown
    for unknown in (None, math.nan, math.inf, True, "0.1"):
        assert stats.plus_minus(1.2345, unknown) == "1.23", unknown
