"""The one clock every timed region reads: devices synchronised before it starts and before it stops.

GPU ops are asynchronous: a tf.function call returns once its kernels are queued, and fetching an output waits
only for the ops that output depends on. A training loop's losses depend on the forward pass; the backward pass,
the gradient all-reduce and the update of the last step may still be running on the GPUs when they arrive
(TensorFlow says so for ``tf.test.experimental.sync_devices``). A clock read then would overstate images/sec,
and in an alternating pair of timed calls (measure.breakdown's full step, then its compute-only step) the first
call's leftover all-reduce would be charged to the second.

So a region is: synchronise (nothing queued before it runs inside it), start the clock, do the work,
synchronise (everything it queued has finished), stop the clock. ``sync`` is what
``tf.test.experimental.sync_devices`` does, for this process's devices: a SyncDevice op on each, then a wait on
the eager executor's queue. On CPU replicas it costs tens of microseconds and changes nothing; on GPUs it is what makes
the figure true.

    with timer.region() as t:
        out = loop_fn(iterator, n)
    t.seconds

    out, seconds = timer.timed(fn, *args)

Every timed region in the toolkit goes through here (training and finder loops via engine.loop, the step-time
breakdown, the input benchmark, the all-reduce benchmark, find-batch, the CPU peak, doctor's checks);
tests/engine/test_timer.py checks each one with a clock that only a synchronised region reads correctly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.python.eager import context  # this host's address space: not in TensorFlow's public API
from tensorflow.python.ops import gen_sync_ops


def sync() -> None:
    """Block until every device of this process has finished the work queued on it so far.

    What ``tf.test.experimental.sync_devices`` does (a SyncDevice op on each device, then a wait on the eager
    executor's queue), for this process's devices only: in a multi-worker run the logical device list also holds
    the other workers' devices, where TensorFlow's version fails ("Haven't set up remote eager worker"); each
    worker times its own devices, and the collectives already keep the workers in step.
    """
    here = context.context().host_address_space()
    for dev in tf.config.list_logical_devices():
        if "/job:" not in dev.name or dev.name.startswith(here + "/"):
            with tf.device(dev.name):
                gen_sync_ops.sync_device()
    context.async_wait()


@dataclass
class Region:
    seconds: float = float("nan")


class region:  # noqa: N801 - used as a context manager, like contextlib's
    """Time a block of device work: ``with region() as r: ...; r.seconds``."""

    def __enter__(self) -> Region:
        self.result = Region()
        sync()
        self.t0 = time.perf_counter()
        return self.result

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            sync()
        self.result.seconds = time.perf_counter() - self.t0


def timed(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), seconds)``, the devices synchronised at both ends of the clock."""
    with region() as r:
        out = fn(*args, **kwargs)
    return out, r.seconds
