"""summary.json's fields and the run's last log line, from what a run recorded: one builder for ``train`` and
``RunRecorder``.

Pure functions of records: the timed loops (seconds, steps), the steps.csv rows, the evals.csv rows, the monitor's
samples, the input probe, the wall-clock parts, the config and what the set-up found. Nothing here touches
TensorFlow or a device, so every field can be tested from hand-made records (tests/training/test_records.py).
``train_summary`` and ``fit_summary`` give each kind's fields; both go through ``recorded_fields``, the fields the
two share. The field names, units and meanings are documented in tftoolkit/summary.py.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from ... import summary as summary_schema
from ...data.source import SHOW_SKIPPED
from ...measure import stats
from ...measure.input.verdict import verdict as judge_input
from ...measure.monitor import analysis as monitor_analysis

log = logging.getLogger("tftoolkit")

# What a resume after the run's last checkpoint measured: its segment trained nothing, so it timed nothing.
NOTHING_TRAINED = "this process trained no steps: the run was already trained"

# The fields a segment of a resumed run keeps (summary's "segments").
SEGMENT_FIELDS = ("workers", "replicas", "status", "wall_time_s", "images_per_sec", "timed_steps")

# summary's wall_breakdown parts, in order (other_s, the rest, is added last).
WALL_PARTS = ("import_s", "setup_s", "tracing_s", "train_steps_s", "host_loop_s", "evaluation_s", "checkpoints_s",
              "measurement_s", "teardown_s")


# --- the fields both kinds share -----------------------------------------------------------------------------------
def throughput(loop_times: list[tuple[float, int]], global_batch) -> dict:
    """images_per_sec and the step-time figures over the timed loops (seconds, steps), and timed_steps."""
    thr = stats.throughput([dt / n for dt, n in loop_times], global_batch if global_batch else math.nan)
    thr["timed_steps"] = sum(n for _, n in loop_times)
    return thr


def loss_fields(losses: list[float], initial_loss: float | None = None) -> dict:
    """initial_loss (``initial_loss``, else the first step's), final_loss and final_loss_mean10."""
    if initial_loss is None:
        initial_loss = losses[0] if losses else math.nan
    return {"initial_loss": initial_loss,
            "final_loss": losses[-1] if losses else math.nan,
            "final_loss_mean10": float(np.mean(losses[-10:])) if losses else math.nan}


def last_evaluation(evals: list[dict], metric_names=None) -> dict:
    """val_loss, val_accuracy and val_<metric> after the last evaluation (NaN when there was none).
    ``metric_names``: the metrics to report (NaN where the last evaluation lacks one); None: every val_ column
    the last evaluation has."""
    last = evals[-1] if evals else {}
    names = [k for k in last if k.startswith("val_") and k != "val_examples"] if metric_names is None else \
        ["val_loss", "val_accuracy", *(f"val_{n}" for n in metric_names)]
    fields = {"val_loss": math.nan, "val_accuracy": math.nan}
    fields.update({k: float(last[k]) if last.get(k) is not None else math.nan for k in names})
    return fields


def recorded_fields(status: str, error, *, steps: int, steps_per_epoch, global_batch, loop_times, losses, evals,
                    initial_loss=None, metric_names=None) -> dict:
    """The fields a train run and a recorded fit compute the same way from their records."""
    return {"status": status, "error": error, "steps": steps,
            "epochs": steps / steps_per_epoch if steps_per_epoch else math.nan,
            **throughput(loop_times, global_batch),
            **loss_fields(losses, initial_loss),
            **last_evaluation(evals, metric_names)}


def monitor_fields(samples, *, loop_times, global_batch, share: float = 1.0):
    """monitor.csv (a path or a frame) summarised over the timed phase, or None when it cannot be (the monitor
    never fails a run). ``share``: this host's replicas over all replicas; its GPUs processed only that share of
    every global batch, so dividing all workers' images by its own GPUs' energy would overstate images per joule."""
    if isinstance(samples, Path) and not samples.exists():
        return None
    try:
        timed_s = sum(dt for dt, _ in loop_times)
        images = sum(n for _, n in loop_times) * global_batch * share if global_batch else None
        return monitor_analysis.summarize(samples, images=images or None, duration_s=timed_s or None, phase="train")
    except Exception as e:  # noqa: BLE001 - the monitor never fails a run
        log.warning("monitor summary skipped: %s", e)
        return None


# --- a train run's ----------------------------------------------------------------------------------------------
def input_fields(info: dict, *, streamed: bool, augment: bool, skipped=None) -> dict:
    """How the input was read (memory or stream, threads, transform) and what --skip-bad-images skipped.
    ``info``: the source's info; ``skipped``: each split's (count, names) when the splits count their own."""
    count, names = int(info.get("skipped_images", 0)), list(info.get("skipped_image_examples", []))
    if skipped is not None:
        count, names = 0, []
        for n, found in skipped:
            count, names = count + n, names + list(found)
    return {"input_source": info.get("input_source", "memory"),
            "input_threads": info.get("input_threads", {}),
            "input_transform": (info.get("transform", "") + (" + augment" if augment else "")) if streamed else "",
            "skipped_images": count, "skipped_image_examples": names[:SHOW_SKIPPED]}


def input_verdict(capacity: dict, *, status: str, images_per_sec: float, device_kind: str, data_service=None,
                  images_per_sec_se: float = math.nan) -> dict:
    """The input capacity fields: the probe's figures (``capacity``, measure.input.bench.probe's) and what they say
    against the rate training consumed (``images_per_sec``, its standard error ``images_per_sec_se``)."""
    nan = math.nan
    cap = {"input_capacity_images_per_sec": nan, "input_capacity_uncertainty": nan,
           "input_capacity_method": f"not measured (the run {status})", "input_cores": None,
           "input_capacity_per_core": nan, **capacity}
    return {**cap, **judge_input(cap["input_capacity_images_per_sec"], images_per_sec, device_kind,
                                 cap["input_capacity_uncertainty"], images_per_sec_se),
            "data_service": data_service}


def train_summary(config, setup, facts: dict, *, status: str, error, steps: int, steps_per_epoch: int, loop_times,
                  rows, evals, initial_loss: float, metric_names, worker_shard: bool, input_info: dict,
                  streamed: bool, skipped=None, capacity: dict, data_service=None) -> dict:
    """A train run's summary fields before its measurements and wall time: ``config`` (RunConfig), ``setup``
    (engine.devices.DeviceSetup), ``facts`` (what the set-up found: replicas in sync, cross_device_ops, params,
    gradient_bytes, allreduce_dtype, jit_effective, deterministic(_reason), device_memory_peak_bytes, threads,
    dataset, train_examples, num_classes, examples_per_replica, dropped_examples, data_placement(_reason), loss,
    resumed_from_step), and the records."""
    rec = recorded_fields(status, error, steps=steps, steps_per_epoch=steps_per_epoch,
                          global_batch=config.global_batch_size, loop_times=loop_times,
                          losses=[r["loss"] for r in rows], evals=evals, initial_loss=initial_loss,
                          metric_names=metric_names)
    return {
        "status": status, "error": error,
        "replicas": facts["replicas"], "workers": config.workers, "hosts": facts.get("hosts", 1),
        "replicas_per_worker": setup.replicas,
        "device_kind": setup.kind, "devices": list(setup.devices),
        "cross_device_ops": facts["cross_device_ops"], "cross_device_ops_requested": config.cross_device_ops,
        "threads": facts["threads"], "model": config.model, "params": facts["params"],
        # What each optimizer step all-reduces (trainable variables only, in allreduce_dtype); predict scales from it.
        "gradient_bytes": facts["gradient_bytes"], "allreduce_dtype": facts["allreduce_dtype"],
        "allreduce_packs": config.allreduce_packs,
        "dataset": facts["dataset"], "train_examples": facts["train_examples"], "num_classes": facts["num_classes"],
        "per_replica_batch": config.per_replica_batch_size, "global_batch": config.global_batch_size,
        "accumulate": config.accumulate, "learning_rate": config.learning_rate, "base_lr": config.base_lr,
        "base_batch": config.base_batch, "lr_rule": config.lr_rule, "warmup_epochs": config.warmup_epochs,
        "optimizer": config.optimizer, "precision": config.precision, "jit": config.jit,
        "jit_effective": facts["jit_effective"], "deterministic": facts["deterministic"],
        "deterministic_reason": facts["deterministic_reason"],
        "device_memory_peak_bytes": facts["device_memory_peak_bytes"],
        "steps_per_epoch": steps_per_epoch, "steps": steps, "epochs": rec["epochs"],
        "resumed_from_step": facts["resumed_from_step"],
        "examples_per_replica": facts["examples_per_replica"], "dropped_examples": facts["dropped_examples"],
        "input_sharding": config.input_sharding if worker_shard else "exact",
        "data_placement": facts["data_placement"], "data_placement_reason": facts["data_placement_reason"],
        **input_fields(input_info, streamed=streamed, augment=config.augment, skipped=skipped),
        **rec,
        **input_verdict(capacity, status=status, images_per_sec=rec.get("images_per_sec", math.nan),
                        images_per_sec_se=rec.get("images_per_sec_uncertainty", math.nan), device_kind=setup.kind,
                        data_service=data_service),
        "loss": facts["loss"], "metrics": list(metric_names),
    }


def wall_breakdown(parts: dict, wall_time_s: float, first_call=None, step_time_s=None) -> dict:
    """``parts`` (seconds per phase, WALL_PARTS) with tracing split out of the first loop call (``first_call``:
    its seconds and steps; a step of it beyond ``step_time_s`` is tracing) and the remainder as other_s: the
    parts sum to ``wall_time_s``."""
    out = dict(parts)
    if first_call is not None:
        seconds, n = first_call
        per_step = step_time_s if step_time_s and math.isfinite(step_time_s) else 0.0
        tracing = max(0.0, seconds - n * per_step)
        out["tracing_s"] = tracing
        out["train_steps_s"] -= tracing
    out = {k: round(v, 3) for k, v in out.items()}
    out["other_s"] = round(wall_time_s - sum(out.values()), 3)
    return out


def segments(summary: dict, resumed_from: int, previous: dict | None = None) -> list[dict]:
    """Every process that trained this run, oldest first: this one (``summary``), after those the previous
    summary.json listed (or described, if it predates the list). A segment killed before it wrote a summary is
    known only by the steps it left in a checkpoint."""
    this = {k: summary.get(k) for k in SEGMENT_FIELDS}
    this.update(from_step=resumed_from, to_step=summary.get("steps"))
    if not resumed_from:
        return [this]
    earlier = []
    previous = previous or {}
    if previous:
        earlier = previous.get("segments") or [{
            "from_step": previous.get("resumed_from_step", 0), "to_step": previous.get("steps"),
            **{k: previous.get(k) for k in SEGMENT_FIELDS}}]
    reached = max([0] + [int(seg.get("to_step") or 0) for seg in earlier])
    if reached < resumed_from:  # stopped without a summary (SIGKILL, a lost node): its checkpoint says where
        earlier.append({"from_step": reached, "to_step": resumed_from, "status": "interrupted"})
    return earlier + [this]


def wall_fields(summary: dict, *, wall_time_s: float, parts: dict, first_call=None, resumed_from: int = 0,
                previous: dict | None = None) -> dict:
    """wall_time_s, wall_breakdown, segments and run_wall_time_s of a train run whose other fields are
    ``summary``: what it recorded last, once its measurements are done."""
    fields = {"wall_time_s": wall_time_s,
              "wall_breakdown": wall_breakdown(parts, wall_time_s, first_call, summary.get("step_time_s"))}
    fields["segments"] = segments({**summary, **fields}, resumed_from, previous)
    fields["run_wall_time_s"] = float(sum(seg.get("wall_time_s") or 0.0 for seg in fields["segments"]))
    return fields


def done_line(summary: dict, *, timed_loops: int, config, classification: bool, out) -> str:
    """The chief's last line of a train run that finished: steps, the rate (± its uncertainty, which needs two
    timed loop calls), the final loss and the held-out figures."""
    step, resumed = summary["steps"], summary["resumed_from_step"]
    if timed_loops > 1:
        rate = (f"{summary['images_per_sec']:.1f} ± {summary['images_per_sec_uncertainty']:.1f} images/sec "
                f"({summary_schema.measured_with(summary)})")
    elif timed_loops == 1:
        rate = (f"{summary['images_per_sec']:.1f} images/sec from one timed loop call (no uncertainty: more "
                "steps, or a smaller --steps-per-loop, give one)")
    elif step == resumed:
        rate = f"images/sec not measured: {NOTHING_TRAINED.replace(': ', ' (', 1)})"
    else:
        rate = (f"images/sec not measured: all {step - resumed} steps fell in the timing warm-up "
                f"(--timing-warmup-steps {config.timing_warmup_steps}, loops of {config.steps_per_loop})")
    shown = ["val_accuracy"] if classification else ["val_loss"] + [f"val_{n}" for n in summary["metrics"]]
    return (f"done: {step} steps, {rate}, final loss {summary['final_loss']:.4f}, "
            + ", ".join(f"{k} {summary[k]:.4f}" for k in shown) + f" -> {out}")


# --- a recorded fit's -------------------------------------------------------------------------------------------
def fit_summary(facts: dict, *, status: str, error, steps: int, steps_per_epoch, global_batch, loop_times, rows,
                evals, epoch_logs: dict, train_examples) -> dict:
    """A recorded model.fit's summary fields before its monitor and wall time: ``facts`` (the recorder's view of
    the strategy and the model: replicas, workers, replicas_per_worker, device_kind, devices, cross_device_ops,
    threads, device_memory_peak_bytes, model, params, gradient_bytes, and config.json's precision, jit_compile,
    optimizer, loss, metrics, learning_rate), the records, and the last epoch's logs (its train_<metric> means)."""
    B, replicas = global_batch, facts["replicas"]
    lrs = [r["learning_rate"] for r in rows if math.isfinite(r["learning_rate"])]
    rec = recorded_fields(status, error, steps=steps, steps_per_epoch=steps_per_epoch, global_batch=B,
                          loop_times=loop_times, losses=[r["loss"] for r in rows], evals=evals)
    return {
        "status": status, "error": error,
        "hosts": facts.get("hosts", 1),
        **{k: facts[k] for k in ("replicas", "workers", "replicas_per_worker", "device_kind", "devices",
                                 "cross_device_ops", "threads", "device_memory_peak_bytes", "model", "params",
                                 "gradient_bytes")},
        # A fit step is one batch (with Keras' gradient_accumulation_steps, one micro-batch): recorded as such; Keras
        # casts nothing, so each gradient travels in its own dtype.
        "allreduce_dtype": "float32", "allreduce_packs": 1, "accumulate": 1,
        "precision": facts["precision"], "jit": facts["jit_compile"], "optimizer": facts["optimizer"],
        "loss": facts["loss"], "metrics": facts["metrics"],
        "learning_rate": max(lrs) if lrs else facts["learning_rate"],  # the peak, as train's
        "lr_rule": "none",  # the fit's own LR: nothing scaled it to the global batch
        "global_batch": B,
        # Keras splits each global batch evenly over the replicas (the last replica less, for a partial one).
        "per_replica_batch": (B // replicas if B % replicas == 0 else B / replicas) if B else None,
        "steps_per_epoch": steps_per_epoch,
        "train_examples": int(train_examples) if train_examples is not None and math.isfinite(train_examples)
        else None,
        **rec,
        # The metrics as the last epoch trained them (its mean).
        **{f"train_{k}": float(v) for k, v in epoch_logs.items() if not k.startswith("val_") and k != "loss"},
    }


def recorded_line(summary: dict, *, timed_loops: int, warmup_steps: int, out) -> tuple[int, str]:
    """The recorder's last line of a fit, with its logging level: what it recorded, or how it ended."""
    if summary["status"] != "ok":
        return logging.WARNING, f"recorded fit {summary['status']}: {summary['error']} -> {out}"
    if timed_loops > 1:
        rate = f"{summary['images_per_sec']:.1f} ± {summary['images_per_sec_uncertainty']:.1f} examples/sec"
    else:
        rate = (f"examples/sec not measured: {timed_loops} timed call(s) after {warmup_steps} "
                "warm-up steps (more steps, or warmup_steps=0, give one)")
    return logging.INFO, f"recorded: {summary['steps']} steps, {rate}, final loss {summary['final_loss']:.4f} -> {out}"
