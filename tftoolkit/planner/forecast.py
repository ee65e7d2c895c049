"""The forecast tables: one optimizer step's compute, all-reduce and hidden part on hosts x GPUs (step_parts),
the table over GPU counts (predict), where communication overtakes compute (crossover), and the model against
measured runs (compare, run_point).

K micro-batches per optimizer step (``accumulate``), P packs (``allreduce_packs``), S the bytes one all-reduce
moves in its dtype (``allreduce_dtype``); each defaults to the calibration run's.

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

"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import summary
from ..config import DEFAULT_MAX_REPLICAS, DTYPE_BYTES, SCALING_MODES, whole_number
from ..errors import ConfigError
from .choices import DEVICES  # noqa: F401 - forecast's name too
from .calibration import DEFAULT_GPUS_PER_HOST, Calibration, exchange_of, finite, handwritten, on_training_clock
from .comms import BACKWARD_SHARE, Link, allreduce_time, hidden_time



@functools.cache
def expected_max(n: int) -> float:
    """E[max of n independent standard normals]: 0 for n = 1, 1/√π for 2, 3/(2√π) for 3 (numerical quadrature of
    n·x·φ(x)·Φ(x)^(n−1) on a fine grid; exact to 1e-6 for n <= 1024)."""
    if n <= 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 48_001)
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    y = n * x * pdf * cdf ** (n - 1)
    # The trapezoid rule written out as NumPy writes it (bit-equal to np.trapezoid, which the released validation
    # tables were made with): np.trapezoid is NumPy >= 2 only, TensorFlow 2.16-2.17 need NumPy < 2, and np.trapz,
    # its old name, is deprecated in 2.x.
    return float(np.add.reduce(np.diff(x) * (y[1:] + y[:-1]) / 2.0))


def straggler_factor(sigma: float, replicas: int, calibrated_at: int = 1) -> float:
    """How much longer a synchronous step's compute is on ``replicas`` dedicated devices than on
    ``calibrated_at`` (whose measured compute already waited for its own slowest): the slowest of N replicas,
    each varying by σ (coefficient of variation), is E[max of N] standard deviations above the mean."""
    return (1 + sigma * expected_max(replicas)) / (1 + sigma * expected_max(calibrated_at))


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
    if overlap is not None and not (finite(overlap) and 0.0 <= overlap <= 1.0):
        raise ConfigError(f"--overlap is a fraction of the all-reduce in [0, 1], got {overlap}")
    return ExchangeModel(accumulate, dtype, packs, None if overlap is None else float(overlap))


def step_parts(cal: Calibration, hosts: int, gpus_per_host: int, per_replica_batch: float, intra: Link,
               inter: Link | None = None, ex: ExchangeModel = ExchangeModel(), *, devices: str = "dedicated",
               nics_per_host: int = 1, algorithm: str = "ring", straggler: float = 0.0) -> dict:
    """One optimizer step on ``hosts`` x ``gpus_per_host`` GPUs: its compute (K micro-steps), the wait for the
    slowest replica (``straggler`` σ, dedicated devices only: replicas sharing one pool of cores wait for the pool,
    which compute_at already counts), all-reduce, hidden part and step time, and the bytes one all-reduce moves."""
    n = hosts * gpus_per_host
    micro = cal.compute_at(n, per_replica_batch, devices)
    size = cal.gradient_bytes_in(ex.dtype)
    comm = allreduce_time(size, gpus_per_host, hosts, intra, inter, nics_per_host, algorithm, ex.packs)
    hidden = ex.hidden(comm, micro)
    compute = ex.accumulate * micro
    wait = compute * (straggler_factor(straggler, n, cal.replicas) - 1) if devices == "dedicated" else 0.0
    return {"compute_s": compute, "straggler_s": wait, "allreduce_s": comm, "hidden_s": hidden,
            "step_time_s": compute + wait + comm - hidden, "gradient_bytes": size}


def predict(cal: Calibration, intra: Link, inter: Link | None = None, *, mode: str = "weak",
            devices: str = "dedicated", overlap: float | None = None, max_replicas: int = DEFAULT_MAX_REPLICAS,
            gpus_per_host: int = DEFAULT_GPUS_PER_HOST, nics_per_host: int = 1,
            global_batch: float | None = None, algorithm: str = "ring", allreduce_dtype: str | None = None,
            allreduce_packs: int | None = None, accumulate: int | None = None,
            straggler: float = 0.0) -> pd.DataFrame:
    """One row per (hosts, GPUs per host): compute, all-reduce and step time, throughput, speedup, efficiency.

    Weak scaling keeps the calibration's per-replica batch; strong scaling keeps ``global_batch`` (default:
    the calibration run's, per-replica batch × replicas × accumulate) and divides it among the replicas and the
    micro-batches. ``allreduce_dtype``, ``allreduce_packs`` and ``accumulate`` default to the run's (exchange).
    """
    if mode not in SCALING_MODES:
        raise ConfigError(f"mode must be one of {', '.join(SCALING_MODES)}, got {mode!r}")
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
                          algorithm=algorithm, straggler=straggler)
        # A forecast that never leaves one host is named for its link alone: no "+ ib200" it does not use.
        spans = inter is not None and max_replicas > gpus_per_host
        rows.append({"scenario": intra.name + (f" + {inter.name}" if spans else ""),
                     "intra": intra.name, "inter": inter.name if inter is not None else "", "hosts": hosts,
                     "gpus_per_host": g, "replicas": n, "per_replica_batch": b, "accumulate": k,
                     "global_batch": b * n * k, "allreduce_dtype": ex.dtype, "allreduce_packs": ex.packs,
                     "gradient_bytes": part["gradient_bytes"], "compute_s": part["compute_s"],
                     "straggler_s": part["straggler_s"],
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



def compare(cal: Calibration, link: Link, measured: pd.DataFrame, devices: str = "dedicated",
            overlap: float | None = None, algorithm: str = "ring", inter: Link | None = None,
            nics_per_host: int = 1, straggler: float = 0.0) -> pd.DataFrame:
    """Predicted vs measured step time at each measured run, each modelled on the hosts x GPUs it ran on (``link``
    inside a host, ``inter`` between hosts) with the accumulation, all-reduce dtype and packs it ran with
    (measured_frame's columns; one host, and the calibration's exchange, where a frame lacks them). A run over
    several hosts with no ``inter`` is refused: the link between its hosts is not known."""
    out = measured.copy()
    if "hosts" not in out.columns:
        out["hosts"], out["gpus_per_host"], out["layout"] = 1, out["replicas"], "one host"
    parts = []
    for _, r in out.iterrows():
        hosts, per_host = int(r["hosts"]), int(r["gpus_per_host"])
        if hosts > 1 and inter is None:
            raise ConfigError(f"{r.get('source', 'a measured run')} ran {int(r['replicas'])} GPUs on {hosts} hosts "
                              f"({r['layout']}); give --inter-host, the link between its hosts, to compare with it")
        ex = exchange(cal, r.get("allreduce_dtype"), _int_or_none(r.get("allreduce_packs")),
                      _int_or_none(r.get("accumulate")), overlap)
        parts.append(step_parts(cal, hosts, per_host, float(r["per_replica_batch"]), link,
                                inter if hosts > 1 else None, ex, devices=devices, nics_per_host=nics_per_host,
                                algorithm=algorithm, straggler=straggler))
    out["predicted_compute_s"] = [x["compute_s"] for x in parts]
    out["predicted_allreduce_s"] = [x["allreduce_s"] for x in parts]
    out["predicted_step_time_s"] = [x["step_time_s"] for x in parts]
    out["error"] = out["predicted_step_time_s"] / out["step_time_s"] - 1
    return out


def _int_or_none(v):
    return int(v) if finite(v) or isinstance(v, np.integer) else None



def run_point(run_dir, frame: pd.DataFrame, ex: ExchangeModel | None = None,
              cal: Calibration | None = None) -> dict | None:
    """The run's own step time beside the forecast at its replica count (each scenario's predicted step time and
    communication fraction, and their error), when the forecast covers it with the run's own accumulation and
    all-reduce (``ex``: the forecast's); None when it does not, and when it could not check anything (``cal``):
    the forecast's compute was taken from that very point (one replica: its step is the calibration), or was given
    (--compute-ms) for devices other than the run's (a GPU's compute against a CPU-simulated step).

    ``measured_by_tftoolkit`` and ``source`` say whether the step time was measured in a run tftoolkit trained or
    is a figure of a summary.json written by hand (calibration.handwritten): only the first is called measured."""
    s = summary.read(Path(run_dir) / "summary.json")
    if cal is not None and ((cal.given and s.get("device_kind") != "GPU")
                            or (not cal.given and cal.replicas == 1 and s.get("replicas") == 1)):
        return None
    n = s.get("replicas")
    step = (on_training_clock(s, "step_time_no_input_s") if finite(s.get("step_time_no_input_s"))
            else s.get("step_time_s"))
    if not (finite(n) and finite(step)) or frame.empty or n not in set(frame["replicas"]):
        return None
    if ex is not None and (ex.accumulate, ex.dtype, ex.packs) != exchange_of(s):
        return None
    why = handwritten(run_dir)
    rows = {}
    for name, g in frame[frame["replicas"] == n].groupby("scenario", sort=False):
        r = g.iloc[0]
        rows[name] = {"predicted_step_time_s": float(r["step_time_s"]),
                      "error": float(r["step_time_s"] / step - 1),
                      "predicted_communication_fraction": float(r["allreduce_s"] / (r["allreduce_s"] + r["compute_s"]))}
    return {"replicas": int(n), "step_time_s": float(step), "communication_fraction": s.get("communication_fraction"),
            "device_kind": s.get("device_kind"), "measured_by_tftoolkit": not why,
            "source": ("measured by tftoolkit in this run" if not why
                       else f"the run directory's summary.json, not measured by tftoolkit ({why})"),
            "scenarios": rows}
