"""engine.collectives and the batch-norm layer built on it: the same sums and gradients as TensorFlow's and
Keras' own, with one all-reduce per layer."""

import numpy as np
import pytest
import tensorflow as tf

from tftoolkit.engine import collectives, devices, models


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
