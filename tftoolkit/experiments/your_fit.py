"""Notebook 06's stand-ins for a user's own code: in-memory data, a small Keras model, the strategy.

Notebook 06 shows what a user's training script already has (a MirroredStrategy, a compiled Keras model, its own
``model.fit``) plus the one line it adds, ``callbacks=[tftoolkit.RunRecorder(out_dir)]``. The data and the model
a user would bring are made here, so the notebook stays a list of calls; swap them for your own.
"""

from __future__ import annotations

import numpy as np

from ..data import shapes

NUM_CLASSES = len(shapes.CLASS_NAMES)
SMOKE = {"train_images": 512, "val_images": 64, "image_size": 16, "epochs": 2, "warmup_steps": 2}


def settings(smoke: bool, **params) -> dict:
    """The notebook's parameters, with ``SMOKE`` applied when ``smoke`` (a < 30 s check on 2 CPU cores)."""
    return {**params, **(SMOKE if smoke else {})}


def example_data(train_images: int, val_images: int, image_size: int, seed: int = 0):
    """((x, y), (x_val, y_val)): shapes16k's ten classes of shapes rendered in memory (data.shapes), as float32
    images in [0, 1] and integer labels, the arrays a user's script would load."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (train_images, val_images):
        labels = rng.integers(0, NUM_CLASSES, n)
        out.append((shapes.render(labels, image_size, rng).astype(np.float32) / 255.0, labels))
    return tuple(out)


def example_model(image_size: int, num_classes: int = NUM_CLASSES):
    """An uncompiled Keras classifier emitting logits: the model registry's small_cnn (engine.models)."""
    # Deferred (here and in mirrored): the engine is TensorFlow's side, which the notebook starts with init_devices.
    from ..engine import models

    return models.small_cnn((image_size, image_size, 3), num_classes)


def mirrored(setup):
    """A MirroredStrategy over the devices ``tftoolkit.init_devices`` set up: in a script on GPUs it is
    ``tf.distribute.MirroredStrategy()``; simulated CPU replicas need their device names (engine.strategy)."""
    from ..engine.strategy import make_strategy

    strategy, _ = make_strategy(setup)
    return strategy
