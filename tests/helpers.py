"""Helpers several test modules share (tests/ is on sys.path: pytest puts the rootdir conftest's folder there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The small, fast recipe behavioural tests train with (a test about counts, files or resuming does not need the
# default model, which is several times heavier): small_cnn, no warmup, a constant LR.
FAST = dict(model="small_cnn", warmup_epochs=0.0, schedule="constant")
FAST_ARGS = ["--model", "small_cnn", "--warmup-epochs", "0", "--schedule", "constant"]


class lazy:
    """A module imported at its first attribute, not when the test module is: ``tf = lazy("tensorflow")``; setting
    or deleting an attribute (monkeypatch) reaches the module. Test
    modules that name TensorFlow (or a toolkit module that imports it) at their top then collect without it; the
    session fixture in conftest.py imports it before the first test either way."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _module(self):
        import importlib

        return importlib.import_module(self._name)

    @property
    def __dict__(self):  # monkeypatch reads the value it restores from here
        return vars(self._module())

    def __getattr__(self, attr):
        if attr.startswith(("_", "pytest")) and self._name not in sys.modules:
            raise AttributeError(attr)  # pytest's collection probes every module global (_mock_name, pytestmark, ...)
        return getattr(self._module(), attr)

    def __setattr__(self, attr, value):  # monkeypatch.setattr(timer, "sync", ...) patches the module itself
        setattr(self._module(), attr, value)

    def __delattr__(self, attr):
        delattr(self._module(), attr)


def env_with_tests_on_path(**extra) -> dict:
    """os.environ for a subprocess that must import this folder's modules (``--model models_for_tests:...``)."""
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def assert_no_tensorflow(code: str, *args: str, timeout: float = 180) -> str:
    """Run ``code`` in a fresh interpreter and fail if it imported TensorFlow (or failed); returns its stdout."""
    probe = textwrap.dedent(code) + textwrap.dedent("""
        import sys as _sys
        _loaded = sorted(m for m in _sys.modules if m == "tensorflow" or m.startswith(("tensorflow.", "keras")))
        assert not _loaded, f"TensorFlow imported: {_loaded[:5]}"
    """)
    done = subprocess.run([sys.executable, "-c", probe, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def config_option(config, folder) -> list[str]:
    """``--config FILE`` for a ``train`` command line: ``config`` written into ``folder`` as a run directory's
    config.json (what tftoolkit.train hands the workers it launches)."""
    from tftoolkit import fileio, rundir

    path = Path(folder) / "given_config.json"
    fileio.write_json(path, rundir.config_record(config.to_dict()))
    return ["--config", str(path)]


def assert_part_as_stated(summary: dict, part: str) -> None:
    """A breakdown part in summary.json holds to its status (tftoolkit.measure.parts.Part): measured is above
    NOISE_SIGMAS of its errors, within noise is under them and not FAIL_SIGMAS below 0 (its sign not known: a little
    below 0 is allowed), failed has no number (null). ``part`` is the field's stem: "allreduce_time", "input_wait",
    "compute_time"."""
    from tftoolkit.measure.parts import FAIL_SIGMAS, FAILED, MEASURED, WITHIN_NOISE
    from tftoolkit.measure.stats import NOISE_SIGMAS

    status, value, se = summary[part + "_status"], summary[part + "_s"], summary[part + "_uncertainty_s"]
    if status == FAILED:
        assert value is None or value != value, (part, summary)
    elif status == WITHIN_NOISE:
        assert -FAIL_SIGMAS * se <= value < NOISE_SIGMAS * se, (part, value, se)
    else:
        assert status == MEASURED and value > 0 and value >= NOISE_SIGMAS * se, (part, status, value, se)


def checkpoint_variables(run_dir: Path, checkpoint: str | None = None) -> dict:
    """Every variable of a run's newest checkpoint (or of ``checkpoint``, a path prefix), by name."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(checkpoint or Path(run_dir) / "checkpoints"))
    # Keras 3 stores each weight once, under the optimizer's _trainable_variables (the model's path points to
    # the same objects); optimizer slots, the step and the example counters come too.
    skip = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map() if n not in skip}


def checkpointed_step(run_dir: Path) -> int:
    """The step of a run's newest whole checkpoint (0 when it has none): the newest with its index file, which is
    what a rerun restores (engine/checkpoint.py). Not tf.train.latest_checkpoint: the ``checkpoint`` state file it
    reads is rewritten after the checkpoint is whole, so a SIGKILL between the two leaves it one save behind (a
    rerun then rightly resumed from step 20 where that file still said 18)."""
    from tftoolkit.engine.checkpoint import steps_on_disk

    steps = steps_on_disk(Path(run_dir) / "checkpoints")
    return steps[0] if steps else 0


def load_dataset(dataset, **config):
    """``registry.load`` of a dataset (a path or a name) with ``config``'s other RunConfig fields."""
    from tftoolkit import RunConfig
    from tftoolkit.data import registry

    return registry.load(RunConfig(dataset=str(dataset), **config))


def examples(ds):
    """A source's split (unbatched (image, label, id)) as three NumPy arrays, in the dataset's order."""
    import numpy as np

    xs, ys, ids = [], [], []
    for x, y, i in ds.batch(1000).as_numpy_iterator():
        xs.append(x), ys.append(y), ids.append(i)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ids)


# --- a localhost tf.data service (tftoolkit data-service start), each server its own process -----------------
class ServiceProcess:
    """One ``tftoolkit data-service start ARGS`` process; threads keep reading its output (a full pipe would
    block it), and ``lines`` holds its stdout. Stopped by pid: ``stop()`` (SIGTERM, then SIGKILL) or ``kill()``."""

    def __init__(self, *args: str):
        import threading

        self.args = args
        self.lines: list[str] = []
        self.err: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "tftoolkit", "data-service", "start", *args], cwd=ROOT,
                                     env=env_with_tests_on_path(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        for stream, into in ((self.proc.stdout, self.lines), (self.proc.stderr, self.err)):
            threading.Thread(target=lambda s=stream, i=into: i.extend(line.rstrip("\n") for line in s),
                             daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_serving(self, timeout: float = 90) -> "ServiceProcess":
        """Wait for the "serving" line (every server is up); fail with the process's last words if it ends or
        takes longer than ``timeout`` seconds."""
        import time

        deadline = time.monotonic() + timeout
        while not any(line.startswith("serving") for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"data-service start {' '.join(self.args)} did not start (exit code "
                                     f"{self.proc.returncode}): " + "\n".join((self.lines + self.err)[-15:]))
            time.sleep(0.1)
        return self

    def address(self) -> str:
        """The dispatcher's address as printed (``grpc://host:port``): the one trainers pass to --data-service."""
        import re

        for line in self.lines:
            m = re.match(r"tf\.data service dispatcher at (\S+)$", line)
            if m:
                return m.group(1)
        raise AssertionError("no dispatcher address among: " + "\n".join(self.lines))

    def stop(self, timeout: float = 10) -> int:
        """SIGTERM by pid and the exit code; SIGKILL when it has not ended within ``timeout`` seconds."""
        import signal

        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def data_service(workers: int = 2, timeout: float = 90):
    """A localhost tf.data service for a test: a dispatcher process (no workers of its own) and ``workers`` worker
    processes that join it, each its own process so that a test can kill one by pid (``service.workers[0].kill()``).

        with data_service(2) as service:   # service.address: grpc://localhost:PORT, for --data-service
            ...

    Everything is stopped by pid at the end, killed if it does not stop. Start-up is a TensorFlow import per
    process: ~10 s on 2 cores.
    """
    import contextlib
    import types

    @contextlib.contextmanager
    def running():
        started: list[ServiceProcess] = []
        try:
            started.append(ServiceProcess("--port", "0", "--service-workers", "0", "--host", "localhost"))
            address = started[0].wait_serving(timeout).address()
            joining = [ServiceProcess("--dispatcher", address, "--host", "localhost") for _ in range(workers)]
            started += joining
            for w in joining:
                w.wait_serving(timeout)
            yield types.SimpleNamespace(address=address, dispatcher=started[0], workers=joining)
        finally:
            for p in reversed(started):  # workers first: each then stops without retrying a gone dispatcher
                try:
                    p.stop()
                except subprocess.TimeoutExpired:
                    pass

    return running()


# The stateful ops tf.data's make_deterministic rewrite lets a pipeline run asynchronously around (TensorFlow 2.21,
# tensorflow/core/grappler/optimizers/data/make_deterministic.cc: kDeterministicStatefulOps and
# kDeterministicStatefulOpsWhenAsync); a version suffix (V2) is dropped before the lookup, as there.
DETERMINISTIC_STATEFUL = {"TextLineDataset", "FixedLengthRecordDataset", "TFRecordDataset", "TensorSliceDataset",
                          "RangeDataset", "SSTableDataset", "RecordIODataset", "Print", "Assert", "RandomUniform",
                          "RandomUniformInt", "RandomStandardNormal", "ParameterizedTruncatedNormal", "TruncatedNormal",
                          "RandomShuffle", "Multinomial", "RandomGamma", "RandomGammaGrad", "RandomPoisson",
                          "RandomCrop", "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2"}


def ops_that_serialise_the_pipeline(ds) -> set[str]:
    """The stateful ops inside ``ds``'s dataset functions that, under op determinism (on by default on CPU
    replicas), make tf.data's make_deterministic rewrite run every parallel map of the pipeline serially and every
    prefetch at 0. Empty for a pipeline that keeps its parallelism."""
    import re

    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.framework import op_def_registry

    calls = {"StatefulPartitionedCall", "PartitionedCall", "If", "StatelessIf", "While", "StatelessWhile"}
    graph = graph_pb2.GraphDef.FromString(ds._as_serialized_graph().numpy())
    found = set()
    for fn in graph.library.function:
        for node in fn.node_def:
            op = op_def_registry.get(node.op)
            if op is not None and op.is_stateful and node.op not in calls \
                    and re.sub(r"V\d+$", "", node.op) not in DETERMINISTIC_STATEFUL:
                found.add(node.op)
    return found


def event_accumulator(path):
    """TensorBoard's reader of the event files under ``path``, loaded (tests of what a run or a recorded fit wrote)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def event_series(acc, tag):
    """[(step, value)] of scalar ``tag`` as written by tf.summary.scalar (a tensor event)."""
    import numpy as np
    from tensorboard.util import tensor_util

    return [(e.step, float(np.asarray(tensor_util.make_ndarray(e.tensor_proto)))) for e in acc.Tensors(tag)]


def strict_json(text: str):
    """``text`` parsed as strict JSON (RFC 8259, what JavaScript's JSON.parse accepts): NaN and Infinity refused."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def executed_notebook(name: str, basetemp: Path) -> tuple[Path, Path]:
    """Notebook NAME run once per ``pytest`` session in smoke mode, as ``make docs`` runs it (its first cell's
    papermill command; docs/hooks/execute_notebooks.py): (the executed copy, its out_dir). tests/docs/test_site.py
    and tests/experiments/test_notebooks.py both read 00_environment's run, from whichever pytest worker ran it
    first; the others wait on a lock for it (xdist's recipe for a session fixture run once). A failed run is
    reported to each caller. ``basetemp``: the session's ``tmp_path_factory.getbasetemp()``."""
    import fcntl

    if str(ROOT / "docs" / "hooks") not in sys.path:
        sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import execute_notebooks  # docs/hooks is not a package: the script make docs runs

    # Each xdist worker has a basetemp of its own (popen-gw0, ...) in the session's folder
    shared = (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / "executed-notebooks"
    shared.mkdir(exist_ok=True)
    executed, failed = shared / "notebooks" / f"{name}.ipynb", shared / f"{name}.failed"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not executed.exists() and not failed.exists():
            try:
                done = execute_notebooks.execute(ROOT / "notebooks" / f"{name}.ipynb", shared, timeout=600)
            except subprocess.TimeoutExpired:
                failed.write_text("papermill had not finished after 600 s")
            else:
                if done.returncode:
                    failed.write_text(done.stderr[-3000:] or f"papermill exited {done.returncode}")
    assert not failed.exists(), f"{name} in smoke mode:\n{failed.read_text()}"
    return executed, shared / "runs" / name
