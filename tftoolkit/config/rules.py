"""The rules a RunConfig's values must meet, checked once when it is made (``RunConfig.__post_init__``).

``coerce_types`` checks each field against its annotation, with the coercions papermill needs (an int for a float
field, a tuple for a list); ``check_values`` the ranges, the choices and how the fields agree (the GPUs and the
replicas, the replicas and the workers, the two ways of giving the batch, accumulation and the last batch, the
tf.data service). Every refusal is a one-line ConfigError naming the field and what to give instead. The derived
numbers are computed in the config itself (config/__init__.py), not here.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing

from ..errors import ConfigError

MAX_SEED = 2**32 - 1  # the largest seed keras.utils.set_random_seed accepts

POSITIVE = ("replicas", "workers", "per_replica_batch", "global_batch", "base_batch", "steps", "steps_per_loop",
            "train_images", "image_size", "accumulate", "allreduce_packs")  # counts: > 0 where given
POSITIVE_FINITE = ("base_lr", "epochs", "divergence_factor", "data_service_timeout")
NON_NEGATIVE = ("warmup_epochs", "weight_decay", "checkpoint_every", "timing_warmup_steps")


def whole_number(v) -> bool:
    """An int (NumPy's too), not a bool: a count of examples, replicas or micro-batches."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def service_address(text: str, what: str = "--data-service") -> tuple[str, int]:
    """(host, port) of a tf.data service address, ``host:port`` or ``grpc://host:port``; a one-line ConfigError
    naming ``what`` when it is neither. An IPv6 host keeps its brackets (``[::1]:5050``), the form gRPC dials."""
    example = "give HOST:PORT, e.g. node1:5050 or grpc://node1:5050 (what tftoolkit data-service start prints)"
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{what} is empty; {example}")
    rest = text.strip()
    if "://" in rest:
        protocol, _, rest = rest.partition("://")
        if protocol != "grpc":
            raise ConfigError(f"{what} {text!r} uses protocol {protocol!r}; the tf.data service speaks grpc:// only "
                              f"({example})")
    host, _, port = rest.rpartition(":")
    bad_host = not host or any(c.isspace() or c in "/@" for c in host) or (":" in host and not host.startswith("["))
    if bad_host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} {text!r} is not HOST:PORT with a port from 1 to 65535; {example}")
    return host, int(port)


# --- types ----------------------------------------------------------------------------------------------------
def _base_types(tp) -> tuple[type, ...]:
    """(int,), (int, NoneType), (list,) ... from an annotation like ``int | None``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        out = ()
        for a in typing.get_args(tp):
            out += _base_types(a)
        return out
    if origin is list:
        return (list,)
    return (tp,)


def coerce_types(cfg) -> None:
    """Each field of the frozen dataclass ``cfg`` of its annotated type, or a ConfigError naming it; an int given
    for a float and a tuple of ints for a list are converted in place."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        allowed = _base_types(hints[f.name])
        if v is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(v, int) and not isinstance(v, bool):
            object.__setattr__(cfg, f.name, float(v))  # 1 is a fine float; papermill passes ints for 1.0
            continue
        if list in allowed and isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            object.__setattr__(cfg, f.name, list(v))
            continue
        ok = any(isinstance(v, t) for t in allowed if t is not type(None))
        if isinstance(v, bool) and bool not in allowed:
            ok = False  # True is an int in Python; as a batch size it is a mistake
        if not ok:
            names = " or ".join("None" if t is type(None) else ("list of int" if t is list else t.__name__) for t in allowed)
            raise ConfigError(f"{f.name}: expected {names}, got {type(v).__name__} {v!r}")


# --- values ---------------------------------------------------------------------------------------------------
def check_values(cfg) -> None:
    """The ranges, the choices and how the fields of ``cfg`` (a RunConfig, types already checked) agree."""
    _check_gpus(cfg)
    _check_ranges(cfg)
    for f in dataclasses.fields(cfg):
        choices = f.metadata.get("choices")
        if choices and getattr(cfg, f.name) not in choices:
            raise ConfigError(f"{f.name}: unknown value {getattr(cfg, f.name)!r}; choose one of {', '.join(choices)}")
    _check_batch(cfg)
    if cfg.data_service is not None:
        service_address(cfg.data_service)
        if cfg.last_batch == "partial":
            raise ConfigError("--last-batch partial cannot go through --data-service: the service carries each "
                              "step's replicas' batches as one element, which needs whole batches; use "
                              "--last-batch drop")


def _check_gpus(cfg) -> None:
    """``gpus``: distinct indices >= 0, as many as the replicas per worker; stored as a list of int."""
    if cfg.gpus is None:
        return
    gpus = [int(g) for g in cfg.gpus]
    if not gpus:
        raise ConfigError("gpus: give at least one GPU index, e.g. --gpus 0,1")
    if len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise ConfigError(f"gpus: indices must be distinct and >= 0, got {gpus}")
    if cfg.replicas is not None and cfg.replicas != len(gpus) * cfg.workers:
        raise ConfigError(f"replicas={cfg.replicas} but gpus names {len(gpus)} GPUs"
                          + (f" per worker x {cfg.workers} workers" if cfg.workers > 1 else "")
                          + "; give one or the other")
    object.__setattr__(cfg, "gpus", gpus)


def _check_ranges(cfg) -> None:
    """Counts > 0, rates and lengths finite and > 0, what may be 0 not negative, at least two classes, a seed
    Keras accepts."""
    for name in POSITIVE:
        v = getattr(cfg, name)
        if v is not None and v <= 0:
            raise ConfigError(f"{name} must be > 0, got {v}")
    if cfg.num_classes is not None and cfg.num_classes < 2:
        raise ConfigError(f"num_classes must be >= 2, got {cfg.num_classes}")
    for name in POSITIVE_FINITE:
        v = getattr(cfg, name)
        if not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"{name} must be a finite number > 0, got {v}")
    if cfg.data_memory_gb is not None and not (cfg.data_memory_gb > 0 and math.isfinite(cfg.data_memory_gb)):
        raise ConfigError(f"data_memory_gb must be a finite number > 0, got {cfg.data_memory_gb}")
    for name in NON_NEGATIVE:
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if not 0 < cfg.measure_budget <= 1:
        raise ConfigError(f"measure_budget is a fraction of the run's wall time, more than 0 and at most 1 (0.10 is "
                          f"10%), got {cfg.measure_budget}")
    if not 0 <= cfg.seed <= MAX_SEED:  # what keras.utils.set_random_seed (NumPy's legacy seeding) accepts
        raise ConfigError(f"seed must be a whole number from 0 to 2**32 - 1 = {MAX_SEED}, got {cfg.seed}")


def _check_batch(cfg) -> None:
    """The replicas divide among the workers; a global batch divides by replicas x accumulate and agrees with a
    per-replica batch given too; accumulation needs whole batches."""
    if cfg.replicas is not None and cfg.replicas % cfg.workers:
        raise ConfigError(f"replicas={cfg.replicas} does not divide among workers={cfg.workers}: replicas "
                          f"counts every worker's replicas; use a multiple of {cfg.workers}")
    k = cfg.accumulate
    acc = f" x accumulate={k}" if k > 1 else ""
    if cfg.global_batch is not None and cfg.replicas is not None and cfg.global_batch % (cfg.replicas * k):
        fix = (f"use a multiple of {cfg.replicas * k}" if k == 1 else
               f"use a multiple of {cfg.replicas * k}, or give --per-replica-batch")
        raise ConfigError(f"global_batch={cfg.global_batch} does not divide by replicas={cfg.replicas}{acc}; {fix}")
    if cfg.global_batch is not None and cfg.per_replica_batch is not None and cfg.replicas is not None \
            and cfg.per_replica_batch * cfg.replicas * k != cfg.global_batch:
        raise ConfigError(f"global_batch={cfg.global_batch} and per_replica_batch={cfg.per_replica_batch} disagree "
                          f"on {cfg.replicas} replica(s){acc} ({cfg.per_replica_batch} x {cfg.replicas}"
                          f"{f' x {k}' if k > 1 else ''} = {cfg.per_replica_batch * cfg.replicas * k}); give one "
                          "or the other")
    if k > 1 and cfg.last_batch == "partial":
        raise ConfigError("--accumulate needs whole batches (each replica runs --accumulate micro-batches of "
                          "--per-replica-batch): use --last-batch drop")
