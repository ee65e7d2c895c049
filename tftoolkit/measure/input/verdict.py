"""What an input capacity says about a run: input-bound, close to the limit, or fed.

Pure functions of two figures and their errors (``measure.input.bench.probe``'s capacity and the images/sec training
consumed), so the summary builder and the readers of finished runs use them without starting TensorFlow.
"""

from __future__ import annotations

import math

from ..stats import NOISE_SIGMAS

INPUT_BOUND, NEAR = 1.25, 2.0  # headroom under INPUT_BOUND: input-bound; under NEAR: little to spare
WORDS = {"input-bound": "input-bound", "near": "close to the limit", "fed": "not the limit"}


def _pm(value: float, error: float, digits: int) -> str:
    return f"{value:,.{digits}f}" + (f" ± {error:,.{digits}f}" if error == error else "")


def rate(images: list[int], seconds: list[float]) -> tuple[float, float]:
    """Images/sec over the probe's timed calls (all their images over all their seconds) and its standard error:
    the ratio estimator's, sqrt(n / (n - 1) * sum((images_i - rate * seconds_i)^2)) / sum(seconds_i) over the n
    calls, so a call that ran slower or faster than the others widens it; NaN under two calls."""
    n, total_s = len(images), float(sum(seconds))
    if n == 0 or n != len(seconds) or not total_s > 0:
        return math.nan, math.nan
    r = sum(images) / total_s
    if n < 2:
        return r, math.nan
    spread = sum((i - r * s) ** 2 for i, s in zip(images, seconds))
    return r, math.sqrt(n / (n - 1) * spread) / total_s


def line_within_noise(headroom: float, uncertainty: float) -> float | None:
    """The verdict's line (INPUT_BOUND or NEAR) that ``headroom`` is within NOISE_SIGMAS of its ``uncertainty`` of,
    the nearer one; None when it is clear of both or its error is not known: then the verdict is the figures'."""
    if not (uncertainty == uncertainty and uncertainty >= 0 and headroom == headroom):
        return None
    close = [line for line in (INPUT_BOUND, NEAR) if abs(headroom - line) <= NOISE_SIGMAS * uncertainty]
    return min(close, key=lambda line: abs(headroom - line)) if close else None


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
    figures = (f"the input alone delivers {_pm(capacity, capacity_se, 0)} images/sec, training consumed "
               f"{_pm(consumed, consumed_se, 0)}")
    if headroom < INPUT_BOUND:
        kind, note = "input-bound", f"input-bound: {figures} (headroom {_pm(headroom, se, 2)})"
    elif headroom < NEAR:
        kind, note = "near", (f"input is close to the limit: {figures} (headroom {_pm(headroom, se, 2)}, little to "
                              "spare)")
    else:
        kind, note = "fed", f"input is not the limit: {figures} ({_pm(headroom, se, 1)}x headroom)"
    line = line_within_noise(headroom, se)
    if line is not None:  # the kind on the line's other side
        other = ("near" if kind == "input-bound" else "input-bound") if line == INPUT_BOUND else \
            ("fed" if kind == "near" else "near")
        note += f"; within {NOISE_SIGMAS:g} standard errors of a headroom of {line:g}, so it may be {WORDS[other]}"
    if device_kind == "CPU-simulated":
        note += (f"; on simulated replicas input and compute share the cores, so the input needed about "
                 f"{1 / headroom:.0%} of their time")
    return {"input_headroom": headroom, "input_headroom_uncertainty": se, "input_verdict": kind, "input_note": note}
