"""A forecast without a run directory: a model (its parameter count, or a registered / keras.applications name), a
GPU and a server from the catalogue, and either a single-GPU rate or nothing (compute from FLOPs).

    step(N)  = compute · (1 + σ · E[max of N]) + allreduce(S, G, H) − hidden + overhead(N > 1)
    compute  = per-replica batch / images_per_sec                      with --images-per-sec (a measured or
                                                                        published single-GPU rate at that batch)
             = compute_ms                                              with --compute-ms
             = 3 · forward FLOPs · batch / (peak(precision) · achieved) otherwise
    S        = params · bytes of the all-reduce dtype (float32: Keras keeps float32 gradients under mixed precision)

- The all-reduce (``algorithm``), over the links topology.py resolves (peer-to-peer, named systems' NVLink rings,
  NICs per host), two-level across hosts (comms.allreduce_time):
  ``ring``: NCCL 2 and later (its rings over the topology; Horovod, MirroredStrategy's NcclAllReduce, the collective
  ops), and a parameter server sharded over the GPUs (every GPU sends and receives the same 2(N−1)/N · S);
  ``tree``: NCCL's double binary tree, the ring's bandwidth with a latency logarithmic in N (comms.tree_allreduce_time);
  ``ring-in-order``: NCCL 1.x's one ring in device order (catalogue_links.in_order_ring_link);
  ``star``: TensorFlow's reduce-to-one, every buffer through one device; ``hierarchical-copy``: TensorFlow's
  HierarchicalCopyAllReduce, a star in each half of the GPUs and an exchange between the halves' main devices
  (comms.hierarchical_copy_time);
  ``host``: the variables in host memory (a parameter server on the CPU, CentralStorageStrategy): every GPU copies S
  of gradients up and S of variables down each step over its PCIe link; a one-GPU step pays its own 2·S/B already
  (a rate measured that way includes it), so N GPUs add the contention of k sharing the busiest uplink:
  2 · (k − 1) · S / B (comms.host_transfer_time, catalogue_links.uplink_sharing);
  ``parameter-server``: the variables spread over the GPUs, each held whole by one (tf_cnn_benchmarks' default
  ``--variable_update=parameter_server --local_parameter_device=gpu``, which places each variable greedily on the
  least-loaded GPU): the GPU holding the most bytes, at least the largest tensor, receives N − 1 gradients of them
  and sends N − 1 copies back each step, over its own link: (N − 1) · max(S_largest, S / N) / B + 2(N − 1)·α
  (comms.parameter_server_time). That is proportional to N − 1, where a ring saturates at 2(N − 1)/N: for a model
  whose largest tensor is most of it (VGG16's first dense layer: 103 of 138M parameters) the holder is the bottleneck.
- The exchange's dtype (``allreduce_dtype``): float16 for gradients compacted to 16 bits before the exchange
  (tf_cnn_benchmarks' ``--compact_gradient_transfer``, Horovod's fp16 compression): S halves.
- The host as a shared link: where GPU-to-GPU traffic is staged through host memory (no peer-to-peer, or a ring
  across the CPU sockets of a named PCIe server), the GPUs on one socket share its capacity
  (catalogue_links.host_staged_link).
- Stragglers (σ): a synchronous step waits for the slowest of N replicas. With each replica's compute varying by
  σ (its coefficient of variation) around the mean, the expected slowest of N is E[max of N standard normals]
  (forecast.expected_max: 0 at one GPU, 1/√π at two, 1.42 at eight, 2.35 at 64) standard deviations above it (Chen et al.
  2016, "Revisiting Distributed Synchronous SGD", measured this tail). σ is ``straggler``, default the value fitted
  to the published validation rows (validation.release: one σ for all of them, never per row).
- hidden: forecast.ExchangeModel's, from the packs (``allreduce_packs``) or a given ``overlap`` (framework fusion).
- peak: the catalogue's figure for the unit the precision runs on (catalogue.matmul_tflops: float32 is TF32 on
  Ampere and later, as TensorFlow does by default); achieved: the fraction of it a model family reaches on a GPU
  chip in a precision's unit, fitted to the published validation rows (validation.achieved_fractions), never to one
  row.
- overhead: a fixed per-step cost of a multi-GPU step (synchronisation, framework), ``overhead_ms``; default the
  value fitted to the published rows together with σ (validation.fit_step_costs; it comes out 0 ms: the rows' extra
  per-step time grows with the compute and with N, which the straggler term carries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..config import DTYPE_BYTES, whole_number
from ..errors import ConfigError
from .. import catalogue
from .comms import Link, allreduce_time, host_transfer_time, measured_busbw, parameter_server_time
from .choices import ALGORITHMS, DEFAULT_ALGORITHM  # noqa: F401 - planner's names too
from .forecast import ExchangeModel, straggler_factor
from .catalogue_links import (find_gpu, in_order_ring_link, inter_link, intra_link, link_class, ring_link, socket_crossing,
                       uplink_sharing)

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# Parameters of each model's largest variable (the parameter server's bottleneck), counted from the layer shapes:
# VGG16's fc1 25088 x 4096; AlexNet's first dense layer (256 x 6 x 6) x 4096 (tf_cnn_benchmarks' definition,
# unconfirmed here); ResNet-50/152's 3x3 convolutions of the last stage 3 x 3 x 512 x 512; InceptionV3's classifier
# 2048 x 1000; InceptionV4's 1536 x 1000 (its largest convolution is smaller, unconfirmed).
LARGEST_TENSOR = {"vgg16": 102_760_448, "alexnet": 37_748_736, "resnet50": 2_359_296, "resnet50v1.5": 2_359_296,
                  "resnet152": 2_359_296, "inceptionv3": 2_048_000, "inceptionv4": 1_536_000}


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
    algorithm: str = DEFAULT_ALGORITHM
    allreduce_dtype: str = "float32"
    allreduce_packs: int = 1
    overlap: float | None = None
    overhead_ms: float | None = None   # default: fitted with σ
    achieved: float | None = None       # fraction of peak; default: fitted per family, chip and unit
    straggler: float | None = None      # σ, a replica's compute's coefficient of variation; default: fitted
    measured_busbw: tuple[tuple[int, float], ...] = ()  # (GPU count, bus bandwidth GB/s) from allreduce.csv
    measured_from: str = ""             # which file and implementation they came from

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
        if self.overhead_ms is not None and not (isinstance(self.overhead_ms, (int, float))
                                                 and math.isfinite(self.overhead_ms) and self.overhead_ms >= 0):
            raise ConfigError(f"--overhead-ms must be a number of ms >= 0, got {self.overhead_ms!r}")
        if self.straggler is not None and not (isinstance(self.straggler, (int, float))
                                               and math.isfinite(self.straggler) and 0 <= self.straggler < 1):
            raise ConfigError(f"--straggler is a coefficient of variation in [0, 1), got {self.straggler!r}")
        if self.nics_per_host is not None and not (whole_number(self.nics_per_host) and self.nics_per_host >= 1):
            raise ConfigError(f"--nics-per-host must be a whole number >= 1, got {self.nics_per_host!r}")
        if self.overlap is not None and not (isinstance(self.overlap, (int, float)) and math.isfinite(self.overlap)
                                             and 0.0 <= self.overlap <= 1.0):
            raise ConfigError(f"--overlap is a fraction of the all-reduce in [0, 1], got {self.overlap!r}")
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
        raise ConfigError(f"no achieved fraction of peak for model {plan.model!r} on GPU chip {gpu.chip} ({gpu.key}) "
                          f"in {unit} ({plan.precision}); give --images-per-sec or --compute-ms")
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


def _allreduce(plan: Plan, gpu, size: float, g: int, hosts: int, inter, nics: int):
    """(seconds of one step's all-reduce on ``hosts`` x ``g`` GPUs, how the link inside a host was found, its name)."""
    if plan.algorithm == "host":
        k, why = uplink_sharing(gpu, plan.interconnect, g)
        up = ring_link(catalogue.link(f"pcie{gpu.pcie_gen}" if gpu.pcie_gen else "pcie3"))
        t = host_transfer_time(size, k, up, plan.allreduce_packs)
        if hosts > 1:  # the hosts' parameter servers exchange over the NICs (one GPU per host: no intra term)
            t += allreduce_time(size, 1, hosts, up, inter, nics, "ring", plan.allreduce_packs)
        return t, f"variables in host memory: {why}", up.name
    if plan.algorithm == "parameter-server":
        intra, how = intra_link(gpu, plan.interconnect, g, ring=False)  # the holder's own link
        largest = LARGEST_TENSOR.get(str(plan.model or "").lower())
        part = largest * DTYPE_BYTES[plan.allreduce_dtype] if largest else None
        t = parameter_server_time(size, part, g, intra, plan.allreduce_packs)
        cross, beyond = socket_crossing(gpu, plan.interconnect, g)
        if cross is not None:  # the GPUs on the other socket send to the holder (and receive) across the sockets
            held = max(part or 0.0, size / g)
            t = max(t, beyond * held / cross.bandwidth_Bps)
        if hosts > 1:
            t += allreduce_time(size, 1, hosts, intra, inter, nics, "ring", plan.allreduce_packs)
        held = (f"largest tensor {largest:,} parameters" if largest else
                "largest tensor unknown: variables taken as evenly spread")
        return t, f"parameter server on the GPUs ({held}); {how}", intra.name
    if plan.algorithm == "ring-in-order":
        intra, how = in_order_ring_link(gpu, plan.interconnect, g)
        algorithm = "ring"
    else:
        intra, how = intra_link(gpu, plan.interconnect, g)
        algorithm = plan.algorithm
    if plan.measured_busbw and g > 1:  # the user's own GPUs, measured: their busbw replaces the catalogue's
        bw, which = measured_busbw(dict(plan.measured_busbw), g)
        intra = Link(f"measured ({plan.measured_from})", bw, intra.latency_us, which)
        how = f"busbw {bw:.3g} GB/s {which} ({plan.measured_from})"
    t = allreduce_time(size, g, hosts, intra, inter if hosts > 1 else None, nics, algorithm, plan.allreduce_packs)
    return t, how, intra.name


def forecast(plan: Plan, achieved: float | None = None, straggler: float = 0.0,
             overhead_ms: float = 0.0) -> tuple[pd.DataFrame, dict]:
    """(one row per replica count: compute, all-reduce, step, images/sec, efficiency; what it assumed).
    ``straggler``, ``overhead_ms``: σ and the fixed cost when the plan gives none (the release's fitted values,
    validation.release)."""
    gpu = find_gpu(plan.gpu)
    compute, compute_from = compute_time(plan, achieved)
    if plan.params is None:
        raise ConfigError("the model's parameter count is unknown; give --params or --model")
    size = plan.params * DTYPE_BYTES[plan.allreduce_dtype]
    ex = ExchangeModel(1, plan.allreduce_dtype, plan.allreduce_packs, plan.overlap)
    inter, sys_nics = inter_link(plan.interconnect, plan.inter_host)
    nics = plan.nics_per_host or sys_nics or 1
    sigma = plan.straggler if plan.straggler is not None else straggler
    fixed_ms = plan.overhead_ms if plan.overhead_ms is not None else overhead_ms
    rows, links = [], {}
    for n in plan.replica_counts:
        hosts, g = layout(n, plan.gpus_per_host)
        if hosts > 1 and inter is None:
            raise ConfigError(f"{n} GPUs span {hosts} hosts of {plan.gpus_per_host}; give --inter-host")
        comm, how, link_name = _allreduce(plan, gpu, size, g, hosts, inter, nics)
        hidden = ex.hidden(comm, compute)
        overhead = fixed_ms / 1e3 if n > 1 else 0.0
        wait = compute * (straggler_factor(sigma, n) - 1)  # the slowest replica sets a synchronous step
        step = compute + wait + comm - hidden + overhead
        links[f"{g} GPU(s) per host"] = how
        rows.append({"replicas": n, "hosts": hosts, "gpus_per_host": g, "per_replica_batch": plan.per_replica_batch,
                     "global_batch": plan.per_replica_batch * n, "compute_s": compute, "straggler_s": wait,
                     "allreduce_s": comm,
                     "hidden_s": hidden, "overhead_s": overhead, "step_time_s": step,
                     "images_per_sec": plan.per_replica_batch * n / step,
                     "comm_share": (comm - hidden) / step if n > 1 else 0.0,
                     "comm_exceeds_compute": comm > compute,
                     "hardware_class": ("single GPU" if n == 1 else link_class(gpu, plan.interconnect, g)
                                        + (" + network" if hosts > 1 else "")),
                     "scenario": f"{plan.interconnect or link_name}" + (f" + {inter.name}" if hosts > 1 else "")})
    df = pd.DataFrame(rows)
    one = plan.per_replica_batch / compute  # the 1-GPU rate, whether or not 1 is among the counts
    df["efficiency"] = df["images_per_sec"] / (df["replicas"] * one)
    assumed = {"compute": compute_from, "compute_s": compute, "gpu": gpu.key, "precision": plan.precision,
               "params": plan.params, "gradient_bytes": size, "algorithm": plan.algorithm,
               "links": links, "inter_host": inter.name if inter is not None and (df["hosts"] > 1).any() else None,
               "nics_per_host": nics,
               "overlap": ex.note, "overhead_ms": fixed_ms, "case": plan.case,
               "straggler": sigma,
               "stragglers": (f"the slowest of N replicas sets the step: compute x (1 + {sigma:.3g} x E[max of N "
                              "standard normals])" + (" (given, --straggler)" if plan.straggler is not None else
                                                      " (sigma fitted to the published validation rows)"))}
    return df, assumed


def crossover_text(frame: pd.DataFrame) -> str:
    """Where the forecast's all-reduce takes longer than its compute, in words ("" where it never does)."""
    over = frame[frame["comm_exceeds_compute"]]
    if over.empty:
        return ""
    n = int(over["replicas"].min())
    r = over[over["replicas"] == n].iloc[0]
    prev = frame[frame["replicas"] < n].sort_values("replicas")
    gain = ""
    if len(prev):
        p = prev.iloc[-1]
        ratio = r["images_per_sec"] / p["images_per_sec"]
        gain = (f"; from {int(p['replicas'])} to {n} GPUs the rate " +
                (f"falls ({ratio:.2f}x)" if ratio < 1 else f"gains only {ratio:.2f}x for {n / p['replicas']:.3g}x "
                 "the GPUs" if ratio < 0.75 * n / p["replicas"] else f"grows {ratio:.2f}x"))
    return (f"communication overtakes compute at {n} GPUs: the all-reduce takes {r['allreduce_s'] * 1e3:.3g} ms, "
            f"the compute {r['compute_s'] * 1e3:.3g} ms per step{gain}")

