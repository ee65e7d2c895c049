"""Where a training step's time goes: compute, gradient all-reduce, input wait; load balance; FLOPs and MFU.

Runs after training (``RunConfig.measure``), on the trained run's strategy and shapes. The step is split in
interleaved rounds, timed while the run's training iterator is still alive (``measure_parts``): each round times
one call of the same length of three variants, in a rotated order,

  A  the real training step (the run's own input pipeline)
  B  the same step on the run's own input cut to one step's elements, cached and repeated (nothing to wait for)
  C  B without the gradient all-reduce (the engine's ``compute_loop``, on training's own model and optimizer: each
     replica applies its own gradient, so the only thing missing is communication; one replica has no C)

so that a round's three calls see the same machine state, and the parts split the step they were timed beside,
not one from another moment (on a loaded host the two need not agree). summary.json gets:

  breakdown_step_time_s   median of A, the step the parts split (training's step_time_s was timed earlier)
  step_time_no_input_s    median of B
  compute_time_s          median of C
  micro_step_time_s       compute_time_s / accumulate (derived): with --accumulate K an optimizer step is K
                          micro-steps and one all-reduce
  allreduce_time_s        median of B - C: the all-reduce the step really pays, after any overlap with compute
  input_wait_s            median of A - B
  other_time_s            breakdown_step_time_s - the three medians (medians do not add; zero within its error)
  *_uncertainty_s         each median's bootstrap standard error (rounds resampled whole)
  *_status                each part: measured, within noise (under 2 errors of zero: drawn hollow, never a
                          finding), or failed (negative beyond its noise: the value is NaN, never clipped to 0)
  breakdown_adds_up       no part failed, compute fits in the step, and "other" is zero within 3 of its errors
                          (docs/guides/measuring.md)
  breakdown_note          which parts are within noise or failed, and whether the parts add up
  breakdown_step_matches_training  the step the parts split is training's step within their errors
  allreduce_direct_time_s the gradient all-reduce timed alone (allreduce.time_allreduce on the model's
                          gradient shapes, as the step packs them): its cost with nothing to overlap
  input_wait_fraction     input_wait_s / breakdown_step_time_s
  communication_fraction  allreduce_time_s / (compute_time_s + allreduce_time_s)
  communication_note      one sentence; says so when communication exceeds compute
  imbalance               max / mean of the examples each replica trained on (1.0 = balanced)
  flops_per_example ... mfu  see tftoolkit.measure.flops
  measure_time_s, measure_cost  what measuring took, and where (the run logs it with its share of the run)

Cost: the rounds get MEASURE_SHARE of the training loop's time (``plan``), but never fewer than MIN_ROUNDS rounds
of one step: a median and its error need them, whatever they cost, and the run's log says what they cost.

Measuring never changes the trained model: the extra steps on the trained engine (with and without the all-reduce)
run from a snapshot of every model and optimizer variable, restored afterwards.
The timed training loop itself is untouched: all of this happens after it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from .stats import NOISE_SIGMAS  # a part within this many standard errors of zero is within noise

log = logging.getLogger("tftoolkit")

# Rounds of three interleaved calls of steps_per_loop steps each, after a warm-up call each: the real training step
# (the run's own iterator), the same step on one batch already on the devices (no input), and that step without the
# all-reduce. Interleaving (in a rotated order) makes each round's three calls see the same machine state (turbo,
# other processes), so per-round differences are the parts, and the step they split is timed beside them.
MIN_ROUNDS, MAX_ROUNDS = 5, 9  # 5 rounds: a median and a bootstrap error that means something; more only if cheap
MEASURE_SHARE = 0.05  # the rounds' share of the training loop's time above the floor of MIN_ROUNDS (the floor and the
# trace dominate a short run: 13% of a 2-epoch default train on a loaded 2-core host, BENCHMARKS.md)
DIRECT_ALLREDUCE_REPEATS = 5
BOOTSTRAP = 1000  # resamples of the rounds for each median's standard error

FIELDS = ("breakdown_step_time_s", "step_time_no_input_s", "compute_time_s", "micro_step_time_s", "allreduce_time_s",
          "allreduce_direct_time_s", "input_wait_s", "other_time_s", "breakdown_step_time_uncertainty_s",
          "compute_time_uncertainty_s", "allreduce_time_uncertainty_s", "allreduce_direct_time_uncertainty_s",
          "input_wait_uncertainty_s", "other_time_uncertainty_s", "compute_time_status", "allreduce_time_status",
          "input_wait_status", "other_time_status", "breakdown_rounds", "breakdown_adds_up", "breakdown_note",
          "breakdown_step_matches_training",
          "input_wait_fraction", "communication_fraction", "communication_note", "imbalance", "flops_per_example",
          "forward_flops_per_example", "flops_source", "achieved_flops", "peak_flops", "peak_flops_source", "mfu")
PARTS = (("compute", "compute_time_s"), ("all-reduce", "allreduce_time_s"), ("input wait", "input_wait_s"),
         ("other", "other_time_s"))


# --- formulas (pinned by tests/measure/test_breakdown.py) --------------------------------------------------
MEASURED, WITHIN_NOISE, FAILED = "measured", "within noise", "failed"  # a part's status, summary's *_status
ADD_UP_SIGMAS = 3.0  # "other" beyond this many of its errors: the parts do not add up (2 fails 13% of honest
# 5-round breakdowns, 3 none of 300: benchmarks/breakdown_estimator.py, docs/guides/measuring.md)
ADD_UP_FLOOR_S = 1e-6  # the least "other" can be told from zero: the clock's resolution, not a fudge


@dataclass(frozen=True)
class Part:
    """One part of the step: the median over rounds (``raw``) and its bootstrap standard error. Its ``status``:
    FAILED when it came out negative beyond NOISE_SIGMAS errors (or could not be estimated): a time cannot be
    negative, so the measurement failed, and it is reported so, never clipped to 0 or moved into another part;
    WITHIN_NOISE when within NOISE_SIGMAS errors of zero (its sign is not known; drawn and printed as such); else
    MEASURED."""

    raw: float
    uncertainty: float

    @property
    def status(self) -> str:
        bound = NOISE_SIGMAS * self.uncertainty if self.uncertainty == self.uncertainty else 0.0
        if not self.raw == self.raw or self.raw < -bound or (self.raw < 0 and bound == 0):
            return FAILED
        return WITHIN_NOISE if abs(self.raw) < bound else MEASURED

    @property
    def within_noise(self) -> bool:
        return self.status == WITHIN_NOISE

    @property
    def seconds(self) -> float:
        """The estimate as reported: the median itself (a part within noise may be a little below 0), NaN when the
        measurement failed."""
        return math.nan if self.status == FAILED else self.raw


@dataclass(frozen=True)
class Breakdown:
    """The step and its parts, from interleaved rounds. Each part is a median over rounds of a per-round difference,
    and "other" is what the three medians leave of the step's median, so the parts add up to the step by
    construction; what can fail is the premise. The breakdown adds up (``adds_up``) when no part failed and "other"
    is zero within NOISE_SIGMAS of its own error: medians of differences taken from the same rounds then agree with
    the difference of the medians. "Other" beyond its noise means the rounds disagree with one another (a load that
    came and went inside a round), and the split is not a split of one step."""

    step: Part
    no_input: Part
    compute: Part
    allreduce: Part
    input_wait: Part
    other: Part
    rounds: int
    rest: Part | None = None  # the step - compute: all-reduce, input wait and other together (never below zero)

    @property
    def parts(self) -> dict:
        return {"compute": self.compute, "all-reduce": self.allreduce, "input wait": self.input_wait,
                "other": self.other}

    @property
    def failed(self) -> list[str]:
        """The timed parts whose measurement failed (negative beyond noise); "other" is judged by ``adds_up``."""
        return [name for name, p in self.parts.items() if name != "other" and p.status == FAILED]

    @property
    def compute_beyond_step(self) -> bool:
        """Compute longer than the step it is a part of, beyond the noise of their difference: each part may be within
        noise alone while together they say the step took less than its compute."""
        return self.rest is not None and self.rest.status == FAILED

    @property
    def tolerance_s(self) -> float:
        se = self.other.uncertainty
        return max(ADD_UP_SIGMAS * se if se == se else 0.0, ADD_UP_FLOOR_S)

    @property
    def adds_up(self) -> bool:
        return (not self.failed and not self.compute_beyond_step and self.other.raw == self.other.raw
                and abs(self.other.raw) <= self.tolerance_s)

    def note(self) -> str:
        def ms(p):
            return f"{p.raw * 1e3:.2f}" + (f" ± {p.uncertainty * 1e3:.2f}" if p.uncertainty == p.uncertainty else "")

        noisy = [name for name, p in self.parts.items() if p.within_noise]
        text = (f"{' and '.join(noisy)} within noise (under {NOISE_SIGMAS:g} standard errors of zero)" if noisy
                else "every part above noise")
        if self.failed:
            bad = ", ".join(f"{name} came out {ms(self.parts[name])} ms" for name in self.failed)
            return (f"the breakdown FAILED: {bad}, negative beyond its noise (a time cannot be): the rounds did not "
                    f"see one machine state; the part is not reported ({self.rounds} interleaved rounds)")
        if self.compute_beyond_step:
            return (f"the breakdown FAILED: compute ({ms(self.compute)} ms) came out longer than the step it is part of "
                    f"({ms(self.step)} ms; by {ms(Part(-self.rest.raw, self.rest.uncertainty))} ms, beyond its noise): "
                    f"the rounds did not see one machine state ({self.rounds} interleaved rounds)")
        if not self.adds_up:
            return (text + f"; the parts do NOT add up to the step: the medians leave {ms(self.other)} ms, beyond "
                    f"{NOISE_SIGMAS:g} errors of zero: the rounds disagree ({self.rounds} interleaved rounds)")
        return text + (f"; the parts add up to the step ({self.step.raw * 1e3:.2f} ms, other {ms(self.other)} ms, "
                       f"{self.rounds} interleaved rounds)")


def split(step_all, no_input_all, compute_all) -> Breakdown:
    """The parts of a step from per-round timings of the real step, the step without input and the step without
    all-reduce (same rounds, same lengths): compute = median(compute), all-reduce = median(no input - compute),
    input wait = median(step - no input), other = median(step) - the three. Errors: the standard deviation of each
    median over BOOTSTRAP resamples of whole rounds (so the parts keep their correlation)."""
    a, b, c = (np.asarray(list(x), dtype=float) for x in (step_all, no_input_all, compute_all))
    if not len(a) == len(b) == len(c) or len(a) == 0:
        raise ValueError(f"split needs the same rounds of each variant, got {len(a)}, {len(b)} and {len(c)}")

    def medians(rounds):  # step, no input, compute, all-reduce, input wait, other, step - compute: on the last axis
        m = np.median(rounds, axis=-2)
        return np.concatenate([m, (m[..., 0] - m[..., 2] - m[..., 3] - m[..., 4])[..., None],
                               (m[..., 0] - m[..., 2])[..., None]], axis=-1)

    rounds = np.stack([a, b, c, b - c, a - b], axis=1)
    med = medians(rounds)
    rng = np.random.default_rng(0)  # a fixed seed: the same timings give the same errors
    se = (medians(rounds[rng.integers(0, len(a), size=(BOOTSTRAP, len(a)))]).std(axis=0, ddof=1) if len(a) > 1
          else np.full(7, math.nan))
    step, no_input, compute, allreduce, input_wait, other, rest = (Part(float(m), float(s)) for m, s in zip(med, se))
    return Breakdown(step, no_input, compute, allreduce, input_wait, other, rounds=len(a), rest=rest)


def breakdown(step_all, no_input_all, compute_all, replicas: int, accumulate: int = 1) -> dict:
    """summary.json's breakdown fields from per-round timings (``split``): each part with its error and its status
    (``*_status``: measured, within noise, failed), and whether they add up to the step (``breakdown_adds_up``)."""
    b = split(step_all, no_input_all, compute_all)
    compute_s, allreduce_s = b.compute.seconds, b.allreduce.seconds if replicas > 1 else 0.0
    denom = compute_s + allreduce_s
    step = b.step.seconds
    status = {name: p.status for name, p in b.parts.items()}
    status["other"] = WITHIN_NOISE if abs(b.other.raw) <= b.tolerance_s else MEASURED  # a residual, never "failed"
    if replicas <= 1:
        status["all-reduce"] = MEASURED  # none, exactly: one replica all-reduces nothing
    return {
        "breakdown_step_time_s": step,
        "breakdown_step_time_uncertainty_s": b.step.uncertainty,
        "step_time_no_input_s": b.no_input.seconds,
        "compute_time_s": compute_s,
        "micro_step_time_s": compute_s / accumulate,
        "allreduce_time_s": allreduce_s,
        "input_wait_s": b.input_wait.seconds,
        "other_time_s": b.other.raw,
        "compute_time_uncertainty_s": b.compute.uncertainty,
        "allreduce_time_uncertainty_s": b.allreduce.uncertainty if replicas > 1 else 0.0,
        "input_wait_uncertainty_s": b.input_wait.uncertainty,
        "other_time_uncertainty_s": b.other.uncertainty,
        **{f"{key[:-2]}_status": status[name] for name, key in PARTS},
        "breakdown_rounds": b.rounds,
        "breakdown_adds_up": b.adds_up,
        "breakdown_note": b.note(),
        "input_wait_fraction": b.input_wait.seconds / step if step > 0 else math.nan,
        "communication_fraction": allreduce_s / denom if denom > 0 else math.nan,
        "communication_note": communication_note(compute_s, allreduce_s, replicas, status["all-reduce"]),
    }


def communication_note(compute_s: float, allreduce_s: float, replicas: int, status: str = MEASURED) -> str:
    if replicas <= 1:
        return "one replica: there is no gradient all-reduce"
    if status == FAILED:
        return "communication not measured: the all-reduce part of the breakdown failed (negative beyond its noise)"
    if not (compute_s == compute_s and allreduce_s == allreduce_s):
        return "communication not measured"
    ms = f"all-reduce {allreduce_s * 1e3:.2f} ms vs compute {compute_s * 1e3:.2f} ms per step"
    if status == WITHIN_NOISE:
        return (f"the all-reduce is within noise ({ms}): too small against the step's noise to say what it costs; "
                "more rounds or a quieter machine would tell")
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


def plan(steps_per_loop: int, step_s: float, train_s: float) -> tuple[int, int]:
    """(rounds, steps per call) for the interleaved rounds: MEASURE_SHARE of the training loop's ``train_s`` seconds
    spent on 3 calls a round, at least MIN_ROUNDS rounds of at least one step (the floor a median and its error need,
    whatever it costs), at most MAX_ROUNDS rounds of steps_per_loop steps (training's own call length)."""
    budget = MEASURE_SHARE * train_s if train_s == train_s and train_s > 0 else 0.0
    per_step = step_s if step_s == step_s and step_s > 0 else math.inf
    n = int(min(steps_per_loop, max(1, budget // (3 * MIN_ROUNDS * per_step))))
    rounds = int(min(MAX_ROUNDS, max(MIN_ROUNDS, budget // (3 * n * per_step))))
    return rounds, n


def time_step_parts(engine, config, source, train_examples: int, iterator, rounds: int = MIN_ROUNDS,
                    steps: int | None = None) -> dict:
    """Per-round seconds per step of three calls of ``steps`` steps (default steps_per_loop), interleaved in a
    rotated order: the real step on ``iterator`` (the run's own training iterator: the input pipeline included),
    the same step on one batch already on the devices, and that step without the all-reduce (the engine's own
    ``compute_loop``: training's model and optimizer, no second engine to build). One replica all-reduces nothing:
    its rounds time the first two, and its compute is the step without input. Every variable is restored
    afterwards, so the trained model is unchanged."""
    strategy = engine.strategy
    n = steps or config.steps_per_loop
    t0 = time.perf_counter()
    # The run's own input, cut to one step's elements, cached and repeated: the step with no input to wait for. Its
    # iterator has the training iterator's type, so the training loop's trace serves it (no trace of its own).
    replay = iter(engine.feed.train_input(strategy, source, config, replay=True))
    saved = _snapshot(engine)
    try:
        variants = [(engine.train_loop, iterator), (engine.train_loop, replay)]
        if strategy.num_replicas_in_sync > 1:
            variants.append((engine.compute_loop, replay))
        # Warm-up: one step each (the step count is a tensor, so these traces serve the timed loops too).
        for loop_fn, it in variants:
            _time_loop(loop_fn, it, 1)
        warm_s = time.perf_counter() - t0
        times = interleaved(*[lambda f=f, it=it: _time_loop(f, it, n) for f, it in variants], rounds=rounds)
    finally:
        _restore(saved)
    return {"step_all_s": times[0].tolist(), "no_input_all_s": times[1].tolist(),
            "compute_all_s": times[-1 if len(times) == 3 else 1].tolist(), "steps_per_call": n, "warmup_s": warm_s}


def interleaved(*timers, rounds: int) -> list[np.ndarray]:
    """``rounds`` rounds of one timing of each of ``timers`` (functions returning seconds), the order rotated every round (no variant always
    runs after the same one). Each is one engine.timer region (devices synchronised before the clock starts and
    before it stops), so what one call left running on a GPU cannot be charged to the next."""
    out = [[] for _ in timers]
    for r in range(rounds):
        for i in (np.arange(len(timers)) + r) % len(timers):
            out[i].append(timers[i]())
    return [np.array(x) for x in out]


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


def measure_parts(engine, config, source, iterator, train_s: float, step_s: float) -> dict:
    """The interleaved rounds (``time_step_parts``) while the run's training ``iterator`` is alive, sized by ``plan``
    to the training loop's ``train_s`` seconds at ``step_s`` a step; what fails is returned as ``error``."""
    # Every worker of a multi-worker run must run the same calls (each step's all-reduce joins them all), and each
    # would size the plan by its own clock: they take the fixed floor instead.
    rounds, n = plan(config.steps_per_loop, step_s, train_s) if config.workers <= 1 else (MIN_ROUNDS, 1)
    t0 = time.perf_counter()
    try:
        parts = time_step_parts(engine, config, source, source.train_examples, iterator, rounds=rounds, steps=n)
    except Exception as e:  # noqa: BLE001 - a failed measurement must not fail a finished run
        return {"error": f"step breakdown: {type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
    return {**parts, "seconds": time.perf_counter() - t0}


def summary_fields(engine, config, setup, source, summary: dict, hosts: int = 1, parts: dict | None = None) -> dict:
    """Every measurement field for summary.json; a measurement that fails is NaN with ``measure_error``.
    ``hosts``: distinct hosts of a multi-worker run (for the peak of CPU workers). ``parts``: ``measure_parts``'
    rounds, timed before the training iterator was released (without them, no step breakdown)."""
    from . import flops

    out = {k: math.nan for k in FIELDS}
    out["communication_note"] = ""
    errors = []
    t0 = time.perf_counter()
    costs = {"rounds": (parts or {}).get("seconds", 0.0),
             "of which traces and warm-up": (parts or {}).get("warmup_s", 0.0)}
    if parts is None:
        errors.append("step breakdown: not timed (no training iterator)")
    elif "error" in parts:
        errors.append(parts["error"])
    else:
        try:
            out.update(breakdown(parts["step_all_s"], parts["no_input_all_s"], parts["compute_all_s"],
                                 setup.replicas, accumulate=config.accumulate))
            out.update(against_training(out, summary, parts.get("steps_per_call", 0), config.steps_per_loop))
        except Exception as e:  # noqa: BLE001
            errors.append(f"step breakdown: {type(e).__name__}: {e}")
    t1 = time.perf_counter()
    try:
        from ..engine.step import jit_effective

        jit = jit_effective(config, setup.kind, setup.replicas)
        out["allreduce_direct_time_s"], out["allreduce_direct_time_uncertainty_s"] = (
            direct_allreduce_time(engine, jit=jit) if setup.replicas > 1 else (0.0, 0.0))
    except Exception as e:  # noqa: BLE001
        errors.append(f"direct all-reduce: {type(e).__name__}: {e}")
    costs["direct all-reduce"] = time.perf_counter() - t1
    out.update(load_balance(summary.get("examples_per_replica", [])))
    t1 = time.perf_counter()
    try:
        out.update(flops.utilisation(engine.model, source.input_shape, config.precision, setup,
                                     summary.get("images_per_sec", math.nan), workers=config.workers, hosts=hosts))
    except Exception as e:  # noqa: BLE001
        errors.append(f"flops: {type(e).__name__}: {e}")
    costs["FLOPs and peak"] = time.perf_counter() - t1
    out["measure_time_s"] = time.perf_counter() - t0 + costs["rounds"]  # the rounds ran before, in _loop
    out["measure_cost"] = ", ".join(f"{k} {v:.1f} s" for k, v in costs.items())
    if errors:
        out["measure_error"] = "; ".join(str(x).splitlines()[0] for x in errors)
        log.warning("measurement incomplete: %s", out["measure_error"])
    if "error" not in (parts or {"error": 1}):
        log.info("%s; %s; MFU %.1f%% (%s)", format_line({**out, "accumulate": config.accumulate}),
                 out["communication_note"], out["mfu"] * 100, out["peak_flops_source"])
    return out


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


def cost_line(measure_s: float, wall_s: float, cost: str, rounds: int, steps: int) -> str:
    """What measuring cost the run, for the log: seconds, share of the run's wall time, and where they went."""
    share = measure_s / wall_s if wall_s > 0 else math.nan
    why = (f"; over {MEASURE_SHARE * 2:.0%}: on several replicas the step without the all-reduce is traced once, and "
           f"{MIN_ROUNDS} rounds of one-step calls are the least a median with an error needs; --no-measure skips it"
           if share > 2 * MEASURE_SHARE else "")
    return (f"measurement: {measure_s:.1f} s, {share:.0%} of the run's {wall_s:.1f} s ({cost}; {rounds} interleaved "
            f"rounds of {steps} step(s) a call){why}")


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
