"""What a Keras fit's strategy, model and optimizer say, read for ``RunRecorder``: its devices and workers, the
optimizer's name and learning rates, and the compiled loss and metrics by name (as ``train`` names them)."""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from ..engine import devices as devices_mod


def fit_devices(strategy) -> tuple[list[str], list[int]]:
    """(this worker's devices as train names them, e.g. ['/gpu:0', '/gpu:1'], their TensorFlow GPU numbers)."""
    try:
        names = list(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError):  # the default strategy: wherever TensorFlow places ops
        names = ["/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"]
    specs = [tf.DeviceSpec.from_string(d) for d in names]
    out = [f"/{(s.device_type or 'cpu').lower()}:{s.device_index or 0}" for s in specs]
    return out, [int(d.split(":")[1]) for d in out if d.startswith("/gpu:")]


def cluster_addresses(strategy) -> list[str]:
    """The chief's and workers' addresses in the strategy's cluster (none without one)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    try:
        spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    except Exception:  # noqa: BLE001 - no cluster: one worker on one host
        spec = {}
    return [str(a) for job in ("chief", "worker") for a in (spec.get(job) or [])]


def fit_workers(strategy) -> int:
    """Worker processes in the strategy's cluster (1 without one)."""
    return max(1, len(cluster_addresses(strategy)))


def fit_hosts(strategy) -> int:
    """Distinct machines among the strategy's cluster addresses (1 without a cluster)."""
    return max(1, len({a.rsplit(":", 1)[0] for a in cluster_addresses(strategy)}))


def memory_peaks(kind: str, devices: list[str]):
    """engine.devices.memory_peaks of these devices (None on CPU)."""
    setup = devices_mod.DeviceSetup(kind, tuple(devices), None, devices_mod.host_cores())
    return devices_mod.memory_peaks(setup)


def optimizer_name(opt) -> str:
    """sgd, momentum, adam, ... as train's optimizer field names them (a Keras optimizer's class, lower case)."""
    opt = getattr(opt, "inner_optimizer", opt)  # under a LossScaleOptimizer
    name = type(opt).__name__.lower()
    return "momentum" if name == "sgd" and float(getattr(opt, "momentum", 0) or 0) > 0 else name


def read_lr(opt) -> float:
    try:
        return float(keras.ops.convert_to_numpy(opt.learning_rate))
    except Exception:  # noqa: BLE001 - an optimizer without a readable LR
        return math.nan


def lrs_at(opt, iterations, fallback: float) -> np.ndarray:
    """The LR applied at each optimizer iteration: a schedule evaluated there, else the epoch's value."""
    schedule = getattr(getattr(opt, "inner_optimizer", opt), "_learning_rate", None)
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        try:
            return np.asarray(keras.ops.convert_to_numpy(schedule(np.asarray(iterations, np.float32))), float)
        except Exception:  # noqa: BLE001 - a schedule that takes one step at a time
            pass
    return np.full(len(iterations), fallback, float)


def names_of(spec):
    """A compiled loss or metrics (Keras' compile config) as names: "mse", ["accuracy", "top2"], {"out": ...}."""
    if spec is None or isinstance(spec, str):
        return spec
    if isinstance(spec, dict) and "class_name" in spec:
        return (spec.get("config") or {}).get("name") or spec["class_name"]
    if isinstance(spec, dict):
        return {k: names_of(v) for k, v in spec.items()}
    if isinstance(spec, (list, tuple)):
        return [names_of(v) for v in spec]
    return getattr(spec, "name", None) or getattr(spec, "__name__", None) or type(spec).__name__
