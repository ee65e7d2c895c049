import pytest

from tftoolkit.engine import devices, strategy
from tftoolkit.engine.devices import DeviceSetup
from tftoolkit.errors import ConfigError

GPU4 = DeviceSetup("GPU", ("/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"), (0, 1, 2, 3), 16)
CPU4 = DeviceSetup("CPU-simulated", ("/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"), None, 2)


def test_auto_picks_nccl_on_multi_gpu_linux(monkeypatch):
    monkeypatch.setattr(strategy, "nccl_available", lambda: (True, ""))
    assert strategy.choose_cross_device_ops("auto", GPU4)[0] == "nccl"


def test_auto_falls_back_with_the_reason_when_nccl_is_missing(monkeypatch):
    monkeypatch.setattr(strategy, "nccl_available", lambda: (False, "NCCL is Linux-only (this is win32)"))
    impl, reason = strategy.choose_cross_device_ops("auto", GPU4)
    assert impl == "hierarchical_copy" and "Linux-only" in reason
    with pytest.raises(ConfigError, match="nccl is not available: NCCL is Linux-only"):
        strategy.choose_cross_device_ops("nccl", GPU4)


def test_cpu_replicas_use_reduce_to_one_and_refuse_nccl():
    assert strategy.choose_cross_device_ops("auto", CPU4)[0] == "reduce_to_one"
    assert strategy.choose_cross_device_ops("hierarchical_copy", CPU4)[0] == "hierarchical_copy"
    with pytest.raises(ConfigError, match="needs GPUs"):
        strategy.choose_cross_device_ops("nccl", CPU4)


def test_nccl_unavailable_here_says_why():
    ok, why = strategy.nccl_available()
    assert not ok and ("CUDA" in why or "Linux" in why)


@pytest.mark.parametrize("impl", ["reduce_to_one", "hierarchical_copy"])
def test_strategy_mirrors_over_the_chosen_devices(impl):
    setup = devices.init(2)
    strat, name = strategy.make_strategy(setup, impl)
    assert strat.num_replicas_in_sync == 2 and name == impl
    assert [d.upper() for d in strat.extended.worker_devices] == ["/JOB:LOCALHOST/REPLICA:0/TASK:0/DEVICE:CPU:0",
                                                                 "/JOB:LOCALHOST/REPLICA:0/TASK:0/DEVICE:CPU:1"]
