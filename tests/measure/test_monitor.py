"""measure.monitor (sampler, metrics, analysis): the sampler, its CSV, its failure handling, and the summary numbers.

GPU readings come from tests/fake_nvml.py (written from the documented NVML API; see tests/fixtures/README.md);
host readings are real (psutil on this machine).
"""

import json
import logging
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest

import fake_nvml
from tftoolkit import nvml
from tftoolkit.measure.monitor import analysis, metrics, sampler
from tftoolkit.errors import ConfigError, DataError, DeviceError, RunDirError, ToolkitError

from helpers import ROOT, assert_no_tensorflow

HERE = ROOT / "tests"  # fake_nvml.py and fixtures/
REAL_FIXTURES = sorted((HERE / "fixtures").glob("nvml_*.json"))

FAST = 0.05  # seconds between samples in tests


def use(monkeypatch, fixture=None, **kw):
    mod = fake_nvml.install(monkeypatch, fixture, **kw)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return mod


@pytest.fixture
def no_gpu(monkeypatch):
    return use(monkeypatch, init_error="NVMLError_LibraryNotFound")


@pytest.fixture
def gpus(monkeypatch):
    return use(monkeypatch)


def run(path, seconds, **kw):
    with sampler.Monitor(path, interval_s=kw.pop("interval_s", FAST), **kw) as mon:
        time.sleep(seconds)
    return mon, analysis.read_monitor(path)


# -- bad input -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("interval", [0, -1, 0.0, float("nan"), float("inf"), "0.5", True, None])
def test_interval_must_be_positive_seconds(tmp_path, no_gpu, interval):
    with pytest.raises(ConfigError, match="interval_s must be a number of seconds > 0") as e:
        sampler.Monitor(tmp_path / "m.csv", interval_s=interval)
    assert isinstance(e.value, ToolkitError)


def test_gpu_index_that_does_not_exist_names_the_gpus_present(tmp_path, gpus):
    with pytest.raises(DeviceError) as e:
        sampler.Monitor(tmp_path / "m.csv", gpu_indices=[1, 7])
    msg = str(e.value)
    assert "GPU index 7 does not exist" in msg
    assert "0 (NVIDIA A100-SXM4-80GB), 1 (NVIDIA A100-SXM4-80GB), 2 (Tesla T4), 3 (Tesla T4)" in msg
    assert gpus._initialised == 0


def test_gpu_index_on_a_machine_without_gpus(tmp_path, no_gpu):
    with pytest.raises(DeviceError, match="no GPU can be queried.*gpu_indices=None"):
        sampler.Monitor(tmp_path / "m.csv", gpu_indices=[0])


@pytest.mark.parametrize("bad", [[-1], ["0"], [True], 1.5])
def test_gpu_indices_must_be_numbers(tmp_path, gpus, bad):
    with pytest.raises(ConfigError):
        sampler.Monitor(tmp_path / "m.csv", gpu_indices=bad)


def test_phase_names_must_fit_a_csv_cell(tmp_path, no_gpu):
    mon = sampler.Monitor(tmp_path / "m.csv")
    for bad in ["", "  ", "a,b", 'say "hi"', "x\ny", None]:
        with pytest.raises(ConfigError):
            mon.phase(bad)


# -- host monitoring (real psutil) ---------------------------------------------------------------------------------------
def test_host_only_csv_columns_devices_and_phases(tmp_path, no_gpu, caplog):
    caplog.set_level(logging.INFO, logger="tftoolkit")
    path = tmp_path / "run"
    path.mkdir()
    with sampler.Monitor(path, interval_s=FAST) as mon:  # a directory: writes <dir>/monitor.csv
        mon.phase("warmup")
        time.sleep(0.2)
        mon.phase("train")
        sum(i * i for i in range(300_000))
        time.sleep(0.2)
        mon.phase("eval")
        time.sleep(0.15)
    assert (path / "monitor.csv").read_text().splitlines()[0] == "time_s,device,metric,value,phase"
    df = analysis.read_monitor(path)
    assert list(df.columns) == ["time_s", "device", "metric", "value", "phase"]
    assert {"host", "cpu0"} <= set(df["device"]) and not any(df["device"].str.startswith("gpu"))
    assert {"cpu_util_pct", "rss_bytes", "sys_mem_used_pct"} <= set(df["metric"])
    cpu = df[df["metric"] == "cpu_util_pct"]["value"]
    assert cpu.between(0, 100).all()
    assert df[df["metric"] == "rss_bytes"]["value"].min() > 10 * 2**20  # a Python with pandas loaded
    # Phases appear in the order they were set, each over a contiguous stretch of time.
    first_seen = df.groupby("phase")["time_s"].min().sort_values()
    assert list(first_seen.index) == ["run", "warmup", "train", "eval"]
    assert df.groupby("phase")["time_s"].max()["warmup"] <= first_seen["train"]
    assert df["time_s"].max() >= 0.5
    assert any("no GPU metrics" in r.message for r in caplog.records)


def test_file_is_readable_while_running(tmp_path, no_gpu):
    path = tmp_path / "m.csv"
    with sampler.Monitor(path, interval_s=FAST, flush_s=0.1):
        time.sleep(0.4)
        during = analysis.read_monitor(path)  # what a killed run would leave behind
        time.sleep(0.2)
    after = analysis.read_monitor(path)
    assert len(during) > 0 and during["time_s"].max() >= 0.1
    assert len(after) > len(during)


@pytest.mark.slow
def test_killed_run_leaves_a_readable_file(tmp_path):
    path = tmp_path / "m.csv"
    code = textwrap.dedent(f"""
        import os, signal, time
        from tftoolkit.measure.monitor.sampler import Monitor
        Monitor({str(path)!r}, interval_s={FAST}, flush_s=0.1).start()
        time.sleep(0.6)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=60)
    assert proc.returncode == -9
    df = analysis.read_monitor(path)
    assert df["time_s"].max() >= 0.3 and {"host"} <= set(df["device"])


def test_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "monitor.csv"
    path.write_text("time_s,device,metric,value,phase\n0.0,host,cpu_util_pct,12.5,train\n0.5,host,cpu_ut")
    df = analysis.read_monitor(tmp_path)
    assert len(df) == 1 and df.loc[0, "value"] == 12.5


def test_read_monitor_missing_or_foreign_file(tmp_path):
    with pytest.raises(DataError, match="no monitor file"):
        analysis.read_monitor(tmp_path)
    (tmp_path / "monitor.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="not a monitor file"):
        analysis.read_monitor(tmp_path)
    (tmp_path / "monitor.csv").write_text("time_s,device,metric,value,phase\n")
    assert list(analysis.read_monitor(tmp_path).columns) == metrics.COLUMNS


# -- GPU monitoring through the fake -------------------------------------------------------------------------------------
def test_gpu_metrics_and_units(tmp_path, gpus):
    mon, df = run(tmp_path / "m.csv", 0.3)
    assert mon.gpu_indices == [0, 1, 2, 3]
    g0 = df[df["device"] == "gpu0"].groupby("metric")["value"]
    assert g0.max()["util_gpu_pct"] == 90 and g0.max()["util_mem_pct"] == 45
    assert g0.max()["power_w"] == 250.0  # 250000 mW
    assert g0.max()["mem_total_bytes"] == 80 * 2**30 and g0.min()["mem_used_bytes"] == 2**30
    assert g0.max()["sm_clock_mhz"] == 1410 and 60 <= g0.max()["temp_c"] <= 63
    assert g0.max()["pcie_tx_mb_per_s"] == 1.0 and g0.max()["pcie_rx_mb_per_s"] == 2.0  # 1000 / 2000 KB/s
    # Each reading adds 1024 KiB on each of 12 links: rate x time between samples = 12 MiB.
    times = df[df["device"] == "gpu0"].groupby("time_s").size().index.to_series()
    nvl = df[(df["device"] == "gpu0") & (df["metric"] == "nvlink_tx_mb_per_s")].set_index("time_s")["value"]
    # The sample at stop can fall in the same millisecond as the last one (same time_s): its rate is over a
    # sub-millisecond span that the written times cannot show, so it is left out.
    nvl = nvl[~nvl.index.duplicated(keep="first")]
    dt = times.diff().reindex(nvl.index)
    wide = dt >= 0.03  # time_s is written to the ms: closer samples (the one at stop) cannot be checked to 5%
    moved = (nvl * dt)[wide]
    assert len(moved) >= 2 and moved.to_numpy() == pytest.approx(12 * 1024 * 1024 / 1e6, rel=0.05), (nvl, dt)
    assert "nvlink_tx_mb_per_s" not in set(df[df["device"] == "gpu2"]["metric"])  # T4: no NVLink
    # PCIe throughput blocks for 20 ms a call, so it is read at most every PCIE_EVERY_S.
    assert (df["metric"] == "pcie_tx_mb_per_s").sum() == 4
    assert gpus._initialised == 0


def test_throttle_reasons_bitmask_and_names(tmp_path, monkeypatch):
    fx = fake_nvml.synthetic_fixture(samples=1)
    fx["samples"][0][1]["nvmlDeviceGetCurrentClocksEventReasons"] = 0x04 | 0x40
    use(monkeypatch, fx)
    _, df = run(tmp_path / "m.csv", 0.15)
    g1 = set(df[df["device"] == "gpu1"]["metric"])
    assert {"throttle_sw_power_cap", "throttle_hw_thermal_slowdown"} <= g1
    assert set(df[(df["device"] == "gpu1") & (df["metric"] == "throttle_reasons")]["value"]) == {0x44}
    assert not any(m.startswith("throttle_") and m != "throttle_reasons"
                   for m in df[df["device"] == "gpu0"]["metric"])
    s = analysis.summarize(df)
    assert s["gpus"]["gpu1"]["throttled"] and s["gpus"]["gpu1"]["throttle_reasons"] == ["hw_thermal_slowdown",
                                                                                        "sw_power_cap"]
    assert not s["gpus"]["gpu0"]["throttled"]


def test_gpu_selection_and_cuda_visible_devices(tmp_path, gpus, monkeypatch):
    assert sampler.Monitor(tmp_path / "a.csv", gpu_indices=[2]).gpu_indices == [2]
    assert sampler.Monitor(tmp_path / "a.csv", np.float64(0.5), np.array([3, 1])).gpu_indices == [3, 1]
    assert sampler.Monitor(tmp_path / "a.csv", gpu_indices=[]).gpu_indices == []  # host only
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert sampler.Monitor(tmp_path / "b.csv").gpu_indices == [2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000-0000-0000-0000-000000000001")
    assert sampler.Monitor(tmp_path / "c.csv").gpu_indices == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert sampler.Monitor(tmp_path / "d.csv").gpu_indices == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-abc")
    assert sampler.Monitor(tmp_path / "e.csv").gpu_indices == [0, 1, 2, 3]  # cannot map: take all


def test_failing_metric_is_logged_once_and_skipped(tmp_path, gpus, caplog):
    gpus.fail["nvmlDeviceGetPowerUsage"] = "NVMLError_Unknown"  # on all four GPUs, every sample
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        _, df = run(tmp_path / "m.csv", 0.3)
    power_logs = [r for r in caplog.records if "power" in r.getMessage()]
    assert len(power_logs) == 1 and power_logs[0].levelno == logging.WARNING
    assert "skipped for the rest of the run" in power_logs[0].getMessage()
    assert "power_w" not in set(df["metric"])
    assert (df["metric"] == "util_gpu_pct").sum() >= 4 * 5  # the rest carried on
    assert gpus.calls["nvmlDeviceGetPowerUsage"] == 4  # one try per GPU, then left alone


def test_metric_failing_mid_run_keeps_earlier_rows(tmp_path, gpus, caplog):
    with sampler.Monitor(tmp_path / "m.csv", interval_s=FAST) as mon:
        time.sleep(0.2)
        gpus.fail[("nvmlDeviceGetTemperature", 3)] = "NVMLError_GpuIsLost"
        lost_at = time.monotonic() - mon.t0
        time.sleep(0.2)
    df = analysis.read_monitor(tmp_path / "m.csv")
    temp3 = df[(df["device"] == "gpu3") & (df["metric"] == "temp_c")]
    assert len(temp3) >= 2 and temp3["time_s"].max() <= lost_at + FAST
    assert df[(df["device"] == "gpu0") & (df["metric"] == "temp_c")]["time_s"].max() > lost_at + 0.1
    assert sum("GpuIsLost" in r.getMessage() for r in caplog.records) == 1


def test_no_permission_is_logged_once_with_a_hint(tmp_path, gpus, caplog):
    gpus.fail["nvmlDeviceGetUtilizationRates"] = "NVMLError_NoPermission"
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        _, df = run(tmp_path / "m.csv", 0.2)
    msgs = [r.getMessage() for r in caplog.records if "NoPermission" in r.getMessage()]
    assert len(msgs) == 1 and "no permission" in msgs[0]
    assert "util_gpu_pct" not in set(df["metric"]) and "power_w" in set(df["metric"])


def test_nvml_failing_at_start_falls_back_to_host(tmp_path, gpus, caplog):
    mon = sampler.Monitor(tmp_path / "m.csv", interval_s=FAST)  # GPUs were there at construction...
    gpus.fail["nvmlInit"] = "NVMLError_DriverNotLoaded"        # ...and the driver went away before start
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        with mon:
            time.sleep(0.15)
    df = analysis.read_monitor(tmp_path / "m.csv")
    assert set(df["device"]) >= {"host"} and not any(df["device"].str.startswith("gpu"))
    assert sum("NVML failed at start" in r.getMessage() for r in caplog.records) == 1


def test_unwritable_path_is_a_run_dir_error(tmp_path, no_gpu):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(RunDirError, match="cannot write the monitor file"):
        sampler.Monitor(tmp_path / "file" / "monitor.csv").start()


def test_monitor_cannot_start_twice(tmp_path, no_gpu):
    with sampler.Monitor(tmp_path / "m.csv", interval_s=FAST) as mon:
        with pytest.raises(ConfigError, match="already running"):
            mon.start()


# -- summaries -----------------------------------------------------------------------------------------------------------
def frame(rows):
    return pd.DataFrame(rows, columns=metrics.COLUMNS)


def test_energy_is_power_integrated_over_time():
    # 100 W held for 2 s, sampled every 0.5 s.
    df = frame([(t / 2, "gpu0", "power_w", 100.0, "train") for t in range(5)])
    s = analysis.summarize(df, images=1000)
    g = s["gpus"]["gpu0"]
    assert g["energy_j"] == pytest.approx(200.0) and g["power_mean_w"] == pytest.approx(100.0)
    assert s["images_per_joule"] == pytest.approx(5.0) and g["images_per_joule"] == pytest.approx(5.0)
    # A ramp 0 -> 200 W over 2 s is also 200 J (trapezoids are exact on a line).
    ramp = frame([(t / 2, "gpu0", "power_w", 50.0 * t, "train") for t in range(5)])
    assert analysis.summarize(ramp)["gpus"]["gpu0"]["energy_j"] == pytest.approx(200.0)
    # duration_s sets the window: mean power x duration.
    assert analysis.summarize(df, duration_s=4.0)["gpus"]["gpu0"]["energy_j"] == pytest.approx(400.0)


def test_images_per_joule_splits_images_across_replicas():
    rows = [(t / 2, g, "power_w", w, "train") for t in range(5) for g, w in (("gpu0", 100.0), ("gpu1", 50.0))]
    s = analysis.summarize(frame(rows), images=600)
    assert s["gpu_energy_j"] == pytest.approx(300.0)
    assert s["images_per_joule"] == pytest.approx(2.0)
    assert s["gpus"]["gpu0"]["images_per_joule"] == pytest.approx(1.5)  # 300 images / 200 J
    assert s["gpus"]["gpu1"]["images_per_joule"] == pytest.approx(3.0)  # 300 images / 100 J


def test_energy_comes_from_nvml_s_counter_where_the_gpu_has_one():
    # Power is a 1-second average on recent GPUs, so a burst between samples is missed by the integral; NVML's
    # energy counter (mJ, Volta and newer) is not. 80 W read at every sample, 200 J counted over the same 2 s.
    rows = [(t / 2, "gpu0", "power_w", 80.0, "train") for t in range(5)]
    rows += [(t / 2, "gpu0", "energy_j", 50.0 * t + 7.0, "train") for t in range(5)]
    s = analysis.summarize(frame(rows), images=1000)
    g = s["gpus"]["gpu0"]
    assert g["energy_j"] == pytest.approx(200.0) and g["power_mean_w"] == pytest.approx(100.0)
    assert g["energy_source"] == "energy counter" and s["images_per_joule"] == pytest.approx(5.0)
    # Without the counter: the power samples, and says so.
    g = analysis.summarize(frame(rows[:5]))["gpus"]["gpu0"]
    assert g["energy_j"] == pytest.approx(160.0) and g["energy_source"] == "power samples"
    # duration_s sets the window for the counter too: mean power x duration.
    assert analysis.summarize(frame(rows), duration_s=4.0)["gpus"]["gpu0"]["energy_j"] == pytest.approx(400.0)


def test_the_monitor_records_the_energy_counter(tmp_path, monkeypatch):
    # GPUs 0-1 count energy: +200 J and +400 J per reading; the 4 recorded readings repeat, so the counter
    # goes back every 4th reading, as it does when the driver reloads: that interval counts 0, the total goes on.
    use(monkeypatch, fake_nvml.synthetic_fixture())
    with sampler.Monitor(tmp_path / "m.csv", interval_s=0.05, gpu_indices=[0, 2]):
        time.sleep(0.4)
    df = analysis.read_monitor(tmp_path / "m.csv")
    e0 = df[(df["device"] == "gpu0") & (df["metric"] == "energy_j")]["value"].to_numpy()
    steps = np.diff(e0)
    assert len(e0) >= 6 and e0[0] == 0.0  # from the monitor's start, in J
    assert set(np.round(steps, 6)) == {0.0, 200.0} and list(steps[:3]) == [200.0] * 3 and steps[3] == 0.0
    assert df[(df["device"] == "gpu2") & (df["metric"] == "energy_j")].empty  # no counter: no rows, no error


def test_energy_measured_live_from_a_constant_100w_gpu(tmp_path, monkeypatch):
    fixture = fake_nvml.synthetic_fixture(power_mw=(100_000,) * 4)
    for per_dev in fixture["samples"]:  # power samples only: the integral's path
        for reading in per_dev:
            reading.pop("nvmlDeviceGetTotalEnergyConsumption", None)
    use(monkeypatch, fixture)
    start = time.monotonic()
    with sampler.Monitor(tmp_path / "m.csv", interval_s=0.1, gpu_indices=[0]):
        time.sleep(2.0)
    wall = time.monotonic() - start  # >= 2 s; more on a loaded machine
    s = analysis.summarize(analysis.read_monitor(tmp_path / "m.csv"))
    energy = s["gpus"]["gpu0"]["energy_j"]
    assert energy == pytest.approx(100.0 * s["duration_s"], rel=1e-3)
    # The first and last samples sit at the ends of the monitored block, so ~200 J: 100 W x the block's length.
    assert 100.0 * (wall - 0.1) <= energy <= 100.0 * wall
    assert energy >= 195.0


def _util_frame(gpu1_low: int, n: int = 10, idle_eval: int = 0) -> pd.DataFrame:
    rows = []
    for k in range(n):
        rows += [(k * 0.5, "gpu0", "util_gpu_pct", 90.0, "train"),
                 (k * 0.5, "gpu1", "util_gpu_pct", 5.0 if k < gpu1_low else 85.0, "train")]
    for k in range(n, n + idle_eval):  # everyone idle: does not count against anyone
        rows += [(k * 0.5, "gpu0", "util_gpu_pct", 0.0, "eval"), (k * 0.5, "gpu1", "util_gpu_pct", 0.0, "eval")]
    return frame(rows)


def test_idle_flag():
    s = analysis.summarize(_util_frame(gpu1_low=3))
    assert s["gpus"]["gpu1"]["idle"] and s["gpus"]["gpu1"]["idle_frac"] == pytest.approx(0.3)
    assert not s["gpus"]["gpu0"]["idle"] and s["gpus"]["gpu0"]["idle_frac"] == 0.0
    assert any(f.startswith("gpu1 was under 10% utilisation 30%") for f in s["flags"])
    # Exactly 20% is not "more than 20%".
    assert not analysis.summarize(_util_frame(gpu1_low=2))["gpus"]["gpu1"]["idle"]
    # Time when all GPUs were idle (an eval on the host, a checkpoint) is not held against any of them.
    s = analysis.summarize(_util_frame(gpu1_low=3, idle_eval=20))
    assert s["gpus"]["gpu1"]["idle_frac"] == pytest.approx(0.3)
    # One GPU has nobody to be compared with.
    single = analysis.summarize(frame([(k, "gpu0", "util_gpu_pct", 0.0, "train") for k in range(5)]))
    assert single["gpus"]["gpu0"]["idle"] is False and single["gpus"]["gpu0"]["idle_frac"] is None


def test_throttle_flag_needs_more_than_a_blip_and_ignores_idle_clocks():
    def frame_with(bits):
        return frame([(k * 0.5, "gpu0", "throttle_reasons", b, "train") for k, b in enumerate(bits)])
    s = analysis.summarize(frame_with([0x40] * 3 + [0x0] * 7))
    assert s["gpus"]["gpu0"]["throttled"] and s["gpus"]["gpu0"]["throttle_frac"] == pytest.approx(0.3)
    assert s["gpus"]["gpu0"]["throttle_reasons"] == ["hw_thermal_slowdown"]
    assert not analysis.summarize(frame_with([0x1] * 10))["gpus"]["gpu0"]["throttled"]  # GpuIdle is not throttling
    assert not analysis.summarize(frame_with([0x4] + [0x0] * 39))["gpus"]["gpu0"]["throttled"]  # 2.5%


def test_summary_of_a_real_host_run_and_phase_filter(tmp_path, no_gpu):
    with sampler.Monitor(tmp_path / "m.csv", interval_s=FAST) as mon:
        mon.phase("train")
        time.sleep(0.3)
        mon.phase("eval")
        time.sleep(0.1)
    df = analysis.read_monitor(tmp_path / "m.csv")
    s = analysis.summarize(df, images=100, duration_s=0.4)
    assert s["gpus"] == {} and s["gpu_energy_j"] is None and s["images_per_joule"] is None
    assert 0 <= s["host"]["cpu_util_mean_pct"] <= 100
    assert s["host"]["rss_peak_bytes"] == df[df["metric"] == "rss_bytes"]["value"].max()
    train = analysis.summarize(df, phase="train")
    assert 0 < train["samples"] < s["samples"]
    json.dumps(s)


def test_summary_of_empty_frame():
    s = analysis.summarize(frame([]))
    assert s["samples"] == 0 and s["gpus"] == {} and s["host"]["cpu_util_mean_pct"] is None


# -- no TensorFlow, ever -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_hardware_monitor_and_plots_never_import_tensorflow(tmp_path):
    assert_no_tensorflow(f"""
        import time
        from tftoolkit.measure import hardware
        from tftoolkit.measure.monitor import analysis, sampler
        from tftoolkit.plots import monitor as plots
        hardware.format_report(hardware.collect())
        with sampler.Monitor({str(tmp_path)!r}, interval_s=0.05) as mon:
            mon.phase("train"); time.sleep(0.2)
        df = analysis.read_monitor({str(tmp_path)!r})
        analysis.summarize(df, images=10)
        plots.plot_monitor_timeseries(df); plots.plot_utilisation_heatmap(df)
    """)


# -- a real recording, when there is one ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in REAL_FIXTURES] or [pytest.param(
    None, marks=pytest.mark.skip(reason="no recorded NVML fixture yet: see tests/fixtures/README.md"))])
def test_replay_recorded_fixture_through_the_monitor(path, tmp_path, monkeypatch):
    fixture = json.loads(path.read_text())
    use(monkeypatch, fixture)
    n = len(fixture["samples"])
    _, df = run(tmp_path / "m.csv", FAST * (n + 1))
    for i, per_dev in enumerate(fixture["samples"][0]):
        util = per_dev.get("nvmlDeviceGetUtilizationRates")
        if isinstance(util, dict) and "gpu" in util:
            recorded = {s[i]["nvmlDeviceGetUtilizationRates"]["gpu"] for s in fixture["samples"]}
            assert set(df[(df["device"] == f"gpu{i}") & (df["metric"] == "util_gpu_pct")]["value"]) <= recorded
    json.dumps(analysis.summarize(df))


def test_summarize_takes_a_path_or_a_frame_and_says_what_else_it_needs(tmp_path):
    rows = [(t / 2, "gpu0", "power_w", 100.0, "train") for t in range(5)]
    df = frame(rows)
    df.to_csv(tmp_path / "monitor.csv", index=False)
    by_frame = analysis.summarize(df)
    assert analysis.summarize(tmp_path / "monitor.csv") == by_frame  # the file
    assert analysis.summarize(str(tmp_path)) == by_frame              # its run directory, as text
    with pytest.raises(DataError, match="a monitor frame .* or the path of a monitor.csv"):
        analysis.summarize({"time_s": [0.0]})
    with pytest.raises(DataError, match="lacks column"):
        analysis.summarize(pd.DataFrame({"time_s": [0.0]}))


def test_throttle_bits_are_nvml_s():
    pynvml = pytest.importorskip("pynvml")
    for bit, name in metrics.THROTTLE_REASONS.items():
        camel = "".join(w.capitalize() for w in name.split("_"))
        assert getattr(pynvml, f"nvmlClocksThrottleReason{camel}") == bit, name
    assert metrics.POWER_CAP_MASK == pynvml.nvmlClocksEventReasonSwPowerCap
    assert metrics.SLOWDOWN_MASK == (pynvml.nvmlClocksEventReasonSwThermalSlowdown
                                     | pynvml.nvmlClocksEventReasonHwThermalSlowdown
                                     | pynvml.nvmlClocksEventReasonHwSlowdown
                                     | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown)


def _h200_fixture(samples: int, bits_of) -> dict:
    """The synthetic fixture with gpu0 an H200 whose k-th reading of the clock-event reasons is bits_of(0, k)."""
    fx = fake_nvml.synthetic_fixture(samples=samples)
    fx["devices"][0] = dict(fx["devices"][0], nvmlDeviceGetName="NVIDIA H200", nvmlDeviceGetCudaComputeCapability=[9, 0])
    for k, per_dev in enumerate(fx["samples"]):
        for i, reading in enumerate(per_dev):
            reading["nvmlDeviceGetCurrentClocksEventReasons"] = bits_of(i, k)
    return fx


def test_an_h200_at_its_power_cap_is_not_a_cooling_fault(monkeypatch):
    # An H200 under a full bf16 matmul load: NVML reported the software power cap in 74% of samples. That is how
    # the GPU runs at full load; a thermal or hardware slowdown (gpu1 here) is the fault to flag.
    import pynvml

    cap, thermal = pynvml.nvmlClocksEventReasonSwPowerCap, pynvml.nvmlClocksEventReasonHwThermalSlowdown
    fx = _h200_fixture(50, lambda i, k: (cap if k < 37 else 0) if i == 0 else (cap | thermal if k < 10 else 0))
    fake = use(monkeypatch, fx)
    fake.nvmlInit()
    rows = []
    for k in range(50):  # each call returns the next recorded reading
        for i in range(2):
            h = fake.nvmlDeviceGetHandleByIndex(i)
            rows.append((k * 0.5, f"gpu{i}", "throttle_reasons", fake.nvmlDeviceGetCurrentClocksEventReasons(h), "train"))
    s = analysis.summarize(frame(rows))
    g0, g1 = s["gpus"]["gpu0"], s["gpus"]["gpu1"]
    assert g0["power_cap_frac"] == pytest.approx(0.74) and g0["power_capped"]
    assert g0["slowdown_frac"] == 0.0 and not g0["slowed_down"] and g0["slowdown_reasons"] == []
    assert not any(f.startswith("gpu0") for f in s["flags"])  # no "check cooling" for the power cap
    assert any(n.startswith("gpu0 ran at its software power cap in 74% of samples") and "not a cooling fault" in n
               for n in s["notes"])
    assert g1["slowed_down"] and g1["slowdown_frac"] == pytest.approx(0.2)
    assert g1["slowdown_reasons"] == ["hw_thermal_slowdown"]
    (flag,) = s["flags"]
    assert flag.startswith("gpu1 slowed down in 20% of samples (hw_thermal_slowdown)") and "cooling" in flag


def test_the_sampler_s_power_cap_reading_ends_as_a_note(tmp_path, monkeypatch):
    use(monkeypatch, _h200_fixture(4, lambda i, k: 0x4 if i == 0 else 0))
    _, df = run(tmp_path / "m.csv", 0.2)
    s = analysis.summarize(df)
    assert s["gpus"]["gpu0"]["power_capped"] and s["gpus"]["gpu0"]["power_cap_frac"] == 1.0
    assert s["flags"] == [] and len(s["notes"]) == 1


def test_the_recorded_h200_at_full_load_is_power_capped_not_faulty(tmp_path, monkeypatch):
    # A real recording: one H200 under a sustained bf16 matmul load (docs/benchmarks/gpu-reference.md), NVML's
    # clock-event reasons 0x4 (software power cap) in every sample, 689-695 W against the 700 W limit.
    fixture = json.loads((HERE / "fixtures" / "nvml_nvidia-h200_1gpu_20261204.json").read_text())
    assert {s[0]["nvmlDeviceGetCurrentClocksEventReasons"] for s in fixture["samples"]} == {4}
    use(monkeypatch, fixture)
    _, df = run(tmp_path / "m.csv", FAST * 12)
    s = analysis.summarize(df)
    g = s["gpus"]["gpu0"]
    assert g["power_capped"] and g["power_cap_frac"] == 1.0 and not g["slowed_down"]
    assert s["flags"] == []
    (note,) = s["notes"]
    assert "not a cooling fault" in note
