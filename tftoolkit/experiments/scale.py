"""Scaling study: the same training at several replica counts, one tidy table (``scaling.csv``).

    tftoolkit scale --replica-counts 1,2,4 --mode weak --steps 60 --out runs/scale

Each replica count is an ordinary run directory, ``OUT/runs/r<N>/`` (rerunning resumes or reuses them),
and ``OUT/scaling.csv`` has one row per count:

  replicas, mode, global_batch, per_replica_batch, images_per_sec, uncertainty, speedup,
  speedup_uncertainty, efficiency, baseline_replicas, step_time_s, compute_time_s, allreduce_time_s,
  input_wait_s, communication_fraction, input_wait_fraction, imbalance, mfu, breakdown_step_time_s (+ its
  uncertainty), each part's uncertainty and status, breakdown_adds_up, device_kind, status, run_dir

- weak scaling keeps the per-replica batch (the global batch grows with N): the usual data-parallel use;
- strong scaling keeps the global batch (``--global-batch``, or per-replica batch x the smallest N), so each
  replica's share shrinks; every N must divide it.
- speedup = images/sec(N) / images/sec(N_base) and efficiency = speedup / (N / N_base), where N_base is the
  smallest replica count in the list (named in ``baseline_replicas``; 1 when the list has 1). In both modes
  perfect scaling is throughput proportional to N, i.e. efficiency 1.0.

The runs share one process: ``devices.init`` creates logical devices for the largest N up front.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd

from .. import fileio, logs
from .. import summary as summary_schema
from ..config import DEFAULT_PER_REPLICA_BATCH, SCALING_MODES, RunConfig
from ..errors import ConfigError
from ..measure import stats

log = logging.getLogger("tftoolkit")

# Each breakdown part travels with its error and status (measure.breakdown: measured, within noise, failed), and the
# step the parts split with training's: a figure drawn from scaling.csv alone says what the run directories say.
BREAKDOWN_COLUMNS = ["breakdown_step_time_s", "breakdown_step_time_uncertainty_s", "compute_time_uncertainty_s",
                     "allreduce_time_uncertainty_s", "input_wait_uncertainty_s", "compute_time_status",
                     "allreduce_time_status", "input_wait_status", "breakdown_adds_up", "device_kind"]
COLUMNS = ["replicas", "mode", "global_batch", "per_replica_batch", "images_per_sec", "uncertainty", "speedup",
           "speedup_uncertainty", "efficiency", "baseline_replicas", "step_time_s", "compute_time_s",
           "allreduce_time_s", "input_wait_s", "communication_fraction", "input_wait_fraction", "imbalance", "mfu",
           *BREAKDOWN_COLUMNS, "status", "run_dir"]
# summary.json field -> scaling.csv column, for the per-run figures copied as they are.
_FROM_SUMMARY = {"images_per_sec": "images_per_sec", "images_per_sec_uncertainty": "uncertainty",
                 "step_time_s": "step_time_s", "compute_time_s": "compute_time_s",
                 "allreduce_time_s": "allreduce_time_s", "input_wait_s": "input_wait_s",
                 "communication_fraction": "communication_fraction", "input_wait_fraction": "input_wait_fraction",
                 "imbalance": "imbalance", "mfu": "mfu", **{c: c for c in BREAKDOWN_COLUMNS}, "status": "status"}
summary_schema.names(*_FROM_SUMMARY)


def parse_replicas(value) -> list[int]:
    """``"1,2,4"`` or [1, 2, 4] -> [1, 2, 4]; zero, negatives and duplicates are refused."""
    if isinstance(value, str):
        try:
            counts = [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--replica-counts: expected comma-separated integers like 1,2,4, got {value!r}") from None
    else:
        counts = [int(x) for x in value]
    if not counts:
        raise ConfigError("--replica-counts: give at least one replica count, e.g. 1,2,4")
    bad = [n for n in counts if n <= 0]
    if bad:
        raise ConfigError(f"--replica-counts: counts must be >= 1, got {bad}")
    dupes = sorted({n for n in counts if counts.count(n) > 1})
    if dupes:
        raise ConfigError(f"--replica-counts: {dupes} listed more than once; give each count once")
    return sorted(counts)


def configs(base: RunConfig, replicas, mode: str = "weak") -> list[RunConfig]:
    """One validated config per replica count, following the scaling mode."""
    counts = parse_replicas(replicas)
    if mode not in SCALING_MODES:
        raise ConfigError(f"--mode: unknown value {mode!r}; choose weak or strong")
    if base.gpus is not None:
        raise ConfigError("scale picks the first N devices for each count; drop --gpus (use CUDA_VISIBLE_DEVICES "
                          "to choose which GPUs)")
    if mode == "weak":
        if base.global_batch is not None:
            raise ConfigError("weak scaling keeps the per-replica batch; give --per-replica-batch, not --global-batch "
                              "(or use --mode strong)")
        return [base.replace(replicas=n) for n in counts]
    k = base.accumulate
    global_batch = (base.global_batch if base.global_batch is not None
                    else (base.per_replica_batch or DEFAULT_PER_REPLICA_BATCH) * counts[0] * k)
    bad = [n for n in counts if global_batch % (n * k)]
    if bad:
        unit = math.lcm(*counts) * k
        raise ConfigError(f"strong scaling keeps the global batch {global_batch}, which does not divide by "
                          f"{bad} replicas{f' x accumulate {k}' if k > 1 else ''}; choose a global batch that all "
                          f"of {counts}{f' x {k}' if k > 1 else ''} divide (e.g. {unit * max(1, global_batch // unit)})")
    # The per-replica batch follows the global one at each count (each run records its own).
    return [base.replace(replicas=n, global_batch=global_batch, per_replica_batch=None) for n in counts]


def table(rows: list[dict], mode: str):
    """scaling.csv from per-run rows (replicas, global_batch, per_replica_batch + summary fields)."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS)
    base = frame.sort_values("replicas").iloc[0]
    n0, thr0, err0 = int(base["replicas"]), float(base["images_per_sec"]), float(base["uncertainty"])
    frame["mode"] = mode
    frame["baseline_replicas"] = n0
    frame["speedup"] = [stats.speedup(t, thr0) for t in frame["images_per_sec"]]
    frame["speedup_uncertainty"] = [
        0.0 if n == n0 else stats.ratio_uncertainty(t, e, thr0, err0)
        for n, t, e in zip(frame["replicas"], frame["images_per_sec"], frame["uncertainty"])]
    frame["efficiency"] = [stats.scaling_efficiency(s, int(n), n0) for s, n in zip(frame["speedup"], frame["replicas"])]
    for col in COLUMNS:
        if col not in frame:
            frame[col] = math.nan
    return frame[COLUMNS].sort_values("replicas").reset_index(drop=True)


def row_status(summary: dict, run_dir="a run") -> str:
    """A replica count's status in scaling.csv: the run's, except that a run which trained but timed no step (all
    of it one call of the loop, which traces the step) is "unmeasured": a scaling table measures, so the command
    exits non-zero rather than show "ok" beside a missing rate."""
    status = summary.get("status", "failed")
    if status == "ok" and not summary.get("timed_steps"):
        log.warning("%s: images/sec not measured: every step fell in one call of the loop, which traces the step; "
                    "train more steps (--train-images, --epochs) or fewer per call (--steps-per-loop)",
                    run_dir)
        return "unmeasured"
    return status


def scale(config: RunConfig | dict, replicas, out, mode: str = "weak", *, force: bool = False,
          quiet: bool = False):
    """Run ``config`` at each replica count into ``out/runs/r<N>`` and write ``out/scaling.csv``; returns it."""
    # Deferred: the engine and training (TensorFlow's side) start only when a run does; importing this module
    # (a file reader of scaling.csv) must not.
    from ..engine import devices
    from ..training import train

    logs.ensure_logging(quiet)
    if isinstance(config, dict):
        config = RunConfig.from_dict(config)
    runs = configs(config, replicas, mode)
    # TensorFlow fixes its device list once: set it up for the largest count before the first run.
    devices.init(max(c.replicas for c in runs))
    out = Path(out)
    rows = []
    for cfg in runs:
        run_dir = out / "runs" / f"r{cfg.replicas}"
        log.info("scale (%s): %d replica(s), global batch %d -> %s", mode, cfg.replicas, cfg.global_batch_size, run_dir)
        summary = train(cfg, run_dir, force=force, quiet=quiet)
        row = {"replicas": cfg.replicas, "global_batch": cfg.global_batch_size,
               "per_replica_batch": cfg.per_replica_batch_size, "run_dir": str(run_dir.relative_to(out))}
        row.update({col: summary.get(key, math.nan) for key, col in _FROM_SUMMARY.items()})
        row["status"] = row_status(summary, run_dir)
        rows.append(row)
        # Written after every run, so a long study that stops half-way keeps what it measured.
        fileio.write_csv(out / "scaling.csv", table(rows, mode))
    frame = table(rows, mode)
    fileio.write_csv(out / "scaling.csv", frame)
    return frame
