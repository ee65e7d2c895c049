"""Checkpoints through tf.train.CheckpointManager, with TensorFlow's rule for multi-worker runs.

Every worker saves, because saving may run collectives, but one copy only must survive: the chief saves
into the run's ``checkpoints/``, every other worker into a temporary directory it deletes at once (named
as TensorFlow's own multi-worker helpers name it). Every worker restores the chief's copy, so the run
directory must be on a filesystem all workers see.
"""

from __future__ import annotations

import shutil
from pathlib import Path

KEEP = 2  # checkpoints kept: the newest and the one before it


def write_dir(run_checkpoints: Path, worker_id: int = 0) -> Path:
    """Where this worker saves: the run's checkpoints/ for the chief (worker 0), a temporary directory otherwise."""
    if worker_id == 0:
        return run_checkpoints
    return run_checkpoints / f"workertemp_{worker_id}"


class Checkpoints:
    """Save and restore ``objects`` (a dict of trackables) under ``directory``."""

    def __init__(self, directory, objects: dict, *, worker_id: int = 0, keep: int = KEEP):
        import tensorflow as tf

        self.directory = Path(directory)
        self.worker_id = worker_id
        self.checkpoint = tf.train.Checkpoint(**objects)
        self.write_dir = write_dir(self.directory, worker_id)
        if worker_id != 0:
            shutil.rmtree(self.write_dir, ignore_errors=True)  # left by a worker killed while saving
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(self.write_dir), max_to_keep=keep)

    def restore_latest(self) -> str | None:
        """Restore the newest checkpoint (every worker reads the chief's); returns its path, or None."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(str(self.directory))
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
        return latest

    def save(self, step: int) -> None:
        self.write_dir.mkdir(parents=True, exist_ok=True)
        self.manager.save(checkpoint_number=int(step))
        if self.worker_id != 0:
            shutil.rmtree(self.write_dir, ignore_errors=True)
