"""The NVML bindings (pynvml, from the nvidia-ml-py package), loaded in one place so tests can hand in a fake."""

from __future__ import annotations


def load():
    """The pynvml module (ImportError when nvidia-ml-py is not installed)."""
    import pynvml

    return pynvml


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def text(value) -> str:
    """A string NVML returned; pynvml decodes most, but struct fields (PciInfo.busId) stay bytes."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
