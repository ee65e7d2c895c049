"""Step-time breakdown, load balance, FLOPs and MFU: formulas with numbers, then a real run's summary."""

import math

import numpy as np
import pytest

from tftoolkit.engine import devices
from tftoolkit.measure import breakdown as measure, flops
from tftoolkit.config import RunConfig

from helpers import FAST

devices.init(4)  # before anything touches TensorFlow (conftest does the same)


# --- breakdown formulas ------------------------------------------------------------------------------------
def test_breakdown_splits_the_step():
    b = measure.breakdown(step_time_s=0.010, step_no_input_s=0.008, compute_s=0.006, replicas=4)
    assert b["allreduce_time_s"] == pytest.approx(0.002)
    assert b["input_wait_s"] == pytest.approx(0.002)
    assert b["input_wait_fraction"] == pytest.approx(0.2)
    assert b["communication_fraction"] == pytest.approx(0.25)   # 2 ms of the 8 ms step without input
    assert b["communication_note"].startswith("compute-bound") and "25%" in b["communication_note"]


def test_breakdown_says_when_communication_exceeds_compute():
    b = measure.breakdown(step_time_s=0.007, step_no_input_s=0.007, compute_s=0.002, replicas=8)
    assert b["allreduce_time_s"] == pytest.approx(0.005) and b["input_wait_s"] == 0.0
    assert b["communication_fraction"] == pytest.approx(5 / 7)
    assert "communication-bound" in b["communication_note"] and "stop paying off" in b["communication_note"]


def test_breakdown_clips_timing_noise_and_handles_one_replica():
    b = measure.breakdown(step_time_s=0.004, step_no_input_s=0.005, compute_s=0.0052, replicas=1)
    assert b["allreduce_time_s"] == 0.0 and b["input_wait_s"] == 0.0
    assert b["communication_fraction"] == 0.0
    assert b["communication_note"] == "one replica: there is no gradient all-reduce"
    # a directly timed all-reduce can be passed instead of the difference
    b = measure.breakdown(0.01, 0.008, 0.006, 2, allreduce_s=0.001)
    assert b["allreduce_time_s"] == 0.001 and b["communication_fraction"] == pytest.approx(1 / 7)


def test_load_balance_is_max_over_mean():
    assert measure.load_balance([250, 250, 250, 250])["imbalance"] == 1.0
    assert measure.load_balance([12, 10, 10, 8])["imbalance"] == pytest.approx(1.2)
    assert math.isnan(measure.load_balance([])["imbalance"])


# --- FLOPs ---------------------------------------------------------------------------------------------------
def _conv_dense_model():
    import keras
    from keras import layers

    inputs = keras.Input((8, 8, 3))
    x = layers.Conv2D(4, 3, padding="same")(inputs)   # 8x8x4 outputs, 3x3x3 MACs each, + bias
    x = layers.Flatten()(x)                           # 256
    outputs = layers.Dense(5)(x)                      # 256x5 MACs + bias
    return keras.Model(inputs, outputs)


# By hand: conv 2 x (8*8*4 * 3*3*3) + 8*8*4 bias = 13824 + 256; dense 2 x (256*5) + 5 = 2560 + 5.
HAND_COUNT = 13824 + 256 + 2560 + 5


def test_flops_of_a_hand_counted_conv_dense_model():
    model = _conv_dense_model()
    assert flops.analytic_forward_flops(model) == HAND_COUNT == 16645
    assert flops.profiler_forward_flops(model, (8, 8, 3)) == HAND_COUNT
    assert flops.forward_flops(model, (8, 8, 3)) == (HAND_COUNT, "tf_profiler")
    assert flops.training_flops_per_example(HAND_COUNT) == 3 * HAND_COUNT


def test_analytic_flops_of_strided_depthwise_and_biasless_layers():
    import keras
    from keras import layers

    inputs = keras.Input((9, 9, 2))
    x = layers.Conv2D(6, 3, strides=2, use_bias=False)(inputs)  # valid: 4x4x6 outputs, 3*3*2 MACs each
    x = layers.DepthwiseConv2D(3, padding="same")(x)            # 4x4x6 outputs, 3*3 MACs each, + bias
    x = layers.Flatten()(x)                                     # 96
    outputs = layers.Dense(3, use_bias=False)(x)                # 96x3 MACs
    model = keras.Model(inputs, outputs)
    expected = 2 * (4 * 4 * 6 * 18) + (2 * (4 * 4 * 6 * 9) + 4 * 4 * 6) + 2 * 96 * 3
    assert flops.analytic_forward_flops(model) == expected == 3456 + 1824 + 576


def test_cpu_peak_is_measured_once_and_mfu_divides_by_it(cpu_devices):
    peak, source = flops.cpu_matmul_peak()
    assert peak > 1e8 and source.startswith("measured: tf.matmul")
    assert flops.cpu_matmul_peak() == (peak, source)  # cached per process
    u = flops.utilisation(_conv_dense_model(), (8, 8, 3), "float32", cpu_devices, images_per_sec=1000.0)
    assert u["flops_per_example"] == 3 * HAND_COUNT
    assert u["achieved_flops"] == pytest.approx(3 * HAND_COUNT * 1000.0)
    assert u["peak_flops"] == peak and "share these cores" in u["peak_flops_source"]
    assert u["mfu"] == pytest.approx(u["achieved_flops"] / peak)


def test_gpu_peak_comes_from_the_rated_table(monkeypatch):
    pytest.importorskip("tftoolkit.measure.hardware")
    from tftoolkit.engine.devices import DeviceSetup

    setup = DeviceSetup("GPU", ("/gpu:0", "/gpu:1"), (0, 1), 8)
    monkeypatch.setattr(flops, "gpu_names", lambda s: ["NVIDIA A100-SXM4-80GB"] * 2)
    peak, source = flops.peak_flops(setup, "mixed_bfloat16")
    assert peak == pytest.approx(2 * 312e12) and "bf16" in source and "x 2 GPU" in source
    monkeypatch.setattr(flops, "_gpu_precision", lambda p: "tf32")
    assert flops.peak_flops(setup, "float32")[0] == pytest.approx(2 * 156e12)
    monkeypatch.setattr(flops, "gpu_names", lambda s: ["Tesla V100-SXM2-16GB"])  # no TF32: the FP32 rate
    assert flops.peak_flops(setup, "float32")[0] == pytest.approx(15.7e12)
    monkeypatch.setattr(flops, "gpu_names", lambda s: ["Imaginary GPU 9000"])
    peak, source = flops.peak_flops(setup, "float32")
    assert math.isnan(peak) and "Imaginary GPU 9000" in source


@pytest.mark.parametrize("mask, tf_gpus", [(None, (0, 1)), ("4,5", (0, 1)), ("5,2,7", (1, 2))])
def test_gpu_names_come_from_tensorflow_s_own_list_under_any_mask(monkeypatch, mask, tf_gpus):
    # TensorFlow numbers the GPUs a CUDA_VISIBLE_DEVICES mask leaves from 0; NVML keeps the machine's numbers.
    # Indexing TensorFlow's list with NVML's 4 and 5 used to find nothing (MFU NaN) or another GPU.
    import tensorflow as tf

    from tftoolkit.engine import devices as devs

    names = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L40S"]
    phys = [f"GPU{i}" for i in range(len(mask.split(",")) if mask else 2)]
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: phys)
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda d: {"device_name": names[phys.index(d)]})
    if mask:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
    else:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devs, "_state", {})
    setup = devs._init_gpus(FakeTF(), phys, None, list(tf_gpus))
    assert setup.tf_gpus == tf_gpus
    assert flops.gpu_names(setup) == [names[i] for i in tf_gpus]
    nvml = [int(mask.split(",")[i]) for i in tf_gpus] if mask else list(tf_gpus)
    assert list(setup.gpu_indices) == nvml  # the monitor's numbers are NVML's
    peak, source = flops.peak_flops(setup, "mixed_bfloat16")
    assert peak == pytest.approx(sum(hw_peak(names[i]) for i in tf_gpus)) and "unavailable" not in source


def hw_peak(name):
    from tftoolkit.measure import hardware

    return hardware.peak_flops(name, "bf16")


class FakeTF:
    """tf.config as devices._init_gpus uses it, recording nothing."""

    class config:
        @staticmethod
        def set_visible_devices(devs, kind):
            pass

        class experimental:
            @staticmethod
            def set_memory_growth(dev, on):
                pass


def test_a_multi_worker_run_divides_by_every_worker_s_devices(monkeypatch):
    # images_per_sec counts every worker's images: the peak must count every worker's GPUs (not the chief's).
    from tftoolkit.engine.devices import DeviceSetup

    gpu = DeviceSetup("GPU", ("/gpu:0", "/gpu:1"), (0, 1), 8, (0, 1))
    monkeypatch.setattr(flops, "gpu_names", lambda s: ["NVIDIA A100-SXM4-80GB"] * 2)
    one, _ = flops.run_peak(gpu, "mixed_bfloat16")
    four, source = flops.run_peak(gpu, "mixed_bfloat16", workers=4)
    assert four == pytest.approx(4 * one) and "x 4 (4 workers, assumed alike)" in source
    monkeypatch.setattr(flops, "forward_flops", lambda model, shape: (1e9, "tf_profiler"))
    u1 = flops.utilisation(None, (32, 32, 3), "mixed_bfloat16", gpu, 1000.0)
    u4 = flops.utilisation(None, (32, 32, 3), "mixed_bfloat16", gpu, 1000.0, workers=4)
    assert u1["mfu"] == pytest.approx(4 * u4["mfu"])
    # CPU workers launched on one host share its cores: the host's peak once, per distinct host.
    cpu = DeviceSetup("CPU-simulated", ("/cpu:0",), None, 2)
    monkeypatch.setattr(flops, "cpu_matmul_peak", lambda dtype="float32": (1e11, "measured"))
    assert flops.run_peak(cpu, "float32", workers=2, hosts=1)[0] == pytest.approx(1e11)
    assert flops.run_peak(cpu, "float32", workers=2, hosts=2)[0] == pytest.approx(2e11)


# --- on a real engine and a real run --------------------------------------------------------------------------
SMALL = dict(dataset="synthetic", image_size=16, train_images=256, per_replica_batch=16, steps_per_loop=4,
             timing_warmup_steps=4, eval_every_epoch=False, **FAST)


def test_measuring_does_not_change_the_trained_weights(cpu_devices):
    from tftoolkit.engine import strategy
    from tftoolkit.data import catalog
    from tftoolkit.engine.session import resolve
    from tftoolkit.engine.step import build_engine

    cfg = resolve(RunConfig(replicas=2, steps=8, **SMALL))
    setup = devices.init(2)
    source = catalog.load_source(cfg)
    strat, _ = strategy.make_strategy(setup, "auto")
    engine = build_engine(cfg, strat, source, source.train_examples)
    before = [np.array(v.numpy()) for v in engine.model.variables + engine.optimizer.variables]
    parts = measure.time_step_parts(engine, cfg, source, source.train_examples, rounds=1)
    after = [np.array(v.numpy()) for v in engine.model.variables + engine.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert parts["full_s"] > 0 and parts["compute_s"] > 0


@pytest.mark.slow  # a training of ~5 s (test-fast's budget; make test runs it)
def test_training_summary_has_the_breakdown_fields(tmp_path):
    import tftoolkit

    s = tftoolkit.train(RunConfig(replicas=2, steps=12, **SMALL), tmp_path / "run", quiet=True)
    assert s["status"] == "ok" and "measure_error" not in s
    for key in measure.FIELDS:
        assert key in s, key
    assert s["compute_time_s"] > 0 and s["step_time_no_input_s"] > 0
    assert s["allreduce_time_s"] >= 0 and s["input_wait_s"] >= 0
    # The all-reduce timed alone: a time, or on a loaded machine 0 with the bound its noise sets (measure.allreduce)
    assert s["allreduce_direct_time_s"] > 0 or (s["allreduce_direct_time_s"] == 0
                                                and s["allreduce_direct_time_uncertainty_s"] > 0)
    for key in ("input_wait_fraction", "communication_fraction"):
        assert 0.0 <= s[key] <= 1.0, key
    assert s["communication_note"].startswith(("compute-bound", "communication-bound"))
    assert s["imbalance"] == 1.0 and s["examples_per_replica"] == [192, 192]
    assert s["gradient_bytes"] == 4 * s["params"]
    # small_cnn on 16x16x3: 3 x the forward count; achieved = that x images/sec; MFU against the host's matmul
    assert s["flops_source"] == "tf_profiler" and s["flops_per_example"] == 3 * s["forward_flops_per_example"]
    assert s["achieved_flops"] == pytest.approx(s["flops_per_example"] * s["images_per_sec"])
    assert s["peak_flops_source"].startswith("measured") and 0 < s["mfu"] < 2
