"""The communication model: links (presets and your own), the ring, star and hierarchical all-reduce times, the
part of an all-reduce hidden behind the backward pass, and the fit of a link to ``tftoolkit bench allreduce``'s
allreduce.csv.

On one host the ring all-reduce costs 2(N−1)/N · S/B + 2(N−1)·α (nccl-tests' bus factor; the α-β model of
Thakur, Rabenseifner & Gropp 2005, summed for a ring reduce-scatter + all-gather). Across hosts it is the
hierarchical all-reduce NCCL and Horovod use: reduce-scatter inside the host, all-reduce of each GPU's 1/G shard
between hosts, all-gather inside; the G shards leave a host over its ``nics`` NICs together, so that stage moves
S per host. ``star`` is 2(N−1)·(S/B + α): every buffer through one device, as TensorFlow's reduce_to_one does;
``hierarchical-copy`` a star in each half and an exchange between the halves (hierarchical_copy_time). The
planner (plan.py) adds the parameter server in host memory (host_transfer_time) and NCCL 1's one ring in device
order (catalogue_links.in_order_ring_link).
B is the bandwidth per direction a ring achieves (bus bandwidth), α the latency per ring step.

Link presets (bandwidth per direction in GB/s = 10^9 B/s, α in µs); the source keys are those of the hardware
reference the figures were taken from. B is what a ring achieves where a measurement is published, else the rated
figure:

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
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError
from .links import INTER_PRESETS, INTRA_PRESETS, PRESETS, Link, parse_link  # noqa: F401 - comms' names too

BACKWARD_SHARE = 2.0 / 3.0  # backward ≈ 2 × forward FLOPs: the most of a step an all-reduce can hide behind


# --- the cost model (pinned by tests/planner/test_predict.py) -----------------------------------------------------
def ring_allreduce_time(size_bytes: float, replicas: int, link: Link) -> float:
    """2(N−1)/N · S/B + 2(N−1)·α; 0 for one replica."""
    if replicas <= 1:
        return 0.0
    n = replicas
    return 2.0 * (n - 1) / n * size_bytes / link.bandwidth_Bps + 2.0 * (n - 1) * link.latency_s


def tree_allreduce_time(size_bytes: float, replicas: int, link: Link) -> float:
    """NCCL's double binary tree (NCCL 2.4 and later, NCCL_ALGO=Tree): the ring's bandwidth term with a latency
    logarithmic in N, 2(N−1)/N · S/B + 2·⌈log2 N⌉·α (NVIDIA's "Massively Scale Your Deep Learning Training with
    NCCL 2.4" blog: "full bandwidth" and "logarithmic latency"). 0 for one replica."""
    if replicas <= 1:
        return 0.0
    n = replicas
    return 2.0 * (n - 1) / n * size_bytes / link.bandwidth_Bps + 2.0 * math.ceil(math.log2(n)) * link.latency_s


def star_allreduce_time(size_bytes: float, replicas: int, link: Link) -> float:
    """2(N−1) · (S/B + α): every buffer goes to one device and the sum back to every other, one after another
    through that device (TensorFlow's reduce_to_one; what CPU replicas use). 0 for one replica."""
    if replicas <= 1:
        return 0.0
    return 2.0 * (replicas - 1) * (size_bytes / link.bandwidth_Bps + link.latency_s)


def hierarchical_copy_time(size_bytes: float, replicas: int, link: Link) -> float:
    """TensorFlow's HierarchicalCopyAllReduce (written for the DGX-1): the GPUs split in two halves of h = N/2; each
    half reduces to its main device (a star), the two mains exchange their sums, and each broadcasts back to its
    half (tensorflow/python/distribute/cross_device_utils.py, aggregate_gradients_using_hierarchical_copy): 2(h−1)·
    (S/B + α) + 2·(S/B + α). With one pack (TensorFlow's default) every byte goes through the two mains. Not checked
    against published rows: none of validation/ used it. 0 for one replica."""
    if replicas <= 1:
        return 0.0
    h = max(1, replicas // 2)
    return (2.0 * (h - 1) + 2.0) * (size_bytes / link.bandwidth_Bps + link.latency_s)


def parameter_server_time(size_bytes: float, largest_bytes: float | None, replicas: int, link: Link,
                          packs: int = 1) -> float:
    """Variables spread over the GPUs, each held whole by one GPU that sums its gradients and sends the variable
    back (tf_cnn_benchmarks' parameter_server on the GPUs): the GPU holding the most, max(largest tensor, S / N),
    receives N − 1 gradients of it and sends N − 1 copies, both directions at once over its link:
    (N − 1) · max(S_largest, S / N) / B + 2(N − 1)·α per pack. ``largest_bytes`` None: evenly spread (S / N).
    0 for one replica."""
    if replicas <= 1:
        return 0.0
    held = max(largest_bytes or 0.0, size_bytes / replicas)
    return (replicas - 1) * held / link.bandwidth_Bps + 2.0 * packs * (replicas - 1) * link.latency_s


ALGORITHMS = {"ring": ring_allreduce_time, "tree": tree_allreduce_time, "star": star_allreduce_time, "hierarchical-copy": hierarchical_copy_time}


def host_transfer_time(size_bytes: float, sharing: int, uplink: Link, packs: int = 1) -> float:
    """The variables in host memory (a parameter server on the CPU): every GPU copies S of gradients up and S of
    variables down each step over its PCIe link, and ``sharing`` GPUs share the busiest uplink to the host. One GPU
    already pays 2·S/B (a rate measured on one GPU includes it), so N GPUs add 2·(k − 1)·S/B (+ latency per pack)."""
    if sharing <= 1:
        return 0.0
    return 2.0 * (sharing - 1) * size_bytes / uplink.bandwidth_Bps + 2.0 * packs * uplink.latency_s


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



def usable_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``tftoolkit bench allreduce``'s allreduce.csv a link can be read from: status ok, more than one
    replica, a size and a finite positive time (as numbers), and single buffers when the table has them: one buffer
    per size is the S/B + alpha shape, while a model's gradient set (payload grads:NAME) adds a cost per tensor that
    the model does not have (compare it with the prediction instead: check_gradient_sets)."""
    need = ["impl", "replicas", "size_bytes", "time_s"]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise DataError(f"allreduce.csv lacks column(s) {', '.join(missing)}; write it with `tftoolkit bench allreduce`")
    df = frame.copy()
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") == "ok"]
    if "payload" in df.columns and (df["payload"] == "buffer").any():
        df = df[df["payload"] == "buffer"]
    for col in ("replicas", "size_bytes", "time_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df[(df["replicas"] > 1) & (df["size_bytes"] > 0) & np.isfinite(df["time_s"]) & (df["time_s"] > 0)]
    if df.empty:
        raise DataError("allreduce.csv has no usable rows (status ok, replicas > 1, a finite time)")
    return df


def fit_link(frame: pd.DataFrame, impl: str | None = None, name: str | None = None,
             algorithm: str = "ring") -> tuple[Link, dict]:
    """(α, B) of the ring (or star) model fitted to ``allreduce.csv`` rows by least squares on relative error.

    Ring: t = α·2(N−1) + (1/B)·2(N−1)/N·S; star: t = α·2(N−1) + (1/B)·2(N−1)·S; over every usable row (status ok, N > 1, finite time; single buffers
    when the table has them) of one implementation (``impl``, default: the one with the highest median busbw). Returns the link and a dict
    with the fit's rows and its median absolute relative error.
    """
    df = usable_rows(frame)
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
    factor = 2 * (n - 1) / n if algorithm in ("ring", "tree") else 2 * (n - 1)
    steps = 2 * np.ceil(np.log2(n)) if algorithm == "tree" else 2 * (n - 1)
    a = np.column_stack([steps, factor * size]) / t[:, None]  # rows scaled by 1/t: relative error
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


def busbw_by_replicas(frame: pd.DataFrame, impl: str | None = None) -> tuple[dict[int, float], str]:
    """({GPU count: bus bandwidth in GB/s}, implementation) from ``tftoolkit bench allreduce``'s allreduce.csv rows
    (one file per GPU count, read together): per count, the busbw (nccl-tests': algbw x 2(n-1)/n) of the largest
    buffer timed, where the bandwidth term dominates; of ``impl`` (default: the one with the highest median)."""
    df = usable_rows(frame)
    n = df["replicas"]
    df["_busbw"] = df["size_bytes"] / df["time_s"] / 1e9 * 2 * (n - 1) / n
    if impl is None:
        impl = str(df.groupby("impl")["_busbw"].median().idxmax())
    df = df[df["impl"] == impl]
    if df.empty:
        raise DataError(f"allreduce.csv has no usable rows for implementation {impl!r}")
    out = {}
    for count, g in df.groupby("replicas"):
        out[int(count)] = float(g.loc[g["size_bytes"] == g["size_bytes"].max(), "_busbw"].median())
    return out, impl


def measured_busbw(busbw: dict[int, float], replicas: int) -> tuple[float, str]:
    """(bus bandwidth for ``replicas`` GPUs, how) from measured {count: busbw}: the count's own where measured;
    between measured counts the next smaller one's; past the largest count N, where busbw fell from the count
    before it by more than 10%, the host's share C / n with C = busbw(N) x N (the GPUs share one capacity), else
    busbw(N) kept."""
    if replicas in busbw:
        return busbw[replicas], f"measured at {replicas} GPUs"
    counts = sorted(busbw)
    top = counts[-1]
    if replicas < top:
        below = [c for c in counts if c < replicas]
        c = below[-1] if below else counts[0]
        return busbw[c], f"not measured at {replicas} GPUs: taken from {c} GPUs"
    if len(counts) > 1 and busbw[top] < 0.9 * busbw[counts[-2]]:
        cap = busbw[top] * top
        return cap / replicas, (f"extrapolated from {top} GPUs: busbw fell from {busbw[counts[-2]]:.3g} to "
                                f"{busbw[top]:.3g} GB/s, so the GPUs share one capacity, {cap:.3g} GB/s / {replicas}")
    return busbw[top], f"extrapolated from {top} GPUs: busbw did not fall with the GPU count, kept"


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

