"""``RunRecorder``: a Keras callback that turns a user's own ``model.fit`` into a run directory.

    model.fit(x, y, epochs=5, callbacks=[tftoolkit.RunRecorder("runs/mine")])

RUN_DIR/ config.json  summary.json  steps.csv  evals.csv  monitor.csv  env.json  tensorboard/  .lock: the files
``tftoolkit.train`` writes, with its names and columns, so the report, the plots, ``tftoolkit tensorboard``,
``advise`` and ``predict`` read a recorded fit as they read a run of the toolkit's own loop. The folder is locked
and checked as ``train`` does it (``rundir.lock``, ``rundir.prepare``): a live run there refuses the fit; a
folder holding a different run is refused unless ``force=True``; the same fit recorded again replaces the old
record (a fit cannot resume). Under MultiWorkerMirroredStrategy only the chief writes; every worker makes the
same variable reads, since reading a metric's count all-reduces it across the workers.

What a callback sees in Keras 3 (3.15, TensorFlow backend: keras/src/backend/tensorflow/trainer.py):
- ``on_train_batch_begin(begin)`` / ``on_train_batch_end(end, logs)`` come once per call of the compiled train
  function, which runs ``steps_per_execution`` steps; ``end - begin + 1`` overstates the last call of an epoch
  that runs out of batches, so the optimizer's step counter, read once per epoch, corrects it. (Keras 3.15 on TF
  2.21 fails any ``steps_per_execution`` > 1 under a MirroredStrategy of 2+ replicas with "You must feed a value
  for placeholder tensor": keras-team/keras#19246; one replica or no strategy works.)
- ``self.params`` holds ``epochs``, ``steps`` (per epoch; None for data of unknown length) and ``verbose``, not
  the batch size. The global batch is ``global_batch=`` when given, else counted: Keras' loss tracker (the Mean
  named "loss" in ``model.metrics``) adds each replica's batch to its ``count``, which reads as the sum over the
  replicas; read once after the first call, it is that call's examples.
- ``logs["loss"]`` at a batch end is the running mean over the epoch so far, not the step's loss. A call's own
  mean loss is (m_k C_k - m_(k-1) C_(k-1)) / (C_k - C_(k-1)), m the running means and C the examples so far.
- No hook sees an exception: ``fit`` raises past the callbacks and never calls ``on_train_end``. So the recorder
  wraps ``model.train_function``, which ``fit`` looks up for every call: an exception in a step (out of memory, a
  bad batch) writes status failed, Ctrl-C status interrupted, before it goes on. A fit that ends in an exception
  elsewhere (another callback raising) is recorded as interrupted when this process records into that folder
  again, or exits.
- Overriding a batch-end hook makes Keras run the callbacks in the training thread (it hands them to a thread
  pool only when no callback needs them), so on GPUs the next call is launched once the previous one finished.

Timing: each call's time runs from the synchronised end of the previous call (or, for an epoch's first call,
from just before it) to its own synchronised end (``engine.timer.sync``, then the clock), divided by the steps it
ran. Keras' own work between calls (the other callbacks, a progress bar) is part of the fit, so it is in the
figure, and so is an epoch's first get-next from the iterator Keras makes for it; one sync per call is the
recorder's cost. The first ``warmup_steps`` (at least the first call: tracing) and an epoch's last call when its
batch was partial (another shape: a retrace, fewer examples) are not timed. Everything else (rows, TensorBoard
events, file writes) waits for the end of an epoch; the events of all its steps are written in one compiled call.
"""

from __future__ import annotations

import atexit
import logging
import math
import time
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from .. import fileio, rundir
from .. import summary as summary_schema
from ..engine import collectives
from ..engine import devices as devices_mod
from ..engine import timer
from ..engine.strategy import allreduce_name
from ..errors import ConfigError, error_line
from ..logs import ensure_logging
from ..measure.monitor.sampler import Monitor
from . import keras_facts, records
from .records.files import EVAL_COLUMNS, write_env
from .tensorboard import Events, trial_id

log = logging.getLogger("tftoolkit")

# RunConfig's defaults: rundir.prepare compares a folder's config.json with them filled in, so a recorded fit's
# config (which names none of RunConfig's fields but its own) is compared key by key with what is there.
DEFAULT_WARMUP_STEPS = rundir.config_defaults()["timing_warmup_steps"]
ABANDONED = ("the fit ended without Keras calling on_train_end: an exception outside a training step, or the "
             "process exited mid-fit")

_ACTIVE: dict[str, "RunRecorder"] = {}  # resolved run directory -> the recorder recording into it


def _finish_abandoned(out=None) -> None:
    """Finish, as interrupted, recordings whose fit ended without on_train_end (all of them, or ``out``'s)."""
    for key, rec in list(_ACTIVE.items()):
        if out is None or key == str(Path(out).resolve()):
            rec._finish("interrupted", ABANDONED)


atexit.register(_finish_abandoned)


class RunRecorder(keras.callbacks.Callback):
    """Record a ``model.fit`` into run directory ``out_dir`` (see the module docstring).

    ``global_batch``: examples per step over all replicas, when Keras' count cannot give it (a custom
    ``train_step`` that skips the loss tracker); checked against the count otherwise. ``warmup_steps``: steps
    left out of the throughput figures (default: RunConfig's ``timing_warmup_steps``). ``force``: overwrite a
    folder that holds a different run. After the fit, ``summary`` holds what summary.json holds.
    """

    def __init__(self, out_dir, *, global_batch: int | None = None, warmup_steps: int | None = None,
                 force: bool = False, monitor_interval_s: float = 0.5, quiet: bool = False):
        super().__init__()
        for name, value, least in (("global_batch", global_batch, 1), ("warmup_steps", warmup_steps, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ConfigError(f"RunRecorder {name} must be an integer >= {least} or None, got {value!r}")
        self.out = Path(out_dir)
        self.global_batch_given = global_batch
        self.warmup_steps = DEFAULT_WARMUP_STEPS if warmup_steps is None else warmup_steps
        self.force, self.quiet, self.monitor_interval_s = force, quiet, monitor_interval_s
        self.summary: dict | None = None
        self.config: dict | None = None
        self._active = False
        self._lock = self._monitor = self._events = None

    # --- the fit begins ----------------------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        ensure_logging(self.quiet)
        _finish_abandoned(self.out)  # a fit into this folder that raised outside a step: recorded, lock released
        self._started = time.time()
        model, strategy = self.model, self.model.distribute_strategy
        self._replicas = int(strategy.num_replicas_in_sync)
        asked = devices_mod.configured()
        if asked is not None and asked != self._replicas:
            log.warning("the strategy runs %d replica(s) but tftoolkit.init_devices set up %d device(s): this fit is "
                        "recorded at %d; pass the devices to MirroredStrategy to run another count", self._replicas,
                        asked, self._replicas)
        self._devices, self._gpus = keras_facts.fit_devices(strategy)
        self._kind = "GPU" if self._gpus else "CPU-simulated"
        self._writes = bool(strategy.extended.should_checkpoint)  # MultiWorkerMirroredStrategy: the chief alone
        self._optimizer = model.optimizer
        self._iter0 = int(self._optimizer.iterations.numpy())
        self._loss_tracker = next((m for m in model.metrics if m.name == "loss" and hasattr(m, "count")), None)
        self.config = self._config(model, strategy)
        self._global_batch = self.global_batch_given
        self._calls, self.rows, self.evals, self.loop_times = [], [], [], []
        self._steps, self._epoch_logs, self._val_examples = 0, {}, None
        self._epoch_steps = self._epoch_examples = None  # the first whole epoch's, counted
        self._closed, self._mark, self._first = True, None, True
        if self._writes:
            self._lock = rundir.lock(self.out)
            try:
                _, same = rundir.prepare(self.out, {**rundir.config_defaults(), **self.config}, force=self.force)
                if same:  # a fit cannot resume: the same fit recorded again replaces the record
                    log.info("%s held a record of this same fit; recording it again", self.out)
                    rundir.clear(self.out)
                fileio.write_json(self.out / "config.json", rundir.config_record(self.config, recorder={
                    "warmup_steps": self.warmup_steps, "global_batch_given": self.global_batch_given,
                    "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self._started))}))
                write_env(self.out, self._kind, self._devices)
                self._events = Events(self.out / "tensorboard")
                self._events.hparams(self.config, trial_id(self.out))
                self._monitor = Monitor(self.out / "monitor.csv", interval_s=self.monitor_interval_s,
                                        gpu_indices=devices_mod.nvml_indices(self._gpus) if self._gpus else None,
                                        phase="warmup").start()
            except BaseException:
                self._release()
                raise
        self._wrap_train_function()
        self._active = True
        _ACTIVE[str(self.out.resolve())] = self
        log.info("recording this fit into %s: %d replica(s) on %s, %s", self.out, self._replicas,
                 ", ".join(self._devices), self.config["strategy"])

    def _config(self, model, strategy) -> dict:
        """What defines the recorded fit (config.json's "config": its identity, as a RunConfig is a run's)."""
        compiled = model.get_compile_config() or {}
        opt = self._optimizer
        schedule = getattr(getattr(opt, "inner_optimizer", opt), "_learning_rate", None)
        return {
            "recorded_with": "tftoolkit.RunRecorder",
            "model": model.name,
            "params": int(model.count_params()),
            "optimizer": keras_facts.optimizer_name(opt),
            "learning_rate": keras_facts.read_lr(opt),
            "lr_schedule": type(schedule).__name__
            if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule) else None,
            "loss": keras_facts.names_of(compiled.get("loss")),
            "metrics": keras_facts.names_of(compiled.get("metrics")),
            "strategy": "default" if type(strategy).__name__.startswith("_Default") else type(strategy).__name__,
            "replicas": self._replicas,
            "workers": keras_facts.fit_workers(strategy),
            "hosts": keras_facts.fit_hosts(strategy),
            "global_batch": self.global_batch_given,
            "epochs": self.params.get("epochs"),
            "steps_per_epoch": self.params.get("steps"),
            "steps_per_execution": int(getattr(model, "steps_per_execution", 1) or 1),
            "jit_compile": bool(getattr(model, "jit_compile", False)),
            "precision": model.dtype_policy.name,
        }

    def _wrap_train_function(self):
        """Route fit's calls through a function that records an exception before it propagates (see above)."""
        inner, rec = self.model.train_function, self

        def train_function(iterator):
            try:
                return inner(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):  # the end of the data: fit's normal way out
                raise
            except KeyboardInterrupt:
                rec._finish("interrupted", f"interrupted after step {rec._steps}")
                raise
            except BaseException as e:
                rec._finish("failed", f"{error_line(e)} (after step {rec._steps})")
                raise

        self._wrapped = (inner, train_function)
        self.model.train_function = train_function

    # --- every call: one device sync and the clock, nothing else ----------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._last_end, self._mark, self._closed, self._calls = epoch, -1, None, False, []
        self._closed_epoch = (0, math.nan)

    def on_train_batch_begin(self, batch, logs=None):
        if self._mark is None:  # the epoch's first call (the LR is read here, after other callbacks set it)
            self._epoch_lr = keras_facts.read_lr(self._optimizer)
            timer.sync()
            self._mark = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        timer.sync()  # the call's work has finished on every device before the clock is read
        now = time.perf_counter()
        steps = self.params.get("steps")
        end = min(batch, steps - 1) if steps else batch
        n, warm = end - self._last_end, self._steps < self.warmup_steps or self._first
        self._calls.append([n, now - self._mark, (logs or {}).get("loss", math.nan), warm])
        self._last_end, self._mark, self._steps = end, now, self._steps + n
        if self._first:
            self._first = False
            self._count_global_batch(n)
        if warm and self._steps >= self.warmup_steps and self._monitor is not None:
            self._monitor.phase("train")  # the next call is timed

    def _count_global_batch(self, n: int) -> None:
        counted = self._examples() / n if self._loss_tracker is not None else math.nan
        if self._global_batch is None:
            if counted > 0:
                self._global_batch = int(round(counted))
            else:
                log.warning("RunRecorder: the global batch is unknown (the model's loss tracker counted nothing: a "
                            "custom train_step?); pass RunRecorder(..., global_batch=N) for images/sec")
        elif counted > 0 and abs(counted - self._global_batch) > 0.5:
            log.warning("RunRecorder: global_batch=%d was given, but the first step trained %.0f examples",
                        self._global_batch, counted)

    def _examples(self) -> float:
        return float(self._loss_tracker.count.numpy())  # summed over the replicas (a SyncOnRead variable)

    # --- the end of an epoch: rows, events, evaluations ---------------------------------------------------------
    def on_test_begin(self, logs=None):
        if self._active:
            self._close_epoch()  # before evaluate resets the loss tracker
            if self._monitor is not None:
                self._monitor.phase("eval")

    def on_test_end(self, logs=None):
        if self._active:
            self._val_examples = int(self._examples()) if self._loss_tracker is not None else None
            if self._monitor is not None:
                self._monitor.phase("warmup" if self._steps < self.warmup_steps else "train")

    def on_epoch_end(self, epoch, logs=None):
        if not self._active:
            return
        self._close_epoch()
        steps, examples = self._closed_epoch
        if self._epoch_steps is None and steps:
            self._epoch_steps, self._epoch_examples = steps, examples
        self._epoch_logs = dict(logs or {})
        val = {k: float(v) for k, v in self._epoch_logs.items() if k.startswith("val_")}
        if val:
            row = {"epoch": epoch, "step": self._steps, **val, "val_examples": self._val_examples}
            self.evals.append(row)
            if self._events is not None:
                given = {k[4:]: v for k, v in val.items()}
                self._events.evaluation(self._steps, given.pop("loss", math.nan), given.pop("accuracy", math.nan),
                                        given)

    def _close_epoch(self, read: bool = True) -> None:
        """Turn the epoch's calls into rows and timed loops (once per epoch: two variable reads); the epoch's
        (steps, examples) go to ``_closed_epoch``. ``read=False`` after a failure: no variable is read (under
        MultiWorkerMirroredStrategy reading the count all-reduces, and the other workers may be gone)."""
        if self._closed or not self._calls:
            self._closed = True
            return
        self._closed = True
        calls, B = self._calls, self._global_batch
        over, examples = 0, math.nan
        if read:
            over = self._steps - (int(self._optimizer.iterations.numpy()) - self._iter0)
            examples = self._examples() if self._loss_tracker is not None else math.nan
        if 0 < over < calls[-1][0]:  # the last call ran out of batches before steps_per_execution
            calls[-1][0] -= over
            self._steps -= over
        steps = sum(c[0] for c in calls)
        partial = B is not None and examples < steps * B - 0.5
        # Examples so far in the epoch after each call, for the running means (the last batch may be partial).
        cum = np.cumsum([c[0] * (B or 1) for c in calls], dtype=float)
        if partial:
            cum[-1] = examples
        first = self._steps - steps
        prev_sum = prev_c = 0.0
        rows = []
        lrs = keras_facts.lrs_at(self._optimizer, self._iter0 + first + np.arange(steps), self._epoch_lr)
        for i, (n, dt, mean, warm) in enumerate(calls):
            call_loss = (mean * cum[i] - prev_sum) / (cum[i] - prev_c) if cum[i] > prev_c else math.nan
            prev_sum, prev_c = mean * cum[i], cum[i]
            if not warm and not (partial and i == len(calls) - 1):
                self.loop_times.append((dt, n))
            for _ in range(n):
                rows.append({"step": first + len(rows) + 1, "epoch": self._epoch, "loss": call_loss,
                             "learning_rate": float(lrs[len(rows)]), "step_time_s": dt / n})
        self.rows += rows
        if self._events is not None and rows:
            ips = [B / r["step_time_s"] if B else math.nan for r in rows]
            self._events.steps(first, [r["loss"] for r in rows], lrs[:len(rows)], [r["step_time_s"] for r in rows],
                               ips)
        self._calls = []
        self._closed_epoch = (steps, examples)

    # --- the end ------------------------------------------------------------------------------------------------
    def on_train_end(self, logs=None):
        if not self._active:
            return
        self._close_epoch()
        last = self.rows[-1]["loss"] if self.rows else math.nan
        if self.rows and not math.isfinite(last):
            self._finish("diverged", f"loss became {last} at step {self.rows[-1]['step']}")
        else:
            self._finish("ok", None)

    def _finish(self, status: str, error: str | None) -> None:
        if not self._active:
            return
        self._active = False
        _ACTIVE.pop(str(self.out.resolve()), None)
        if getattr(self.model, "train_function", None) is self._wrapped[1]:
            self.model.train_function = self._wrapped[0]
        try:
            self._close_epoch(read=status in ("ok", "diverged"))
            if self._monitor is not None:
                self._monitor.stop()
            self.summary = self._summary(status, error)
            if self._writes:
                fileio.write_csv(self.out / "steps.csv", pd.DataFrame(
                    self.rows, columns=["step", "epoch", "loss", "learning_rate", "step_time_s"]))
                if self.evals:
                    cols = EVAL_COLUMNS + sorted({k for r in self.evals for k in r} - set(EVAL_COLUMNS))
                    fileio.write_csv(self.out / "evals.csv", pd.DataFrame(self.evals, columns=cols))
                if self._events is not None:
                    self._events.final(self.summary) if status == "ok" else self._events.close()
                fileio.write_json(self.out / "summary.json", summary_schema.check(self.summary))
                self._log_done()
        finally:
            self._release()

    def _release(self) -> None:
        if self._monitor is not None:
            self._monitor.stop()
        if self._lock is not None:
            self._lock.release()
        self._lock = self._monitor = self._events = None

    def _summary(self, status: str, error: str | None) -> dict:
        model, replicas = self.model, self._replicas
        facts = {
            "replicas": replicas, "workers": self.config["workers"], "hosts": self.config.get("hosts", 1),
            "replicas_per_worker": len(self._devices),
            "device_kind": self._kind, "devices": self._devices,
            "cross_device_ops": allreduce_name(model.distribute_strategy) if replicas > 1 else None,
            "threads": devices_mod.thread_settings(),
            "device_memory_peak_bytes": keras_facts.memory_peaks(self._kind, self._devices),
            "model": model.name, "params": int(model.count_params()),
            # What each step all-reduces (trainable variables only, each in its own dtype); predict scales from it.
            "gradient_bytes": collectives.gradient_bytes(model.trainable_variables),
            **{k: self.config[k] for k in ("precision", "jit_compile", "optimizer", "loss", "metrics",
                                           "learning_rate")},
        }
        summary = records.summary.fit_summary(
            facts, status=status, error=error, steps=self._steps,
            steps_per_epoch=self.params.get("steps") or self._epoch_steps, global_batch=self._global_batch,
            loop_times=self.loop_times, rows=self.rows, evals=self.evals, epoch_logs=self._epoch_logs,
            train_examples=self._epoch_examples)
        if self._writes:  # this worker's GPUs: its replicas' share
            found = records.summary.monitor_fields(self.out / "monitor.csv", loop_times=self.loop_times,
                                                 global_batch=self._global_batch, share=len(self._devices) / replicas)
            if found is not None:
                summary["monitor"] = found
        summary["wall_time_s"] = time.time() - self._started
        return summary

    def _log_done(self) -> None:
        level, line = records.summary.recorded_line(self.summary, timed_loops=len(self.loop_times),
                                                  warmup_steps=self.warmup_steps, out=self.out)
        log.log(level, "%s", line)
