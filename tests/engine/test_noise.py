"""Gradient noise scale: the estimator against problems whose tr(Σ) and |G|² are known in closed form.

1. Linear least squares, NumPy: loss ½(xᵀw − y)², x ~ N(0, I_d), y = xᵀw* + ε, ε ~ N(0, σ²). At w with
   r = w − w*, the per-example gradient is g = x(xᵀr − ε), so G = E[xxᵀ]r = r and, with the Gaussian fourth
   moment E[|x|²(xᵀr)²] = (d+2)|r|², E|g|² = (d+2)|r|² + dσ²:
       |G|² = |r|²,   tr(Σ) = E|g|² − |G|² = (d+1)|r|² + dσ².
2. The training loop itself (cross-entropy, as the engine trains): a linear softmax classifier at zero
   weights on x ~ N(μ, s²I_d) with labels drawn independently of x from class probabilities π. With logits 0,
   softmax p = 1/K, and the per-example gradient is (x vᵀ, v) for kernel and bias, v = 1/K − onehot(y). With
   m = E[v] = 1/K − π and E|v|² = 1 − 1/K:
       |G|² = (|μ|² + 1)|m|²,   tr(Σ) = (|μ|² + d s² + 1)(1 − 1/K) − |G|².
   A learning rate of 1e-9 keeps the weights at zero, so every step samples the same point.
"""

import math

import numpy as np
import pandas as pd
import pytest

import tftoolkit
from tftoolkit.config import RunConfig
from tftoolkit.errors import ConfigError

from helpers import lazy

noise = lazy("tftoolkit.engine.noise")  # collected without TensorFlow (tests/helpers.py)

TOLERANCE = 0.15  # the bar; the estimates below land within a few percent


def least_squares_truth(r, sigma):
    d = len(r)
    g2 = float(r @ r)
    return g2, (d + 1) * g2 + d * sigma**2


def softmax_at_zero_truth(mu, s, pi):
    k, d = len(pi), len(mu)
    m = 1.0 / k - np.asarray(pi)
    g2 = (mu @ mu + 1.0) * (m @ m)
    return g2, (mu @ mu + d * s**2 + 1.0) * (1.0 - 1.0 / k) - g2


# --- the estimator's arithmetic --------------------------------------------------------------------------
def test_unbiased_matches_mccandlish_a1_and_inverts_the_expectation():
    g2, tr, bs, bb = 0.3, 7.0, 16, 64
    small, big = g2 + tr / bs, g2 + tr / bb  # E|G_B|^2 = |G|^2 + tr(Sigma)/B
    est_g2, est_tr = noise.unbiased(small, 1 / bs, big, bb)
    assert est_g2 == pytest.approx(g2) and est_tr == pytest.approx(tr)
    # The appendix's |G|^2 form: (B_big|G_big|^2 - B_small|G_small|^2) / (B_big - B_small).
    assert est_g2 == pytest.approx((bb * big - bs * small) / (bb - bs))
    # Uneven small batches: 1/B_small is the mean of 1/b_i.
    bs_list = [20, 12]
    small_uneven = np.mean([g2 + tr / b for b in bs_list])
    assert noise.unbiased(small_uneven, np.mean([1 / b for b in bs_list]), big, bb) == pytest.approx((g2, tr))


def test_ema_is_bias_corrected_and_skips_nan():
    out = noise.ema([5.0, 5.0, math.nan, 5.0], decay=0.99)
    np.testing.assert_allclose(out, [5.0, 5.0, 5.0, 5.0])
    assert math.isnan(noise.ema([math.nan])[0])
    assert math.isnan(noise.b_simple(-0.1, 3.0)) and noise.b_simple(0.5, 3.0) == 6.0


@pytest.mark.parametrize("replicas, per_replica", [(4, 16), (8, 8), (2, 32)])
def test_least_squares_noise_scale_matches_the_closed_form(replicas, per_replica):
    rng = np.random.default_rng(1)
    d, sigma, steps = 10, 0.5, 400
    w_star = rng.standard_normal(d)
    r = rng.standard_normal(d) * 0.5
    w = w_star + r
    truth_g2, truth_tr = least_squares_truth(r, sigma)
    ests = []
    for _ in range(steps):
        x = rng.standard_normal((replicas * per_replica, d))
        y = x @ w_star + sigma * rng.standard_normal(len(x))
        g = x * (x @ w - y)[:, None]  # per-example gradients
        small = [p.mean(0) for p in np.split(g, replicas)]
        ests.append(noise.estimate_from_gradients(small, [per_replica] * replicas, g.mean(0), len(g)))
    est_g2, est_tr = (noise.ema(np.array(ests)[:, i])[-1] for i in range(2))
    assert est_tr == pytest.approx(truth_tr, rel=TOLERANCE)
    assert est_g2 == pytest.approx(truth_g2, rel=TOLERANCE)
    assert noise.b_simple(est_g2, est_tr) == pytest.approx(truth_tr / truth_g2, rel=TOLERANCE)
    # And the plain average over all steps (less noisy than the EMA's last ~100) is much closer still.
    mean_g2, mean_tr = np.array(ests).mean(0)
    assert mean_tr / mean_g2 == pytest.approx(truth_tr / truth_g2, rel=0.05)


# --- the training loop -----------------------------------------------------------------------------------
ZERO_LINEAR = "models_for_tests:zero_linear"  # a linear softmax classifier at zero (tests/models_for_tests.py)


def _softmax_problem(n=8192, d=8, seed=0):
    rng = np.random.default_rng(seed)
    mu, s, pi = np.full(d, 0.35), 1.0, np.array([0.55, 0.25, 0.15, 0.05])
    x = (mu + s * rng.standard_normal((n, d))).astype("float32").reshape(n, 1, 1, d)
    y = rng.choice(len(pi), n, p=pi).astype("int32")
    return (x, y), softmax_at_zero_truth(mu, s, pi)


@pytest.mark.parametrize("replicas, accumulate", [(4, 1), (1, 1), (2, 2), (1, 4)])
def test_training_loop_noise_scale_matches_the_closed_form(tmp_path, replicas, accumulate):
    # With --accumulate K the small batches are the micro-batches (B_small = 16 at 2 x K2 and 1 x K4, as at 4 x 1),
    # B_big the global batch: the estimate is the same whatever K, within the bar.
    (x, y), (truth_g2, truth_tr) = _softmax_problem()
    cfg = RunConfig(replicas=replicas, global_batch=64, model=ZERO_LINEAR, num_classes=4, optimizer="sgd",
                    base_lr=1e-9, lr_rule="none", epochs=1, steps_per_loop=32, noise_scale=True, measure=False,
                    accumulate=accumulate)
    s = tftoolkit.train(cfg, tmp_path / "run", quiet=True, data=(x, y))
    assert s["status"] == "ok" and s["noise_scale_steps"] == 128
    small = 32 if replicas * accumulate == 1 else 64 // (replicas * accumulate)
    assert s["noise_scale_big_batch"] == 64 and s["noise_scale_small_batch"] == small
    assert s["noise_scale_trace"] == pytest.approx(truth_tr, rel=TOLERANCE)
    assert s["noise_scale_grad_sq"] == pytest.approx(truth_g2, rel=TOLERANCE)
    assert s["noise_scale_ema"] == pytest.approx(truth_tr / truth_g2, rel=TOLERANCE)  # 26.0
    # The run's figure: the averaged estimates of the later half (64 steps), with an interval around the truth.
    assert s["noise_scale"] == pytest.approx(truth_tr / truth_g2, rel=TOLERANCE) and s["noise_scale_window_steps"] == 64
    lo, hi = s["noise_scale_interval"]
    assert lo < truth_tr / truth_g2 < hi
    # The LR is 1e-9: the loss stays at ln(4), and the summary says the figure cannot guide a batch choice.
    assert s["noise_scale_reliable"] is False and "near ln(4)" in s["noise_scale_warnings"][0]
    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    assert list(steps.columns) == ["step", "epoch", "loss", "learning_rate", "step_time_s", "call", "timed",
                                   "noise_grad_sq", "noise_trace", "noise_scale"]
    assert steps["noise_scale"].iloc[-1] == pytest.approx(s["noise_scale_ema"], rel=1e-5)
    assert steps[["noise_grad_sq", "noise_trace", "noise_scale"]].notna().all().all()
    est = noise.robust_estimate(steps["noise_grad_sq"], steps["noise_trace"])
    assert est["noise_scale"] == pytest.approx(s["noise_scale"], rel=1e-6)  # what advise recomputes from the file


def test_noise_scale_does_not_change_what_is_trained(tmp_path):
    # Several replicas: the same gradients are applied (the norms ride along). One replica: the two halves'
    # gradients add up to the whole batch's (to float rounding).
    (x, y), _ = _softmax_problem(n=512)
    for replicas in (2, 1):
        base = RunConfig(replicas=replicas, global_batch=64, model=ZERO_LINEAR, num_classes=4, optimizer="momentum",
                         base_lr=0.5, lr_rule="none", steps=8, steps_per_loop=4, measure=False)
        off = tftoolkit.train(base, tmp_path / f"off{replicas}", quiet=True, data=(x, y))
        on = tftoolkit.train(base.replace(noise_scale=True), tmp_path / f"on{replicas}", quiet=True, data=(x, y))
        a = pd.read_csv(tmp_path / f"off{replicas}" / "steps.csv")["loss"]
        b = pd.read_csv(tmp_path / f"on{replicas}" / "steps.csv")["loss"]
        assert a.iloc[-1] < a.iloc[0] - 0.02  # it trained (labels ignore x: the floor is the entropy of pi)
        np.testing.assert_allclose(b, a, rtol=1e-5 if replicas == 1 else 0)
        assert off["final_loss"] == pytest.approx(on["final_loss"], rel=1e-5)


@pytest.mark.parametrize("kw", [dict(replicas=1, global_batch=1), dict(replicas=2, per_replica_batch=1),
                                dict(replicas=4, global_batch=4)])
def test_per_replica_batch_of_one_is_refused(kw):
    with pytest.raises(ConfigError, match="noise_scale needs a per-replica batch of at least 2"):
        RunConfig(noise_scale=True, **kw)
    RunConfig(noise_scale=False, **kw)  # fine without it


def test_cli_refuses_noise_scale_with_batch_one(tmp_path, capsys):
    from tftoolkit.cli import main

    assert main(["train", "--replicas", "2", "--per-replica-batch", "1", "--noise-scale", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "noise_scale needs a per-replica batch of at least 2" in err and len(err.strip().splitlines()) == 1


def test_one_replica_with_batch_norm_warns_that_halves_change_training(caplog):
    import keras

    i = keras.Input((4,))
    bn_model = keras.Model(i, keras.layers.Dense(2)(keras.layers.BatchNormalization()(i)))
    with caplog.at_level("WARNING", logger="tftoolkit"):
        noise.NoiseScale(1, model=bn_model)
        noise.NoiseScale(2, model=bn_model)  # several replicas: training is unchanged, no warning
    assert caplog.text.count("ghost batch norm") == 1
