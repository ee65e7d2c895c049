"""Models used by tests through --model module:function."""

import keras


def l2_cnn(input_shape, num_classes):
    """A conv net with L2 kernel regularisers: its model.losses must count once however many replicas."""
    reg = keras.regularizers.L2(0.05)
    i = keras.Input(input_shape)
    x = keras.layers.Conv2D(8, 3, activation="relu", kernel_regularizer=reg)(i)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(i, keras.layers.Dense(num_classes, kernel_regularizer=reg)(x))
