"""tftoolkit.logs' progress bars: a terminal gets tqdm's text bar, a notebook open in JupyterLab its widget, papermill
lines."""

import sys
import types

import pytest

from tftoolkit import logs


class ZMQInteractiveShell:  # the class name ipykernel's shell has: a notebook kernel
    pass


@pytest.fixture()
def kernel(monkeypatch):
    """This process as a notebook kernel: IPython's get_ipython() answers with a kernel's shell."""
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=ZMQInteractiveShell))
    monkeypatch.delenv(logs.PROGRESS_ENV, raising=False)
    monkeypatch.delenv(logs.SESSION_ENV, raising=False)


def test_a_notebook_run_by_papermill_gets_progress_as_lines(kernel, capsys):
    # Failed before the fix: no progress at all in a notebook papermill (or a sweep) ran.
    assert logs.progress_kind() == "lines"  # papermill / nbclient: a kernel with no server session
    bar = logs.progress_bar(3, unit="step", leave=False)
    for _ in range(3):
        bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err and err.endswith("\n")
    lines = err.splitlines()
    assert 1 <= len(lines) <= 3 and "0/3" in lines[0] and "3/3" in lines[-1]  # the start, and the end kept


def test_a_notebook_open_in_jupyterlab_gets_the_widget(kernel, monkeypatch):
    monkeypatch.setenv(logs.SESSION_ENV, "/home/me/notebooks/01.ipynb")  # what jupyter_server sets
    assert logs.progress_kind() == "notebook" and logs.progress_kind(quiet=True) is None
    from tqdm.notebook import tqdm as widget_bar

    bar = logs.progress_bar(10, unit="step")
    try:
        assert isinstance(bar, widget_bar) and not bar.disable  # ipywidgets (the lab extra) draws it
    finally:
        bar.close()
    monkeypatch.setenv(logs.PROGRESS_ENV, "0")
    assert logs.progress_kind() is None and logs.progress_bar(10).disable


def test_a_terminal_gets_the_text_bar_and_a_pipe_none(monkeypatch):
    monkeypatch.delenv(logs.PROGRESS_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "IPython", None)
    monkeypatch.setattr(sys, "stderr", types.SimpleNamespace(isatty=lambda: True, write=lambda s: None,
                                                             flush=lambda: None))
    assert logs.progress_kind() == "text" and logs.progress_kind(quiet=True) is None
    monkeypatch.setattr(sys, "stderr", types.SimpleNamespace(isatty=lambda: False, write=lambda s: None,
                                                             flush=lambda: None))
    assert logs.progress_kind() is None
    monkeypatch.setenv(logs.PROGRESS_ENV, "1")  # a log file that should show the bar anyway
    assert logs.progress_kind() == "text"
