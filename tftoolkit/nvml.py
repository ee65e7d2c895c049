"""The one way into NVML (the ``pynvml`` module of nvidia-ml-py): ``load()`` and ``session()``.

Every NVML user in the toolkit (gpus, engine.feed, measure.host_topology, measure.sampler, measure.doctor.driver_checks) opens
NVML through ``session()`` and nothing else imports pynvml (tests/test_nvml.py scans the sources for it), so tests
hand in one fake by replacing ``load`` (tests/fake_nvml.py) and every user sees it.

``session()`` initialises NVML on entry and shuts it down on exit; sessions opened while one is open (a monitor
sampling while the environment report runs, the doctor calling gpus) share it, so NVML is initialised once and shut
down once, by the last one to close, also when a block raises.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0          # sessions open now, in every thread together
_module = None      # the pynvml module the open sessions share


def load():
    """The pynvml module (ImportError when nvidia-ml-py is not installed)."""
    # Deferred on purpose: importing the toolkit never needs the binding (a results-only install may lack it), and
    # tests replace this function with one that returns tests/fake_nvml.py's stand-in.
    import pynvml

    return pynvml


@contextmanager
def session():
    """pynvml, initialised for the ``with`` block (nvmlInit raises as pynvml does: no library, no driver).

    Nested and concurrent sessions share one nvmlInit; the last to close calls nvmlShutdown once. A failing
    nvmlShutdown is ignored: the readings are taken, and the process is not worse off than before.
    """
    global _depth, _module
    with _lock:
        if _depth == 0:
            mod = load()
            mod.nvmlInit()
            _module = mod
        _depth += 1
        mod = _module
    try:
        yield mod
    finally:
        with _lock:
            _depth -= 1
            closing = _module if _depth == 0 else None
            if closing is not None:
                _module = None
        if closing is not None:
            try:
                closing.nvmlShutdown()
            except Exception:  # noqa: BLE001 - see the docstring
                pass


def open_sessions() -> int:
    """How many sessions are open now (0 once every block has exited)."""
    return _depth


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def text(value) -> str:
    """A string NVML returned; pynvml decodes most, but struct fields (PciInfo.busId) stay bytes."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
