"""Five tasks that are not image classification, through ``tftoolkit.train``: each a few lines of data, a Keras model
builder and a loss (tests/training/test_tasks.py trains each on 1 and 2 replicas and checks they agree and learn).

    import tftoolkit
    from examples import tasks

    data, model, loss, metrics = tasks.regression()
    tftoolkit.train({"replicas": 2, "global_batch": 64, "epochs": 8}, "runs/regression",
                    data=data, model=model, loss=loss, metrics=metrics)

Data are made here from a seed, small enough to learn in seconds on a laptop's CPU.
"""

from __future__ import annotations

import numpy as np

N, VAL = 1024, 256  # training and validation examples


def _split(x, y):
    """(x, y, x_val, y_val): the last VAL examples held out; x and y may be dicts of arrays."""
    def cut(a, part):
        return {k: cut(v, part) for k, v in a.items()} if isinstance(a, dict) else (a[:N] if part == 0 else a[N:])

    return cut(x, 0), cut(y, 0), cut(x, 1), cut(y, 1)


def regression(seed: int = 0):
    """Tabular floats -> one float target: mean squared error, mean absolute error reported."""
    import keras

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N + VAL, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) + 0.1 * rng.normal(size=N + VAL)).astype(np.float32)

    def model(input_shape, num_classes):
        inputs = keras.Input(input_shape)
        return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(32, activation="relu")(inputs)))

    return _split(x, y), model, "mse", ["mae"]


def segmentation(seed: int = 0, size: int = 16):
    """uint8 images -> a class per pixel (a bright square on noise): sparse cross-entropy per pixel, averaged over
    the pixels as Keras' own reduction does."""
    import keras

    rng = np.random.default_rng(seed)
    images = rng.integers(0, 100, (N + VAL, size, size, 1)).astype(np.uint8)
    masks = np.zeros((N + VAL, size, size), np.int32)
    for i, (r, c) in enumerate(rng.integers(0, size - 6, (N + VAL, 2))):
        images[i, r:r + 6, c:c + 6] += 120
        masks[i, r:r + 6, c:c + 6] = 1

    def model(input_shape, num_classes):
        inputs = keras.Input(input_shape)
        h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Conv2D(num_classes, 1)(h))  # per-pixel logits

    return (_split(images, masks), model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            ["accuracy"])


def multi_label(seed: int = 0, labels: int = 5):
    """Tabular floats -> several independent yes/no labels (multi-hot): binary cross-entropy on logits."""
    import keras

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N + VAL, 16)).astype(np.float32)
    y = (x @ rng.normal(size=(16, labels)) > 0).astype(np.float32)

    def model(input_shape, num_classes):
        inputs = keras.Input(input_shape)
        return keras.Model(inputs, keras.layers.Dense(labels)(keras.layers.Dense(32, activation="relu")(inputs)))

    return _split(x, y), model, keras.losses.BinaryCrossentropy(from_logits=True), [
        keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")]  # threshold 0: on logits


def two_inputs(seed: int = 0):
    """Two inputs (a dict) and two outputs, each with its own loss: a class and a value."""
    import keras

    rng = np.random.default_rng(seed)
    a = rng.normal(size=(N + VAL, 8)).astype(np.float32)
    b = rng.normal(size=(N + VAL, 4)).astype(np.float32)
    y = {"kind": (a[:, 0] + b[:, 0] > 0).astype(np.int32), "value": (a[:, 1] - 2 * b[:, 1]).astype(np.float32)}

    def model(input_shape, num_classes):
        ia, ib = keras.Input(input_shape["a"], name="a"), keras.Input(input_shape["b"], name="b")
        h = keras.layers.Dense(32, activation="relu")(keras.layers.Concatenate()([ia, ib]))
        return keras.Model({"a": ia, "b": ib}, {"kind": keras.layers.Dense(2, activation="softmax", name="kind")(h),
                                                 "value": keras.layers.Dense(1, name="value")(h)})

    return _split({"a": a, "b": b}, y), model, {"kind": "sparse_categorical_crossentropy", "value": "mse"}, {
        "kind": ["accuracy"]}


def text_classifier(seed: int = 0, length: int = 20, vocabulary: int = 50):
    """Token ids -> a class (does token 7 occur?): the default classification loss on a non-image input."""
    import keras

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocabulary, (N + VAL, length)).astype(np.int32)
    tokens[rng.random(N + VAL) < 0.5, rng.integers(0, length)] = 7
    labels = (tokens == 7).any(axis=1).astype(np.int32)

    def model(input_shape, num_classes):
        inputs = keras.Input(input_shape, dtype="int32")
        h = keras.layers.GlobalMaxPooling1D()(keras.layers.Embedding(vocabulary, 16)(inputs))
        return keras.Model(inputs, keras.layers.Dense(num_classes)(h))  # logits, as the default loss takes

    return _split(tokens, labels), model, None, None


ALL = {"regression": regression, "segmentation": segmentation, "multi_label": multi_label, "two_inputs": two_inputs,
       "text_classifier": text_classifier}
