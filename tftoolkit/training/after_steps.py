"""What a run measures after its last step, while its training input is still alive: the input probe (the run's own
pipeline pulled alone, measure.input.bench) and the step breakdown's rounds (measure.breakdown), both sized to the
run's time; and, on a rerun with nothing left to train, the rates the earlier process timed (steps.csv).

Functions of ``run`` (training.run.Run), called from its loop: they set ``run.input_capacity`` and
``run.step_parts`` and add their seconds to ``run.wall["measurement_s"]``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time

import numpy as np

from ..errors import error_line
from ..measure import breakdown
from ..measure.input import bench as inputbench
from . import records
from .records.summary import NOTHING_TRAINED

log = logging.getLogger("tftoolkit")


def measure_what_was_trained(run, hooks) -> None:
    """A rerun with nothing left to train: the process that trained the last step was killed before its summary
    (while it measured). images/sec and the step times come from the loop calls that process timed (steps.csv's
    ``call`` and ``timed``), and the input probe and the breakdown are measured now, on an input made for them,
    sized to the time those steps trained. Without those columns (an older steps.csv) nothing is measured."""
    run.loop_times = records.files.timed_loops(run.rows)
    if not run.loop_times:
        run.input_capacity = {"input_capacity_method": f"not measured ({NOTHING_TRAINED})"}
        return
    trained_s = float(sum(r["step_time_s"] for r in run.rows if r.get("step_time_s") == r.get("step_time_s")))
    log.info("nothing left to train: images/sec from the %d loop calls the earlier process timed (steps.csv); "
             "the input and the step breakdown are measured now", len(run.loop_times))
    hooks.make_iterator(run.derived["total_steps"])
    with run.watchdog.watching() if run.watchdog else contextlib.nullcontext():
        probe_input(run, trained_s)
        if run.config.measure:
            measure_parts(run, elapsed_s=trained_s + time.time() - run.started)


def measure_parts(run, elapsed_s: float | None = None) -> None:
    """The breakdown's rounds, sized to the measuring budget (breakdown.budget: a share of the run's wall time so
    far, ``elapsed_s``, less what the input probe took); the loop's first call says what a trace of it costs."""
    step_s = float(np.median([s / n for s, n in run.loop_times] or [math.nan]))
    trace_s = run.first_call[0] - run.first_call[1] * step_s if run.first_call else math.nan
    run.step_parts = breakdown.measure_parts(
        run.engine, run.config, run.source, run.iterator, step_s, trace_s,
        elapsed_s=time.time() - run.started if elapsed_s is None else elapsed_s,
        spent_s=run.wall["measurement_s"], setup=run.setup)
    run.wall["measurement_s"] += run.step_parts["seconds"]


def probe_input(run, trained_s: float | None = None) -> None:
    """The input capacity of the run's own pipeline, pulled alone after the last step (measure.input.bench): a
    figure for the summary's input verdict; a failure to measure it fails nothing. ``trained_s``: the training
    time it is sized to (default: this process's)."""
    t0 = time.perf_counter()
    try:
        trained_s = run.wall["train_steps_s"] if trained_s is None else trained_s
        seconds = min(inputbench.PROBE_S, inputbench.PROBE_SHARE * trained_s)
        run.input_capacity = inputbench.probe(run.engine.strategy, run.engine.feed, run.iterator,
                                              workers=run.config.workers, seconds=seconds)
    except Exception as e:  # noqa: BLE001 - the run trained; say what could not be measured
        log.warning("input capacity not measured: %s", error_line(e))
        run.input_capacity = {"input_capacity_method": f"not measured: {error_line(e)}"}
    run.wall["measurement_s"] += time.perf_counter() - t0
