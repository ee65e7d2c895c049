"""A forecast without a run directory: a model (its parameter count, or a registered / keras.applications name), a
GPU and a server from the catalogue, and either a single-GPU rate or nothing (compute from FLOPs).

    step(N)  = compute + allreduce(S, G, H) − hidden + overhead(N > 1)
    compute  = per-replica batch / images_per_sec                      with --images-per-sec (a measured or
                                                                        published single-GPU rate at that batch)
             = compute_ms                                              with --compute-ms
             = 3 · forward FLOPs · batch / (peak(precision) · achieved) otherwise
    S        = params · bytes of the all-reduce dtype (float32: Keras keeps float32 gradients under mixed precision)

- The all-reduce is comms.allreduce_time over the links topology.py resolves (peer-to-peer, named systems'
  NVLink rings, NICs per host): ring (NCCL), or star for TensorFlow's reduce-to-one / hierarchical copy and the
  parameter-server case, two-level across hosts.
- hidden: forecast.ExchangeModel's, from the packs (``allreduce_packs``) or a given ``overlap`` (framework fusion).
- peak: the catalogue's figure for the unit the precision runs on (catalogue.matmul_tflops: float32 is TF32 on
  Ampere and later, as TensorFlow does by default); achieved: the fraction of it a model family reaches on a GPU
  generation, fitted to the published validation rows (validation.achieved_fractions), never to one row.
- overhead: a fixed per-step cost of a multi-GPU step (synchronisation, framework), ``overhead_ms`` (default 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..config import DTYPE_BYTES, whole_number
from ..errors import ConfigError
from .. import catalogue
from .comms import ALGORITHMS, allreduce_time
from .forecast import ExchangeModel
from .topology import find_gpu, inter_link, intra_link

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def _counts(v) -> tuple[int, ...]:
    if isinstance(v, str):
        v = [x for x in v.split(",") if x.strip()]
    try:
        out = tuple(int(x) for x in v)
    except (TypeError, ValueError):
        raise ConfigError(f"--replica-counts must be whole numbers like 1,2,4,8, got {v!r}") from None
    if not out or min(out) < 1:
        raise ConfigError(f"--replica-counts must be whole numbers >= 1, got {v!r}")
    return tuple(sorted(set(out)))


@dataclass(frozen=True)
class Plan:
    """What to forecast: the model, the hardware, the batch. Validated at construction."""
    gpu: str
    per_replica_batch: int
    params: int | None = None
    model: str | None = None
    gpus_per_host: int = 8
    interconnect: str | None = None     # a catalogue link or system (default: the GPU's PCIe generation)
    inter_host: str | None = None       # a catalogue link between hosts (default: the system's NIC)
    nics_per_host: int | None = None    # default: the system's NICs, else 1
    images_per_sec: float | None = None
    compute_ms: float | None = None
    forward_flops: float | None = None  # per example; counted from the model when not given
    precision: str = "float32"
    replica_counts: tuple[int, ...] = (1, 2, 4, 8)
    algorithm: str = "ring"
    allreduce_dtype: str = "float32"
    allreduce_packs: int = 1
    overlap: float | None = None
    overhead_ms: float = 0.0
    achieved: float | None = None       # fraction of peak; default: fitted per family and generation

    def __post_init__(self):
        object.__setattr__(self, "replica_counts", _counts(self.replica_counts))
        if self.params is None and self.model is None:
            raise ConfigError("give --params N or --model NAME")
        if self.images_per_sec is not None and self.compute_ms is not None:
            raise ConfigError("give --images-per-sec or --compute-ms, not both")
        for flag, v in (("--per-replica-batch", self.per_replica_batch), ("--gpus-per-host", self.gpus_per_host),
                        ("--allreduce-packs", self.allreduce_packs)):
            if not (whole_number(v) and v >= 1):
                raise ConfigError(f"{flag} must be a whole number >= 1, got {v!r}")
        for flag, v in (("--images-per-sec", self.images_per_sec), ("--compute-ms", self.compute_ms),
                        ("--params", self.params)):
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{flag} must be a number > 0, got {v!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"--algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.allreduce_dtype not in DTYPE_BYTES:
            raise ConfigError(f"--allreduce-dtype must be one of {', '.join(DTYPE_BYTES)}")
        find_gpu(self.gpu)  # an unknown name is refused here, listing the known ones

    @property
    def case(self) -> str:
        """Which residuals the interval comes from: a given rate (or compute time), or FLOPs over the peak."""
        return "rate" if self.images_per_sec is not None or self.compute_ms is not None else "flops"


def compute_time(plan: Plan, achieved: float | None = None) -> tuple[float, str]:
    """(seconds of one replica's compute per step, what it rests on)."""
    b = plan.per_replica_batch
    if plan.images_per_sec is not None:
        return b / plan.images_per_sec, f"{plan.images_per_sec:g} images/s on one GPU given (--images-per-sec)"
    if plan.compute_ms is not None:
        return plan.compute_ms / 1e3, f"{plan.compute_ms:g} ms per step given (--compute-ms)"
    gpu = find_gpu(plan.gpu)
    tflops, unit = catalogue.matmul_tflops(gpu, plan.precision)
    if not tflops:
        raise ConfigError(f"{gpu.key} has no confirmed {unit} peak in the catalogue; give --images-per-sec")
    frac = plan.achieved or achieved
    if frac is None:
        raise ConfigError("no achieved fraction of peak for this model family and GPU generation (the published "
                          "validation rows have none); give --images-per-sec or --compute-ms")
    if not plan.forward_flops:
        raise ConfigError("the model's forward FLOPs are unknown; give --model NAME (counted) or --images-per-sec")
    t = 3.0 * plan.forward_flops * b / (tflops * 1e12 * frac)
    return t, (f"3 x {plan.forward_flops / 1e9:.3g} GFLOPs x batch {b} over {gpu.key}'s {tflops:g} TFLOP/s "
               f"{unit} x achieved {frac:.2f}")


def layout(n: int, gpus_per_host: int) -> tuple[int, int]:
    """(hosts, GPUs per host) for ``n`` GPUs: one host up to ``gpus_per_host``, then whole hosts."""
    if n <= gpus_per_host:
        return 1, n
    if n % gpus_per_host:
        raise ConfigError(f"{n} GPUs do not fill whole hosts of {gpus_per_host}; use a multiple of --gpus-per-host")
    return n // gpus_per_host, gpus_per_host


def forecast(plan: Plan, achieved: float | None = None) -> tuple[pd.DataFrame, dict]:
    """(one row per replica count: compute, all-reduce, step, images/sec, efficiency; what it assumed)."""
    gpu = find_gpu(plan.gpu)
    compute, compute_from = compute_time(plan, achieved)
    if plan.params is None:
        raise ConfigError("the model's parameter count is unknown; give --params or --model")
    size = plan.params * DTYPE_BYTES[plan.allreduce_dtype]
    ex = ExchangeModel(1, plan.allreduce_dtype, plan.allreduce_packs, plan.overlap)
    inter, sys_nics = inter_link(plan.interconnect, plan.inter_host)
    nics = plan.nics_per_host or sys_nics or 1
    rows, links = [], {}
    for n in plan.replica_counts:
        hosts, g = layout(n, plan.gpus_per_host)
        intra, how = intra_link(gpu, plan.interconnect, g)
        if hosts > 1 and inter is None:
            raise ConfigError(f"{n} GPUs span {hosts} hosts of {plan.gpus_per_host}; give --inter-host")
        comm = allreduce_time(size, g, hosts, intra, inter if hosts > 1 else None, nics, plan.algorithm,
                              plan.allreduce_packs)
        hidden = ex.hidden(comm, compute)
        overhead = plan.overhead_ms / 1e3 if n > 1 else 0.0
        step = compute + comm - hidden + overhead
        links[f"{g} GPU(s) per host"] = how
        rows.append({"replicas": n, "hosts": hosts, "gpus_per_host": g, "per_replica_batch": plan.per_replica_batch,
                     "global_batch": plan.per_replica_batch * n, "compute_s": compute, "allreduce_s": comm,
                     "hidden_s": hidden, "overhead_s": overhead, "step_time_s": step,
                     "images_per_sec": plan.per_replica_batch * n / step,
                     "scenario": f"{plan.interconnect or intra.name}" + (f" + {inter.name}" if hosts > 1 else "")})
    df = pd.DataFrame(rows)
    one = plan.per_replica_batch / compute  # the 1-GPU rate, whether or not 1 is among the counts
    df["efficiency"] = df["images_per_sec"] / (df["replicas"] * one)
    assumed = {"compute": compute_from, "compute_s": compute, "gpu": gpu.key, "precision": plan.precision,
               "params": plan.params, "gradient_bytes": size, "algorithm": plan.algorithm,
               "links": links, "inter_host": inter.name if inter is not None else None, "nics_per_host": nics,
               "overlap": ex.note, "overhead_ms": plan.overhead_ms, "case": plan.case}
    return df, assumed
