"""The custom data-parallel training loop (strategy.run on distributed batches).

Why not ``model.fit``: Keras 3's fit is reported broken under MultiWorkerMirroredStrategy
(keras-team/keras#20585), and the measurements need the per-replica gradients and the all-reduce as
separate, visible steps.

The arithmetic that makes N replicas equal one device (tests/test_equivalence.py checks it):
each replica divides the *sum* of its per-example losses by the *global* batch size, so the gradients
summed across replicas by the all-reduce are exactly the gradient of the global-batch mean loss.
"""

from __future__ import annotations

import logging
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .data import catalog, pipeline
from . import devices, fileio, rundir, stats
from .config import RunConfig
from .errors import ConfigError, ToolkitError

log = logging.getLogger("tftoolkit")


def ensure_logging(quiet: bool = False) -> None:
    """Log to stderr when nobody configured the tftoolkit logger (CLI, notebooks, plain scripts)."""
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("tftoolkit: %(message)s"))
        log.addHandler(h)
        log.propagate = False
    log.setLevel(logging.WARNING if quiet else logging.INFO)


def resolve(config: RunConfig | dict) -> RunConfig:
    """Validate a config and fix the replica count for this machine."""
    if isinstance(config, dict):
        config = RunConfig.from_dict(config)
    if not isinstance(config, RunConfig):
        raise ConfigError(f"expected a RunConfig or a dict, got {type(config).__name__}")
    if config.replicas is None:
        # replicas counts every worker's: each runs the GPUs named, or all it has, or 1 replica on CPU
        config = config.replace(replicas=config.workers * devices.resolve_replicas(None, config.gpus))
    return config


def make_optimizer(config: RunConfig, schedule):
    import keras

    wd = config.weight_decay or None
    name = config.optimizer
    if name == "sgd":
        opt = keras.optimizers.SGD(schedule, weight_decay=wd)
    elif name == "momentum":
        opt = keras.optimizers.SGD(schedule, momentum=0.9, weight_decay=wd)
    elif name == "adam":
        opt = keras.optimizers.Adam(schedule, weight_decay=wd)
    elif name == "adamw":
        opt = keras.optimizers.AdamW(schedule, weight_decay=config.weight_decay)
    else:
        opt = keras.optimizers.Lamb(schedule, weight_decay=wd)
    if config.precision == "mixed_float16":
        # float16 gradients underflow without loss scaling; the wrapper also skips steps with inf/nan grads.
        opt = keras.optimizers.LossScaleOptimizer(opt)
    # The training step all-reduces the gradients itself (so it can be timed and the per-replica gradients
    # seen); Keras would all-reduce them a second time inside apply(), summing N copies. Turn that off.
    inner = getattr(opt, "inner_optimizer", opt)
    inner._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)
    return opt


@dataclass
class Engine:
    """Model, optimizer and the compiled step functions for one run, built inside the strategy's scope."""

    strategy: Any
    model: Any
    optimizer: Any
    schedule: Any
    train_loop: Any   # tf.function(iterator, n) -> (losses[n], examples per replica[R])
    evaluate: Any     # tf.function(dataset) -> (sum loss, correct, count)
    noise: Any = None  # noise.NoiseScale with --noise-scale: EMAs, and the latest loop's per-step values


def jit_effective(config: RunConfig, strategy) -> bool:
    """Whether the step is XLA-compiled: asked for, and not over several logical CPU devices.

    XLA maps every logical CPU device to one XLA CPU device, so a compiled step that touches replica 1's
    variables from replica 0's device fails ("tfvariable_on_a_different_device" in XLA's known issues).
    """
    if not config.jit:
        return False
    if strategy.num_replicas_in_sync > 1 and "GPU" not in strategy.extended.worker_devices[0].upper():
        log.warning("--jit ignored: XLA cannot compile one step across several simulated CPU replicas "
                    "(it works on GPUs, and on one CPU replica)")
        return False
    return True


def build_engine(config: RunConfig, strategy, source, train_examples: int, allreduce: bool = True,
                 schedule=None) -> Engine:
    """Build everything that lives on the devices. ``allreduce=False`` trains each replica on its own
    gradients (scaled as if summed): the same compute without communication, for the step-time breakdown.
    ``schedule`` replaces the config's learning-rate schedule (the LR finder's sweep).
    """
    import keras
    import tensorflow as tf

    from . import models, noise as noise_mod, schedules

    replicas = strategy.num_replicas_in_sync
    global_batch = config.global_batch_size
    partial = config.last_batch == "partial"
    with strategy.scope():
        model = models.build(config.model, source.input_shape, source.num_classes)
        if schedule is None:
            schedule = schedules.from_config(config, train_examples)
        optimizer = make_optimizer(config, schedule)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    # The noise scale needs the all-reduced gradient, so the compute-only engine (allreduce=False) skips it.
    noise = noise_mod.NoiseScale(replicas, model=model) if config.noise_scale and allreduce else None

    def forward_backward(images, labels, denom, reg_share=1.0):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = loss_fn(labels, logits)
            # Sum over this replica / global batch: summing these over replicas gives the global mean.
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=denom)
            if model.losses:
                # Regularisation is computed identically on every replica; divide by replicas so the sum
                # over replicas counts it once.
                loss += reg_share * tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, model.trainable_variables)

    def replica_step(images, labels):
        ctx = tf.distribute.get_replica_context()
        local_n = tf.shape(labels)[0]
        if partial:
            # A short last batch is split unevenly; divide by the true global count, not the nominal one.
            denom = ctx.all_reduce(tf.distribute.ReduceOp.SUM, local_n)
        else:
            denom = global_batch
        if noise is not None and replicas == 1:
            # One replica has no smaller batch to compare with: its two halves are the small batches.
            loss, grads, parts = noise_mod.two_halves(forward_backward, images, labels, denom)
        else:
            loss, grads = forward_backward(images, labels, denom)
            parts = [(grads, local_n)]
        if allreduce and noise is not None:
            # The replica's squared norm rides along in the gradient all-reduce: no extra collective.
            scale = noise_mod.loss_scale(optimizer)
            *grads, sums = ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                          list(grads) + [noise.replica_sums(parts, denom, scale)])
            estimate = noise.estimate(sums, grads, denom, scale)
        elif allreduce:
            # SUM, not MEAN: each replica's gradient is already divided by the global batch.
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        else:
            grads = [g * replicas for g in grads]
        optimizer.apply(grads, model.trainable_variables)
        if noise is not None:
            return loss, local_n, estimate
        return loss, local_n

    step_fn = tf.function(replica_step, jit_compile=True) if jit_effective(config, strategy) else replica_step

    local_replicas = len(strategy.extended.worker_devices)

    def all_counts(counts):
        """This worker's per-replica example counts -> every replica's, the same list on every worker."""
        if local_replicas == replicas:
            return counts

        def own(c):  # replica r of worker w is global replica w * local + r
            return c[tf.distribute.get_replica_context().replica_id_in_sync_group % local_replicas][None]

        return strategy.gather(strategy.run(own, args=(counts,)), axis=0)

    @tf.function
    def train_loop(iterator, n):
        losses = tf.TensorArray(tf.float32, size=n)
        counts = tf.zeros([local_replicas], tf.int64)
        noise_rows = tf.TensorArray(tf.float32, size=n if noise is not None else 0)
        for i in tf.range(n):
            images, labels, _ = next(iterator)
            out = strategy.run(step_fn, args=(images, labels))
            loss_pr, n_pr = out[0], out[1]
            losses = losses.write(i, tf.cast(strategy.reduce(tf.distribute.ReduceOp.SUM, loss_pr, axis=None), tf.float32))
            counts += tf.cast(tf.stack(strategy.experimental_local_results(n_pr)), tf.int64)
            if noise is not None:
                # Every replica computed the same estimate from all-reduced values; take the first.
                noise_rows = noise_rows.write(i, noise.update(strategy.experimental_local_results(out[2])[0]))
        if noise is not None:
            noise.last.assign(noise_rows.stack())
        return losses.stack(), all_counts(counts)

    def replica_eval(images, labels):
        logits = model(images, training=False)
        per_example = loss_fn(labels, logits)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32))
        return tf.reduce_sum(per_example), correct, tf.cast(tf.shape(labels)[0], tf.float32)

    @tf.function
    def evaluate(dist_dataset):
        total = tf.zeros([3], tf.float32)
        for images, labels, _ in dist_dataset:
            out = strategy.run(replica_eval, args=(images, labels))
            total += tf.stack([strategy.reduce(tf.distribute.ReduceOp.SUM, o, axis=None) for o in out])
        return total

    return Engine(strategy, model, optimizer, schedule, train_loop, evaluate, noise)


def _default_out(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{config.model.replace(':', '_').replace('.', '_')}-r{config.replicas}"


def _apply_global_settings(config: RunConfig, setup) -> None:
    import keras
    import tensorflow as tf

    from tensorflow.python.framework import config as tf_config  # disable_op_determinism is not exported

    keras.utils.set_random_seed(config.seed)
    # Op determinism is process-wide, so it is set (or unset) for every run: a notebook may sweep over both.
    if config.deterministic and config.jit:
        log.warning("--jit with --deterministic: XLA has no deterministic MaxPool gradient, so ops are left "
                    "non-deterministic for this run (data order and initial weights still follow --seed)")
        tf_config.disable_op_determinism()
    elif config.deterministic:
        tf.config.experimental.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()
    if config.precision == "mixed_float16" and setup.kind != "GPU":
        log.warning("mixed_float16 on CPU runs, but slowly: CPUs have no fast float16 math (use float32 or "
                    "mixed_bfloat16 here)")
    keras.mixed_precision.set_global_policy(config.precision)


def train(config: RunConfig | dict, out: str | Path | None = None, *, force: bool = False, quiet: bool = False,
          data=None) -> dict:
    """Train data-parallel as ``config`` says and write the run directory; returns the summary dict.

    ``data``: optional NumPy arrays (x, y) or (x, y, x_val, y_val) instead of ``config.dataset``.
    """
    ensure_logging(quiet)
    from . import multiworker

    config, cluster = multiworker.resolve(config)  # a cluster in TF_CONFIG or Slurm sets `workers`
    config = resolve(config)
    if config.workers > 1:
        return multiworker.train(config, cluster, out, force=force, quiet=quiet, data=data)
    setup = devices.init(config.replicas, config.gpus)
    source = catalog.load_source(config, data)
    n_train = source.train_examples
    derived = config.derived(n_train)
    out = Path(out) if out is not None else _default_out(config)
    out, resuming = rundir.prepare(out, config.to_dict(), force=force)
    fileio.write_json(out / "config.json", {"config": config.to_dict(), "derived": derived,
                                            "dataset": {"name": source.name, **source.info}})
    if resuming and (out / "summary.json").exists():
        previous = fileio.read_json(out / "summary.json")
        if previous.get("status") == "ok":
            log.info("%s already holds a finished run of this config; nothing to do", out)
            return previous

    run = _Run(config, setup, source, derived, out, quiet)
    return run.execute()


class _Run:
    """One training run: state on the host side of the loop (timing, logs, checkpoints, summary)."""

    def __init__(self, config, setup, source, derived, out, quiet, cluster=None, strategy=None):
        # Multi-worker (tftoolkit.multiworker): the strategy made when the cluster formed, and this worker's
        # place in it. Only the chief writes the run directory's files.
        self.cluster, self.premade = cluster, strategy
        self.chief = cluster is None or cluster.is_chief
        self.config, self.setup, self.source, self.derived, self.out, self.quiet = config, setup, source, derived, out, quiet
        self.rows: list[dict] = []
        self.evals: list[dict] = []
        self.loop_times: list[tuple[float, int]] = []   # per timed loop: (seconds, steps)
        self.status, self.error = "ok", None
        self.started = time.time()

    def execute(self) -> dict:
        import tensorflow as tf

        from .strategy import make_strategy

        config, setup, derived = self.config, self.setup, self.derived
        _apply_global_settings(config, setup)
        strategy, impl = self.premade or make_strategy(setup, config.cross_device_ops)
        self.impl = impl
        sim = " (simulated: logical CPU devices sharing the host's cores)" if setup.kind == "CPU-simulated" else ""
        log.info("%d replica(s) on %s%s", setup.replicas, ", ".join(setup.devices), sim)
        log.info("global batch %d = %d per replica x %d; lr %.4g = %.4g x %.4g (%s rule, base batch %d); "
                 "%d steps/epoch, %d steps, warmup %d steps",
                 derived["global_batch"], derived["per_replica_batch"], config.replicas, derived["learning_rate"],
                 config.base_lr, derived["lr_scale"], config.lr_rule, config.base_batch, derived["steps_per_epoch"],
                 derived["total_steps"], derived["warmup_steps"])
        eng = build_engine(config, strategy, self.source, derived["train_examples"])
        self.engine = eng
        self.state = {
            "step": tf.Variable(0, dtype=tf.int64, trainable=False),
            "counts": tf.Variable(tf.zeros([strategy.num_replicas_in_sync], tf.int64), trainable=False),
            "dropped": tf.Variable(0, dtype=tf.int64, trainable=False),
            "initial_loss": tf.Variable(float("nan"), dtype=tf.float32, trainable=False),
        }
        extra = eng.noise.checkpoint_items() if eng.noise is not None else {}
        ckpt = tf.train.Checkpoint(model=eng.model, optimizer=eng.optimizer, **self.state, **extra)
        from .multiworker import checkpoint_write_dir

        write_dir = checkpoint_write_dir(self.out / "checkpoints", self.cluster)
        if not self.chief:
            shutil.rmtree(write_dir, ignore_errors=True)  # left by a worker killed while saving
        self.manager = tf.train.CheckpointManager(ckpt, str(write_dir), max_to_keep=2)
        self.resumed_from = 0
        latest = tf.train.latest_checkpoint(str(self.out / "checkpoints"))  # every worker restores the chief's
        if latest:
            ckpt.restore(latest).assert_existing_objects_matched()
            self.resumed_from = int(self.state["step"].numpy())
            self._reload_logs()
            log.info("resuming from step %d (%s)", self.resumed_from, latest)
        if self.chief:
            self._write_env()
        from .monitor import Monitor

        # The monitor samples GPUs (NVML) and the host (psutil) in a thread; it never fails a run.
        # Every worker samples its own host; the chief's file is the run's monitor.csv.
        name = "monitor.csv" if self.chief else f"monitor-worker{self.cluster.worker_id}.csv"
        self.monitor = Monitor(self.out / name, interval_s=0.5, gpu_indices=setup.gpu_indices, phase="warmup")
        try:
            with self.monitor:
                self._loop()
        except KeyboardInterrupt:
            self.status, self.error = "failed", f"interrupted at step {int(self.state['step'].numpy())}; run the same command again to resume"
            self._finish()
            raise
        except ToolkitError:
            raise
        except Exception as e:  # noqa: BLE001 - recorded in the summary (a sweep goes on), then re-raised
            self.status, self.error = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._finish()
            raise
        return self._finish()

    def _write_env(self):
        import tensorflow as tf

        from . import hardware

        info = {"version": tf.__version__, **tf.sysconfig.get_build_info()}
        env = hardware.collect(tf_info=info)
        env["tftoolkit"] = {"device_kind": self.setup.kind, "devices": list(self.setup.devices),
                            "threads": devices.thread_settings()}
        fileio.write_json(self.out / "env.json", env)

    # --- the loop --------------------------------------------------------------------------------
    def _loop(self):
        import tensorflow as tf
        from tqdm.auto import tqdm

        config, eng, st = self.config, self.engine, self.state
        spe, total = self.derived["steps_per_epoch"], self.derived["total_steps"]
        step = int(st["step"].numpy())
        warm_loops_left = max(1, math.ceil(config.timing_warmup_steps / config.steps_per_loop))
        bar = tqdm(total=total, initial=step, unit="step", disable=self.quiet or not sys.stderr.isatty(),
                   dynamic_ncols=True, leave=False)
        dist_val = None
        try:
            while step < total and self.status == "ok":
                epoch, pos = divmod(step, spe)
                ds = pipeline.train_dataset(self.source, config, epoch, skip_batches=pos)
                iterator = iter(pipeline.distribute(eng.strategy, ds))
                epoch_start_count = int(st["counts"].numpy().sum()) - pos * config.global_batch_size
                while pos < spe and step < total:
                    n = min(config.steps_per_loop, spe - pos, total - step)
                    if config.checkpoint_every:
                        n = min(n, config.checkpoint_every - step % config.checkpoint_every)
                    t0 = time.perf_counter()
                    losses, counts = eng.train_loop(iterator, tf.constant(n, tf.int32))
                    losses = losses.numpy()  # waits for the devices: the time below is the loop's real time
                    dt = time.perf_counter() - t0
                    st["counts"].assign_add(counts)
                    if warm_loops_left > 0:
                        warm_loops_left -= 1
                        if not warm_loops_left:
                            self.monitor.phase("train")
                    else:
                        self.loop_times.append((dt, n))
                    noise_rows = eng.noise.last.numpy() if eng.noise is not None else None
                    for i, loss in enumerate(losses):
                        self.rows.append({"step": step + i + 1, "epoch": epoch, "loss": float(loss), "step_time_s": dt / n})
                        if noise_rows is not None:
                            self.rows[-1]["noise_scale"] = float(noise_rows[i, 2])
                    if math.isnan(float(st["initial_loss"].numpy())):
                        st["initial_loss"].assign(float(losses[0]))
                    step += n
                    pos += n
                    st["step"].assign(step)
                    bar.update(n)
                    bar.set_postfix(loss=f"{losses[-1]:.4f}")
                    if self._diverged(losses, step - n):
                        break
                    if config.checkpoint_every and step % config.checkpoint_every == 0 and step < total:
                        self._checkpoint()
                if pos == spe:  # a whole epoch went through: count what it did not train on
                    seen = int(st["counts"].numpy().sum()) - epoch_start_count
                    st["dropped"].assign_add(self.source.train_examples - seen)
                if self.status == "ok" and config.eval_every_epoch and (pos == spe or step == total):
                    if dist_val is None:
                        dist_val = self._eval_dataset()
                    self.monitor.phase("eval")
                    self._evaluate(dist_val, epoch, step)
                    self.monitor.phase("train" if warm_loops_left == 0 else "warmup")
        finally:
            bar.close()
        if self.status == "ok":
            self._checkpoint()

    def _diverged(self, losses, first_step) -> bool:
        start = float(self.state["initial_loss"].numpy())
        limit = self.config.divergence_factor * max(start, 1e-8)
        for i, loss in enumerate(losses):
            if not np.isfinite(loss) or loss > limit:
                what = f"loss became {loss}" if not np.isfinite(loss) else f"loss {loss:.4g} > {self.config.divergence_factor:g} x initial {start:.4g}"
                self.status, self.error = "diverged", f"{what} at step {first_step + i + 1}"
                log.warning("diverged: %s; stopping", self.error)
                return True
        return False

    def _eval_dataset(self):
        ds = pipeline.eval_dataset(self.source, self.config)
        return None if ds is None else pipeline.distribute(self.engine.strategy, ds)

    def _evaluate(self, dist_val, epoch, step):
        if dist_val is None:
            return
        loss_sum, correct, count = self.engine.evaluate(dist_val).numpy()
        row = {"epoch": epoch, "step": step, "val_loss": float(loss_sum / count), "val_accuracy": float(correct / count),
               "val_examples": int(count)}
        self.evals.append(row)
        log.info("epoch %d (step %d): val_loss %.4f, val_accuracy %.4f", epoch, step, row["val_loss"], row["val_accuracy"])

    # --- files ---------------------------------------------------------------------------------
    def _steps_frame(self):
        import pandas as pd


        df = pd.DataFrame(self.rows, columns=self._row_columns())
        if len(df):
            # The LR applied at step k (1-based) is the schedule at optimizer iteration k-1.
            lrs = np.asarray(self.engine.schedule(np.asarray(df["step"] - 1, dtype=np.float32)))
            df.insert(3, "learning_rate", lrs.astype(float))
        else:
            df.insert(3, "learning_rate", [])
        return df

    def _write_logs(self):
        if not self.chief:
            return
        import pandas as pd

        fileio.write_csv(self.out / "steps.csv", self._steps_frame())
        fileio.write_csv(self.out / "evals.csv",
                         pd.DataFrame(self.evals, columns=["epoch", "step", "val_loss", "val_accuracy", "val_examples"]))

    def _reload_logs(self):
        import pandas as pd

        step = self.resumed_from
        if (self.out / "steps.csv").exists():
            df = pd.read_csv(self.out / "steps.csv")
            self.rows = df[df["step"] <= step][self._row_columns()].to_dict("records")
        if (self.out / "evals.csv").exists():
            df = pd.read_csv(self.out / "evals.csv")
            self.evals = df[df["step"] <= step].to_dict("records")

    def _row_columns(self) -> list[str]:
        return ["step", "epoch", "loss", "step_time_s"] + (["noise_scale"] if self.config.noise_scale else [])

    def _checkpoint(self):
        # Every worker saves, since saving may run collectives; a non-chief saves into a temporary directory
        # and deletes it at once (TensorFlow's rule for multi-worker checkpoints: one copy survives).
        Path(self.manager.directory).mkdir(parents=True, exist_ok=True)
        self.manager.save(checkpoint_number=int(self.state["step"].numpy()))
        if not self.chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
        self._write_logs()

    def _monitor_summary(self, thr) -> dict:
        from . import monitor

        path = self.out / "monitor.csv"
        if not path.exists():
            return {}
        try:
            df = monitor.read_monitor(path)
            timed_s = sum(dt for dt, _ in self.loop_times)
            images = thr["timed_steps"] * self.config.global_batch_size
            return monitor.summarize(df, images=images or None, duration_s=timed_s or None, phase="train")
        except Exception as e:  # noqa: BLE001 - the monitor never fails a run
            log.warning("monitor summary skipped: %s", e)
            return {}

    def _finish(self) -> dict:
        config, setup, st = self.config, self.setup, self.state
        self._write_logs()
        step = int(st["step"].numpy())
        spe = self.derived["steps_per_epoch"]
        thr = stats.throughput([dt / n for dt, n in self.loop_times], config.global_batch_size)
        thr["timed_steps"] = sum(n for _, n in self.loop_times)
        last = self.evals[-1] if self.evals else {}
        losses = [r["loss"] for r in self.rows]
        summary = {
            "status": self.status,
            "error": self.error,
            "replicas": self.engine.strategy.num_replicas_in_sync,
            "workers": config.workers,
            "replicas_per_worker": setup.replicas,
            "device_kind": setup.kind,
            "devices": list(setup.devices),
            "cross_device_ops": self.impl,
            "threads": devices.thread_settings(),
            "model": config.model,
            "params": int(self.engine.model.count_params()),
            # What each step all-reduces (trainable variables only); tftoolkit predict scales from it.
            "gradient_bytes": int(sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                                      for v in self.engine.model.trainable_variables)),
            "dataset": self.source.name,
            "train_examples": self.source.train_examples,
            "per_replica_batch": config.per_replica_batch_size,
            "global_batch": config.global_batch_size,
            "learning_rate": config.learning_rate,
            "base_lr": config.base_lr,
            "base_batch": config.base_batch,
            "lr_rule": config.lr_rule,
            "optimizer": config.optimizer,
            "precision": config.precision,
            "jit": config.jit,
            "steps_per_epoch": spe,
            "steps": step,
            "epochs": step / spe,
            "resumed_from_step": self.resumed_from,
            "examples_per_replica": [int(c) for c in st["counts"].numpy()],
            "dropped_examples": int(st["dropped"].numpy()),
            **thr,
            "initial_loss": float(st["initial_loss"].numpy()),
            "final_loss": losses[-1] if losses else math.nan,
            "final_loss_mean10": float(np.mean(losses[-10:])) if losses else math.nan,
            "val_loss": last.get("val_loss", math.nan),
            "val_accuracy": last.get("val_accuracy", math.nan),
            "wall_time_s": time.time() - self.started,
        }
        if self.engine.noise is not None:
            # Before measure: its extra steps on this engine would move the EMAs.
            summary.update(self.engine.noise.summary(
                small_batch=config.global_batch_size / 2 if setup.replicas == 1 else config.per_replica_batch_size,
                big_batch=config.global_batch_size))
        if config.measure and self.status == "ok":
            from . import measure  # after the timed loop, on a snapshot: the trained weights stay as they are

            summary.update(measure.summary_fields(self.engine, config, setup, self.source, summary))
        summary["monitor"] = self._monitor_summary(thr)
        if self.chief:
            fileio.write_json(self.out / "summary.json", summary)
        if self.status == "ok":
            log.info("done: %d steps, %.1f ± %.1f images/sec, final loss %.4f, val_accuracy %s -> %s",
                     step, thr["images_per_sec"], thr["images_per_sec_uncertainty"] if thr["timed_steps"] > 1 else float("nan"),
                     summary["final_loss"], f"{summary['val_accuracy']:.4f}", self.out)
        return summary
