"""Device selection: simulated CPU replicas here, and the GPU paths against a stand-in for tf.config."""

import types

import pytest

from tftoolkit.engine import devices
from tftoolkit.errors import DeviceError


def test_simulated_replicas_are_logical_cpu_devices():
    setup = devices.init(3)
    assert setup.kind == "CPU-simulated"
    assert setup.devices == ("/cpu:0", "/cpu:1", "/cpu:2") and setup.replicas == 3 and setup.gpu_indices is None


def test_more_simulated_replicas_than_initialised_says_what_to_do():
    with pytest.raises(DeviceError, match=r"init_devices\(64\)"):
        devices.init(64)


def test_gpus_on_a_cpu_machine_is_an_error():
    with pytest.raises(DeviceError, match="has none visible"):
        devices.init(gpus=[0])


def test_thread_pools_are_set_for_shared_cores():
    import tensorflow as tf

    t = devices.thread_settings()
    assert t["intra_op"] == tf.config.threading.get_intra_op_parallelism_threads() == devices.host_cores()
    assert t["inter_op"] == tf.config.threading.get_inter_op_parallelism_threads()


class FakeTF:
    """The few tf.config calls devices.py makes for GPUs, recording what was asked."""

    def __init__(self, initialised=False):
        self.visible, self.growth, self.initialised = None, [], initialised

        def set_visible_devices(devs, kind):
            if self.initialised:
                raise RuntimeError("Visible devices cannot be modified after being initialized")
            self.visible = list(devs)

        def set_memory_growth(dev, on):
            self.growth.append((dev, on))

        self.config = types.SimpleNamespace(set_visible_devices=set_visible_devices,
                                            experimental=types.SimpleNamespace(set_memory_growth=set_memory_growth))


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(devices, "_state", {})


def test_gpus_by_index_become_the_only_visible_ones(fresh_state):
    tf, phys = FakeTF(), ["G0", "G1", "G2", "G3", "G4", "G5"]
    setup = devices._init_gpus(tf, phys, None, [0, 2, 5])
    assert tf.visible == ["G0", "G2", "G5"] and [g for g, on in tf.growth if on] == ["G0", "G2", "G5"]
    assert setup.kind == "GPU" and setup.devices == ("/gpu:0", "/gpu:1", "/gpu:2") and setup.gpu_indices == (0, 2, 5)


def test_replicas_take_the_first_n_gpus_and_default_is_all(fresh_state, monkeypatch):
    assert devices._init_gpus(FakeTF(), ["G0", "G1", "G2"], 2, None).gpu_indices == (0, 1)
    monkeypatch.setattr(devices, "_state", {})
    assert devices._init_gpus(FakeTF(), ["G0", "G1", "G2"], None, None).replicas == 3


def test_missing_gpus_are_named_with_those_present(fresh_state):
    with pytest.raises(DeviceError, match=r"GPU\(s\) \[5\] are not there; this machine has 4 GPU\(s\): 0, 1, 2, 3"):
        devices._init_gpus(FakeTF(), ["G0", "G1", "G2", "G3"], None, [1, 5])


def test_more_gpus_than_present(fresh_state):
    with pytest.raises(DeviceError, match="8 replicas asked but this machine has 2 GPU"):
        devices._init_gpus(FakeTF(), ["G0", "G1"], 8, None)


def test_gpus_after_tensorflow_started_keep_physical_names(fresh_state):
    setup = devices._init_gpus(FakeTF(initialised=True), ["G0", "G1", "G2"], None, [2])
    assert setup.devices == ("/gpu:2",)


def test_resolve_replicas():
    assert devices.resolve_replicas(None, [3, 4]) == 2
    assert devices.resolve_replicas(5, None) == 5
    assert devices.resolve_replicas(None, None) == 1  # no GPU here: one CPU replica
