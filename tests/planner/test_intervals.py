"""The interval from errors on rows not fitted to (intervals.py): leave-one-source-out figures, and what widens."""

import numpy as np
import pytest

from tftoolkit.planner import intervals, predict
from tftoolkit.planner.plan import Plan


def test_leave_one_source_out_figures_hold():
    res = intervals.out_of_sample()
    # Every published source was forecast by a model fitted without it; heldout.csv by one fitted to published.csv.
    published = res[res["set"] == "published"]
    assert (published["left_out"] == published["source"]).all()
    assert set(res["set"]) == {"published", "heldout"}
    s = intervals.summary(res, "rate")
    assert s["rows"] == 428
    assert s["median"] <= 0.03       # relative efficiency error, median (measured 2.9%)
    assert s["p90"] <= 0.12          # and 90th percentile (9.5%)
    assert s["coverage"] >= 0.80     # nested: each source's interval from the other sources' residuals (85%)


def test_tf_cnn_benchmarks_fp16_rows_exchange_float16_gradients():
    from tftoolkit.planner import validation
    assert validation.exchange_dtype("TensorFlow tf_cnn_benchmarks", "mixed_float16") == "float16"
    assert validation.exchange_dtype("TensorFlow tf_cnn_benchmarks", "float32") == "float32"
    assert validation.exchange_dtype("Horovod (NCCL), NGC container", "mixed_float16") == "float32"


def test_the_interval_widens_with_gpus_communication_an_unknown_exchange_and_unfitted_hardware():
    base = intervals.spread(2, 0.1, True, True)
    assert intervals.spread(8, 0.1, True, True) > base
    assert intervals.spread(2, 0.5, True, True) > base
    assert intervals.spread(2, 0.1, False, True) == pytest.approx(base * intervals.UNKNOWN_EXCHANGE)
    assert intervals.spread(2, 0.1, True, False) == pytest.approx(base * intervals.UNFITTED_CLASS)


def test_a_forecast_on_hardware_no_fitted_row_ran_on_says_so():
    geforce = predict.run_plan(Plan(gpu="rtx-2080-ti", per_replica_batch=64, params=25_557_032,
                                    images_per_sec=300, interconnect="pcie3", replica_counts="1,8"))
    assert "no fitted rows ran on pcie via host memory" in geforce["interval"]["method"]
    dgx = predict.run_plan(Plan(gpu="v100", per_replica_batch=64, params=25_557_032, images_per_sec=360,
                                interconnect="dgx1-v100", replica_counts="1,8"))
    assert "no fitted rows" not in dgx["interval"]["method"]
    width = [np.log(r["images_per_sec_high"] / r["images_per_sec_low"]) for r in (geforce["rows"][1], dgx["rows"][1])]
    assert width[0] > width[1]
    assert "out of sample" in dgx["checked"] and "relative efficiency error" in dgx["checked"]
