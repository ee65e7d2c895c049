"""LR range test and batch finder, under MirroredStrategy on simulated replicas.

The LR test runs on a problem whose stable LR range is known: a zero-initialised linear softmax classifier on
x ~ N(0, I_8) with K = 4 classes. At zero weights the loss Hessian is E[xxᵀ] ⊗ (I/K − 11ᵀ/K²), whose largest
eigenvalue is 1/K, so plain gradient descent is stable for LR < 2K = 8 near the start.
"""

import json

import numpy as np
import pandas as pd
import pytest

from tftoolkit.tuning import finders
from tftoolkit.cli import main
from tftoolkit.config import RunConfig
from tftoolkit.errors import ConfigError, ModelError

MODELS = "models_for_tests"  # zero_linear, dense_net (tests/models_for_tests.py)


def _separable(n=4096, d=8, k=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype("float32")
    y = np.argmax(x @ rng.standard_normal((d, k)), 1).astype("int32")
    return x.reshape(n, 1, 1, d), y


# --- pure pieces -----------------------------------------------------------------------------------------
def test_suggestion_is_the_steepest_point_of_a_known_curve():
    lrs = finders.exponential_lrs(1e-5, 10.0, 200)
    assert lrs[0] == pytest.approx(1e-5) and lrs[-1] == pytest.approx(10.0)
    # Loss falls as a tanh in log LR, steepest at LR 1e-2, then blows up past LR 1.
    loss = 2.0 - np.tanh(np.log(lrs / 1e-2)) + np.where(lrs > 1.0, (lrs - 1.0) * 50, 0.0)
    stop = finders.blowup_index(finders.running_smooth(loss, 10))
    assert lrs[stop] > 1.0 and lrs[stop] < 2.0
    lr, why = finders.suggest_lr(lrs[:stop], finders.centred_smooth(loss[:stop], 10))
    assert lr == pytest.approx(1e-2, rel=0.15) and why == "steepest descent of the smoothed loss"


def test_no_suggestion_when_the_loss_does_not_fall():
    lrs = finders.exponential_lrs(1e-5, 10.0, 100)
    lr, why = finders.suggest_lr(lrs, np.full(100, 2.3) + 0.001 * np.sin(np.arange(100)))
    assert np.isnan(lr) and "fell by only" in why


def _default_task_like_sweep(seed=0):
    """A sweep like the default task's: a loss of 1.60 flat to LR 1e-4, a 2% fall steepest at LR 6e-4 (the known
    answer) to a minimum near 1.3e-3, then a climb; raw scatter 0.01 a step."""
    lrs = finders.exponential_lrs(1e-6, 10.0, 200)
    fall = 0.032 * (1 + np.tanh(3 * np.log(lrs / 6e-4))) / 2
    climb = np.where(lrs > 1.3e-3, (lrs / 1.3e-3 - 1) * 0.1, 0.0)
    return lrs, 1.60 - fall + climb + 0.01 * np.random.default_rng(seed).standard_normal(200)


def test_a_small_clear_fall_gets_a_suggestion_and_noise_does_not():
    # The default task's sweep fell by 1.7% from LR 3e-4 to its minimum: the old fixed 2% rule suggested nothing.
    lrs, loss = _default_task_like_sweep()
    stop = finders.blowup_index(finders.running_smooth(loss, 10))
    sm = finders.centred_smooth(loss[:stop], 10)
    assert np.isnan(finders.suggest_lr(lrs[:stop], sm, min_drop=0.02)[0])  # the old rule
    lr, why = finders.suggest_lr(lrs[:stop], sm, losses=loss[:stop], window=10)
    assert lr == pytest.approx(6e-4, rel=0.25) and why == "steepest descent of the smoothed loss"
    # The same scatter with no fall: no suggestion, in any of 20 draws, and the reason gives the figures.
    for seed in range(20):
        flat = 1.60 + 0.01 * np.random.default_rng(seed).standard_normal(200)
        lr, why = finders.suggest_lr(lrs, finders.centred_smooth(flat, 10), losses=flat, window=10)
        assert np.isnan(lr), seed
    assert "fell by only" in why and "x its noise (0.00" in why and "to its minimum at LR" in why
    # The default task's sweep measured here (144 steps, 2026-12-04): the loss never left ln(10) = 2.303.
    flat = 2.302 + 0.004 * np.random.default_rng(0).standard_normal(144)
    lr, why = finders.suggest_lr(lrs[:144], finders.centred_smooth(flat, 10), losses=flat, window=10,
                                 chance=np.log(10))
    assert np.isnan(lr) and why.startswith("the loss never left chance (ln(classes) = 2.303) in 144 steps (the "
                                           "smoothed loss fell by only")
    # A clear fall that ends above 98% of ln(classes) is still a fall: suggested, not called chance.
    lrs, loss = _default_task_like_sweep()
    loss = loss + (2.303 - 1.60)  # 2.30 falling by 0.032 to 2.27, above 0.98 x 2.303 = 2.257
    stop = finders.blowup_index(finders.running_smooth(loss, 10))
    lr, _ = finders.suggest_lr(lrs[:stop], finders.centred_smooth(loss[:stop], 10), losses=loss[:stop], window=10,
                               chance=np.log(10))
    assert lr == pytest.approx(6e-4, rel=0.25)


def test_centred_smoothing_does_not_lag():
    ramp = np.arange(100.0)
    np.testing.assert_allclose(finders.centred_smooth(ramp, 11)[5:-5], ramp[5:-5])
    assert finders.running_smooth(ramp, 11)[50] < 46  # an EMA of span 11 trails a ramp by ~5 points


def test_search_stops_at_a_few_percent_and_says_how_many_trials_are_left():
    # The model fitted 2744 per replica; the old search bisected to 2745, 2746, 2748 (390 s of real steps).
    calls, said = [], []

    def fits(b):
        calls.append(b)
        return b <= 2744

    best, capped = finders.search_batch(fits, 32, precision=0.03, announce=lambda *a: said.append(a))
    assert not capped and 2744 * 0.97 <= best <= 2744 and fits(best)
    assert said == [(2048, 4096, 6)] and len(calls) - 1 == 8 + 6  # 32..4096 doubling, then the 6 announced
    # An estimate that knows the answer (CPU replicas: the criterion is the estimate) costs one trial, exactly.
    calls.clear()
    assert finders.search_batch(fits, 32, precision=0.03, known=lambda lo, hi: 2744) == (2744, False)
    assert calls[-1] == 2744 and len(calls) == 8 + 1


def test_search_doubles_then_bisects():
    calls = []

    def fits(b):
        calls.append(b)
        return b <= 300

    assert finders.search_batch(fits, 32) == (300, False)
    assert calls[:5] == [32, 64, 128, 256, 512] and len(calls) == 5 + 8  # 256..512 bisected in 8 steps
    calls.clear()
    assert finders.search_batch(fits, 1000) == (300, False)  # halving first
    assert calls[:3] == [1000, 500, 250]
    assert finders.search_batch(lambda b: True, 8, max_batch=100) == (100, True)
    assert finders.search_batch(lambda b: False, 8) == (0, False)


def test_memory_estimate_of_a_hand_counted_model():
    import keras

    from tftoolkit.engine import models as registry

    model = registry.build(f"{MODELS}:dense_net", (2, 2, 3), 5)
    params = 12 * 16 + 16 + 16 * 5 + 5
    est = finders.estimate_memory(model, 10, "adam")
    assert est["fixed"] == params * 4 * (2 + 2)  # weights, gradients, two Adam slots
    assert est["per_example"] == 2 * (12 + 12 + 16 + 5) * 4  # input, flatten, dense, logits; x2 for backward
    assert est["total"] == est["fixed"] + 10 * est["per_example"]
    assert isinstance(model, keras.Model)


def test_oom_errors_are_recognised():
    import tensorflow as tf

    assert finders._is_oom(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor"))
    assert finders._is_oom(MemoryError())
    assert finders._is_oom(tf.errors.InternalError(None, None, "Failed to allocate 4 GiB"))
    assert not finders._is_oom(tf.errors.InternalError(None, None, "something else"))
    assert not finders._is_oom(ValueError("OOM"))


# --- under the strategy ----------------------------------------------------------------------------------
def test_find_lr_on_a_problem_with_a_known_stable_range(tmp_path):
    cfg = RunConfig(replicas=2, per_replica_batch=32, optimizer="sgd", lr_rule="linear", base_batch=32,
                    model=f"{MODELS}:zero_linear", num_classes=4, steps_per_loop=25)
    r = finders.find_lr(cfg, tmp_path / "lr", lr_min=1e-4, lr_max=1e3, steps=150, quiet=True, data=_separable())
    assert r["stopped_at_step"] is not None and r["stopped_at_step"] < 150  # the loss blew up before lr_max
    blown = r["frame"]["learning_rate"].iloc[-1]
    assert 8 < blown < 300  # past the stable limit 2K = 8 of plain gradient descent, well before 1e3
    assert 0.05 < r["suggested_lr"] < 2  # where the loss falls fastest, an order of magnitude under the blow-up
    assert r["suggested_base_lr"] == pytest.approx(r["suggested_lr"] / 2)  # linear rule: global 64 vs base 32
    frame = pd.read_csv(tmp_path / "lr" / "lr_find.csv")
    assert list(frame.columns) == ["step", "learning_rate", "loss", "smoothed_loss"]
    assert frame["smoothed_loss"].min() < 0.6 * frame["smoothed_loss"].iloc[0]
    assert json.loads((tmp_path / "lr" / "lr_find.json").read_text())["suggested_lr"] == r["suggested_lr"]
    assert (tmp_path / "lr" / "lr_find.png").stat().st_size > 10_000


def test_find_batch_on_cpu_follows_the_memory_estimate(tmp_path, monkeypatch):
    from tftoolkit.engine import step as train_mod

    engines = []
    real = train_mod.build_engine
    monkeypatch.setattr(train_mod, "build_engine", lambda *a, **k: engines.append(real(*a, **k)) or engines[-1])
    cfg = RunConfig(replicas=2, per_replica_batch=16, optimizer="momentum", model=f"{MODELS}:dense_net",
                    dataset="synthetic", image_size=4, train_images=256)
    limit_mb = 0.25
    r = finders.find_batch(cfg, tmp_path / "fb", memory_limit_mb=limit_mb, quiet=True)
    # Every trial that ran a step (the five that fit) used the one trace: the batch size is not in the graph.
    assert len(engines) == 1 and engines[0].train_loop.experimental_get_tracing_count() == 1
    fixed, per_ex = r["estimate_fixed_bytes"], r["estimate_per_example_bytes"]
    assert per_ex == 2 * (48 + 48 + 16 + 10) * 4
    assert r["max_per_replica_batch"] == (limit_mb * 2**20 - fixed) // per_ex  # 267
    assert r["max_global_batch"] == 2 * r["max_per_replica_batch"] and r["device_kind"] == "CPU-simulated"
    frame = pd.read_csv(tmp_path / "fb" / "batch_find.csv")
    assert frame["per_replica_batch"].tolist()[:6] == [16, 32, 64, 128, 256, 512]
    assert frame["fits"].tolist()[:6] == [True] * 5 + [False]
    assert (tmp_path / "fb" / "batch_find.png").exists()


def test_find_batch_bisects_on_out_of_memory_errors(tmp_path, monkeypatch):
    # A stand-in for a GPU: the step raises ResourceExhaustedError above 48 examples per replica.

    import tensorflow as tf

    from tftoolkit.engine import step as train_mod
    real = train_mod.build_engine

    def build_with_small_memory(*args, **kwargs):
        eng = real(*args, **kwargs)
        loop = eng.train_loop

        def oom_loop(iterator, n):
            losses, counts = loop(iterator, n)
            if int(counts.numpy()[0]) > 48 * int(n):
                raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape [49,...]")
            return losses, counts

        eng.train_loop = oom_loop
        return eng

    monkeypatch.setattr(train_mod, "build_engine", build_with_small_memory)
    cfg = RunConfig(replicas=2, per_replica_batch=32, model=f"{MODELS}:dense_net", dataset="synthetic", image_size=4,
                    train_images=256)
    r = finders.find_batch(cfg, tmp_path / "oom", memory_limit_mb=1024, quiet=True)
    assert r["max_per_replica_batch"] == 48
    frame = r["frame"]
    assert frame["per_replica_batch"].tolist() == [32, 64, 48, 56, 52, 50, 49]
    assert frame.loc[~frame["fits"], "reason"].str.startswith("out of memory: ResourceExhaustedError").all()


def test_find_batch_bad_input(tmp_path, capsys):
    cfg = RunConfig(replicas=2, per_replica_batch=8, model=f"{MODELS}:dense_net", dataset="synthetic", image_size=4,
                    train_images=256)
    with pytest.raises(ConfigError, match="simulated on CPU.*--memory-limit-mb"):
        finders.find_batch(cfg, tmp_path / "a", quiet=True)
    with pytest.raises(ModelError, match="does not fit even at per-replica batch 1"):
        finders.find_batch(cfg, tmp_path / "b", memory_limit_mb=0.001, quiet=True)
    rc = main(["find-batch", "--replicas", "2", "--model", f"{MODELS}:dense_net", "--dataset", "synthetic", "--image-size", "4",
               "--memory-limit-mb", "0.001", "--out", str(tmp_path / "c"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "does not fit even at per-replica batch 1" in err and len(err.strip().splitlines()) == 1


# --- a target global batch: the per-replica batch and accumulate that reach it ------------------------------
def test_memory_estimate_counts_the_accumulators_float32_gradient_sum():
    from tftoolkit.engine import models as registry

    model = registry.build(f"{MODELS}:dense_net", (2, 2, 3), 5)
    params = 12 * 16 + 16 + 16 * 5 + 5
    one, four = finders.estimate_memory(model, 10, "adam"), finders.estimate_memory(model, 10, "adam", accumulate=4)
    assert one["accumulator"] == 0 and four["accumulator"] == 4 * params
    assert four["total"] - one["total"] == 4 * params


def test_find_batch_reaches_a_target_global_batch_by_accumulation_on_cpu(tmp_path, capsys):
    # dense_net on 4x4x3 inputs with momentum: fixed 3 x 3816 bytes, 976 bytes per example; under 0.25 MiB one
    # replica holds 256. Global 2048 on 2 replicas is 1024 per replica: 256 x 4 would fit alone, but not with the
    # 3816-byte gradient sum accumulation keeps (11448 + 3816 + 256 x 976 > 262144): 128 x 8.
    out = tmp_path / "fb"
    assert main(["find-batch", "--replicas", "2", "--model", f"{MODELS}:dense_net", "--optimizer", "momentum",
                 "--dataset", "synthetic", "--image-size", "4", "--train-images", "256", "--memory-limit-mb", "0.25",
                 "--target-global-batch", "2048", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert ("global batch 2048 = per-replica batch 128 x 2 replica(s) x accumulate 8: train with --replicas 2 "
            "--per-replica-batch 128 --accumulate 8 (the memory estimate counts the") in text
    r = json.loads((out / "batch_find.json").read_text())
    assert r["max_per_replica_batch"] == 256
    t = r["target"]
    assert (t["global_batch"], t["replicas"], t["per_replica_batch"], t["accumulate"], t["accumulator_bytes"]) == (
        2048, 2, 128, 8, 3816)


def test_a_gpu_target_says_what_the_trials_did_not_hold():
    from types import SimpleNamespace

    from tftoolkit.engine import models as registry

    model = registry.build(f"{MODELS}:dense_net", (4, 4, 3), 10)
    cfg = RunConfig(replicas=4, optimizer="adam")
    t = finders._target(1000, SimpleNamespace(kind="GPU", replicas=4), 100, None, model, cfg, None)
    assert (t["per_replica_batch"], t["accumulate"]) == (50, 5)  # 250 per replica: 50 x 5 (125 > 100)
    assert "not in their peak; leave that much free" in t["memory"] and t["accumulator_bytes"] == 3816
    t = finders._target(1000, SimpleNamespace(kind="GPU", replicas=4), 300, None, model, cfg, None)
    assert (t["per_replica_batch"], t["accumulate"]) == (250, 1) and t["memory"].startswith("no accumulation")
    # A per-replica batch the user fixed is kept, if it fits.
    t = finders._target(1000, SimpleNamespace(kind="GPU", replicas=4), 100, 25, model, cfg, None)
    assert (t["per_replica_batch"], t["accumulate"]) == (25, 10)
    with pytest.raises(ConfigError, match="--per-replica-batch 125 does not fit: the most a replica holds is 100"):
        finders._target(1000, SimpleNamespace(kind="GPU", replicas=4), 100, 125, model, cfg, None)


@pytest.mark.parametrize("args, message", [
    (["--target-global-batch", "101"], "--target-global-batch 101 does not divide among 2 replica(s): use a multiple "
                                       "of 2 (100 or 102)"),
    (["--target-global-batch", "0"], "--target-global-batch must be a whole number of examples > 0, got 0"),
    (["--target-global-batch", "100", "--per-replica-batch", "16"],
     "--target-global-batch 100 is not a multiple of --per-replica-batch 16 x 2 replica(s) = 32: use 96 or 128, or "
     "drop --per-replica-batch"),
])
def test_find_batch_bad_target_is_one_line_exit_2_before_any_trial(tmp_path, capsys, args, message):
    rc = main(["find-batch", "--replicas", "2", "--model", f"{MODELS}:dense_net", "--dataset", "synthetic",
               "--image-size", "4", "--memory-limit-mb", "1", "--out", str(tmp_path / "c"), "--quiet", *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()


def test_find_batch_tries_one_micro_batch(tmp_path):
    with pytest.raises(ConfigError, match="leave accumulate at 1, and give --target-global-batch"):
        finders.find_batch(RunConfig(replicas=2, accumulate=2), tmp_path / "a", memory_limit_mb=1, quiet=True)
