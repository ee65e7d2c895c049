"""The validation table's FLOPs are the toolkit's own count of the Keras model; keras.applications names are the whole
networks the published rows trained; counting prints none of TensorFlow's native start-up lines."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tftoolkit.engine import models
from tftoolkit.planner import modelsize, validation


@pytest.mark.slow
def test_resnet50_count_matches_the_validation_table():
    params, forward, how = modelsize.count("resnet50", 224)
    assert params == validation.PARAMS["resnet50"]
    assert forward / 1e9 == pytest.approx(validation.FORWARD_GFLOPS["resnet50"], rel=1e-3)


@pytest.mark.slow  # builds VGG16 twice: 9.4 s of CPU, the costliest test of test-fast (BENCHMARKS.md)
def test_a_keras_applications_name_is_the_whole_network_and_name_headless_is_without_its_head():
    # At 32 px VGG16's head is smaller than at 224 (its first dense layer reads 1x1x512, not 7x7x512), but there.
    whole, _, _ = modelsize.count("vgg16", 32)
    headless, _, _ = modelsize.count("vgg16_headless", 32)
    conv = 14_714_688  # VGG16's convolutions
    assert headless == conv + 512 * 1000 + 1000
    assert whole == conv + (512 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 1000 + 1000)
    assert "with its classifier head" in models.describe("vgg16") and "vgg16_headless" in models.describe("vgg16")
    assert "without its classifier head" in models.describe("vgg16_headless")


@pytest.mark.slow
def test_vgg16_counts_the_138m_parameters_the_published_rows_trained():
    params, forward, _ = modelsize.count("vgg16", 224)
    assert params == validation.PARAMS["vgg16"] == 138_357_544
    assert forward / 1e9 == pytest.approx(validation.FORWARD_GFLOPS["vgg16"], rel=1e-3)


@pytest.mark.slow  # a fresh interpreter that imports TensorFlow: 5.1 s of CPU
def test_counting_prints_none_of_tensorflows_start_up_lines(tmp_path):
    # A fresh process, as a user's: TensorFlow loads inside the count. Its C++ logging writes to file descriptor 2
    # directly ("failed call to cuInit", "Could not find cuda drivers", oneDNN), which capsys would not see.
    code = ("import gc\n"
            "from tftoolkit.planner import modelsize\n"
            "print(modelsize.count('small_vgg', 32)[0])\n"
            "print('frozen', gc.get_freeze_count())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TFTOOLKIT_DEBUG", "TF_CPP_MIN_LOG_LEVEL")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    counted, frozen = done.stdout.split()[-3], done.stdout.split()[-1]
    assert int(counted) > 0
    # ... and TensorFlow's import, loaded by the count, kept out of the collector (engine/devices.frozen_import)
    assert int(frozen) > 300_000, done.stdout
    for noise in ("cuInit", "cuda", "CUDA", "oneDNN", "absl", "I0000", "E0000", "W0000", "np.object"):
        assert noise not in done.stderr, done.stderr
