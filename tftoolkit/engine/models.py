"""Model registry: a name (``small_cnn``, ``resnet20``, keras.applications names) or ``package.module:function``.

Every builder takes ``(input_shape, num_classes)`` and returns an uncompiled Keras model whose output is
float32 logits (so mixed precision never computes the loss in half precision).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from typing import Callable

from ..errors import ModelError
from .applications import APPLICATIONS, HEADLESS, application, build_application, describe  # noqa: F401
from .collectives import all_sum

_REGISTRY: dict[str, Callable] = {}


def register(name: str):
    def deco(fn):
        _REGISTRY[name] = fn
        return fn

    return deco


def names() -> list[str]:
    return sorted(list(_REGISTRY) + list(APPLICATIONS) + [n + HEADLESS for n in APPLICATIONS])


_LAYERS: dict = {}

# Per-example weights of the batch being traced (1 for an example, 0 for the padding an empty replica computes on,
# engine.feed.pad_empty), read by layers whose statistics span the replicas (SyncBatchNorm): set while the step
# calls the model and read while tracing. Per thread: MirroredStrategy traces each replica's function in a thread
# of its own, concurrently, so a shared stack would hand one replica another's weights.
_LOCAL = threading.local()


def _weights_stack() -> list:
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack


class example_weights:  # noqa: N801 - a context manager
    """``with example_weights(w): model(images)``: batch statistics across replicas count example i with w[i]."""

    def __init__(self, weights):
        self.weights = weights

    def __enter__(self):
        _weights_stack().append(self.weights)
        return self.weights

    def __exit__(self, *exc):
        _weights_stack().pop()


def current_example_weights():
    """The weights of the innermost ``example_weights`` on this thread, or None."""
    stack = _weights_stack()
    return stack[-1] if stack else None


def _standardize_layer():
    """The Standardize layer class (defined on first use: importing this module must not import Keras)."""
    if "Standardize" in _LAYERS:
        return _LAYERS["Standardize"]
    import keras  # deferred: the model registry imports without Keras
    from keras import ops  # deferred: the model registry imports without Keras

    @keras.saving.register_keras_serializable("tftoolkit")
    class Standardize(keras.layers.Layer):
        """(x - mean) / std over each image's own pixels: per example, so N replicas still equal one device.

        Images arrive as [0, 1] floats with any brightness and colour; centred and scaled, a plain conv net
        without normalisation layers trains in a fraction of the steps (shapes16k: 0.14 -> 0.55 validation
        accuracy after 200 steps of momentum SGD, the same network without and with it).
        """

        def call(self, x):
            mean = ops.mean(x, axis=(1, 2, 3), keepdims=True)
            var = ops.var(x, axis=(1, 2, 3), keepdims=True)
            return (x - mean) * ops.rsqrt(var + 1e-5)

    _LAYERS["Standardize"] = Standardize
    return Standardize


@register("small_vgg")
def small_vgg(input_shape, num_classes):
    """The default: per-image standardisation, two 3x3 convs at full and half resolution, one at a quarter.

    conv24-conv24-pool-conv48-conv48-pool-conv96, global average pooling, dense 96: 0.1 M parameters. The two
    convolutions before the first pooling are what tell a corner from a curve at 32 px (with one, square and
    circle, frame and ring stay confused). No batch norm: N replicas compute exactly what one device computes.
    Any image size of at least 4 x 4 and any number of channels.
    """
    import keras  # deferred: the model registry imports without Keras
    from keras import layers  # deferred: the model registry imports without Keras

    inputs = keras.Input(shape=input_shape)
    x = _standardize_layer()()(inputs)
    for i, filters in enumerate(((24, 24), (48, 48), (96,))):
        for f in filters:
            x = layers.Conv2D(f, 3, padding="same", activation="relu")(x)
        if i < 2:
            x = layers.MaxPooling2D()(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(96, activation="relu")(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="small_vgg")


def _sync_bn_layer():
    """The SyncBatchNorm layer class (defined on first use, as Standardize)."""
    if "SyncBatchNorm" in _LAYERS:
        return _LAYERS["SyncBatchNorm"]
    import keras  # deferred: the model registry imports without Keras
    import tensorflow as tf  # deferred: the model registry imports without Keras

    @keras.saving.register_keras_serializable("tftoolkit")
    class SyncBatchNorm(keras.layers.BatchNormalization):
        """Keras' ``BatchNormalization(synchronized=True)`` with one all-reduce per layer instead of three.

        Keras all-reduces the sum, the sum of squares and the count one by one, each through
        ``ReplicaContext.all_reduce``, whose tracing cost grows with the depth of the network (collectives.py).
        Here the three go in one tensor through one ``collectives.all_sum`` (a single tensor, so no batching of
        collectives whose launch order could differ between replicas). The arithmetic is Keras': var = E[x^2] -
        E[x]^2 of the all-reduced sums.
        """

        def __init__(self, **kwargs):
            kwargs["synchronized"] = True
            super().__init__(**kwargs)

        def _moments(self, inputs, mask):
            ctx = tf.distribute.get_replica_context()
            if mask is not None or ctx is None:
                return super()._moments(inputs, mask)
            axes = list(self._reduction_axes)
            x = inputs  # BatchNormalization.call has cast float16 inputs up to float32 already
            count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
            x_sum, x_squares = tf.reduce_sum(x, axes), tf.reduce_sum(tf.square(x), axes)
            weights = current_example_weights()
            if weights is not None and axes and axes[0] == 0:
                # A replica with no example of a short batch computes on one padding example of weight 0: it
                # must add nothing to the sums and the count. Only then (a cond): an ordinary batch's arithmetic
                # stays exactly Keras'.
                w = tf.cast(weights, x.dtype)
                padded = tf.reduce_min(w) < 1

                def weighted():
                    wb = tf.reshape(w, [-1] + [1] * (len(x.shape) - 1))
                    per_example = count / tf.cast(tf.shape(x)[0], x.dtype)
                    return (tf.reduce_sum(x * wb, axes), tf.reduce_sum(tf.square(x) * wb, axes),
                            tf.reduce_sum(w) * per_example)

                x_sum, x_squares, count = tf.cond(padded, weighted, lambda: (x_sum, x_squares, count))
            local = tf.concat([tf.reshape(x_sum, [-1]), tf.reshape(x_squares, [-1]), [count]], 0)
            channels = self.moving_mean.shape.num_elements()
            total_sum, total_squares, total_count = tf.split(all_sum(local), [channels, channels, 1])
            shape = self.moving_mean.shape
            mean = tf.math.divide_no_nan(tf.reshape(total_sum, shape), total_count[0])
            squared_mean = tf.math.divide_no_nan(tf.reshape(total_squares, shape), total_count[0])
            return mean, tf.maximum(squared_mean - tf.square(mean), 0.0)

    _LAYERS["SyncBatchNorm"] = SyncBatchNorm
    return SyncBatchNorm


@register("small_cnn_bn")
def small_cnn_bn(input_shape, num_classes):
    """small_cnn with synchronized batch norm and per-image standardisation: the batch-size study's model.

    Momentum SGD trains it at 8x the learning rate small_cnn stands (shapes16k: 0.99 validation accuracy after
    2 epochs at batch 256 and LR 0.1, where small_cnn stays at chance above LR 0.02), which is what lets linear
    LR scaling hold over a range of batches (Goyal et al. 2017 on ResNet-50). Synchronized: every replica
    normalises by the statistics of the whole global batch, so N replicas compute what one device computes (up
    to float32 rounding in the variance, as resnet20). Moving-average momentum 0.9, not Keras' 0.99, so the
    statistics used at evaluation settle within a run of a few hundred steps.
    """
    import keras  # deferred: the model registry imports without Keras
    from keras import layers  # deferred: the model registry imports without Keras

    inputs = keras.Input(shape=input_shape)
    x = _standardize_layer()()(inputs)
    for i, filters in enumerate((32, 64, 64)):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = layers.ReLU()(_sync_bn_layer()(momentum=0.9)(x))
        if i < 2:
            x = layers.MaxPooling2D()(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(64, activation="relu")(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="small_cnn_bn")


@register("small_cnn")
def small_cnn(input_shape, num_classes):
    """Three 3x3 conv layers and a dense head: fast on CPU, learns shapes16k in a few epochs.

    No batch normalisation or dropout: its N-replica result is exactly the 1-device result, which the
    invariant tests rely on.
    """
    import keras  # deferred: the model registry imports without Keras
    from keras import layers  # deferred: the model registry imports without Keras

    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(64, activation="relu")(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


@register("resnet20")
def resnet20(input_shape, num_classes):
    """CIFAR-style ResNet-20 (He et al. 2016, section 4.2): 3 stages x 3 basic blocks, 16/32/64 filters.

    Batch norm is synchronized across replicas: with per-replica statistics a replica normalises by its
    own slice of the batch, and N replicas would no longer compute what one device does on the same
    global batch. The price is one small all-reduce per BN layer per step.
    """
    import keras  # deferred: the model registry imports without Keras
    from keras import layers  # deferred: the model registry imports without Keras

    def bn():
        return _sync_bn_layer()()

    def block(x, filters, stride):
        shortcut = x
        y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        y = layers.ReLU()(bn()(y))
        y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
        y = bn()(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
            shortcut = bn()(shortcut)
        return layers.ReLU()(layers.Add()([y, shortcut]))

    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(bn()(x))
    for stage, filters in enumerate((16, 32, 64)):
        for i in range(3):
            x = block(x, filters, 2 if (stage > 0 and i == 0) else 1)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="resnet20")


def qualified_name(fn: Callable) -> str:
    """How a model callable is recorded in a config (``module.qualname``; ``__main__.f`` for a notebook cell's)."""
    return f"{getattr(fn, '__module__', None) or '<unknown>'}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def build(name, input_shape, num_classes: int, classifier: bool = True):
    """Build model ``name`` for this dataset; call inside ``strategy.scope()``.

    ``name``: a registered name, a keras.applications name, ``package.module:function``, or a Python callable
    ``fn(input_shape, num_classes) -> keras.Model`` (a model written in a notebook cell, say). ``classifier``: check
    it gives (batch, num_classes) logits, as the default task needs (``check_classifier``); another task's loss is
    checked against the outputs on real examples instead (engine/losses.py).
    """
    import keras  # deferred: the model registry imports without Keras

    label = qualified_name(name) if callable(name) else name
    if callable(name):
        model = _call(name, label, input_shape, num_classes)
    elif name in _REGISTRY:
        model = _REGISTRY[name](tuple(input_shape), num_classes)
    elif application(name):
        model = build_application(name, input_shape, num_classes)
    else:
        model = _call(resolve(name), name, input_shape, num_classes)
    if not isinstance(model, keras.Model):
        raise ModelError(f"model {label!r} returned {type(model).__name__}, not a keras.Model")
    if classifier:
        check_classifier(model, label, num_classes)
    return model


def check_classifier(model, label: str, num_classes: int) -> None:
    """The default task's model: (batch, num_classes) logits, and no final softmax (warned about)."""
    out = model.output_shape
    if not (isinstance(out, tuple) and out[-1] == num_classes):
        raise ModelError(f"model {label!r} outputs shape {out}; expected (batch, {num_classes}) logits")
    if ends_in_softmax(model):
        logging.getLogger("tftoolkit").warning(
            "model %r ends in a softmax, but the loss takes logits (SparseCategoricalCrossentropy(from_logits=True)): "
            "it would train on the log of probabilities, slowly and wrongly scaled; remove the final softmax "
            "(Dense(num_classes) with no activation)", label)


def ends_in_softmax(model) -> bool:
    """Whether the layer producing the model's output is a softmax (an activation or a Softmax layer)."""
    import keras  # deferred: the model registry imports without Keras

    layer = model.layers[-1] if getattr(model, "layers", None) else None
    if layer is None:
        return False
    if isinstance(layer, keras.layers.Softmax):
        return True
    activation = getattr(layer, "activation", None)
    return activation is not None and getattr(activation, "__name__", "") == "softmax"


def _shape(input_shape):
    """A per-example input shape as builders get it: a tuple, or for several inputs a dict / tuple of tuples."""
    if isinstance(input_shape, dict):
        return {k: _shape(v) for k, v in input_shape.items()}
    if isinstance(input_shape, (list, tuple)) and input_shape and isinstance(input_shape[0], (list, tuple, dict)):
        return tuple(_shape(v) for v in input_shape)
    return tuple(input_shape)


def _call(fn, label: str, input_shape, num_classes):
    shape = _shape(input_shape)
    try:
        return fn(shape, num_classes)
    except Exception as e:  # noqa: BLE001 - the user's function: its error, in one line
        raise ModelError(f"{label}(input_shape={shape}, num_classes={num_classes}) failed: "
                         f"{type(e).__name__}: {e}") from None


def resolve(name) -> Callable | None:
    """Check that model ``name`` exists before anything is read or set up: a registered or keras.applications
    name, or a callable (None: built by name); ``package.module:function`` is imported and its function returned.

    The import looks in the working folder first, as ``python -m`` would: the ``tftoolkit`` console script's own
    folder is what Python puts on the path, so a user's ``mypackage/`` beside their data would not be found."""
    if callable(name) or name in _REGISTRY or application(name):
        return None
    if ":" not in name:
        raise ModelError(f"unknown model {name!r}; use one of {', '.join(names())} or package.module:function")
    module_name, _, fn_name = name.partition(":")
    cwd = os.getcwd()
    if not any(os.path.abspath(p or ".") == cwd for p in sys.path):
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module, reported in one line
        raise ModelError(f"cannot import {module_name!r} for --model {name}: {type(e).__name__}: {e} (looked in "
                         f"the working folder {cwd} and the installed packages)") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ModelError(f"{module_name} has no function {fn_name!r} (from --model {name})")
    return fn
