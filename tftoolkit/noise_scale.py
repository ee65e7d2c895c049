"""Gradient noise scale B_simple = tr(Σ)/|G|², measured for free in data-parallel training: the arithmetic.

NumPy only, so the training step (engine.noise, which runs the same functions on tensors), advise, the report and
notebook 05 share one estimator, and results copied off a GPU server are read without TensorFlow.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"): the critical batch size, past which
a bigger batch stops cutting the number of optimizer steps, is about B_simple = tr(Σ)/|G|², where G is the
true gradient and Σ the per-example gradient covariance. A gradient averaged over B examples has
E|G_B|² = |G|² + tr(Σ)/B, so two batch sizes give two equations in the two unknowns (their appendix A.1):

    tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)
    |G|²  ≈ (B_big·|G_big|² − B_small·|G_small|²) / (B_big − B_small)   (= |G_big|² − tr(Σ)/B_big)

Data parallelism computes both gradients anyway: each replica's own gradient is a small-batch gradient
(B_small = per-replica batch) and the all-reduced one is the big-batch gradient (B_big = global batch).
So with ``--noise-scale`` the step adds only squared norms (one pass over the gradients on each replica,
one over the reduced gradient) and four scalars to the all-reduce it already does; no second backward
pass. With one replica there is no smaller batch, so the step runs forward/backward on the two halves of
the batch and adds their gradients (the same total work; the sum is the full-batch gradient, exactly for
models without batch statistics; with batch norm the statistics become per-half, as in ghost batch norm).

|G_small|² is the mean over replicas (or halves) of the squared norm of each one's batch-*mean* gradient.
With uneven small batches b_i the mean of E|G_i|² is |G|² + tr(Σ)·mean(1/b_i), so 1/B_small is taken as
mean(1/b_i); for equal batches that is the formula above.

Each step's two estimates are unbiased but noisy (|G|² can even come out negative). steps.csv keeps them
(``noise_grad_sq``, ``noise_trace``) and the ratio of an exponential moving average of each (``noise_scale``,
to follow it during training; bias-corrected like Adam's moments, the ratio needs no correction). The run's figure,
summary.json ``noise_scale``, is ``robust_estimate``: the ratio of the two estimates averaged over the later half
of the run, with a bootstrap interval and the reasons not to trust it (``reliability``). Where in training it was
measured matters: ``growth``, its value over the second half of that window over the first, says whether it was
still growing there (early training, where it understates the batch that pays off later; ``phase_text`` says it in
words). The EMAs' ratio at the end is ``noise_scale_ema``, with its components ``noise_scale_grad_sq`` (|G|²) and
``noise_scale_trace`` (tr Σ). Steps where a replica's batch is empty or uneven (a partial last batch), or whose
gradients are not finite (float16 overflow), are left out of the averages.
"""

from __future__ import annotations

import math

import numpy as np

# EMA decay of the two estimates: 0.99 averages over roughly the last 100 steps, long enough to tame the
# per-step noise of |G|² (its standard error is of the order of tr(Σ)/B_big per step), short enough to
# follow the noise scale as it grows during training.
EMA_DECAY = 0.99

SUMMARY_FIELDS = ("noise_scale", "noise_scale_interval", "noise_scale_reliable", "noise_scale_warnings",
                  "noise_scale_window_steps", "noise_scale_window", "noise_scale_growth", "noise_scale_growth_interval",
                  "noise_scale_early", "noise_scale_ema", "noise_scale_grad_sq", "noise_scale_trace",
                  "noise_scale_steps", "noise_scale_ema_decay", "noise_scale_small_batch", "noise_scale_big_batch")


# --- the estimator (plain arithmetic: the same function serves NumPy, floats and TensorFlow tensors) -------
def unbiased(small_sq, inv_small, big_sq, big_batch):
    """(|G|², tr Σ) from the mean squared norm ``small_sq`` of small-batch mean gradients (batches of mean
    reciprocal size ``inv_small`` = mean 1/b_i) and the squared norm ``big_sq`` of the big-batch gradient."""
    trace = (small_sq - big_sq) / (inv_small - 1.0 / big_batch)
    grad_sq = big_sq - trace / big_batch
    return grad_sq, trace


def estimate_from_gradients(small_grads, small_batches, big_grad, big_batch):
    """NumPy version of one step: ``small_grads`` are the small batches' mean gradients (flat arrays),
    ``big_grad`` the big batch's mean gradient. Returns (|G|², tr Σ)."""
    small_sq = float(np.mean([np.dot(g, g) for g in small_grads]))
    inv_small = float(np.mean([1.0 / b for b in small_batches]))
    big = np.asarray(big_grad, dtype=float)
    return unbiased(small_sq, inv_small, float(big @ big), float(big_batch))


def ema(values, decay: float = EMA_DECAY) -> np.ndarray:
    """Bias-corrected exponential moving average of a series; NaN entries are skipped (carry the last)."""
    out, acc, count = [], 0.0, 0
    for v in np.asarray(values, dtype=float):
        if math.isfinite(v):
            acc = decay * acc + (1.0 - decay) * v
            count += 1
        out.append(acc / (1.0 - decay**count) if count else math.nan)
    return np.array(out)


def b_simple(grad_sq, trace) -> float:
    """tr(Σ)/|G|²; NaN when the |G|² estimate is not positive (the gradient is lost in the noise)."""
    return float(trace / grad_sq) if grad_sq > 0 and math.isfinite(trace) else math.nan


# --- over a run: the figure a recommendation can stand on (NumPy; advise, the report, notebook 05) --------------
LATER_FRACTION = 0.5   # the later half of the run: the noise scale grows as the loss falls, early steps understate it
BLOCK_STEPS = 10       # bootstrap blocks of consecutive steps (neighbouring estimates are correlated)
BOOTSTRAP = 1000
MIN_STEPS = 50         # fewer valid steps in the window than this: too few to trust
MAX_SPREAD = 3.0       # an interval wider than this factor (hi / lo) says little about the batch
CHANCE_FRACTION = 0.9  # a final loss above this share of ln(classes) is still near chance: the run did not learn


def _block_index(m: int, boot: int, rng) -> np.ndarray:
    """``boot`` block-bootstrap resamples of the indices 0..m-1 in blocks of BLOCK_STEPS consecutive steps (one row
    each): the same rows index |G|^2 and tr(Sigma), whose per-step estimates are correlated."""
    blocks = max(1, math.ceil(m / BLOCK_STEPS))
    starts = rng.integers(0, max(1, m - BLOCK_STEPS + 1), size=(boot, blocks))
    return (starts[:, :, None] + np.arange(min(BLOCK_STEPS, m))[None, None, :]).reshape(boot, -1)


def robust_estimate(grad_sq, trace, later: float = LATER_FRACTION, boot: int = BOOTSTRAP, seed: int = 0) -> dict:
    """B_simple over the later part of a run, as McCandlish et al. (app. A) and nanoGNS estimate it: the ratio of
    the *averaged* per-step estimates, mean tr(Σ) / mean |G|², not an average (or the last value) of per-step
    ratios, whose |G|² denominators scatter around zero. A 90% interval comes from a bootstrap over blocks of
    BLOCK_STEPS consecutive steps. ``grad_sq`` and ``trace`` are the per-step unbiased estimates (steps.csv's
    ``noise_grad_sq`` and ``noise_trace``; NaN where a step did not count).

    Returns {"noise_scale", "interval": [lo, hi], "grad_sq", "trace", "steps", "from_index"}; the noise scale is
    NaN when the averaged |G|² is not positive (the gradient is lost in the noise)."""
    g, t = np.asarray(grad_sq, dtype=float), np.asarray(trace, dtype=float)
    start = int(len(g) * (1.0 - later))
    g, t = g[start:], t[start:]
    ok = np.isfinite(g) & np.isfinite(t)
    g, t = g[ok], t[ok]
    m = len(g)
    out = {"noise_scale": math.nan, "interval": [math.nan, math.nan], "grad_sq": math.nan, "trace": math.nan,
           "steps": int(m), "from_index": start}
    if m == 0:
        return out
    mg, mt = float(g.mean()), float(t.mean())
    out.update(grad_sq=mg, trace=mt, noise_scale=b_simple(mg, mt))
    idx = _block_index(m, boot, np.random.default_rng(seed))
    bg, bt = g[idx].mean(axis=1), t[idx].mean(axis=1)
    ratios = np.where(bg > 0, bt / np.where(bg > 0, bg, 1.0), np.inf)
    out["interval"] = [float(np.quantile(ratios, q, method="inverted_cdf")) for q in (0.05, 0.95)]  # inf stays inf
    return out


def reliability(est: dict, final_loss: float | None = None, classes: int | None = None) -> list[str]:
    """Why ``est`` (robust_estimate) should not be trusted; empty when nothing argues against it."""
    warnings = []
    if classes and final_loss is not None and math.isfinite(final_loss) and \
            final_loss >= CHANCE_FRACTION * math.log(classes):
        warnings.append(f"the loss stayed near ln({classes}) = {math.log(classes):.3f} (final {final_loss:.3f}): the "
                        "run did not learn, and a noise scale measured at chance says nothing about the batch")
    if est["steps"] < MIN_STEPS:
        warnings.append(f"only {est['steps']} valid steps in the later half of the run (want {MIN_STEPS} or more): "
                        "train longer with --noise-scale")
    b = est["noise_scale"]
    if not (math.isfinite(b) and b > 0):
        warnings.append("the averaged |G|^2 estimate is not positive: the gradient is lost in the noise at this "
                        "point of training, so there is no noise scale to recommend from")
    else:
        lo, hi = est["interval"]
        if not (lo > 0 and math.isfinite(hi)) or hi / lo > MAX_SPREAD:
            warnings.append(f"the 90% interval of the noise scale, {lo:.3g} to {hi:.3g}, spans more than a factor of "
                            f"{MAX_SPREAD:g}: too uncertain to choose a batch from")
    return warnings




def growth(grad_sq, trace, later: float = LATER_FRACTION, boot: int = BOOTSTRAP, seed: int = 0) -> dict:
    """How much the noise scale grew across the window robust_estimate averages: B_simple of the window's second half
    over B_simple of its first half, with a 90% block-bootstrap interval. The noise scale grows as the loss falls
    (McCandlish et al. 2018, §3), so a ratio clearly above 1 says the run measured it in early training, where it
    understates the batch that pays off later.

    Returns {"ratio", "interval": [lo, hi], "early"}: ``early`` is True when the interval lies above 1, False when it
    does not, None when a half has no positive |G|^2 (or too few steps) to tell."""
    g, t = np.asarray(grad_sq, dtype=float), np.asarray(trace, dtype=float)
    start = int(len(g) * (1.0 - later))
    g, t = g[start:], t[start:]
    ok = np.isfinite(g) & np.isfinite(t)
    g, t = g[ok], t[ok]
    out = {"ratio": math.nan, "interval": [math.nan, math.nan], "early": None}
    half = len(g) // 2
    if half < BLOCK_STEPS:
        return out
    (g1, t1), (g2, t2) = (g[:half], t[:half]), (g[half:], t[half:])
    b1, b2 = b_simple(g1.mean(), t1.mean()), b_simple(g2.mean(), t2.mean())
    if not (b1 > 0 and b2 > 0):
        return out
    rng = np.random.default_rng(seed)
    i1, i2 = _block_index(half, boot, rng), _block_index(len(g) - half, boot, rng)
    bg1, bt1, bg2, bt2 = g1[i1].mean(axis=1), t1[i1].mean(axis=1), g2[i2].mean(axis=1), t2[i2].mean(axis=1)
    ok = (bg1 > 0) & (bg2 > 0) & (bt1 > 0)
    ratios = np.where(ok, (bt2 / np.where(ok, bg2, 1.0)) / (bt1 / np.where(ok, bg1, 1.0)), np.nan)
    ratios = np.where(np.isnan(ratios), np.inf, ratios)  # a half lost in the noise: no bound on that side
    lo, hi = (float(np.quantile(ratios, q, method="inverted_cdf")) for q in (0.05, 0.95))
    out.update(ratio=b2 / b1, interval=[lo, hi], early=bool(lo > 1.0))
    return out


def phase_text(window: list, grew: dict) -> str:
    """Where in training the noise scale was measured, and whether it was still growing there, in one sentence."""
    first, last, total = window
    where = f"measured over steps {first}-{last} of {total}"
    lo, hi = grew["interval"]
    if grew["early"] is None:
        return where + " (too few steps, or too noisy a half, to tell whether it was still growing)"
    band = f"{lo:.2f}-{hi:.2f}" if math.isfinite(hi) else f"{lo:.2f} or more"  # inf: a half's |G|^2 lost in noise
    how = f"it grew {grew['ratio']:.2f}x (90% interval {band}) from the first to the second half of them"
    if grew["early"]:
        return (f"{where}, while it was still growing: {how}. A noise scale from early training understates the batch "
                "that pays off later: measure again later in training")
    return f"{where}; {how}: no growth beyond its noise"
