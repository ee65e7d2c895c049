"""Where a training step's time goes: compute, gradient all-reduce, input wait; load balance; FLOPs and MFU.

Runs after training (``RunConfig.measure``), on the trained run's strategy and shapes, and adds these
fields to summary.json:

  step_time_no_input_s    the full step on one real batch already on the devices (no input pipeline at all)
  compute_time_s          the same step with no gradient all-reduce: each replica applies its own gradient
                          (engine.step.build_engine(allreduce=False)), so the only thing missing is communication
  micro_step_time_s       compute_time_s / accumulate (derived): with --accumulate K an optimizer step is K micro-steps
                          (forward and backward of one micro-batch each, their share of the update included) and
                          one all-reduce; without, the compute itself
  allreduce_time_s        step_time_no_input_s - compute_time_s (median of interleaved pairs, >= 0): the
                          all-reduce time the step really pays, after any overlap with compute (once per
                          optimizer step, whatever K)
  *_uncertainty_s         the standard error of compute, all-reduce (of the paired differences) and input wait;
                          a part smaller than twice its uncertainty is "within noise", and ``breakdown_note`` says
                          which. The parts are timed apart, so they need not add up to the step exactly
  allreduce_direct_time_s the gradient all-reduce timed alone (allreduce.time_allreduce on the model's
                          gradient shapes, as the step packs them): its cost with nothing to overlap
  input_wait_s            training's median step time - step_time_no_input_s (>= 0)
  input_wait_fraction     input_wait_s / training's step time
  communication_fraction  allreduce_time_s / (compute_time_s + allreduce_time_s)
  communication_note      one sentence; says so when communication exceeds compute
  imbalance               max / mean of the examples each replica trained on (1.0 = balanced)
  flops_per_example ... mfu  see tftoolkit.measure.flops

Measuring never changes the trained model: the extra steps on the trained engine run from a snapshot of
every model and optimizer variable, restored afterwards; the no-all-reduce engine is a separate model.
The timed training loop itself is untouched: all of this happens after it, at the cost of a few loops.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

log = logging.getLogger("tftoolkit")

# Interleaved (full step, compute-only step) loop pairs of steps_per_loop steps, after a one-step warm-up each.
# Interleaving makes each pair see the same machine state (turbo, other processes), so their difference is
# the all-reduce.
MEASURE_ROUNDS = 5  # enough pairs for a standard error of each part
DIRECT_ALLREDUCE_REPEATS = 5

FIELDS = ("step_time_no_input_s", "compute_time_s", "micro_step_time_s", "allreduce_time_s", "allreduce_direct_time_s", "input_wait_s",
          "compute_time_uncertainty_s", "allreduce_time_uncertainty_s", "allreduce_direct_time_uncertainty_s",
          "input_wait_uncertainty_s", "breakdown_note",
          "input_wait_fraction", "communication_fraction", "communication_note", "imbalance", "flops_per_example",
          "forward_flops_per_example", "flops_source", "achieved_flops", "peak_flops", "peak_flops_source", "mfu")
NOISE_SIGMAS = 2.0  # a part within this many standard errors of zero is reported as within noise


# --- formulas (pinned by tests/test_measure.py) ----------------------------------------------------------
def standard_error(values) -> float:
    v = np.asarray(list(values), dtype=float)
    v = v[np.isfinite(v)]
    return float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan


def breakdown(step_time_s: float, step_no_input_s: float, compute_s: float, replicas: int,
              allreduce_s: float | None = None, *, full_all=None, compute_all=None,
              step_time_uncertainty_s: float = math.nan, accumulate: int = 1) -> dict:
    """Split a step into compute, all-reduce and input wait; ``allreduce_s`` defaults to the difference
    ``step_no_input_s - compute_s``. Negative differences (timing noise) are clipped to 0 in the fields, and the
    uncertainties (from the per-round timings ``full_all`` / ``compute_all``, and the training step's own) say
    which parts are within noise (``breakdown_note``)."""
    if allreduce_s is None:
        allreduce_s = step_no_input_s - compute_s
    raw_allreduce = allreduce_s
    allreduce_s = max(0.0, allreduce_s) if allreduce_s == allreduce_s else math.nan
    raw_wait = step_time_s - step_no_input_s
    input_wait = max(0.0, raw_wait) if raw_wait == raw_wait else math.nan
    full_all = list(full_all) if full_all is not None else []
    compute_all = list(compute_all) if compute_all is not None else []
    compute_se = standard_error(compute_all)
    allreduce_se = (standard_error(np.subtract(full_all, compute_all)) if len(full_all) == len(compute_all)
                    else math.nan)
    full_se = standard_error(full_all)
    wait_se = math.hypot(full_se, step_time_uncertainty_s) if step_time_uncertainty_s == step_time_uncertainty_s \
        else full_se
    noisy = [name for name, value, se in (("all-reduce", raw_allreduce, allreduce_se), ("input wait", raw_wait, wait_se))
             if se == se and value == value and abs(value) < NOISE_SIGMAS * se]
    denom = compute_s + allreduce_s
    comm_frac = allreduce_s / denom if denom > 0 else math.nan
    return {
        "step_time_no_input_s": step_no_input_s,
        "compute_time_s": compute_s,
        "micro_step_time_s": compute_s / accumulate,
        "allreduce_time_s": allreduce_s,
        "input_wait_s": input_wait,
        "compute_time_uncertainty_s": compute_se,
        "allreduce_time_uncertainty_s": allreduce_se,
        "input_wait_uncertainty_s": wait_se,
        "breakdown_note": (f"{' and '.join(noisy)} within noise (under {NOISE_SIGMAS:g} standard errors of zero)"
                           if noisy else "every part above noise"),
        "input_wait_fraction": input_wait / step_time_s if step_time_s > 0 else math.nan,
        "communication_fraction": comm_frac,
        "communication_note": communication_note(compute_s, allreduce_s, replicas),
    }


def communication_note(compute_s: float, allreduce_s: float, replicas: int) -> str:
    if replicas <= 1:
        return "one replica: there is no gradient all-reduce"
    if not (compute_s == compute_s and allreduce_s == allreduce_s):
        return "communication not measured"
    ms = f"all-reduce {allreduce_s * 1e3:.2f} ms vs compute {compute_s * 1e3:.2f} ms per step"
    if allreduce_s > compute_s:
        return (f"communication-bound: the gradient all-reduce takes longer than the compute ({ms}); this is "
                "where more replicas stop paying off. A larger per-replica batch, a faster all-reduce "
                "(tftoolkit bench allreduce) or fewer, larger gradients help")
    frac = allreduce_s / (compute_s + allreduce_s) if compute_s + allreduce_s > 0 else 0.0
    return f"compute-bound: the gradient all-reduce is {frac:.0%} of the step ({ms})"


def load_balance(examples_per_replica) -> dict:
    """Imbalance = max / mean of per-replica example counts (1.0 = every replica did the same work).

    Per-replica *time* is not measured: a MirroredStrategy step is one tf.function call that returns when
    the slowest replica is done, and TensorFlow exposes per-device op times only through the profiler's
    trace, too heavy to run on every training run. Counts catch the imbalance data parallelism can cause
    (an uneven last batch); identical devices then take the same time for the same work.
    """
    c = np.asarray(list(examples_per_replica), dtype=float)
    if c.size == 0 or c.mean() <= 0:
        return {"imbalance": math.nan}
    return {"imbalance": float(c.max() / c.mean())}


# --- timing ----------------------------------------------------------------------------------------------
def _time_loop(train_loop, iterator, n: int) -> float:
    """Seconds per step of one ``train_loop`` call of n steps (outputs fetched: the devices are done)."""
    from ..engine.loop import timed_call

    return timed_call(train_loop, iterator, n)[1] / n


class Replay:
    """Stands in for the distributed iterator ``train_loop`` takes: every ``next`` gives the same per-replica
    ``values``, already on the replicas' devices (``engine.feed.Feed.replay``: one batch sliced as the pipeline
    slices it, or indices into the device-resident split).

    Not a tf.data iterator on purpose: deleting one used to wait for tf.data's autotuning threads (one per
    device for a distributed iterator), which took from 0.3 s to over a minute on a loaded 2-core machine
    (gdb: ~RootDataset::Iterator waiting on Model::OptimizeLoop). The price is one extra trace of the trained
    engine's loop, since a new argument type means a new trace.
    """

    def __init__(self, values):
        self.values = values

    def __iter__(self):
        return self

    def __next__(self):
        return self.values


def _snapshot(engine):
    variables = list(engine.model.variables) + list(engine.optimizer.variables)
    return variables, [np.array(v.numpy()) for v in variables]


def _restore(snapshot) -> None:
    for v, value in zip(*snapshot):
        v.assign(value)


def time_step_parts(engine, config, source, train_examples: int, rounds: int = MEASURE_ROUNDS) -> dict:
    """Median per-step time of the full step and of the compute-only step, both on one batch already on the
    devices; the all-reduce is the median of the paired differences."""
    from ..engine.step import build_engine

    strategy = engine.strategy
    n = config.steps_per_loop
    # One real batch, already on the devices, replayed every step: the step with no input pipeline at all.
    iterator = Replay(engine.feed.replay(strategy, source, config))
    saved = _snapshot(engine)
    try:
        bare = build_engine(config, strategy, source, train_examples, allreduce=False, model=engine.model_source
                            if callable(engine.model_source) else None, feed=engine.feed, loss=engine.task_spec[0],
                            metrics=engine.task_spec[1])
        # Warm-up: one step each (the step count is a tensor, so these traces serve the timed loops too).
        _time_loop(engine.train_loop, iterator, 1)
        _time_loop(bare.train_loop, iterator, 1)
        full, compute = interleaved(lambda: _time_loop(engine.train_loop, iterator, n),
                                    lambda: _time_loop(bare.train_loop, iterator, n), rounds)
    finally:
        _restore(saved)
    return {"full_s": float(np.median(full)), "compute_s": float(np.median(compute)),
            "allreduce_s": float(np.median(full - compute)), "full_all_s": full.tolist(),
            "compute_all_s": compute.tolist()}


def interleaved(time_a, time_b, rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """``rounds`` alternating (a, b) timings. Each is one engine.timer region (devices synchronised before the
    clock starts and before it stops), so what one call left running on a GPU cannot be charged to the next."""
    a, b = [], []
    for _ in range(rounds):
        a.append(time_a())
        b.append(time_b())
    return np.array(a), np.array(b)


def direct_allreduce_time(engine, repeats: int = DIRECT_ALLREDUCE_REPEATS, jit: bool = False) -> tuple[float, float]:
    """The model's gradient all-reduce alone, on the run's strategy, through the all-reduce the step uses: under
    XLA (``jit``) that is MirroredStrategy's collective all-reduce, not its cross_device_ops; in the run's
    --allreduce-dtype, casts included (as one pack: with several, the step's calls add their latencies). Returns
    (seconds, standard error); a time within the call's noise gets up to 4x the repeats (allreduce.EXTRA_REPEATS),
    in one process only: each worker of a multi-worker run judges the noise of its own clock, and a worker that
    repeats when another does not starts all-reduces the other never joins (the run then records a measure_error),
    so workers run the same fixed repeats."""
    from .allreduce import EXTRA_REPEATS, gradient_shapes, time_allreduce

    shapes, dtypes = gradient_shapes(engine.model)
    strategy = engine.strategy
    one_process = len(strategy.extended.worker_devices) == strategy.num_replicas_in_sync
    t = time_allreduce(strategy, shapes, dtypes=dtypes, repeats=repeats, warmup=1, iters=1, jit=jit,
                       max_repeats=(EXTRA_REPEATS if one_process else 1) * repeats,
                       allreduce_dtype=engine.exchange.dtype)
    return t["time_s"], t["time_err_s"]


def summary_fields(engine, config, setup, source, summary: dict, hosts: int = 1) -> dict:
    """Every measurement field for summary.json; a measurement that fails is NaN with ``measure_error``.
    ``hosts``: distinct hosts of a multi-worker run (for the peak of CPU workers)."""
    from . import flops

    out = {k: math.nan for k in FIELDS}
    out["communication_note"] = ""
    errors = []
    t0 = time.perf_counter()
    try:
        parts = time_step_parts(engine, config, source, summary["train_examples"])
        step = summary.get("step_time_s", math.nan)
        ips, ips_se = summary.get("images_per_sec", math.nan), summary.get("images_per_sec_uncertainty", math.nan)
        step_se = step * ips_se / ips if ips and ips == ips and ips_se == ips_se else math.nan
        out.update(breakdown(step, parts["full_s"], parts["compute_s"], setup.replicas,
                             allreduce_s=parts["allreduce_s"], full_all=parts["full_all_s"],
                             compute_all=parts["compute_all_s"], step_time_uncertainty_s=step_se,
                             accumulate=config.accumulate))
    except Exception as e:  # noqa: BLE001 - a failed measurement must not fail a finished run
        errors.append(f"step breakdown: {type(e).__name__}: {e}")
    try:
        from ..engine.step import jit_effective

        jit = jit_effective(config, setup.kind, setup.replicas)
        out["allreduce_direct_time_s"], out["allreduce_direct_time_uncertainty_s"] = (
            direct_allreduce_time(engine, jit=jit) if setup.replicas > 1 else (0.0, 0.0))
    except Exception as e:  # noqa: BLE001
        errors.append(f"direct all-reduce: {type(e).__name__}: {e}")
    out.update(load_balance(summary.get("examples_per_replica", [])))
    try:
        out.update(flops.utilisation(engine.model, source.input_shape, config.precision, setup,
                                     summary.get("images_per_sec", math.nan), workers=config.workers, hosts=hosts))
    except Exception as e:  # noqa: BLE001
        errors.append(f"flops: {type(e).__name__}: {e}")
    out["measure_time_s"] = time.perf_counter() - t0
    if errors:
        out["measure_error"] = "; ".join(str(x).splitlines()[0] for x in errors)
        log.warning("measurement incomplete: %s", out["measure_error"])
    else:
        log.info("%s; %s; MFU %.1f%% (%s)", format_line(summary.get("step_time_s", math.nan),
                                                         {**out, "accumulate": config.accumulate}),
                 out["communication_note"], out["mfu"] * 100, out["peak_flops_source"])
    return out


def format_line(step_time_s: float, f: dict) -> str:
    """The breakdown as one line that claims only what was measured: each part with its standard error, the
    ones within noise marked, and no "=" (the parts are timed apart, so they need not add up to the step)."""
    noisy = f.get("breakdown_note", "").split(" within noise")[0] if "within noise" in f.get("breakdown_note", "") \
        else ""

    def part(name, key):  # key "compute_time_s" -> its uncertainty "compute_time_uncertainty_s"
        value, se = f.get(key, math.nan), f.get(key[:-2] + "_uncertainty_s", math.nan)
        text = f"{name} {value * 1e3:.2f}" + (f" ± {se * 1e3:.2f}" if se == se else "") + " ms"
        return text + (" (within noise)" if name in noisy else "")

    compute = part("compute", "compute_time_s")
    micro, k = f.get("micro_step_time_s", math.nan), f.get("accumulate", 1)
    if k > 1 and micro == micro:
        compute += f" ({k} micro-steps of {micro * 1e3:.2f} ms, one all-reduce)"
    return (f"step {step_time_s * 1e3:.2f} ms; timed apart: " + ", ".join(
        [compute, part("all-reduce", "allreduce_time_s"), part("input wait", "input_wait_s")]))
