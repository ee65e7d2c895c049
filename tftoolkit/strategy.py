"""The one place a tf.distribute strategy is created.

Library code that runs inside a strategy gets it from ``tf.distribute.get_strategy()``, so it also runs
under the default strategy in tests.
"""

from __future__ import annotations

import logging
import sys

from .devices import DeviceSetup
from .errors import ConfigError

log = logging.getLogger("tftoolkit")


def nccl_available() -> tuple[bool, str]:
    """Whether NcclAllReduce can work here, and why not when it cannot."""
    if not sys.platform.startswith("linux"):
        return False, f"NCCL is Linux-only (this is {sys.platform})"
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    if not info.get("is_cuda_build", False):
        return False, "this TensorFlow build has no CUDA (install tensorflow[and-cuda])"
    if not tf.config.list_physical_devices("GPU"):
        return False, "TensorFlow sees no GPU (driver missing, or CUDA_VISIBLE_DEVICES empty)"
    return True, ""


def choose_cross_device_ops(name: str, setup: DeviceSetup) -> tuple[str, str]:
    """Resolve ``auto`` to a concrete implementation; return (name, reason logged for the choice)."""
    if setup.kind != "GPU":
        if name == "nccl":
            raise ConfigError("cross_device_ops=nccl needs GPUs; replicas here are simulated on CPU. "
                              "Use auto, reduce_to_one or hierarchical_copy")
        if name == "auto":
            # On CPU TensorFlow's own default picks a collective implementation that we measured ~25x slower
            # than a plain reduce-to-one-device for a 16 MB all-reduce on 4 logical devices (BENCHMARKS.md).
            return "reduce_to_one", "CPU replicas: reduce_to_one is the fastest all-reduce between logical CPU devices"
        return name, "as requested"
    if name == "auto":
        if setup.replicas == 1:
            return "reduce_to_one", "one replica: nothing to all-reduce"
        ok, why = nccl_available()
        if ok:
            return "nccl", "multi-GPU Linux: NCCL"
        return "hierarchical_copy", f"NCCL unavailable ({why}); falling back to hierarchical_copy"
    if name == "nccl":
        ok, why = nccl_available()
        if not ok:
            raise ConfigError(f"cross_device_ops=nccl is not available: {why}; use hierarchical_copy or auto")
    return name, "as requested"


def cross_device_ops_object(name: str):
    import tensorflow as tf

    return {
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduce_to_one": tf.distribute.ReductionToOneDevice,
    }[name]()


def make_strategy(setup: DeviceSetup, cross_device_ops: str = "auto"):
    """A MirroredStrategy over ``setup.devices``; returns (strategy, resolved cross-device-ops name)."""
    import tensorflow as tf

    impl, reason = choose_cross_device_ops(cross_device_ops, setup)
    log.info("all-reduce: %s (%s)", impl, reason)
    strategy = tf.distribute.MirroredStrategy(devices=list(setup.devices),
                                              cross_device_ops=cross_device_ops_object(impl))
    return strategy, impl
