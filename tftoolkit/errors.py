"""The toolkit's exceptions.

Every error a user can cause is one of these; the message says what to do next. The CLI turns them into
one line on stderr and exit code 2 (see ``cli.main``), so a traceback in front of a user means a bug.
"""

import re


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


def first_line(error: BaseException, limit: int = 300) -> str:
    """An exception's first line for a one-line message, without TensorFlow's wrapping: the
    ``{{function_node __wrapped__Sub_device_/job:localhost/...}}`` prefix and the ``[Op:Sub] name:`` suffix say
    where inside TensorFlow, nothing a user can act on ("Incompatible shapes: [4] vs. [4,10]" is what matters)."""
    lines = str(error).strip().splitlines()
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", lines[0] if lines else "")
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text).strip()
    return (text or type(error).__name__)[:limit]
