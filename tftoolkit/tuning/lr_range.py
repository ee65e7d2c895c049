"""The LR range test's arithmetic (Smith 2017, "Cyclical Learning Rates", §3.3): the sweep's learning rates, the
smoothing of its losses, where it blows up, and the LR it suggests. ``finders.find_lr`` runs the sweep under the
strategy and calls these; they are plain NumPy, tested without training.

The suggestion is the LR where the smoothed loss falls fastest per unit of log LR, before its minimum. The loss is
smoothed for it by a *centred* moving average (centred_smooth): the EMA fastai smooths with lags by half its span,
which on a 200-step sweep moves the suggestion up by several times; the EMA (running_smooth) is what the sweep
watches while it runs, to stop at the blow-up.
"""

from __future__ import annotations

import math

import numpy as np

from ..planner.choices import BLOWUP

SMOOTH_FRACTION = 0.05  # smooth over 5% of the sweep (10 of 200 steps, a third of a decade of LR)
SKIP_START = 0.1  # the first 10% of the sweep: the smoothed loss still carries its start-up bias and noise
# Learning is a fall of the smoothed loss, before its minimum, past NOISE_TIMES the standard error of a smoothed point
# (a flat noisy curve's lowest point sits a few below its start), and past MIN_DROP (a floor; a fixed 2% missed the
# default task's clear 1.7% fall). A loss never under CHANCE x ln(classes) never left chance.
NOISE_TIMES, MIN_DROP, CHANCE = 6.0, 0.005, 0.98


def exponential_lrs(lr_min: float, lr_max: float, steps: int) -> np.ndarray:
    return lr_min * (lr_max / lr_min) ** (np.arange(steps) / max(steps - 1, 1))


def smoothing_window(steps: int) -> int:
    return max(3, int(round(SMOOTH_FRACTION * steps)))


def running_smooth(losses, window: int) -> np.ndarray:
    """Bias-corrected EMA with the span of ``window`` points: what the sweep watches while it runs."""
    beta = 1.0 - 2.0 / (window + 1)
    out, avg = [], 0.0
    for i, v in enumerate(np.asarray(losses, dtype=float)):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** (i + 1)))
    return np.array(out)


def centred_smooth(losses, window: int) -> np.ndarray:
    """Centred moving average over ``window`` points (shrinking at the ends). Unlike an EMA it does not lag:
    an EMA of span w shifts the curve by ~w/2 points, i.e. (w/2)/steps of the LR range to the right, which
    moves the steepest point up by the same factor."""
    v = np.asarray(losses, dtype=float)
    h = window // 2
    return np.array([v[max(0, i - h):i + h + 1].mean() for i in range(len(v))])


def blowup_index(smoothed, factor: float = BLOWUP) -> int | None:
    """First index where the smoothed loss is not finite or exceeds ``factor`` × its running minimum."""
    best = math.inf
    for i, v in enumerate(smoothed):
        if not math.isfinite(v) or (i > 0 and v > factor * best):
            return i
        best = min(best, v)
    return None


def suggest_lr(lrs, smoothed, skip_start: float = SKIP_START, min_drop: float = MIN_DROP, losses=None,
               window: int | None = None, chance: float = math.nan) -> tuple[float, str]:
    """LR at the steepest descent of the smoothed loss vs log LR, looking only before its minimum (Smith 2017; the
    fastai finder's "steep" point).

    The slope is a central difference over ±``len/40`` points (at least 1), so what noise is left in the smoothed loss
    does not pick the point. Returns (lr, note); lr is NaN, with the reason, when the loss did not fall before its
    minimum by ``min_drop`` of its start and, given the raw ``losses``, by NOISE_TIMES a smoothed point's error."""
    lrs, sm = np.asarray(lrs, dtype=float), np.asarray(smoothed, dtype=float)
    finite = np.isfinite(sm)
    if finite.sum() < 10:
        return math.nan, "too few finite losses to suggest an LR; lower --lr-min or raise --lr-steps"
    end = int(np.nanargmin(np.where(finite, sm, np.nan)))
    start = int(len(sm) * skip_start)
    fall = float(sm[start] - sm[end]) if end > start else 0.0
    drop = fall / abs(sm[start]) if end > start else 0.0
    noise = math.nan
    if losses is not None and end - start >= 5:
        raw = np.asarray(losses, dtype=float)[start:end + 1]
        resid = raw - sm[start:end + 1]
        resid = resid[np.isfinite(resid)]
        if len(resid) > 2:
            noise = float(resid.std(ddof=1) / math.sqrt(window or smoothing_window(len(sm))))
    needs = f"{min_drop:.1%} of the loss" + (f" and {NOISE_TIMES:g} x its noise ({noise:.3g})" if noise == noise else "")
    if end - start < 5 or drop < min_drop or (noise == noise and fall <= NOISE_TIMES * noise):
        where = (f"from LR {lrs[start]:.3g} to its minimum at LR {lrs[end]:.3g}" if end > start
                 else f"after LR {lrs[start]:.3g} (its minimum is at LR {lrs[end]:.3g}, in the first "
                      f"{skip_start:.0%} of the sweep)")
        fell = f"the smoothed loss fell by only {max(fall, 0):.3g} ({max(drop, 0):.1%}) {where} (needs {needs})"
        if sm[end] >= CHANCE * chance:  # ``chance``, ln(classes): NaN when not known
            return math.nan, (f"the loss never left chance (ln(classes) = {chance:.3f}) in {len(sm)} steps ({fell}): no "
                              "LR started the model learning; give it more steps per LR (--lr-steps) or a narrower "
                              "range (--lr-min)")
        return math.nan, f"{fell}: the sweep is too short to see learning (raise --lr-steps) or starts too high " \
                         "(lower --lr-min)"
    w = max(1, len(sm) // 40)
    log_lr = np.log(lrs)
    idx = np.arange(start, end + 1)
    lo, hi = np.clip(idx - w, 0, len(sm) - 1), np.clip(idx + w, 0, end)
    slope = (sm[hi] - sm[lo]) / np.where(log_lr[hi] > log_lr[lo], log_lr[hi] - log_lr[lo], np.nan)
    i = int(idx[np.nanargmin(slope)])
    return float(lrs[i]), "steepest descent of the smoothed loss"
