"""Throughput statistics: the formulas every figure in a summary comes from (pinned by tests/test_stats.py)."""

from __future__ import annotations

import math

import numpy as np

# Scales the median absolute deviation to the standard deviation of a normal distribution, so jitter is
# comparable to a std but not inflated by the occasional slow step (a GC pause, a checkpoint).
MAD_TO_STD = 1.4826


def mean_and_uncertainty(values) -> tuple[float, float]:
    """Mean and its standard error std/sqrt(n) (sample std, n-1); uncertainty is NaN for one value."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    if v.size == 1:
        return float(v[0]), math.nan
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size))


def jitter(values) -> float:
    """1.4826 x median absolute deviation."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan
    return float(MAD_TO_STD * np.median(np.abs(v - np.median(v))))


def throughput(step_times, examples_per_step: int) -> dict:
    """Images/sec from per-step times (one value per timed step, or per loop of steps averaged).

    The rate is examples / mean step time, which weights every second equally (the mean of per-step rates
    would overweight fast steps); its uncertainty follows from the step-time standard error (delta method).
    """
    t = np.asarray(step_times, dtype=float)
    if t.size == 0:
        return {"images_per_sec": math.nan, "examples_per_sec": math.nan, "images_per_sec_uncertainty": math.nan,
                "images_per_sec_jitter": math.nan,
                "step_time_s": math.nan, "step_time_p50_s": math.nan, "step_time_p90_s": math.nan,
                "step_time_p99_s": math.nan, "timed_steps": 0}
    mean_t, se_t = mean_and_uncertainty(t)
    ips = examples_per_step / mean_t
    rates = examples_per_step / t
    return {
        "images_per_sec": ips,
        "examples_per_sec": ips,  # the same rate, named for data that are not images
        "images_per_sec_uncertainty": ips * se_t / mean_t if not math.isnan(se_t) else math.nan,
        "images_per_sec_jitter": jitter(rates),
        "step_time_s": float(np.median(t)),
        "step_time_mean_s": mean_t,
        "step_time_p50_s": float(np.percentile(t, 50)),
        "step_time_p90_s": float(np.percentile(t, 90)),
        "step_time_p99_s": float(np.percentile(t, 99)),
        "timed_steps": int(t.size),
    }


def percentile(values, q: float) -> float:
    """The q-th percentile (0-100, linear interpolation as NumPy's default); NaN for no values."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan
    return float(np.percentile(v, q))


def speedup(throughput: float, baseline_throughput: float) -> float:
    """How many times faster than the baseline run (same work per second measure, e.g. images/sec)."""
    if not baseline_throughput > 0:
        return math.nan
    return float(throughput) / float(baseline_throughput)


def scaling_efficiency(speedup_value: float, replicas: int, baseline_replicas: int = 1) -> float:
    """Speedup over the ideal (linear) speedup replicas/baseline_replicas: 1.0 = perfect scaling."""
    if replicas <= 0 or baseline_replicas <= 0:
        raise ValueError(f"replica counts must be > 0, got {replicas} and {baseline_replicas}")
    return float(speedup_value) / (replicas / baseline_replicas)


def plus_minus(value: float, error, spec: str = ".2f") -> str:
    """``value`` formatted by ``spec``, with " ± error" (the same format) where the error is a finite number: a figure
    whose error is unknown (None, NaN) is printed alone, never with a made-up one."""
    known = isinstance(error, (int, float, np.number)) and not isinstance(error, bool) and math.isfinite(error)
    return f"{value:{spec}}" + (f" ± {error:{spec}}" if known else "")


def ratio_uncertainty(a: float, a_err: float, b: float, b_err: float) -> float:
    """Standard error of a/b for independent a and b (first-order error propagation)."""
    if not (b != 0 and math.isfinite(a) and math.isfinite(b)):
        return math.nan
    if math.isnan(a_err) or math.isnan(b_err):
        return math.nan
    r = a / b
    rel = math.hypot(a_err / a if a else 0.0, b_err / b)
    return abs(r) * rel


# A measured quantity within this many standard errors of zero is "within noise": its sign is not known, so it is drawn
# and printed as such and never stated as a finding (the breakdown's parts, their shares, their comparisons).
NOISE_SIGMAS = 2.0


def within_noise(value: float, uncertainty: float, sigmas: float = NOISE_SIGMAS) -> bool | None:
    """Whether ``value`` is within ``sigmas`` standard errors of zero: True or False, or None when it cannot be told
    (the value or its uncertainty is missing or not finite, as in results written before uncertainties were)."""
    try:
        v, u = float(value), float(uncertainty)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(v) and math.isfinite(u) and u >= 0):
        return None
    return abs(v) < sigmas * u


def differ(a: float, a_err: float, b: float, b_err: float, sigmas: float = NOISE_SIGMAS) -> bool | None:
    """Whether a - b is beyond noise (``within_noise`` of the difference, independent errors), or None when unknown."""
    try:
        noisy = within_noise(float(a) - float(b), math.hypot(float(a_err), float(b_err)), sigmas)
    except (TypeError, ValueError):
        return None
    return None if noisy is None else not noisy
