"""One training run on the host side of the loop: the loop's timing, evaluation, checkpoints and divergence.

The engine (tftoolkit.engine) computes; this module decides when to call it and records what happened into the
run directory: config.json (written by ``api.train``), steps.csv, evals.csv and env.json (records.files), monitor.csv,
checkpoints/ and, last, summary.json (its fields from records.summary). In a multi-worker run every worker runs a
``Run`` (the collectives need all of them) but only the chief writes the run directory's files.

Nothing here runs inside the timed region: a loop's time is the call of the compiled loop alone
(``engine.loop.Chunk.seconds``); rows, counters, the divergence check and checkpoints come after it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

from .. import fileio, logs
from .. import summary as summary_schema
from ..data import pipeline
from ..data import service as service_mod
from ..data.bad_records import explain_error
from ..engine import devices, feed, loop, losses
from ..engine.checkpoint import Checkpoints
from ..engine.session import Session
from ..engine.step import build_engine
from ..errors import DataError, ToolkitError, error_line
from ..measure import breakdown
from ..measure.monitor.sampler import Monitor
from . import after_steps, records, signals
from .hooks import LoopHooks
from .tensorboard import Events, profile_for_run, trial_id

# TensorFlow is imported where it is used, not here: the CLI imports this module before the run's set-up, and
# engine.session.start times TensorFlow's import apart (wall_breakdown's import_s). The engine modules above defer
# it for the same reason (tests/training/test_records.py checks that importing this module leaves it out).

log = logging.getLogger("tftoolkit")


# One rule for signals, in training/signals.py: SIGTERM is taken as Ctrl-C; noted in the loop; held back after the
# last step until the summary is written.
Terminated, _Stop, stop_on_sigterm = signals.Terminated, signals.Stop, signals.stop_on_sigterm


class Run:
    """One training run of ``session`` into ``out``; ``execute()`` trains and returns the summary dict.

    ``worker_id``: this process's place in a multi-worker run (0 = the chief, which alone writes files).
    """

    def __init__(self, session: Session, out: Path, quiet: bool = False, worker_id: int = 0, workers: int = 1,
                 hosts: int = 1):
        self.session = session
        self.config, self.setup, self.source = session.config, session.setup, session.source
        self.derived = session.derived
        self.out, self.quiet = Path(out), quiet
        self.worker_id, self.chief = worker_id, worker_id == 0
        self.hosts = hosts  # distinct hosts among the workers (the peak FLOP/s of CPU workers)
        self.rows: list[dict] = []
        self.evals: list[dict] = []
        self.loop_times: list[tuple[float, int]] = []   # per timed loop: (seconds, steps)
        self.status, self.error = "ok", None
        self.started = session.started or time.time()
        # Wall-clock accounting (summary's wall_breakdown): each phase adds its seconds here.
        self.wall = dict.fromkeys(("import_s", "setup_s", "tracing_s", "train_steps_s", "host_loop_s", "evaluation_s",
                                   "checkpoints_s", "measurement_s", "teardown_s"), 0.0)
        self.first_call = None  # (seconds, steps) of the first loop call: tracing is in it
        self.input_capacity = {}  # measure.input.bench.probe's fields, once the run has trained
        self.events = self.profile = None  # set when the run starts (tensorboard events, the profiler)

    def execute(self) -> dict:
        self._log_plan()
        self._build()
        self._restore()
        setup = self.setup
        if self.chief:
            records.files.write_env(self.out, setup.kind, setup.devices)
        self._start_tensorboard()
        # The monitor samples GPUs (NVML) and the host (psutil) in a thread; it never fails a run.
        # Every worker samples its own host; the chief's file is the run's monitor.csv.
        name = "monitor.csv" if self.chief else f"monitor-worker{self.worker_id}.csv"
        self.monitor = Monitor(self.out / name, interval_s=0.5, gpu_indices=setup.gpu_indices, phase="warmup")
        self.finishing = signals.Deferred()  # from the last step to the summary (signals.py)
        try:
            with self.monitor:
                self._loop()
        except KeyboardInterrupt as e:
            self.finishing.restore()
            self._interrupted(e)
            self._finish()
            raise
        except ToolkitError:
            self.finishing.restore()
            raise
        except Exception as e:  # noqa: BLE001 - recorded in the summary (a sweep goes on), then re-raised
            self.finishing.restore()
            # A bad image or record a streamed split met (data/stream.py) is named in one line.
            bad = explain_error(e, list(self.source.streams.values())) if self.source.streamed else None
            self.status, self.error = "failed", bad or error_line(e)
            self._finish()
            if bad:
                raise DataError(bad) from None
            raise
        try:
            summary = self._finish()
        except KeyboardInterrupt as e:  # asked twice while measuring: the summary without what was not measured
            self._interrupted(e)
            self._finish()
            raise
        except BaseException:
            self.finishing.restore()
            raise
        self.finishing.end()  # a signal held back while the run measured and wrote its summary: honoured now
        return summary

    def _log_plan(self) -> None:
        """The run's devices and derived arithmetic, in the log before anything is built."""
        config, setup, derived = self.config, self.setup, self.derived
        sim = " (simulated: logical CPU devices sharing the host's cores)" if setup.kind == "CPU-simulated" else ""
        log.info("%d replica(s) on %s%s", setup.replicas, ", ".join(setup.devices), sim)
        acc = (f" x {config.accumulate} micro-batches accumulated (one all-reduce per optimizer step)"
               if config.accumulate > 1 else "")
        log.info("global batch %d = %d per replica x %d%s; lr %.4g = %.4g x %.4g (%s rule, base batch %d); "
                 "%d steps/epoch, %d steps, warmup %d steps",
                 derived["global_batch"], derived["per_replica_batch"], config.replicas, acc, derived["learning_rate"],
                 config.base_lr, derived["lr_scale"], config.lr_rule, config.base_batch, derived["steps_per_epoch"],
                 derived["total_steps"], derived["warmup_steps"])
        if self.source.streams:  # what --skip-bad-images skips is listed here, once each (records.summary.input_fields)
            for name, split in self.source.streams.items():
                if split.skip_bad:
                    split.skip_log = str(self.out / f"skipped-{name}{'' if self.chief else f'-worker{self.worker_id}'}.tsv")

    def _build(self) -> None:
        """The engine, its checks on a few real examples, the run's counters and its checkpoints."""
        import tensorflow as tf  # deferred: see the note at the imports

        config, setup, strategy = self.config, self.setup, self.session.strategy
        eng = build_engine(config, strategy, self.source, self.derived["train_examples"], model=self.session.model,
                           loss=self.session.loss, metrics=self.session.metrics,
                           feed=feed.make(config, setup, strategy, self.source))
        self.engine = eng
        if eng.task.classification and self.source.structured:
            losses.check_class_labels(self.source)
        if not eng.task.classification or eng.task.metrics:
            # The loss and metrics on a few real examples, before anything trains: what does not fit is one line
            # (the default classification loss fits by construction, but a metric added to it may not).
            losses.check(eng.task, eng.model, *pipeline.first_batch(self.source, min(4, self.source.train_examples)))
        self.state = {
            "step": tf.Variable(0, dtype=tf.int64, trainable=False),
            "counts": tf.Variable(tf.zeros([strategy.num_replicas_in_sync], tf.int64), trainable=False),
            "dropped": tf.Variable(0, dtype=tf.int64, trainable=False),
            "initial_loss": tf.Variable(float("nan"), dtype=tf.float32, trainable=False),
        }
        extra = eng.noise.checkpoint_items() if eng.noise is not None else {}
        self.checkpoints = Checkpoints(self.out / "checkpoints", {"model": eng.model, "optimizer": eng.optimizer,
                                                                 **self.state, **extra}, worker_id=self.worker_id)

    def _restore(self) -> None:
        """Resume from the latest checkpoint, if there is one, with the rows and the summary it left."""
        self.resumed_from = 0
        latest = self.checkpoints.restore_latest()
        # The previous process's summary, if it wrote one: the earlier segments of a resumed run.
        self.previous_summary = None
        if latest and (self.out / "summary.json").exists():
            try:
                self.previous_summary = summary_schema.read(self.out)
            except (OSError, ValueError):
                pass
        if latest:
            self.resumed_from = int(self.state["step"].numpy())
            self._reload_logs()
            log.info("resuming from step %d (%s)", self.resumed_from, latest)

    def _interrupted(self, e: KeyboardInterrupt) -> None:
        by = " by SIGTERM" if isinstance(e, Terminated) else ""
        step = int(self.state["step"].numpy())
        after = " while measuring after the last step (the measurement is not in this summary)" if (
            step >= self.derived["total_steps"]) else ""
        self.status = "interrupted"
        self.error = f"interrupted{by} at step {step}{after}; run the same command again to resume"

    def _start_tensorboard(self):
        config, total = self.config, self.derived["total_steps"]
        self.events = Events(self.out / "tensorboard") if self.chief else None
        if self.events is not None and self.resumed_from == 0:
            # One HParams session per run (a resumed run's first segment wrote it), under an id no other run has:
            # its directory. Every sweep point's run folder has the same name ("run"), and TensorBoard merges
            # sessions that share a trial id into one row.
            self.events.hparams(config.to_dict(), trial_id(self.out))
        # Every worker traces its own devices; the chief's trace is the one in the run directory.
        self.profile = profile_for_run(config.profile_range(), self.out / "tensorboard", total, self.resumed_from,
                                       self.chief)

    # --- the loop --------------------------------------------------------------------------------
    def _loop(self):
        config, eng, st = self.config, self.engine, self.state
        spe, total = self.derived["steps_per_epoch"], self.derived["total_steps"]
        start = int(st["step"].numpy())
        span = config.profile_range()
        n_calls = loop.calls(start, total, spe, config.steps_per_loop, config.checkpoint_every,
                             (span[0] - 1, span[1]) if span else ())
        self.warm_loops_left = loop.warm_calls(config.timing_warmup_steps, config.steps_per_loop, n_calls)
        if self.warm_loops_left * config.steps_per_loop < config.timing_warmup_steps and n_calls > 1:
            log.warning("the timing warm-up (--timing-warmup-steps %d) would cover all %d loop calls of this run: "
                        "images/sec is timed over its last %d call(s) instead (after %d untimed); more steps give "
                        "a steadier rate", config.timing_warmup_steps, n_calls, n_calls - self.warm_loops_left,
                        self.warm_loops_left)
        bar = logs.progress_bar(total, quiet=self.quiet, initial=start, unit="step", leave=False)
        hooks = LoopHooks(self, bar)  # what happens between the loop's calls (training/hooks.py)
        self.iterator = None
        t_drive = time.perf_counter()
        self.wall["import_s"] = self.session.import_s
        self.wall["setup_s"] = time.time() - self.started - self.session.import_s
        setup_before = self.wall["setup_s"]
        train_loop, self.watchdog = eng.train_loop, None
        if config.data_service:
            self.watchdog = service_mod.Watchdog(config.data_service, config.data_service_timeout, self._service_stalled)
            train_loop = self.watchdog.wrap(eng.train_loop)
        try:
            _Stop.deferring = config.workers == 1
            try:
                loop.drive(train_loop, hooks.make_iterator, start=start, total=total, steps_per_epoch=spe,
                           steps_per_loop=config.steps_per_loop, every=config.checkpoint_every,
                           breaks=(span[0] - 1, span[1]) if span else (), on_epoch_start=hooks.on_epoch_start,
                           before_call=hooks.before_call, on_loop=hooks.on_loop, on_epoch_end=hooks.on_epoch_end)
            finally:
                _Stop.deferring = False
            # Every step is trained (or the run diverged): a signal from here on (one during the last call or
            # evaluation, too) waits until the summary is written, and the steps are saved before it is measured.
            self.finishing.start(signal.SIGTERM if _Stop.requested else None)
            if self.status == "ok":
                self.checkpoint()
            if self.status == "ok" and start < total:
                # Both read on from the training input, so from the service too: the deadline still holds.
                with self.watchdog.watching() if self.watchdog else contextlib.nullcontext():
                    after_steps.probe_input(self)
                    if config.measure:  # the breakdown's rounds need the training iterator, released below
                        after_steps.measure_parts(self)
            elif self.status == "ok":  # a resume after the last checkpoint (a kill before the summary): no input ran
                after_steps.measure_what_was_trained(self, hooks)
        finally:
            if self.watchdog:
                self.watchdog.close()
            drive_s = time.perf_counter() - t_drive
            t0 = time.perf_counter()
            bar.close()
            self.iterator = None  # the one iterator of the run goes here: its teardown is timed
            if self.profile is not None:
                self.profile.stop()  # a run that stopped inside the range still leaves its trace
            self.wall["teardown_s"] += time.perf_counter() - t0
            inside = (self.wall["train_steps_s"] + self.wall["evaluation_s"] + self.wall["checkpoints_s"]
                      + self.wall["setup_s"] - setup_before + self.wall["measurement_s"])
            self.wall["host_loop_s"] = max(0.0, drive_s - inside)

    def _service_stalled(self, line: str) -> None:
        """The watchdog's call when the tf.data service has stalled the training call: that call is stuck in
        TensorFlow's client and cannot be joined or interrupted, so the run is recorded here, from the watchdog's
        thread (failed, with what the calls that returned trained), and the process ends. The checkpoints on disk
        stay what a rerun resumes from."""
        self.status, self.error = "failed", line
        try:
            self._finish()
        finally:
            try:
                log.error("failed: %s", line)
                logging.shutdown()  # flushes the log handlers; os._exit runs nothing else
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(1)  # whatever failed above: the stuck call would otherwise hold the process for ever

    # --- files ---------------------------------------------------------------------------------
    def _write_logs(self):
        if not self.chief:
            return
        steps = records.files.steps_frame(self.rows, records.files.row_columns(self.config.noise_scale),
                                        self.engine.schedule)
        records.files.write_logs(self.out, steps, self.evals,
                                 records.files.EVAL_COLUMNS + [f"val_{n}" for n in self.engine.task.metric_names])

    def _reload_logs(self):
        self.rows, self.evals = records.files.read_logs(self.out, self.resumed_from,
                                                        records.files.row_columns(self.config.noise_scale))

    def checkpoint(self):
        # Logs first: a resume keeps the rows up to the step it restores, so they must be on disk by the time
        # the checkpoint is; rows past a checkpoint that a kill left unfinished are dropped and trained again.
        t0 = time.perf_counter()
        self._write_logs()
        self.checkpoints.save(int(self.state["step"].numpy()))
        self.wall["checkpoints_s"] += time.perf_counter() - t0

    def _finish(self) -> dict:
        config, setup, st, eng = self.config, self.setup, self.state, self.engine
        t_finish = time.perf_counter()
        self._write_logs()
        step = int(st["step"].numpy())
        sess, src = self.session, self.source
        facts = {  # what the set-up found (records.summary.train_summary names each)
            "replicas": eng.strategy.num_replicas_in_sync, "hosts": self.hosts,
            "cross_device_ops": sess.cross_device_ops or sess.impl,
            "threads": devices.thread_settings(), "params": int(eng.model.count_params()),
            "gradient_bytes": eng.exchange.bytes(eng.model.trainable_variables), "allreduce_dtype": eng.exchange.dtype,
            "dataset": src.name, "train_examples": src.train_examples, "num_classes": src.num_classes,
            "jit_effective": sess.jit, "deterministic": sess.deterministic,
            "deterministic_reason": sess.deterministic_reason, "device_memory_peak_bytes": devices.memory_peaks(setup),
            "resumed_from_step": self.resumed_from, "examples_per_replica": [int(c) for c in st["counts"].numpy()],
            "dropped_examples": int(st["dropped"].numpy()), "data_placement": eng.feed.placement,
            "data_placement_reason": eng.feed.reason, "loss": eng.task.loss_name}
        streams = self.source.streams  # streamed or read into memory: each split counts and lists its own
        summary = records.summary.train_summary(
            config, setup, facts, status=self.status, error=self.error, steps=step,
            steps_per_epoch=self.derived["steps_per_epoch"], loop_times=self.loop_times, rows=self.rows,
            evals=self.evals, initial_loss=float(st["initial_loss"].numpy()), metric_names=eng.task.metric_names,
            worker_shard=bool(self.source.worker_shard), input_info=self.source.info, streamed=self.source.streamed,
            skipped=[split.skipped() for split in streams.values()] if streams else None,
            capacity=self.input_capacity,
            data_service=service_mod.describe_service(config.data_service) if config.data_service else None)
        self.wall["teardown_s"] += time.perf_counter() - t_finish
        t_measure = time.perf_counter()
        if eng.noise is not None:
            # Before measure: its extra steps on this engine would move the EMAs.
            rows = [r for r in self.rows if "noise_grad_sq" in r]
            summary.update(eng.noise.summary(
                small_batch=(config.global_batch_size / 2 if config.replicas == 1 and config.accumulate == 1
                             else config.per_replica_batch_size),
                big_batch=config.global_batch_size, grad_sq=[r["noise_grad_sq"] for r in rows],
                trace=[r["noise_trace"] for r in rows], final_loss=summary["final_loss_mean10"],
                classes=self.source.num_classes))
        if config.measure and self.status == "ok":
            # After the timed loop, on a snapshot: the trained weights stay.
            summary.update(breakdown.summary_fields(eng, config, setup, self.source, summary, hosts=self.hosts,
                                                    parts=getattr(self, "step_parts", None)))
        summary["monitor"] = records.summary.monitor_fields(
            self.out / "monitor.csv", loop_times=self.loop_times, global_batch=config.global_batch_size,
            share=setup.replicas / eng.strategy.num_replicas_in_sync) or {}
        self.wall["measurement_s"] += time.perf_counter() - t_measure
        summary.update(records.summary.wall_fields(summary, wall_time_s=time.time() - self.started, parts=self.wall,
                                                 first_call=self.first_call, resumed_from=self.resumed_from,
                                                 previous=self.previous_summary))
        if "measure_cost" in summary:  # what measuring cost, said where the user sees it
            summary["measure_share"] = breakdown.share(self.wall["measurement_s"], summary["wall_time_s"])
            log.info("%s", breakdown.cost_line(self.wall["measurement_s"], summary["wall_time_s"],
                                               summary["measure_cost"], summary["breakdown_rounds"],
                                               getattr(self, "step_parts", {}).get("steps_per_call", 0),
                                               summary.get("breakdown_method", ""), config.measure_budget))
        if self.profile is not None:
            summary["profiled_steps"] = config.profile_steps
            summary["profile_traces"] = [str(p.relative_to(self.out)) for p in self.profile.traces()]
        if self.events is not None:
            if self.status == "ok":
                self.events.final(summary)  # "final" figures only for a run that finished
            else:
                self.events.close()
        if self.chief:
            fileio.write_json(self.out / "summary.json", summary_schema.check(summary))
        if self.status == "ok" and self.chief and summary["input_verdict"]:
            log.info("input: %s", summary["input_note"])
        if self.status == "ok" and self.chief:  # one "done" line per run: the chief's, with the run's figures
            log.info("%s", records.summary.done_line(summary, timed_loops=len(self.loop_times), config=config,
                                                   classification=eng.task.classification, out=self.out))
        return summary
