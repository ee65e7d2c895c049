"""Data placement: host and device placement train the same examples, the choice follows its rule, bad input exits 2."""

import numpy as np
import pytest

import tftoolkit
from tftoolkit.config import RunConfig
from tftoolkit.data import pipeline, source as source_mod
from tftoolkit.engine import devices, feed
from tftoolkit.errors import ConfigError

from helpers import FAST

CPU = devices.DeviceSetup("CPU-simulated", ("/cpu:0", "/cpu:1"), None, 2)
GPU = devices.DeviceSetup("GPU", ("/gpu:0", "/gpu:1"), (0, 1), 16)
MB = 10**6


def test_auto_keeps_the_data_on_the_host_on_cpu_and_on_gpus_that_nvml_cannot_size():
    assert feed.choose("auto", CPU, 49 * MB)[0] == "host"
    placement, why = feed.choose("auto", GPU, 49 * MB, gpu_memory=None)
    assert placement == "host" and "NVML" in why


def test_auto_puts_a_split_that_fits_a_quarter_of_each_gpu_on_the_devices():
    placement, why = feed.choose("auto", GPU, 49 * MB, gpu_memory=80 * 10**9)
    assert placement == "device" and "49.0 MB" in why and "80.00 GB" in why
    placement, why = feed.choose("auto", GPU, 30 * 10**9, gpu_memory=80 * 10**9)
    assert placement == "host" and "exceeds 25%" in why


def test_device_placement_that_does_not_fit_is_refused_with_the_sizes():
    with pytest.raises(ConfigError, match=r"takes 90.00 GB but each GPU has 80.00 GB.*--data-placement host"):
        feed.choose("device", GPU, 90 * 10**9, gpu_memory=80 * 10**9)
    # Simulated replicas hold one copy each in host RAM.
    with pytest.raises(ConfigError, match=r"2 copies of the training split take 200.0 MB but the host has 150.0 MB"):
        feed.choose("device", CPU, 100 * MB, host_available=150 * MB)
    assert feed.choose("device", CPU, 100 * MB, host_available=10**12)[0] == "device"


def test_an_unknown_placement_names_the_choices():
    with pytest.raises(ConfigError, match="data_placement: unknown value 'gpu'; choose one of host, device, auto"):
        RunConfig(data_placement="gpu")


def _train(tmp_path, name, replicas, placement, augment=True, steps=8, **kw):
    x, y = source_mod.synthetic_arrays(200, 12, 4, seed=5)
    vx, vy = source_mod.synthetic_arrays(40, 12, 4, seed=6)
    params = dict(FAST, optimizer="momentum", base_lr=0.05, lr_rule="none", measure=False, seed=3, steps_per_loop=3)
    cfg = RunConfig(replicas=replicas, per_replica_batch=16 // replicas, steps=steps, augment=augment,
                    data_placement=placement, **{**params, **kw})
    s = tftoolkit.train(cfg, tmp_path / name, quiet=True, data=(x, y, vx, vy))
    import pandas as pd

    return s, pd.read_csv(tmp_path / name / "steps.csv")["loss"].to_numpy()


@pytest.mark.slow  # a training of ~5 s (test-fast's budget; make test runs it)
@pytest.mark.parametrize("replicas", [1, 2])
def test_device_placement_trains_exactly_what_host_placement_trains(tmp_path, replicas):
    # 8 steps of 16 over 200 examples: the run crosses an epoch (a new order) with augmentation on.
    host, host_losses = _train(tmp_path, "host", replicas, "host")
    dev, dev_losses = _train(tmp_path, "device", replicas, "device")
    assert host["data_placement"] == "host" and dev["data_placement"] == "device"
    np.testing.assert_array_equal(host_losses, dev_losses)
    assert host["examples_per_replica"] == dev["examples_per_replica"]
    assert host["val_loss"] == dev["val_loss"]
    # The comparison can fail: the same run without augmentation trains on other pixels and ends elsewhere.
    _, plain_losses = _train(tmp_path, "plain", replicas, "device", augment=False)
    assert not np.array_equal(plain_losses, dev_losses)


def test_device_placement_on_two_replicas_equals_one_device(tmp_path):
    _, one = _train(tmp_path, "one", 1, "device", optimizer="sgd")
    _, two = _train(tmp_path, "two", 2, "device", optimizer="sgd")
    np.testing.assert_allclose(one, two, rtol=1e-5)


def test_the_cli_refuses_device_placement_that_does_not_fit_in_one_line(tmp_path, monkeypatch, capsys):
    # A refusal at set-up, before a step: the command's own exit code and stderr, in this process (the console
    # script's exit and stderr as a shell sees them: tests/cli/test_cli.py).
    from tftoolkit.cli import main

    monkeypatch.setattr(feed, "host_available_bytes", lambda: 1000)
    code = main(["train", "--replicas", "2", "--dataset", "synthetic", "--train-images", "512", "--steps", "1",
                 "--data-placement", "device", "--out", str(tmp_path / "r"), "--quiet"])
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tftoolkit train: error")]
    assert len(err) == 1 and "2 copies of the training split take" in err[0] and "host has 0.0 MB free" in err[0]
    assert not (tmp_path / "r" / "summary.json").exists()  # nothing trained


def test_augmentation_is_a_keyed_flip_and_crop_the_same_for_the_same_key():
    import tensorflow as tf

    images = tf.constant(np.arange(2 * 6 * 6 * 1, dtype=np.uint8).reshape(2, 6, 6, 1))
    keys = pipeline.augment_keys(tf.constant([0, 1], tf.int64), 0, seed=1)
    a = pipeline.augment(images, keys, pad=2).numpy()
    assert a.shape == (2, 6, 6, 1) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, pipeline.augment(images, keys, pad=2).numpy())
    # Each output is a window of the reflect-padded image, flipped or not, as the key's bits say.
    for i in range(2):
        k = int(keys[i])
        dy, dx, flip = (k >> 8) % 5, (k >> 24) % 5, k & 1
        padded = np.pad(images[i].numpy(), [(2, 2), (2, 2), (0, 0)], mode="reflect")
        window = padded[dy:dy + 6, dx:dx + 6]
        np.testing.assert_array_equal(a[i], window[:, ::-1] if flip else window)
    # Another epoch draws again.
    other = pipeline.augment_keys(tf.constant([0, 1], tf.int64), 1, seed=1)
    assert not np.array_equal(keys.numpy(), other.numpy())


# --- on a GPU, the device path stays in device memory (TensorFlow's kernel registry) ---------------------------------
@pytest.mark.parametrize("shape, dtype", [((32, 32, 3), "uint8"), ((5, 5, 3), "uint8"), ((8, 8, 1), "float32")])
def test_every_op_of_the_device_path_keeps_its_data_in_gpu_memory(shape, dtype):
    # Read from the registry the GPU build of TensorFlow installs (GPU kernels are registered without a GPU): an op
    # with no GPU kernel for its dtypes (GatherV2 and MirrorPad on uint8) would run on the CPU, and a kernel that
    # keeps an argument in host memory (any int32: Identity, Reshape, AddV2) would copy the data through the host.
    from tftoolkit.engine import kernels

    graph = feed.device_path_graph(shape, augment=True, dtype=dtype)
    ops = {op.type for op in graph.get_operations()}
    assert {"Identity", "GatherV2", "MirrorPad"} <= ops  # placement, gather, augmentation are all in the graph
    if dtype == "uint8":
        assert "Bitcast" in ops
    assert kernels.gpu_problems(graph) == []


def test_the_registry_check_sees_host_memory_and_missing_gpu_kernels():
    # What the previous device path did: int32 words "placed" with tf.identity (host memory on a GPU), the
    # augmentation's MirrorPad on uint8 (no GPU kernel), int32 index arithmetic.
    import tensorflow as tf

    from tftoolkit.engine import kernels

    @tf.function(autograph=False)
    def old_path(words, labels, indices):
        rows = tf.gather(tf.identity(words), indices)
        images = tf.reshape(tf.bitcast(rows, tf.uint8), [-1, 4, 4, 4])
        padded = tf.pad(images, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="REFLECT")
        return padded, tf.gather(tf.identity(labels), indices + 1)

    graph = old_path.get_concrete_function(tf.TensorSpec([None, 16], tf.int32), tf.TensorSpec([None], tf.int32),
                                           tf.TensorSpec([None], tf.int32)).graph
    problems = "\n".join(kernels.gpu_problems(graph))
    assert "Identity" in problems and "kept in host memory" in problems
    assert "MirrorPad" in problems and "no GPU kernel for T=uint8" in problems
    assert "AddV2 (add): input 'x' (int32) is kept in host memory" in problems
    assert "Reshape" not in problems and "GatherV2" not in problems  # uint8 reshape, int32 gather: on the device


@pytest.mark.parametrize("shape", [(4, 4, 3), (5, 5, 3), (3, 7, 1)])
def test_images_pack_into_int64_words_and_back_exactly(shape):
    images = np.random.default_rng(0).integers(0, 256, size=(6, *shape), dtype=np.uint8)
    words = feed.pack_words(images)
    assert words.dtype == np.int64 and words.shape == (6, -(-int(np.prod(shape)) // 8))
    np.testing.assert_array_equal(feed.unpack_words(words, shape).numpy(), images)
    _, labels, packed = feed.resident_arrays(images, np.arange(6, dtype=np.int32))
    assert packed and labels.dtype == np.int64


@pytest.mark.slow  # two trainings
def test_host_placement_prefetches_to_gpus_and_trains_the_same(tmp_path, monkeypatch):
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    opts = pipeline.input_options(strategy)
    assert opts.experimental_fetch_to_device is False  # CPU replicas: the host is the device
    # On GPUs the next batches are copied to each GPU ahead of the step (a MultiDeviceIterator per replica).
    # Forced here on CPU replicas: the same examples reach the same replicas, so the run is unchanged.
    monkeypatch.setattr(pipeline, "on_gpus", lambda strategy: True)
    opts = pipeline.input_options(strategy)
    assert opts.experimental_fetch_to_device is True and opts.experimental_per_replica_buffer_size == pipeline.PREFETCH
    fetched, fetched_losses = _train(tmp_path, "fetched", 2, "host")
    monkeypatch.undo()
    plain, plain_losses = _train(tmp_path, "plain", 2, "host")
    np.testing.assert_array_equal(fetched_losses, plain_losses)
    assert fetched["val_loss"] == plain["val_loss"]
