"""A run's logs and environment on disk: steps.csv, evals.csv (written, and read back for a resume) and env.json.

Used by ``Run`` (the toolkit's loop) and ``RunRecorder`` (a user's model.fit), so both write the same names and
columns; summary.json is built by records.summary and written by each of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ... import fileio
from ...engine import devices
from ...measure import hardware

EVAL_COLUMNS = ["epoch", "step", "val_loss", "val_accuracy", "val_examples"]  # evals.csv's first columns
NOISE_COLUMNS = ["noise_grad_sq", "noise_trace", "noise_scale"]  # steps.csv's, with noise_scale=True


def write_env(out: Path, kind: str, device_names) -> None:
    """env.json: the hardware report, then the toolkit's view of the devices (a run's, or a recorded fit's)."""
    import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

    env = hardware.collect(tf_info={"version": tf.__version__, **tf.sysconfig.get_build_info()})
    env["tftoolkit"] = {"device_kind": kind, "devices": list(device_names), "threads": devices.thread_settings(),
                        "version": hardware.toolkit_version()}  # the report's header says which toolkit measured
    fileio.write_json(out / "env.json", env)


def row_columns(noise_scale: bool) -> list[str]:
    """steps.csv's columns as a train run's rows hold them (the learning rate is added on writing). ``call``: the
    first step of the loop call the step ran in; ``timed``: 1 where that call counts in images/sec (not a warm-up
    or profiled call), so the rates can be computed again from the file (timed_loops)."""
    return ["step", "epoch", "loss", "step_time_s", "call", "timed"] + (NOISE_COLUMNS if noise_scale else [])


def timed_loops(rows: list[dict]) -> list[tuple[float, int]]:
    """(seconds, steps) of every timed loop call in steps.csv's ``rows``, in order: what the process that trained
    them timed, for a rerun that has nothing left to train (a kill after the last step, before the summary).
    Rows from a steps.csv without the ``call``/``timed`` columns give none."""
    calls: dict[int, list[float]] = {}
    for r in rows:
        call, timed = r.get("call"), r.get("timed")
        if call is None or timed is None or call != call or timed != timed or not timed:  # absent or NaN
            continue
        calls.setdefault(int(call), []).append(float(r["step_time_s"]))
    return [(sum(times), len(times)) for _, times in sorted(calls.items())]


def steps_frame(rows: list[dict], columns: list[str], schedule) -> pd.DataFrame:
    """steps.csv of a train run: ``rows`` with the learning rate ``schedule`` applied at each step."""
    df = pd.DataFrame(rows, columns=columns)
    if len(df):
        # The LR applied at step k (1-based) is the schedule at optimizer iteration k-1.
        lrs = np.asarray(schedule(np.asarray(df["step"] - 1, dtype=np.float32)))
        df.insert(3, "learning_rate", lrs.astype(float))
    else:
        df.insert(3, "learning_rate", [])
    return df


def write_logs(out: Path, steps: pd.DataFrame, evals: list[dict], eval_columns: list[str]) -> None:
    fileio.write_csv(out / "steps.csv", steps)
    fileio.write_csv(out / "evals.csv", pd.DataFrame(evals, columns=eval_columns))


def read_logs(out: Path, up_to_step: int, columns: list[str]) -> tuple[list[dict], list[dict]]:
    """steps.csv's rows (with ``columns``) and evals.csv's, up to ``up_to_step``: what a resume keeps."""
    rows, evals = [], []
    if (out / "steps.csv").exists():
        df = pd.read_csv(out / "steps.csv")
        # reindex: a steps.csv from an older version may lack a column (it comes back as NaN)
        rows = df[df["step"] <= up_to_step].reindex(columns=columns).to_dict("records")
    if (out / "evals.csv").exists():
        df = pd.read_csv(out / "evals.csv")
        evals = df[df["step"] <= up_to_step].to_dict("records")
    return rows, evals
