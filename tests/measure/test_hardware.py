"""measure.hardware (the environment report), measure.host_topology (this host's wiring), measure.peaks (peak FLOP/s).

NVML is replaced by tests/fake_nvml.py, built from the documented API (no GPU was available when these tests
were written); any real recording in tests/fixtures/nvml_*.json is replayed through the same fake.
"""

import importlib.metadata
import importlib.util
import inspect
import json
import re
from pathlib import Path

import pytest

import fake_nvml
from tftoolkit import catalogue, nvml
from tftoolkit.measure import hardware, host_topology, peaks
from tftoolkit.errors import ConfigError

from helpers import ROOT

HERE = ROOT / "tests"  # fake_nvml.py and fixtures/


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


recorder = _load("record_nvml_fixture", ROOT / "benchmarks" / "record_nvml_fixture.py")
REAL_FIXTURES = sorted((HERE / "fixtures").glob("nvml_*.json"))
NO_REAL_FIXTURE = pytest.param(None, marks=pytest.mark.skip(
    reason="no recorded NVML fixture yet: run benchmarks/record_nvml_fixture.py on a GPU machine"))

# What `nvidia-smi topo -m` prints for the synthetic machine (format of current drivers: ANSI-underlined
# header, a NIC column, affinity columns, legends). Written by hand, like the fake.
TOPO_TEXT = (
    "\x1b[4m\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV12\tSYS\tSYS\tNODE\t0-15\t0\t\tN/A\n"
    "GPU1\tNV12\t X \tSYS\tSYS\tNODE\t0-15\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tPIX\tSYS\t16-31\t1\t\tN/A\n"
    "GPU3\tSYS\tSYS\tPIX\t X \tSYS\t16-31\t1\t\tN/A\n"
    "NIC0\tNODE\tNODE\tSYS\tSYS\t X \t\t\t\t\n"
    "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)
EXPECTED = [["X", "NV12", "SYS", "SYS"], ["NV12", "X", "SYS", "SYS"],
            ["SYS", "SYS", "X", "PIX"], ["SYS", "SYS", "PIX", "X"]]


@pytest.fixture
def fake(monkeypatch):
    mod = fake_nvml.install(monkeypatch)
    monkeypatch.setattr(host_topology, "_run_topo_command", lambda: None)
    return mod


# -- this machine (no GPU here) ----------------------------------------------------------------------------------------
def test_report_on_this_machine_is_json_and_reads_tf_build_without_importing_it():
    report = hardware.collect()
    json.dumps(report)  # env.json must be writable as is
    tf = report["tensorflow"]
    assert tf["version"] == importlib.metadata.version("tensorflow")
    text = (Path(importlib.util.find_spec("tensorflow").submodule_search_locations[0])
            / "python" / "platform" / "build_info.py").read_text()
    m = re.search(r"'cuda_version', '([^']*)'", text)
    assert tf["cuda_version"] == (m.group(1) if m else None)
    assert report["host"]["cpu_logical_cores"] >= 1 and report["host"]["memory_total_bytes"] > 0
    if not report["gpus"]:
        assert "simulated" in report["summary"] and "CPU" in report["summary"]
        assert report["nccl"]["usable"] is False and "no GPU" in report["nccl"]["reason"]
        assert report["driver"]["reason"]
    text = hardware.format_report(report)
    assert "Host" in text and "GPUs" in text and report["summary"] in text


@pytest.mark.parametrize("error, says", [("NVMLError_LibraryNotFound", "libnvidia-ml is not installed"),
                                          ("NVMLError_DriverNotLoaded", "driver is not loaded")])
def test_no_gpu_machine_says_so_plainly(monkeypatch, error, says):
    fake_nvml.install(monkeypatch, init_error=error)
    monkeypatch.setattr(host_topology, "_run_topo_command", lambda: None)
    report = hardware.collect()
    assert report["gpus"] == [] and report["topology"]["matrix"] == []
    assert says in report["summary"] and "simulated" in report["summary"]
    assert report["nccl"]["usable"] is False


def test_pynvml_not_installed(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(nvml, "load", missing)
    report = hardware.collect()
    assert report["gpus"] == [] and "nvidia-ml-py" in report["driver"]["reason"]


# -- GPUs through the fake -----------------------------------------------------------------------------------------------
def test_gpu_facts_and_units(fake):
    report = hardware.collect(tf_info={"is_cuda_build": True})
    assert report["driver"] == {"nvml_available": True, "driver_version": "550.54.15", "cuda_driver_version": "12.4",
                                "reason": None}
    g0, g2 = report["gpus"][0], report["gpus"][2]
    assert [g["index"] for g in report["gpus"]] == [0, 1, 2, 3]
    assert g0["name"] == "NVIDIA A100-SXM4-80GB" and g0["compute_capability"] == "8.0"
    assert g0["memory_total_bytes"] == 80 * 2**30
    assert g0["power_limit_w"] == 400.0  # NVML gives mW
    assert (g0["pcie_gen_max"], g0["pcie_width_max"]) == (4, 16)
    assert g0["pci_bus_id"] == "00000000:07:00.0"  # bytes from the PciInfo struct, decoded
    assert g0["nvlink_active_links"] == 12 and g2["nvlink_active_links"] == 0
    assert (g2["pcie_gen_current"], g2["pcie_gen_max"]) == (1, 3)
    assert g0["peak_tflops"]["bf16"] == 312.0
    assert report["nccl"] == {"usable": True, "reason": "Linux, CUDA build, 4 GPUs"}
    assert report["errors"] == []
    assert fake._initialised == 0  # every nvmlInit has its nvmlShutdown
    json.dumps(report)


def test_topology_matrix_nvlink_and_pcie(fake):
    topo = hardware.collect()["topology"]
    assert topo["source"] == "nvml" and topo["complete"]
    assert topo["matrix"] == EXPECTED
    pairs = {tuple(p["gpus"]): p for p in topo["pairs"]}
    assert len(pairs) == 6
    assert pairs[(0, 1)]["nvlink_links"] == 12 and pairs[(0, 1)]["nvlink_version"] == "3.0"  # enum 4 = NVLink 3.0
    assert pairs[(0, 1)]["pcie_level"] == "NODE"  # the PCIe path is still reported under the NVLinks
    assert pairs[(2, 3)] | {} == {"gpus": [2, 3], "link": "PIX", "nvlink_links": 0, "nvlink_version": None,
                                  "pcie_level": "PIX", "meaning": "one PCIe switch"}
    assert pairs[(1, 2)]["link"] == "SYS" and "sockets" in pairs[(1, 2)]["meaning"]


def test_nvswitch_board_shows_every_pair_as_nvlink(monkeypatch):
    fake_nvml.install(monkeypatch, fake_nvml.nvswitch_fixture(n=4, links=18))
    topo = hardware.collect()["topology"]
    assert all(topo["matrix"][i][j] == ("X" if i == j else "NV18") for i in range(4) for j in range(4))
    assert {p["nvlink_version"] for p in topo["pairs"]} == {"4.0"}


def test_topology_falls_back_to_nvidia_smi_when_nvml_topology_fails(fake, monkeypatch):
    fake.fail["nvmlDeviceGetTopologyCommonAncestor"] = "NVMLError_Unknown"
    monkeypatch.setattr(host_topology, "_run_topo_command", lambda: TOPO_TEXT)
    report = hardware.collect()
    assert report["topology"]["source"] == "nvidia-smi"
    assert report["topology"]["matrix"] == EXPECTED
    assert any(e["where"].startswith("topology.") and "NVMLError_Unknown" in e["error"] for e in report["errors"])
    assert any("nvidia-smi" in n for n in report["notes"])


def test_topology_without_any_fallback_keeps_what_nvml_gave(fake):
    fake.fail["nvmlDeviceGetTopologyCommonAncestor"] = "NVMLError_Unknown"
    topo = hardware.collect()["topology"]
    assert topo["source"] == "nvml" and not topo["complete"]
    assert topo["matrix"][0][1] == "NV12" and topo["matrix"][2][3] == "?"


def test_parse_topo_matrix_ignores_nic_columns_and_ansi():
    topo = host_topology.parse_topo_matrix(TOPO_TEXT)
    assert topo["matrix"] == EXPECTED
    assert {tuple(p["gpus"]): p["nvlink_links"] for p in topo["pairs"]}[(0, 1)] == 12
    one = host_topology.parse_topo_matrix("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-7\t0\n")
    assert one["matrix"] == [["X"]] and one["pairs"] == []
    assert host_topology.parse_topo_matrix("NVIDIA-SMI has failed")["matrix"] == []


def test_no_permission_on_one_query_is_recorded_not_raised(fake):
    fake.fail["nvmlDeviceGetEnforcedPowerLimit"] = "NVMLError_NoPermission"
    fake.fail[("nvmlDeviceGetPowerManagementLimit", 1)] = "NVMLError_NoPermission"
    report = hardware.collect()
    assert report["gpus"][0]["power_limit_w"] == 400.0  # fell back to the management limit
    assert report["gpus"][1]["power_limit_w"] is None
    assert [e["where"] for e in report["errors"]] == ["gpu1.power_limit"]
    assert "NoPermission" in report["errors"][0]["error"]
    assert "error: gpu1.power_limit" in hardware.format_report(report)


def test_not_supported_is_an_answer_not_an_error(fake):
    fake.fail["nvmlDeviceGetCurrPcieLinkGeneration"] = "NVMLError_NotSupported"
    report = hardware.collect()
    assert report["gpus"][0]["pcie_gen_current"] is None and report["errors"] == []


def test_caller_tf_info_overrides_files(fake):
    report = hardware.collect(tf_info={"version": "9.9.9", "is_cuda_build": False, "cuda_version": None})
    tf = report["tensorflow"]
    assert tf["version"] == "9.9.9" and tf["source"] == "caller" and tf["is_cuda_build"] is False
    assert report["nccl"]["usable"] is False and "no CUDA" in report["nccl"]["reason"]


def test_parse_build_info_both_spellings():
    od = ("import collections\nbuild_info = collections.OrderedDict([('cuda_version', '12.5.1'), "
          "('cudnn_version', '9'), ('is_cuda_build', True)])\n")
    assert hardware.parse_build_info(od) == {"cuda_version": "12.5.1", "cudnn_version": "9", "is_cuda_build": True}
    assert hardware.parse_build_info("build_info = {'is_cuda_build': False}\n") == {"is_cuda_build": False}
    assert hardware.parse_build_info("x = 1\n") == {}


def test_format_report_tables(fake):
    text = hardware.format_report(hardware.collect())
    assert re.search(r"GPU0\s+X\s+NV12\s+SYS\s+SYS", text)
    assert re.search(r"0\s+NVIDIA A100-SXM4-80GB\s+80\.0 GiB\s+8\.0\s+400 W", text)
    assert "NV12  = a bonded set of 12 NVLinks (NVLink 3.0)" in text
    assert "PIX   = one PCIe switch" in text


def test_env_command_prints_json_or_table(fake, capsys):
    from tftoolkit import cli

    assert cli.main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["gpus"]) == 4
    assert cli.main(["env"]) == 0
    assert "Topology (from nvml)" in capsys.readouterr().out


# -- peak FLOP/s -------------------------------------------------------------------------------------------------------
def test_peak_flops_lookup():
    assert peaks.peak_flops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4e12)
    assert peaks.peak_flops("NVIDIA H100 80GB HBM3", "mixed_float16") == pytest.approx(989.4e12)
    assert peaks.peak_flops("NVIDIA A100-SXM4-80GB", "float32") == pytest.approx(19.5e12)
    assert peaks.peak_flops("nvidia  a100-sxm4-80gb", "tf32") == pytest.approx(156e12)  # spacing/case tolerant
    assert peaks.peak_flops("Tesla V100-SXM2-32GB", "bf16") is None  # no BF16 on Volta
    assert peaks.peak_flops("Tesla T4", "fp16") == pytest.approx(65e12)
    assert peaks.peak_flops("NVIDIA H100 NVL", "fp32") is None  # unconfirmed in the catalogue
    assert peaks.peak_flops("Some Future GPU", "bf16") is None
    with pytest.raises(ConfigError, match="unknown precision"):
        peaks.peak_flops("Tesla T4", "int8")


def test_peak_rows_come_from_the_catalogue_by_nvml_name():
    names = [n for g in catalogue.gpus() for n in g.names] + list(peaks.NOT_YET_CATALOGUED)
    assert "NVIDIA A100-SXM4-80GB" in names and "NVIDIA H100 80GB HBM3" in names
    assert not set(peaks.NOT_YET_CATALOGUED) & {n for g in catalogue.gpus() for n in g.names}  # one home per GPU
    assert peaks.peak_tflops("Some Future GPU") is None
    for name in names:
        row = peaks.peak_tflops(name)
        assert set(row) == {"fp32", "tf32", "fp16", "bf16"}, name
        known = [row[k] for k in ("fp32", "tf32", "fp16") if row[k] is not None]
        assert known == sorted(known), f"{name}: tensor rates should not be below FP32"


# -- the fake and the recorder stay honest -----------------------------------------------------------------------------
def test_fake_follows_installed_pynvml_api():
    real = pytest.importorskip("pynvml")
    mod = fake_nvml.build(fake_nvml.synthetic_fixture())
    for name in dir(mod):
        value = getattr(mod, name)
        if name.startswith("nvml") and callable(value):
            assert hasattr(real, name), name
            real_params = list(inspect.signature(getattr(real, name)).parameters)
            assert list(inspect.signature(value).parameters) == real_params, name
        elif name.startswith("NVML_") and name != "NVML_NVLINK_MAX_LINKS":
            assert getattr(real, name) == value, name
        elif name.startswith("NVMLError_"):
            assert getattr(real, name)().value == value().value, name
    assert issubclass(mod.NVMLError_NoPermission, mod.NVMLError)
    assert isinstance(mod.NVMLError(4), mod.NVMLError_NoPermission)  # pynvml picks the subclass by code


def test_every_nvml_call_in_the_package_exists_in_pynvml():
    real = pytest.importorskip("pynvml")
    root = ROOT
    used = set()
    for path in [*sorted((root / "tftoolkit").rglob("*.py")), root / "benchmarks" / "record_nvml_fixture.py"]:
        used |= set(re.findall(r"\bnvml\.(nvml\w+)", path.read_text()))
    assert used and not [n for n in used if not hasattr(real, n)]


def test_recorder_round_trip_replays_identically(fake):
    before = hardware.collect()
    recorded = json.loads(json.dumps(recorder.record(fake, seconds=0.0, interval=0.01)))
    assert recorded["format"] == fake_nvml.synthetic_fixture()["format"]
    assert recorded["devices"][2]["nvlink"] == [{"nvmlDeviceGetNvLinkState": {
        "error": "NVMLError_NotSupported", "message": "Not Supported"}}]
    replay = fake_nvml.build(recorded)
    nvml.load = lambda: replay  # the fixture's monkeypatch restores it
    after = hardware.collect()
    for g in before["gpus"] + after["gpus"]:
        g.pop("uuid")  # the recorder anonymises UUIDs
    assert after["gpus"] == before["gpus"] and after["topology"] == before["topology"]
    assert after["driver"] == before["driver"]


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in REAL_FIXTURES] or [NO_REAL_FIXTURE])
def test_replay_recorded_fixture(path, monkeypatch):
    fixture = json.loads(path.read_text())
    fake_nvml.install(monkeypatch, fixture)
    monkeypatch.setattr(host_topology, "_run_topo_command", lambda: None)
    report = hardware.collect()
    json.dumps(report)
    assert len(report["gpus"]) == len(fixture["devices"])
    names = [d["nvmlDeviceGetName"] for d in fixture["devices"]]
    assert [g["name"] for g in report["gpus"]] == [n if isinstance(n, str) else None for n in names]
    if fixture.get("nvidia_smi_topo_m") and len(report["gpus"]) > 1:
        # NVML's answer must agree with nvidia-smi's on the same machine.
        assert report["topology"]["matrix"] == host_topology.parse_topo_matrix(fixture["nvidia_smi_topo_m"])["matrix"]


@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA L40S", "float32", 91.6), ("NVIDIA L40S", "tf32", 183.0), ("NVIDIA L40S", "mixed_bfloat16", 362.05),
    ("NVIDIA L40", "tf32", 90.5), ("NVIDIA A40", "mixed_float16", 149.7), ("NVIDIA A10", "tf32", 62.5),
    ("NVIDIA B200", "bf16", 2250.0), ("NVIDIA B200", "tf32", 1100.0), ("NVIDIA GH200 480GB", "bf16", 989.4),
    ("NVIDIA H200 NVL", "bf16", 835.5),
])
def test_newer_gpus_have_their_dense_datasheet_peaks(name, precision, tflops):
    assert peaks.peak_flops(name, precision) == pytest.approx(tflops * 1e12)
    assert peaks.peak_flops("NVIDIA H200 NVL", "fp32") is None  # unconfirmed: no guess
