"""A full disk or a read-only folder: one line and exit code 2, the last good files intact, never `status: ok`.

Where the tests run as root and may mount, the full disk is a real tmpfs of a few hundred KiB and the
read-only folder a real read-only bind mount; elsewhere those tests skip with the reason, and the same
failure is injected at the write call instead (the last test), so the code path is covered everywhere.
"""

import errno
import json
import os
import subprocess

import pytest

from tftoolkit import cli, fileio
from tftoolkit.errors import RunDirError

from helpers import FAST_ARGS

TRAIN = ["train", "--replicas", "1", "--per-replica-batch", "16", "--steps", "6", "--steps-per-loop", "2",
         "--checkpoint-every", "2", "--dataset", "synthetic", "--image-size", "8", "--train-images", "128",
         "--no-measure", "--quiet", *FAST_ARGS]


def _mount(args: list[str], target) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root (the injected-error test covers the code path)")
    done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({done.stderr.strip() or done.returncode}); the injected-error test covers it")


@pytest.fixture
def small_disk(tmp_path):
    """A 320 KiB tmpfs: room for a run's small files, not for a checkpoint of small_cnn (about 0.5 MB)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    _mount(["-t", "tmpfs", "-o", "size=320k", "tmpfs"], mnt)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_full_disk_while_checkpointing_is_one_line_and_no_ok_summary(small_disk, capsys):
    out = small_disk / "run"
    assert cli.main([*TRAIN, "--out", str(out)]) == 2
    line = _one_line(capsys)
    assert "cannot write" in line and "No space left on device (ENOSPC)" in line, line
    assert not (out / "summary.json").exists() or json.loads((out / "summary.json").read_text())["status"] != "ok"
    assert not list(out.rglob(".tmp-*"))


def test_a_full_disk_keeps_the_last_complete_file(small_disk):
    path = small_disk / "summary.json"
    fileio.write_json(path, {"status": "ok", "steps": 3})
    with open(small_disk / "filler", "wb", buffering=0) as f:  # fill the disk
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    with pytest.raises(RunDirError, match=r"cannot write .*summary.json: No space left on device \(ENOSPC\)"):
        fileio.write_json(path, {"status": "ok", "steps": 6, "pad": "x" * 100000})
    assert fileio.read_json(path) == {"status": "ok", "steps": 3}
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "summary.json"]


def test_a_read_only_run_directory_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main([*TRAIN, "--out", str(out)]) == 0
    capsys.readouterr()
    ro = tmp_path / "ro"
    ro.mkdir()
    _mount(["--bind", str(out)], ro)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        before = (ro / "summary.json").read_text()
        assert cli.main([*TRAIN, "--out", str(ro)]) == 2
        line = _one_line(capsys)
        assert "Read-only file system (EROFS)" in line, line
        assert (ro / "summary.json").read_text() == before
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_an_injected_full_disk_at_steps_csv_fails_the_run_cleanly(tmp_path, monkeypatch, capsys):
    """The same failure without root: os.replace of steps.csv raises ENOSPC, as a full disk would."""
    real = os.replace

    def replace(src, dst, *a, **k):
        if str(dst).endswith("steps.csv"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(fileio.os, "replace", replace)
    out = tmp_path / "run"
    assert cli.main([*TRAIN, "--out", str(out)]) == 2
    line = _one_line(capsys)
    assert "cannot write" in line and "steps.csv" in line and "ENOSPC" in line
    assert not (out / "summary.json").exists()
    assert not [p for p in out.rglob("*.tmp")]
