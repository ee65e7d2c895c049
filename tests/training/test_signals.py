"""tftoolkit.training.signals: every command takes SIGTERM as Ctrl-C; after a run's last step signals wait for its summary."""

import signal
import subprocess
import sys

import pytest

from tftoolkit.training import signals


def test_a_held_signal_is_raised_at_the_end_and_a_second_one_at_once():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    held = signals.Deferred().start()
    signal.raise_signal(signal.SIGTERM)
    assert held.signum == signal.SIGTERM  # noted, nothing raised
    with pytest.raises(signals.Terminated):
        held.end()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    held = signals.Deferred().start()
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as e:
        signal.raise_signal(signal.SIGINT)  # asked twice
    assert not isinstance(e.value, signals.Terminated)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    signals.Deferred().start(pending=signal.SIGTERM).restore()  # restored without raising
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.slow  # four subprocesses that import the CLI (~10 s each on 2 busy cores)
@pytest.mark.parametrize("command", [["scale", "--replica-counts", "1", "--out", "o"], ["find-lr", "--out", "o"],
                                     ["find-batch", "--out", "o"], ["bench", "input"]])
def test_every_long_running_command_takes_sigterm_as_ctrl_c(tmp_path, command):
    """SIGTERM in the middle of the command's work: its own clean-up runs (a KeyboardInterrupt), exit 143 and one
    line, never the silent default death (a subprocess: the old default would end the test runner itself)."""
    code = ("import os, signal, sys, time\n"
            "from tftoolkit import cli\n"
            "def work(*a, **k):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(5)\n"
            "    raise SystemExit('SIGTERM was not taken')\n"
            "import tftoolkit.cli.measure as measure, tftoolkit.cli.tuning as tuning\n"
            "measure.config_from_args = tuning.config_from_args = work\n"
            f"sys.exit(cli.main({command!r}))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].endswith("interrupted (SIGTERM)")
