"""What a run writes into its run directory besides its checkpoints, for both kinds of run (``training.run.Run``
and ``training.recorder.RunRecorder``):

    files     steps.csv, evals.csv and env.json, and what a rerun reads back from them
    summary   summary.json's fields and the run's last log line, from those records

summary.json's schema and its reader are ``tftoolkit.summary`` (no TensorFlow: every report reads it); this room
builds it. Neither imports TensorFlow or needs a device, so every field is tested from hand-made records
(tests/training/test_records.py).
"""

from . import files, summary

__all__ = ["files", "summary"]
