"""tftoolkit.gpus: CUDA_VISIBLE_DEVICES read as CUDA reads it, and the GPUs children get (the launch bug)."""

import pytest

import fake_nvml
from tftoolkit import gpus, nvml


@pytest.mark.parametrize("text, expected", [
    (None, None),                          # unset: every GPU
    ("", []),                              # set but empty: none
    ("-1", []),                            # the usual way to hide every GPU
    ("0,2", ["0", "2"]),
    ("2,1", ["2", "1"]),                   # list order is enumeration order
    (" 4 , 5 ", ["4", "5"]),
    ("0,2,-1,1", ["0", "2"]),              # the first invalid entry ends the list (CUDA's own example)
    ("1gpu,2", ["1", "2"]),                # read like strtoul
    ("01,3", ["1", "3"]),
    ("0,x,1", ["0"]),
    ("0,0", []),                           # a repeated entry makes nothing visible
    ("GPU-8932f937,GPU-aa01", ["GPU-8932f937", "GPU-aa01"]),
    ("GPU-8932f937,1", ["GPU-8932f937"]),  # another kind of entry is an invalid one
    ("0,GPU-8932f937", ["0"]),
    ("MIG-GPU-8932f937/1/0", ["MIG-GPU-8932f937/1/0"]),
    ("0,,1", ["0"]),
])
def test_parse_follows_cuda(text, expected):
    assert gpus.parse(text) == expected


def test_ids_hand_out_this_process_s_own_gpus(monkeypatch):
    monkeypatch.setattr(gpus, "machine_count", lambda: 8)
    assert gpus.ids({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == ["4", "5", "6", "7"]
    assert gpus.ids({}) == [str(i) for i in range(8)]
    assert gpus.ids({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_child_env_numbers_gpus_as_nvml_only_when_the_ids_are_nvml_s():
    assert gpus.child_env(["2", "3"], {}) == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    # Entries from our own CUDA_VISIBLE_DEVICES keep the numbering they were given in.
    assert gpus.child_env(["5"], {"CUDA_VISIBLE_DEVICES": "4,5"}) == {"CUDA_VISIBLE_DEVICES": "5"}
    assert gpus.child_env(["1"], {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == {"CUDA_VISIBLE_DEVICES": "1"}


def test_physical_maps_tensorflow_s_numbers_back():
    assert gpus.physical([0, 1], {"CUDA_VISIBLE_DEVICES": "4,6"}) == ["4", "6"]
    assert gpus.physical([1], {}) == ["1"]


UUIDS = ["GPU-aaaa-0000", "GPU-aaab-1111", "GPU-cccc-2222", "GPU-dddd-3333"]


@pytest.fixture
def four_gpus(monkeypatch):
    """tests/fake_nvml.py with four GPUs of these UUIDs, initialised; later drivers name MIG instances MIG-<uuid>,
    and NVML gives the instance's handle and its parent (here MIG-1f2e-0001 on GPU 3)."""
    fx = fake_nvml.synthetic_fixture(samples=0)
    fx["devices"] = [dict(d, nvmlDeviceGetUUID=u) for d, u in zip(fx["devices"], UUIDS)]
    fx["mig"] = {"MIG-1f2e-0001": 3}
    fake_nvml.install(monkeypatch, fx)
    with nvml.session() as mod:
        yield mod


@pytest.mark.parametrize("devices, expected", [
    (["2", "3"], [2, 3]),
    (["3", "9", "1"], [3]),                       # an index past the last GPU ends the list
    (["GPU-cccc", "GPU-aaab-1111"], [2, 1]),      # UUID prefixes
    (["GPU-aaa", "GPU-cccc"], []),                # an ambiguous prefix ends the list
    (["MIG-GPU-cccc-2222/1/0"], [2]),             # a MIG slice (CUDA 11.0's name) maps to the GPU it is part of
    (["MIG-1f2e-0001"], [3]),                     # and the later MIG-<uuid> through NVML's parent handle
    (["MIG-GPU-eeee-9999/1/0"], None),            # a parent NVML does not know: no mapping (the monitor takes all)
    (["MIG-ffff-0002"], None),
])
def test_nvml_indices(devices, expected, four_gpus):
    assert gpus.nvml_indices(devices, four_gpus) == expected


def test_machine_count_asks_nvml_through_its_session(monkeypatch):
    mod = fake_nvml.install(monkeypatch)
    assert gpus.machine_count() == 4
    assert mod.calls["nvmlInit"] == mod.calls["nvmlShutdown"] == 1 and mod._initialised == 0


def test_launched_workers_get_the_gpus_this_process_was_given(monkeypatch):
    """The bug: under CUDA_VISIBLE_DEVICES=4,5,6,7 the workers used to get "0,1" and "2,3"."""
    from tftoolkit.cli import cluster as cli_cluster
    from tftoolkit.cluster import launch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    p = launch.plan(*cli_cluster.train_command(["train", "--out", "x"]), 2)
    assert p.gpu_slices == [["4", "5"], ["6", "7"]] and p.replicas_per_worker == 2
    envs = [launch.worker_env(p, k, ["localhost:1", "localhost:2"], "/tmp", 10) for k in range(2)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,5", "6,7"]
    assert all("CUDA_DEVICE_ORDER" not in e for e in envs)


def test_the_monitor_watches_the_physical_gpus_a_run_uses(monkeypatch):
    """TensorFlow's /gpu:0 under CUDA_VISIBLE_DEVICES=4,5 is nvidia-smi's GPU 4."""
    from tftoolkit.engine import devices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert devices.nvml_indices([1]) == (5,)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa")
    assert devices.nvml_indices([0]) is None  # the monitor maps UUIDs itself
