"""The chunked loop driver: from a start step to a total, in calls of the compiled loop.

Every host loop in the toolkit (training, the LR finder, the input benchmark) has the same shape: one
tf.function call runs ``n`` steps (``steps_per_loop`` cuts Python's share of each step), a call never crosses
an epoch boundary (the data of each epoch is its own shuffled pass, so the position in the epoch is part
of what a resumed run must reproduce) nor a multiple of ``every`` (where checkpoints go). ``drive`` owns
that arithmetic; callers add what they do between calls through two small hooks, as orbit's Controller
takes its actions:

    on_epoch_start(epoch, position)   when the drive enters an epoch (at ``position`` when resuming)
    before_call(step, n)          just before a call (the profiler starts here)
    on_loop(chunk) -> bool        after each call, on the host (timing, logs, divergence): True stops
    on_epoch_end(epoch, step, complete, stopped)   after an epoch's last call (evaluation, counts)

Hooks run between calls, never inside the compiled loop, so nothing they do is in the timed region:
``Chunk.seconds`` is the call alone, timed by engine.timer (devices synchronised at both ends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Chunk:
    """One call of the compiled loop: where it ran and what it returned (as NumPy values)."""

    epoch: int
    position: int     # steps into the epoch before this call
    first_step: int   # global step before this call (the steps run are first_step + 1 ... + steps)
    steps: int
    seconds: float    # wall time of the call, devices synchronised at both ends (engine.timer)
    outputs: Any      # the loop function's outputs, fetched to NumPy

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps


def timed_call(loop_fn, iterator, n: int) -> tuple[Any, float]:
    """Run ``loop_fn(iterator, n)``; returns (its outputs as NumPy values, seconds).

    The clock is engine.timer's: fetching the outputs would wait only for the ops they depend on (the forward
    pass of the last step), not for its backward pass, all-reduce and update, which a GPU may still be running.
    """
    import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

    from . import timer  # imports TensorFlow too

    out, seconds = timer.timed(loop_fn, iterator, tf.constant(n, tf.int32))
    return tf.nest.map_structure(lambda t: t.numpy(), out), seconds


def chunk_steps(step: int, position: int, steps_per_epoch: int, total: int, steps_per_loop: int,
                every: int = 0, breaks=()) -> int:
    """Steps in the next call: up to steps_per_loop, to the epoch's end, the total, the next multiple of every,
    or the next step in ``breaks`` (where a call must end: a profiled range's edges)."""
    n = min(steps_per_loop, steps_per_epoch - position, total - step)
    if every:
        n = min(n, every - step % every)
    for b in breaks:
        if step < b:
            n = min(n, b - step)
    return n


def calls(start: int, total: int, steps_per_epoch: int, steps_per_loop: int, every: int = 0, breaks=()) -> int:
    """How many calls ``drive`` makes from step ``start`` to ``total`` (chunk_steps' cuts, counted ahead)."""
    step, n_calls = start, 0
    while step < total:
        step += chunk_steps(step, step % steps_per_epoch, steps_per_epoch, total, steps_per_loop, every, breaks)
        n_calls += 1
    return n_calls


def warm_calls(warmup_steps: int, steps_per_loop: int, n_calls: int) -> int:
    """Calls left out of the timing: those ``warmup_steps`` cover, at least the first (it traces the step). A run too
    short for that warm-up keeps two calls timed where it has three or more, one where it has two, so it still
    measures a rate instead of reporting none; only a run of one call has none to time."""
    wanted = max(1, math.ceil(warmup_steps / steps_per_loop))
    return wanted if wanted < n_calls else max(1, n_calls - 2)


def drive(loop_fn: Callable, make_iterator: Callable[[int], Any], *, start: int, total: int,
          steps_per_epoch: int, steps_per_loop: int, every: int = 0, breaks=(),
          on_epoch_start: Callable[[int, int], None] | None = None,
          before_call: Callable[[int, int], None] | None = None,
          on_loop: Callable[[Chunk], bool] | None = None,
          on_epoch_end: Callable[..., None] | None = None) -> int:
    """Run ``loop_fn`` from step ``start`` to ``total``; returns the step reached.

    ``make_iterator(start)`` gives one iterator from step ``start`` over every remaining epoch
    (data.pipeline.train_input): one iterator per drive, since deleting a distributed iterator is what used to
    stall between epochs. A hook that returns True stops the drive after its epoch's end hook has run.
    ``before_call(step, n)`` runs just before a call of ``n`` steps from ``step`` (starting a profiler, say).
    """
    step = start
    iterator = make_iterator(start) if start < total else None
    while step < total:
        epoch, pos = divmod(step, steps_per_epoch)
        if on_epoch_start is not None:
            on_epoch_start(epoch, pos)
        stopped = False
        while pos < steps_per_epoch and step < total:
            n = chunk_steps(step, pos, steps_per_epoch, total, steps_per_loop, every, breaks)
            if before_call is not None:
                before_call(step, n)
            outputs, seconds = timed_call(loop_fn, iterator, n)
            chunk = Chunk(epoch, pos, step, n, seconds, outputs)
            step += n
            pos += n
            if on_loop is not None and on_loop(chunk):
                stopped = True
                break
        if on_epoch_end is not None:
            on_epoch_end(epoch, step, complete=(pos == steps_per_epoch), stopped=stopped)
        if stopped:
            break
    return step
