"""The tf.data service, client side: a run's training input pipeline sent to the workers of a dispatcher.

``tftoolkit data-service start`` (cluster/dataservice.py) runs a dispatcher and workers, on this host or on CPU
hosts beside it; ``--data-service HOST:PORT`` sends the training pipeline there. The dataset this process would
have read (data/pipeline.py in memory, data/stream.py streamed) is serialised, graph and captured tensors, and run
by the service's workers: for a streamed split they read the same files, so every worker must see them at the
same paths (a shared file system), as Model Garden's readers assume. Validation stays local: it is read in order,
once per epoch, and is small beside training.

What one service element is: one optimizer step of this input pipeline, its replicas' per-replica batches stacked
(``batch(local)``; with --accumulate K, all K micro-batches of them: ``batch(local x K)``), unstacked again here. A
step is therefore made whole by one worker, from one epoch, and replica r still gets slice r of every global batch,
as without the service.

Processing mode: ``distributed_epoch`` (ShardingPolicy.DYNAMIC). The dispatcher hands out the pipeline's first
source, the range of epochs (both pipelines are ``range(first_epoch, ...).flat_map(one epoch)``), one epoch per
split: every epoch is made once, by one worker, exactly as the local pipeline makes it, so an epoch still means
each example once. ``parallel_epochs`` would have every worker run every epoch: K workers, each example K times.
- One worker: the local pipeline's order exactly, so N replicas equal one device and a resumed run equals an
  uninterrupted one, as without the service.
- K > 1 workers: K epochs are in flight at once and their steps reach the trainer in arrival order, so which
  steps of which epochs come first depends on timing: not deterministic (each step's batch is still one the local
  pipeline makes). A resumed run starts a new job at its step's epoch.
- A worker that dies: TensorFlow 2.21 keeps it registered (its dispatcher only logs the loss), and the client
  skips each request it does not answer and reads on from the other workers, so a run goes on at their pace; the
  rest of the epoch the dead worker was making is lost (distributed_epoch delivers at most once). When every worker
  is gone, or the dispatcher is, TensorFlow's client waits for them with no deadline of its own (cluster/
  dataservice.py has what TensorFlow does): ``Watchdog`` is the run's, --data-service-timeout seconds.
- A multi-worker run (several trainer processes): each trainer's pipeline is its own job, so with K > 1 service
  workers the trainers may train slices of different steps at the same time.

Datasets that run Python per element (py_function, from_generator, Pillow decoding) cannot run on the service's
workers: ``check_pure`` refuses them before anything starts. Every format the toolkit reads decodes in the graph.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid

from ..config.rules import service_address
from ..errors import ConfigError

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

MODE = "distributed_epoch"
# Ops that call back into the Python interpreter that built the dataset: a service worker has none.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
# A dataset's graph travels as one protocol buffer, whose hard limit is 2 GiB: an in-memory split's arrays ride in
# it as constants.
GRAPH_LIMIT_BYTES = 1 << 30


def normalise(address: str, what: str = "--data-service") -> str:
    """The form ``tf.data.experimental.service.distribute(service=...)`` takes, spelled out: ``grpc://host:port``
    (it also takes a bare host:port; one spelling makes a printed address and a recorded one read the same)."""
    host, port = service_address(address, what)
    return f"grpc://{host}:{port}"


def reachable(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something accepts a TCP connection at ``address`` within ``timeout_s``: TensorFlow does not fail on
    a dispatcher that is not there (a WorkerServer and a client's first read both retry it with no deadline)."""
    host, port = service_address(address)
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_s):
            return True
    except OSError:
        return False


def check_reachable(address: str) -> None:
    """A one-line ConfigError unless a dispatcher listens at ``address`` (checked before any training starts)."""
    if not reachable(address, timeout_s=3.0):
        port = service_address(address)[1]
        raise ConfigError(f"--data-service {address}: no tf.data service dispatcher answers there; start one with "
                          f"`tftoolkit data-service start --port {port}` or give the address it printed")


def check_pure(ds, what: str = "the training input") -> None:
    """A ConfigError if ``ds`` runs Python per element: the service's workers cannot run it."""
    from tensorflow.core.framework import graph_pb2  # deferred: TensorFlow (see the note under the imports)

    graph = graph_pb2.GraphDef.FromString(ds._as_serialized_graph().numpy())  # noqa: SLF001 - tf.data's own use
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    python = sorted(ops & PYTHON_OPS)
    if python:
        raise ConfigError(f"--data-service: {what} runs Python per element ({', '.join(python)}: py_function, "
                          "from_generator or a Python decoder), which the service's workers cannot run; the service "
                          "needs a pure tf.data pipeline. Drop --data-service, or give the data as files the toolkit "
                          "decodes in the graph (TFRecords, image folders)")


def through(ds, address: str, local: int, job: str, accumulate: int = 1):
    """``ds`` (this pipeline's per-replica batches, ``local`` replicas in turn, ``accumulate`` micro-batches a step)
    read from the service instead."""
    import tensorflow as tf

    check_pure(ds)
    # One step's replicas (and micro-batches) travel together: one worker makes the step, from one epoch.
    step = ds.batch(local * accumulate, drop_remainder=True)
    # compression=None: decoded pixels hardly compress, and the trainer's cores are what the service relieves.
    served = step.apply(tf.data.experimental.service.distribute(processing_mode=MODE, service=normalise(address),
                                                                job_name=job, compression=None))
    served = served.map(_noted)  # each step's arrival, for the Watchdog: the trainer's side, where Python runs
    # The trainer's side keeps the pipeline's options (no autotuning thread: it stalled iterator deletion).
    return served.unbatch().prefetch(local).with_options(ds.options())


def job_name(pipeline: int) -> str:
    """A job of its own per iterator: an iterator made again (a resumed run, a benchmark) starts from its step,
    never from what an earlier job left."""
    return f"tftoolkit-{uuid.uuid4().hex[:12]}-p{pipeline}"


def describe_service(address: str) -> dict:
    """What summary.json records in ``data_service``."""
    return {"address": address, "mode": MODE, "workers": None}


# --- the run's deadline on the service ----------------------------------------------------------------------------
class _Arrivals:
    """When the last step's element came from the service, in time.monotonic() seconds (one clock per process)."""

    at = 0.0


arrivals = _Arrivals()


def _arrived():
    arrivals.at = time.monotonic()
    return True


def _noted(*element):
    """``element``, once its arrival is noted: a py_function on the trainer's side, one per step (tens of µs)."""
    import tensorflow as tf

    noted = tf.py_function(_arrived, [], Tout=tf.bool)
    with tf.control_dependencies([noted]):
        element = tf.nest.map_structure(tf.identity, element)
    return element[0] if len(element) == 1 else element


class Watchdog:
    """A deadline on the service: while the run waits on a training call (``watching``), no step's element for
    ``timeout_s`` seconds calls ``on_stall(line)``, from this watchdog's thread.

    TensorFlow's client has none of its own: with every worker gone, or the dispatcher, its get_next waits in C++
    forever, holding the training call, and nothing can interrupt it there. ``on_stall`` therefore runs while the
    call is still stuck, so it must record what the run has (the rows of the calls that returned, the summary) and
    end the process (``os._exit``). It runs under the lock the call's end takes, so the run's state does not move
    beneath it. A call that runs longer than ``timeout_s`` with elements arriving is not a stall: each step's
    element counts. The first call's tracing counts against the deadline, which must therefore be longer.
    """

    def __init__(self, address: str, timeout_s: float, on_stall):
        self.address, self.timeout_s, self.on_stall = address, timeout_s, on_stall
        self._lock = threading.Lock()
        self._since: float | None = None  # when the call being watched began; None between calls
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="data-service-watchdog", daemon=True)
        self._thread.start()

    def line(self) -> str:
        return (f"the tf.data service at {self.address} delivered nothing for {self.timeout_s:g} s "
                "(--data-service-timeout): check that its dispatcher runs and that at least one of its workers does "
                f"(tftoolkit data-service start --dispatcher {self.address}); the checkpoints are kept: run the same "
                "command again to resume")

    @contextlib.contextmanager
    def watching(self):
        with self._lock:
            self._since = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._since = None

    def wrap(self, fn):
        """``fn``, each call of it watched."""
        def watched(*args, **kwargs):
            with self.watching():
                return fn(*args, **kwargs)
        return watched

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        while not self._closed.wait(min(1.0, self.timeout_s / 10)):
            with self._lock:
                if self._since is not None and time.monotonic() - max(self._since, arrivals.at) > self.timeout_s:
                    self.on_stall(self.line())
                    return
