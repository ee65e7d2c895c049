"""The gradient noise scale inside the training step (TensorFlow); the estimator itself, its derivation and the
run-level estimate are in tftoolkit/noise_scale.py (NumPy, shared with advise, the report and notebook 05).
"""

from __future__ import annotations

import logging
import math

import tensorflow as tf

from ..noise_scale import (  # noqa: F401 - the arithmetic, re-exported for the step's callers
    EMA_DECAY, SUMMARY_FIELDS, b_simple, ema, estimate_from_gradients, growth, reliability, robust_estimate, unbiased)

log = logging.getLogger("tftoolkit")


# --- in the training step (TensorFlow) ---------------------------------------------------------------------
def _all_layers(model):
    for layer in getattr(model, "layers", []):
        yield layer
        yield from _all_layers(layer)


def _dense(g):
    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


def sq_norm(grads):
    """Σ g² over a list of gradient tensors, in float64 (float16 gradients would overflow; float32 sums of
    many terms lose the digits the difference |G_small|² − |G_big|² needs)."""
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(_dense(g), tf.float64))) for g in grads if g is not None])


def loss_scale(optimizer):
    """The factor the loss (hence every gradient) was multiplied by before differentiation (float16 loss
    scaling); norms are taken of the unscaled gradients."""
    return tf.cast(optimizer.scale_loss(tf.constant(1.0)), tf.float64)


def two_halves(forward_backward, images, labels, denom):
    """One replica: forward/backward on each half of the batch (the two small batches); returns
    (loss, full-batch gradients, [(half gradients, half size), ...]).

    Each half's loss is its per-example sum over the *whole* batch's ``denom`` (plus its share of the
    regularisation), so the two gradients add up to the gradient the unsplit step computes.
    """
    n = tf.shape(tf.nest.flatten(labels)[0])[0]
    h = n // 2
    share_a = tf.cast(h, tf.float32) / tf.cast(tf.maximum(n, 1), tf.float32)

    def half(tree, first):  # every input and target of a structure, cut alike
        return tf.nest.map_structure(lambda t: t[:h] if first else t[h:], tree)

    loss_a, g_a = forward_backward(half(images, True), half(labels, True), denom, share_a)
    loss_b, g_b = forward_backward(half(images, False), half(labels, False), denom, 1.0 - share_a)
    grads = [None if a is None else _dense(a) + _dense(b) for a, b in zip(g_a, g_b)]
    return loss_a + loss_b, grads, [(g_a, h), (g_b, n - h)]


class NoiseScale:
    """Per-step estimates inside the step, their EMAs in variables (checkpointed with the run).

    ``replica_sums`` runs on each replica before the gradient all-reduce and returns a 4-vector that is
    all-reduced (SUM) together with the gradients; ``estimate`` turns the reduced vector and the reduced
    gradients into this step's (|G|², tr Σ, valid); ``update`` (outside ``strategy.run``) folds them into
    the EMAs and returns (|G|², tr Σ, B_simple of the EMAs) for steps.csv.
    """

    def __init__(self, replicas: int, decay: float = EMA_DECAY, model=None, accumulate: int = 1):
        if replicas == 1 and accumulate == 1 and model is not None and any(
                "BatchNormalization" in type(layer).__name__ for layer in _all_layers(model)):
            log.warning("--noise-scale on one replica runs the batch as two halves, so batch norm normalises "
                        "each half by its own statistics (like ghost batch norm): training differs from a run "
                        "without it. Use 2 or more replicas (or --accumulate 2) to measure the noise scale without "
                        "changing training")
        self.replicas = replicas
        # With --accumulate K the small batches are the replicas' micro-batches: replicas x K of them per step.
        self.accumulate = accumulate
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

    def part_sums(self, grads, b, denom, scale):
        """[|mean gradient of the part|², 1/b, 1, usable] for one small batch of ``b`` examples (a replica's batch,
        one of its halves, or one of its micro-batches): additive over the parts of a step."""
        denom = tf.cast(denom, tf.float64)
        b = tf.cast(b, tf.float64)
        safe_b = tf.maximum(b, 1.0)
        # A part's gradient is its batch-mean gradient x b/denom (the loss is divided by the global batch so that
        # the all-reduce SUM gives the global mean): undo that factor, and the loss scale.
        sq = sq_norm(grads) * tf.square(denom / safe_b / scale)
        usable = b >= 1.0
        if self.replicas * self.accumulate > 1:
            # An uneven split (partial last batch) would weight the regularisation gradient unevenly.
            usable = tf.logical_and(usable, tf.equal(b * self.replicas * self.accumulate, denom))
        return tf.stack([sq, 1.0 / safe_b, tf.constant(1.0, tf.float64), tf.cast(usable, tf.float64)])

    def replica_sums(self, parts, denom, scale):
        """[Σ|mean gradient of part|², Σ 1/b, parts, parts usable] on this replica, for parts [(grads, b), ...]."""
        return tf.add_n([self.part_sums(grads, b, denom, scale) for grads, b in parts])

    def estimate(self, sums, reduced_grads, denom, scale):
        """This step's (|G|², tr Σ, valid) from the all-reduced sums and gradients (float64 3-vector)."""
        parts = sums[2]
        small_sq, inv_small = sums[0] / parts, sums[1] / parts
        big_sq = sq_norm(reduced_grads) / tf.square(scale)
        grad_sq, trace = unbiased(small_sq, inv_small, big_sq, tf.cast(denom, tf.float64))
        valid = tf.cast(tf.equal(sums[3], parts), tf.float64)
        return tf.stack([grad_sq, trace, valid])

    def update(self, est):
        grad_sq, trace, valid = est[0], est[1], est[2]
        ok = tf.logical_and(valid > 0, tf.logical_and(tf.math.is_finite(grad_sq), tf.math.is_finite(trace)))
        new = self.decay * self.ema + (1.0 - self.decay) * tf.stack([grad_sq, trace])
        self.ema.assign(tf.where(ok, new, self.ema))
        self.count.assign_add(tf.cast(ok, tf.int64))
        ema = self.ema.read_value()
        nan = tf.constant(math.nan, tf.float64)
        ratio = tf.where(ema[0] > 0, ema[1] / tf.where(ema[0] > 0, ema[0], 1.0), nan)
        # The step's own estimates for steps.csv (NaN where the step did not count): what robust_estimate averages.
        return tf.cast(tf.stack([tf.where(ok, grad_sq, nan), tf.where(ok, trace, nan), ratio]), tf.float32)

    def summary(self, small_batch: float, big_batch: int, grad_sq=(), trace=(), final_loss=None,
                classes=None) -> dict:
        """summary.json's noise fields: the robust estimate over the run's per-step ``grad_sq`` / ``trace`` (the
        headline ``noise_scale``, its interval and whether it can be trusted), and the EMAs' ratio at the end."""
        count = int(self.count.numpy())
        g2, tr = (float(x) for x in self.ema.numpy())
        corr = 1.0 - self.decay**count if count else math.nan
        g2, tr = (g2 / corr, tr / corr) if count else (math.nan, math.nan)
        est = robust_estimate(grad_sq, trace)
        warnings = reliability(est, final_loss, classes)
        grew, steps = growth(grad_sq, trace), len(grad_sq)
        return {"noise_scale": est["noise_scale"], "noise_scale_interval": est["interval"],
                "noise_scale_reliable": not warnings, "noise_scale_warnings": warnings,
                "noise_scale_window_steps": est["steps"],
                "noise_scale_window": [est["from_index"] + 1, steps, steps] if steps else None,
                "noise_scale_growth": grew["ratio"], "noise_scale_growth_interval": grew["interval"],
                "noise_scale_early": grew["early"], "noise_scale_ema": b_simple(g2, tr),
                "noise_scale_grad_sq": g2, "noise_scale_trace": tr,
                "noise_scale_steps": count, "noise_scale_ema_decay": self.decay,
                "noise_scale_small_batch": small_batch, "noise_scale_big_batch": big_batch}
