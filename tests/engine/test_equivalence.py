"""The invariant the toolkit stands on: N replicas compute what 1 device computes for the same global batch."""

import functools

import numpy as np
import pytest

from tftoolkit.config import RunConfig
from tftoolkit.data import pipeline, source as source_mod
from tftoolkit.engine import loop, session
from tftoolkit.engine.step import build_engine

STEPS = 6


def _train_weights(replicas, optimizer, base_lr, model="small_cnn", steps_per_loop=3, jit=False, dtype=None,
                   cross_device_ops="auto", **extra):
    """(weights, per-step losses) after STEPS steps, set up and driven exactly as a training run is; ``extra``:
    other config fields (accumulate, allreduce_dtype, allreduce_packs)."""
    weights, losses, _ = _trained(replicas, optimizer, base_lr, model, steps_per_loop, jit, dtype, cross_device_ops,
                                  tuple(sorted(extra.items())))
    return [w.copy() for w in weights], losses.copy()


def _moved(weights, replicas, optimizer, base_lr, model="small_cnn", steps_per_loop=3, jit=False, dtype=None) -> float:
    """How far ``weights`` are from that run's initial weights (its largest change): a comparison of two runs
    means something only if training moved them."""
    _, _, initial = _trained(replicas, optimizer, base_lr, model, steps_per_loop, jit, dtype, "auto")
    return max(np.abs(a - b).max() for a, b in zip(weights, initial))


@functools.lru_cache(maxsize=None)
def _trained(replicas, optimizer, base_lr, model, steps_per_loop, jit, dtype, cross_device_ops="auto", extra=()):
    # Cached: the 1-device baselines serve every replica count and test that compares with them.
    config = RunConfig(replicas=replicas, global_batch=48, optimizer=optimizer, base_lr=base_lr, base_batch=48,
                       model=model, steps=STEPS, steps_per_loop=steps_per_loop, jit=jit, seed=7, measure=False,
                       cross_device_ops=cross_device_ops, **dict(extra))
    x, y = source_mod.synthetic_arrays(480, 16, 10, seed=3)
    # The run's own set-up: seed (the same initial weights for every replica count) and determinism.
    sess = session.start(config, data=(x, y))
    if dtype:
        import keras

        keras.config.set_dtype_policy(dtype)
    eng = build_engine(sess.config, sess.strategy, sess.source, sess.source.train_examples)
    initial = [w.copy() for w in eng.model.get_weights()]
    losses = []
    loop.drive(eng.train_loop, lambda start: iter(pipeline.train_input(sess.strategy, sess.source, sess.config,
               start)), start=0, total=STEPS,
               steps_per_epoch=sess.derived["steps_per_epoch"], steps_per_loop=steps_per_loop,
               on_loop=lambda chunk: losses.extend(chunk.outputs[0].tolist()))
    return [w.copy() for w in eng.model.get_weights()], np.array(losses), initial


def _assert_same(a, b, rtol=1e-5):
    """Equal within rtol of the model's weight scale (a per-tensor scale would judge a bias of ~0.02 at float32
    rounding of the much larger sums that produce it)."""
    scale = max(np.abs(w).max() for w in a)
    for wa, wb in zip(a, b):
        np.testing.assert_allclose(wa, wb, rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("optimizer, lr", [("momentum", 0.05), ("adam", 0.003)])
@pytest.mark.parametrize("replicas", [2, 4])
def test_n_replicas_equal_one_device(replicas, optimizer, lr):
    w1, l1 = _train_weights(1, optimizer, lr)
    wn, ln = _train_weights(replicas, optimizer, lr)
    # The weights moved (so the comparison means something) ...
    assert _moved(w1, 1, optimizer, lr) > 1e-3
    # ... and N replicas end where one device ends, step by step in loss too.
    # Adam divides each coordinate's step by its gradient RMS, so float32 rounding in a near-zero gradient
    # becomes a visible difference in that coordinate's update: 1e-4 of the weight scale, 1e-5 for momentum.
    _assert_same(w1, wn, rtol=1e-5 if optimizer == "momentum" else 1e-4)
    np.testing.assert_allclose(ln, l1, rtol=1e-5)


@pytest.mark.slow  # a training of ~5 s (test-fast's budget; make test runs it)
def test_the_default_recipe_on_four_replicas_equals_one_device(restore_float32):
    # The default model and optimiser (small_vgg, Adam): per-image standardisation and no batch norm, so nothing
    # in the forward pass depends on how the global batch is cut. In float64: Adam divides each coordinate's step
    # by its gradient RMS, so where a gradient is at float32 rounding level the summation order of 1 or 4 replicas
    # can decide the sign of a whole LR-sized step (in float32 on this data: 0.8% of the weight scale, losses equal
    # to 1e-6); without that rounding what is left is the arithmetic, which must be the same (1.8e-6 measured).
    d = RunConfig()
    assert (d.model, d.optimizer) == ("small_vgg", "adam")
    w1, l1 = _train_weights(1, d.optimizer, 0.003, model=d.model, dtype="float64")
    w4, l4 = _train_weights(4, d.optimizer, 0.003, model=d.model, dtype="float64")
    assert _moved(w1, 1, d.optimizer, 0.003, model=d.model, dtype="float64") > 1e-3
    _assert_same(w1, w4, rtol=1e-5)
    np.testing.assert_allclose(l4, l1, rtol=1e-5)


@pytest.fixture
def restore_float32():
    yield
    import keras

    keras.config.set_dtype_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet20", "small_cnn_bn"])  # small_cnn_bn: the batch-size study's model
def test_synchronized_batchnorm_matches_one_device(restore_float32, model):
    # Synchronized BN computes var = E[x^2] - E[x]^2 from all-reduced sums, so its statistics are the global
    # batch's on any replica count. In float32 the two runs agree to rounding at the first step (2e-7) and then
    # drift as high-LR training amplifies the rounding of summing in another order (resnet20: 15% of the loss by
    # step 10; benchmarks/bench_float32_drift.py, BENCHMARKS.md; a shifted variance does not change it, so it is
    # not the E[x^2] - E[x]^2 cancellation). In float64 the rounding vanishes and what is left is the arithmetic,
    # which must be the same.
    w1, l1 = _train_weights(1, "momentum", 0.05, model=model, steps_per_loop=STEPS, dtype="float64")
    w2, l2 = _train_weights(2, "momentum", 0.05, model=model, steps_per_loop=STEPS, dtype="float64")
    _assert_same(w1, w2, rtol=1e-5)
    np.testing.assert_allclose(l2, l1, rtol=1e-6)


def test_steps_per_loop_does_not_change_the_result():
    w_a, l_a = _train_weights(2, "momentum", 0.05, steps_per_loop=1)
    w_b, l_b = _train_weights(2, "momentum", 0.05, steps_per_loop=6)
    _assert_same(w_a, w_b, rtol=1e-6)
    np.testing.assert_allclose(l_a, l_b, rtol=1e-6)


def test_xla_step_matches_plain_step():
    # One replica: XLA cannot compile a step across several *simulated* CPU replicas (see jit_effective).
    w_a, l_a = _train_weights(1, "momentum", 0.05, jit=False)
    w_b, l_b = _train_weights(1, "momentum", 0.05, jit=True)
    _assert_same(w_a, w_b, rtol=1e-4)
    np.testing.assert_allclose(l_a, l_b, rtol=1e-4)


@pytest.mark.slow
def test_every_all_reduce_offered_equals_one_device_or_is_refused():
    # Odd counts are where TensorFlow's hierarchical copy loses a replica: each implementation the toolkit offers
    # either trains what one device trains, or is refused before anything runs (nccl: no GPUs here).
    from tftoolkit.config import CROSS_DEVICE_OPS

    replicas = 3
    from tftoolkit.errors import ConfigError

    w_1, l_1 = _train_weights(1, "momentum", 0.05)
    trained = []
    for impl in CROSS_DEVICE_OPS:
        try:
            w_n, l_n = _train_weights(replicas, "momentum", 0.05, cross_device_ops=impl)
        except ConfigError as e:
            assert impl == "nccl" or (impl == "hierarchical_copy" and replicas % 2), (impl, e)
            continue
        _assert_same(w_1, w_n)
        np.testing.assert_allclose(l_1, l_n, rtol=1e-5)
        trained.append(impl)
    assert set(trained) == {"auto", "reduce_to_one", "collective"}


@pytest.mark.slow
def test_jit_on_several_cpu_replicas_is_skipped_said_and_changes_nothing_else(caplog):
    # XLA cannot compile one step across several simulated CPU replicas: the step runs uncompiled, the run says so
    # (jit_effective), and nothing else follows from the flag: determinism stays on (it used to be turned off
    # with --jit even when XLA never ran), so the losses are bit for bit those of the run without --jit.
    with caplog.at_level("WARNING", logger="tftoolkit"):
        sess = session.start(RunConfig(replicas=2, jit=True, dataset="synthetic", image_size=8, train_images=64))
    assert "--jit ignored" in caplog.text and sess.jit is False and sess.deterministic is True
    w_a, l_a = _train_weights(2, "momentum", 0.05, jit=False)
    w_b, l_b = _train_weights(2, "momentum", 0.05, jit=True)
    np.testing.assert_array_equal(l_a, l_b)
    for a, b in zip(w_a, w_b):
        np.testing.assert_array_equal(a, b)
    # On one CPU replica XLA does compile, and then ops are not deterministic (no deterministic XLA MaxPool
    # gradient): said, not silent.
    assert session.start(RunConfig(replicas=1, jit=True, dataset="synthetic", image_size=8,
                                   train_images=64)).deterministic is False


def test_regularisation_losses_count_once_across_replicas():
    # Each replica adds model.losses / replicas (tf.nn.scale_regularization_loss); the all-reduce sums them back
    # to one copy. Without the division, 4 replicas would apply 4x the weight decay of one device.
    w1, l1 = _train_weights(1, "momentum", 0.05, model="models_for_tests:l2_cnn")
    w4, l4 = _train_weights(4, "momentum", 0.05, model="models_for_tests:l2_cnn")
    _assert_same(w1, w4)
    np.testing.assert_allclose(l4, l1, rtol=1e-5)
    # And once across micro-batches: each adds 1/K of it.
    wk, lk = _train_weights(2, "momentum", 0.05, model="models_for_tests:l2_cnn", accumulate=2)
    _assert_same(w1, wk)
    np.testing.assert_allclose(lk, l1, rtol=1e-5)


REMAINDERS_CHILD = r"""
import numpy as np
from tftoolkit.engine import devices
devices.init(8)
import tensorflow as tf
from tftoolkit.config import RunConfig
from tftoolkit.data import registry, pipeline, source as source_mod
from tftoolkit.engine import loop, session, strategy as strategy_mod
from tftoolkit.engine.step import build_engine

# One engine per replica count (a trace each), reused for every remainder: weights and optimizer state are
# restored before each case, and every case's batches come through the toolkit's own split (data.pipeline).
BASE = dict(model="models_for_tests:tiny_conv_bn", optimizer="momentum", base_lr=0.05, lr_rule="none", warmup_epochs=0.0,
            schedule="constant", last_batch="partial", seed=5, measure=False, deterministic=True, image_size=6)
x, y = source_mod.synthetic_arrays(64, 6, 10, seed=1)
vx, vy = source_mod.synthetic_arrays(64, 6, 10, seed=2)


def engine(replicas):
    setup = devices.DeviceSetup("CPU-simulated", tuple(f"/cpu:{i}" for i in range(replicas)), None, 2)
    sess = session.start(RunConfig(replicas=replicas, global_batch=2 * replicas, **BASE), data=(x, y, vx, vy),
                         setup=setup)
    eng = build_engine(sess.config, sess.strategy, sess.source, sess.source.train_examples)
    state = [v.numpy() for v in eng.model.variables + eng.optimizer.variables]
    return sess, eng, state


def case(sess, eng, state, global_batch, n_train, n_val):
    for v, value in zip(eng.model.variables + eng.optimizer.variables, state):
        v.assign(value)
    config = sess.config.replace(global_batch=global_batch)
    source = registry.load_source(config, data=(x[:n_train], y[:n_train], vx[:n_val], vy[:n_val]))
    losses, counts = [], np.zeros(sess.strategy.num_replicas_in_sync, np.int64)

    def on_loop(chunk):
        losses.extend(chunk.outputs[0].tolist())
        counts[:] += chunk.outputs[1]

    spe = config.steps_per_epoch(n_train)
    loop.drive(eng.train_loop, lambda s: iter(pipeline.train_input(sess.strategy, source, config, s)), start=0,
               total=spe, steps_per_epoch=spe, steps_per_loop=spe, on_loop=on_loop)
    split = pipeline.eval_input(sess.strategy, source, config)
    val = eng.evaluate(split).numpy()
    # Evaluated again (every evaluation of a run reads one iterator, from where the last pass ended): the same split.
    np.testing.assert_array_equal(eng.evaluate(split).numpy(), val)
    return [w.copy() for w in eng.model.get_weights()], np.array(losses), counts, val


one = engine(1)
checked = 0
for replicas in (3, 8):  # odd (and prime), and the most, with every pattern of empty slices: a trace each
    many = engine(replicas)
    for rest in range(1, replicas):
        # A full batch of 2R, then a short one of `rest` (< R: some replicas' slices are empty), in training
        # (--last-batch partial) and in evaluation (the validation split's last batch). Remainder 0 has no short
        # batch: every equivalence test above is that case (and tests/data/test_pipeline.py checks its split).
        g, n = 2 * replicas, 2 * replicas + rest
        w1, l1, c1, v1 = case(*one, g, n, 4 * replicas + rest)
        wn, ln, cn, vn = case(*many, g, n, 4 * replicas + rest)
        assert len(ln) == 2 and np.isfinite(ln).all(), (replicas, rest, ln)
        assert cn.sum() == n and cn.max() - cn.min() <= 2, (replicas, rest, cn)
        np.testing.assert_allclose(ln, l1, rtol=1e-5, err_msg=f"{replicas} replicas, remainder {rest}")
        scale = max(np.abs(w).max() for w in w1)
        for a, b in zip(w1, wn):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale, err_msg=f"{replicas} replicas, remainder {rest}")
        assert vn[2] == v1[2] == 4 * replicas + rest, (replicas, rest, vn)  # every validation example once
        np.testing.assert_allclose(vn[:2], v1[:2], rtol=1e-5, err_msg=f"{replicas} replicas, remainder {rest}")
        checked += 1
print("checked", checked)
"""


@pytest.mark.slow  # its own process, with 8 logical CPU devices
def test_every_remainder_at_every_replica_count_trains_and_evaluates_as_one_device():
    # Short batches split over replicas leave some replicas nothing when they hold fewer examples than there are
    # replicas. Replica counts 3 and 8 x every remainder 1..R-1, in training (--last-batch partial) and in
    # evaluation: no crash, every example counted once, the same losses, weights and validation figures as one
    # device. Eight replicas with remainders 1-7 leave from one to seven replicas empty, which covers what the
    # counts between would; 2 and 4 replicas with full batches are the equivalence tests above. (The split itself
    # is checked for every count 1-8 and every remainder 0..R-1 in tests/data/test_pipeline.py; each count here
    # costs a trace of its own.)
    import subprocess
    import sys

    from helpers import ROOT, env_with_tests_on_path

    done = subprocess.run([sys.executable, "-c", REMAINDERS_CHILD], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=env_with_tests_on_path())
    assert done.returncode == 0 and "checked 9" in done.stdout, done.stderr[-4000:]


# --- gradient accumulation and the gradient exchange ----------------------------------------------------
@pytest.mark.parametrize("replicas, accumulate", [(2, 2), (1, 4)])
def test_accumulated_micro_batches_equal_one_device_at_the_global_batch(replicas, accumulate):
    # 2 replicas x 2 micro-batches of 12 (and 1 device x 4 of 12) = one device on the global batch of 48: the
    # float32 sum of the micro-batches' gradients, each divided by the global batch, all-reduced once.
    w1, l1 = _train_weights(1, "momentum", 0.05)
    wk, lk = _train_weights(replicas, "momentum", 0.05, accumulate=accumulate)
    assert _moved(w1, 1, "momentum", 0.05) > 1e-3
    _assert_same(w1, wk)
    np.testing.assert_allclose(lk, l1, rtol=1e-5)


def test_accumulation_with_synchronized_batchnorm_normalises_over_each_micro_batch_of_all_replicas(restore_float32):
    # Batch norm sees one pass at a time: the replicas' micro-batches together (2 x 12), so 2 replicas x K=2 equal one
    # device running K=2 micro-batches of 24, and differ from one device on the whole 48 at once. In float64, as the
    # synchronized batch-norm test above and for its reason (float32 rounding of sums in another order, amplified).
    kw = dict(model="small_cnn_bn", steps_per_loop=STEPS, dtype="float64")
    w1, l1 = _train_weights(1, "momentum", 0.05, accumulate=2, **kw)
    w2, l2 = _train_weights(2, "momentum", 0.05, accumulate=2, **kw)
    _assert_same(w1, w2)
    np.testing.assert_allclose(l2, l1, rtol=1e-6)
    whole, _ = _train_weights(1, "momentum", 0.05, **kw)
    assert max(np.abs(a - b).max() for a, b in zip(whole, w1)) > 1e-3  # the statistics are the micro-batches'


def test_gradients_in_packs_train_as_one_device():
    # Each pack its own all-reduce, last layers first: the same sums.
    w1, l1 = _train_weights(1, "momentum", 0.05)
    wp, lp = _train_weights(2, "momentum", 0.05, allreduce_packs=3)
    _assert_same(w1, wp)
    np.testing.assert_allclose(lp, l1, rtol=1e-5)


@pytest.mark.parametrize("dtype, unit", [("bfloat16", 2.0**-8), ("float16", 2.0**-11)])
def test_a_16_bit_all_reduce_differs_from_float32_by_rounding_only(dtype, unit):
    # Each replica's gradient is rounded to ``dtype`` once, their sum once more: a relative error of about 2 units in
    # the last place per step. Over the steps of momentum SGD the weights stay within a few units of the run's own
    # movement, and the losses too; and they are not bit-equal (the cast happened).
    w32, l32 = _train_weights(2, "momentum", 0.05)
    w16, l16 = _train_weights(2, "momentum", 0.05, allreduce_dtype=dtype)
    moved = _moved(w32, 2, "momentum", 0.05)
    diff = max(np.abs(a - b).max() for a, b in zip(w32, w16))
    assert 0 < diff <= 8 * unit * moved, (diff, moved)
    np.testing.assert_allclose(l16, l32, rtol=8 * unit)


def _tiny_loss(labels, logits):
    """Cross-entropy x 1e-6: every gradient, divided by the global batch, lies below float16's smallest normal."""
    import keras

    return 1e-6 * keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def test_a_float16_all_reduce_turns_on_loss_scaling_so_tiny_gradients_survive_the_cast(tmp_path, caplog):
    # Gradients of ~1e-7 are float16 subnormals (spacing 6e-8): cast as they are they would arrive rounded by up to
    # half their size. Under the loss scale they travel 32768 times larger, and what training does matches float32.
    import tftoolkit
    from helpers import checkpoint_variables

    x, y = source_mod.synthetic_arrays(192, 8, 4, seed=3)
    kw = dict(replicas=2, global_batch=64, optimizer="sgd", base_lr=2000.0, lr_rule="none", warmup_epochs=0.0,
              schedule="constant", model="small_cnn", steps=3, steps_per_loop=3, measure=False, seed=7,
              eval_every_epoch=False)
    # The weights both runs start from: the run's own set-up (session.start seeds them) builds the model, and
    # nothing trains (a run at LR 1e-12 ends at these to 1e-19).
    sess = session.start(RunConfig(**kw), data=(x, y), loss=_tiny_loss)
    initial = build_engine(sess.config, sess.strategy, sess.source, sess.source.train_examples,
                           loss=sess.loss).model.trainable_variables
    runs = {}
    for name, dtype in (("float32", "float32"), ("float16", "float16")):
        with caplog.at_level("INFO", logger="tftoolkit"):
            s = tftoolkit.train(RunConfig(**kw, allreduce_dtype=dtype), tmp_path / name, quiet=False, data=(x, y),
                                loss=_tiny_loss)
        assert s["status"] == "ok"
        runs[name] = checkpoint_variables(tmp_path / name)
    # Keras 3 checkpoints each weight as the optimizer's _trainable_variables/<i>: the model's i-th trainable one.
    index = {n: int(n.split("_trainable_variables/")[1].split("/")[0]) for n in runs["float32"]
             if "_trainable_variables" in n}
    names = list(index)
    assert sorted(index.values()) == list(range(len(initial)))
    assert all(runs["float32"][n].shape == tuple(initial[i].shape) for n, i in index.items())
    moved = max(np.abs(runs["float32"][n] - initial[i].numpy()).max() for n, i in index.items())  # what 3 steps moved
    diff = max(np.abs(runs["float32"][n] - runs["float16"][n]).max() for n in names)
    assert moved > 1e-5 and diff <= 1e-2 * moved, (diff, moved)
    assert "--allreduce-dtype float16: dynamic loss scaling turned on" in caplog.text
