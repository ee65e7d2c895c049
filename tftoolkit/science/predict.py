"""Predict data-parallel step time, speedup and efficiency for N GPUs from one measured run.

The model (one line per term; every figure it uses is in the output so a prediction can be checked):

    t(N)        = K · t_micro(per-replica batch) + t_allreduce(S, N) − hidden
    t_allreduce = P · [2(G−1)/G · S/(P·B_intra) + 2(G−1)·α_intra          inside each host (G GPUs)
                     + 2(H−1)/H · S/(P·nics·B_inter) + 2(H−1)·α_inter]    between H hosts
    hidden      = min(overlap · t_allreduce, ⅔ · t_micro)                  with --overlap
                = (P−1)/P · min(t_allreduce, ⅔ · t_micro)                  otherwise (modelled, not measured)

K micro-batches per optimizer step (``accumulate``), P packs (``allreduce_packs``), S the bytes one all-reduce
moves in its dtype (``allreduce_dtype``); each defaults to the calibration run's.

``algorithm="star"`` replaces the in-host ring by 2(G−1)·(S/B + α): every buffer through one device, as
TensorFlow's reduce_to_one does (the all-reduce of CPU replicas, and of GPUs where NCCL is missing).

On one host (H = 1) this is the ring all-reduce cost 2(N−1)/N · S/B + 2(N−1)·α (nccl-tests' bus factor;
the α-β model of Thakur, Rabenseifner & Gropp 2005, summed for a ring reduce-scatter + all-gather; see
shared/reference/hardware.md §3). Across hosts it is the hierarchical all-reduce NCCL and Horovod use:
reduce-scatter inside the host, all-reduce of each GPU's 1/G shard between hosts, all-gather inside; the
G shards leave a host over its ``nics`` NICs together, so that stage moves S per host.

S = gradient bytes as the all-reduce moves them: the run's ``gradient_bytes`` (or ``params`` × the bytes of its
``allreduce_dtype``), converted to the asked dtype by the bytes per element (DTYPE_BYTES: bfloat16 and float16
move half of float32's). Runs written before these fields moved float32 in one pack without accumulation. B is the
bandwidth per direction a ring achieves (bus bandwidth), α the latency per ring step.

Packs: each of the P packs is its own all-reduce of S/P bytes, so the bandwidth term stays and the latency is paid
P times. ``overlap`` is the fraction of the all-reduce hidden behind the backward pass, at most that backward pass
(taken as ⅔ of one micro-step's compute: only the last micro-batch's backward pass runs beside the all-reduce).
Without ``--overlap`` it is *modelled* from the packs, not measured here: the packs hold equal bytes in reverse
layer order, and the backward pass finishes them one after another, evenly over its time, so the first P−1 can
go while it still runs and the last only after it. Sent one after another, they hide (P−1)/P of the all-reduce
when it is shorter than the backward pass (only the last pack shows), and (P−1)/P of the backward pass when it is
longer (the first pack waits for 1/P of it). One pack hides nothing: this toolkit's step then all-reduces after
the whole backward pass (``engine.step``). With accumulation (K > 1) the toolkit all-reduces after its loop over
the micro-batches, so nothing is modelled as hidden either (give ``--overlap`` for a step that overlaps the last
micro-batch's backward pass, as DDP's ``no_sync`` does). Horovod or Keras' fit with gradient bucketing overlap
part of it too; give ``--overlap`` to model those.

Accumulation: a run with ``accumulate`` K computes K micro-steps per optimizer step, so its measured compute per
step is K × that of one micro-batch. A forecast at ``--accumulate K`` models a step as K micro-steps and one
all-reduce: communication's share of the step falls as K grows, and the global batch is per-replica × N × K.

Compute is calibrated from the run: ``step_time_s`` of a one-replica run (the median of its timed steps;
it has no all-reduce), else ``compute_time_s`` (the step with no all-reduce, from ``--measure``; as its share of
the step it was timed interleaved with, times ``step_time_s``: on_training_clock), each divided by the run's
``accumulate`` into the compute of one micro-step. With ``devices="dedicated"`` (GPUs: every
replica has its own device) compute depends only on the per-replica batch: constant in weak scaling, and
proportional to the per-replica batch in strong scaling (it overstates the gain at small per-replica
batches, where a GPU is not kept busy). With ``devices="shared"`` (CPU-simulated replicas: every replica
runs on the same host cores) compute is proportional to the total examples per step, N × per-replica batch.

Input: a run's summary says what its input delivers per core (``input_capacity_per_core``). Hosts like the run's,
or of ``--host-cores`` cores, each feed their own GPUs; the first GPU count whose predicted images/sec exceed that
capacity is where input becomes the limit, and the cores per host (or tf.data service workers, hosts of the same
cores) that would lift it follow from the rate per core (add_input_limit, input_limit).

Link presets (bandwidth per direction in GB/s = 10^9 B/s, α in µs), from shared/reference/hardware.md, whose
source keys are quoted. B is what a ring achieves where a measurement is published, else the rated figure:

  pcie4    31.5 GB/s  PCIe 4.0 x16 per direction, rated (HN, ML, GK; NCCL itself models Gen3 at 12 of 15.75:
           expect ~75% of this); α 3.0 µs = 42 µs for an 8-byte all-reduce on 8×RTX 4090 over PCIe (I6) / 14 steps
  pcie5    63 GB/s    PCIe 5.0 x16 per direction, rated (HN, ML, GK); α 3.0 µs as pcie4 (no PCIe 5 figure published)
  nvlink3  235 GB/s   measured 8×A100 all-reduce busbw (ML; 300 GB/s rated NVLink 3 per direction);
           α 0.6 µs = 3.5 µs for a 1 KB all-reduce on 4×H800 NVLink ring (I5) / 6 steps (NCCL's LL NVLink
           per-step latency is also 0.6 µs, NT)
  nvlink4  370 GB/s   NCCL lead's application-level target per direction for H100/H200 (I1); 367.6 measured
           on 8×H200 without NVLS (SB); 450 rated; α 0.6 µs as nvlink3
  ib100    12.0 GB/s  NCCL's NET_BW labelled "100Gbit" (NT; line rate 12.5 GB/s, ML)
  ib200    22.6 GB/s  HDR 200 Gb/s: 3 nodes × 4 HDR NICs measured 85–96 GB/s busbw of 100 (I2): 90.5/4 per NIC
  ib400    47 GB/s    NDR 400 Gb/s: NVIDIA maintainer expects 46–48 GB/s busbw per NIC (I3)
           α for all IB presets 9.8 µs = 19.5 µs for an 8-byte all-reduce between 2 nodes × 1 GPU over HDR
           (I8) / 2 steps; no NDR or EDR latency is published at this level (unconfirmed for those).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import summary
from ..config import DTYPE_BYTES, whole_number
from ..errors import ConfigError, DataError, RunDirError

BACKWARD_SHARE = 2.0 / 3.0  # backward ≈ 2 × forward FLOPs: the most of a step an all-reduce can hide behind
DEFAULT_MAX_REPLICAS = 64
DEFAULT_GPUS_PER_HOST = 8
MODES = ("weak", "strong")
DEVICES = ("dedicated", "shared")

# The summary.json fields the model is calibrated and checked with.
READS = summary.names("replicas", "per_replica_batch", "gradient_bytes", "params", "step_time_s", "compute_time_s",
                      "images_per_sec", "images_per_sec_uncertainty", "device_kind", "communication_fraction",
                      "step_time_no_input_s", "accumulate", "allreduce_dtype", "allreduce_packs",
                      "breakdown_step_time_s")


def on_training_clock(s: dict, key: str) -> float:
    """A breakdown time (``compute_time_s``, ``step_time_no_input_s``) scaled onto the run's own ``step_time_s``: its
    share of the step it was timed interleaved with (``breakdown_step_time_s``) x step_time_s. The breakdown is
    timed after training, when the host's load may differ; its shares hold, its absolute times need not. Summaries
    from before the interleaved breakdown have no such step: their time as recorded."""
    value, step, beside = s.get(key), s.get("step_time_s"), s.get("breakdown_step_time_s")
    if _finite(value) and _finite(step) and _finite(beside) and beside > 0 and step > 0:
        return float(value) * float(step) / float(beside)
    return float(value) if _finite(value) else math.nan


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth_GBps: float  # per direction, as a ring achieves it (bus bandwidth)
    latency_us: float      # per ring step
    source: str = ""

    def __post_init__(self):
        if not (isinstance(self.bandwidth_GBps, (int, float)) and math.isfinite(self.bandwidth_GBps)
                and self.bandwidth_GBps > 0):
            raise ConfigError(f"link {self.name!r}: bandwidth must be a finite number of GB/s > 0, got "
                              f"{self.bandwidth_GBps!r}")
        if not (isinstance(self.latency_us, (int, float)) and math.isfinite(self.latency_us) and self.latency_us >= 0):
            raise ConfigError(f"link {self.name!r}: latency must be a finite number of µs >= 0, got {self.latency_us!r}")

    @property
    def bandwidth_Bps(self) -> float:
        return self.bandwidth_GBps * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


PRESETS: dict[str, Link] = {
    "pcie4": Link("pcie4", 31.5, 3.0, "PCIe 4.0 x16 rated per direction (HN, ML, GK); alpha from I6"),
    "pcie5": Link("pcie5", 63.0, 3.0, "PCIe 5.0 x16 rated per direction (HN, ML, GK); alpha as pcie4"),
    "nvlink3": Link("nvlink3", 235.0, 0.6, "8xA100 measured busbw (ML); alpha from I5 / NCCL LL (NT)"),
    "nvlink4": Link("nvlink4", 370.0, 0.6, "H100/H200 app-level target (I1), 367.6 measured 8xH200 (SB)"),
    "ib100": Link("ib100", 12.0, 9.8, "NCCL NET_BW '100Gbit' (NT); alpha from I8 (HDR)"),
    "ib200": Link("ib200", 22.6, 9.8, "HDR: 85-96 of 100 GB/s over 4 NICs (I2); alpha from I8"),
    "ib400": Link("ib400", 47.0, 9.8, "NDR: 46-48 GB/s busbw per NIC (I3); alpha from I8 (unconfirmed for NDR)"),
}
INTRA_PRESETS = ("pcie4", "pcie5", "nvlink3", "nvlink4")
INTER_PRESETS = ("ib100", "ib200", "ib400")


def parse_link(text: str) -> Link:
    """A preset name, or ``NAME=BANDWIDTH_GBps[:LATENCY_us]`` for a link of your own."""
    text = str(text).strip()
    if "=" in text:
        name, _, spec = text.partition("=")
        bw, _, lat = spec.partition(":")
        try:
            bw_v, lat_v = float(bw), float(lat) if lat else 0.0
        except ValueError:
            raise ConfigError(f"cannot read link {text!r}; write NAME=GBps[:latency_us], e.g. mylink=25:5") from None
        return Link(name.strip() or "custom", bw_v, lat_v, "given on the command line")
    if text not in PRESETS:
        raise ConfigError(f"unknown interconnect {text!r}; use one of {', '.join(PRESETS)} or NAME=GBps[:latency_us]")
    return PRESETS[text]


# --- the cost model (pinned by tests/test_predict.py) -----------------------------------------------------
def ring_allreduce_time(size_bytes: float, replicas: int, link: Link) -> float:
    """2(N−1)/N · S/B + 2(N−1)·α; 0 for one replica."""
    if replicas <= 1:
        return 0.0
    n = replicas
    return 2.0 * (n - 1) / n * size_bytes / link.bandwidth_Bps + 2.0 * (n - 1) * link.latency_s


def star_allreduce_time(size_bytes: float, replicas: int, link: Link) -> float:
    """2(N−1) · (S/B + α): every buffer goes to one device and the sum back to every other, one after another
    through that device (TensorFlow's reduce_to_one; what CPU replicas use). 0 for one replica."""
    if replicas <= 1:
        return 0.0
    return 2.0 * (replicas - 1) * (size_bytes / link.bandwidth_Bps + link.latency_s)


ALGORITHMS = {"ring": ring_allreduce_time, "star": star_allreduce_time}


def _algorithm(name: str):
    if name not in ALGORITHMS:
        raise ConfigError(f"all-reduce algorithm must be one of {', '.join(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]


def allreduce_time(size_bytes: float, gpus_per_host: int, hosts: int, intra: Link, inter: Link | None = None,
                   nics_per_host: int = 1, algorithm: str = "ring", packs: int = 1) -> float:
    """Hierarchical all-reduce: ``algorithm`` inside each host, then a ring between hosts over
    ``nics_per_host`` NICs; in ``packs`` all-reduces of size_bytes / packs each (every one pays the latency)."""
    size = size_bytes / packs
    t = _algorithm(algorithm)(size, gpus_per_host, intra)
    if hosts > 1:
        if inter is None:
            raise ConfigError("more than one host needs an inter-host link (e.g. --inter-host ib200)")
        nic = Link(inter.name, inter.bandwidth_GBps * nics_per_host, inter.latency_us)
        t += ring_allreduce_time(size, hosts, nic)
    return packs * t


def hidden_time(allreduce_s: float, backward_s: float, overlap: float | None = None, packs: int = 1) -> float:
    """The part of the all-reduce that runs while the backward pass (``backward_s``) still computes.

    ``overlap`` given: that fraction of the all-reduce, at most the backward pass. Otherwise modelled from the
    ``packs`` (equal bytes, last layers first, finished evenly over the backward pass, sent one after another):
    pack i is ready at i/P of the backward pass, so the last one finishes at max(backward + t/P, backward/P + t),
    and what is hidden is (P−1)/P · min(t_allreduce, backward)."""
    if overlap is not None:
        return min(overlap * allreduce_s, backward_s)
    return (packs - 1) / packs * min(allreduce_s, backward_s)


def step_time(compute_s: float, allreduce_s: float, overlap: float | None = 0.0, *, packs: int = 1,
              backward_s: float | None = None) -> float:
    """compute + all-reduce − hidden_time; the backward pass is ⅔ of ``compute_s`` unless ``backward_s`` says."""
    backward = BACKWARD_SHARE * compute_s if backward_s is None else backward_s
    return compute_s + allreduce_s - hidden_time(allreduce_s, backward, overlap, packs)


# --- calibration from a run directory and from bench allreduce ---------------------------------------------
@dataclass(frozen=True)
class Calibration:
    compute_s: float           # measured compute of one micro-step (a step, without accumulation)
    per_replica_batch: float   # at this per-replica batch (the micro-batch)
    replicas: int              # on this many replicas
    gradient_bytes: float      # bytes one all-reduce moved in the run, in its allreduce_dtype
    source: str                # which fields it came from
    device_kind: str = ""      # the run's devices: GPU, or CPU-simulated
    given: bool = False        # compute given by the user (--compute-ms), not measured in the run
    accumulate: int = 1        # the run's micro-batches per optimizer step (its step's compute is this many)
    allreduce_dtype: str = "float32"  # the dtype its gradient_bytes were moved in
    allreduce_packs: int = 1   # the packs it all-reduced them in

    @property
    def label(self) -> str:
        """Where the compute figure comes from, for every forecast made with it."""
        if self.given:
            return f"compute {self.compute_s * 1e3:.3g} ms/step given (--compute-ms)"
        if self.accumulate > 1:
            return (f"compute {self.compute_s * 1e3:.3g} ms per micro-step measured on "
                    f"{self.device_kind or 'unknown devices'} ({self.source} / accumulate {self.accumulate})")
        return f"compute {self.compute_s * 1e3:.3g} ms/step measured on {self.device_kind or 'unknown devices'} ({self.source})"

    def compute_at(self, replicas: int, per_replica_batch: float, devices: str, accumulate: int = 1) -> float:
        """Compute of one optimizer step of ``accumulate`` micro-steps at ``per_replica_batch`` on ``replicas``."""
        if devices == "shared":
            # One pool of cores does every replica's work: time follows the examples per step.
            micro = self.compute_s * (replicas * per_replica_batch) / (self.replicas * self.per_replica_batch)
        else:
            micro = self.compute_s * per_replica_batch / self.per_replica_batch
        return accumulate * micro

    def gradient_bytes_in(self, dtype: str | None = None) -> float:
        """Bytes one all-reduce moves in ``dtype`` (default: the run's): the run's bytes, per element converted."""
        dtype = dtype or self.allreduce_dtype
        return self.gradient_bytes / DTYPE_BYTES[self.allreduce_dtype] * DTYPE_BYTES[dtype]


def _finite(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


def calibrate(run_dir, compute_ms: float | None = None) -> Calibration:
    """Compute time, batch and gradient size from RUN_DIR/summary.json; says which fields are missing.
    ``compute_ms``: the step's compute in ms at the run's per-replica batch on one GPU, given instead."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise RunDirError(f"{run_dir} has no summary.json; give a run directory written by `tftoolkit train`")
    return calibrate_summary(summary.read(path), str(path), compute_ms)


def gpu_forecast_refusal(cal: Calibration, devices: str) -> str | None:
    """Why GPUs cannot be forecast from ``cal``, or None: compute measured on CPU-simulated replicas says nothing of
    a GPU's step time, which is far shorter, so communication would weigh much more than it predicts."""
    if devices != "dedicated" or cal.given or cal.device_kind == "GPU":
        return None
    step = "micro-step" if cal.accumulate > 1 else "step"
    return (f"this run's compute ({cal.compute_s * 1e3:.3g} ms per {step}) was measured on {cal.device_kind or 'non-GPU'} "
            "replicas; a GPU computes that step far faster, so a GPU forecast from it would understate how much "
            "communication costs. Give --compute-ms (one GPU's compute of one step at this per-replica batch), a run "
            "measured on a GPU, or --devices shared to model the simulated replicas themselves")


def _what(s: dict, key: str) -> str:
    return key if key not in s else f"{key} (it is {s[key]!r})"


def exchange_of(s: dict, where: str = "summary") -> tuple[int, str, int]:
    """(accumulate, allreduce_dtype, allreduce_packs) of a run's summary; a run written before they existed
    ran 1 micro-batch per step, all-reduced float32 in one pack."""
    k, dtype, packs = (s.get("accumulate"), s.get("allreduce_dtype"), s.get("allreduce_packs"))
    k = 1 if k is None else k
    dtype = "float32" if dtype is None else dtype
    packs = 1 if packs is None else packs
    bad = [f"{name} (it is {v!r})" for name, v in (("accumulate", k), ("allreduce_packs", packs))
           if not (_finite(v) and v >= 1 and v == int(v))]
    if dtype not in DTYPE_BYTES:
        bad.append(f"allreduce_dtype (it is {dtype!r}; one of {', '.join(DTYPE_BYTES)})")
    if bad:
        raise RunDirError(f"{where} has unreadable field(s): {', '.join(bad)}")
    return int(k), str(dtype), int(packs)


def calibrate_summary(s: dict, where: str = "summary", compute_ms: float | None = None) -> Calibration:
    """The calibration from a summary. ``compute_ms``: one GPU's compute of one forward/backward pass at the run's
    per-replica batch (one micro-batch's, with accumulation), in ms, instead of the run's own."""
    accumulate, dtype, packs = exchange_of(s, where)
    if compute_ms is not None:
        if not (_finite(compute_ms) and compute_ms > 0):
            raise ConfigError(f"--compute-ms must be a number of milliseconds > 0, got {compute_ms!r}")
        # Given per micro-step: scaled up to the run's step here, divided back into a micro-step below.
        s = {**s, "compute_time_s": compute_ms / 1e3 * accumulate, "step_time_s": None}
    missing = [_what(s, k) for k in ("replicas", "per_replica_batch") if not _finite(s.get(k))]
    if not (_finite(s.get("gradient_bytes")) or _finite(s.get("params"))):
        missing.append("gradient_bytes (or params)")
    replicas = s.get("replicas")
    if _finite(s.get("step_time_s")) and replicas == 1:
        # The median over every timed training step: steadier than compute_time_s, which --measure takes from
        # a few extra loops (and one replica has no all-reduce to take out).
        compute, source = float(s["step_time_s"]), "step_time_s (one replica: no all-reduce in it)"
    elif _finite(s.get("compute_time_s")) and s["compute_time_s"] > 0:
        compute = on_training_clock(s, "compute_time_s")
        source = ("compute_time_s (its share of the step it was timed beside x step_time_s)"
                  if compute != s["compute_time_s"] else "compute_time_s")
    else:
        compute, source = math.nan, ""
        if _finite(replicas) and replicas > 1:
            missing.append(_what(s, "compute_time_s") + " (train with --measure)")
        else:
            missing.append(f"{_what(s, 'compute_time_s')} or {_what(s, 'step_time_s')} (a finite step time needs "
                           "more steps than --timing-warmup-steps)")
    if missing:
        raise RunDirError(f"{where} lacks field(s) the prediction needs: {', '.join(missing)}")
    grad_bytes = (float(s["gradient_bytes"]) if _finite(s.get("gradient_bytes"))
                  else float(s["params"]) * DTYPE_BYTES[dtype])
    # The run's step and compute times are per optimizer step: K micro-steps of the per-replica batch.
    return Calibration(compute / accumulate, float(s["per_replica_batch"]), int(replicas), grad_bytes, source,
                       str(s.get("device_kind") or ""), compute_ms is not None, accumulate, dtype, packs)


def fit_link(frame: pd.DataFrame, impl: str | None = None, name: str | None = None,
             algorithm: str = "ring") -> tuple[Link, dict]:
    """(α, B) of the ring (or star) model fitted to ``allreduce.csv`` rows by least squares on relative error.

    Ring: t = α·2(N−1) + (1/B)·2(N−1)/N·S; star: t = α·2(N−1) + (1/B)·2(N−1)·S; over every usable row (status ok, N > 1, finite time; single buffers
    when the table has them) of one implementation (``impl``, default: the one with the highest median busbw). Returns the link and a dict
    with the fit's rows and its median absolute relative error.
    """
    need = ["impl", "replicas", "size_bytes", "time_s"]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise DataError(f"allreduce.csv lacks column(s) {', '.join(missing)}; write it with `tftoolkit bench allreduce`")
    df = frame.copy()
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") == "ok"]
    if "payload" in df.columns and (df["payload"] == "buffer").any():
        # One buffer per size: the S/B + alpha shape. A model's gradient set (payload grads:NAME) adds a cost
        # per tensor that the model does not have; compare it with the prediction instead (check_gradient_sets).
        df = df[df["payload"] == "buffer"]
    df = df[(pd.to_numeric(df["replicas"], errors="coerce") > 1)]
    df = df[np.isfinite(pd.to_numeric(df["time_s"], errors="coerce")) & (pd.to_numeric(df["size_bytes"], errors="coerce") > 0)]
    if df.empty:
        raise DataError("allreduce.csv has no usable rows (status ok, replicas > 1, a finite time)")
    if impl is None:
        busbw = df["busbw_GBps"] if "busbw_GBps" in df.columns else df["size_bytes"] / df["time_s"]
        impl = str(df.assign(_b=busbw).groupby("impl")["_b"].median().idxmax())
    df = df[df["impl"] == impl]
    if df.empty:
        raise DataError(f"allreduce.csv has no usable rows for implementation {impl!r}")
    n = df["replicas"].astype(float).to_numpy()
    size = df["size_bytes"].astype(float).to_numpy()
    t = df["time_s"].astype(float).to_numpy()
    cost = _algorithm(algorithm)
    factor = 2 * (n - 1) / n if algorithm == "ring" else 2 * (n - 1)
    a = np.column_stack([2 * (n - 1), factor * size]) / t[:, None]  # rows scaled by 1/t: relative error
    coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha, inv_b = float(coef[0]), float(coef[1])
    if inv_b <= 0:
        raise DataError(f"allreduce.csv ({impl}): time does not grow with size, so no bandwidth can be fitted; "
                        "include larger sizes (e.g. --sizes 64KiB..64MiB)")
    alpha = max(alpha, 0.0)
    link = Link(name or f"measured:{impl}", 1.0 / inv_b / 1e9, alpha * 1e6,
                f"{algorithm} model fitted to allreduce.csv ({impl})")
    fitted = np.array([cost(s_, int(n_), link) for s_, n_ in zip(size, n)])
    err = fitted / t - 1
    return link, {"impl": impl, "algorithm": algorithm, "rows": int(len(t)), "replicas": sorted({int(x) for x in n}),
                  "median_abs_rel_error": float(np.median(np.abs(err))), "max_abs_rel_error": float(np.abs(err).max())}


def check_gradient_sets(frame: pd.DataFrame, link: Link, algorithm: str = "ring") -> pd.DataFrame:
    """The ring model against the timed all-reduce of real models' gradient sets (``payload`` grads:NAME rows
    of allreduce.csv): predicted time from their total bytes, and the relative error."""
    if "payload" not in frame.columns:
        return pd.DataFrame()
    df = frame[frame["payload"].astype(str).str.startswith("grads:")]
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") == "ok"]
    df = df[["impl", "replicas", "payload", "tensors", "size_bytes", "time_s"]].copy()
    cost = _algorithm(algorithm)
    df["predicted_s"] = [cost(float(s_), int(n), link) for s_, n in zip(df["size_bytes"], df["replicas"])]
    df["error"] = df["predicted_s"] / df["time_s"] - 1
    return df.reset_index(drop=True)


def read_allreduce_csvs(paths) -> pd.DataFrame:
    frames = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "allreduce.csv"
        if not p.exists():
            raise DataError(f"{p} does not exist; write it with `tftoolkit bench allreduce --out DIR`")
        frames.append(pd.read_csv(p))
    return pd.concat(frames, ignore_index=True)


# --- prediction tables -------------------------------------------------------------------------------------
def layouts(max_replicas: int, gpus_per_host: int) -> list[tuple[int, int]]:
    """(hosts, GPUs per host): 1..G GPUs on one host, then whole hosts of G GPUs up to ``max_replicas``."""
    if max_replicas < 1 or gpus_per_host < 1:
        raise ConfigError(f"max replicas and GPUs per host must be >= 1, got {max_replicas} and {gpus_per_host}")
    out = [(1, g) for g in range(1, min(gpus_per_host, max_replicas) + 1)]
    out += [(h, gpus_per_host) for h in range(2, max_replicas // gpus_per_host + 1)]
    return out


@dataclass(frozen=True)
class ExchangeModel:
    """How a forecast optimizer step runs: ``accumulate`` micro-steps, then one all-reduce of the gradients in
    ``dtype``, in ``packs``; ``overlap`` the fraction of it hidden behind the backward pass, or None: modelled."""
    accumulate: int = 1
    dtype: str = "float32"
    packs: int = 1
    overlap: float | None = None

    @property
    def modelled(self) -> bool:
        """Whether the hidden part is the packs' model (not a fraction given with --overlap)."""
        return self.overlap is None and self.packs > 1 and self.accumulate == 1

    def hidden(self, allreduce_s: float, micro_compute_s: float) -> float:
        # Only the last micro-batch's backward pass can run beside the all-reduce; with accumulation this
        # toolkit's step all-reduces after the micro-batch loop, so the packs' model hides nothing there.
        if self.overlap is None and self.accumulate > 1:
            return 0.0
        return hidden_time(allreduce_s, BACKWARD_SHARE * micro_compute_s, self.overlap, self.packs)

    @property
    def note(self) -> str:
        """How the hidden part is found, for prediction.json and the printed forecast."""
        if self.overlap is not None:
            return (f"given (--overlap {self.overlap:g}): that fraction of the all-reduce is hidden, at most the "
                    "backward pass (2/3 of one micro-step's compute)")
        if self.modelled:
            return (f"modelled, not measured here: {self.packs} packs of equal bytes, last layers first; the first "
                    f"{self.packs - 1} go while the backward pass runs, the last after it: hidden = "
                    f"{self.packs - 1}/{self.packs} x min(all-reduce, backward pass = 2/3 of the compute)")
        if self.accumulate > 1:
            return ("none: with accumulation the step all-reduces after its loop over the micro-batches (give "
                    "--overlap for a step that overlaps the last micro-batch's backward pass)")
        return "none: one all-reduce after the whole backward pass (give --allreduce-packs or --overlap to model one)"


def exchange(cal: Calibration, allreduce_dtype: str | None = None, packs: int | None = None,
             accumulate: int | None = None, overlap: float | None = None) -> ExchangeModel:
    """The forecast's ExchangeModel: each of dtype, packs and accumulate as asked, or the calibration run's."""
    dtype = cal.allreduce_dtype if allreduce_dtype is None else allreduce_dtype
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--allreduce-dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    packs = cal.allreduce_packs if packs is None else packs
    accumulate = cal.accumulate if accumulate is None else accumulate
    for flag, v in (("--allreduce-packs", packs), ("--accumulate", accumulate)):
        if not (whole_number(v) and v >= 1):
            raise ConfigError(f"{flag} must be a whole number >= 1, got {v!r}")
    if overlap is not None and not (_finite(overlap) and 0.0 <= overlap <= 1.0):
        raise ConfigError(f"--overlap is a fraction of the all-reduce in [0, 1], got {overlap}")
    return ExchangeModel(accumulate, dtype, packs, None if overlap is None else float(overlap))


def step_parts(cal: Calibration, hosts: int, gpus_per_host: int, per_replica_batch: float, intra: Link,
               inter: Link | None = None, ex: ExchangeModel = ExchangeModel(), *, devices: str = "dedicated",
               nics_per_host: int = 1, algorithm: str = "ring") -> dict:
    """One optimizer step on ``hosts`` x ``gpus_per_host`` GPUs: its compute (K micro-steps), all-reduce, hidden
    part and step time, and the bytes one all-reduce moves."""
    n = hosts * gpus_per_host
    micro = cal.compute_at(n, per_replica_batch, devices)
    size = cal.gradient_bytes_in(ex.dtype)
    comm = allreduce_time(size, gpus_per_host, hosts, intra, inter, nics_per_host, algorithm, ex.packs)
    hidden = ex.hidden(comm, micro)
    compute = ex.accumulate * micro
    return {"compute_s": compute, "allreduce_s": comm, "hidden_s": hidden, "step_time_s": compute + comm - hidden,
            "gradient_bytes": size}


def predict(cal: Calibration, intra: Link, inter: Link | None = None, *, mode: str = "weak",
            devices: str = "dedicated", overlap: float | None = None, max_replicas: int = DEFAULT_MAX_REPLICAS,
            gpus_per_host: int = DEFAULT_GPUS_PER_HOST, nics_per_host: int = 1,
            global_batch: float | None = None, algorithm: str = "ring", allreduce_dtype: str | None = None,
            allreduce_packs: int | None = None, accumulate: int | None = None) -> pd.DataFrame:
    """One row per (hosts, GPUs per host): compute, all-reduce and step time, throughput, speedup, efficiency.

    Weak scaling keeps the calibration's per-replica batch; strong scaling keeps ``global_batch`` (default:
    the calibration run's, per-replica batch × replicas × accumulate) and divides it among the replicas and the
    micro-batches. ``allreduce_dtype``, ``allreduce_packs`` and ``accumulate`` default to the run's (exchange).
    """
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if devices not in DEVICES:
        raise ConfigError(f"devices must be one of {', '.join(DEVICES)}, got {devices!r}")
    if nics_per_host < 1:
        raise ConfigError(f"nics_per_host must be >= 1, got {nics_per_host}")
    ex = exchange(cal, allreduce_dtype, allreduce_packs, accumulate, overlap)
    k = ex.accumulate
    gb = float(global_batch) if global_batch else cal.per_replica_batch * cal.replicas * cal.accumulate
    rows = []
    for hosts, g in layouts(max_replicas, gpus_per_host):
        n = hosts * g
        b = cal.per_replica_batch if mode == "weak" else gb / (n * k)
        if b < 1:
            continue
        part = step_parts(cal, hosts, g, b, intra, inter, ex, devices=devices, nics_per_host=nics_per_host,
                          algorithm=algorithm)
        rows.append({"scenario": intra.name + (f" + {inter.name}" if inter is not None else ""),
                     "intra": intra.name, "inter": inter.name if inter is not None else "", "hosts": hosts,
                     "gpus_per_host": g, "replicas": n, "per_replica_batch": b, "accumulate": k,
                     "global_batch": b * n * k, "allreduce_dtype": ex.dtype, "allreduce_packs": ex.packs,
                     "gradient_bytes": part["gradient_bytes"], "compute_s": part["compute_s"],
                     "allreduce_s": part["allreduce_s"], "hidden_s": part["hidden_s"],
                     "step_time_s": part["step_time_s"], "images_per_sec": b * n * k / part["step_time_s"],
                     "comm_exceeds_compute": part["allreduce_s"] > part["compute_s"]})
    df = pd.DataFrame(rows)
    base = df.loc[df["replicas"] == 1, "images_per_sec"]
    base = float(base.iloc[0]) if len(base) else math.nan
    df["speedup"] = df["images_per_sec"] / base
    df["efficiency"] = df["speedup"] / df["replicas"]
    return df


def crossover(frame: pd.DataFrame) -> dict:
    """Per scenario: the smallest replica count where the all-reduce takes longer than the compute."""
    out = {}
    for name, g in frame.groupby("scenario", sort=False):
        over = g[g["comm_exceeds_compute"]]
        out[name] = int(over["replicas"].min()) if len(over) else None
    return out


# --- where a host's input becomes the limit ------------------------------------------------------------------
# The summary fields the input limit is made from (issue 23: every run measures its input capacity).
INPUT_READS = summary.names("input_capacity_per_core", "input_cores", "workers", "data_service")
NOT_MEASURED = "input capacity not measured in this run"


@dataclass(frozen=True)
class InputHost:
    """What feeds the GPUs: every GPU host has ``cores`` cores whose input delivers ``per_core`` images/s each, and a
    tf.data service worker is a host like it (the same cores, the same rate per core)."""
    per_core: float   # images/s one core's input delivers (the run's input_capacity_per_core)
    cores: int        # cores of each GPU host, and of each tf.data service worker host
    cores_from: str   # where ``cores`` came from, for every figure made with it

    @property
    def capacity(self) -> float:
        return self.per_core * self.cores


def input_host(s: dict, host_cores: int | None = None) -> tuple[InputHost | None, str]:
    """(the run's input host, "") from its summary, or (None, why not). ``host_cores``: ask about a host with that
    many cores instead of the run's own (input_cores x workers)."""
    if host_cores is not None and not (isinstance(host_cores, int) and not isinstance(host_cores, bool)
                                       and host_cores >= 1):
        raise ConfigError(f"--host-cores must be a whole number of cores >= 1, got {host_cores!r}")
    per_core = s.get("input_capacity_per_core")
    if not (_finite(per_core) and per_core > 0):
        return None, NOT_MEASURED
    if s.get("data_service"):
        # The capacity came through tf.data service workers, whose cores input_cores does not count: it is not a
        # rate per core of this host.
        return None, ("input capacity measured through a tf.data service: not a rate per core of this host (measure "
                      "a run without --data-service)")
    # On CPU-simulated replicas the per-core rate is still a planning figure: the probe pulled the input alone
    # after training, with the cores to itself, so it did not share them with the simulated replicas' compute.
    if host_cores is not None:
        return InputHost(float(per_core), host_cores, "--host-cores"), ""
    cores, workers = s.get("input_cores"), s.get("workers") or 1
    if not (_finite(cores) and cores >= 1 and _finite(workers) and workers >= 1):
        return None, "the run does not say how many cores its input had (input_cores); give --host-cores"
    n = int(cores) * int(workers)
    return InputHost(float(per_core), n, f"this run's host: input_cores {int(cores)} x {int(workers)} worker(s)"), ""


def _ceil(x: float) -> int:
    # A rate that is a whole multiple of the per-core rate (1200 / 100 = 12) must not round up on float noise.
    return max(0, int(math.ceil(x * (1 - 1e-9))))


def add_input_limit(frame: pd.DataFrame, host: InputHost, gpus_per_host: int) -> pd.DataFrame:
    """Per GPU count (a frame with ``replicas`` and predicted ``images_per_sec``): the input capacity of its hosts,
    whether the GPUs would consume more than that, the cores per host whose input would keep up, and the tf.data
    service workers (hosts like ``host``) that would add the rest. Past one host every GPU host is like ``host``
    and feeds its own GPUs, as layouts() lays them out."""
    out = frame.copy()
    hosts = np.ceil(out["replicas"].astype(float) / gpus_per_host)
    ips = out["images_per_sec"].astype(float)
    out["input_capacity_images_per_sec"] = host.capacity * hosts
    out["input_limited"] = ips > out["input_capacity_images_per_sec"]
    out["input_cores_needed_per_host"] = [_ceil(v / h / host.per_core) for v, h in zip(ips, hosts)]
    out["input_service_workers_needed"] = [_ceil((v - c) / host.capacity)
                                           for v, c in zip(ips, out["input_capacity_images_per_sec"])]
    return out


def _needs(r) -> dict:
    return {"replicas": int(r["replicas"]), "images_per_sec": float(r["images_per_sec"]),
            "input_capacity_images_per_sec": float(r["input_capacity_images_per_sec"]),
            "cores_needed_per_host": int(r["input_cores_needed_per_host"]),
            "service_workers_needed": int(r["input_service_workers_needed"])}


def input_limit(frame: pd.DataFrame, host: InputHost) -> dict:
    """The first GPU count whose predicted images/sec exceed the input capacity (None: input keeps up everywhere),
    what it and the largest count considered need, and a sentence saying so. ``frame``: add_input_limit's, of one
    scenario."""
    g = frame.sort_values("replicas")
    limited = g[g["input_limited"]]
    first = _needs(limited.iloc[0]) if len(limited) else None
    largest = _needs(g.iloc[-1])
    # Where the GPUs come closest to the input's capacity: past one host, each host's GPUs consume less (the
    # all-reduce between hosts slows the step), so that is not always the largest count.
    closest = _needs(g.loc[(g["images_per_sec"] / g["input_capacity_images_per_sec"]).idxmax()])
    return {"limit_replicas": first["replicas"] if first else None, "at_limit": first, "at_largest": largest,
            "note": _limit_note(first, largest, closest, host)}


def _lift(n: dict, host: InputHost) -> str:
    k = n["service_workers_needed"]
    return (f"{n['cores_needed_per_host']} cores per host would feed them, or {k} more host{'s' if k != 1 else ''} "
            f"of {host.cores} cores as tf.data service workers")


def _limit_note(first: dict | None, largest: dict, closest: dict, host: InputHost) -> str:
    if first is None:
        return (f"input keeps up to {largest['replicas']} GPUs: at its closest, {closest['replicas']} GPUs would "
                f"consume {closest['images_per_sec']:,.0f} images/s of the "
                f"{closest['input_capacity_images_per_sec']:,.0f} the input delivers")
    text = (f"input becomes the limit at {first['replicas']} GPUs: they would consume {first['images_per_sec']:,.0f} "
            f"images/s, the input delivers {first['input_capacity_images_per_sec']:,.0f}; {_lift(first, host)}")
    if largest["replicas"] != first["replicas"]:
        text += (f"; at {largest['replicas']} GPUs ({largest['images_per_sec']:,.0f} images/s) "
                 f"{_lift(largest, host)}")
    return text


def host_fields(host: InputHost) -> dict:
    """The input host's figures, as advice.json and prediction.json hold them (``input_limit``)."""
    return {"forecast": True, "per_core_images_per_sec": host.per_core, "host_cores": host.cores,
            "host_cores_from": host.cores_from, "host_capacity_images_per_sec": host.capacity,
            "service_worker_cores": host.cores}


def input_lines(il: dict | None) -> list[str]:
    """The lines describe() prints for an ``input_limit`` (advice.json's or prediction.json's)."""
    if not il:
        return []
    lines = []
    if "per_core_images_per_sec" in il:
        lines.append(f"input: {il['per_core_images_per_sec']:,.0f} images/s per core x {il['host_cores']} cores "
                     f"({il['host_cores_from']}) = {il['host_capacity_images_per_sec']:,.0f} images/s per host")
    if not il.get("forecast"):
        return lines + [f"input limit: {il['why']}"]
    if "scenarios" in il:
        return lines + [f"{name}: {r['note']}" for name, r in il["scenarios"].items()]
    return lines + [f"input limit ({il['throughput_model']}): {il['note']}"]


def _with_input_limit(frame: pd.DataFrame, host: InputHost | None, why: str, devices: str,
                      gpus_per_host: int) -> tuple[pd.DataFrame, dict]:
    """The forecast with the input columns added (add_input_limit) and prediction.json's ``input_limit``."""
    if host is None:
        return frame, {"forecast": False, "why": why}
    if devices == "shared":
        return frame, {**host_fields(host), "forecast": False,
                       "why": "not forecast for --devices shared: the replicas and the input share the same cores (the "
                              "run's input_headroom says what share of their time the input needed)"}
    frame = add_input_limit(frame, host, gpus_per_host)
    return frame, {**host_fields(host), "scenarios": {name: input_limit(g, host)
                                                      for name, g in frame.groupby("scenario", sort=False)}}


# --- checking the model against measured runs --------------------------------------------------------------
def measured_frame(sources) -> pd.DataFrame:
    """Measured step times from run directories (summary.json) or CSV tables with ``replicas`` and
    ``step_time_s`` (or ``images_per_sec`` and ``global_batch``) columns, e.g. scaling.csv; each with the
    ``accumulate``, ``allreduce_dtype`` and ``allreduce_packs`` it ran with (1, float32, 1 where not recorded)."""

    rows = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            if not (p / "summary.json").exists():
                raise RunDirError(f"{p} has no summary.json")
            s = summary.read(p)
            missing = [k for k in ("replicas", "per_replica_batch", "step_time_s") if not _finite(s.get(k))]
            if missing:
                raise RunDirError(f"{p}/summary.json lacks field(s) {', '.join(missing)}")
            ips, ips_err = s.get("images_per_sec"), s.get("images_per_sec_uncertainty")
            rel = ips_err / ips if _finite(ips) and _finite(ips_err) and ips > 0 else math.nan
            k, dtype, packs = exchange_of(s, f"{p}/summary.json")
            rows.append({"source": str(p), "replicas": int(s["replicas"]), "per_replica_batch": s["per_replica_batch"],
                         "accumulate": k, "allreduce_dtype": dtype, "allreduce_packs": packs,
                         "step_time_s": s["step_time_s"], "step_time_uncertainty_s": s["step_time_s"] * rel,
                         "compute_time_s": s.get("compute_time_s", math.nan),
                         "allreduce_time_s": s.get("allreduce_time_s", math.nan)})
        elif p.suffix == ".csv" and p.exists():
            df = pd.read_csv(p)
            if "step_time_s" not in df.columns:
                if not {"images_per_sec", "global_batch"} <= set(df.columns):
                    raise DataError(f"{p} needs columns replicas and step_time_s (or images_per_sec and global_batch)")
                df["step_time_s"] = df["global_batch"] / df["images_per_sec"]
            defaults = {"accumulate": 1, "allreduce_dtype": "float32", "allreduce_packs": 1}
            for col, v in defaults.items():
                df[col] = df[col].fillna(v) if col in df.columns else v
            if "per_replica_batch" not in df.columns:
                df["per_replica_batch"] = df["global_batch"] / (df["replicas"] * df["accumulate"])
            for _, r in df.iterrows():
                k, dtype, packs = exchange_of({c: r[c] for c in defaults}, str(p))
                rows.append({"source": str(p), "replicas": int(r["replicas"]), "per_replica_batch": r["per_replica_batch"],
                             "accumulate": k, "allreduce_dtype": dtype, "allreduce_packs": packs,
                             "step_time_s": r["step_time_s"], "step_time_uncertainty_s": math.nan,
                             "compute_time_s": r.get("compute_time_s", math.nan),
                             "allreduce_time_s": r.get("allreduce_time_s", math.nan)})
        else:
            raise DataError(f"{p}: expected a run directory or a .csv table")
    return pd.DataFrame(rows)


def compare(cal: Calibration, link: Link, measured: pd.DataFrame, devices: str = "dedicated",
            overlap: float | None = None, algorithm: str = "ring") -> pd.DataFrame:
    """Predicted vs measured step time at each measured replica count (single host, ``link``), each run modelled
    with the accumulation, all-reduce dtype and packs it ran with (measured_frame's columns; the calibration's
    where a frame lacks them)."""
    out = measured.copy()
    parts = []
    for _, r in out.iterrows():
        ex = exchange(cal, r.get("allreduce_dtype"), _int_or_none(r.get("allreduce_packs")),
                      _int_or_none(r.get("accumulate")), overlap)
        parts.append(step_parts(cal, 1, int(r["replicas"]), float(r["per_replica_batch"]), link, None, ex,
                                devices=devices, algorithm=algorithm))
    out["predicted_compute_s"] = [x["compute_s"] for x in parts]
    out["predicted_allreduce_s"] = [x["allreduce_s"] for x in parts]
    out["predicted_step_time_s"] = [x["step_time_s"] for x in parts]
    out["error"] = out["predicted_step_time_s"] / out["step_time_s"] - 1
    return out


def _int_or_none(v):
    return int(v) if _finite(v) or isinstance(v, np.integer) else None


# --- the command ---------------------------------------------------------------------------------------------
def run(run_dir, out=None, *, interconnects=None, inter_host="ib200", allreduce_csv=None, impl=None,
        mode="weak", devices="dedicated", overlap: float | None = None, max_replicas=DEFAULT_MAX_REPLICAS,
        gpus_per_host=DEFAULT_GPUS_PER_HOST, nics_per_host=1, measured=None, algorithm="ring",
        figures=True, compute_ms: float | None = None, on_refusal: str = "raise", host_cores: int | None = None,
        allreduce_dtype: str | None = None, allreduce_packs: int | None = None, accumulate: int | None = None) -> dict:
    """``tftoolkit predict``: prediction.csv, prediction.json and figures in ``out`` (default: RUN_DIR).

    A GPU forecast from compute measured on CPU-simulated replicas is refused (gpu_forecast_refusal) unless
    ``compute_ms`` gives the compute: a ConfigError, or with ``on_refusal="report"`` (a notebook) a result that
    says why and holds no forecast. Every forecast carries where its compute figure came from, and when it covers
    the run's own replica count, the run's measured point beside it. It also says at which GPU count the input of
    hosts like the run's (or of ``host_cores`` cores) becomes the limit: ``input_limit``, and the frame's input
    columns (add_input_limit). ``allreduce_dtype``, ``allreduce_packs`` and ``accumulate`` (default: the run's) set
    how each forecast step exchanges its gradients (ExchangeModel); without ``overlap`` the packs' overlap is modelled,
    and prediction.json says so (``overlap_model``)."""
    from .. import fileio

    cal = calibrate(run_dir, compute_ms)
    ex = exchange(cal, allreduce_dtype, allreduce_packs, accumulate, overlap)
    host, why = input_host(summary.read(Path(run_dir) / "summary.json"), host_cores)
    refusal = gpu_forecast_refusal(cal, devices)
    if refusal:
        if on_refusal != "report":
            raise ConfigError(refusal)
        frame = pd.DataFrame(columns=["scenario", "replicas", "efficiency", "speedup", "comm_exceeds_compute"])
        frame.attrs["why"] = refusal
        result = {"run_dir": str(run_dir), "refused": refusal, "calibration": {"source": cal.label}, "frame": frame,
                  "comparison_frame": None}
        out = Path(out) if out is not None else Path(run_dir)
        fileio.write_json(out / "prediction.json", {k: v for k, v in result.items() if "frame" not in k})
        if figures:
            from ..plots import predict as pplots
            from ..plots.theme import save_figure

            save_figure(pplots.efficiency(frame), out, "efficiency_vs_replicas", formats=("png",))
        return result
    links: list[Link] = []
    fit = None
    if allreduce_csv:
        link, fit = fit_link(read_allreduce_csvs(allreduce_csv), impl, algorithm=algorithm)
        links.append(link)
    names = interconnects if interconnects is not None else ([] if allreduce_csv else list(INTRA_PRESETS))
    if isinstance(names, str):
        names = [x for x in names.split(",") if x.strip()]
    links += [parse_link(x) for x in names]
    if not links:
        raise ConfigError("no interconnect to predict for; give --interconnect and/or --allreduce-csv")
    inter = parse_link(inter_host) if inter_host else None
    if max_replicas > gpus_per_host and inter is None:
        raise ConfigError(f"--max-replicas {max_replicas} spans several hosts of {gpus_per_host} GPUs; give --inter-host")
    frame = pd.concat([predict(cal, link, inter, mode=mode, devices=devices, overlap=overlap, max_replicas=max_replicas,
                               gpus_per_host=gpus_per_host, nics_per_host=nics_per_host, algorithm=algorithm,
                               allreduce_dtype=ex.dtype, allreduce_packs=ex.packs, accumulate=ex.accumulate)
                       for link in links],
                      ignore_index=True)
    frame, input_fields = _with_input_limit(frame, host, why, devices, gpus_per_host)
    result = {
        "run_dir": str(run_dir), "mode": mode, "devices": devices, "overlap": overlap, "gpus_per_host": gpus_per_host,
        "nics_per_host": nics_per_host, "max_replicas": max_replicas, "algorithm": algorithm,
        "accumulate": ex.accumulate, "allreduce_dtype": ex.dtype, "allreduce_packs": ex.packs,
        "gradient_bytes": cal.gradient_bytes_in(ex.dtype),
        "overlap_model": ex.note, "overlap_modelled": ex.modelled,
        "calibration": {"compute_s": cal.compute_s, "per_replica_batch": cal.per_replica_batch,
                        "replicas": cal.replicas, "gradient_bytes": cal.gradient_bytes, "source": cal.label,
                        "device_kind": cal.device_kind, "given": cal.given, "accumulate": cal.accumulate,
                        "allreduce_dtype": cal.allreduce_dtype, "allreduce_packs": cal.allreduce_packs},
        "measured_point": measured_point(run_dir, frame, ex),
        "links": {lk.name: {"bandwidth_GBps": lk.bandwidth_GBps, "latency_us": lk.latency_us, "source": lk.source}
                  for lk in links + ([inter] if inter is not None else [])},
        "allreduce_fit": fit,
        "crossover_replicas": crossover(frame),
        "input_limit": input_fields,
        "model": "t = K*micro_compute + P*[2(G-1)/G*S/(P*B_intra) + 2(G-1)*alpha_intra + 2(H-1)/H*S/(P*nics*B_inter) "
                 "+ 2(H-1)*alpha_inter] - hidden; hidden = min(overlap*allreduce, 2/3*micro_compute) with --overlap, "
                 "else (P-1)/P*min(allreduce, 2/3*micro_compute) for K = 1 (modelled, not measured), 0 for K > 1",
    }
    comparison = None
    if measured:
        comparison = compare(cal, links[0], measured_frame(measured), devices, overlap, algorithm)
        result["comparison"] = {"link": links[0].name,
                                "median_abs_error": float(comparison["error"].abs().median()),
                                "max_abs_error": float(comparison["error"].abs().max())}
    out = Path(out) if out is not None else Path(run_dir)
    fileio.write_csv(out / "prediction.csv", frame)
    if comparison is not None:
        fileio.write_csv(out / "prediction_vs_measured.csv", comparison)
    fileio.write_json(out / "prediction.json", result)
    if figures:
        from ..plots import predict as pplots
        from ..plots.theme import save_figure

        save_figure(pplots.efficiency(frame), out, "efficiency_vs_replicas", formats=("png",))
        if comparison is not None:
            save_figure(pplots.predicted_vs_measured(comparison), out, "predicted_vs_measured", formats=("png",))
    result["frame"] = frame
    result["comparison_frame"] = comparison
    return result


def measured_point(run_dir, frame: pd.DataFrame, ex: ExchangeModel | None = None) -> dict | None:
    """The run's own measurement beside the forecast at its replica count (each scenario's predicted step time and
    communication fraction, and their error), when the forecast covers it with the run's own accumulation and
    all-reduce (``ex``: the forecast's); None when it does not."""
    s = summary.read(Path(run_dir) / "summary.json")
    n = s.get("replicas")
    measured = (on_training_clock(s, "step_time_no_input_s") if _finite(s.get("step_time_no_input_s"))
                else s.get("step_time_s"))
    if not (_finite(n) and _finite(measured)) or frame.empty or n not in set(frame["replicas"]):
        return None
    if ex is not None and (ex.accumulate, ex.dtype, ex.packs) != exchange_of(s):
        return None
    rows = {}
    for name, g in frame[frame["replicas"] == n].groupby("scenario", sort=False):
        r = g.iloc[0]
        rows[name] = {"predicted_step_time_s": float(r["step_time_s"]),
                      "error": float(r["step_time_s"] / measured - 1),
                      "predicted_communication_fraction": float(r["allreduce_s"] / (r["allreduce_s"] + r["compute_s"]))}
    return {"replicas": int(n), "measured_step_time_s": float(measured),
            "measured_communication_fraction": s.get("communication_fraction"),
            "device_kind": s.get("device_kind"), "scenarios": rows}


def describe(result: dict) -> str:
    """The lines the CLI prints."""
    lines = []
    if result.get("refused"):
        return f"no forecast: {result['refused']}"
    frame = result["frame"]
    cal = result["calibration"]
    lines.append(f"calibration: {cal['source']} at per-replica batch {cal['per_replica_batch']:g}; gradients "
                 f"{cal['gradient_bytes'] / 1e6:.2f} MB (every forecast below rests on this compute figure)")
    if "allreduce_dtype" in result:
        k, dtype, packs = result["accumulate"], result["allreduce_dtype"], result["allreduce_packs"]
        moved = f"{result['gradient_bytes'] / 1e6:.2f} MB in {dtype}"
        if dtype != cal.get("allreduce_dtype", dtype):
            moved += f" (the run's {cal['gradient_bytes'] / 1e6:.2f} MB in {cal['allreduce_dtype']}, converted)"
        lines.append(f"step: accumulate {k} (compute {k} x one micro-step, global batch = per-replica x replicas x "
                     f"{k}), one all-reduce of {moved} in {packs} pack{'s' if packs != 1 else ''}; hidden behind the "
                     f"backward pass: {result['overlap_model']}")
    for name, g in frame.groupby("scenario", sort=False):
        pick = g[g["replicas"].isin([1, 2, 4, 8, 16, 32, 64])]
        eff = ", ".join(f"{int(r)}: {e:.0%}" for r, e in zip(pick["replicas"], pick["efficiency"]))
        cross = result["crossover_replicas"].get(name)
        where = (f"communication overtakes compute at {cross} replicas" if cross
                 else f"compute stays larger than communication up to {int(g['replicas'].max())} replicas")
        lines.append(f"{name}: efficiency {eff}; {where}")
    mp = result.get("measured_point")
    if mp:
        for name, r in mp["scenarios"].items():
            frac = mp.get("measured_communication_fraction")
            lines.append(f"measured at {mp['replicas']} replica(s) ({mp['device_kind']}): step "
                         f"{mp['measured_step_time_s'] * 1e3:.2f} ms against {name}'s {r['predicted_step_time_s'] * 1e3:.2f} ms "
                         f"({r['error']:+.0%})" + (f"; communication {frac:.0%} measured, "
                                                   f"{r['predicted_communication_fraction']:.0%} predicted"
                                                   if _finite(frac) else ""))
    if result.get("comparison"):
        c = result["comparison"]
        lines.append(f"predicted vs measured step time ({c['link']}): median |error| {c['median_abs_error']:.1%}, "
                     f"max {c['max_abs_error']:.1%}")
    return "\n".join(lines + input_lines(result.get("input_limit")))
