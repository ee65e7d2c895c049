"""The toolkit's exceptions.

Every error a user can cause is one of these; the message says what to do next. The CLI turns them into
one line on stderr and exit code 2 (see ``cli.main``), so a traceback in front of a user means a bug. An exhausted
memory is not the user's mistake, but its line (``out_of_memory``) still says what ran out and what to lower.
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


class UnreadableRunError(DataError, ValueError):
    """A file of a run directory (summary.json) or a table of results is not what the toolkit writes: truncated, not
    an object, a field of the wrong type. A ValueError too, so a reader of many runs lists it as unreadable."""


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


MEMORY_FIX = ("lower what the run holds: the batch (--per-replica-batch or --global-batch), --image-size, "
              "--data-memory-gb (data held in memory) or --replicas (each holds a copy of the model)")


def out_of_memory(e: BaseException) -> str | None:
    """One line for an allocation that failed, naming what ran out and what to lower; None for other errors.

    NumPy's and Python's MemoryError often carry no message at all (an allocation inside TensorFlow's C++ that
    fails under ``ulimit -v`` arrives as a bare MemoryError), and TensorFlow's ResourceExhaustedError names the
    device. An address-space limit is named, because TensorFlow reserves far more virtual memory than it touches:
    under ``ulimit -v`` it runs out long before the host does."""
    if isinstance(e, MemoryError):
        text = str(e).strip().splitlines()
        what = f"out of host memory (MemoryError{': ' + text[0] if text else ', no size given'})"
    elif type(e).__name__ == "ResourceExhaustedError":  # TensorFlow's, on a GPU or the host: its line says which
        what = f"out of memory (ResourceExhaustedError: {first_line(e)})"
    else:
        return None
    cap = address_space_limit()
    if cap is not None:
        what += (f" under an address-space limit of {cap / 1e9:.1f} GB (ulimit -v), which counts TensorFlow's "
                 "reservations, not only what it uses: raise or lift the limit (or cap memory with a cgroup), or")
    else:
        what += ";"
    return f"{what} {MEMORY_FIX}"


def address_space_limit() -> int | None:
    """This process's address-space limit in bytes (``ulimit -v``, RLIMIT_AS), or None when there is none."""
    import resource  # POSIX only: imported here so the exceptions themselves import anywhere

    try:
        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (OSError, ValueError, AttributeError):  # no RLIMIT_AS on this platform
        return None
    return None if cap == resource.RLIM_INFINITY else int(cap)


def error_line(e: BaseException) -> str:
    """One line that says what went wrong (for an exhausted memory: what ran out and what to lower, out_of_memory).
    A TensorFlow op error's first line is often only "Graph execution error:"; the Python exception raised inside
    the graph (a file the input pipeline could not decode, say) is in the lines below, so the last
    "SomeError: ..." line among them is the one that says why."""
    oom = out_of_memory(e)
    if oom is not None:
        return oom
    text = str(e)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if len(lines) > 1:
        causes = [line for line in lines[1:] if re.match(r"^[A-Za-z_.]*(Error|Exception): ", line)]
        if causes:
            return f"{type(e).__name__}: {first} {causes[-1]}"[:500]
        # An op's own failure (a check in the input pipeline, say) names no Python exception: its message is the
        # line before the first [[{{node ...}}]].
        node = next((i for i, line in enumerate(lines) if line.startswith("[[{{node")), 0)
        if first.endswith("Graph execution error:") and node > 1:
            return f"{type(e).__name__}: {first} {lines[node - 1]}"[:500]
    return f"{type(e).__name__}: {first}"
