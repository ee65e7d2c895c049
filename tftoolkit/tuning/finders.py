"""Finders that run under the same MirroredStrategy as training: a learning-rate range test and the
largest per-replica batch that fits in device memory.

``find_lr`` (Smith 2017, "Cyclical Learning Rates", §3.3; the fastai/Keras-tuner LR finder): train for a few
hundred steps while the LR grows exponentially from ``lr_min`` to ``lr_max``, stop once the smoothed loss
blows up (a running average over ``blowup`` × its minimum, or not finite), and suggest the LR where the
smoothed loss falls fastest per unit of log LR. The loss is smoothed for the suggestion by a *centred*
moving average: the EMA fastai smooths with lags by half its span, which on a 200-step sweep moves the
suggestion up by several times. The suggestion is the LR for the config's *global* batch; lr_find.json also gives
the ``--base-lr`` it corresponds to under the config's LR rule.

``find_batch``: the largest per-replica batch whose training step runs, by doubling from the config's
per-replica batch until a step fails with out-of-memory (``tf.errors.ResourceExhaustedError``), then
bisecting to within BATCH_PRECISION (on CPU the estimate's answer, checked by one step). The popular finders (Lightning's
``scale_batch_size``) refuse to run distributed; here each trial is one real step of the training loop on
every replica, so what fits is what training will use, all-reduce buffers included.

On GPUs the out-of-memory error is the authority, and the peak memory TensorFlow reports for the first
replica's GPU is recorded. ``memory_limit_mb`` then caps it further (say, to leave room for evaluation).
On CPU replicas there is no device memory to run out of (the host swaps, or the kernel kills the process),
so ``memory_limit_mb`` is required and means: a batch fits when the *estimated* training memory of one
replica stays under it (``memory.estimate_memory``: weights, gradients and optimizer slots, plus twice every
layer's output per example: kept for the backward pass, and its gradient). Batches under the limit still
run one real step, which catches a MemoryError from the host.

With ``target_global_batch`` G: the largest per-replica batch b <= the one that fits with G = b × replicas × K for
a whole K, the ``--accumulate`` K (config.accumulation_plan). Accumulation keeps a float32 sum of the gradients
(``estimate_memory``'s ``accumulator``): the CPU estimate counts it; on GPUs batch_find.json says what to leave free.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import RunConfig, accumulation_plan
from ..errors import ConfigError, ModelError
from ..planner.choices import BLOWUP, LR_MAX, LR_MIN, LR_STEPS, MAX_BATCH  # noqa: F401 - finders' names too
from ..planner.memory import estimate_memory
from .lr_range import blowup_index, centred_smooth, exponential_lrs, running_smooth, smoothing_window, suggest_lr

log = logging.getLogger("tftoolkit")

# find-batch bisects to within this share of the batch: each trial is a real step (bisecting to one example took
# 390 s on 2 cores, 2744 against 2745, 2746, 2748), and 3% of a batch changes no decision.
BATCH_PRECISION = 0.03
OOM_WORDS = ("out of memory", "oom", "failed to allocate", "resource exhausted")


# --- LR range test (its arithmetic: lr_range.py) ------------------------------------------------------------
def _exponential_schedule(lr_min, lr_max, steps):
    import keras
    from keras import ops

    class ExponentialSweep(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            frac = ops.cast(step, "float32") / float(max(steps - 1, 1))
            return lr_min * ops.power(lr_max / lr_min, frac)

        def get_config(self):
            return {"lr_min": lr_min, "lr_max": lr_max, "steps": steps}

    return ExponentialSweep()


def _prepare(config, data, quiet):
    from ..engine import session
    from ..logs import ensure_logging

    ensure_logging(quiet)
    sess = session.start(config, data)
    return sess.config, sess.setup, sess.source, sess.strategy


def _out_dir(out) -> Path:
    from ..fileio import ensure_dir

    return ensure_dir(out, "--out folder")


def find_lr(config: RunConfig | dict, out, *, lr_min: float = LR_MIN, lr_max: float = LR_MAX,
            steps: int = LR_STEPS, blowup: float = BLOWUP, data=None, quiet: bool = False, figures: bool = True) -> dict:
    """Exponential LR sweep under the strategy; writes lr_find.csv, lr_find.json, lr_find.png into ``out``."""
    from .. import fileio
    from ..data import pipeline
    from ..engine import loop
    from ..engine.step import build_engine

    if not (0 < lr_min < lr_max and math.isfinite(lr_max)):
        raise ConfigError(f"need 0 < lr_min < lr_max, got lr_min={lr_min}, lr_max={lr_max}")
    if steps < 10:
        raise ConfigError(f"an LR sweep needs at least 10 steps, got {steps}")
    if not blowup > 1:
        raise ConfigError(f"blowup must be > 1 (a multiple of the lowest loss), got {blowup}")
    config, setup, source, strategy = _prepare(config, data, quiet)
    out = _out_dir(out)
    spe = config.steps_per_epoch(source.train_examples)
    eng = build_engine(config, strategy, source, source.train_examples,
                       schedule=_exponential_schedule(lr_min, lr_max, steps))
    log.info("LR sweep %.3g -> %.3g over %d steps, global batch %d on %d replica(s)", lr_min, lr_max, steps,
             config.global_batch_size, setup.replicas)
    losses: list[float] = []
    stop, t0 = None, time.perf_counter()
    window = smoothing_window(steps)

    def on_loop(chunk) -> bool:
        nonlocal stop
        losses.extend(float(x) for x in chunk.outputs[0])
        stop = blowup_index(running_smooth(losses, window), blowup)
        return stop is not None

    # The sweep's data is the training order from step 0, however many epochs its steps span.
    loop.drive(eng.train_loop, lambda start: iter(pipeline.train_input(strategy, source, config, start)),
               start=0, total=steps, steps_per_epoch=spe, steps_per_loop=config.steps_per_loop, on_loop=on_loop)
    lrs = exponential_lrs(lr_min, lr_max, steps)[:len(losses)]
    keep = len(losses) if stop is None else stop + 1  # the first blown-up step stays in the table
    losses = np.asarray(losses[:keep], dtype=float)
    smoothed = np.full(keep, np.nan)
    upto = keep if stop is None else stop  # smooth only what came before the blow-up (it may be inf or NaN)
    smoothed[:upto] = centred_smooth(losses[:upto], window)
    frame = pd.DataFrame({"step": np.arange(1, keep + 1), "learning_rate": lrs[:keep], "loss": losses,
                          "smoothed_loss": smoothed})
    suggestion, why = suggest_lr(frame["learning_rate"].iloc[:stop], frame["smoothed_loss"].iloc[:stop],
                                 losses=frame["loss"].iloc[:stop], window=window,
                                 chance=math.log(source.num_classes) if (source.num_classes or 0) > 1 else math.nan)
    min_i = int(np.nanargmin(smoothed)) if np.isfinite(smoothed).any() else 0
    result = {
        "suggested_lr": suggestion, "suggestion": why,
        "suggested_base_lr": suggestion / config.lr_scale if math.isfinite(suggestion) else math.nan,
        # What to train with next: the suggestion as --base-lr, or the config's own when there is none.
        "base_lr_to_use": suggestion / config.lr_scale if math.isfinite(suggestion) else config.base_lr,
        "min_loss_lr": float(frame["learning_rate"].iloc[min_i]),
        "stopped_at_step": int(stop + 1) if stop is not None else None,
        "stop_reason": (f"smoothed loss above {blowup:g} x its minimum (or not finite) at LR "
                        f"{frame['learning_rate'].iloc[-1]:.3g}" if stop is not None else "reached lr_max"),
        "lr_min": lr_min, "lr_max": lr_max, "steps": steps, "steps_run": len(losses),
        "global_batch": config.global_batch_size, "replicas": setup.replicas, "lr_rule": config.lr_rule,
        "base_batch": config.base_batch, "optimizer": config.optimizer, "model": config.model,
        "seconds": time.perf_counter() - t0, "config": config.to_dict(),
        "note": "suggested_lr is for this global batch; suggested_base_lr is the --base-lr that the LR rule scales to it",
    }
    fileio.write_csv(out / "lr_find.csv", frame)
    fileio.write_json(out / "lr_find.json", result)
    if figures:
        from ..plots import batch as bplots
        from ..plots.theme import save_figure

        save_figure(bplots.lr_finder(frame, suggestion), out, "lr_find", formats=("png",))
    if math.isfinite(suggestion):  # without one, the result's "suggestion" says why (the CLI prints it once)
        log.info("suggested LR %.4g (%s); %s", suggestion, why, result["stop_reason"])
    result["frame"] = frame
    return result


# --- batch finder ----------------------------------------------------------------------------------------
def _is_oom(e: BaseException) -> bool:
    import tensorflow as tf

    if isinstance(e, (tf.errors.ResourceExhaustedError, MemoryError)):
        return True
    if isinstance(e, (tf.errors.InternalError, tf.errors.UnknownError)):
        text = str(e).lower()
        return any(w in text for w in OOM_WORDS)
    return False


class _Trials:
    """Runs one training step at a per-replica batch under the strategy and records whether it fit."""

    def __init__(self, eng, config, setup, source, strategy, limit_bytes):
        self.eng, self.config, self.setup, self.source, self.strategy = eng, config, setup, source, strategy
        self.limit = limit_bytes
        self.rows: list[dict] = []
        self.gpu = setup.kind == "GPU"

    def fits(self, b: int) -> bool:
        import tensorflow as tf

        from ..engine import timer

        est = estimate_memory(self.eng.model, b, self.config.optimizer, self.config.precision)
        row = {"trial": len(self.rows) + 1, "per_replica_batch": b, "fits": False, "memory_bytes": float(est["total"]),
               "memory_source": "estimate", "reason": "", "seconds": 0.0}
        t0 = time.perf_counter()
        if not self.gpu and self.limit is not None and est["total"] > self.limit:
            row["reason"] = f"estimated {est['total'] / 2**20:.1f} MiB > limit {self.limit / 2**20:.1f} MiB"
        else:
            device = self.setup.devices[0]
            try:
                if self.gpu:
                    tf.config.experimental.reset_memory_stats(device)
                shape = tuple(self.source.input_shape)
                one = (tf.zeros((b, *shape), tf.float32), tf.zeros([b], tf.int32))
                # A constant batch of b per replica: the step's memory depends on shapes, not values. Re-batched
                # so its batch dimension is unknown to the graph: one trace of the step serves every trial
                # (a static b would retrace it per trial, ~1 s each on CPU); the runtime shapes stay b.
                it = iter(self.strategy.distribute_datasets_from_function(
                    lambda ctx: tf.data.Dataset.from_tensors(one).repeat().unbatch().batch(b)))
                # Synchronised: a GPU reports running out of memory when the step runs, not when it is queued.
                timer.timed(self.eng.train_loop, it, tf.constant(1, tf.int32))
                row["fits"] = True
                if self.gpu:
                    row["memory_bytes"] = float(tf.config.experimental.get_memory_info(device)["peak"])
                    row["memory_source"] = "peak"
                    if self.limit is not None and row["memory_bytes"] > self.limit:
                        row["fits"] = False
                        row["reason"] = (f"peak {row['memory_bytes'] / 2**20:.1f} MiB > limit "
                                         f"{self.limit / 2**20:.1f} MiB")
            except Exception as e:  # noqa: BLE001 - only out-of-memory is an answer; anything else is re-raised
                if not _is_oom(e):
                    raise
                row["reason"] = f"out of memory: {type(e).__name__}"
        row["seconds"] = time.perf_counter() - t0
        self.rows.append(row)
        log.info("per-replica batch %d: %s%s", b, "fits" if row["fits"] else "does not fit",
                 f" ({row['reason']})" if row["reason"] else "")
        return row["fits"]


def search_batch(fits, start: int, max_batch: int = MAX_BATCH, precision: float = 0.0, known=None,
                 announce=None) -> tuple[int, bool]:
    """Largest b in [1, max_batch] with fits(b), by doubling (or halving) from ``start`` then bisecting.

    The bisection stops once the bracket is within ``precision`` of the batch that fits (0: one example).
    ``known(lo, hi)`` names the largest batch below ``hi`` an estimate says fits: one trial there replaces the
    bisection. ``announce(lo, hi, trials)`` hears the bracket and about how many trials are left. Returns (batch,
    capped); batch 0 when even 1 does not fit; capped when max_batch itself fits."""
    start = max(1, min(start, max_batch))
    if fits(start):
        lo, hi = start, None
        while hi is None:
            if lo >= max_batch:
                return max_batch, True
            nxt = min(lo * 2, max_batch)
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        hi, lo = start, 0
        while lo == 0:
            if hi == 1:
                return 0, False
            nxt = hi // 2
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
    guess = known(lo, hi) if known is not None else None
    if guess is not None and lo < guess < hi:
        if fits(guess):
            return guess, False  # guess + 1 is over the estimate: it does not fit, no trial needed
        hi = guess

    step = max(1, int(lo * precision))  # lo only grows: the bracket to reach is fixed here
    if announce is not None and hi - lo > step:
        announce(lo, hi, math.ceil(math.log2((hi - lo) / step)))
    while hi - lo > step:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, False


def find_batch(config: RunConfig | dict, out, *, memory_limit_mb: float | None = None, max_batch: int = MAX_BATCH,
               data=None, quiet: bool = False, figures: bool = True, target_global_batch: int | None = None) -> dict:
    """Largest per-replica batch that fits; writes batch_find.csv, batch_find.json, batch_find.png into ``out``.
    With ``target_global_batch``: also the per-replica batch and accumulate that reach it (``target``)."""
    from .. import fileio
    from ..engine.step import build_engine

    if memory_limit_mb is not None and not (memory_limit_mb > 0 and math.isfinite(memory_limit_mb)):
        raise ConfigError(f"--memory-limit-mb must be a number > 0, got {memory_limit_mb}")
    if max_batch < 1:
        raise ConfigError(f"--max-batch must be >= 1, got {max_batch}")
    config = config if isinstance(config, RunConfig) else RunConfig.from_dict(config)
    if config.accumulate != 1:
        raise ConfigError("find-batch tries one micro-batch per step: leave accumulate at 1, and give "
                          "--target-global-batch for the accumulate that reaches a larger global batch")
    fixed = config.per_replica_batch if target_global_batch is not None else None  # given by the user: keep it
    if target_global_batch is not None:
        # Bad input fails here, before any model is built (on the replica count given, if any).
        accumulation_plan(target_global_batch, config.replicas or 1, max_batch if fixed is None else None, fixed)
    config, setup, source, strategy = _prepare(config, data, quiet)
    if setup.kind != "GPU" and memory_limit_mb is None:
        raise ConfigError("these replicas are simulated on CPU, which has no device memory to run out of: give "
                          "--memory-limit-mb (a batch then fits while the estimated memory of one replica stays "
                          "under it)")
    out = _out_dir(out)
    limit = memory_limit_mb * 2**20 if memory_limit_mb is not None else None
    # One engine for every trial: only the batch shape changes (each new shape retraces the step). The loss
    # divisor stays the configured global batch, which changes the numbers, not the memory.
    eng = build_engine(config, strategy, source, source.train_examples)
    trials = _Trials(eng, config, setup, source, strategy, limit)
    t0 = time.perf_counter()
    est = estimate_memory(eng.model, 0, config.optimizer, config.precision)  # on CPU, the criterion in closed form:
    known = None if setup.kind == "GPU" or limit is None else (  # noqa: E731 - None: hi failed for a real reason
        lambda lo, hi: (lambda b: b if b < hi else None)(int((limit - est["fixed"]) // est["per_example"])))
    say = lambda lo, hi, n: log.info("%d fits, %d does not: about %d more trial(s) to within %.0f%%, ~%.0f s at the "  # noqa: E731
                                     "trials' pace", lo, hi, n, BATCH_PRECISION * 100, n * _pace(trials.rows))
    best, capped = search_batch(trials.fits, config.per_replica_batch_size, max_batch, BATCH_PRECISION, known, say)
    frame = pd.DataFrame(trials.rows, columns=["trial", "per_replica_batch", "fits", "memory_bytes", "memory_source",
                                               "reason", "seconds"])
    result = {
        "max_per_replica_batch": best, "capped_at_max_batch": capped, "replicas": setup.replicas,
        "max_global_batch": best * setup.replicas, "device_kind": setup.kind, "memory_limit_mb": memory_limit_mb,
        "criterion": ("out-of-memory error" + (" or peak memory over the limit" if limit else "")) if setup.kind == "GPU"
        else "estimated training memory of one replica under --memory-limit-mb (CPU: no device memory)",
        "estimate_fixed_bytes": est["fixed"], "estimate_per_example_bytes": est["per_example"],
        "trials": len(trials.rows), "seconds": time.perf_counter() - t0, "model": config.model,
        "precision": BATCH_PRECISION,
        "optimizer": config.optimizer, "precision": config.precision, "config": config.to_dict(),
    }
    plan_error = None
    if target_global_batch is not None and best > 0:
        try:
            result["target"] = _target(target_global_batch, setup, best, fixed, eng.model, config, limit)
        except ConfigError as e:  # the trials are still written: they say what fits
            plan_error = e
            result["target"] = {"global_batch": target_global_batch, "error": str(e)}
    fileio.write_csv(out / "batch_find.csv", frame)
    fileio.write_json(out / "batch_find.json", result)
    if figures and len(frame):
        from ..plots import batch as bplots
        from ..plots.theme import save_figure

        save_figure(bplots.batch_finder(frame, limit), out, "batch_find", formats=("png",))
    if best == 0:
        last = trials.rows[-1]
        raise ModelError(f"model {config.model} does not fit even at per-replica batch 1 ({last['reason']}); "
                         "use a smaller model or input size, mixed precision, or more memory"
                         + (" (--memory-limit-mb)" if limit else ""))
    if plan_error is not None:
        raise plan_error
    log.info("largest per-replica batch that fits: %d (global %d on %d replicas)%s", best, best * setup.replicas,
             setup.replicas, " - the --max-batch cap" if capped else "")
    result["frame"] = frame
    return result


def _pace(rows: list[dict]) -> float:  # mean seconds of the trials that ran a step
    return float(np.mean([r["seconds"] for r in rows if r["fits"] or r["reason"].startswith("out of memory")] or [0]))


def _target(global_batch: int, setup, best: int, fixed: int | None, model, config, limit: float | None) -> dict:
    """batch_find.json's ``target``: the per-replica batch and accumulate that reach ``global_batch``."""
    cpu = setup.kind != "GPU" and limit is not None

    def fits(b: int, k: int) -> bool:
        # On CPU the criterion is the estimate, which with K > 1 holds the gradients' float32 sum too.
        return not cpu or estimate_memory(model, b, config.optimizer, config.precision, k)["total"] <= limit

    plan = accumulation_plan(global_batch, setup.replicas, best, fixed, fits)
    k = plan["accumulate"]
    acc = estimate_memory(model, plan["per_replica_batch"], config.optimizer, config.precision, k)["accumulator"]
    if k == 1:
        memo = "no accumulation: one pass of the replicas holds it"
    elif cpu:
        memo = f"the memory estimate counts the {acc / 2**20:.3g} MiB float32 sum of the gradients accumulation adds"
    else:
        memo = (f"the trials ran one micro-step: accumulation adds a float32 sum of the gradients, {acc / 2**20:.3g} "
                "MiB per replica, not in their peak; leave that much free")
    return {**plan, "accumulator_bytes": acc, "memory": memo,
            "train_with": f"--replicas {plan['replicas']} --per-replica-batch {plan['per_replica_batch']}"
                          + (f" --accumulate {k}" if k > 1 else "")}
