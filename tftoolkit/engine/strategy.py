"""The one place a tf.distribute strategy is created (training, multi-worker, the all-reduce benchmark).

Library code that runs inside a strategy gets it from ``tf.distribute.get_strategy()``, so it also runs
under the default strategy in tests.
"""

from __future__ import annotations

import logging
import sys

import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy as cars  # multi-worker internals
from tensorflow.python.distribute import distribute_lib

from ..errors import ConfigError
from .devices import DeviceSetup

log = logging.getLogger("tftoolkit")


def nccl_available() -> tuple[bool, str]:
    """Whether NcclAllReduce can work here, and why not when it cannot."""
    if not sys.platform.startswith("linux"):
        return False, f"NCCL is Linux-only (this is {sys.platform})"
    info = tf.sysconfig.get_build_info()
    if not info.get("is_cuda_build", False):
        return False, "this TensorFlow build has no CUDA (install tensorflow[and-cuda])"
    if not tf.config.list_physical_devices("GPU"):
        return False, "TensorFlow sees no GPU (driver missing, or CUDA_VISIBLE_DEVICES empty)"
    return True, ""


def choose_cross_device_ops(name: str, setup: DeviceSetup) -> tuple[str, str]:
    """Resolve ``auto`` to a concrete implementation; return (name, reason logged for the choice).

    ``hierarchical_copy`` is refused at an odd replica count: TensorFlow's implementation
    (cross_device_utils.aggregate_gradients_using_hierarchical_copy) splits the devices into two groups of n // 2,
    so with 3 replicas the third one's gradients are never added (measured: 3 replicas all-reduce 1 + 2 + 3 to 3,
    tests/engine/test_strategy.py), and training silently goes wrong.
    """
    odd = setup.replicas > 1 and setup.replicas % 2 == 1
    if name == "hierarchical_copy" and odd:
        raise ConfigError(f"cross_device_ops=hierarchical_copy at {setup.replicas} replicas: TensorFlow's hierarchical "
                          "copy splits the devices into two groups of n // 2 and drops the odd one's gradients; use an "
                          "even replica count, or reduce_to_one, collective or auto")
    if setup.kind != "GPU":
        if name == "nccl":
            raise ConfigError("cross_device_ops=nccl needs GPUs; replicas here are simulated on CPU. "
                              "Use auto, reduce_to_one, collective or hierarchical_copy")
        if name == "auto":
            # On CPU TensorFlow's own default picks a collective (ring) implementation that we measured 2-6x
            # slower than a plain reduce-to-one-device (4.6x at 16 MiB on 4 logical devices; BENCHMARKS.md).
            return "reduce_to_one", "CPU replicas: reduce_to_one is the fastest all-reduce between logical CPU devices"
        return name, "as requested"
    if name == "auto":
        if setup.replicas == 1:
            return "reduce_to_one", "one replica: nothing to all-reduce"
        ok, why = nccl_available()
        if ok:
            return "nccl", "multi-GPU Linux: NCCL"
        if odd:
            return "reduce_to_one", (f"NCCL unavailable ({why}); reduce_to_one (hierarchical_copy drops a replica at "
                                     f"{setup.replicas} replicas)")
        return "hierarchical_copy", f"NCCL unavailable ({why}); falling back to hierarchical_copy"
    if name == "nccl":
        ok, why = nccl_available()
        if not ok:
            raise ConfigError(f"cross_device_ops=nccl is not available: {why}; use hierarchical_copy or auto")
    return name, "as requested"


def cross_device_ops_object(name: str):
    """The CrossDeviceOps for ``name``; None for ``collective`` (MirroredStrategy's own CollectiveAllReduce)."""
    if name == "collective":
        return None
    return {
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduce_to_one": tf.distribute.ReductionToOneDevice,
    }[name]()


def mirrored(devices, cross_device_ops=None):
    """A MirroredStrategy over ``devices`` with a collective key range of its own: every strategy the toolkit
    builds comes from here.

    Every MirroredStrategy numbers its collective groups and instances from the same start
    (``MirroredStrategy._collective_key_base``), and it always builds collective ops: the default all-reduce
    when ``cross_device_ops`` is None, and the one XLA uses whatever ``cross_device_ops`` says. A second strategy
    in the process then reuses the first one's keys: with another replica count that aborts every collective
    op in the process ("joining a group with size 3, but that group has size 2", tensorflow#61314); with another
    buffer shape under a reused instance key, "Shape mismatch in the collective instance". A notebook or
    ``tftoolkit scale`` builds strategies of 1, 2 and 4 replicas in one process. So each strategy starts a
    fresh range, as TensorFlow's own tests do (strategy_combinations.py), moved on again after, so a strategy
    created elsewhere later does not start inside this one's range.
    """
    tf.distribute.MirroredStrategy._collective_key_base += 100000
    strategy = tf.distribute.MirroredStrategy(devices=list(devices), cross_device_ops=cross_device_ops)
    tf.distribute.MirroredStrategy._collective_key_base += 100000
    return strategy


def make_strategy(setup: DeviceSetup, cross_device_ops: str = "auto"):
    """A MirroredStrategy over ``setup.devices``; returns (strategy, resolved cross-device-ops name)."""
    impl, reason = choose_cross_device_ops(cross_device_ops, setup)
    log.info("all-reduce: %s (%s)", impl, reason)
    return mirrored(setup.devices, cross_device_ops_object(impl)), impl


def check_allreduce_dtype(dtype: str, impl: str, setup: DeviceSetup, jit: bool, replicas: int = 2) -> None:
    """Refuse an all-reduce dtype the implementation cannot reduce on these devices (``impl``: what the step really
    all-reduces with, effective_cross_device_ops), before anything trains.

    bfloat16 on GPUs, outside XLA: ``NcclAllReduce``'s op admits half, float, double, int32 and int64 only (a
    TypeError when the graph is built; tests/engine/test_strategy.py reads the op's registered types), and
    TensorFlow's collective executor rejects a bfloat16 reduction on a GPU at run time ("Collective all-reduce does
    not support datatype DT_BFLOAT16 on DEVICE_GPU", base_collective_executor.cc), which also aborts every later
    collective in the process. HierarchicalCopyAllReduce and ReductionToOneDevice add with AddN, which has bfloat16
    GPU kernels; CPU replicas reduce bfloat16 with any implementation. Under XLA the all-reduce is XLA's own (NCCL,
    accumulating in float32), not checked by us on GPUs: allowed, and said. float16 works on every path. One replica
    in all (``replicas``) reduces nothing.
    """
    if dtype != "bfloat16" or setup.kind != "GPU" or replicas == 1:
        return
    if jit and impl.startswith("collective_nccl (xla)"):
        log.warning("--allreduce-dtype bfloat16 under XLA on GPUs: XLA's own NCCL all-reduce, which TensorFlow's "
                    "sources say takes bfloat16; not verified by tftoolkit on GPUs (float16 is)")
        return
    if impl in ("nccl", "collective", "collective_nccl", "collective_ring", "tf_default"):
        raise ConfigError(f"--allreduce-dtype bfloat16 cannot go through {impl} on GPUs: TensorFlow's NCCL and "
                          "collective all-reduce take no bfloat16 there (outside XLA). Use --allreduce-dtype float16 "
                          "(the same bytes), or --cross-device-ops hierarchical_copy / reduce_to_one, or --jit")


def effective_cross_device_ops(impl: str, setup: DeviceSetup, jit: bool) -> str:
    """What the step really all-reduces with: under XLA on GPUs MirroredStrategy ignores ``cross_device_ops`` and
    uses its CollectiveAllReduce, NCCL between physical GPUs (mirrored_strategy.py, ``_get_cross_device_ops``:
    "Under XLA context, MirroredStrategy uses CollectiveAllReduce op")."""
    if jit and setup.kind == "GPU" and setup.replicas > 1:
        return "collective_nccl (xla)"
    return impl


# --- several workers (processes, hosts): MultiWorkerMirroredStrategy --------------------------------------
def choose_collective(name: str, setup: DeviceSetup) -> tuple[str, str]:
    """The collective implementation for a multi-worker run: (name, reason logged for the choice)."""
    if name in ("reduce_to_one", "hierarchical_copy"):
        raise ConfigError(f"cross_device_ops={name} works inside one process only; a multi-worker run all-reduces "
                          "with collective ops: use auto (ring on CPU, NCCL on GPUs) or nccl")
    if setup.kind != "GPU":
        if name == "nccl":
            raise ConfigError("cross_device_ops=nccl needs GPUs; replicas here are simulated on CPU. Use auto (ring)")
        return "ring", "CPU workers: collective ring all-reduce over gRPC"
    ok, why = nccl_available()
    if name == "nccl" and not ok:
        raise ConfigError(f"cross_device_ops=nccl is not available: {why}; use auto")
    if ok:
        return "nccl", "GPU workers: NCCL" + (" (auto)" if name == "auto" else "")
    return "ring", f"NCCL unavailable ({why}); collective ring all-reduce over gRPC"


def make_multiworker_strategy(setup: DeviceSetup, cross_device_ops: str = "auto"):
    """A MultiWorkerMirroredStrategy over this worker's ``setup.devices``; the cluster comes from TF_CONFIG.

    Blocks until every worker has connected. Returns (strategy, "collective_ring" | "collective_nccl").

    TensorFlow's MultiWorkerMirroredStrategy mirrors over all GPUs of a worker, or over one CPU device when
    there is none: it never uses several logical CPU devices per worker. To simulate N replicas per worker
    on CPU (and to use exactly the GPUs the config names) the strategy is built with the one method that
    lists a worker's devices replaced. Verified on TF 2.21 with 2 workers x 2 logical CPU devices: 4 replicas
    in sync, replica ids 0-3 in worker order, ring all-reduce and initial-value broadcast correct
    (tests/test_multiworker.py checks training end to end against one process with 4 replicas).
    """
    impl, reason = choose_collective(cross_device_ops, setup)
    log.info("all-reduce: collective %s (%s)", impl, reason)
    kind = "GPU" if setup.kind == "GPU" else "CPU"
    local = [int(d.rsplit(":", 1)[1]) for d in setup.devices]

    class _Extended(cars.CollectiveAllReduceExtended):
        def _initialize_local_devices(self, cluster_resolver, worker_device):
            return tuple(f"{worker_device}/device:{kind}:{i}" for i in local), kind

    class _Strategy(tf.distribute.MultiWorkerMirroredStrategy):
        def __init__(self, options):
            distribute_lib.Strategy.__init__(self, _Extended(self, cluster_resolver=None, communication_options=options))

    implementation = {"ring": tf.distribute.experimental.CommunicationImplementation.RING,
                      "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}[impl]
    strategy = _Strategy(tf.distribute.experimental.CommunicationOptions(implementation=implementation))
    return strategy, f"collective_{impl}"


# --- the all-reduce benchmark's strategies ------------------------------------------------------------------
def make_bench_strategy(impl: str, setup: DeviceSetup):
    """(MirroredStrategy over ``setup.devices`` all-reducing with ``impl``, CommunicationOptions or None).

    ``impl``: nccl, hierarchical_copy, reduce_to_one (explicit cross-device ops), collective (CollectiveAllReduce
    with RING, what multi-worker training uses without NCCL) or tf_default (what MirroredStrategy picks itself).
    """
    if impl in ("collective", "tf_default"):
        # No cross_device_ops: MirroredStrategy builds a CollectiveAllReduce (RING on CPU, NCCL on real GPUs).
        strategy = mirrored(setup.devices)
    else:
        strategy = mirrored(setup.devices, cross_device_ops_object(impl))
    options = None
    if impl == "collective":
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return strategy, options


def allreduce_name(strategy, options=None) -> str:
    """What a strategy really all-reduces with, e.g. ``CollectiveAllReduce(RING)`` (from TF internals; best effort)."""
    ext = strategy.extended
    ops = getattr(ext, "_cross_device_ops", None) or getattr(ext, "_inferred_cross_device_ops", None)
    name = type(ops).__name__ if ops is not None else "unknown"
    if name == "CollectiveAllReduce":
        impl = getattr(options, "implementation", None)
        if impl is None or str(getattr(impl, "name", impl)) == "AUTO":
            impl = getattr(getattr(ext, "_communication_options", None), "implementation", "AUTO")
        name += f"({getattr(impl, 'name', impl)})"
    return name
