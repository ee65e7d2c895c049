"""The step breakdown's arithmetic: the parts of a step from interleaved rounds of timings (measure/breakdown.py
times them), each with its bootstrap error and status, whether they add up, and the load balance; the measuring
budget and the rounds it pays for.

Pure NumPy, no TensorFlow: tests/measure/test_breakdown.py pins these formulas in milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .stats import NOISE_SIGMAS, within_noise  # the one rule for what is within noise

BOOTSTRAP = 1000  # resamples of the rounds for each median's standard error
PARTS = (("compute", "compute_time_s"), ("all-reduce", "allreduce_time_s"), ("input wait", "input_wait_s"),
         ("other", "other_time_s"))


# --- formulas (pinned by tests/measure/test_breakdown.py) --------------------------------------------------
MEASURED, WITHIN_NOISE, FAILED = "measured", "within noise", "failed"  # a part's status, summary's *_status
FAIL_SIGMAS = 3.0  # a part negative, or "other" away from zero, beyond this many of its errors: the breakdown failed,
# or does not add up. At 2 (NOISE_SIGMAS) "other" wrongly failed 13% of honest 5-round breakdowns, and a part whose
# truth is zero (input that never makes the step wait) came out "failed" in 0.3-7% of 3-9-round ones; at 3, 0% and
# 0-2.8% (benchmarks/breakdown_estimator.py [--input-wait-ms 0], docs/guides/measuring.md). Between them a part is
# within noise: its sign is not known.
ADD_UP_FLOOR_S = 1e-6  # the least "other" can be told from zero: the clock's resolution, not a fudge

# --- the measuring budget (measure/breakdown.py times the rounds ``plan`` sizes) -----------------------------------
MIN_ROUNDS, MAX_ROUNDS = 3, 9  # 3 rounds: a median with a bootstrap error (88-92% of 3-round errors cover a known
# answer, 93-99% at 5: benchmarks/breakdown_estimator.py --rounds 3 5); more rounds only while the budget holds them
MEASURE_BUDGET = 0.10  # measuring's share of the run's wall time so far, at most, by default (--measure-budget;
# BENCHMARKS.md measures it)
RESERVE_SHARE = 0.3  # of the budget, kept for what the rounds' plan does not count: the replayed input's pipeline,
# the FLOP count and the summaries after them (the all-reduce timed alone and the peak run before the rounds, and the
# budget is what is left after them: measure.breakdown.measure_parts)


def budget(elapsed_s: float, spent_s: float = 0.0, share: float = MEASURE_BUDGET) -> float:
    """Seconds the breakdown's rounds may take: ``share`` (the run's --measure-budget) of the run's ``elapsed_s``
    wall seconds so far, less RESERVE_SHARE of it, less ``spent_s`` already measured (the input probe, the all-reduce
    timed alone, the peak). Measuring M seconds after E then keeps M / (E + M) under ``share``."""
    if not (elapsed_s == elapsed_s and elapsed_s > 0):
        return 0.0
    return max(0.0, share * elapsed_s * (1 - RESERVE_SHARE) - max(spent_s, 0.0))


def floor_s(step_s: float) -> float:
    """The least the rounds cost at ``step_s`` a step: MIN_ROUNDS rounds of two one-step calls (the step and the step
    without input), the least a median with an error needs. Where it is over the budget the rounds are left out."""
    return 2 * MIN_ROUNDS * step_s if step_s == step_s and step_s > 0 else math.inf


@dataclass(frozen=True)
class Plan:
    """How the rounds are timed: ``rounds`` rounds of one call of ``steps`` steps per variant; ``split``: the step
    without the all-reduce is one of them (its trace and warm-up fit the budget), else the all-reduce is timed alone."""

    rounds: int
    steps: int
    split: bool
    budget_s: float = math.nan


def plan(steps_per_loop: int, step_s: float, budget_s: float, trace_s: float = 0.0, replicas: int = 1) -> Plan:
    """The rounds for ``budget_s`` seconds (``budget``) at ``step_s`` a step. Every round times one call of each
    variant: the real step and the step without input, and on several replicas the step without the all-reduce
    when its trace (``trace_s``, about training's own) and warm-up step plus MIN_ROUNDS rounds of three one-step calls
    fit. Then the calls get as many steps as MIN_ROUNDS rounds can pay for (up to steps_per_loop, training's own call
    length), and the rounds as many as fit, between MIN_ROUNDS (whatever it costs) and MAX_ROUNDS."""
    budget_s = budget_s if budget_s == budget_s and budget_s > 0 else 0.0
    per_step = step_s if step_s == step_s and step_s > 0 else math.inf
    trace = trace_s if trace_s == trace_s and trace_s >= 0 else math.inf
    split = replicas > 1 and trace + per_step * (1 + 3 * MIN_ROUNDS) <= budget_s
    calls = 3 if split else 2
    avail = budget_s - (trace + per_step if split else 0.0)
    n = int(min(steps_per_loop, max(1, avail // (calls * MIN_ROUNDS * per_step))))
    rounds = int(min(MAX_ROUNDS, max(MIN_ROUNDS, avail // (calls * n * per_step))))
    return Plan(rounds, n, split, budget_s)


@dataclass(frozen=True)
class Part:
    """One part of the step: the median over rounds (``raw``) and its bootstrap standard error. Its ``status``:
    FAILED when it came out negative beyond FAIL_SIGMAS errors (or could not be estimated): a time cannot be
    negative, so the measurement failed, and it is reported so, never clipped to 0 or moved into another part;
    WITHIN_NOISE when within NOISE_SIGMAS errors of zero, or negative by less than FAIL_SIGMAS errors (its sign is not
    known; drawn and printed as such); else MEASURED."""

    raw: float
    uncertainty: float

    @property
    def status(self) -> str:
        bound = FAIL_SIGMAS * self.uncertainty if self.uncertainty == self.uncertainty else 0.0
        if not self.raw == self.raw or self.raw < -bound or (self.raw < 0 and bound == 0):
            return FAILED
        return WITHIN_NOISE if self.raw < 0 or within_noise(self.raw, self.uncertainty) else MEASURED

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
    is zero within FAIL_SIGMAS of its own error: medians of differences taken from the same rounds then agree with
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
        return max(FAIL_SIGMAS * se if se == se else 0.0, ADD_UP_FLOOR_S)

    @property
    def adds_up(self) -> bool:
        return (not self.failed and not self.compute_beyond_step and self.other.raw == self.other.raw
                and abs(self.other.raw) <= self.tolerance_s)

    def note(self) -> str:
        def ms(p):
            return f"{p.raw * 1e3:.2f}" + (f" ± {p.uncertainty * 1e3:.2f}" if p.uncertainty == p.uncertainty else "")

        noisy = [name for name, p in self.parts.items() if p.within_noise]
        text = (f"{' and '.join(noisy)} within noise (under {NOISE_SIGMAS:g} standard errors above zero, not "
                f"{FAIL_SIGMAS:g} below)" if noisy else "every part above noise")
        if self.failed:
            bad = ", ".join(f"{name} came out {ms(self.parts[name])} ms" for name in self.failed)
            return (f"the breakdown FAILED: {bad}, negative beyond {FAIL_SIGMAS:g} of its errors (a time cannot be): "
                    f"the rounds did not see one machine state; the part is not reported ({self.rounds} interleaved "
                    "rounds)")
        if self.compute_beyond_step:
            return (f"the breakdown FAILED: compute ({ms(self.compute)} ms) came out longer than the step it is part of "
                    f"({ms(self.step)} ms; by {ms(Part(-self.rest.raw, self.rest.uncertainty))} ms, beyond "
                    f"{FAIL_SIGMAS:g} of its errors): "
                    f"the rounds did not see one machine state ({self.rounds} interleaved rounds)")
        if not self.adds_up:
            return (text + f"; the parts do NOT add up to the step: the medians leave {ms(self.other)} ms, beyond "
                    f"{FAIL_SIGMAS:g} errors of zero: the rounds disagree ({self.rounds} interleaved rounds)")
        return text + (f"; the parts add up to the step ({self.step.raw * 1e3:.2f} ms, other {ms(self.other)} ms, "
                       f"{self.rounds} interleaved rounds)")


def split(step_all, no_input_all, compute_all, allreduce: tuple[float, float] | None = None) -> Breakdown:
    """The parts of a step from per-round timings of the real step, the step without input and the step without
    all-reduce (same rounds, same lengths): compute = median(compute), all-reduce = median(no input - compute),
    input wait = median(step - no input), other = median(step) - the three. Errors: the standard deviation of each
    median over BOOTSTRAP resamples of whole rounds (so the parts keep their correlation).

    ``allreduce`` (seconds, standard error): the all-reduce timed alone, where no step without it was timed; then
    compute is the step without input less it, each round, and both parts carry its error."""
    a, b, c = (np.asarray(list(x), dtype=float) for x in (step_all, no_input_all, compute_all))
    if allreduce is not None:
        c = b - allreduce[0]
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
    if allreduce is not None:  # a constant in every round: its own error, added to what depends on it
        extra = allreduce[1] if allreduce[1] == allreduce[1] else 0.0
        se[2], se[3], se[6] = math.hypot(se[2], extra), allreduce[1], math.hypot(se[6], extra)
    step, no_input, compute, allreduce, input_wait, other, rest = (Part(float(m), float(s)) for m, s in zip(med, se))
    return Breakdown(step, no_input, compute, allreduce, input_wait, other, rounds=len(a), rest=rest)


def breakdown(step_all, no_input_all, compute_all, replicas: int, accumulate: int = 1,
              allreduce: tuple[float, float] | None = None) -> dict:
    """summary.json's breakdown fields from per-round timings (``split``): each part with its error and its status
    (``*_status``: measured, within noise, failed), and whether they add up to the step (``breakdown_adds_up``).
    ``allreduce``: the all-reduce timed alone, when no step without it was timed (``split``)."""
    b = split(step_all, no_input_all, compute_all, allreduce if replicas > 1 else None)
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
        # A share only where the part's size is known (a part within noise has no known sign): else NaN.
        "input_wait_fraction": b.input_wait.seconds / step if step > 0 and status["input wait"] == MEASURED else math.nan,
        "communication_fraction": allreduce_s / denom if denom > 0 and known(status, "all-reduce", "compute") else math.nan,
        "communication_note": communication_note(compute_s, allreduce_s, replicas, status["all-reduce"]),
    }


def known(status: dict, *parts: str) -> bool:
    return all(status[p] == MEASURED for p in parts)


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
