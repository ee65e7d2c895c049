"""summary.json: every field a run writes, with its unit and meaning. The one place they are documented.

The training run writes the file through ``check`` (an undocumented field is a bug, caught by the tests);
every reader (scale, grid, report, advise, predict, the sweep's results.csv) reads it through ``read`` and
declares the fields it reads with ``names``, which fails on a name that is not documented here.

Units: "s" seconds, "images/s", "bytes", "FLOP" and "FLOP/s", "1" for a ratio or fraction (0..1), "" for
text, counts and flags. Throughput and step times are over timed loops only (the first
``timing_warmup_steps`` are left out); see measure.stats for the formulas.

The file is strict JSON: a number that is unknown (not measured, no held-out split: NaN in the summary the run
returns) or not finite is null there, and so is a text field that does not apply. ``read`` gives the numbers' nulls
back as NaN, so a reader sees what the run returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from . import fileio
from .errors import UnreadableRunError, first_line


@dataclass(frozen=True)
class Field:
    name: str
    unit: str
    meaning: str
    group: str


def _fields(group: str, rows: list[tuple[str, str, str]]) -> list[Field]:
    return [Field(name, unit, meaning, group) for name, unit, meaning in rows]


_ALL = (
    _fields("outcome", [
        ("status", "", "ok, diverged (the loss blew up: the run stopped itself), failed, or interrupted (Ctrl-C or "
                       "SIGTERM; a recorded model.fit (RunRecorder) also by an exception outside a training step)"),
        ("error", "", "what went wrong, one line; null when status is ok"),
        ("resumed_from_step", "", "the checkpointed step this run resumed from (0: a fresh run)"),
        ("wall_time_s", "s", "wall time of this process's run, from set-up (devices, data) to the summary"),
        ("segments", "", "every process that trained this run, oldest first: from_step, to_step, workers, replicas, "
                         "status, wall_time_s, images_per_sec, timed_steps (one segment for a run never resumed; a "
                         "segment killed before writing a summary has only its steps and status 'interrupted'); the "
                         "throughput and wall-time fields above are the last segment's"),
        ("run_wall_time_s", "s", "wall time of all segments together (what segments record)"),
        ("wall_breakdown", "s", "wall_time_s split into: import_s (importing TensorFlow, when the run's set-up did), setup_s "
                                "(devices, data read, model, restore, data placement, building the input pipeline), "
                                "tracing_s (the first loop call beyond its steps' share), train_steps_s (the compiled "
                                "loop's calls), host_loop_s (logs, events, progress between calls), evaluation_s, "
                                "checkpoints_s, measurement_s (measure=True, monitor and noise summaries), teardown_s "
                                "(iterator release, profiler stop, final logs), other_s (the rest); they sum to "
                                "wall_time_s"),
    ])
    + _fields("devices", [
        ("replicas", "", "replicas in sync (all workers' together)"),
        ("workers", "", "worker processes sharing the replicas"),
        ("hosts", "", "distinct machines among the workers (by their cluster addresses; 1 without a cluster): with "
                      "replicas, the host layout predict --measured compares a run on"),
        ("replicas_per_worker", "", "replicas each worker runs"),
        ("device_kind", "", "GPU, or CPU-simulated (logical CPU devices sharing the host's cores)"),
        ("devices", "", "this worker's TensorFlow devices, e.g. ['/gpu:0', '/gpu:1']"),
        ("cross_device_ops", "", "the gradient all-reduce that really ran (nccl, reduce_to_one, collective_ring, ...; "
                                 "\"collective_nccl (xla)\" under --jit on GPUs, where MirroredStrategy ignores the "
                                 "choice)"),
        ("cross_device_ops_requested", "", "the cross_device_ops option as given (auto, nccl, ...)"),
        ("device_memory_peak_bytes", "bytes", "per replica, the most device memory TensorFlow's allocator held "
                                              "(tf.config.experimental.get_memory_info peak; GPUs only, null on CPU): "
                                              "the run's own memory, unlike NVML's used memory, which counts the CUDA "
                                              "context and TensorFlow's pool"),
        ("threads", "", "TensorFlow's intra-op and inter-op thread pool sizes ({} when TensorFlow chose)"),
    ])
    + _fields("model", [
        ("model", "", "registered model name or package.module:function"),
        ("params", "", "model parameters"),
        ("gradient_bytes", "bytes", "bytes each replica all-reduces per optimizer step, as moved: the trainable "
                                    "variables' gradients in allreduce_dtype"),
        ("allreduce_dtype", "", "dtype the gradients travelled in through the all-reduce (bfloat16, float16: cast "
                                "before it and back after; float32: each in its own dtype, uncast; float32 on one "
                                "replica, which reduces nothing)"),
        ("allreduce_packs", "", "all-reduce calls per optimizer step, each a pack of gradients in reverse layer order "
                                "(--allreduce-packs)"),
        ("precision", "", "float32, mixed_float16 or mixed_bfloat16"),
        ("jit", "", "whether XLA compilation was asked for"),
        ("jit_effective", "", "whether the step really was XLA-compiled (not over several simulated CPU replicas)"),
        ("deterministic", "", "whether TensorFlow's op determinism was on (default: on CPU, off on GPUs, where "
                              "deterministic kernels cost throughput; off under XLA)"),
        ("deterministic_reason", "", "why deterministic has its value"),
        ("optimizer", "", "sgd, momentum, adam, adamw or lamb"),
        ("loss", "", "the training loss: sparse_categorical_crossentropy (from logits) for classification, else the "
                     "loss given or compiled (its name)"),
        ("metrics", "", "the metrics given or compiled, by name: each is also a field val_<name> (see is_metric)"),
    ])
    + _fields("data", [
        ("dataset", "", "dataset name (shapes16k, synthetic, arrays, a folder's name)"),
        ("train_examples", "", "training examples per epoch"),
        ("num_classes", "", "classes of the dataset (from the data: labels 0..num_classes-1), the model's outputs"),
        ("examples_per_replica", "", "examples each replica trained on, counted on the devices (a list)"),
        ("dropped_examples", "", "examples of partial last batches left out (last_batch=drop), all epochs"),
        ("input_sharding", "", "what each worker read: exact (every global batch, its replicas' slices kept) or file "
                               "(only its own TFRecord shards)"),
        ("data_placement", "", "where the training split lived: host (tf.data gathers) or device (a copy per replica)"),
        ("data_placement_reason", "", "why: asked for, or auto's rule with the sizes"),
        ("input_source", "", "memory (decoded once, then gathered by index) or stream (read and decoded from the "
                             "files by tf.data while training: a split over --data-memory-gb)"),
        ("input_threads", "", "a streamed split's tf.data parallelism: cores, interleave_cycle (shards open at once), "
                              "read_threads, decode_threads"),
        ("input_transform", "", "a streamed split's transform: inception (random crops of mixed-size images, centre "
                                "crop to evaluate) or fixed (decoded whole), then ' + augment' when --augment; empty in memory"),
        ("skipped_images", "", "images (or records) skipped as undecodable or out of range (--skip-bad-images)"),
        ("skipped_image_examples", "", "the first few of them, by file (and record)"),
    ])
    + _fields("batch and learning rate", [
        ("per_replica_batch", "", "examples per replica per forward/backward pass (a micro-batch with accumulate > 1)"),
        ("global_batch", "", "examples per optimizer step over all replicas: per_replica_batch x replicas x accumulate"),
        ("accumulate", "", "micro-batches each replica ran per optimizer step, their gradients summed before one "
                           "all-reduce (--accumulate; 1: none)"),
        ("learning_rate", "1", "peak learning rate after the LR rule scaled base_lr to the global batch"),
        ("base_lr", "1", "learning rate at base_batch"),
        ("base_batch", "", "global batch at which base_lr was tuned"),
        ("lr_rule", "", "none, linear or sqrt"),
        ("warmup_epochs", "", "epochs of linear warmup from base_lr to learning_rate"),
        ("steps_per_epoch", "", "optimizer steps per epoch"),
        ("steps", "", "optimizer steps trained"),
        ("epochs", "", "steps / steps_per_epoch"),
    ])
    + _fields("throughput", [
        ("images_per_sec", "images/s", "global batch / mean step time over timed loops"),
        ("examples_per_sec", "images/s", "the same figure as images_per_sec, named for any data (tokens rows, tabular "
                                         "rows, images): examples per second"),
        ("images_per_sec_uncertainty", "images/s", "standard error of images_per_sec (std/sqrt(n) over timed loops)"),
        ("images_per_sec_jitter", "images/s", "1.4826 x median absolute deviation of per-loop rates"),
        ("step_time_s", "s", "median step time"),
        ("step_time_mean_s", "s", "mean step time"),
        ("step_time_p50_s", "s", "50th percentile step time"),
        ("step_time_p90_s", "s", "90th percentile step time"),
        ("step_time_p99_s", "s", "99th percentile step time"),
        ("timed_steps", "", "steps in the timed loops"),
    ])
    + _fields("loss", [
        ("initial_loss", "", "training loss of the first step"),
        ("final_loss", "", "training loss of the last step"),
        ("final_loss_mean10", "", "mean training loss of the last 10 steps"),
        ("val_loss", "", "validation loss after the last evaluation (null without a held-out split)"),
        ("val_accuracy", "1", "validation accuracy after the last evaluation (classification; null for other tasks)"),
    ])
    + _fields("input capacity (every run)", [
        ("input_capacity_images_per_sec", "images/s", "what the run's input path alone delivers on this host (its data, "
                                                      "image size, augmentation, placement, data service): the run's own "
                                                      "pipeline pulled with no model after training (all workers: the "
                                                      "chief's rate x workers); null when not measured"),
        ("input_capacity_uncertainty", "images/s", "its standard error (a line through the probe's calls; NaN under 5)"),
        ("input_capacity_method", "", "how input_capacity_images_per_sec was found: measured, with the batches and "
                                      "seconds of the probe, or not measured and why (the run failed, or this "
                                      "process trained no steps: a resume after the run's last checkpoint)"),
        ("input_cores", "", "the CPU cores this process's input could use (its affinity), per worker"),
        ("input_capacity_per_core", "images/s", "input_capacity_images_per_sec / (input_cores x workers): the host's "
                                                "input rate per core, what advise and predict scale with"),
        ("input_headroom", "1", "input_capacity_images_per_sec / images_per_sec: how many times faster the input can "
                                "go than training consumed it (near 1 or below: input-bound); on simulated CPU "
                                "replicas 1 / input_headroom is the share of the shared cores' time input needed"),
        ("input_headroom_uncertainty", "1", "its standard error (the two rates' relative errors)"),
        ("input_verdict", "", "input-bound (headroom under 1.25), near (under 2) or fed; empty when not measured"),
        ("input_note", "", "one sentence: the verdict, its figures and errors (on simulated replicas, the cores' share)"),
        ("data_service", "", "the tf.data service the input came through, or null: address, mode, job, workers "
                             "(the workers the dispatcher had, when it could tell)"),
    ])
    + _fields("breakdown (measure=True)", [
        ("breakdown_step_time_s", "s", "the real training step (the run's own input), median of the breakdown's "
                                       "rounds: each round times it, the step without input and the step without "
                                       "the all-reduce, interleaved, so the parts below split this step"),
        ("breakdown_step_time_uncertainty_s", "s", "bootstrap standard error of breakdown_step_time_s"),
        ("step_time_no_input_s", "s", "the full step on one batch already on the devices (no input pipeline), median "
                                      "of the rounds"),
        ("compute_time_s", "s", "the same step without the gradient all-reduce, median of the rounds"),
        ("micro_step_time_s", "s", "compute_time_s / accumulate, derived, not timed apart: one micro-batch's forward "
                                   "and backward pass (with its share of the update); an optimizer step is accumulate "
                                   "of them and one all-reduce"),
        ("allreduce_time_s", "s", "median over rounds of (step without input - compute): the all-reduce the step "
                                  "pays; NaN when the part failed (allreduce_time_status)"),
        ("allreduce_direct_time_s", "s", "the gradient all-reduce timed alone (nothing to overlap with)"),
        ("input_wait_s", "s", "median over rounds of (step - step without input): waiting for input; NaN when the "
                              "part failed (input_wait_status)"),
        ("other_time_s", "s", "breakdown_step_time_s - the medians of compute, all-reduce and input wait (medians do "
                              "not add): zero within 3 of its errors when the parts add up"),
        ("compute_time_uncertainty_s", "s", "bootstrap standard error of compute_time_s (rounds resampled)"),
        ("allreduce_time_uncertainty_s", "s", "bootstrap standard error of allreduce_time_s"),
        ("allreduce_direct_time_uncertainty_s", "s", "standard error of allreduce_direct_time_s (the paired "
                                                     "differences of the call with and without the all-reduce)"),
        ("input_wait_uncertainty_s", "s", "bootstrap standard error of input_wait_s"),
        ("other_time_uncertainty_s", "s", "bootstrap standard error of other_time_s"),
        ("compute_time_status", "", "measured | within noise (under 2 standard errors above zero, and not 3 below "
                                    "it: its size is not known, drawn hollow, never a finding) | failed (negative "
                                    "beyond 3 standard errors: the value is NaN; a time cannot be negative)"),
        ("allreduce_time_status", "", "the all-reduce's status, as compute_time_status"),
        ("input_wait_status", "", "the input wait's status, as compute_time_status"),
        ("other_time_status", "", "within noise (the parts add up) or measured (they do not)"),
        ("breakdown_rounds", "1", "interleaved rounds the parts are medians of"),
        ("breakdown_adds_up", "", "true when no part failed, compute is not longer than the step beyond the noise "
                                  "of their difference, and other_time_s is zero within 3 of its errors (the medians "
                                  "of the rounds' differences agree with the difference of their medians)"),
        ("breakdown_note", "", "which parts are within noise or failed, whether the parts add up to the step, and "
                               "whether that step is training's"),
        ("breakdown_step_matches_training", "", "breakdown_step_time_s equals step_time_s within 2 of their combined "
                                                "errors; false: the rounds saw another machine state, the parts are "
                                                "shares of their own step (null: not comparable)"),
        ("input_wait_fraction", "1", "input_wait_s / breakdown_step_time_s; null unless input_wait_status is measured (a part "
                                     "within noise has no known share)"),
        ("communication_fraction", "1", "allreduce_time_s / (compute_time_s + allreduce_time_s); null unless both measured"),
        ("communication_note", "", "one sentence: compute-bound or communication-bound, with the times"),
        ("imbalance", "1", "max / mean of examples_per_replica (1.0 = every replica did the same work)"),
        ("measure_time_s", "s", "time the measurement took, after training (the breakdown's rounds included)"),
        ("measure_cost", "", "where measure_time_s went: the rounds, the direct all-reduce, FLOPs and the peak"),
        ("measure_budget_s", "s", "what the breakdown's rounds could spend: 10% of the run's wall time before them, "
                                  "less the input probe and a reserve for what follows (measure.breakdown.budget)"),
        ("measure_share", "1", "wall_breakdown's measurement_s / wall_time_s: what measuring cost the run (the budget, "
                               "--measure-budget, 0.10 unless set, keeps it under that: the breakdown's rounds are "
                               "left out where even their least does not fit, which breakdown_method says)"),
        ("breakdown_method", "", "how the parts were timed: interleaved rounds of the step, the step without input "
                                 "and the step without the all-reduce; or, where that step's trace did not fit the "
                                 "budget, the all-reduce timed alone (allreduce_direct_time_s) and compute the step "
                                 "without input less it; or \"not measured: ...\" where even the rounds' least "
                                 "(3 rounds of two one-step calls) did not fit the measuring budget"),
        ("measure_error", "", "what could not be measured, when something could not"),
    ])
    + _fields("FLOPs (measure=True)", [
        ("flops_per_example", "FLOP", "training FLOPs per example (3 x forward)"),
        ("forward_flops_per_example", "FLOP", "forward FLOPs per example"),
        ("flops_source", "", "how the forward FLOPs were counted (tf_profiler or analytic)"),
        ("achieved_flops", "FLOP/s", "flops_per_example x images_per_sec"),
        ("peak_flops", "FLOP/s", "the devices' peak: rated (GPUs) or a measured matmul (CPU)"),
        ("peak_flops_source", "", "where peak_flops comes from"),
        ("mfu", "1", "model FLOPs utilisation: achieved_flops / peak_flops"),
    ])
    + _fields("gradient noise scale (noise_scale=True)", [
        ("noise_scale", "", "B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018): the ratio of the per-step unbiased "
                            "estimates averaged over the later half of the run; null when the averaged |G|^2 is not "
                            "positive"),
        ("noise_scale_interval", "", "90% interval of noise_scale, [lo, hi] (bootstrap over blocks of 10 steps; null for a bound "
                                     "not found)"),
        ("noise_scale_reliable", "", "false when the run stayed near chance, too few steps were measured, the |G|^2 "
                                     "estimate is not positive or the interval spans more than a factor of 3"),
        ("noise_scale_warnings", "", "why noise_scale is not reliable (a list; empty when it is)"),
        ("noise_scale_window_steps", "", "valid steps in the later half that noise_scale averages"),
        ("noise_scale_window", "", "where in training it was measured: [first step, last step, steps in the run]"),
        ("noise_scale_growth", "", "B_simple of the window's second half over its first half: the noise scale grows "
                                   "as the loss falls (noise_scale.growth)"),
        ("noise_scale_growth_interval", "", "90% interval of noise_scale_growth, [lo, hi] (block bootstrap)"),
        ("noise_scale_early", "", "true when it was still growing over the window (the growth's interval above 1): "
                                  "measured in early training, it understates the batch that pays off later; null "
                                  "when that cannot be told"),
        ("noise_scale_ema", "", "the ratio of the EMAs at the end (steps.csv's noise_scale, last row)"),
        ("noise_scale_grad_sq", "", "EMA of the unbiased |G|^2"),
        ("noise_scale_trace", "", "EMA of the unbiased tr(Sigma)"),
        ("noise_scale_steps", "", "steps that entered the EMAs"),
        ("noise_scale_ema_decay", "1", "EMA decay per step"),
        ("noise_scale_small_batch", "", "the small batch of the estimator (a replica's, or half the batch on one)"),
        ("noise_scale_big_batch", "", "the big batch of the estimator (the global batch)"),
    ])
    + _fields("profiler (profile_steps)", [
        ("profiled_steps", "", "the steps traced by TensorFlow's profiler, A-B (left out of the throughput figures)"),
        ("profile_traces", "", "the trace files written (*.xplane.pb under tensorboard/plugins/profile)"),
    ])
    + _fields("monitor", [
        ("monitor", "", "monitor.csv summarised over the timed phase (measure.monitor.summarize: utilisation, "
                        "memory, temperature, power, energy per GPU; flags for idle GPUs and thermal or "
                        "hardware slowdowns; notes for GPUs at their power cap, which is not a fault)"),
    ])
)

FIELDS: dict[str, Field] = {f.name: f for f in _ALL}


# The metrics a run is given (tftoolkit.train(metrics=...), a compiled model's, a recorded fit's) are named by the
# user: each is a field val_<name> (its value after the last evaluation) or train_<name> (its last training value,
# from a recorded model.fit), documented by this rule rather than one by one.
METRIC_PREFIXES = ("val_", "train_")


def is_metric(name: str) -> bool:
    return name.startswith(METRIC_PREFIXES) and name not in FIELDS


def check(summary: dict) -> dict:
    """``summary`` unchanged, after checking every field is documented here (the writer calls this); the given
    metrics' fields (``is_metric``) follow their rule."""
    unknown = sorted(n for n in set(summary) - set(FIELDS) if not is_metric(n))
    if unknown:
        raise ValueError(f"summary fields not documented in tftoolkit/summary.py: {', '.join(unknown)}")
    return summary


# The fields that hold numbers (besides the given metrics'): their nulls read back as NaN. device_memory_peak_bytes
# is None on CPU, where there is nothing to measure, as the run returns it.
_NUMBER_UNITS = ("s", "images/s", "bytes", "FLOP", "FLOP/s", "1")
_UNITLESS_NUMBERS = frozenset({"initial_loss", "final_loss", "final_loss_mean10", "val_loss", "epochs", "noise_scale",
                               "noise_scale_interval", "noise_scale_ema", "noise_scale_grad_sq", "noise_scale_trace"})


def holds_number(name: str) -> bool:
    """Whether field ``name`` is a number (or numbers) when known: a null of it in summary.json is NaN."""
    f = FIELDS.get(name)
    if f is None:
        return is_metric(name)
    return name in _UNITLESS_NUMBERS or (f.unit in _NUMBER_UNITS and name != "device_memory_peak_bytes")


def _unknowns_as_nan(name: str, value):
    if value is None:
        return math.nan if holds_number(name) else None
    if isinstance(value, list):
        return [_unknowns_as_nan(name, v) for v in value]
    if isinstance(value, dict):  # wall_breakdown's parts are numbers; a segment's keys are fields' names
        return {k: (math.nan if v is None else v) if holds_number(name) else _unknowns_as_nan(k, v)
                for k, v in value.items()}
    return value


def names(*wanted: str) -> tuple[str, ...]:
    """``wanted``, after checking each is a documented field: readers declare the fields they read with it."""
    unknown = [n for n in wanted if n not in FIELDS]
    if unknown:
        raise KeyError(f"not summary fields: {', '.join(unknown)} (see tftoolkit/summary.py)")
    return wanted


def read(path) -> dict:
    """A run's summary.json (``path``: the file or its run directory).

    A run written before a field existed, or that did not measure it, lacks that field: readers use
    ``.get(name, default)``. A number's null (unknown, or not finite) comes back as NaN.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    try:
        data = fileio.read_json(path)
    except ValueError as e:  # truncated, not JSON, not UTF-8
        raise UnreadableRunError(f"{path} is not readable JSON ({first_line(e, 120)}); it is not a summary a run "
                                 "wrote: run the run again, or leave it out") from None
    if not isinstance(data, dict):
        raise UnreadableRunError(f"{path} holds a JSON {type(data).__name__}, not a run's summary (an object of "
                                 "fields); run the run again, or leave it out")
    for name, value in data.items():
        if not _of_its_type(name, value):
            raise UnreadableRunError(f"{path}: field {name!r} is {value!r}, not a number; not a summary a run wrote: "
                                     "run the run again, or leave it out")
    return {k: _unknowns_as_nan(k, v) for k, v in data.items()}


# Counts a run writes as whole numbers (the fields holds_number names are the measured numbers).
_COUNTS = frozenset({"resumed_from_step", "replicas", "workers", "hosts", "replicas_per_worker", "params",
                     "allreduce_packs", "train_examples", "num_classes", "dropped_examples", "per_replica_batch",
                     "global_batch", "accumulate", "base_batch", "steps_per_epoch", "steps", "timed_steps"})


def _of_its_type(name: str, value) -> bool:
    """Whether a field's value is of the kind the run writes: a number (or null) for a number or a count."""
    def number(v):
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))

    if name in _COUNTS:
        return value is None or (isinstance(value, int) and not isinstance(value, bool))
    if holds_number(name) and not isinstance(value, dict):
        return all(number(v) for v in value) if isinstance(value, list) else number(value)
    return True


def table() -> str:
    """The fields as a Markdown table (README, ``tftoolkit train --help`` readers)."""
    rows = ["| field | unit | meaning |", "|---|---|---|"]
    for f in _ALL:
        rows.append(f"| `{f.name}` | {f.unit or ''} | {f.meaning} |")
    return "\n".join(rows)


def measured_with(row) -> str:
    """How a throughput figure was measured, from its run's summary: precision, XLA, op determinism, data
    placement and the all-reduce that really ran (each changes images/sec on GPUs). Empty for older runs."""
    def get(key):
        value = row.get(key) if hasattr(row, "get") else None
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else value

    parts = []
    if get("precision"):
        parts.append(str(get("precision")))
    jit = get("jit_effective")
    if jit is not None:
        parts.append("XLA" if bool(jit) else "no XLA")
    det = get("deterministic")
    if det is not None:
        parts.append("deterministic ops" if bool(det) else "non-deterministic ops")
    if get("data_placement"):
        parts.append(f"data on the {'devices' if get('data_placement') == 'device' else 'host'}")
    if get("cross_device_ops"):
        parts.append(f"all-reduce {get('cross_device_ops')}")
    return ", ".join(parts)
