"""What a run shows as it goes: one ``tftoolkit`` logger, configured once for the CLI, notebooks and scripts, and
progress bars where someone is watching.

A text bar (tqdm) goes to a terminal's stderr. In a notebook kernel that a Jupyter server started for an open
notebook (JupyterLab, Jupyter Notebook: the server sets ``JPY_SESSION_NAME`` in the kernel's environment) the bar is
tqdm's notebook widget (ipywidgets, in the ``lab`` extra). A kernel started by papermill or nbclient has no such
session and no widget to draw: it gets the bar as plain lines, one every ``LINES_EVERY_S`` seconds and one at the end,
so an executed notebook (and the log papermill streams) shows how far each training got without a line per step.
``TFTOOLKIT_PROGRESS`` decides when set: ``0`` never, ``1`` always.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("tftoolkit")


def ensure_logging(quiet: bool = False) -> None:
    """Log to stderr when nobody configured the tftoolkit logger (CLI, notebooks, plain scripts)."""
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("tftoolkit: %(message)s"))
        log.addHandler(h)
        log.propagate = False
    log.setLevel(logging.WARNING if quiet else logging.INFO)


PROGRESS_ENV = "TFTOOLKIT_PROGRESS"  # "0": never a progress bar; "1": always
SESSION_ENV = "JPY_SESSION_NAME"  # set by jupyter_server in the kernels it starts for a notebook session


def _in_kernel() -> bool:
    shell = sys.modules.get("IPython")
    try:
        return bool(shell) and type(shell.get_ipython()).__name__ == "ZMQInteractiveShell"
    except AttributeError:
        return False


def progress_kind(quiet: bool = False) -> str | None:
    """Which bar to show: "text" (a terminal), "notebook" (a notebook open in a Jupyter server) or None."""
    forced = os.environ.get(PROGRESS_ENV, "").strip()
    if quiet or forced == "0":
        return None
    if _in_kernel():
        return "notebook" if forced == "1" or os.environ.get(SESSION_ENV) else "lines"
    return "text" if forced == "1" or sys.stderr.isatty() else None


LINES_EVERY_S = 30.0  # a notebook run by papermill: a progress line this often (a few per training, not per step)


class _Lines:
    """A file for tqdm that turns each redraw (a carriage return, then the bar) into a line of its own: a stored
    notebook output keeps every character written, and carriage returns would pile up as one long line."""

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text:
            sys.stderr.write(text + "\n")

    def flush(self) -> None:
        sys.stderr.flush()


def progress_bar(total: int | None, *, quiet: bool = False, **kw):
    """A tqdm bar of ``progress_kind(quiet)``: disabled (a no-op with the same methods) where no one watches."""
    shown = progress_kind(quiet)
    if shown == "notebook":
        try:
            from tqdm.notebook import tqdm  # notebooks only (it needs ipywidgets)

            return tqdm(total=total, **kw)
        except ImportError:  # ipywidgets missing (install the lab extra): the text bar, in the cell's stderr
            pass
    from tqdm import tqdm  # deferred: importing tftoolkit stays light (tftoolkit/__init__.py)

    if shown == "lines":
        # leave: the last state stays as the run's last progress line (a short run's only one after the first)
        return tqdm(total=total, file=_Lines(), mininterval=LINES_EVERY_S, ncols=80, ascii=True,
                    **{**kw, "leave": True})
    return tqdm(total=total, disable=shown is None, dynamic_ncols=True, **kw)
