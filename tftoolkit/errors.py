"""The toolkit's exceptions.

Every error a user can cause is one of these; the message says what to do next. The CLI turns them into
one line on stderr and exit code 2 (see ``cli.main``), so a traceback in front of a user means a bug.
"""


class ToolkitError(Exception):
    """Base class: a problem the user can fix (bad input, missing data, wrong machine)."""


class ConfigError(ToolkitError, ValueError):
    """A parameter is unknown, of the wrong type, or out of range."""


class DeviceError(ToolkitError):
    """The requested devices are not there, or TensorFlow was initialised before they could be set."""


class ClusterError(ToolkitError):
    """Worker processes of a multi-worker run could not form a cluster, or one of them failed."""


class DataError(ToolkitError):
    """A dataset is missing, corrupt, or does not fit the run."""


class RunDirError(ToolkitError):
    """A run directory belongs to a different run (use force) or cannot be written."""


class ModelError(ToolkitError):
    """A model name is unknown, or an import path does not give a Keras model."""


class SweepError(ToolkitError):
    """A sweep spec is invalid (notebook, parameters, grid, values) or its output folder holds another sweep."""
