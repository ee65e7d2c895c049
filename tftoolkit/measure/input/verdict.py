"""What an input capacity says about a run: input-bound, close to the limit, or fed.

A pure function of two figures (``measure.input.bench.probe``'s capacity and the images/sec training consumed), so
the summary builder and the readers of finished runs use it without starting TensorFlow.
"""

from __future__ import annotations

INPUT_BOUND, NEAR = 1.25, 2.0  # headroom under INPUT_BOUND: input-bound; under NEAR: little to spare


def verdict(capacity: float, consumed: float, device_kind: str) -> dict:
    """input_headroom, input_verdict and input_note from the capacity and the images/sec training consumed.

    On GPUs the input runs on the host's cores and the step on the GPUs: a headroom near 1 means the GPUs waited
    for input. On simulated CPU replicas the step runs on the same cores, so the capacity (measured with the
    cores to itself) is more than input could have had while training; there 1 / headroom is the share of the
    cores' time the input needed, and the same thresholds read as: input took (nearly) all of it.
    """
    if not (capacity == capacity and consumed == consumed and capacity > 0 and consumed > 0):
        return {"input_headroom": float("nan"), "input_verdict": "",
                "input_note": "input capacity not measured"}
    headroom = capacity / consumed
    figures = f"the input alone delivers {capacity:,.0f} images/sec, training consumed {consumed:,.0f}"
    if headroom < INPUT_BOUND:
        kind, note = "input-bound", f"input-bound: {figures} (headroom {headroom:.2f})"
    elif headroom < NEAR:
        kind, note = "near", f"input is close to the limit: {figures} (headroom {headroom:.2f}, little to spare)"
    else:
        kind, note = "fed", f"input is not the limit: {figures} ({headroom:.1f}x headroom)"
    if device_kind == "CPU-simulated":
        note += (f"; on simulated replicas input and compute share the cores, so the input needed about "
                 f"{1 / headroom:.0%} of their time")
    return {"input_headroom": headroom, "input_verdict": kind, "input_note": note}
