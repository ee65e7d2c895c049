"""Test set-up shared by every module.

TensorFlow fixes its device list when it first initialises, once per process, so the simulated replicas
every test may use are created here, before any test touches TensorFlow.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402

MAX_TEST_REPLICAS = 4


@pytest.fixture(scope="session")
def cpu_devices():
    from tftoolkit.engine import devices

    return devices.init(MAX_TEST_REPLICAS)


@pytest.fixture(scope="session", autouse=True)
def _init_devices_first():
    # Importing TF is cheap enough; initialising devices up front makes test order irrelevant.
    from tftoolkit.engine import devices

    devices.init(MAX_TEST_REPLICAS)
