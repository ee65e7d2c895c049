"""Checkpoints that a kill cannot half-write, and a resume that falls back when the newest one is damaged.

A save writes ``ckpt-N`` into a temporary folder beside the checkpoints (tf.train.Checkpoint.write), flushes
it, then renames its data files into ``checkpoints/`` and its index file last: a checkpoint exists when its
index does, and then it is whole. The ``checkpoint`` state file (what tf.train.latest_checkpoint reads) is
rewritten after that, atomically, and only then are checkpoints beyond the newest ``KEEP`` deleted. So a
SIGKILL at any instant leaves the previous set, or the previous set plus the new checkpoint, never half of one.

A resume tries the checkpoints on disk newest first (found by their index files, not by the state file, which
a kill may have left one save behind). One that does not restore (a truncated or unreadable file, a tensor
missing) is reported with its file name and the one before it is tried; the step restored with it is the
data position, so the run replays from there and ends where an uninterrupted run ends. When none restores,
the run stops with a RunDirError naming the files and the way out (--force starts it over).

Multi-worker runs follow TensorFlow's rule: every worker saves (saving may run collectives), but only the
chief's copy is kept; the others write into a temporary folder they delete at once. Every worker restores
the chief's files, so the run directory must be on a filesystem all workers see.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from pathlib import Path

from ..errors import RunDirError
from ..fileio import atomic_write, remove_stale_temps

log = logging.getLogger("tftoolkit")

KEEP = 2  # checkpoints kept: the newest, and the one a damaged newest falls back to
PREFIX = "ckpt"
_INDEX = re.compile(rf"^{PREFIX}-(\d+)\.index$")
_DISK_ERRORS = {"No space left on device": errno.ENOSPC, "Read-only file system": errno.EROFS,
                "Disk quota exceeded": errno.EDQUOT}


def write_dir(run_checkpoints: Path, worker_id: int = 0) -> Path:
    """Where this worker saves: the run's checkpoints/ for the chief (worker 0), a temporary directory otherwise."""
    if worker_id == 0:
        return run_checkpoints
    return run_checkpoints / f"workertemp_{worker_id}"


def steps_on_disk(directory) -> list[int]:
    """The steps of the whole checkpoints in ``directory`` (those with an index file), newest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)) for p in directory.iterdir() if (m := _INDEX.match(p.name))), reverse=True)


def _disk_error(e: BaseException) -> int | None:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
        return e.errno
    text = str(e)
    return next((code for words, code in _DISK_ERRORS.items() if words in text), None)


class Checkpoints:
    """Save and restore ``objects`` (a dict of trackables) under ``directory``."""

    def __init__(self, directory, objects: dict, *, worker_id: int = 0, keep: int = KEEP):
        import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

        self.directory = Path(directory)
        self.worker_id, self.keep = worker_id, keep
        self.checkpoint = tf.train.Checkpoint(**objects)
        self.write_dir = write_dir(self.directory, worker_id)
        if worker_id != 0:
            shutil.rmtree(self.write_dir, ignore_errors=True)  # left by a worker killed while saving
        else:
            # The state file's temporary name, left by a kill between its write and its rename (the state file
            # itself is intact); the run directory's lock says no other process of this run is writing one.
            remove_stale_temps(self.directory)

    # --- saving ------------------------------------------------------------------------------------------
    def save(self, step: int) -> None:
        if self.worker_id != 0:
            self.write_dir.mkdir(parents=True, exist_ok=True)
            try:
                self._write(self.write_dir, step)
            finally:
                shutil.rmtree(self.write_dir, ignore_errors=True)
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".tmp-{PREFIX}-{int(step)}-{os.getpid()}"
        name = f"{PREFIX}-{int(step)}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            self._write(tmp, step)
            files = sorted((p for p in tmp.iterdir() if p.name.startswith(name + ".")),
                           key=lambda p: p.name.endswith(".index"))  # the index last
            for f in files:
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            for f in files:
                os.replace(f, self.directory / f.name)
            _fsync_dir(self.directory)
            self._write_state()
            self._prune()
        except Exception as e:
            code = _disk_error(e)
            if code is not None:
                raise RunDirError(f"cannot write checkpoint {self.directory / name}: {os.strerror(code)} "
                                  f"({errno.errorcode[code]}); the previous checkpoints are kept; free space or use "
                                  "a writable --out, then run the same command again") from None
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _write(self, folder: Path, step: int) -> None:
        """``folder/ckpt-<step>.*``: Checkpoint.save numbers files by its save counter, which restores with them."""
        self.checkpoint.save_counter.assign(int(step) - 1)
        self.checkpoint.save(str(folder / PREFIX))

    def _write_state(self) -> None:
        """The ``checkpoint`` file tf.train.latest_checkpoint reads (a CheckpointState text proto, relative paths)."""
        names = [f"{PREFIX}-{s}" for s in reversed(steps_on_disk(self.directory)[: self.keep])]
        text = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(f'all_model_checkpoint_paths: "{n}"\n' for n in names)
        atomic_write(self.directory / "checkpoint", text)

    def _prune(self) -> None:
        keep = set(steps_on_disk(self.directory)[: self.keep])
        for p in self.directory.iterdir():
            m = re.match(rf"^{PREFIX}-(\d+)\.", p.name)
            if m and int(m.group(1)) not in keep:
                p.unlink(missing_ok=True)  # older checkpoints, and data files a kill left without an index
            elif p.name.startswith(f".tmp-{PREFIX}-") and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        remove_stale_temps(self.directory)  # the state file's, as in __init__

    # --- restoring ---------------------------------------------------------------------------------------
    def restore_latest(self) -> str | None:
        """Restore the newest checkpoint that restores; returns its path, or None when there is none."""
        steps = steps_on_disk(self.directory)
        failures = []
        for step in steps:
            path = str(self.directory / f"{PREFIX}-{step}")
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except Exception as e:  # noqa: BLE001 - any damage: say which file, and fall back to the one before
                why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]
                failures.append(f"{Path(path).name} ({why})")
                log.warning("checkpoint %s does not restore (%s)%s", path, why,
                            "; falling back to the one before it" if step != steps[-1] else "")
                continue
            if failures:
                log.warning("resumed from %s, an older checkpoint: the steps after it are trained again", path)
            return path
        if failures:
            raise RunDirError(f"no checkpoint in {self.directory} restores: {'; '.join(failures)}; the run cannot "
                              "resume: pass --force to start it over")
        return None


def _fsync_dir(path: Path) -> None:
    """Make the renames into ``path`` durable (a crash of the machine, not only of the process)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
