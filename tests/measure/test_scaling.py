"""Scaling within configurations, from a runs frame alone (no report, no files)."""

import json
import math

import pandas as pd
import pytest

from tftoolkit.measure import scaling


def _runs(rows):
    return pd.DataFrame([{"source": "s", "status": "ok", "mode": "weak", "images_per_sec_uncertainty": 10.0,
                          "point_params": json.dumps(p), "replicas": p["replicas"], "images_per_sec": ips}
                         for p, ips in rows])


def test_groups_are_the_other_axes_and_seeds_are_repeats():
    runs = _runs([({"replicas": 1, "model": "a", "seed": 0}, 1000.0),
                  ({"replicas": 1, "model": "a", "seed": 1}, 1200.0),
                  ({"replicas": 2, "model": "a", "seed": 0}, 1900.0),
                  ({"replicas": 2, "model": "a", "seed": 1}, 2100.0),
                  ({"replicas": 1, "model": "b", "seed": 0}, 400.0), ({"replicas": 2, "model": "b", "seed": 0}, 600.0)])
    assert scaling.with_groups(runs)["group"].tolist() == ["model=a"] * 4 + ["model=b"] * 2
    rates = scaling.group_rates(runs).set_index(["group", "replicas"])
    assert rates.loc[("model=a", 1), "images_per_sec"] == pytest.approx(1100.0)
    assert rates.loc[("model=a", 1), "repeats"] == 2
    assert rates.loc[("model=a", 1), "spread"] == pytest.approx(math.sqrt(2 * 100.0 ** 2))
    assert rates.loc[("model=a", 1), "uncertainty"] == pytest.approx(100.0)   # spread / sqrt(2)
    assert rates.loc[("model=b", 2), "uncertainty"] == 10.0                  # one run: its own uncertainty
    table = scaling.speedups(runs)
    by = table.groupby(["group", "replicas"])[["speedup", "efficiency"]].first()
    assert by.loc[("model=a", 1)].tolist() == [1.0, 1.0]
    assert by.loc[("model=a", 2)].tolist() == pytest.approx([2000 / 1100, 2000 / 1100 / 2])
    assert by.loc[("model=b", 2)].tolist() == pytest.approx([1.5, 0.75])


def test_one_configuration_is_one_unnamed_group_and_failed_runs_do_not_count():
    runs = _runs([({"replicas": 1}, 1000.0), ({"replicas": 2}, 1800.0), ({"replicas": 4}, 0.0)])
    runs.loc[2, "status"] = "failed"
    table = scaling.speedups(runs)
    assert set(table["group"]) == {""}
    assert table["speedup"].tolist()[:2] == [1.0, 1.8] and math.isnan(table["speedup"].iloc[2])
