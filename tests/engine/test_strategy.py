import pytest

from tftoolkit.engine import devices
from tftoolkit.engine.devices import DeviceSetup
from tftoolkit.errors import ConfigError

from helpers import lazy

strategy = lazy("tftoolkit.engine.strategy")  # collected without TensorFlow (tests/helpers.py)

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


GPU3 = DeviceSetup("GPU", ("/gpu:0", "/gpu:1", "/gpu:2"), (0, 1, 2), 16)
CPU3 = DeviceSetup("CPU-simulated", ("/cpu:0", "/cpu:1", "/cpu:2"), None, 2)


@pytest.mark.parametrize("setup", [CPU3, GPU3, DeviceSetup("GPU", tuple(f"/gpu:{i}" for i in range(7)), None, 16)])
def test_hierarchical_copy_is_refused_at_an_odd_replica_count(setup):
    # TensorFlow's hierarchical copy splits the devices into two groups of n // 2: at 3 the third replica's
    # gradients are never summed (measured below).
    with pytest.raises(ConfigError, match=rf"hierarchical_copy at {setup.replicas} replicas: .*drops the odd one"):
        strategy.choose_cross_device_ops("hierarchical_copy", setup)


def test_auto_never_picks_hierarchical_copy_at_an_odd_count(monkeypatch):
    monkeypatch.setattr(strategy, "nccl_available", lambda: (False, "no NCCL"))
    impl, reason = strategy.choose_cross_device_ops("auto", GPU3)
    assert impl == "reduce_to_one" and "drops a replica" in reason
    assert strategy.choose_cross_device_ops("auto", GPU4)[0] == "hierarchical_copy"


def test_tensorflow_s_hierarchical_copy_really_loses_the_third_replica(cpu_devices):
    # The evidence for the refusal, kept honest: if a TensorFlow release fixes it, this fails and the refusal can go.
    from tftoolkit.measure import allreduce

    ok, why = allreduce.check_sum(strategy.mirrored(CPU3.devices, strategy.cross_device_ops_object("hierarchical_copy")))
    assert not ok and "got 3 for 1 + ... + 3 = 6" in why
    for impl in ("reduce_to_one", "collective"):
        assert allreduce.check_sum(strategy.mirrored(CPU3.devices, strategy.cross_device_ops_object(impl)))[0]


def test_under_xla_on_gpus_the_all_reduce_is_the_collective_one():
    # mirrored_strategy.py: "Under XLA context, MirroredStrategy uses CollectiveAllReduce op" whatever
    # cross_device_ops says; the summary and the direct all-reduce timing follow what really runs.
    assert strategy.effective_cross_device_ops("nccl", GPU4, jit=True) == "collective_nccl (xla)"
    assert strategy.effective_cross_device_ops("nccl", GPU4, jit=False) == "nccl"
    assert strategy.effective_cross_device_ops("reduce_to_one", CPU4, jit=True) == "reduce_to_one"
    one = DeviceSetup("GPU", ("/gpu:0",), (0,), 16)
    assert strategy.effective_cross_device_ops("reduce_to_one", one, jit=True) == "reduce_to_one"


def test_the_direct_allreduce_timing_compiles_with_xla_when_the_step_does(monkeypatch):
    from tftoolkit.measure import allreduce, breakdown

    seen = {}
    monkeypatch.setattr(allreduce, "time_allreduce", lambda *a, **k: seen.update(k) or {"time_s": 0.001, "time_err_s": 0.0})
    monkeypatch.setattr(allreduce, "gradient_shapes", lambda model: ([(4,)], ["float32"]))
    from tftoolkit.engine.step import Exchange

    def strategy(local, replicas):
        return type("S", (), {"extended": type("X", (), {"worker_devices": ["d"] * local})(),
                              "num_replicas_in_sync": replicas})()

    engine = type("E", (), {"model": None, "strategy": strategy(2, 2), "exchange": Exchange("bfloat16")})()
    breakdown.direct_allreduce_time(engine, repeats=5, jit=True)
    assert seen["jit"] is True
    assert seen["allreduce_dtype"] == "bfloat16"  # and in the run's all-reduce dtype, casts included
    assert seen["max_repeats"] == 20  # one process: repeats added while the time is within noise
    # Several workers: each would judge its own clock's noise, and one repeating alone waits for all-reduces the
    # others never start; all run the same fixed repeats.
    engine.strategy = strategy(2, 4)
    breakdown.direct_allreduce_time(engine, repeats=5, jit=True)
    assert seen["max_repeats"] == 5


COLLECTIVE_KEYS_CHILD = """
import sys
from tftoolkit.engine import devices, strategy
import numpy as np
devices.init(4)
import tensorflow as tf
# Strategies of 1, 2 and 3 replicas, one after another in one process, each all-reducing with collective ops
# (what XLA uses on GPUs, and --cross-device-ops collective): each must sum exactly.
for n in (1, 2, 3, 2):
    setup = devices.DeviceSetup("CPU-simulated", tuple(f"/cpu:{i}" for i in range(n)), None, 2)
    s, _ = strategy.make_strategy(setup, "collective")
    def rep():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce("SUM", tf.fill([8], tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)))
    out = tf.function(lambda: s.run(rep))()
    got = sorted({float(v.numpy()[0]) for v in s.experimental_local_results(out)})
    assert got == [n * (n + 1) / 2], (n, got)
print("ok")
"""


@pytest.mark.slow  # its own process: a clash of collective keys aborts every collective op in the process
def test_strategies_of_different_sizes_in_one_process_take_fresh_collective_keys():
    import subprocess
    import sys

    from helpers import ROOT

    done = subprocess.run([sys.executable, "-c", COLLECTIVE_KEYS_CHILD], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


# --- the all-reduce dtype on GPUs ------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["nccl", "collective", "collective_nccl", "collective_ring"])
def test_bfloat16_gradients_are_refused_where_tensorflow_cannot_reduce_them_on_gpus(impl):
    from tftoolkit.engine.strategy import check_allreduce_dtype

    with pytest.raises(ConfigError, match="bfloat16 cannot go through .* float16"):
        check_allreduce_dtype("bfloat16", impl, GPU4, jit=False, replicas=4)
    check_allreduce_dtype("float16", impl, GPU4, jit=False, replicas=4)  # half precision goes everywhere
    check_allreduce_dtype("bfloat16", impl, CPU4, jit=False, replicas=4)  # CPU replicas reduce bfloat16
    check_allreduce_dtype("bfloat16", impl, GPU4, jit=False, replicas=1)  # one replica reduces nothing


@pytest.mark.parametrize("impl", ["hierarchical_copy", "reduce_to_one", "collective_nccl (xla)"])
def test_bfloat16_gradients_go_through_add_n_reductions_and_xla(impl):
    from tftoolkit.engine.strategy import check_allreduce_dtype

    check_allreduce_dtype("bfloat16", impl, GPU4, jit=impl.endswith("(xla)"), replicas=4)


def test_the_nccl_op_and_add_n_on_gpus_take_the_dtypes_the_check_assumes():
    # What check_allreduce_dtype stands on, read from this TensorFlow's registry (a newer one that adds bfloat16 to
    # NcclAllReduce makes this fail, and the refusal can go): the op's T excludes bfloat16 and admits half; AddN, the
    # sum of hierarchical_copy and reduce_to_one, has GPU kernels for both.
    import tensorflow as tf
    from tensorflow.python.framework import kernels, op_def_registry

    attr = {a.name: a for a in op_def_registry.get("NcclAllReduce").attr}["T"]
    allowed = set(attr.allowed_values.list.type)
    assert tf.float16.as_datatype_enum in allowed and tf.float32.as_datatype_enum in allowed
    assert tf.bfloat16.as_datatype_enum not in allowed
    gpu_types = {t for k in kernels.get_registered_kernels_for_op("AddN").kernel if k.device_type == "GPU"
                 for c in k.constraint for t in c.allowed_values.list.type}
    assert {tf.bfloat16.as_datatype_enum, tf.float16.as_datatype_enum} <= gpu_types
