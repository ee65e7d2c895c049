"""engine/losses.py: one loss value per example, divided as Keras' own reduction divides."""

import numpy as np
import pytest

from tftoolkit.engine import losses
from tftoolkit.errors import ConfigError


def _model(out_shape):
    import keras

    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Reshape(out_shape)(keras.layers.Dense(int(np.prod(out_shape)))(inputs)))


def test_a_per_pixel_loss_is_averaged_over_the_pixels_as_keras_reduces_it():
    """sum over the batch of the per-example means / batch = Keras' sum_over_batch_size (mean over every pixel):
    so the global-batch division of engine/step.py gives model.fit's loss."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(6, 4, 5, 3)), tf.float32)
    masks = tf.constant(rng.integers(0, 3, (6, 4, 5)), tf.int32)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    task = losses.resolve(_model((4, 5, 3)), loss)
    per_example = task.per_example(masks, logits)
    assert per_example.shape == (6,)
    assert float(tf.reduce_sum(per_example)) / 6 == pytest.approx(float(loss(masks, logits)), rel=1e-6)
    # and the reduction the object was made with does not matter: it is called unreduced
    summed = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    np.testing.assert_allclose(losses.resolve(_model((4, 5, 3)), summed).per_example(masks, logits), per_example)


def test_the_default_is_classification_with_accuracy():
    task = losses.resolve(_model((10,)))
    assert task.classification and task.metrics == [] and task.loss_name == losses.DEFAULT_LOSS


def test_accuracy_follows_the_loss_as_keras_compile_reads_it():
    import keras

    assert isinstance(losses.resolve(_model((4,)), "binary_crossentropy", ["accuracy"]).metrics[0],
                      keras.metrics.BinaryAccuracy)
    assert isinstance(losses.resolve(_model((4,)), "sparse_categorical_crossentropy", ["accuracy"]).metrics[0],
                      keras.metrics.SparseCategoricalAccuracy)


def test_a_metric_is_named_as_asked():
    assert losses.resolve(_model((1,)), "mse", ["mae"]).metric_names == ["mae"]


def test_a_loss_per_output_must_name_the_outputs():
    import keras

    inputs = keras.Input((3,))
    model = keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(inputs), "b": keras.layers.Dense(1, name="b")(inputs)})
    with pytest.raises(ConfigError, match="loss for output\\(s\\) c, but the model's outputs are a, b"):
        losses.resolve(model, {"a": "mse", "c": "mse"})
    with pytest.raises(ConfigError, match="1 losses for 2 outputs"):
        losses.resolve(model, ["mse"])


def test_mse_on_class_labels_is_one_line_without_tensorflow_s_wrapping():
    model = _model((10,))
    task = losses.resolve(model, "mse")
    x, y = np.zeros((4, 3), np.float32), np.arange(4, dtype=np.int32)
    with pytest.raises(ConfigError) as e:
        losses.check(task, model, x, y)
    message = str(e.value)
    assert message.startswith("loss mse does not fit the model's outputs (4, 10) and the targets (4,): ")
    assert "Incompatible shapes" in message and "function_node" not in message and "[Op:" not in message, message
