"""The scaling model: ring and hierarchical all-reduce cost, calibration from run directories and
allreduce.csv, the prediction table, crossover, and the errors for bad input. No TensorFlow needed."""

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from tftoolkit.cli import main
from tftoolkit.errors import ConfigError, DataError, RunDirError
from tftoolkit.planner import calibration, comms, forecast, predict, validation
from tftoolkit.planner.calibration import Calibration
from tftoolkit.planner.comms import Link
from tftoolkit.planner.predict import Scenario

RESNET50_BYTES = 25.6e6 * 4  # ~25.6 M parameters in float32


def _run_dir(tmp_path, name="run", toolkit=False, **fields):
    """A summary.json written by hand; with ``toolkit``, beside the files a run tftoolkit trained writes (their
    contents do not matter here), so that its figures count as measured."""
    d = tmp_path / name
    d.mkdir()
    s = {"replicas": 1, "per_replica_batch": 64, "params": 1_000_000, "step_time_s": 0.1, "device_kind": "GPU", **fields}
    (d / "summary.json").write_text(json.dumps(s))
    if toolkit:
        (d / "config.json").write_text(json.dumps({"config": {"replicas": s["replicas"]}}))
        (d / "env.json").write_text("{}")
        (d / "steps.csv").write_text("step,loss,step_time_s\n1,2.0,0.1\n")
    return d


def test_ring_allreduce_cost_is_the_alpha_beta_formula():
    link = Link("x", 100.0, 5.0)
    # 8 ranks, 1 GB: 2*7/8 * 1e9 / 100e9 = 17.5 ms, plus 14 steps * 5 us = 70 us.
    assert comms.ring_allreduce_time(1e9, 8, link) == pytest.approx(0.0175 + 70e-6)
    assert comms.ring_allreduce_time(1e9, 1, link) == 0.0
    # Bandwidth term approaches 2 S/B: the bus factor of nccl-tests.
    assert comms.ring_allreduce_time(1e9, 1000, Link("y", 100.0, 0.0)) == pytest.approx(0.02, rel=1e-3)


def test_hierarchical_allreduce_adds_the_inter_host_ring_per_host():
    nv, ib = comms.PRESETS["nvlink4"], comms.PRESETS["ib200"]
    s = RESNET50_BYTES
    one_host = comms.allreduce_time(s, 8, 1, nv)
    assert one_host == pytest.approx(2 * 7 / 8 * s / 370e9 + 14 * 0.6e-6)
    four_hosts = comms.allreduce_time(s, 8, 4, nv, ib)
    assert four_hosts == pytest.approx(one_host + 2 * 3 / 4 * s / 22.6e9 + 6 * 9.8e-6)
    # Eight NICs per host carry the inter-host stage eight times faster.
    eight_nics = comms.allreduce_time(s, 8, 4, nv, ib, nics_per_host=8)
    assert eight_nics - one_host == pytest.approx(2 * 3 / 4 * s / (8 * 22.6e9) + 6 * 9.8e-6)
    with pytest.raises(ConfigError, match="inter-host link"):
        comms.allreduce_time(s, 8, 2, nv, None)


def test_overlap_hides_at_most_the_backward_pass():
    assert comms.step_time(0.1, 0.05) == pytest.approx(0.15)
    assert comms.step_time(0.1, 0.05, overlap=1.0) == pytest.approx(0.1)
    # A long all-reduce can only hide behind the backward pass (2/3 of compute).
    assert comms.step_time(0.03, 0.5, overlap=1.0) == pytest.approx(0.03 + 0.5 - 0.02)


def test_prediction_table_weak_scaling_resnet50_on_nvlink4():
    cal = Calibration(compute_s=0.2, per_replica_batch=64, replicas=1, gradient_bytes=RESNET50_BYTES, source="test")
    df = forecast.predict(cal, comms.PRESETS["nvlink4"], comms.PRESETS["ib200"])
    assert df["replicas"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 40, 48, 56, 64]
    row8 = df.set_index("replicas").loc[8]
    comm8 = 2 * 7 / 8 * RESNET50_BYTES / 370e9 + 14 * 0.6e-6
    assert row8["allreduce_s"] == pytest.approx(comm8)
    assert row8["efficiency"] == pytest.approx(0.2 / (0.2 + comm8))
    assert row8["speedup"] == pytest.approx(8 * 0.2 / (0.2 + comm8))
    assert df.set_index("replicas").loc[1, "efficiency"] == pytest.approx(1.0)
    assert row8["hosts"] == 1 and df.set_index("replicas").loc[64, "hosts"] == 8
    assert forecast.crossover(df) == {"nvlink4 + ib200": None}  # 0.2 s of compute dwarfs ~9 ms of all-reduce


def test_crossover_where_communication_overtakes_compute_on_pcie():
    # 10 ms of compute, 400 MB of gradients over PCIe 4: 2(N-1)/N * 0.4 GB / 31.5 GB/s > 10 ms from N = 2.
    cal = Calibration(0.01, 32, 1, 400e6, "test")
    df = forecast.predict(cal, comms.PRESETS["pcie4"], max_replicas=8)
    assert forecast.crossover(df) == {"pcie4": 2}
    # Strong scaling divides a fixed global batch: compute shrinks with N, so efficiency falls faster.
    weak = forecast.predict(cal, comms.PRESETS["nvlink4"], max_replicas=8).set_index("replicas")
    strong = forecast.predict(cal, comms.PRESETS["nvlink4"], max_replicas=8, mode="strong",
                             global_batch=128).set_index("replicas")
    assert strong.loc[8, "per_replica_batch"] == 16 and strong.loc[1, "compute_s"] == pytest.approx(0.04)
    assert strong.loc[8, "efficiency"] < weak.loc[8, "efficiency"]


def test_shared_devices_scale_compute_with_total_examples():
    cal = Calibration(0.04, 32, 2, 1e6, "test")  # measured: 2 replicas of 32 on shared cores, 40 ms
    assert cal.compute_at(4, 32, "shared") == pytest.approx(0.08)
    assert cal.compute_at(4, 32, "dedicated") == pytest.approx(0.04)


def test_calibration_from_run_directories(tmp_path):
    cal = calibration.calibrate(_run_dir(tmp_path))
    assert cal.compute_s == 0.1 and cal.gradient_bytes == 4e6 and "step_time_s" in cal.source
    cal = calibration.calibrate(_run_dir(tmp_path, "m", replicas=4, compute_time_s=0.07, gradient_bytes=3_000_000))
    assert cal.compute_s == 0.07 and cal.gradient_bytes == 3e6 and cal.replicas == 4
    with pytest.raises(RunDirError, match=r"lacks field\(s\) the prediction needs: compute_time_s \(train with --measure\)"):
        calibration.calibrate(_run_dir(tmp_path, "n", replicas=4))
    with pytest.raises(RunDirError, match="per_replica_batch.*gradient_bytes \\(or params\\)"):
        calibration.calibrate_summary({"replicas": 1, "step_time_s": 0.1})
    with pytest.raises(RunDirError, match="step_time_s \\(it is nan\\)"):
        calibration.calibrate_summary({"replicas": 1, "per_replica_batch": 8, "params": 10, "step_time_s": math.nan})
    with pytest.raises(RunDirError, match="no summary.json"):
        calibration.calibrate(tmp_path / "nowhere")


def test_fit_link_recovers_bandwidth_and_latency_from_allreduce_csv():
    true = Link("t", 12.5, 40.0)
    rows = []
    for n in (2, 4):
        for size in 2.0 ** np.arange(12, 27, 2):
            t = comms.ring_allreduce_time(size, n, true)
            rows.append({"impl": "ring", "replicas": n, "size_bytes": size, "time_s": t * (1.02 if n == 4 else 0.98),
                         "busbw_GBps": size / t * 2 * (n - 1) / n / 1e9, "status": "ok"})
    rows.append({"impl": "slow", "replicas": 2, "size_bytes": 1e6, "time_s": 1.0, "busbw_GBps": 1e-3, "status": "ok"})
    rows.append({"impl": "nccl", "replicas": 2, "size_bytes": None, "time_s": None, "status": "skipped"})
    link, fit = comms.fit_link(pd.DataFrame(rows))
    assert fit["impl"] == "ring" and fit["replicas"] == [2, 4] and fit["rows"] == 16
    assert link.bandwidth_GBps == pytest.approx(12.5, rel=0.05)
    assert link.latency_us == pytest.approx(40.0, rel=0.1)
    assert fit["median_abs_rel_error"] < 0.03
    with pytest.raises(DataError, match="lacks column"):
        comms.fit_link(pd.DataFrame({"impl": ["a"]}))
    with pytest.raises(DataError, match="no usable rows"):
        comms.fit_link(pd.DataFrame(rows[-1:]))


@pytest.mark.parametrize("text, match", [("nvlink9", "unknown interconnect"), ("x=0", "bandwidth must be"),
                                         ("x=-5:1", "bandwidth must be"), ("x=10:-1", "latency must be"),
                                         ("x=fast", "cannot read link"), ("x=inf", "bandwidth must be")])
def test_bad_links_are_refused(text, match):
    with pytest.raises(ConfigError, match=match):
        comms.parse_link(text)


def test_custom_link_and_presets_are_valid():
    assert comms.parse_link("mylink=25:5") == Link("mylink", 25.0, 5.0, "given on the command line")
    for link in comms.PRESETS.values():
        assert link.bandwidth_GBps > 0 and link.latency_us >= 0 and link.source


def test_compare_reports_the_relative_error(tmp_path):
    cal = Calibration(0.01, 32, 1, 4e6, "test")
    link = Link("m", 1.0, 100.0)
    runs = [_run_dir(tmp_path, f"r{n}", replicas=n, per_replica_batch=32, step_time_s=st, images_per_sec=32 * n / st,
                     images_per_sec_uncertainty=1.0) for n, st in ((2, 0.03), (4, 0.05))]
    cmp_ = forecast.compare(cal, link, calibration.measured_frame(runs), devices="shared")
    # N=2: compute 0.02 + all-reduce 2*1/2*4e6/1e9 + 2*100e-6 = 0.0242; measured 0.03 -> -19.3%.
    r2 = cmp_.set_index("replicas").loc[2]
    assert r2["predicted_step_time_s"] == pytest.approx(0.0242)
    assert r2["error"] == pytest.approx(0.0242 / 0.03 - 1)


def test_cli_predict_writes_table_json_and_figures(tmp_path, capsys):
    run = _run_dir(tmp_path, replicas=1, step_time_s=0.05, params=25_600_000, toolkit=True)
    out = tmp_path / "pred"
    assert main(["predict", str(run), "--out", str(out), "--measured", str(run)]) == 0
    text = capsys.readouterr().out
    assert "nvlink4 + ib200: efficiency 1: 100%" in text
    assert "predicted vs measured step time over pcie4, each run on its own hosts x GPUs (1 x 1): median" in text
    df = pd.read_csv(out / "prediction.csv")
    assert set(df["scenario"]) == {"pcie4 + ib200", "pcie5 + ib200", "nvlink3 + ib200", "nvlink4 + ib200"}
    assert len(df) == 4 * 15
    result = json.loads((out / "prediction.json").read_text())
    assert result["links"]["pcie4"]["bandwidth_GBps"] == 31.5
    assert (out / "efficiency_vs_replicas.png").stat().st_size > 10_000
    assert (out / "predicted_vs_measured.png").exists()


def test_cli_predict_bad_input_is_one_line_exit_2(tmp_path, capsys):
    run = _run_dir(tmp_path)
    assert main(["predict", str(run), "--interconnect", "slow=0"]) == 2
    assert "bandwidth must be a finite number of GB/s > 0" in capsys.readouterr().err
    bad = _run_dir(tmp_path, "bad", replicas=2)
    assert main(["predict", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "lacks field(s) the prediction needs: compute_time_s" in err and len(err.strip().splitlines()) == 1


def test_fit_uses_single_buffers_and_checks_gradient_sets_against_them():
    true = Link("t", 4.0, 10.0)
    rows = [{"impl": "r", "replicas": n, "payload": "buffer", "tensors": 1, "size_bytes": s,
             "time_s": comms.ring_allreduce_time(s, n, true), "status": "ok"}
            for n in (2, 4) for s in (2.0**16, 2.0**20, 2.0**24)]
    # A gradient set of 22 tensors pays a per-tensor cost the buffer model leaves out: 3x the time.
    rows.append({"impl": "r", "replicas": 2, "payload": "grads:small_cnn", "tensors": 22, "size_bytes": 244520,
                 "time_s": 3 * comms.ring_allreduce_time(244520, 2, true), "status": "ok"})
    link, fit = comms.fit_link(pd.DataFrame(rows))
    assert fit["rows"] == 6 and link.bandwidth_GBps == pytest.approx(4.0) and link.latency_us == pytest.approx(10.0)
    check = comms.check_gradient_sets(pd.DataFrame(rows), link)
    assert check["payload"].tolist() == ["grads:small_cnn"] and check["error"].iloc[0] == pytest.approx(1 / 3 - 1)


def test_star_model_for_reduce_to_one():
    link = Link("x", 100.0, 5.0)
    assert comms.star_allreduce_time(1e9, 4, link) == pytest.approx(6 * (0.01 + 5e-6))
    assert comms.star_allreduce_time(1e9, 1, link) == 0.0
    # Star grows with N-1, ring levels off at 2S/B: 4 vs 2 replicas cost 3x (star) and 1.5x (ring).
    assert comms.star_allreduce_time(1e9, 4, Link("y", 100.0, 0)) / comms.star_allreduce_time(
        1e9, 2, Link("y", 100.0, 0)) == pytest.approx(3.0)
    rows = [{"impl": "reduce_to_one", "replicas": n, "size_bytes": s, "time_s": comms.star_allreduce_time(s, n, link)}
            for n in (2, 4) for s in (1e5, 1e6, 1e7)]
    fitted, fit = comms.fit_link(pd.DataFrame(rows), algorithm="star")
    assert fitted.bandwidth_GBps == pytest.approx(100.0) and fitted.latency_us == pytest.approx(5.0)
    assert fit["algorithm"] == "star"
    with pytest.raises(ConfigError, match="algorithm must be one of ring, tree, star"):
        comms.allreduce_time(1e6, 2, 1, link, algorithm="butterfly")  # tree is modelled now; an unknown name is not


def test_gpus_are_not_forecast_from_simulated_compute_without_a_given_step_time(tmp_path, capsys):
    # The run: 2 CPU-simulated replicas, compute 12.56 ms/step on shared cores, communication 4.3% measured.
    run = _run_dir(tmp_path, replicas=2, per_replica_batch=64, compute_time_s=0.01256, step_time_s=0.0131,
                   step_time_no_input_s=0.0131, device_kind="CPU-simulated", communication_fraction=0.043,
                   gradient_bytes=4e5, toolkit=True)
    assert main(["predict", str(run), "--interconnect", "pcie4"]) == 2
    err = capsys.readouterr().err
    assert "measured on CPU-simulated replicas" in err and "--compute-ms" in err
    # With the step time given, the forecast is made and says where its compute came from.
    assert main(["predict", str(run), "--interconnect", "pcie4", "--inter-host", "ib200", "--compute-ms", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("calibration: compute 2 ms/step given (--compute-ms)")
    # The run's own CPU-simulated step is not set beside a GPU's given compute: comparing them says nothing.
    assert "measured at" not in out
    result = json.loads((run / "prediction.json").read_text())
    assert result["calibration"]["given"] is True and result["run_point"] is None
    # The simulated replicas themselves can still be modelled (shared devices), labelled as measured there.
    r = predict.run(run, tmp_path / "shared", Scenario(interconnects="pcie4", devices="shared", max_replicas=8), figures=False)
    assert "measured on CPU-simulated" in r["calibration"]["source"]
    # A notebook gets the refusal as a result that says why, not an exception.
    r = predict.run(run, tmp_path / "nb", Scenario(interconnects="pcie4"), on_refusal="report", figures=True)
    assert "measured on CPU-simulated" in r["refused"] and predict.forecast_text(r).startswith("no forecast: ")
    assert (tmp_path / "nb" / "efficiency_vs_replicas.png").exists()


# --- where the host's input becomes the limit ---------------------------------------------------------------
# A GPU at 150 images/s (15 images per 100 ms step, gradients of 4 bytes over a link of 1 PB/s: linear scaling), and
# a host whose input delivers 100 images/s per core on 4 cores: 400 images/s.
FED_BY_4_CORES = {"replicas": 1, "per_replica_batch": 15, "step_time_s": 0.1, "params": 1,
                  "input_capacity_per_core": 100.0, "input_cores": 4, "workers": 1}
FAST = "fast=1000000:0"


def test_input_becomes_the_limit_where_the_gpus_outrun_the_host(tmp_path, capsys):
    # No straggler term (--straggler 0): the figures below are the link's and the input's arithmetic alone.
    run = _run_dir(tmp_path, **FED_BY_4_CORES)
    r = predict.run(run, tmp_path / "p", Scenario(interconnects=FAST, max_replicas=8, straggler=0), figures=False)
    df = r["frame"].set_index("replicas")
    assert df["images_per_sec"].tolist() == pytest.approx([150 * n for n in range(1, 9)])
    assert (df["input_capacity_images_per_sec"] == 400).all()
    assert df["input_limited"].tolist() == [False, False, True, True, True, True, True, True]
    # 450 images/s at 3 GPUs: 5 cores, or 1 more 4-core host; 1200 at 8: 12 cores, or ceil(800 / 400) = 2 hosts.
    assert df["input_cores_needed_per_host"].tolist() == [2, 3, 5, 6, 8, 9, 11, 12]
    assert df["input_service_workers_needed"].tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    il = json.loads((tmp_path / "p" / "prediction.json").read_text())["input_limit"]
    assert (il["forecast"], il["per_core_images_per_sec"], il["host_cores"], il["host_capacity_images_per_sec"]) == (
        True, 100.0, 4, 400.0)
    sc = il["scenarios"]["fast"]  # one host: no "+ ib200" it does not use
    assert sc["limit_replicas"] == 3
    assert (sc["at_limit"]["cores_needed_per_host"], sc["at_limit"]["service_workers_needed"]) == (5, 1)
    assert (sc["at_largest"]["replicas"], sc["at_largest"]["cores_needed_per_host"],
            sc["at_largest"]["service_workers_needed"]) == (8, 12, 2)
    assert set(pd.read_csv(tmp_path / "p" / "prediction.csv")["input_limited"]) == {True, False}
    text = predict.forecast_text(r)
    assert ("input: 100 images/s per core x 4 cores (this run's host: input_cores 4 x 1 worker(s)) = 400 images/s "
            "per host") in text
    assert ("fast: input becomes the limit at 3 GPUs: they would consume 450 images/s, the input delivers "
            "400; 5 cores per host would feed them, or 1 more host of 4 cores as tf.data service workers; at 8 GPUs "
            "(1,200 images/s) 12 cores per host would feed them, or 2 more hosts of 4 cores") in text


def test_the_input_s_error_travels_into_its_limit_and_a_count_within_it_says_either_side_is_possible(tmp_path):
    # The run measured its capacity 400 ± 40 images/s (10%): 450 at 3 GPUs is within 2 of its errors (80) of it
    run = _run_dir(tmp_path, **FED_BY_4_CORES, input_capacity_images_per_sec=400.0, input_capacity_uncertainty=40.0)
    r = predict.run(run, tmp_path / "p", Scenario(interconnects=FAST, max_replicas=8, straggler=0), figures=False)
    df = r["frame"].set_index("replicas")
    assert df["input_capacity_uncertainty"].tolist() == pytest.approx([40.0] * 8)  # one host each: its 10%
    il = json.loads((tmp_path / "p" / "prediction.json").read_text())["input_limit"]
    assert il["host_capacity_uncertainty"] == pytest.approx(40.0)
    text = predict.forecast_text(r)
    assert "= 400 ± 40 images/s per host" in text
    # The GPUs' forecast has its interval too (425..496 images/s at 3 GPUs): it reaches within 2 errors of the
    # capacity (320..480), so 3 GPUs may keep up, and 2 GPUs (283..331) may already be limited.
    assert ("fast: input becomes the limit at 3 GPUs: they would consume 450 images/s, the input delivers 400 ± 40 "
            "(the GPUs' forecast interval, 425..496 images/s, reaches within 2 of the input capacity's errors: it may "
            "keep up there); 5 cores per host") in text
    assert ("; it may already be the limit at 2 GPUs (300 images/s; the GPUs' forecast interval, 283..331 images/s, "
            "reaches within 2 of the input capacity's errors)") in text
    assert df["input_limited"].tolist() == [False, False] + [True] * 6
    assert df["input_limit_possible"].tolist() == [False] + [True] * 7
    assert (il["scenarios"]["fast"]["limit_replicas"], il["scenarios"]["fast"]["limit_possible_from_replicas"]) == (3, 2)
    # A capacity measured without an error (an older run, or too few probe calls): the figures alone, as before
    run = _run_dir(tmp_path, "old", **FED_BY_4_CORES, input_capacity_images_per_sec=400.0,
                   input_capacity_uncertainty=None)
    r = predict.run(run, tmp_path / "q", Scenario(interconnects=FAST, max_replicas=8, straggler=0), figures=False)
    text = predict.forecast_text(r)
    assert "= 400 images/s per host" in text and "may keep up" not in text and " ± " not in text.split("input:")[1]


def test_the_gpus_forecast_interval_alone_can_put_a_count_on_either_side_of_the_input_limit(tmp_path):
    # A capacity without an error: 110 images/s per core x 4 = 440. At 3 GPUs the forecast is 450 (425..496): over
    # it at its centre, under it at its low end. At 2 GPUs (283..331) the input keeps up whatever the forecast's
    # error, so the input may be the limit from 3 GPUs, not before.
    run = _run_dir(tmp_path, **{**FED_BY_4_CORES, "input_capacity_per_core": 110.0})
    r = predict.run(run, tmp_path / "p", Scenario(interconnects=FAST, max_replicas=8, straggler=0), figures=False)
    df = r["frame"].set_index("replicas")
    assert df.loc[3, "images_per_sec_low"] < 440 < df.loc[3, "images_per_sec"]
    assert df["input_limited"].tolist() == df["input_limit_possible"].tolist() == [False, False] + [True] * 6
    sc = json.loads((tmp_path / "p" / "prediction.json").read_text())["input_limit"]["scenarios"]["fast"]
    assert (sc["limit_replicas"], sc["limit_possible_from_replicas"]) == (3, 3)
    text = predict.forecast_text(r)
    assert ("the input delivers 440 (the GPUs' forecast interval, 425..496 images/s, reaches the input capacity: it "
            "may keep up there); ") in text and "may already be" not in text
    # Where the input keeps up at every count's centre, the count whose interval reaches it is named, and the
    # first such count when that is not the closest: 320 x 4 = 1,280 ± 128; 7 GPUs (991..1,157) reach 1,024.
    run = _run_dir(tmp_path, "wide", **{**FED_BY_4_CORES, "input_capacity_per_core": 320.0},
                   input_capacity_images_per_sec=1280.0, input_capacity_uncertainty=128.0)
    r = predict.run(run, tmp_path / "q", Scenario(interconnects=FAST, max_replicas=8, straggler=0), figures=False)
    df = r["frame"].set_index("replicas")
    assert not df["input_limited"].any() and df["input_limit_possible"].tolist() == [False] * 6 + [True] * 2
    text = predict.forecast_text(r)
    assert ("fast: input keeps up to 8 GPUs: at its closest, 8 GPUs would consume 1,200 images/s of the 1,280 ± 128 "
            "the input delivers (the GPUs' forecast interval, 1,133..1,322 images/s, reaches within 2 of the input "
            "capacity's errors: it may be the limit there); the first count at which it may be the limit is 7 GPUs "
            "(the GPUs' forecast interval, 991..1,157 images/s, reaches within 2 of the input capacity's errors)") in text


def test_the_input_line_counts_one_core_as_one_core():
    from tftoolkit.planner.inputlimit import input_lines

    il = {"forecast": False, "why": "w", "per_core_images_per_sec": 100.0, "host_cores_from": "--host-cores",
          "host_capacity_images_per_sec": 100.0}
    assert input_lines({**il, "host_cores": 1})[0].startswith("input: 100 images/s per core x 1 core (--host-cores)")
    assert "x 2 cores (--host-cores) = 200" in input_lines({**il, "host_cores": 2,
                                                            "host_capacity_images_per_sec": 200.0})[0]


def test_host_cores_asks_about_another_server_and_each_host_feeds_its_own_gpus(tmp_path, capsys):
    # No straggler term (--straggler 0): the figures below are the link's and the input's arithmetic alone.
    run = _run_dir(tmp_path, **{**FED_BY_4_CORES, "workers": 2, "input_cores": 2})  # 2 workers x 2 cores each
    assert main(["predict", str(run), "--straggler", "0", "--interconnect", FAST, "--max-replicas", "8"]) == 0
    assert "x 4 cores (this run's host: input_cores 2 x 2 worker(s)) = 400 images/s" in capsys.readouterr().out
    assert main(["predict", str(run), "--straggler", "0", "--interconnect", FAST, "--max-replicas", "16", "--host-cores", "8"]) == 0
    out = capsys.readouterr().out
    assert "100 images/s per core x 8 cores (--host-cores) = 800 images/s per host" in out
    il = json.loads((run / "prediction.json").read_text())["input_limit"]["scenarios"]["fast + ib200"]
    assert il["limit_replicas"] == 6  # 900 > 800
    # 16 GPUs are 2 hosts of 8: 2 x 800 images/s of input against ~2,400 consumed (ib200 between the hosts takes
    # microseconds): 12 cores per host, or ceil(800 / 800) = 1 more 8-core host.
    big = il["at_largest"]
    assert (big["replicas"], big["input_capacity_images_per_sec"], big["cores_needed_per_host"],
            big["service_workers_needed"]) == (16, 1600.0, 12, 1)
    # Enough cores: input keeps up everywhere, and says so.
    assert main(["predict", str(run), "--straggler", "0", "--interconnect", FAST, "--max-replicas", "16", "--host-cores", "16"]) == 0
    # The closest is one full host (8 GPUs, 1,200 of 1,600 images/s); at 16 each host's GPUs consume a little less.
    assert ("fast + ib200: input keeps up to 16 GPUs: at its closest, 8 GPUs would consume 1,200 images/s of the 1,600 "
            "the input delivers") in capsys.readouterr().out
    assert json.loads((run / "prediction.json").read_text())["input_limit"]["scenarios"]["fast + ib200"][
        "limit_replicas"] is None


def test_a_run_without_input_capacity_still_predicts_and_says_so(tmp_path, capsys):
    run = _run_dir(tmp_path, replicas=1, step_time_s=0.05)  # written before runs measured their input
    assert main(["predict", str(run), "--interconnect", "pcie4", "--max-replicas", "8"]) == 0
    assert "input limit: input capacity not measured in this run" in capsys.readouterr().out
    assert json.loads((run / "prediction.json").read_text())["input_limit"] == {
        "forecast": False, "why": "input capacity not measured in this run"}
    assert "input_limited" not in pd.read_csv(run / "prediction.csv").columns
    # Measured through a tf.data service, the capacity is not this host's cores' rate; on shared devices the input
    # and the replicas share the cores: neither is forecast.
    served = _run_dir(tmp_path, "served", **FED_BY_4_CORES, data_service={"address": "grpc://h:5000"})
    r = predict.run(served, tmp_path / "s", Scenario(interconnects="pcie4", max_replicas=8), figures=False)
    assert r["input_limit"]["forecast"] is False and "tf.data service" in r["input_limit"]["why"]
    shared = predict.run(_run_dir(tmp_path, "shared", **FED_BY_4_CORES), tmp_path / "sh",
                         Scenario(interconnects="pcie4", devices="shared", max_replicas=8), figures=False)
    assert shared["input_limit"]["forecast"] is False and "share the same cores" in shared["input_limit"]["why"]


@pytest.mark.parametrize("cores", ["0", "-4"])
def test_bad_host_cores_is_one_line_exit_2(tmp_path, capsys, cores):
    run = _run_dir(tmp_path, **FED_BY_4_CORES)
    assert main(["predict", str(run), "--interconnect", "pcie4", "--host-cores", cores]) == 2
    err = capsys.readouterr().err
    assert f"--host-cores must be a whole number of cores >= 1, got {cores}" in err and len(err.strip().splitlines()) == 1
    assert not (run / "prediction.json").exists()


def test_simulated_replicas_give_a_per_core_rate_to_plan_gpus_with(tmp_path):
    # CPU-simulated: compute refused for GPUs without --compute-ms; with it, the measured input rate per core plans.
    run = _run_dir(tmp_path, **{**FED_BY_4_CORES, "replicas": 2, "compute_time_s": 0.5,
                                "device_kind": "CPU-simulated"})
    r = predict.run(run, tmp_path / "p", Scenario(interconnects=FAST, max_replicas=8, compute_ms=100), figures=False)
    assert r["input_limit"]["scenarios"]["fast"]["limit_replicas"] == 3


# --- the gradient exchange: dtype, packs, accumulation ----------------------------------------------------
def _pipeline_hidden(allreduce, backward, packs):
    """Packs of equal bytes, ready at i/P of the backward pass, sent one after another: what ends before it does."""
    finish = 0.0
    for i in range(1, packs + 1):
        finish = max(finish, i * backward / packs) + allreduce / packs
    return allreduce - (finish - backward)


@pytest.mark.parametrize("allreduce, backward, packs", [(0.01, 0.04, 4), (0.1, 0.04, 4), (0.04, 0.04, 2),
                                                         (0.3, 0.01, 8), (0.02, 0.05, 1), (0.05, 0.02, 3)])
def test_packs_hide_what_a_pipeline_of_packs_behind_the_backward_pass_hides(allreduce, backward, packs):
    assert comms.hidden_time(allreduce, backward, packs=packs) == pytest.approx(
        _pipeline_hidden(allreduce, backward, packs))


def test_pack_overlap_and_latency_numbers():
    # Short all-reduce: all but the last of 4 packs hidden; long one: the first pack waits for 1/4 of the backward pass.
    assert comms.hidden_time(0.01, 0.04, packs=4) == pytest.approx(0.0075)
    assert comms.hidden_time(0.1, 0.04, packs=4) == pytest.approx(0.03)
    assert comms.hidden_time(0.1, 0.04, packs=1) == 0.0
    assert comms.hidden_time(0.1, 0.04, overlap=0.5) == pytest.approx(0.04)  # given: at most the backward pass
    # Each pack is an all-reduce of its own: the bytes' term stays, the latency is paid per pack.
    link = Link("x", 100.0, 5.0)
    assert comms.allreduce_time(1e9, 8, 1, link, packs=4) == pytest.approx(0.0175 + 4 * 70e-6)


def test_calibration_of_an_accumulating_run_in_bfloat16(tmp_path):
    run = _run_dir(tmp_path, per_replica_batch=32, step_time_s=0.4, accumulate=4, allreduce_dtype="bfloat16",
                   allreduce_packs=2, gradient_bytes=2_000_000)
    cal = calibration.calibrate(run)
    # 0.4 s per optimizer step of 4 micro-steps: 0.1 s each; 2 MB in bfloat16 is 4 MB in float32.
    assert (cal.compute_s, cal.accumulate, cal.allreduce_dtype, cal.allreduce_packs) == (0.1, 4, "bfloat16", 2)
    assert cal.gradient_bytes_in("float32") == 4e6 and cal.gradient_bytes_in("float16") == 2e6
    assert cal.gradient_bytes_in() == 2e6
    assert "100 ms per micro-step" in cal.label and "/ accumulate 4" in cal.label
    assert cal.compute_at(1, 32, "dedicated", accumulate=4) == pytest.approx(0.4)
    # --compute-ms is one micro-step's, whatever the run's accumulate.
    assert calibration.calibrate(run, compute_ms=20).compute_s == pytest.approx(0.02)
    # params stand for elements: bytes in the run's dtype.
    cal = calibration.calibrate_summary({"replicas": 1, "per_replica_batch": 8, "step_time_s": 0.1, "params": 1_000_000,
                                     "allreduce_dtype": "float16"})
    assert cal.gradient_bytes == 2e6 and cal.gradient_bytes_in("float32") == 4e6
    # A run from before the fields: float32, one pack, no accumulation.
    old = calibration.calibrate(_run_dir(tmp_path, "old"))
    assert (old.accumulate, old.allreduce_dtype, old.allreduce_packs) == (1, "float32", 1)
    with pytest.raises(RunDirError, match=r"unreadable field\(s\): accumulate \(it is 0\), allreduce_dtype"):
        calibration.calibrate_summary({"replicas": 1, "per_replica_batch": 8, "step_time_s": 0.1, "params": 1,
                                   "accumulate": 0, "allreduce_dtype": "int8"})


def test_accumulation_shrinks_communications_share_and_dtype_and_packs_shrink_it_too():
    # 10 ms per micro-step, 400 MB of float32 gradients over 10 GB/s without latency: 70 ms on 8 replicas.
    cal = Calibration(0.01, 32, 1, 4e8, "test")
    link = Link("l", 10.0, 0.0)

    def at8(**kw):
        return forecast.predict(cal, link, max_replicas=8, **kw).set_index("replicas").loc[8]

    one, four = at8(), at8(accumulate=4)
    assert one["step_time_s"] == pytest.approx(0.08) and four["step_time_s"] == pytest.approx(0.04 + 0.07)
    assert four["global_batch"] == 32 * 8 * 4 and four["compute_s"] == pytest.approx(0.04)
    # Efficiency = compute / step: communication's share falls from 7/8 to 7/11.
    assert one["efficiency"] == pytest.approx(0.01 / 0.08) and four["efficiency"] == pytest.approx(0.04 / 0.11)
    assert at8(allreduce_dtype="bfloat16")["allreduce_s"] == pytest.approx(0.035)
    # 4 packs: 3/4 of the backward pass (2/3 of 10 ms) hidden, 70 ms being longer; none with accumulation, whose
    # all-reduce follows the micro-batch loop, unless an overlap is given.
    packed = at8(allreduce_packs=4)
    assert packed["hidden_s"] == pytest.approx(0.75 * 0.01 * 2 / 3)
    assert packed["step_time_s"] == pytest.approx(0.08 - 0.005)
    assert at8(allreduce_packs=4, accumulate=4)["hidden_s"] == 0.0
    assert at8(allreduce_packs=4, accumulate=4, overlap=1.0)["hidden_s"] == pytest.approx(0.01 * 2 / 3)
    assert (packed["allreduce_dtype"], packed["allreduce_packs"], packed["accumulate"]) == ("float32", 4, 1)
    # Strong scaling keeps the global batch: per-replica batch = global / (replicas x K).
    strong = forecast.predict(cal, link, max_replicas=8, mode="strong", global_batch=1024, accumulate=4)
    assert strong.set_index("replicas")["per_replica_batch"].loc[[1, 8]].tolist() == [256, 32]
    with pytest.raises(ConfigError, match="--allreduce-packs must be a whole number >= 1, got 0"):
        forecast.predict(cal, link, allreduce_packs=0)
    with pytest.raises(ConfigError, match="--allreduce-dtype must be one of float32, bfloat16, float16"):
        forecast.predict(cal, link, allreduce_dtype="float64")


def test_cli_predict_with_another_dtype_packs_and_accumulation(tmp_path, capsys):
    # No straggler term (--straggler 0): the figures below are the link's and the input's arithmetic alone.
    run = _run_dir(tmp_path, step_time_s=0.1)  # 1 GPU, 1,000,000 float32 parameters: 4 MB
    out = tmp_path / "p"
    assert main(["predict", str(run), "--straggler", "0", "--out", str(out), "--interconnect", "pcie4", "--max-replicas", "8",
                 "--allreduce-dtype", "bfloat16", "--allreduce-packs", "4"]) == 0
    text = capsys.readouterr().out
    assert ("one all-reduce of 2.00 MB in bfloat16 (the run's 4.00 MB in float32, converted) in 4 packs; hidden "
            "behind the backward pass: modelled, not measured here") in text
    result = json.loads((out / "prediction.json").read_text())
    assert result["overlap_model"].startswith("modelled, not measured here") and result["overlap_modelled"] is True
    assert (result["allreduce_dtype"], result["allreduce_packs"], result["accumulate"], result["gradient_bytes"]) == (
        "bfloat16", 4, 1, 2e6)
    assert result["run_point"] is None  # the run all-reduced float32 in one pack: not the forecast's step
    df = pd.read_csv(out / "prediction.csv").set_index("replicas")
    assert {"allreduce_dtype", "allreduce_packs", "accumulate", "gradient_bytes", "hidden_s"} <= set(df.columns)
    comm = 4 * (2 * 7 / 8 * 0.5e6 / 31.5e9 + 14 * 3e-6)
    assert df.loc[8, "allreduce_s"] == pytest.approx(comm) and df.loc[8, "hidden_s"] == pytest.approx(0.75 * comm)
    assert df.loc[8, "step_time_s"] == pytest.approx(0.1 + comm / 4)
    # Accumulation: the step is K micro-steps and one all-reduce; given overlap is said to be given.
    assert main(["predict", str(run), "--straggler", "0", "--out", str(out), "--interconnect", "pcie4", "--max-replicas", "8",
                 "--accumulate", "4", "--overlap", "0.5"]) == 0
    assert "step: accumulate 4 (compute 4 x one micro-step" in capsys.readouterr().out
    result = json.loads((out / "prediction.json").read_text())
    assert result["overlap_model"].startswith("given (--overlap 0.5)") and result["overlap_modelled"] is False
    df = pd.read_csv(out / "prediction.csv").set_index("replicas")
    assert df.loc[8, "global_batch"] == 64 * 8 * 4 and df.loc[8, "compute_s"] == pytest.approx(0.4)
    # The run's own settings: nothing is hidden; its one-replica step is the calibration itself, so it is not
    # shown as a check of the forecast ("measured at 1 replica (+0%)" would be circular).
    assert main(["predict", str(run), "--straggler", "0", "--out", str(out), "--interconnect", "pcie4", "--max-replicas", "8"]) == 0
    result = json.loads((out / "prediction.json").read_text())
    assert result["overlap_model"].startswith("none: one all-reduce") and result["run_point"] is None


@pytest.mark.parametrize("args, message", [
    (["--allreduce-packs", "0"], "--allreduce-packs must be a whole number >= 1, got 0"),
    (["--accumulate", "-2"], "--accumulate must be a whole number >= 1, got -2"),
    (["--overlap", "1.5"], "--overlap is a fraction of the all-reduce in [0, 1], got 1.5"),
    (["--allreduce-dtype", "float64"], "invalid choice: 'float64'"),
])
def test_cli_predict_bad_exchange_options_are_one_line_exit_2(tmp_path, capsys, args, message):
    run = _run_dir(tmp_path)
    try:
        rc = main(["predict", str(run), "--interconnect", "pcie4", *args])
    except SystemExit as e:  # argparse's own check of a choice
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (run / "prediction.json").exists()


def test_compare_models_each_measured_run_with_its_own_accumulation(tmp_path):
    cal = Calibration(0.01, 32, 1, 4e6, "test")
    link = Link("m", 1.0, 100.0)
    run = _run_dir(tmp_path, "r2", replicas=2, per_replica_batch=32, accumulate=2, step_time_s=0.03)
    table = tmp_path / "scaling.csv"
    pd.DataFrame({"replicas": [2], "global_batch": [128], "images_per_sec": [128 / 0.03],
                  "accumulate": [2]}).to_csv(table, index=False)
    cmp_ = forecast.compare(cal, link, calibration.measured_frame([run, table]))
    # 2 micro-steps of 10 ms + 2*1/2*4e6/1e9 + 2*100e-6 = 24.2 ms, for both (the table's 128 = 32 x 2 x 2).
    assert cmp_["per_replica_batch"].tolist() == [32, 32]
    assert cmp_["predicted_step_time_s"].tolist() == pytest.approx([0.0242, 0.0242])


def test_a_single_host_forecast_is_not_labelled_with_the_inter_host_link():
    cal = Calibration(0.1, 64, 1, 1e8, "test", "GPU")
    one = forecast.predict(cal, comms.PRESETS["pcie4"], comms.PRESETS["ib200"], max_replicas=8)
    two = forecast.predict(cal, comms.PRESETS["pcie4"], comms.PRESETS["ib200"], max_replicas=16)
    assert set(one["scenario"]) == {"pcie4"} and set(two["scenario"]) == {"pcie4 + ib200"}


def test_a_one_replica_run_is_not_its_own_check(tmp_path):
    run = _run_dir(tmp_path, "one", replicas=1, per_replica_batch=64, step_time_s=0.1, device_kind="GPU",
                   gradient_bytes=1e6)
    r = predict.run(run, tmp_path / "p", Scenario(interconnects="pcie4", max_replicas=8), figures=False)
    assert r["run_point"] is None and "measured at" not in predict.forecast_text(r)


# --- the model against measured runs, each on the hosts it ran on ---------------------------------------------------
def test_compare_models_each_measured_run_on_its_own_hosts(tmp_path):
    cal = Calibration(0.01, 32, 1, 4e6, "test", "GPU")
    nv, ib = comms.PRESETS["nvlink4"], comms.PRESETS["ib200"]
    # A 64-GPU cluster's published figure (8 hosts of 8, written by hand), a 2-worker run of 4 GPUs each, a table
    # with its hosts column, and a 16-GPU run that says nothing of its hosts (whole hosts of --gpus-per-host 4).
    cluster = _run_dir(tmp_path, "cluster", replicas=64, per_replica_batch=32, step_time_s=0.02, hosts=8,
                       gpus_per_host=8)
    workers = _run_dir(tmp_path, "workers", replicas=8, per_replica_batch=32, step_time_s=0.02, workers=2,
                       replicas_per_worker=4)
    plain = _run_dir(tmp_path, "plain", replicas=16, per_replica_batch=32, step_time_s=0.02)
    table = tmp_path / "scaling.csv"
    pd.DataFrame({"replicas": [32], "global_batch": [1024], "images_per_sec": [1024 / 0.02],
                  "hosts": [4]}).to_csv(table, index=False)
    frame = calibration.measured_frame([cluster, workers, plain, table], gpus_per_host=4)
    assert list(zip(frame["hosts"], frame["gpus_per_host"])) == [(8, 8), (2, 4), (4, 4), (4, 8)]
    assert frame["layout"].tolist() == ["its hosts and gpus_per_host", "its workers, taken as one per host",
                                        "whole hosts of --gpus-per-host 4", "its hosts and gpus_per_host"]
    cmp_ = forecast.compare(cal, nv, frame, inter=ib, nics_per_host=2)
    expected = [0.01 + comms.allreduce_time(4e6, g, h, nv, ib, nics_per_host=2) for h, g in
                ((8, 8), (2, 4), (4, 4), (4, 8))]
    assert cmp_["predicted_step_time_s"].tolist() == pytest.approx(expected)
    # Not one host of 64: its ring over NVLink alone would take far less than the two-level all-reduce.
    assert expected[0] > 0.01 + comms.allreduce_time(4e6, 64, 1, nv) * 1.5
    # Without a link between hosts, a run over several is refused, naming the option.
    with pytest.raises(ConfigError, match="ran 64 GPUs on 8 hosts .*give --inter-host"):
        forecast.compare(cal, nv, frame)
    with pytest.raises(DataError, match="12 GPUs are not 2 host"):
        calibration.measured_frame([_run_dir(tmp_path, "odd", replicas=12, step_time_s=0.02, hosts=2,
                                             gpus_per_host=8)])


def test_cli_predict_measured_over_several_hosts_needs_the_link_between_them(tmp_path, capsys):
    # No straggler term (--straggler 0): the figures below are the link's and the input's arithmetic alone.
    run = _run_dir(tmp_path, replicas=1, step_time_s=0.05, params=25_600_000)
    cluster = _run_dir(tmp_path, "cluster", replicas=16, per_replica_batch=64, step_time_s=0.08, hosts=2,
                       gpus_per_host=8)
    # A single-host forecast (8 GPUs) names no link between hosts: the 2-host run cannot be compared.
    assert main(["predict", str(run), "--straggler", "0", "--out", str(tmp_path / "p"), "--interconnect", "nvlink4", "--max-replicas",
                 "8", "--measured", str(cluster)]) == 2
    err = capsys.readouterr().err
    assert "ran 16 GPUs on 2 hosts (its hosts and gpus_per_host); give --inter-host" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["predict", str(run), "--straggler", "0", "--out", str(tmp_path / "p"), "--interconnect", "nvlink4", "--max-replicas",
                 "8", "--inter-host", "ib100", "--measured", str(cluster)]) == 0
    out = capsys.readouterr().out
    assert ("predicted vs the given step times (1 of 1 not measured by tftoolkit: summaries written by hand or "
            "tables) over nvlink4 + ib100 between hosts, each run on its own hosts x GPUs (2 x 8): median") in out
    cmp_ = pd.read_csv(tmp_path / "p" / "prediction_vs_measured.csv")
    comm = comms.allreduce_time(25_600_000 * 4, 8, 2, comms.PRESETS["nvlink4"], comms.PRESETS["ib100"])
    assert cmp_["predicted_step_time_s"].tolist() == pytest.approx([0.05 + comm])
    result = json.loads((tmp_path / "p" / "prediction.json").read_text())
    assert result["comparison"]["inter_host"] == "ib100" and result["comparison"]["layouts"] == ["2 x 8"]
    assert "ib100" in result["links"]
    # Without --measured, a single-host forecast no longer lists ib200 among its links.
    assert main(["predict", str(run), "--straggler", "0", "--out", str(tmp_path / "q"), "--interconnect", "nvlink4", "--max-replicas",
                 "8"]) == 0
    assert list(json.loads((tmp_path / "q" / "prediction.json").read_text())["links"]) == ["nvlink4"]


# --- measured, or written by hand ---------------------------------------------------------------------------------
def test_a_summary_written_by_hand_is_never_called_measured(tmp_path, capsys):
    # A published 8-GPU figure copied into a summary.json (no training logs): 30 ms of compute, a 40 ms step.
    fields = dict(replicas=8, per_replica_batch=64, compute_time_s=0.03, step_time_s=0.04, gradient_bytes=1e8,
                  communication_fraction=0.25)
    by_hand = _run_dir(tmp_path, "published", **fields)
    trained = _run_dir(tmp_path, "trained", toolkit=True, **fields)
    assert calibration.handwritten(by_hand) == "the directory has no config.json, env.json, steps.csv of a tftoolkit run"
    assert calibration.handwritten(trained) == "" and calibration.measured_by_tftoolkit(trained)
    (tmp_path / "other").mkdir()
    for f in ("config.json", "env.json", "steps.csv"):
        (tmp_path / "other" / f).write_text("{}")
    assert calibration.handwritten(tmp_path / "other") == "its config.json is not a tftoolkit run's"

    cal = calibration.calibrate(by_hand)
    assert cal.label == ("compute 30 ms/step from the run directory's summary.json (compute_time_s, on GPU as written "
                         "there; not measured by tftoolkit: the directory has no config.json, env.json, steps.csv of "
                         "a tftoolkit run)")
    assert not cal.measured and "measured on" not in cal.label
    assert calibration.calibrate(trained).label == "compute 30 ms/step measured on GPU (compute_time_s)"

    assert main(["predict", str(by_hand), "--interconnect", "pcie4", "--max-replicas", "8"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("calibration: compute 30 ms/step from the run directory's summary.json")
    assert "measured on" not in text and "measured at" not in text
    assert ("the run directory's summary.json (not measured by tftoolkit) at 8 replica(s) (GPU): step 40.00 ms "
            "against pcie4's") in text and "communication 25% in the summary" in text
    saved = (by_hand / "prediction.json").read_text()
    result = json.loads(saved)
    assert result["calibration"]["measured_by_tftoolkit"] is False
    assert result["run_point"]["measured_by_tftoolkit"] is False
    assert result["run_point"]["source"].startswith("the run directory's summary.json, not measured by tftoolkit")
    assert "measured on" not in saved and "measured at" not in saved and "measured by tftoolkit in" not in saved
    # The same figures in a run tftoolkit trained are measured, and said to be.
    assert main(["predict", str(trained), "--interconnect", "pcie4", "--max-replicas", "8"]) == 0
    text = capsys.readouterr().out
    assert "compute 30 ms/step measured on GPU" in text and "measured at 8 replica(s) (GPU): step 40.00 ms" in text
    result = json.loads((trained / "prediction.json").read_text())
    assert result["calibration"]["measured_by_tftoolkit"] is True and result["run_point"]["measured_by_tftoolkit"]


def test_a_gpu_forecast_waits_for_its_slowest_replica_and_carries_the_interval(tmp_path, capsys):
    # The published rows' straggler sigma by default, relative to the calibration's own replica count (a 2-replica
    # run's compute already waited for the slower of its two); none for replicas sharing one pool of cores.
    run = _run_dir(tmp_path, replicas=2, step_time_s=0.1, compute_time_s=0.1, params=1, toolkit=True,
                   device_kind="GPU")
    v = validation.release()
    r = predict.run(run, tmp_path / "p", Scenario(interconnects="fast=1000000:0", max_replicas=8), figures=False)
    df = r["frame"].set_index("replicas")
    sigma = v["straggler"]
    assert sigma > 0 and r["straggler"] == sigma
    want = forecast.straggler_factor(sigma, 8, 2)
    assert df.loc[8, "straggler_s"] == pytest.approx(df.loc[8, "compute_s"] * (want - 1))
    assert df.loc[2, "straggler_s"] == pytest.approx(0)  # the run's own count: its compute is the calibration
    lo, hi, _ = v["bands"]["rate"]
    assert df.loc[8, "images_per_sec_low"] == pytest.approx(df.loc[8, "images_per_sec"] * math.exp(lo))
    assert "published rows" in r["interval"]["method"] and "checked against" in r["interval"]["checked"]
    assert "interval: 5th-95th percentiles" in predict.forecast_text(r)
    shared = predict.run(run, tmp_path / "s", Scenario(interconnects="fast=1000000:0", devices="shared",
                                                       max_replicas=8), figures=False)
    assert (shared["frame"]["straggler_s"] == 0).all() and shared["interval"]["method"].startswith("none")
    assert shared["frame"]["images_per_sec_low"].isna().all()


def test_a_run_directory_forecasts_efficiency_interval_stops_at_100_percent(tmp_path):
    # The in-sample band (x1.102 above) on a forecast of ~99% efficiency would reach 109% without the cap.
    from tftoolkit.planner import validation
    frame = pd.DataFrame({"replicas": [1, 2], "images_per_sec": [100.0, 198.0], "efficiency": [1.0, 0.99]})
    out, how = validation.with_interval(frame, "rate", validation.release())
    assert out["efficiency_high"].max() <= 1.0
    assert "capped at 100%" in how["method"]


@pytest.mark.parametrize("text, why", [("", "is not a CSV table"), ("hello\nworld\n", "needs columns replicas"),
                                       ("replicas,step_time_s,global_batch\nabc,def,64\n2,0.1,64\n", "line(s) 2 lack"),
                                       ("replicas,images_per_sec,global_batch\n2,fast,64\n", "line(s) 2 lack"),
                                       ("replicas,step_time_s,global_batch\n", "it has no rows"),
                                       ("replicas,step_time_s,per_replica_batch\n1.5,0.1,32\n0,0.1,32\n2,0.1,x\n", "line(s) 2, 3, 4 lack")])
def test_a_measured_table_that_is_not_one_is_refused_naming_the_file(tmp_path, text, why):
    from tftoolkit.errors import DataError

    path = tmp_path / "garbage.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=f"garbage.csv.*{re.escape(why)}"):
        calibration.measured_frame([path])
    path.write_text("replicas,step_time_s,per_replica_batch\n1,0.1,32\n2,0.12,32\n")
    assert calibration.measured_frame([path])["replicas"].tolist() == [1, 2]
