"""Gradient noise scale B_simple = tr(Σ)/|G|², measured for free in data-parallel training.

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

Each step's two estimates are unbiased but noisy (|G|² can even come out negative), so the run keeps a
separate exponential moving average of each and reports their ratio: steps.csv ``noise_scale`` per step,
summary.json ``noise_scale`` at the end with the components ``noise_scale_grad_sq`` (|G|²) and
``noise_scale_trace`` (tr Σ), bias-corrected like Adam's moments (the ratio needs no correction: both
share the factor). Steps where a replica's batch is empty or uneven (a partial last batch), or whose
gradients are not finite (float16 overflow), are left out of the averages.
"""

from __future__ import annotations

import logging
import math

import numpy as np

log = logging.getLogger("tftoolkit")

# EMA decay of the two estimates: 0.99 averages over roughly the last 100 steps, long enough to tame the
# per-step noise of |G|² (its standard error is of the order of tr(Σ)/B_big per step), short enough to
# follow the noise scale as it grows during training.
EMA_DECAY = 0.99

SUMMARY_FIELDS = ("noise_scale", "noise_scale_grad_sq", "noise_scale_trace", "noise_scale_steps",
                  "noise_scale_ema_decay", "noise_scale_small_batch", "noise_scale_big_batch")


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


# --- in the training step (TensorFlow) ---------------------------------------------------------------------
def _all_layers(model):
    for layer in getattr(model, "layers", []):
        yield layer
        yield from _all_layers(layer)


def _dense(g):
    import tensorflow as tf

    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


def sq_norm(grads):
    """Σ g² over a list of gradient tensors, in float64 (float16 gradients would overflow; float32 sums of
    many terms lose the digits the difference |G_small|² − |G_big|² needs)."""
    import tensorflow as tf

    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(_dense(g), tf.float64))) for g in grads if g is not None])


def loss_scale(optimizer):
    """The factor the loss (hence every gradient) was multiplied by before differentiation (float16 loss
    scaling); norms are taken of the unscaled gradients."""
    import tensorflow as tf

    return tf.cast(optimizer.scale_loss(tf.constant(1.0)), tf.float64)


def two_halves(forward_backward, images, labels, denom):
    """One replica: forward/backward on each half of the batch (the two small batches); returns
    (loss, full-batch gradients, [(half gradients, half size), ...]).

    Each half's loss is its per-example sum over the *whole* batch's ``denom`` (plus its share of the
    regularisation), so the two gradients add up to the gradient the unsplit step computes.
    """
    import tensorflow as tf

    n = tf.shape(labels)[0]
    h = n // 2
    share_a = tf.cast(h, tf.float32) / tf.cast(tf.maximum(n, 1), tf.float32)
    loss_a, g_a = forward_backward(images[:h], labels[:h], denom, share_a)
    loss_b, g_b = forward_backward(images[h:], labels[h:], denom, 1.0 - share_a)
    grads = [None if a is None else _dense(a) + _dense(b) for a, b in zip(g_a, g_b)]
    return loss_a + loss_b, grads, [(g_a, h), (g_b, n - h)]


class NoiseScale:
    """Per-step estimates inside the step, their EMAs in variables (checkpointed with the run).

    ``replica_sums`` runs on each replica before the gradient all-reduce and returns a 4-vector that is
    all-reduced (SUM) together with the gradients; ``estimate`` turns the reduced vector and the reduced
    gradients into this step's (|G|², tr Σ, valid); ``update`` (outside ``strategy.run``) folds them into
    the EMAs and returns (|G|², tr Σ, B_simple of the EMAs) for steps.csv.
    """

    def __init__(self, replicas: int, decay: float = EMA_DECAY, model=None):
        import tensorflow as tf

        if replicas == 1 and model is not None and any("BatchNormalization" in type(layer).__name__
                                                       for layer in _all_layers(model)):
            log.warning("--noise-scale on one replica runs the batch as two halves, so batch norm normalises "
                        "each half by its own statistics (like ghost batch norm): training differs from a run "
                        "without it. Use 2 or more replicas to measure the noise scale without changing training")
        self.replicas = replicas
        self.decay = float(decay)
        # Plain variables on the host, outside the strategy's scope: only the cross-replica part of the
        # training loop touches them, once per step, with values every replica has computed identically.
        self.ema = tf.Variable(tf.zeros([2], tf.float64), trainable=False, name="noise_scale_ema")
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="noise_scale_count")
        # (|G|², tr Σ, B_simple) of the steps of the latest train_loop call, for steps.csv.
        self.last = tf.Variable(tf.zeros([0, 3], tf.float32), shape=tf.TensorShape([None, 3]), trainable=False,
                                name="noise_scale_last")

    def checkpoint_items(self) -> dict:
        return {"noise_scale_ema": self.ema, "noise_scale_count": self.count}

    def replica_sums(self, parts, denom, scale):
        """[Σ|mean gradient of part|², Σ 1/b, parts, parts usable] on this replica."""
        import tensorflow as tf

        denom = tf.cast(denom, tf.float64)
        sq, inv, ok = [], [], []
        for grads, b in parts:
            b = tf.cast(b, tf.float64)
            safe_b = tf.maximum(b, 1.0)
            # A replica's gradient is its batch-mean gradient x b/denom (the loss is divided by the global
            # batch so that the all-reduce SUM gives the global mean): undo that factor, and the loss scale.
            sq.append(sq_norm(grads) * tf.square(denom / safe_b / scale))
            inv.append(1.0 / safe_b)
            usable = b >= 1.0
            if self.replicas > 1:
                # An uneven split (partial last batch) would weight the regularisation gradient unevenly.
                usable = tf.logical_and(usable, tf.equal(b * self.replicas, denom))
            ok.append(tf.cast(usable, tf.float64))
        return tf.stack([tf.add_n(sq), tf.add_n(inv), tf.constant(float(len(parts)), tf.float64), tf.add_n(ok)])

    def estimate(self, sums, reduced_grads, denom, scale):
        """This step's (|G|², tr Σ, valid) from the all-reduced sums and gradients (float64 3-vector)."""
        import tensorflow as tf

        parts = sums[2]
        small_sq, inv_small = sums[0] / parts, sums[1] / parts
        big_sq = sq_norm(reduced_grads) / tf.square(scale)
        grad_sq, trace = unbiased(small_sq, inv_small, big_sq, tf.cast(denom, tf.float64))
        valid = tf.cast(tf.equal(sums[3], parts), tf.float64)
        return tf.stack([grad_sq, trace, valid])

    def update(self, est):
        import tensorflow as tf

        grad_sq, trace, valid = est[0], est[1], est[2]
        ok = tf.logical_and(valid > 0, tf.logical_and(tf.math.is_finite(grad_sq), tf.math.is_finite(trace)))
        new = self.decay * self.ema + (1.0 - self.decay) * tf.stack([grad_sq, trace])
        self.ema.assign(tf.where(ok, new, self.ema))
        self.count.assign_add(tf.cast(ok, tf.int64))
        ema = self.ema.read_value()
        ratio = tf.where(ema[0] > 0, ema[1] / tf.where(ema[0] > 0, ema[0], 1.0), tf.constant(math.nan, tf.float64))
        return tf.cast(tf.stack([grad_sq, trace, ratio]), tf.float32)

    def summary(self, small_batch: float, big_batch: int) -> dict:
        count = int(self.count.numpy())
        g2, tr = (float(x) for x in self.ema.numpy())
        corr = 1.0 - self.decay**count if count else math.nan
        g2, tr = (g2 / corr, tr / corr) if count else (math.nan, math.nan)
        return {"noise_scale": b_simple(g2, tr), "noise_scale_grad_sq": g2, "noise_scale_trace": tr,
                "noise_scale_steps": count, "noise_scale_ema_decay": self.decay,
                "noise_scale_small_batch": small_batch, "noise_scale_big_batch": big_batch}
