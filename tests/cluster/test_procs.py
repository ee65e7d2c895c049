"""tftoolkit.cluster.procs: a process group stops as a whole, and a child dies with its parent."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tftoolkit.cluster import procs


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group_with_a_grandchild(tmp_path, trap_term: bool = False):
    pidfile = tmp_path / "grandchild.pid"
    trap = "trap 'exit 0' TERM; " if trap_term else ""
    proc = subprocess.Popen(["sh", "-c", f"{trap}sleep 60 & echo $! > {pidfile}; wait"], start_new_session=True)
    deadline = time.time() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.time() < deadline
        time.sleep(0.02)
    return proc, int(pidfile.read_text())


@pytest.mark.slow
def test_stop_group_kills_the_whole_group_at_once(tmp_path):
    proc, grandchild = _group_with_a_grandchild(tmp_path)
    t0 = time.time()
    procs.stop_group(proc)
    assert proc.returncode == -signal.SIGKILL and time.time() - t0 < 5
    deadline = time.time() + 5
    while _alive(grandchild) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


@pytest.mark.slow
def test_stop_group_gives_a_grace_period_to_shut_down(tmp_path):
    proc, grandchild = _group_with_a_grandchild(tmp_path, trap_term=True)
    procs.stop_group(proc, grace_s=10)
    assert proc.returncode == 0  # it took SIGTERM and left on its own
    os.kill(grandchild, signal.SIGKILL) if _alive(grandchild) else None


@pytest.mark.slow
def test_stop_group_on_a_finished_process_is_harmless():
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    procs.stop_group(proc, grace_s=1)
    assert proc.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_with_its_parent(tmp_path):
    child_pid = tmp_path / "child.pid"
    # parent -> child; the child arms die_with_parent and sleeps; killing the parent must end the child.
    child = ("import os, sys, time; from tftoolkit.cluster import procs; "
             f"ok = procs.die_with_parent(os.getppid()); open({str(child_pid)!r}, 'w').write(str(os.getpid())); "
             "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"])
    deadline = time.time() + 60
    while not child_pid.exists() or not child_pid.read_text():
        assert time.time() < deadline
        time.sleep(0.05)
    pid = int(child_pid.read_text())
    assert _alive(pid)
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


@pytest.mark.slow
def test_die_with_parent_says_when_the_parent_is_already_gone():
    # In a child: arming the death signal here would tie pytest to its own parent.
    code = ("import os; from tftoolkit.cluster import procs; "
            "print(procs.die_with_parent(os.getppid()), procs.die_with_parent(os.getppid() + 100000))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]
