"""tftoolkit: measure and tune multi-GPU data-parallel training with TensorFlow.

Importing the package does not import TensorFlow (the monitor, the report and the plots work without
it); TensorFlow is imported by the functions that train, and by ``tftoolkit.RunRecorder`` (the callback that
records a model.fit of your own into a run directory). Replicas are simulated on CPU where there is
no GPU: call ``init_devices(N)`` first in a notebook that will use up to N simulated replicas.
"""

import os

# TensorFlow's C++ info logs drown the toolkit's own lines; users can still override this.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import warnings  # noqa: E402

# tf.data warns that options are "not known at graph construction time" whenever a distributed dataset
# reads them; it is about serialisation, not about this toolkit's pipelines (options are set eagerly).
warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
# Keras 3.13 (the oldest supported, constraints/oldest.txt) probes `np.object` on import, which NumPy 1.26 answers with
# a FutureWarning on every command: a line about Keras' own code that a user cannot act on.
warnings.filterwarnings("ignore", message="In the future `np.object` will be defined", category=FutureWarning,
                        module=r"keras\.")

from .config import RunConfig  # noqa: E402
from .errors import ConfigError, DataError, DeviceError, ModelError, RunDirError, ToolkitError  # noqa: E402

# tftoolkit.training holds no TensorFlow import at module level, so this stays cheap.
from .training import train  # noqa: E402

__version__ = "0.1.0"

__all__ = ["RunConfig", "train", "RunRecorder", "init_devices", "ToolkitError", "ConfigError", "DataError",
           "DeviceError", "ModelError", "RunDirError"]


def __getattr__(name):
    # RunRecorder is a Keras callback, so its module imports Keras (and TensorFlow): only when it is asked for.
    if name == "RunRecorder":
        from .engine.devices import import_tensorflow

        import_tensorflow()  # its start-up lines held and its objects frozen, as in every toolkit path
        from .training.recorder import RunRecorder

        return RunRecorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def init_devices(replicas=None, gpus=None, *, cpu_devices=None):
    """Set up devices (GPUs, or exactly ``replicas`` simulated CPU devices; ``cpu_devices`` for more) before
    TensorFlow initialises: a plain ``tf.distribute.MirroredStrategy()`` then runs ``replicas`` replicas."""
    from .engine.devices import init

    return init(replicas, gpus, cpu_devices=cpu_devices)
