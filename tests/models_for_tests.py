"""Models tests train through --model models_for_tests:NAME (tests/ is on the path; subprocesses get it through
helpers.env_with_tests_on_path)."""

import keras


def l2_cnn(input_shape, num_classes):
    """A conv net with L2 kernel regularisers: its model.losses must count once however many replicas."""
    reg = keras.regularizers.L2(0.05)
    i = keras.Input(input_shape)
    x = keras.layers.Conv2D(8, 3, activation="relu", kernel_regularizer=reg)(i)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(i, keras.layers.Dense(num_classes, kernel_regularizer=reg)(x))


def zero_linear(input_shape, num_classes):
    """A linear softmax classifier starting at zero: its loss, gradients and stable LR range have closed forms."""
    i = keras.Input(input_shape)
    x = keras.layers.Flatten()(i)
    return keras.Model(i, keras.layers.Dense(num_classes, kernel_initializer="zeros")(x))


def dense_net(input_shape, num_classes):
    """One hidden dense layer: memory grows with the batch in a way the finder's estimate follows."""
    i = keras.Input(input_shape)
    x = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(i))
    return keras.Model(i, keras.layers.Dense(num_classes)(x))


def tiny_conv_bn(input_shape, num_classes):
    """One convolution and one synchronized batch norm: the smallest model with both parts an empty replica breaks
    (a zero-size Conv2D; statistics summed across replicas), fast to trace at 8 replicas."""
    from tftoolkit.engine import models

    i = keras.Input(input_shape)
    x = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(i)
    x = keras.layers.ReLU()(models._sync_bn_layer()(momentum=0.9)(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(i, keras.layers.Dense(num_classes)(x))


def broken(input_shape, num_classes):
    """A builder that exists but fails while the run is set up (after its config is recorded)."""
    raise RuntimeError("a builder that fails")
