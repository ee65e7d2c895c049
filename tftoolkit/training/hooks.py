"""What a run does between calls of its compiled loop: engine.loop.drive's hooks for one ``run.Run``.

After each call (``on_loop``): its time, the step rows, TensorBoard's events, the divergence check, a checkpoint when
one is due, a stop when SIGTERM asked. At an epoch's end (``on_epoch_end``): the examples the epoch dropped, the
evaluation, the checkpoint. Nothing here runs inside the timed region: a call's time is the call alone
(``engine.loop.Chunk.seconds``).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from ..data import pipeline
from ..engine import loop
from . import signals

log = logging.getLogger("tftoolkit")


class LoopHooks:
    """The hooks of ``run``'s loop (``run.Run._loop`` hands them to engine.loop.drive), with its progress ``bar``."""

    def __init__(self, run, bar):
        self.run, self.bar = run, bar
        self.config, self.state = run.config, run.state
        self.spe, self.total = run.derived["steps_per_epoch"], run.derived["total_steps"]
        self.epoch_start_count: dict[int, int] = {}
        self.dist_val = None  # the validation input, made at the first evaluation

    def make_iterator(self, start_step):
        run = self.run
        # Held by the run, not only by the drive, so its release is timed (teardown) rather than hidden.
        t0 = time.perf_counter()
        run.iterator = iter(run.engine.feed.train_input(run.engine.strategy, run.source, self.config, start_step))
        run.wall["setup_s"] += time.perf_counter() - t0  # building the input pipeline is set-up
        return run.iterator

    def on_epoch_start(self, epoch, pos):
        # Examples counted before this epoch began: what the epoch trains on decides what it dropped.
        self.epoch_start_count[epoch] = int(self.state["counts"].numpy().sum()) - pos * self.config.global_batch_size

    def before_call(self, step, n):
        if self.run.profile is not None:
            self.run.profile.before(step)

    def on_loop(self, chunk: loop.Chunk) -> bool:
        run, config, st = self.run, self.config, self.state
        losses, counts = chunk.outputs
        n, step = chunk.steps, chunk.last_step
        run.wall["train_steps_s"] += chunk.seconds
        if run.first_call is None:
            run.first_call = (chunk.seconds, n)
        st["counts"].assign_add(counts)
        profiled = run.profile is not None and run.profile.covers(chunk.first_step, step)
        if run.profile is not None:
            run.profile.after(step)
        was_warm = run.warm_loops_left > 0
        if was_warm:
            run.warm_loops_left -= 1
            if not run.warm_loops_left:
                run.monitor.phase("train")
        timed = not was_warm and not profiled
        if timed:  # a traced call runs slower: it is no measure of throughput
            run.loop_times.append((chunk.seconds, n))
        self.record(chunk, timed)
        if math.isnan(float(st["initial_loss"].numpy())):
            st["initial_loss"].assign(float(losses[0]))
        st["step"].assign(step)
        self.bar.update(n)
        self.bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if self.diverged(losses, chunk.first_step):
            return True
        # A checkpoint at an epoch's end waits for on_epoch_end: it must hold the epoch's dropped count and
        # follow its evaluation, or a kill between them loses both for good (the resume starts after the epoch).
        if step % self.spe and step < self.total and (self.save_due(step) or signals.Stop.requested):
            run.checkpoint()
        if signals.Stop.requested and step % self.spe:
            # SIGTERM arrived during this call: its steps are counted and saved; stop. Only one process can
            # decide this alone: the workers of a multi-worker run must all stop at the same step.
            raise signals.Terminated()
        return False

    def record(self, chunk: loop.Chunk, timed: bool) -> None:
        """The call's step rows (steps.csv; ``timed``: the call counts in images/sec) and TensorBoard's step
        events."""
        run, losses, n = self.run, chunk.outputs[0], chunk.steps
        noise_rows = run.engine.noise.last.numpy() if run.engine.noise is not None else None
        for i, loss in enumerate(losses):
            run.rows.append({"step": chunk.first_step + i + 1, "epoch": chunk.epoch, "loss": float(loss),
                             "step_time_s": chunk.seconds / n, "call": chunk.first_step + 1, "timed": int(timed)})
            if noise_rows is not None:
                run.rows[-1].update(noise_grad_sq=float(noise_rows[i, 0]), noise_trace=float(noise_rows[i, 1]),
                                    noise_scale=float(noise_rows[i, 2]))
        if run.events is not None:
            lrs = np.asarray(run.engine.schedule(np.arange(chunk.first_step, chunk.last_step, dtype=np.float32)))
            run.events.steps(chunk.first_step, losses, lrs, chunk.seconds / n,
                             n * self.config.global_batch_size / chunk.seconds,
                             noise_rows[:, 2] if noise_rows is not None else None)

    def save_due(self, step):
        return bool(self.config.checkpoint_every) and step % self.config.checkpoint_every == 0

    def on_epoch_end(self, epoch, step, complete, stopped):
        run, config, st = self.run, self.config, self.state
        if complete:  # a whole epoch went through: count what it did not train on
            seen = int(st["counts"].numpy().sum()) - self.epoch_start_count[epoch]
            st["dropped"].assign_add(run.source.train_examples - seen)
        if run.status == "ok" and config.eval_every_epoch and (complete or step == self.total):
            if self.dist_val is None:
                self.dist_val = pipeline.eval_input(run.engine.strategy, run.source, config)
            run.monitor.phase("eval")
            t0 = time.perf_counter()
            self.evaluate(self.dist_val, epoch, step)
            run.wall["evaluation_s"] += time.perf_counter() - t0
            run.monitor.phase("train" if run.warm_loops_left == 0 else "warmup")
        if complete and not stopped and step < self.total and (self.save_due(step) or signals.Stop.requested):
            run.checkpoint()
        if signals.Stop.requested and not stopped and step < self.total:
            raise signals.Terminated()

    def diverged(self, losses, first_step) -> bool:
        run = self.run
        start = float(self.state["initial_loss"].numpy())
        factor = self.config.divergence_factor
        limit = factor * max(start, 1e-8)
        for i, loss in enumerate(losses):
            if not np.isfinite(loss) or loss > limit:
                what = f"loss became {loss}" if not np.isfinite(loss) else f"loss {loss:.4g} > {factor:g} x initial {start:.4g}"
                run.status, run.error = "diverged", f"{what} at step {first_step + i + 1}"
                log.warning("diverged: %s; stopping", run.error)
                return True
        return False

    def evaluate(self, dist_val, epoch, step):
        if dist_val is None:
            return
        run = self.run
        task = run.engine.task
        for m in task.metrics:
            m.reset_state()
        loss_sum, correct, count = run.engine.evaluate(dist_val).numpy()
        metrics = {f"val_{m.name}": float(np.asarray(m.result())) for m in task.metrics}
        row = {"epoch": epoch, "step": step, "val_loss": float(loss_sum / count),
               "val_accuracy": float(correct / count) if task.classification else math.nan, "val_examples": int(count),
               **metrics}
        run.evals.append(row)
        if run.events is not None:
            run.events.evaluation(step, row["val_loss"], row["val_accuracy"], {k[4:]: v for k, v in metrics.items()})
        shown = {**({"val_accuracy": row["val_accuracy"]} if task.classification else {}), **metrics}
        log.info("epoch %d (step %d): val_loss %.4f%s", epoch, step, row["val_loss"],
                 "".join(f", {k} {v:.4f}" for k, v in shown.items()))
