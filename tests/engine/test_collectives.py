"""engine.collectives and the batch-norm layer built on it: the same sums and gradients as TensorFlow's and
Keras' own, with one all-reduce per layer."""

import numpy as np
import pytest

from tftoolkit.engine import collectives, devices, models

from helpers import lazy

tf = lazy("tensorflow")  # collected without TensorFlow (tests/helpers.py)


@pytest.fixture(scope="module")
def two_replicas():
    setup = devices.init(2)
    return tf.distribute.MirroredStrategy(setup.devices[:2],
                                          cross_device_ops=tf.distribute.ReductionToOneDevice())


def _per_replica(strategy, arrays):
    return strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(arrays[ctx.replica_id_in_sync_group]))


@pytest.mark.parametrize("ours", [True, False], ids=["collectives.all_sum", "ReplicaContext.all_reduce"])
def test_all_sum_and_its_gradient(two_replicas, ours):
    # loss_r = sum(w_r * all_sum(x)) for each replica r: d(sum of losses)/dx_r = w_0 + w_1 on every replica.
    x = _per_replica(two_replicas, [np.array([1.0, 2.0]), np.array([10.0, 20.0])])
    w = _per_replica(two_replicas, [np.array([1.0, 3.0]), np.array([5.0, 7.0])])

    def replica(xr, wr):
        with tf.GradientTape() as tape:
            tape.watch(xr)
            if ours:
                total = collectives.all_sum(xr)
            else:
                total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, xr)
            loss = tf.reduce_sum(wr * total)
        return total, tape.gradient(loss, xr)

    total, grad = tf.function(lambda: two_replicas.run(replica, args=(x, w)))()
    for t, g in zip(two_replicas.experimental_local_results(total), two_replicas.experimental_local_results(grad)):
        np.testing.assert_array_equal(t.numpy(), [11.0, 22.0])
        np.testing.assert_array_equal(g.numpy(), [6.0, 10.0])


def test_all_sum_no_gradient_sums_lists_and_integers(two_replicas):
    a = _per_replica(two_replicas, [np.array([1.0]), np.array([2.0])])
    b = _per_replica(two_replicas, [np.array([[1.0, 2.0]]), np.array([[3.0, 4.0]])])
    n = _per_replica(two_replicas, [np.int32(3), np.int32(4)])  # a count, as the partial-batch divisor
    out = tf.function(lambda: two_replicas.run(lambda u, v: collectives.all_sum_no_gradient([u, v]), args=(a, b)))()
    assert [t.numpy().tolist() for t in two_replicas.experimental_local_results(out[0])] == [[3.0], [3.0]]
    assert [t.numpy().tolist() for t in two_replicas.experimental_local_results(out[1])] == [[[4.0, 6.0]]] * 2
    count = tf.function(lambda: two_replicas.run(collectives.all_sum_no_gradient, args=(n,)))()
    assert [int(t) for t in two_replicas.experimental_local_results(count)] == [7, 7]


def test_sync_batch_norm_equals_keras_synchronized_batch_norm_with_one_all_reduce(two_replicas, monkeypatch):
    rng = np.random.default_rng(0)
    images = [rng.normal(2.0, 3.0, (4, 5, 5, 3)).astype(np.float32) for _ in range(2)]
    x = _per_replica(two_replicas, images)
    with two_replicas.scope():
        ours = models._sync_bn_layer()(momentum=0.9)
        keras_bn = tf.keras.layers.BatchNormalization(synchronized=True, momentum=0.9)
        for layer in (ours, keras_bn):
            layer.build((None, 5, 5, 3))
            layer.gamma.assign([1.5, 0.5, 2.0])
    calls = []
    original = tf.distribute.ReplicaContext.all_reduce
    monkeypatch.setattr(tf.distribute.ReplicaContext, "all_reduce",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))

    def replica(layer, xr):
        with tf.GradientTape() as tape:
            tape.watch(xr)
            y = layer(xr, training=True)
            loss = tf.reduce_sum(tf.square(y) * tf.constant([1.0, 2.0, 3.0]))
        return y, tape.gradient(loss, [xr, layer.gamma, layer.beta])

    got = tf.function(lambda: two_replicas.run(replica, args=(ours, x)))()
    assert len(calls) == 4  # per replica: one in the forward pass, one for its gradient
    calls.clear()
    want = tf.function(lambda: two_replicas.run(replica, args=(keras_bn, x)))()
    assert len(calls) == 10  # Keras: sum, sum of squares and count forward; the two sums' gradients backward
    for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        for ra, rb in zip(two_replicas.experimental_local_results(a), two_replicas.experimental_local_results(b)):
            np.testing.assert_allclose(ra.numpy(), rb.numpy(), rtol=1e-5, atol=1e-5)
    # The statistics are the global batch's: both replicas normalise by the mean of all 8 images.
    np.testing.assert_allclose(ours.moving_mean.numpy(), 0.1 * np.concatenate(images).mean(axis=(0, 1, 2)), rtol=1e-5)


# --- the gradient exchange: dtype and packs ---------------------------------------------------------------
def test_packs_go_last_layer_first_in_runs_of_about_equal_bytes():
    from tftoolkit.engine.collectives import pack_plan

    sizes = [10, 1, 10, 1, 100, 1]  # conv kernel, bias, ..., the last dense kernel and bias
    assert pack_plan(sizes, 1) == [[5, 4, 3, 2, 1, 0]]
    plan = pack_plan(sizes, 3)
    assert plan == [[5, 4], [3], [2, 1, 0]]  # the last layer's 101 first: it is ready first in the backward pass
    assert sorted(i for p in plan for i in p) == list(range(6))
    assert pack_plan([5, 5, 5, 5], 4) == [[3], [2], [1], [0]]  # as many packs as tensors: one each
    assert pack_plan([100, 1, 1, 1], 2) == [[3, 2, 1], [0]]  # no empty pack, however the bytes fall


@pytest.mark.parametrize("packs", [0, 7])
def test_more_packs_than_gradient_tensors_or_none_is_refused(packs):
    from tftoolkit.engine.collectives import pack_plan
    from tftoolkit.errors import ConfigError

    with pytest.raises(ConfigError, match="at most 6 packs"):
        pack_plan([1] * 6, packs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_all_reduce_sums_the_rounded_gradients_and_returns_float32(two_replicas, dtype):
    # Replica values that 16 bits cannot hold exactly: the result is the 16-bit sum of the 16-bit roundings, back in
    # float32, in every pack; the extra vector rides along uncast (float64).
    from tftoolkit.engine.collectives import all_reduce_gradients

    rng = np.random.default_rng(0)
    a = [rng.normal(size=s).astype("float32") for s in [(3, 4), (4,), (5,)]]
    b = [rng.normal(size=s).astype("float32") for s in [(3, 4), (4,), (5,)]]
    extra = [np.array([1e-12, 1.0]), np.array([2e-12, 3.0])]
    ga = [_per_replica(two_replicas, [x, y]) for x, y in zip(a, b)]
    ex = _per_replica(two_replicas, extra)

    def replica(g0, g1, g2, e):
        return all_reduce_gradients([g0, g1, g2], dtype, plan=[[2], [1, 0]], extra=e)

    grads, summed_extra = tf.function(lambda: two_replicas.run(replica, args=(*ga, ex)))()
    for got, x, y in zip(grads, a, b):
        want = (tf.cast(tf.cast(x, dtype) + tf.cast(y, dtype), tf.float32)).numpy()
        for value in two_replicas.experimental_local_results(got):
            assert value.dtype == tf.float32
            np.testing.assert_array_equal(value.numpy(), want)
            assert not np.array_equal(value.numpy(), x + y)  # rounded: the cast happened
    np.testing.assert_array_equal(two_replicas.experimental_local_results(summed_extra)[0].numpy(), [3e-12, 4.0])


def test_only_a_16_bit_exchange_casts_and_nothing_narrower_is_widened():
    # float32 means "as they are": float64 gradients (the equivalence tests' float64 runs) are not rounded to float32.
    import keras

    from tftoolkit.engine.collectives import gradient_bytes, travels_as

    assert travels_as("float64", "float32") == tf.float64 and travels_as("float32", "float32") == tf.float32
    assert travels_as("float64", "bfloat16") == tf.bfloat16 and travels_as("float32", "float16") == tf.float16
    assert travels_as("float16", "bfloat16") == tf.float16  # already 16 bits: no cast between the two
    v64, v32 = keras.Variable(np.zeros((3, 2)), dtype="float64"), keras.Variable(np.zeros(5), dtype="float32")
    assert gradient_bytes([v64, v32]) == 6 * 8 + 5 * 4 and gradient_bytes([v64, v32], "bfloat16") == 11 * 2
