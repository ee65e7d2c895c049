"""TensorBoard event files for a run: scalars per step and per epoch, HParams, and the profiler's trace.

    RUN_DIR/tensorboard/train/        loss, learning_rate, images_per_sec, step_time_s (per step), noise_scale
    RUN_DIR/tensorboard/validation/   loss, accuracy (per epoch, at the step it ended)
    RUN_DIR/tensorboard/plugins/profile/<run>/*.xplane.pb    with --profile-steps A-B (TensorBoard's Profile tab)

``tensorboard --logdir RUN_DIR/tensorboard`` (or ``tftoolkit tensorboard RUN_OR_SWEEP_DIR``) shows them; on a
sweep folder every point's runs appear side by side, and the HParams tab compares them: each run writes its
config as hyperparameters and its final figures as metrics (final/val_accuracy, final/loss, ...).

Everything is written from the host loop after the timed call has returned, as steps.csv is, so none of it is
in the throughput figures. Only the chief writes.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from ..errors import ConfigError

log = logging.getLogger("tftoolkit")

METRICS = ("val_accuracy", "val_loss", "final_loss", "images_per_sec")  # the HParams tab's columns


def trial_id(run_dir: Path) -> str:
    """The HParams trial id of a run: its directory's absolute path, unique however the run folders are named."""
    return str(Path(run_dir).resolve())


class Events:
    def __init__(self, logdir: Path):
        import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

        self.logdir = Path(logdir)
        self.train = tf.summary.create_file_writer(str(self.logdir / "train"))
        self.validation = tf.summary.create_file_writer(str(self.logdir / "validation"))

    def hparams(self, config: dict, run_id: str) -> None:
        """The run's config as HParams (scalars only; a list such as gpus as its text), as trial ``run_id``."""
        from tensorboard.plugins.hparams import api as hp  # imports TensorFlow

        values = {k: (v if isinstance(v, (bool, int, float, str)) else str(v)) for k, v in config.items()
                  if v is not None}
        with self.train.as_default():
            hp.hparams(values, trial_id=run_id)

    def steps(self, first_step: int, losses, learning_rates, step_time_s, images_per_sec, noise=None) -> None:
        """Per-step scalars at steps first_step + 1, ...: ``step_time_s`` and ``images_per_sec`` one per step or
        one for all (a loop call's)."""
        import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

        n = len(losses)
        _write_steps(self.train, first_step, losses, learning_rates, np.broadcast_to(step_time_s, n),
                     np.broadcast_to(images_per_sec, n))
        if noise is not None:
            with self.train.as_default():
                for i in range(n):
                    tf.summary.scalar("noise_scale", float(noise[i]), step=first_step + i + 1)

    def evaluation(self, step: int, loss: float, accuracy: float, metrics: dict | None = None) -> None:
        """The validation figures: loss, accuracy (a classification's; NaN, and so left out, for another task) and
        the run's given metrics by their names (``metrics``: name -> value)."""
        import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

        with self.validation.as_default():
            tf.summary.scalar("loss", loss, step=step)
            if math.isfinite(accuracy):
                tf.summary.scalar("accuracy", accuracy, step=step)
            for name, value in (metrics or {}).items():
                tf.summary.scalar(name, float(value), step=step)

    def final(self, summary: dict) -> None:
        """The run's outcome as the HParams tab's metrics (at the last step)."""
        import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

        with self.train.as_default():
            for name in METRICS:
                v = summary.get(name)
                if isinstance(v, (int, float)) and math.isfinite(v):
                    tf.summary.scalar(f"final/{name}", float(v), step=int(summary.get("steps") or 0))
        self.close()

    def close(self) -> None:
        for w in (self.train, self.validation):
            w.flush()
            w.close()


def profile_for_run(span, logdir: Path, total: int, resumed_from: int, traces: bool = True):
    """The Profile of ``span`` (profile_steps as (first, last), or None) in a run of ``total`` steps resumed after
    ``resumed_from``; None without a span or when this process ``traces`` not. A span outside the steps this
    process trains is a ConfigError."""
    if span is None:
        return None
    a, b = span
    if b > total or a <= resumed_from:
        where = f"this run has {total} steps" if b > total else f"this run resumes after step {resumed_from}"
        raise ConfigError(f"profile_steps {a}-{b} is outside the run: {where}; give steps between "
                          f"{resumed_from + 1} and {total}")
    return Profile(logdir, a, b) if traces else None


class Profile:
    """TensorFlow's profiler over steps ``first``..``last`` (1-based, inclusive) into ``logdir``."""

    def __init__(self, logdir: Path, first: int, last: int):
        self.logdir, self.first, self.last = Path(logdir), first, last
        self.active = False

    def before(self, first_step: int) -> None:
        """Called before each call of the compiled loop, with the step it starts after."""
        if first_step == self.first - 1 and not self.active:
            import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

            self.logdir.mkdir(parents=True, exist_ok=True)
            tf.profiler.experimental.start(str(self.logdir))
            self.active = True
            log.info("profiling steps %d-%d into %s", self.first, self.last, self.logdir)

    def covers(self, first_step: int, last_step: int) -> bool:
        return first_step < self.last and last_step >= self.first

    def after(self, last_step: int) -> None:
        if self.active and last_step >= self.last:
            self.stop()

    def stop(self) -> None:
        if self.active:
            import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

            tf.profiler.experimental.stop()
            self.active = False

    def traces(self) -> list[Path]:
        return sorted(self.logdir.glob("plugins/profile/*/*.xplane.pb"))


_COMPILED: dict = {}  # the compiled step writer: traced once per process, for every writer


def _write_steps(writer, first_step: int, losses, learning_rates, step_time_s, images_per_sec) -> None:
    """Events.steps' per-step scalars (loss, learning_rate, step_time_s, images_per_sec at steps first_step + 1,
    ...) for many steps in one compiled call. Eager ``tf.summary.scalar`` costs about 0.5 ms a scalar on 2 CPU
    cores, 2 ms a step: more than many a small model's step. Compiled, about 30 µs a step. The writer's resource
    is an argument (TensorFlow's own ``tf.summary.write`` passes ``writer._resource`` the same way), so the
    function is traced once, not once per run: a compiled ``tf.summary`` call keeps the writer it was traced
    with."""
    import tensorflow as tf  # deferred: session.start times TensorFlow's import (see training/run.py)

    if "write" not in _COMPILED:
        from tensorboard.plugins.scalar import metadata
        from tensorflow.python.ops import gen_summary_ops

        scalar = metadata.create_summary_metadata(display_name=None, description=None).SerializeToString()
        spec = tf.TensorSpec([None], tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([], tf.resource), tf.TensorSpec([], tf.int64), spec, spec, spec,
                                      spec])
        def write(handle, first, loss, lr, seconds, rate):
            for i in tf.range(tf.shape(loss, out_type=tf.int64)[0]):
                for tag, values in (("loss", loss), ("learning_rate", lr), ("step_time_s", seconds),
                                    ("images_per_sec", rate)):
                    gen_summary_ops.write_summary(handle, first + i + 1, values[i], tag, scalar)

        _COMPILED["write"] = write
    with tf.device("/cpu:0"):
        _COMPILED["write"](writer._resource, tf.constant(first_step, tf.int64),
                           *(np.asarray(a, np.float32) for a in (losses, learning_rates, step_time_s, images_per_sec)))
