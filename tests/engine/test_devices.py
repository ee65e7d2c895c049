"""Device selection: simulated CPU replicas here, and the GPU paths against a stand-in for tf.config."""

import os
import re
import subprocess
import sys
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


def test_more_simulated_replicas_than_the_cap_are_refused_before_any_device_is_made():
    n = devices.MAX_CPU_REPLICAS + 1
    with pytest.raises(DeviceError, match=rf"{n} simulated replicas.*at most {devices.MAX_CPU_REPLICAS}.*--replicas "
                                          rf"{devices.MAX_CPU_REPLICAS} or fewer"):
        devices.init(n)
    with pytest.raises(DeviceError, match=r"at most"):
        devices.init(100_000)


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


def test_gpus_named_out_of_order_follow_tensorflow_s_order(fresh_state, caplog):
    # TensorFlow numbers the GPUs it makes visible in physical order: with --gpus 2,0 its /gpu:0 is GPU 0. Labels
    # taken from the order given would call replica 0 "GPU 2".
    tf = FakeTF()
    with caplog.at_level("INFO", logger="tftoolkit"):
        setup = devices._init_gpus(tf, ["G0", "G1", "G2"], None, [2, 0])
    assert tf.visible == ["G0", "G2"] and setup.devices == ("/gpu:0", "/gpu:1")
    assert setup.gpu_indices == (0, 2) and setup.tf_gpus == (0, 2)
    assert "take the GPUs in TensorFlow's order, 0,2" in caplog.text


def test_tensorflow_initialised_first_is_warned_about(fresh_state, caplog):
    with caplog.at_level("WARNING", logger="tftoolkit"):
        devices._init_gpus(FakeTF(initialised=True), ["G0", "G1"], None, [1])
    assert "all 2 GPU(s) stay visible" in caplog.text and "no memory growth" in caplog.text


def test_a_gpu_outside_the_mask_is_named_with_the_mask(fresh_state, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(DeviceError, match=r"--gpus 4: GPU\(s\) \[4\] are not visible: CUDA_VISIBLE_DEVICES=4,5 leaves "
                                          r"2 GPU\(s\), numbered inside this process as 0 \(the machine's 4\), 1"):
        devices._init_gpus(FakeTF(), ["G0", "G1"], None, [4])


def test_cuda_numbers_gpus_by_pci_bus_in_this_process_too(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    devices.init(1)
    import os

    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")  # a user's own choice is kept
    devices.init(1)
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_the_run_s_memory_is_tensorflow_s_peak_per_gpu(monkeypatch):
    import tensorflow as tf

    asked = []
    monkeypatch.setattr(tf.config.experimental, "get_memory_info",
                        lambda d: asked.append(d) or {"current": 1, "peak": 1000 * (len(asked))})
    gpu = devices.DeviceSetup("GPU", ("/gpu:0", "/gpu:1"), (4, 5), 8, (0, 1))
    assert devices.memory_peaks(gpu) == [1000, 2000] and asked == ["GPU:0", "GPU:1"]
    assert devices.memory_peaks(devices.DeviceSetup("CPU-simulated", ("/cpu:0",), None, 2)) is None


def _fresh_python(code: str):
    """Run ``code`` in a new interpreter: TensorFlow fixes its devices and its logger once per process."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # two fresh processes (~4 s each)
def test_init_devices_2_gives_a_plain_mirrored_strategy_2_replicas_and_a_notebook_no_info_lines():
    done = _fresh_python(
        "import sys; sys.ps1 = '>>> '  # what an IPython kernel has: TensorFlow then logs INFO to stdout\n"
        "import tftoolkit; tftoolkit.init_devices(2)\n"
        "import tensorflow as tf\n"
        "s = tf.distribute.MirroredStrategy()\n"
        "print('replicas', s.num_replicas_in_sync)\n"
        "print('sum', s.reduce('SUM', s.run(lambda: tf.constant(1.0)), axis=None).numpy())\n"
        "import gc; print('frozen', gc.get_freeze_count(), 'collecting', gc.isenabled())\n"
        "from tftoolkit.engine import devices\n"
        "devices.init(3)\n")
    assert "replicas 2" in done.stdout and "sum 2.0" in done.stdout, done.stderr[-2000:]
    assert "INFO:tensorflow" not in done.stdout + done.stderr  # TensorFlow's interactive default is quieted
    assert "init_devices(3)" in done.stderr  # a count beyond the set-up says what to do, in the same process
    # RunRecorder first here: it imports TensorFlow (without starting its runtime), init_devices then sets it up
    spare = _fresh_python("import gc, tftoolkit; tftoolkit.RunRecorder; "
                          "print('frozen', gc.get_freeze_count(), 'collecting', gc.isenabled()); "
                          "print('n', len(tftoolkit.init_devices(2, cpu_devices=4).devices)); "
                          "import tensorflow as tf; print('logical', len(tf.config.list_logical_devices('CPU')))")
    assert "n 2" in spare.stdout and "logical 4" in spare.stdout, spare.stderr[-2000:]
    # Either first door to TensorFlow keeps its import out of the collector (devices.frozen_import): ~580,000
    # objects here; a bare interpreter with the toolkit imported holds ~60,000 in all
    for proc in (done, spare):
        frozen = int(re.search(r"frozen (\d+) collecting True", proc.stdout).group(1))
        assert frozen > 300_000, proc.stdout


def test_an_import_runs_with_the_collector_off_and_what_it_made_stays_out_of_later_collections():
    import gc

    before = gc.get_freeze_count()
    with devices.frozen_import():
        assert not gc.isenabled()
        made = [[] for _ in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() >= before + len(made)
    gc.disable()  # a collector someone turned off stays off
    try:
        with devices.frozen_import():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    # Dead cycles already on the heap (a notebook's earlier cells) are freed first, not frozen for the process's life
    import weakref

    class Node:
        pass

    dead = Node()
    dead.me, gone = dead, weakref.ref(dead)
    del dead
    with devices.frozen_import():
        pass
    assert gone() is None
    frozen = gc.get_freeze_count()
    with pytest.raises(ImportError):  # and a failed import leaves it on, and freezes nothing (not its traceback)
        with devices.frozen_import():
            raise ImportError("no such module")
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_tensorflow_s_interactive_info_default_is_quieted_and_other_levels_are_kept():
    import logging

    for interactive, level, want in [(True, logging.INFO, logging.WARNING), (False, logging.INFO, logging.INFO),
                                     (True, logging.DEBUG, logging.DEBUG), (True, logging.ERROR, logging.ERROR)]:
        logger = logging.Logger("stand-in", level)
        devices.quiet_tensorflow_info(logger, interactive)
        assert logger.level == want, (interactive, level)


@pytest.mark.parametrize("line, noise", [
    ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n", True),
    ("I0000 00:00:1796405209.322451   12612 port.cc:153] oneDNN custom operations are on. You may see\n", True),
    ("I0000 00:00:1796405209.323106   12612 cudart_stub.cc:31] Could not find cuda drivers on your machine\n", True),
    ("E0000 00:00:1796405209.947178   12612 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
     "Failed call to cuInit: UNKNOWN ERROR (303)\n", True),
    ("2026-12-04 17:24:15.227230: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:10575] Unable to "
     "register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered\n",
     True),  # TensorFlow 2.16's
    ("E0000 00:00:1796405209.947178   12612 gpu_device.cc:2] out of memory allocating 4 GiB\n", False),
    ("tftoolkit: 2 replicas simulated as CPU devices\n", False),
    ("Traceback (most recent call last):\n", False),
])
def test_tensorflow_start_up_lines_are_told_from_the_rest(line, noise):
    assert devices.startup_noise(line) is noise


@pytest.mark.slow  # a fresh interpreter that imports TensorFlow (~5-10 s)
def test_setting_up_devices_prints_none_of_tensorflow_s_start_up_lines():
    # Failed before the fix: 4-7 lines on stderr (absl writes them before TF_CPP_MIN_LOG_LEVEL is read), in every
    # notebook's first cell and before every command's first line.
    done = subprocess.run([sys.executable, "-c", "import sys, tftoolkit; tftoolkit.init_devices(2); "
                           "print('said after', file=sys.stderr)"], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == "said after\n", done.stderr
