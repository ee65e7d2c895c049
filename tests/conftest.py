"""Test set-up shared by every module.

TensorFlow fixes its device list when it first initialises, once per process, so the simulated replicas
every test may use are created here, before any test touches TensorFlow.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")
# The planner's validation results (tftoolkit/planner/kept.py) are kept in a folder of the suite's, shared by its
# workers and the processes they start, never in the user's ~/.cache.
os.environ.setdefault("TFTOOLKIT_CACHE", os.path.join(__import__("tempfile").gettempdir(),
                                                      f"tftoolkit-tests-cache-{os.getuid()}"))

import pytest  # noqa: E402

from tftoolkit.experiments.startup import skip_slow_format_checkers  # noqa: E402

# Each pytest worker imports nbformat (papermill, the notebook tests); without this, jsonschema's optional
# rfc3987-syntax compiles its parsers there, ~6 s of one worker's collection with TensorFlow's objects alive (10 s
# with it, 17 s without; tftoolkit/experiments/startup.py says why nothing uses them). The processes the tests
# start are the toolkit's own entry points, which do the same; tests/experiments/test_startup.py checks it in a
# fresh interpreter, where this line does not reach.
skip_slow_format_checkers()

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


@pytest.fixture(autouse=True)
def _toolkit_log_reaches_caplog():
    # tftoolkit.logs.ensure_logging stops the logger's records at its own stderr handler (no double lines in a
    # notebook); in tests they also go on to the root logger, where caplog listens.
    import logging

    from tftoolkit.logs import ensure_logging

    ensure_logging()  # the handler exists from here on, so a later call does not turn propagation off
    logging.getLogger("tftoolkit").propagate = True
    yield


@pytest.fixture
def chromium(tmp_path):
    """A headless Chromium (tests/browser.py) for one test, stopped by its pid; skipped, with the reason, where
    Chromium is not installed (.ci/run installs it)."""
    from browser import Chromium, find

    if find() is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium; .ci/run installs it)")
    with Chromium(tmp_path) as browser:
        yield browser


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real one-node Slurm on localhost (tests/slurm.py), started once for the tests that ask for it and
    stopped by the pids it started; skipped, with the reason, where Slurm is not installed or this is not root
    (.ci/run installs slurm-wlm and munge)."""
    import shutil
    import tempfile
    from pathlib import Path

    import slurm

    why = slurm.unavailable()
    if why:
        pytest.skip(why)
    work = Path(tempfile.mkdtemp(prefix="tfslurm-", dir="/tmp"))  # short: munge's socket path has a length limit
    try:
        with slurm.Slurm(work) as cluster:
            yield cluster
    finally:
        shutil.rmtree(work, ignore_errors=True)


# The files that take longest go first: `make test` runs `-n 3 --dist loadfile --no-loadscope-reorder`, which
# hands whole files to the workers in collection order, so a long file collected last would leave one worker alone
# at the end. Every file of more than ~40 s of test durations, longest first, from one `make test --durations=0`
# (2026-12-04, a shared host; docs/benchmarks/suite-time.md): the order, not the figures, matters. Files not listed
# keep their order after these.
LONGEST_FIRST = (
    "tests/engine/test_equivalence.py",
    "tests/experiments/test_notebooks.py",
    "tests/docs/test_commands.py",  # one test of ~120 s on a quiet machine (every documented command, 2026-12-05);
    # unlisted, it went out after every listed file
    "tests/cluster/test_multiworker.py",
    "tests/data/test_service.py",
    "tests/cluster/test_slurm.py",
    "tests/training/test_resume.py",
    "tests/cluster/test_dataservice.py",
    "tests/data/test_imagenet.py",
    "tests/training/test_train.py",
    "tests/data/test_streaming.py",
    "tests/training/test_tasks.py",
    "tests/cli/test_cli.py",
    "tests/cluster/test_input_sharding.py",
    "tests/training/test_tensorboard.py",
    "tests/training/test_formats_train.py",
    "tests/training/test_recorder.py",
    "tests/experiments/test_sweep.py",
    "tests/experiments/test_jupyterlab.py",
    "tests/docs/test_site.py",
    "tests/engine/test_feed.py",
    "tests/experiments/test_batch_science_notebook.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item):
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: within a file, and among the rest, the collection order stays
