"""tftoolkit.train with what a notebook has at hand: a model written in a cell, the user's own tf.data pipeline."""

import json

import numpy as np
import pytest

import tftoolkit
from tftoolkit.config import RunConfig
from tftoolkit.errors import DataError, ModelError

from helpers import checkpoint_variables

CFG = dict(per_replica_batch=16, steps=6, steps_per_loop=3, optimizer="momentum", base_lr=0.05, lr_rule="none",
           warmup_epochs=0.0, schedule="constant", num_classes=4, measure=False, timing_warmup_steps=0)


def cell_model(input_shape, num_classes):
    """What a researcher writes in the cell above."""
    import keras

    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def _dataset(n=192, size=8, seed=0):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, size, size, 3)).astype(np.float32)
    y = (x[:, :4, :4, 0].mean((1, 2)) * 4).astype(np.int64).clip(0, 3)  # a learnable label
    return tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 1.0, b))  # a user's pipeline


def test_a_callable_model_and_a_tf_data_dataset_train_and_are_recorded(tmp_path):
    s = tftoolkit.train(RunConfig(replicas=1, **CFG), tmp_path / "run", quiet=True, model=cell_model,
                        data=(_dataset(), _dataset(64, seed=1)))
    assert s["status"] == "ok" and s["steps"] == 6 and s["train_examples"] == 192 and s["dataset"] == "dataset"
    name = f"{__name__}.cell_model"
    assert s["model"] == name
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["model"] == name
    assert s["val_accuracy"] == s["val_accuracy"]  # the validation dataset was evaluated
    again = tftoolkit.train(RunConfig(replicas=1, **CFG), tmp_path / "run", quiet=True, model=cell_model,
                            data=(_dataset(), _dataset(64, seed=1)))
    assert again["wall_time_s"] == s["wall_time_s"]  # the same callable and config: the finished run, not a new one


def test_n_replicas_equal_one_device_on_a_callable_model_and_a_dataset(tmp_path):
    ends = []
    for replicas in (1, 2):
        tftoolkit.train(RunConfig(replicas=replicas, global_batch=32, **{k: v for k, v in CFG.items()
                                                                          if k != "per_replica_batch"}),
                        tmp_path / f"r{replicas}", quiet=True, model=cell_model, data=_dataset())
        ends.append(checkpoint_variables(tmp_path / f"r{replicas}"))
    a, b = ends
    weights = [n for n in a if "_trainable_variables" in n]
    assert weights and max(np.abs(a[n]).max() for n in weights) > 0
    scale = max(np.abs(a[n]).max() for n in weights)
    for n in weights:
        np.testing.assert_allclose(b[n], a[n], rtol=0, atol=1e-5 * scale, err_msg=n)


def _raises(input_shape, num_classes):
    raise RuntimeError("my cell has a bug")


def _not_a_model(input_shape, num_classes):
    return "a string"


def _wrong_outputs(input_shape, num_classes):
    import keras

    i = keras.Input(input_shape)
    return keras.Model(i, keras.layers.Dense(num_classes + 1)(keras.layers.Flatten()(i)))


@pytest.mark.parametrize("fn, message", [
    (_raises, "_raises(input_shape=(8, 8, 3), num_classes=4) failed: RuntimeError: my cell has a bug"),
    (_not_a_model, "returned str, not a keras.Model"),
    (_wrong_outputs, "outputs shape (None, 5); expected (batch, 4) logits"),
    ("small_cnn", "model= takes a callable"),
])
def test_bad_model_callables_are_one_toolkit_error(tmp_path, fn, message):
    from tftoolkit.errors import ConfigError

    with pytest.raises((ModelError, ConfigError), match=message.replace("(", r"\(").replace(")", r"\)")):
        tftoolkit.train(RunConfig(replicas=1, **CFG), tmp_path / "run", quiet=True, model=fn, data=_dataset())


def _bad_datasets():
    import tensorflow as tf

    x = np.zeros((8, 8, 8, 3), np.float32)
    y = np.zeros(8, np.int64)
    mixed = tf.data.Dataset.from_generator(lambda: ((np.zeros((s, s, 3), np.float32), 0) for s in (8, 8, 6)),
                                           output_signature=(tf.TensorSpec((None, None, 3)), tf.TensorSpec((), tf.int64)))
    return [
        (tf.data.Dataset.from_tensor_slices((x, y)).batch(4), "looks batched .* ds.unbatch()"),
        (tf.data.Dataset.from_tensor_slices(x), "a tf.data.Dataset of \\(inputs, targets\\) pairs is needed \\(\\(image, label\\) pairs"),
        # float targets could be another task's (a regression): refused for the default classification loss only,
        # once the model says it is not compiled with another one
        (tf.data.Dataset.from_tensor_slices((np.zeros((32, 8, 8, 3), np.float32), np.zeros(32, np.float32))),
         "labels must be integers"),
        (mixed, "images of different shapes \\(\\(6, 6, 3\\) and \\(8, 8, 3\\)"),
        (tf.data.Dataset.from_tensor_slices((x, y + 7)), "label out of range: labels span \\[7, 7\\] but there are 4"),
    ]


def test_bad_datasets_are_one_data_error_saying_what_to_do(tmp_path):
    for ds, message in _bad_datasets():
        with pytest.raises(DataError, match=message):
            tftoolkit.train(RunConfig(replicas=1, **CFG), tmp_path / "run", quiet=True, data=ds)


def test_greyscale_images_of_any_size_with_the_default_model(tmp_path):
    import tensorflow as tf

    x = np.random.default_rng(0).uniform(0, 255, (64, 20, 28)).astype(np.uint8)  # (height, width): no channels
    y = np.arange(64) % 4
    s = tftoolkit.train(RunConfig(replicas=1, per_replica_batch=16, steps=2, num_classes=4, measure=False),
                        tmp_path / "grey", quiet=True, data=tf.data.Dataset.from_tensor_slices((x, y)))
    assert s["status"] == "ok" and s["model"] == RunConfig().model


def _three_classes(n=96, size=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8), rng.integers(0, 3, n)


@pytest.mark.parametrize("kind", ["arrays", "dataset"])
@pytest.mark.slow
def test_the_class_count_is_taken_from_the_data_and_recorded(tmp_path, kind):
    # 3 classes, nothing said about it: 3 logits (starting loss ~ ln 3, not ln 10), and config.json says 3.
    import tensorflow as tf

    x, y = _three_classes()
    data = (x, y) if kind == "arrays" else tf.data.Dataset.from_tensor_slices((x, y))
    cfg = {k: v for k, v in CFG.items() if k != "num_classes"}
    s = tftoolkit.train(RunConfig(replicas=1, **{**cfg, "steps": 2, "base_lr": 1e-6}), tmp_path / kind, quiet=True,
                        model=cell_model, data=data)
    assert s["num_classes"] == 3 and abs(s["initial_loss"] - np.log(3)) < 0.3
    assert json.loads((tmp_path / kind / "config.json").read_text())["config"]["num_classes"] == 3
    # Said, and contradicted by the labels: refused, before anything trains.
    with pytest.raises(DataError, match=r"label out of range: labels span \[0, 2\] but there are 2 classes"):
        tftoolkit.train(RunConfig(replicas=1, **{**cfg, "num_classes": 2}), tmp_path / "bad", quiet=True,
                        model=cell_model, data=data)


def test_a_validation_split_of_another_shape_is_refused_before_training(tmp_path):
    x, y = _three_classes(size=8)
    vx, vy = _three_classes(n=32, size=12)
    with pytest.raises(DataError, match=r"validation images must have the training images' shape \(N, 8, 8, 3\)"):
        tftoolkit.train(RunConfig(replicas=1, **CFG), tmp_path / "r", quiet=True, data=(x, y, vx, vy))
    assert not (tmp_path / "r" / "summary.json").exists()
    import tensorflow as tf

    with pytest.raises(DataError, match=r"validation data: images of shape \(12, 12, 3\), but the training images"):
        tftoolkit.train(RunConfig(replicas=1, **CFG), tmp_path / "d", quiet=True,
                        data=(tf.data.Dataset.from_tensor_slices((x, y)), tf.data.Dataset.from_tensor_slices((vx, vy))))


@pytest.mark.slow
def test_a_model_ending_in_softmax_is_warned_about(tmp_path, caplog):
    import keras

    def probabilities(input_shape, num_classes):
        i = keras.Input(input_shape)
        return keras.Model(i, keras.layers.Dense(num_classes, activation="softmax")(keras.layers.Flatten()(i)))

    with caplog.at_level("WARNING", logger="tftoolkit"):
        tftoolkit.train(RunConfig(replicas=1, **{**CFG, "steps": 1}), tmp_path / "r", quiet=True, model=probabilities,
                        data=_dataset(64))
    assert "ends in a softmax, but the loss takes logits" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tftoolkit"):
        tftoolkit.train(RunConfig(replicas=1, **{**CFG, "steps": 1}), tmp_path / "ok", quiet=True, model=cell_model,
                        data=_dataset(64))
    assert "softmax" not in caplog.text
