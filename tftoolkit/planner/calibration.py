"""Calibration of the scaling model from a run directory: the compute of one micro-step, its per-replica batch,
the gradient bytes and how the run exchanged them; and the measured step times the model is checked against.

Compute is calibrated from the run: ``step_time_s`` of a one-replica run (the median of its timed steps;
it has no all-reduce), else ``compute_time_s`` (the step with no all-reduce, from ``--measure``; as its share of
the step it was timed interleaved with, times ``step_time_s``: on_training_clock), each divided by the run's
``accumulate`` into the compute of one micro-step. With ``devices="dedicated"`` (GPUs: every
replica has its own device) compute depends only on the per-replica batch: constant in weak scaling, and
proportional to the per-replica batch in strong scaling. With ``devices="shared"`` (CPU-simulated replicas: every
replica runs on the same host cores) compute is proportional to the total examples per step, N × per-replica batch.

Measured or written by hand: a run directory tftoolkit trained holds, beside summary.json, the files a run writes
as it starts and as it logs (RUN_FILES: config.json with the run's config, env.json, steps.csv; tftoolkit/rundir.py).
One with a summary.json alone, or without those files, is taken as written by hand (a published table's figures
copied into a summary): its figures are the summary's, and no label calls them measured (Calibration.label,
measured_by_tftoolkit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import summary
from ..config import DTYPE_BYTES
from ..fileio import read_json
from ..errors import ConfigError, DataError, RunDirError, UnreadableRunError, first_line
from .choices import DEFAULT_GPUS_PER_HOST

# The summary.json fields the model is calibrated and checked with.
READS = summary.names("replicas", "per_replica_batch", "gradient_bytes", "params", "step_time_s", "compute_time_s",
                      "images_per_sec", "images_per_sec_uncertainty", "device_kind", "communication_fraction",
                      "step_time_no_input_s", "accumulate", "allreduce_dtype", "allreduce_packs",
                      "breakdown_step_time_s", "workers", "replicas_per_worker")
# What a run tftoolkit trained writes beside its summary.json (training/api.py, training/records/files.py).
RUN_FILES = ("config.json", "env.json", "steps.csv")
# Written by hand into a summary.json or as a table's columns, the hosts a measured run spanned (no run records them).
LAYOUT_KEYS = ("hosts", "gpus_per_host")


def on_training_clock(s: dict, key: str) -> float:
    """A breakdown time (``compute_time_s``, ``step_time_no_input_s``) scaled onto the run's own ``step_time_s``: its
    share of the step it was timed interleaved with (``breakdown_step_time_s``) x step_time_s. The breakdown is
    timed after training, when the host's load may differ; its shares hold, its absolute times need not. Summaries
    from before the interleaved breakdown have no such step: their time as recorded."""
    value, step, beside = s.get(key), s.get("step_time_s"), s.get("breakdown_step_time_s")
    if finite(value) and finite(step) and finite(beside) and beside > 0 and step > 0:
        return float(value) * float(step) / float(beside)
    return float(value) if finite(value) else math.nan



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
    handwritten: str = ""      # why the run directory is taken as written by hand ("": a run tftoolkit trained)

    @property
    def measured(self) -> bool:
        """Whether the compute was measured by tftoolkit in the run (not given, not a summary written by hand)."""
        return not self.given and not self.handwritten

    @property
    def label(self) -> str:
        """Where the compute figure comes from, for every forecast made with it."""
        if self.given:
            return f"compute {self.compute_s * 1e3:.3g} ms/step given (--compute-ms)"
        per = " per micro-step" if self.accumulate > 1 else "/step"
        source = self.source + (f" / accumulate {self.accumulate}" if self.accumulate > 1 else "")
        if self.handwritten:
            return (f"compute {self.compute_s * 1e3:.3g} ms{per} from the run directory's summary.json ({source}, on "
                    f"{self.device_kind or 'unknown devices'} as written there; not measured by tftoolkit: "
                    f"{self.handwritten})")
        return f"compute {self.compute_s * 1e3:.3g} ms{per} measured on {self.device_kind or 'unknown devices'} ({source})"

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



def finite(v) -> bool:
    """A real, finite number (not a bool, not None, not NaN)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


def handwritten(run_dir) -> str:
    """Why ``run_dir`` is taken as written by hand, not trained by tftoolkit ("" for a run it trained): the RUN_FILES
    it lacks, or a config.json that is not a run's ({"config": {...}})."""
    d = Path(run_dir)
    missing = [f for f in RUN_FILES if not (d / f).exists()]
    if missing:
        return f"the directory has no {', '.join(missing)} of a tftoolkit run"
    try:
        config = read_json(d / "config.json")
    except (OSError, ValueError):
        config = None
    if not (isinstance(config, dict) and isinstance(config.get("config"), dict)):
        return "its config.json is not a tftoolkit run's"
    return ""


def measured_by_tftoolkit(run_dir) -> bool:
    """Whether ``run_dir``'s figures were measured by tftoolkit (a run it trained, not a summary written by hand)."""
    return not handwritten(run_dir)


def calibrate(run_dir, compute_ms: float | None = None) -> Calibration:
    """Compute time, batch and gradient size from RUN_DIR/summary.json; says which fields are missing, and whether
    the directory is a run tftoolkit trained or a summary written by hand (``handwritten``).
    ``compute_ms``: the step's compute in ms at the run's per-replica batch on one GPU, given instead."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise RunDirError(f"{run_dir} has no summary.json; give a run directory written by `tftoolkit train`")
    return calibrate_summary(summary.read(path), str(path), compute_ms, handwritten=handwritten(run_dir))


PREDICT_REMEDY = ("Give --compute-ms (one GPU's compute of one step at this per-replica batch), a run measured on a "
                  "GPU, or --devices shared to model the simulated replicas themselves")


def gpu_forecast_refusal(cal: Calibration, devices: str, remedy: str = PREDICT_REMEDY) -> str | None:
    """Why GPUs cannot be forecast from ``cal``, or None: compute measured on CPU-simulated replicas says nothing of
    a GPU's step time, which is far shorter, so communication would weigh much more than it predicts. ``remedy``:
    what to do, in the options of the command that asks (predict's by default)."""
    if devices != "dedicated" or cal.given or cal.device_kind == "GPU":
        return None
    step = "micro-step" if cal.accumulate > 1 else "step"
    where = "is written in its summary.json as on" if cal.handwritten else "was measured on"
    return (f"this run's compute ({cal.compute_s * 1e3:.3g} ms per {step}) {where} {cal.device_kind or 'non-GPU'} "
            "replicas; a GPU computes that step far faster, so a GPU forecast from it would understate how much "
            f"communication costs. {remedy}")


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
           if not (finite(v) and v >= 1 and v == int(v))]
    if dtype not in DTYPE_BYTES:
        bad.append(f"allreduce_dtype (it is {dtype!r}; one of {', '.join(DTYPE_BYTES)})")
    if bad:
        raise RunDirError(f"{where} has unreadable field(s): {', '.join(bad)}")
    return int(k), str(dtype), int(packs)


def calibrate_summary(s: dict, where: str = "summary", compute_ms: float | None = None, *,
                      handwritten: str = "") -> Calibration:
    """The calibration from a summary. ``compute_ms``: one GPU's compute of one forward/backward pass at the run's
    per-replica batch (one micro-batch's, with accumulation), in ms, instead of the run's own. ``handwritten``: why
    the summary is taken as written by hand (calibration.handwritten of its run directory; "": measured)."""
    accumulate, dtype, packs = exchange_of(s, where)
    if compute_ms is not None:
        if not (finite(compute_ms) and compute_ms > 0):
            raise ConfigError(f"--compute-ms must be a number of milliseconds > 0, got {compute_ms!r}")
        # Given per micro-step: scaled up to the run's step here, divided back into a micro-step below.
        s = {**s, "compute_time_s": compute_ms / 1e3 * accumulate, "step_time_s": None}
    missing = [_what(s, k) for k in ("replicas", "per_replica_batch") if not finite(s.get(k))]
    if not (finite(s.get("gradient_bytes")) or finite(s.get("params"))):
        missing.append("gradient_bytes (or params)")
    replicas = s.get("replicas")
    if finite(s.get("step_time_s")) and replicas == 1:
        # The median over every timed training step: steadier than compute_time_s, which --measure takes from
        # a few extra loops (and one replica has no all-reduce to take out).
        compute, source = float(s["step_time_s"]), "step_time_s (one replica: no all-reduce in it)"
    elif finite(s.get("compute_time_s")) and s["compute_time_s"] > 0:
        compute = on_training_clock(s, "compute_time_s")
        source = ("compute_time_s (its share of the step it was timed beside x step_time_s)"
                  if compute != s["compute_time_s"] else "compute_time_s")
    else:
        compute, source = math.nan, ""
        if finite(replicas) and replicas > 1:
            missing.append(_what(s, "compute_time_s") + " (train with --measure)")
        else:
            missing.append(f"{_what(s, 'compute_time_s')} or {_what(s, 'step_time_s')} (a finite step time needs "
                           "more steps than --timing-warmup-steps)")
    if missing:
        raise RunDirError(f"{where} lacks field(s) the prediction needs: {', '.join(missing)}")
    grad_bytes = (float(s["gradient_bytes"]) if finite(s.get("gradient_bytes"))
                  else float(s["params"]) * DTYPE_BYTES[dtype])
    # The run's step and compute times are per optimizer step: K micro-steps of the per-replica batch.
    return Calibration(compute / accumulate, float(s["per_replica_batch"]), int(replicas), grad_bytes, source,
                       str(s.get("device_kind") or ""), compute_ms is not None, accumulate, dtype, packs, handwritten)



def host_layout(record, replicas: int, gpus_per_host: int, where: str) -> tuple[int, int, str]:
    """(hosts, GPUs per host, where that comes from) of a measured run of ``replicas`` GPUs, from ``record`` (a
    summary or a table's row): its ``hosts`` (and ``gpus_per_host``), written by hand, as no run records them; else
    a multi-worker run's ``workers`` x ``replicas_per_worker``, one worker per host as multi-worker training places
    them; else whole hosts of ``gpus_per_host`` (predict's --gpus-per-host), as the forecast lays GPUs out."""
    def get(key):
        v = record.get(key)
        return int(v) if finite(v) and v >= 1 and v == int(v) else None

    hosts, per_host = get("hosts"), get("gpus_per_host")
    if hosts or per_host:
        hosts = hosts or -(-replicas // per_host)
        per_host, how = per_host or replicas // hosts, "its hosts and gpus_per_host"
    elif (get("workers") or 1) > 1 and get("replicas_per_worker"):
        hosts, per_host, how = get("workers"), get("replicas_per_worker"), "its workers, taken as one per host"
    elif replicas <= gpus_per_host:
        return 1, replicas, f"one host (--gpus-per-host {gpus_per_host})"
    else:
        hosts = -(-replicas // gpus_per_host)
        per_host, how = replicas // hosts, f"whole hosts of --gpus-per-host {gpus_per_host}"
    if hosts * per_host != replicas:
        raise DataError(f"{where}: {replicas} GPUs are not {hosts} host(s) x {per_host} (from {how}); write its hosts "
                        "and gpus_per_host (a summary.json's fields, a table's columns)")
    return hosts, per_host, how


def measured_table(p: Path) -> pd.DataFrame:
    """A table of measured rates (scaling.csv, or one of the user's) with whole positive ``replicas`` and positive
    ``step_time_s`` (or ``images_per_sec`` and ``global_batch``) in every row: anything else is a DataError naming
    the file and the rows, never a comparison quietly left out."""
    need = ("columns replicas, step_time_s (or images_per_sec) and per_replica_batch or global_batch, one row per "
            "measured run")
    try:
        df = pd.read_csv(p)
    except (ValueError, UnicodeDecodeError) as e:  # empty, not CSV, not text (pandas' errors are ValueErrors)
        raise UnreadableRunError(f"{p} is not a CSV table ({first_line(e, 120)}); --measured takes {need}") from None
    if "step_time_s" not in df.columns:
        if not {"images_per_sec", "global_batch"} <= set(df.columns):
            raise UnreadableRunError(f"{p} needs {need}")
        df["step_time_s"] = (pd.to_numeric(df["global_batch"], errors="coerce")
                             / pd.to_numeric(df["images_per_sec"], errors="coerce"))
    if "replicas" not in df.columns or not {"per_replica_batch", "global_batch"} & set(df.columns) or df.empty:
        raise UnreadableRunError(f"{p} needs {need}" + (" (it has no rows)" if df.empty else ""))
    replicas = pd.to_numeric(df["replicas"], errors="coerce")
    step = pd.to_numeric(df["step_time_s"], errors="coerce")
    batch = pd.to_numeric(df.get("per_replica_batch", df.get("global_batch")), errors="coerce")
    bad = [i + 2 for i, (n, t, b) in enumerate(zip(replicas, step, batch))  # +2: the header is line 1
           if not (finite(n) and n >= 1 and n == int(n) and finite(t) and t > 0 and finite(b) and b > 0)]
    if bad:
        raise UnreadableRunError(f"{p}: line(s) {', '.join(map(str, bad[:10]))} lack a whole replicas >= 1, a "
                                 f"positive step time or a positive batch; --measured takes {need}")
    return df.assign(replicas=replicas.astype(int), step_time_s=step.astype(float))


def measured_frame(sources, gpus_per_host: int = DEFAULT_GPUS_PER_HOST) -> pd.DataFrame:
    """Measured step times from run directories (summary.json) or CSV tables with ``replicas`` and
    ``step_time_s`` (or ``images_per_sec`` and ``global_batch``) columns, e.g. scaling.csv; each with the
    ``accumulate``, ``allreduce_dtype`` and ``allreduce_packs`` it ran with (1, float32, 1 where not recorded) and
    the ``hosts`` x ``gpus_per_host`` it ran on (host_layout, with ``layout`` saying from what)."""

    rows = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            if not (p / "summary.json").exists():
                raise RunDirError(f"{p} has no summary.json")
            s = summary.read(p)
            missing = [k for k in ("replicas", "per_replica_batch", "step_time_s") if not finite(s.get(k))]
            if missing:
                raise RunDirError(f"{p}/summary.json lacks field(s) {', '.join(missing)}")
            ips, ips_err = s.get("images_per_sec"), s.get("images_per_sec_uncertainty")
            rel = ips_err / ips if finite(ips) and finite(ips_err) and ips > 0 else math.nan
            k, dtype, packs = exchange_of(s, f"{p}/summary.json")
            hosts, per_host, how = host_layout(s, int(s["replicas"]), gpus_per_host, f"{p}/summary.json")
            rows.append({"source": str(p), "replicas": int(s["replicas"]), "per_replica_batch": s["per_replica_batch"],
                         "hosts": hosts, "gpus_per_host": per_host, "layout": how,
                         "measured_by_tftoolkit": measured_by_tftoolkit(p),
                         "accumulate": k, "allreduce_dtype": dtype, "allreduce_packs": packs,
                         "step_time_s": s["step_time_s"], "step_time_uncertainty_s": s["step_time_s"] * rel,
                         "compute_time_s": s.get("compute_time_s", math.nan),
                         "allreduce_time_s": s.get("allreduce_time_s", math.nan)})
        elif p.suffix == ".csv" and p.exists():
            df = measured_table(p)
            defaults = {"accumulate": 1, "allreduce_dtype": "float32", "allreduce_packs": 1}
            for col, v in defaults.items():
                df[col] = df[col].fillna(v) if col in df.columns else v
            if "per_replica_batch" not in df.columns:
                df["per_replica_batch"] = df["global_batch"] / (df["replicas"] * df["accumulate"])
            for _, r in df.iterrows():
                k, dtype, packs = exchange_of({c: r[c] for c in defaults}, str(p))
                layout = {c: r[c] for c in LAYOUT_KEYS if c in df.columns}
                hosts, per_host, how = host_layout(layout, int(r["replicas"]), gpus_per_host, str(p))
                rows.append({"source": str(p), "replicas": int(r["replicas"]), "per_replica_batch": r["per_replica_batch"],
                             "hosts": hosts, "gpus_per_host": per_host, "layout": how,
                             "measured_by_tftoolkit": False,  # a table: where its figures came from is not known
                             "accumulate": k, "allreduce_dtype": dtype, "allreduce_packs": packs,
                             "step_time_s": r["step_time_s"], "step_time_uncertainty_s": math.nan,
                             "compute_time_s": r.get("compute_time_s", math.nan),
                             "allreduce_time_s": r.get("allreduce_time_s", math.nan)})
        else:
            raise DataError(f"{p}: expected a run directory or a .csv table")
    return pd.DataFrame(rows)

