"""A model's parameter count, forward FLOPs per example and training memory, counted on the Keras model itself
(registered names and keras.applications names, engine.models.build) with the toolkit's own counters
(measure.flops.forward_flops; memory.estimate_memory, the batch finder's estimate).

Kept apart from the planner, which never imports TensorFlow: only the CLI and notebooks call this, and a forecast
given --params and --images-per-sec never needs it. This is the one place that imports TensorFlow to count, and it
does so quietly: TensorFlow's native start-up lines ("failed call to cuInit", "Could not find cuda drivers", oneDNN)
are written by its C++ logging to the process's stderr before Python can filter them, and TF_CPP_MIN_LOG_LEVEL does
not reach the ones logged before absl is initialised; a user planning a purchase on a laptop has no GPU to be told
about. ``quiet_native_stderr`` holds file descriptor 2 while counting and passes on every other line.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re

from ..engine import devices, models
from ..errors import ConfigError
from .memory import OPTIMIZER

# The largest input side a model is counted at: past what any published training row used (InceptionV3's 299, the
# detection models' 1024-1333) with room to spare, and far below the sizes where building the graph crashes the
# process (--image-size 100000 ended in a segmentation fault, exit 139, before this check).
MAX_IMAGE_SIZE = 4096
# TensorFlow's native log lines (absl / TF C++ logging: a severity letter, MMDD, a time) and absl's own preamble.
_NATIVE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before absl::InitializeLog)")


def check_image_size(image_size) -> int:
    """``image_size`` as a whole number of pixels in [1, MAX_IMAGE_SIZE], else a ConfigError naming --image-size."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or not 1 <= image_size <= MAX_IMAGE_SIZE:
        raise ConfigError(f"--image-size must be a whole number of pixels from 1 to {MAX_IMAGE_SIZE}, got "
                          f"{image_size!r}")
    return image_size


@contextlib.contextmanager
def quiet_native_stderr():
    """Every native TensorFlow log line held back while the block runs, every other line passed on
    (engine.devices.holding_stderr). TFTOOLKIT_DEBUG=1 holds nothing."""
    if os.environ.get("TFTOOLKIT_DEBUG"):
        yield
        return
    # TensorFlow 2.16 writes its start-up lines in the C++ format (a date, then "E external/..."), later ones in
    # absl's; either is held back.
    with devices.holding_stderr(lambda line: bool(_NATIVE.match(line)) or devices.startup_noise(line)):
        yield


@functools.cache
def _model(name: str, image_size: int, num_classes: int):
    check_image_size(image_size)
    # Not TF_CPP_MIN_LOG_LEVEL=3: it would not reach the lines logged before absl starts, and it would stay set for
    # the whole process, hiding the error lines of a training run in the same notebook.
    with quiet_native_stderr():
        devices.import_tensorflow()  # a count is often the process's first TensorFlow: its import frozen (devices.py)
        return models.build(name, (image_size, image_size, 3), num_classes)


@functools.cache
def count(name: str, image_size: int = 224, num_classes: int = 1000) -> tuple[int, float, str]:
    """(parameters, forward FLOPs per example, how the FLOPs were counted) of model ``name``."""
    from ..measure import flops

    model = _model(name, check_image_size(image_size), num_classes)
    with quiet_native_stderr():
        forward, how = flops.forward_flops(model, (image_size, image_size, 3))
    return int(model.count_params()), float(forward), how


@functools.cache
def memory(name: str, image_size: int = 224, precision: str = "float32", optimizer: str = OPTIMIZER,
           num_classes: int = 1000) -> dict:
    """Training memory of one replica (memory.estimate_memory, the batch finder's estimate): ``fixed`` bytes
    (weights, gradients, optimizer slots) and ``per_example`` bytes (activations kept for the backward pass)."""
    from .memory import estimate_memory

    est = estimate_memory(_model(name, check_image_size(image_size), num_classes), 1, optimizer, precision)
    return {"fixed": float(est["fixed"]), "per_example": float(est["per_example"]), "optimizer": optimizer,
            "about": models.describe(name),
            "how": "memory.estimate_memory: weights + gradients + optimizer slots, and 2 x every layer's output "
                   "per example in the precision's activation bytes; no framework workspace"}
