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
  is gone the trainer waits for one to come back (cluster/dataservice.py has what TensorFlow does).
- A multi-worker run (several trainer processes): each trainer's pipeline is its own job, so with K > 1 service
  workers the trainers may train slices of different steps at the same time.

Datasets that run Python per element (py_function, from_generator, Pillow decoding) cannot run on the service's
workers: ``check_pure`` refuses them before anything starts. Every format the toolkit reads decodes in the graph.
"""

from __future__ import annotations

import socket
import uuid

from ..config import service_address
from ..errors import ConfigError

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
    from tensorflow.core.framework import graph_pb2

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
    # The trainer's side keeps the pipeline's options (no autotuning thread: it stalled iterator deletion).
    return served.unbatch().prefetch(local).with_options(ds.options())


def job_name(pipeline: int) -> str:
    """A job of its own per iterator: an iterator made again (a resumed run, a benchmark) starts from its step,
    never from what an earlier job left."""
    return f"tftoolkit-{uuid.uuid4().hex[:12]}-p{pipeline}"


def describe(address: str) -> dict:
    """What summary.json records in ``data_service``."""
    return {"address": address, "mode": MODE, "workers": None}
