"""A model's parameter count and forward FLOPs per example, counted on the Keras model itself (registered names
and keras.applications names, engine.models.build) with the toolkit's own counter (measure.flops.forward_flops).

Kept apart from the planner, which never imports TensorFlow: only the CLI and notebooks call this, and a forecast
given --params and --images-per-sec never needs it.
"""

from __future__ import annotations

import functools

from ..engine import models
from ..measure import flops


@functools.cache
def count(name: str, image_size: int = 224, num_classes: int = 1000) -> tuple[int, float, str]:
    """(parameters, forward FLOPs per example, how the FLOPs were counted) of model ``name``."""
    shape = (image_size, image_size, 3)
    model = models.build(name, shape, num_classes)
    forward, how = flops.forward_flops(model, shape)
    return int(model.count_params()), float(forward), how
