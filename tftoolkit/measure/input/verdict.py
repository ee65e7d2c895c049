"""What an input capacity says about a run: input-bound, close to the limit, or fed.

Pure functions of two figures and their errors (``measure.input.bench.probe``'s capacity and the images/sec training
consumed), so the summary builder and the readers of finished runs use them without starting TensorFlow.
"""

from __future__ import annotations

import math

from ..stats import NOISE_SIGMAS, plus_minus

INPUT_BOUND, NEAR = 1.25, 2.0  # headroom under INPUT_BOUND: input-bound; under NEAR: little to spare
WORDS = {"input-bound": "input-bound", "near": "close to the limit", "fed": "not the limit"}


MIN_CALLS = 5  # timed calls a rate's error needs: a line through them leaves n - 2 degrees of freedom (3 at least)


def rate(images: list[int], seconds: list[float]) -> tuple[float, float]:
    """Images/sec over the probe's timed calls, and its standard error. The calls grow (1, 2, 4, ... steps) and each
    pays a fixed cost besides its images (a call's launch, tens of microseconds to milliseconds), so the rate is
    the slope of a least-squares line through (images, seconds): 1 / seconds per image, the fixed cost its intercept,
    kept out of the rate; its error is the slope's (n - 2 degrees of freedom) carried to the rate (se_slope /
    slope^2). Under MIN_CALLS calls, or where the line does not rise, the rate is all the images over all the
    seconds and its error is not known (NaN)."""
    n, total_s = len(images), float(sum(seconds))
    if n == 0 or n != len(seconds) or not total_s > 0:
        return math.nan, math.nan
    overall = sum(images) / total_s
    if n < MIN_CALLS:
        return overall, math.nan
    mx, my = sum(images) / n, total_s / n
    sxx = sum((x - mx) ** 2 for x in images)
    slope = sum((x - mx) * (y - my) for x, y in zip(images, seconds)) / sxx if sxx > 0 else math.nan
    if not slope > 0:
        return overall, math.nan
    cost = my - slope * mx
    residual = sum((y - cost - slope * x) ** 2 for x, y in zip(images, seconds)) / (n - 2)
    return 1 / slope, math.sqrt(residual / sxx) / slope ** 2


def _kind(headroom: float) -> str:
    return "input-bound" if headroom < INPUT_BOUND else "near" if headroom < NEAR else "fed"


def kinds_within_noise(headroom: float, uncertainty: float) -> list[str]:
    """The verdicts other than the figures' that ``headroom`` reaches within NOISE_SIGMAS of its ``uncertainty``
    (in the order input-bound, near, fed); none when its error is not known or is zero."""
    if not (uncertainty == uncertainty and uncertainty > 0 and headroom == headroom):
        return []
    lo, hi = _kind(headroom - NOISE_SIGMAS * uncertainty), _kind(headroom + NOISE_SIGMAS * uncertainty)
    order = list(WORDS)
    return [k for k in order[order.index(lo):order.index(hi) + 1] if k != _kind(headroom)]


def may_be(headroom: float, uncertainty: float) -> str:
    """"may be close to the limit or not the limit": the other verdicts within noise (``kinds_within_noise``) in
    words, or "" when there are none."""
    others = kinds_within_noise(headroom, uncertainty)
    return f"may be {' or '.join(WORDS[k] for k in others)}" if others else ""


def verdict(capacity: float, consumed: float, device_kind: str, capacity_se: float = math.nan,
            consumed_se: float = math.nan) -> dict:
    """input_headroom (with its standard error, from the two figures' relative errors), input_verdict and input_note
    from the capacity and the images/sec training consumed (and their standard errors, where known).

    On GPUs the input runs on the host's cores and the step on the GPUs: a headroom near 1 means the GPUs waited
    for input. On simulated CPU replicas the step runs on the same cores, so the capacity (measured with the
    cores to itself) is more than input could have had while training; there 1 / headroom is the share of the
    cores' time the input needed, and the same thresholds read as: input took (nearly) all of it. A headroom within
    noise of a line says so: the verdict is the figures', and the kind on the line's other side is not ruled out.
    """
    if not (capacity == capacity and consumed == consumed and capacity > 0 and consumed > 0):
        return {"input_headroom": math.nan, "input_headroom_uncertainty": math.nan, "input_verdict": "",
                "input_note": "input capacity not measured"}
    headroom = capacity / consumed
    se = headroom * math.hypot(capacity_se / capacity, consumed_se / consumed)  # NaN where either error is unknown
    figures = (f"the input alone delivers {plus_minus(capacity, capacity_se, ',.0f')} images/sec, training consumed "
               f"{plus_minus(consumed, consumed_se, ',.0f')}")
    kind = _kind(headroom)
    if kind == "input-bound":
        note = f"input-bound: {figures} (headroom {plus_minus(headroom, se, ',.2f')})"
    elif kind == "near":
        note = (f"input is close to the limit: {figures} (headroom {plus_minus(headroom, se, ',.2f')}, little to "
                "spare)")
    else:
        note = f"input is not the limit: {figures} ({plus_minus(headroom, se, ',.1f')}x headroom)"
    if others := may_be(headroom, se):
        note += f"; within {NOISE_SIGMAS:g} standard errors it {others}"
    if device_kind == "CPU-simulated":
        note += (f"; on simulated replicas input and compute share the cores, so the input needed about "
                 f"{1 / headroom:.0%} of their time")
    return {"input_headroom": headroom, "input_headroom_uncertainty": se, "input_verdict": kind, "input_note": note}
