"""Where a training step's time goes: compute, gradient all-reduce, input wait; load balance; FLOPs and MFU.

Runs after training (``RunConfig.measure``), on the trained run's strategy and shapes. The step is split in
interleaved rounds, timed while the run's training iterator is still alive (``measure_parts``): each round times
one call of the same length of three variants, in a rotated order,

  A  the real training step (the run's own input pipeline)
  B  the same step on the run's own input cut to one step's elements, cached and repeated (nothing to wait for)
  C  B without the gradient all-reduce (the engine's ``compute_loop``, on training's own model and optimizer: each
     replica applies its own gradient, so the only thing missing is communication; one replica has no C, and
     where C's trace does not fit the measuring budget (below) there is none either: then C = B - the all-reduce
     timed alone, and breakdown_method says so)

so that a round's three calls see the same machine state, and the parts split the step they were timed beside,
not one from another moment (on a loaded host the two need not agree). summary.json gets:

  breakdown_step_time_s   median of A, the step the parts split (training's step_time_s was timed earlier)
  step_time_no_input_s    median of B
  compute_time_s          median of C
  breakdown_method        how the parts were timed: with C, or with the all-reduce timed alone
  micro_step_time_s       compute_time_s / accumulate (derived): with --accumulate K an optimizer step is K
                          micro-steps and one all-reduce
  allreduce_time_s        median of B - C: the all-reduce the step really pays, after any overlap with compute
  input_wait_s            median of A - B
  other_time_s            breakdown_step_time_s - the three medians (medians do not add; zero within its error)
  *_uncertainty_s         each median's bootstrap standard error (rounds resampled whole)
  *_status                each part: measured, within noise (under 2 errors above zero and not 3 below it: drawn
                          hollow, never a finding), or failed (negative beyond 3 errors: NaN, never clipped to 0)
  breakdown_adds_up       no part failed, compute fits in the step, and "other" is zero within 3 of its errors
                          (docs/guides/measuring.md)
  breakdown_note          which parts are within noise or failed, and whether the parts add up
  breakdown_step_matches_training  the step the parts split is training's step within their errors
  allreduce_direct_time_s the gradient all-reduce timed alone (allreduce.time_allreduce on the model's
                          gradient shapes, as the step packs them): its cost with nothing to overlap
  input_wait_fraction     input_wait_s / breakdown_step_time_s (NaN unless the input wait was measured)
  communication_fraction  allreduce_time_s / (compute_time_s + allreduce_time_s) (NaN unless both were measured)
  communication_note      one sentence; says so when communication exceeds compute
  imbalance               max / mean of the examples each replica trained on (1.0 = balanced)
  flops_per_example ... mfu  see tftoolkit.measure.flops
  measure_time_s, measure_cost  what measuring took, and where (the run logs it with its share of the run)
  measure_budget_s        what the rounds could spend (``budget``)

Cost: measuring gets a budget, MEASURE_BUDGET of the run's wall time so far (``budget``: less what the input probe
took, and RESERVE_SHARE of it kept for what follows the rounds: the replayed input, the all-reduce timed alone, FLOPs
and the peak). ``plan`` sizes the rounds to it: at least MIN_ROUNDS rounds of one step (the least a median and a
bootstrap error need, whatever they cost), more and longer calls while they fit. The step without the all-reduce needs
one more trace of the training loop (about training's own first-call trace): where that and its rounds do not fit the
budget, the rounds time the step and the step without input only, and the all-reduce part is the all-reduce timed
alone (``allreduce_direct_time_s``, with its error: its cost with nothing to overlap), compute the step without input
less it (``breakdown_method`` says which). Fewer rounds give larger errors: a part inside them is within noise.
summary.json records measure_budget_s and measure_share (the measurement's share of the run's wall time).

Measuring never changes the trained model: the extra steps on the trained engine (with and without the all-reduce)
run from a snapshot of every model and optimizer variable, restored afterwards.
The timed training loop itself is untouched: all of this happens after it.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from .parts import (ADD_UP_FLOOR_S, FAIL_SIGMAS, BOOTSTRAP, FAILED, MAX_ROUNDS, MEASURE_BUDGET,  # noqa: F401
                    MEASURED, MIN_ROUNDS, PARTS, RESERVE_SHARE, WITHIN_NOISE, Breakdown, Part, Plan, breakdown, budget,
                    communication_note, floor_s, known, load_balance, plan, split)
from .stats import NOISE_SIGMAS  # a part within this many standard errors of zero is within noise

log = logging.getLogger("tftoolkit")

# Rounds of interleaved calls of the same length (parts.plan sizes them to the budget): the real training step (the
# run's own iterator), the same step on one batch already on the devices (no input), and that step without the
# all-reduce where its trace fits the budget. Interleaving (in a rotated order) makes each round's calls see the same
# machine state (turbo, other processes), so per-round differences are the parts, and the step they split is timed
# beside them.
DIRECT_ALLREDUCE_REPEATS = 5

FIELDS = ("breakdown_step_time_s", "step_time_no_input_s", "compute_time_s", "micro_step_time_s", "allreduce_time_s",
          "allreduce_direct_time_s", "input_wait_s", "other_time_s", "breakdown_step_time_uncertainty_s",
          "compute_time_uncertainty_s", "allreduce_time_uncertainty_s", "allreduce_direct_time_uncertainty_s",
          "input_wait_uncertainty_s", "other_time_uncertainty_s", "compute_time_status", "allreduce_time_status",
          "input_wait_status", "other_time_status", "breakdown_rounds", "breakdown_adds_up", "breakdown_note",
          "breakdown_step_matches_training", "breakdown_method",
          "input_wait_fraction", "communication_fraction", "communication_note", "imbalance", "flops_per_example",
          "forward_flops_per_example", "flops_source", "achieved_flops", "peak_flops", "peak_flops_source", "mfu")


# --- timing ----------------------------------------------------------------------------------------------
def _time_loop(train_loop, iterator, n: int) -> float:
    """Seconds per step of one ``train_loop`` call of n steps (outputs fetched: the devices are done)."""
    from ..engine.loop import timed_call

    return timed_call(train_loop, iterator, n)[1] / n


class Replay:
    """Stands in for the distributed iterator ``train_loop`` takes: every ``next`` gives the same per-replica
    ``values``, already on the replicas' devices (``engine.feed.Feed.replay``: one batch sliced as the pipeline
    slices it, or indices into the device-resident split). For benchmarks that time a step without input.

    The breakdown uses the run's own input replayed instead (data.pipeline.replayed): an argument of another type
    than the training iterator, like this one, costs one more trace of the training loop.
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


def time_step_parts(engine, config, source, train_examples: int, iterator, rounds: int = MIN_ROUNDS,
                    steps: int | None = None, split: bool = True) -> dict:
    """Per-round seconds per step of three calls of ``steps`` steps (default steps_per_loop), interleaved in a
    rotated order: the real step on ``iterator`` (the run's own training iterator: the input pipeline included),
    the same step on one batch already on the devices, and that step without the all-reduce (the engine's own
    ``compute_loop``: training's model and optimizer, no second engine to build). One replica all-reduces nothing:
    its rounds time the first two, and its compute is the step without input; so do several replicas without
    ``split`` (the budget could not hold the third variant's trace). Every variable is restored afterwards, so the
    trained model is unchanged."""
    strategy = engine.strategy
    n = steps or config.steps_per_loop
    t0 = time.perf_counter()
    # The run's own input, cut to one step's elements, cached and repeated: the step with no input to wait for. Its
    # iterator has the training iterator's type, so the training loop's trace serves it (no trace of its own).
    replay = iter(engine.feed.train_input(strategy, source, config, replay=True))
    saved = _snapshot(engine)
    try:
        variants = [(engine.train_loop, iterator), (engine.train_loop, replay)]
        if strategy.num_replicas_in_sync > 1 and split:
            variants.append((engine.compute_loop, replay))
        # Warm-up: the real step needs none (training traced and ran it); the loop without the all-reduce is traced
        # and run one step (the step count is a tensor: one trace serves every call), which fills the replayed
        # input's cache; without it, one element pulled from the host fills it, with no step to pay for.
        if len(variants) == 3:
            _time_loop(*variants[2], 1)
        else:
            next(replay)
        warm_s = time.perf_counter() - t0
        times = interleaved(*[lambda f=f, it=it: _time_loop(f, it, n) for f, it in variants], rounds=rounds)
    finally:
        _restore(saved)
    return {"step_all_s": times[0].tolist(), "no_input_all_s": times[1].tolist(),
            "compute_all_s": times[-1 if len(times) == 3 else 1].tolist(), "steps_per_call": n, "warmup_s": warm_s,
            "split": len(times) == 3}


def interleaved(*timers, rounds: int) -> list[np.ndarray]:
    """``rounds`` rounds of one timing of each of ``timers`` (functions returning seconds), the order rotated every round (no variant always
    runs after the same one). Each is one engine.timer region (devices synchronised before the clock starts and
    before it stops), so what one call left running on a GPU cannot be charged to the next."""
    out = [[] for _ in timers]
    for r in range(rounds):
        for i in (np.arange(len(timers)) + r) % len(timers):
            out[i].append(timers[i]())
    return [np.array(x) for x in out]


def direct_allreduce_time(engine, repeats: int = DIRECT_ALLREDUCE_REPEATS, jit: bool = False,
                          extra: bool = True) -> tuple[float, float]:
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
                       max_repeats=(EXTRA_REPEATS if one_process and extra else 1) * repeats,
                       allreduce_dtype=engine.exchange.dtype)
    return t["time_s"], t["time_err_s"]


def before_rounds(engine, config, setup, extra: bool = True) -> dict:
    """What is measured before the rounds, so that they get what is left of the budget: the all-reduce timed alone
    (``direct``: seconds and error; more repeats for one within its noise only with ``extra``, when the budget holds
    more than the rounds' floor) and the devices' peak FLOP/s (on CPU a matmul, once a process; flops caches it for
    summary_fields), with what each took."""
    from . import flops
    from ..engine.step import jit_effective

    out, t0 = {}, time.perf_counter()
    try:
        jit = jit_effective(config, setup.kind, setup.replicas)
        out["direct"] = direct_allreduce_time(engine, jit=jit, extra=extra) if setup.replicas > 1 else (0.0, 0.0)
    except Exception as e:  # noqa: BLE001 - a failed measurement must not fail a finished run
        out["direct_error"] = f"direct all-reduce: {type(e).__name__}: {e}"
    t1 = time.perf_counter()
    try:
        flops.peak_flops(setup, config.precision)
    except Exception:  # noqa: BLE001, S110 - summary_fields asks again and records why it failed
        pass
    out["direct_s"], out["peak_s"] = t1 - t0, time.perf_counter() - t1
    return out


def measure_parts(engine, config, source, iterator, step_s: float, trace_s: float = 0.0, elapsed_s: float = math.nan,
                  spent_s: float = 0.0, setup=None) -> dict:
    """The interleaved rounds (``time_step_parts``) while the run's training ``iterator`` is alive, after
    ``before_rounds`` (given the run's ``setup``), sized by ``plan`` to what is left of the budget (``budget``: the
    run's ``elapsed_s`` so far, ``spent_s`` measured already) at ``step_s`` a step, the loop's trace taking
    ``trace_s``; what fails is returned as ``error``, and rounds whose least (``floor_s``) is over the budget are
    not timed: ``skipped`` says so (a multi-worker run's workers take them whatever they cost, all alike)."""
    t0 = time.perf_counter()
    least = floor_s(step_s)
    pre = (before_rounds(engine, config, setup, extra=budget(elapsed_s, spent_s, config.measure_budget) > least)
           if setup else {})
    done = time.perf_counter() - t0
    budget_s = budget(elapsed_s + done, spent_s + done, config.measure_budget)
    t1 = time.perf_counter()
    if config.workers <= 1 and least > budget_s:  # a worker of several cannot leave them out alone (below)
        return {**pre, "skipped": over_budget(least, budget_s, config.measure_budget), "budget_s": budget_s,
                "seconds": time.perf_counter() - t0, "rounds_s": 0.0}
    # Every worker of a multi-worker run must run the same calls (each step's all-reduce joins them all), and each
    # would size the plan by its own clock: they take the fixed floor, with the step without the all-reduce.
    p = (plan(config.steps_per_loop, step_s, budget_s, trace_s, engine.strategy.num_replicas_in_sync)
         if config.workers <= 1 else Plan(MIN_ROUNDS, 1, True, budget_s))
    try:
        parts = time_step_parts(engine, config, source, source.train_examples, iterator, rounds=p.rounds,
                                steps=p.steps, split=p.split)
    except Exception as e:  # noqa: BLE001 - a failed measurement must not fail a finished run
        return {**pre, "error": f"step breakdown: {type(e).__name__}: {e}", "seconds": time.perf_counter() - t0,
                "budget_s": budget_s, "rounds_s": time.perf_counter() - t1}
    return {**pre, **parts, "seconds": time.perf_counter() - t0, "budget_s": budget_s,
            "rounds_s": time.perf_counter() - t1}


def over_budget(least_s: float, budget_s: float, share: float) -> str:
    """Why the rounds were left out: their least cost is over what the measuring budget leaves them."""
    return (f"not measured: its least ({MIN_ROUNDS} rounds of two one-step calls, about {least_s:.1f} s) is over the "
            f"{budget_s:.1f} s the measuring budget ({share:.0%} of the run, --measure-budget) leaves it; a longer "
            f"run or a larger --measure-budget measures it")


def summary_fields(engine, config, setup, source, summary: dict, hosts: int = 1, parts: dict | None = None) -> dict:
    """Every measurement field for summary.json; a measurement that fails is NaN with ``measure_error``.
    ``hosts``: distinct hosts of a multi-worker run (for the peak of CPU workers). ``parts``: ``measure_parts``'
    rounds, timed before the training iterator was released (without them, no step breakdown)."""
    from . import flops

    out = {k: math.nan for k in FIELDS}
    out["communication_note"] = out["breakdown_method"] = ""
    errors = []
    t0 = time.perf_counter()
    parts = parts or {}
    costs = {"rounds": parts.get("rounds_s", 0.0), "of which traces and warm-up": parts.get("warmup_s", 0.0)}
    if "direct" in parts or "direct_error" in parts:  # timed before the rounds (before_rounds)
        if "direct" in parts:
            out["allreduce_direct_time_s"], out["allreduce_direct_time_uncertainty_s"] = parts["direct"]
        else:
            errors.append(parts["direct_error"])
        costs["direct all-reduce"], costs["peak"] = parts.get("direct_s", 0.0), parts.get("peak_s", 0.0)
    else:
        try:
            from ..engine.step import jit_effective

            jit = jit_effective(config, setup.kind, setup.replicas)
            out["allreduce_direct_time_s"], out["allreduce_direct_time_uncertainty_s"] = (
                direct_allreduce_time(engine, jit=jit) if setup.replicas > 1 else (0.0, 0.0))
        except Exception as e:  # noqa: BLE001
            errors.append(f"direct all-reduce: {type(e).__name__}: {e}")
        costs["direct all-reduce"] = time.perf_counter() - t0
    if not parts:
        errors.append("step breakdown: not timed (no training iterator)")
    elif "skipped" in parts:  # by the budget: no error, said in the method and the note
        out["breakdown_method"] = out["breakdown_note"] = parts["skipped"]
        log.info("step breakdown %s", parts["skipped"])
    elif "error" in parts:
        errors.append(parts["error"])
    else:
        try:
            out.update(split_fields(parts, out, setup.replicas, config.accumulate))
            out.update(against_training(out, summary, parts.get("steps_per_call", 0), config.steps_per_loop))
        except Exception as e:  # noqa: BLE001
            errors.append(f"step breakdown: {type(e).__name__}: {e}")
    out.update(load_balance(summary.get("examples_per_replica", [])))
    t1 = time.perf_counter()
    try:
        out.update(flops.utilisation(engine.model, source.input_shape, config.precision, setup,
                                     summary.get("images_per_sec", math.nan), workers=config.workers, hosts=hosts))
    except Exception as e:  # noqa: BLE001
        errors.append(f"flops: {type(e).__name__}: {e}")
    costs["FLOPs" if "peak" in costs else "FLOPs and peak"] = time.perf_counter() - t1
    # The rounds (and what came before them) ran in the training loop's run, before the iterator was released
    out["measure_time_s"] = time.perf_counter() - t0 + parts.get("seconds", 0.0)
    out["measure_cost"] = ", ".join(f"{k} {v:.1f} s" for k, v in costs.items())
    out["measure_budget_s"] = parts.get("budget_s", math.nan)
    if errors:
        out["measure_error"] = "; ".join(str(x).splitlines()[0] for x in errors)
        log.warning("measurement incomplete: %s", out["measure_error"])
    if parts and "error" not in parts and "skipped" not in parts:
        log.info("%s; %s; MFU %.1f%% (%s)", format_line({**out, "accumulate": config.accumulate}),
                 out["communication_note"], out["mfu"] * 100, out["peak_flops_source"])
    return out


INTERLEAVED = "interleaved: step, step without input, step without the all-reduce"
ONE_REPLICA = "interleaved: step, step without input (one replica: no all-reduce)"
DIRECT = ("interleaved: step, step without input; the all-reduce timed alone (no overlap with compute): the step "
          "without it did not fit the measuring budget")


def split_fields(parts: dict, fields: dict, replicas: int, accumulate: int = 1) -> dict:
    """The breakdown's fields from ``measure_parts``' rounds. Without the step without the all-reduce (``split``
    false, several replicas), the all-reduce part is the all-reduce timed alone (``fields``'
    allreduce_direct_time_s and its error) and compute is the step without input less it; ``breakdown_method``
    says which."""
    direct = None
    if replicas > 1 and not parts.get("split", True):
        direct = (fields.get("allreduce_direct_time_s", math.nan),
                  fields.get("allreduce_direct_time_uncertainty_s", math.nan))
    out = breakdown(parts["step_all_s"], parts["no_input_all_s"], parts["compute_all_s"], replicas,
                    accumulate=accumulate, allreduce=direct)
    return {**out, "breakdown_method": DIRECT if direct is not None else INTERLEAVED if replicas > 1 else ONE_REPLICA}


def against_training(fields: dict, summary: dict, steps_per_call: int = 0, steps_per_loop: int = 0) -> dict:
    """Whether the step the parts split is training's step (``breakdown_step_matches_training``): within
    NOISE_SIGMAS of their combined error (training's from images_per_sec's). When not, the note says by how much:
    the rounds ran after training, at another moment of a shared machine (or with shorter calls), and the parts are
    shares of their own step."""
    step, se = fields.get("breakdown_step_time_s", math.nan), fields.get("breakdown_step_time_uncertainty_s", math.nan)
    train = summary.get("step_time_s", math.nan)
    rate, rate_se = summary.get("images_per_sec", math.nan), summary.get("images_per_sec_uncertainty", math.nan)
    train_se = train * rate_se / rate if rate == rate and rate > 0 and rate_se == rate_se else 0.0
    if not (step == step and train == train and train > 0):
        return {"breakdown_step_matches_training": None}
    both = math.hypot(se if se == se else 0.0, train_se)
    same = abs(step - train) <= max(NOISE_SIGMAS * both, ADD_UP_FLOOR_S)
    if same:
        return {"breakdown_step_matches_training": True}
    calls = (f" in calls of {steps_per_call} step(s) (training's: {steps_per_loop}, so a call's fixed cost weighs "
             "differently)" if 0 < steps_per_call < steps_per_loop else "")
    note = (f"; its step ({step * 1e3:.2f} ms) is not training's ({train * 1e3:.2f} ms, {step / train - 1:+.0%}): "
            f"timed after training, at another moment{calls}, so read the parts as shares of their own step")
    return {"breakdown_step_matches_training": False, "breakdown_note": fields.get("breakdown_note", "") + note}


def share(measure_s: float, wall_s: float) -> float:
    """The measurement's share of the run's wall time (summary's measure_share; at most the run's --measure-budget
    unless what is measured before the rounds, or after them, outgrew it: the rounds are left out first)."""
    return measure_s / wall_s if wall_s > 0 else math.nan


def cost_line(measure_s: float, wall_s: float, cost: str, rounds: int, steps: int, method: str = "",
              budget_share: float = MEASURE_BUDGET) -> str:
    """What measuring cost the run, for the log: seconds, share of the run's wall time, and where they went."""
    part = share(measure_s, wall_s)
    why = (f"; over the {budget_share:.0%} budget (--measure-budget): what is measured besides the breakdown's rounds "
           f"(the input probe, the all-reduce timed alone, the FLOP count and peak) outgrew it; --no-measure skips it"
           if part > budget_share else "")
    if method.startswith("not measured"):
        return f"measurement: {measure_s:.1f} s, {part:.0%} of the run's {wall_s:.1f} s ({cost}; no breakdown){why}"
    how = f"; {method}" if method.startswith("interleaved: step, step without input;") else ""
    return (f"measurement: {measure_s:.1f} s, {part:.0%} of the run's {wall_s:.1f} s ({cost}; {rounds} interleaved "
            f"rounds of {steps} step(s) a call{how}){why}")


def format_line(f: dict) -> str:
    """The breakdown as one line that claims only what was measured: the step timed beside its parts, each part
    with its standard error, the ones within noise marked, and whether they add up to the step."""
    def part(name, key):  # key "compute_time_s" -> its uncertainty "compute_time_uncertainty_s", its status
        value, se = f.get(key, math.nan), f.get(key[:-2] + "_uncertainty_s", math.nan)
        status = f.get(key[:-2] + "_status")
        if status == FAILED:
            return f"{name} FAILED (negative beyond its noise)"
        text = f"{name} {value * 1e3:.2f}" + (f" ± {se * 1e3:.2f}" if se == se else "") + " ms"
        return text + (" (within noise)" if status == WITHIN_NOISE else "")

    compute = part("compute", "compute_time_s")
    micro, k = f.get("micro_step_time_s", math.nan), f.get("accumulate", 1)
    if k > 1 and micro == micro:
        compute += f" ({k} micro-steps of {micro * 1e3:.2f} ms, one all-reduce)"
    step = part("step", "breakdown_step_time_s")
    sign = "=" if f.get("breakdown_adds_up") else "≠"
    return (f"{step} (interleaved with its parts) {sign} " + " + ".join(
        [compute, part("all-reduce", "allreduce_time_s"), part("input wait", "input_wait_s"),
         part("other", "other_time_s")]))
