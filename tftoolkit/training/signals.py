"""What SIGTERM and Ctrl-C do to a command: the one rule every long-running command follows.

- Every command (``cli.main`` holds ``stop_on_sigterm`` around each; this module imports nothing of the toolkit,
  so the CLI's front door stays light) takes SIGTERM (``timeout``, ``scancel``, a
  Slurm time limit) as it takes Ctrl-C: a ``KeyboardInterrupt`` (``Terminated``, which carries its signal) that
  runs the command's own clean-up, and the CLI exits 128 + the signal (143; 130 for Ctrl-C). So ``scale`` records
  the run in flight as interrupted (its checkpoint and summary), ``sweep`` stops its points and writes
  results.csv, the finders and ``bench`` stop with what they wrote, as ``train`` does.
- Inside a training loop (``Stop.deferring``) SIGTERM is only noted: the call in flight finishes, its steps are
  checkpointed, then the run stops.
- After a run's last step (``Deferred``): SIGTERM and Ctrl-C are held back while it measures and writes its
  summary (seconds), then honoured; a second signal stops it at once (the summary then says what was not
  measured). A signal there must not cost the summary of a run that trained to its end.

SIGKILL cannot be caught: what it loses is bounded by checkpoints and atomic writes (rundir, fileio).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

log = logging.getLogger("tftoolkit")


class Terminated(KeyboardInterrupt):
    """SIGTERM stopped the command (timeout, scancel, a Slurm time limit): an interrupt like Ctrl-C, with its signal."""

    signum = signal.SIGTERM


class Stop:
    """A SIGTERM waiting for the loop: inside the training loop the handler only notes it, so that the call in
    flight finishes and the run checkpoints a consistent state; anywhere else it raises Terminated at once."""

    deferring = False
    requested = False


def _on_sigterm(signum, frame):
    if Stop.deferring:
        Stop.requested = True
        return
    raise Terminated()


def interrupt(signum: int) -> KeyboardInterrupt:
    """The exception a signal becomes: Terminated for SIGTERM, KeyboardInterrupt for Ctrl-C."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def stop_on_sigterm():
    """While inside, SIGTERM interrupts as Ctrl-C does (and, in a training loop, after checkpointing the steps
    trained). Only the main thread can set a signal handler: elsewhere this does nothing. The handler that was
    there comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    Stop.requested = False
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        Stop.deferring = Stop.requested = False


class Deferred:
    """SIGTERM and Ctrl-C held back from ``start()`` until ``end()``, which then raises the first one held: a run
    that trained its last step measures and writes its summary first. A second signal raises at once."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def start(self, pending: int | None = None) -> "Deferred":
        """``pending``: a signal already noted (a SIGTERM during the last training call)."""
        self.signum = pending
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._note) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _note(self, signum, frame):
        if self.signum is not None:  # asked twice: stop now
            self.restore()
            raise interrupt(signum)
        self.signum = signum
        log.warning("%s after the last step: the run stops once its summary is written (again to stop at once)",
                    signal.Signals(signum).name)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def end(self) -> None:
        self.restore()
        if self.signum is not None:
            raise interrupt(self.signum)
