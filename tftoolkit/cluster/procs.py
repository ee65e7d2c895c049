"""Processes this toolkit starts: stop them as a group, and make them die with their parent.

Sweep points and launched workers run in sessions of their own (``start_new_session=True``), so everything
they start (a Jupyter kernel, TensorFlow's helper processes) is in their process group: stopping the group
leaves nothing behind. A child also asks the kernel to kill it when its parent dies (Linux's
PR_SET_PDEATHSIG), so a sweep or launcher killed with SIGKILL leaves no orphan writing into its folders.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_group(proc: subprocess.Popen, grace_s: float = 0.0) -> None:
    """End ``proc``'s process group: SIGTERM and ``grace_s`` seconds to shut down (when > 0), then SIGKILL."""
    steps = ([(signal.SIGTERM, grace_s)] if grace_s > 0 else []) + [(signal.SIGKILL, 5.0)]
    for sig, wait in steps:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def die_with_parent(parent_pid: int | None = None) -> bool:
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere a no-op).

    With ``parent_pid``: returns False when the parent is already gone (it died before the signal was armed),
    so the caller can stop at once.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    return not parent_pid or os.getppid() == int(parent_pid)
