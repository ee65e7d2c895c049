"""The compiled data-parallel step: model, optimiser, and the tf.functions that train (evaluation: evaluate.py).

Why not ``model.fit``: Keras 3's fit is reported broken under MultiWorkerMirroredStrategy
(keras-team/keras#20585), and the measurements need the per-replica gradients and the all-reduce as
separate, visible steps.

The arithmetic that makes N replicas equal one device (tests/test_equivalence.py checks it):
each replica divides the *sum* of its per-example losses by the *global* batch size, so the gradients
summed across replicas by the all-reduce are exactly the gradient of the global-batch mean loss.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from . import collectives, losses, models
from . import feed as feed_mod
from .collectives import all_sum_no_gradient
from .evaluate import make_evaluate
from .feed import pad_empty

log = logging.getLogger("tftoolkit")


@dataclass
class Engine:
    """Model, optimizer and the compiled step functions for one run, built inside the strategy's scope."""

    strategy: Any
    model: Any
    optimizer: Any
    schedule: Any
    train_loop: Any   # tf.function(iterator, n: int32 tensor) -> (losses[n], examples per replica[R])
    evaluate: Any     # (data.pipeline.EvalSplit) -> (sum loss, correct, count)
    noise: Any = None  # noise.NoiseScale with --noise-scale: EMAs, and the latest loop's per-step values
    model_source: Any = None  # what built the model: config.model, or the Python callable that replaced it
    feed: Any = None   # feed.Feed: what the iterator yields (host batches, or indices into device-resident data)
    task: Any = None   # losses.Task: the loss per example and the metrics evaluation reports
    task_spec: tuple = (None, None)  # (loss, metrics) as given: another engine of the same run (breakdown) uses them
    exchange: Any = None  # Exchange: the gradient all-reduce's dtype and packs
    compute_loop: Any = None  # train_loop without the gradient all-reduce (each replica applies its own gradient)


@dataclass
class Exchange:
    """How the step all-reduces gradients: in ``dtype``, in the packs of ``plan`` (collectives.pack_plan)."""

    dtype: str = "float32"
    plan: list = None

    def __call__(self, grads, extra=None):
        return collectives.all_reduce_gradients(grads, self.dtype, self.plan, extra)

    def bytes(self, variables) -> int:
        """Bytes one optimizer step's all-reduce moves per replica (in ``dtype``): summary.json's gradient_bytes."""
        return collectives.gradient_bytes(variables, self.dtype)


def jit_effective(config, kind: str, replicas: int) -> bool:
    """Whether the step is XLA-compiled: asked for, and not over several logical CPU devices (``kind`` is
    DeviceSetup.kind, ``replicas`` this process's replicas).

    XLA maps every logical CPU device to one XLA CPU device, so a compiled step that touches replica 1's
    variables from replica 0's device fails ("tfvariable_on_a_different_device" in XLA's known issues).
    The session decides it once (and logs it); summary.json records it as ``jit_effective``.
    """
    return bool(config.jit) and (kind == "GPU" or replicas == 1)


BUILDERS = ("build_engine", "make_train_loop", "replica_functions", "make_evaluate")  # each run's tf.functions


class PerRunTracing(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning for the functions build_engine makes (BUILDERS).

    Each run (each point of a grid, each replica count of a scaling study, the breakdown's extra engines) builds its
    model and so its own tf.functions, traced once each: a new function, not a retrace. TensorFlow counts traces by
    the Python function's code object (``Function._get_key_for_call_stats``), which every run's closures share, so
    from the sixth run in one process it warned that ``build_engine.<locals>.train_loop`` retraces (8 blocks in
    notebook 02). A signature that changes within one function still warns, and any other function's does too."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("triggered tf.function retracing" in text and any(f"{fn}.<locals>." in text for fn in BUILDERS))


def quiet_per_run_tracing() -> None:
    """Install PerRunTracing on TensorFlow's logger, once."""
    tf_log = logging.getLogger("tensorflow")
    if not any(isinstance(f, PerRunTracing) for f in tf_log.filters):
        tf_log.addFilter(PerRunTracing())


def build_engine(config, strategy, source, train_examples: int, allreduce: bool = True,
                 schedule=None, model=None, feed=None, loss=None, metrics=None) -> Engine:
    """Build everything that lives on the devices. ``allreduce=False`` trains each replica on its own
    gradients (scaled as if summed): the same compute without communication. Every engine also carries that loop as
    ``compute_loop`` on its own model and optimizer: the step-time breakdown times it beside ``train_loop``.
    ``schedule`` replaces the config's learning-rate schedule (the LR finder's sweep); ``model``, a callable
    ``fn(input_shape, num_classes) -> keras.Model``, replaces ``config.model`` (which then records its name).
    ``feed`` (engine.feed.make) says where the data lives; by default the host pipeline's batches.
    ``loss`` and ``metrics``: the task (engine/losses.py); by default the config's --loss/--metrics, else a compiled
    model's, else classification.
    """
    from . import noise as noise_mod  # imports TensorFlow too

    quiet_per_run_tracing()
    feed = feed if feed is not None else feed_mod.host()
    replicas = strategy.num_replicas_in_sync
    model_source = model if model is not None else config.model
    loss = loss if loss is not None else config.loss
    metrics = metrics if metrics is not None else (losses.names_of(config.metrics) or None)
    model, task, optimizer, schedule = build_model(config, strategy, source, train_examples, model_source, loss,
                                                   metrics, schedule)
    # The noise scale needs the all-reduced gradient, so the compute-only loop (allreduce=False) skips it.
    noise = (noise_mod.NoiseScale(replicas, model=model, accumulate=config.accumulate)
             if config.noise_scale and allreduce else None)
    # One replica all-reduces nothing: its gradients are not cast (a 16-bit dtype would only round them).
    exchange = Exchange(config.allreduce_dtype if replicas > 1 else "float32", collectives.pack_plan(
        collectives.gradient_sizes(model.trainable_variables), config.allreduce_packs))
    # Only a short last batch (or a half of a one-replica batch, for the noise scale) can leave a replica no
    # example: an ordinary step carries no padding cond and no weights.
    halves = noise is not None and replicas == 1 and config.accumulate == 1
    ctx = StepContext(config, strategy, feed, model, task, optimizer, exchange, noise, halves)
    # The compute-only loop is a second tf.function over the same model and optimizer: it is traced only when called
    # (the breakdown, after training), so a run that does not measure pays nothing for it.
    return Engine(strategy, model, optimizer, schedule, make_train_loop(ctx, allreduce),
                  make_evaluate(strategy, model, task), noise, model_source, feed, task, (loss, metrics), exchange,
                  make_train_loop(ctx, False))


def build_model(config, strategy, source, train_examples: int, model_source, loss, metrics, schedule=None):
    """(model, task, optimizer, schedule) in the strategy's scope; ``schedule`` by default the config's."""
    from . import schedules  # imports TensorFlow
    from .optimizers import make_optimizer

    with strategy.scope():
        model = models.build(model_source, source.input_shape, source.num_classes, classifier=False)
        task = losses.resolve(model, loss, metrics)  # in the scope: metrics make their variables here
        if task.classification:
            models.check_classifier(model, models.qualified_name(model_source) if callable(model_source)
                                    else model_source, source.num_classes)
        if schedule is None:
            schedule = schedules.from_config(config, train_examples)
        optimizer = make_optimizer(config, schedule)
        optimizer.build(model.trainable_variables)
    return model, task, optimizer, schedule


@dataclass(frozen=True)
class StepContext:
    """What the step's functions close over: one run's config, strategy, feed, model, task, optimizer, gradient
    exchange and noise scale. ``halves``: one replica's batch runs as two halves (the noise scale's small batches)."""

    config: Any
    strategy: Any
    feed: Any
    model: Any
    task: Any
    optimizer: Any
    exchange: Exchange
    noise: Any
    halves: bool

    replicas = property(lambda self: self.strategy.num_replicas_in_sync)
    partial = property(lambda self: self.config.last_batch == "partial")  # a short last batch, split unevenly


def forward_backward_fn(ctx: StepContext):
    """The forward and backward pass of one replica's batch: (loss, gradients), the loss divided by ``denom``."""
    import tensorflow as tf  # deferred: session.start times TensorFlow's import

    model, task, optimizer = ctx.model, ctx.task, ctx.optimizer
    may_be_empty = ctx.partial or ctx.halves

    def forward_backward(images, labels, denom, reg_share=1.0):
        weights = None
        if may_be_empty:
            images, labels, weights = pad_empty(images, labels)
        with tf.GradientTape() as tape:
            with models.example_weights(weights):
                logits = model(images, training=True)
            per_example = task.per_example(labels, logits)
            if weights is not None:
                per_example = per_example * weights
            # Sum over this replica / global batch: summing these over replicas gives the global mean.
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=denom)
            if model.losses:
                # Regularisation is computed identically on every replica; divide by replicas so the sum
                # over replicas counts it once (and by the micro-batches, so their sum counts it once).
                loss += reg_share * tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, model.trainable_variables)

    return forward_backward


def replica_functions(ctx: StepContext, allreduce: bool):
    """The per-replica functions of one optimizer step, with the gradient all-reduce (``allreduce``) or without it
    (each replica then applies its own gradient, scaled as if summed, and skips the noise scale, which needs the
    all-reduced gradient): (step, micro-step, finish, zeros), the first three XLA-compiled where the run is."""
    import tensorflow as tf  # deferred: session.start times TensorFlow's import

    from . import noise as noise_mod  # imports TensorFlow too

    config, strategy, feed, optimizer, model = ctx.config, ctx.strategy, ctx.feed, ctx.optimizer, ctx.model
    noise, replicas, global_batch = (ctx.noise if allreduce else None), ctx.replicas, config.global_batch_size
    accumulate, micro = config.accumulate, config.per_replica_batch_size
    forward_backward = forward_backward_fn(ctx)

    def finish(loss, grads, local_n, denom, noise_sums=None):
        """All-reduce this replica's gradients (summed over its micro-batches) once and apply them."""
        if allreduce and noise is not None:
            # The replica's squared norms ride along in the gradient all-reduce: no extra collective.
            scale = noise_mod.loss_scale(optimizer)
            grads, sums = ctx.exchange(grads, extra=noise_sums)
            estimate = noise.estimate(sums, grads, denom, scale)
        elif allreduce:
            # SUM, not MEAN: each replica's gradient is already divided by the global batch.
            grads = ctx.exchange(grads)
        else:
            grads = [g * replicas for g in grads]
        optimizer.apply(grads, model.trainable_variables)
        if noise is not None:
            return loss, local_n, estimate
        return loss, local_n

    def replica_step(element, resident=None):
        images, labels = feed.batch(element, resident)
        local_n = tf.shape(tf.nest.flatten(labels)[0])[0]
        if ctx.partial:
            # A short last batch is split unevenly; divide by the true global count, not the nominal one.
            denom = all_sum_no_gradient(local_n)
        else:
            denom = global_batch
        if ctx.halves:
            # One replica has no smaller batch to compare with: its two halves are the small batches.
            loss, grads, parts = noise_mod.two_halves(forward_backward, images, labels, denom)
        else:
            loss, grads = forward_backward(images, labels, denom)
            parts = [(grads, local_n)]
        noise_sums = None
        if allreduce and noise is not None:
            noise_sums = noise.replica_sums(parts, denom, noise_mod.loss_scale(optimizer))
        return finish(loss, grads, local_n, denom, noise_sums)

    # --accumulate K: a step takes K elements from the iterator, one micro-batch each. Each runs in its own
    # strategy.run (synchronized batch norm all-reduces inside the forward pass, which TensorFlow allows only
    # outside control flow in the replica function), adding its gradients to a float32 sum that the loop carries
    # per replica; then one all-reduce and one update. Micro-batch k of every replica together is the global
    # batch's k-th slice (data.pipeline orders the examples so), which is what batch norm normalises over.
    # The sums are float32 (float64 for float64 variables): 16-bit gradients of mixed precision would lose the small
    # micro-batches' contributions to a large running sum.
    acc_dtypes = [tf.float64 if v.dtype == tf.float64 else tf.float32 for v in model.trainable_variables]

    def replica_zeros():
        acc = [tf.zeros(v.shape, d) for v, d in zip(model.trainable_variables, acc_dtypes)]
        return acc, tf.constant(0.0, tf.float32), tf.constant(0, tf.int32), tf.zeros([4], tf.float64)

    def replica_micro(acc, loss_sum, n_sum, noise_sum, element, resident=None):
        images, labels = feed.batch(element, resident)
        loss, grads = forward_backward(images, labels, global_batch, 1.0 / accumulate)
        acc = [a + tf.cast(tf.convert_to_tensor(g), a.dtype) for a, g in zip(acc, grads)]
        if allreduce and noise is not None:
            noise_sum += noise.part_sums(grads, micro, global_batch, noise_mod.loss_scale(optimizer))
        return acc, loss_sum + tf.cast(loss, tf.float32), n_sum + tf.shape(tf.nest.flatten(labels)[0])[0], noise_sum

    def replica_finish(acc, loss_sum, n_sum, noise_sum):
        grads = [tf.cast(a, v.dtype) if a.dtype != v.dtype else a for a, v in zip(acc, model.trainable_variables)]
        return finish(loss_sum, grads, n_sum, global_batch, noise_sum if noise is not None else None)

    kind = "GPU" if "GPU" in strategy.extended.worker_devices[0].upper() else "CPU"
    compile_step = jit_effective(config, kind, len(strategy.extended.worker_devices))
    compiled = (lambda fn: tf.function(fn, jit_compile=True, autograph=False)) if compile_step else (lambda fn: fn)
    return compiled(replica_step), compiled(replica_micro), compiled(replica_finish), replica_zeros


def make_train_loop(ctx: StepContext, allreduce: bool):
    """The training loop, with the gradient all-reduce (``allreduce``) or without it (``replica_functions``). Both
    loops share the model, optimizer and feed: the one without is the step-time breakdown's compute-only step."""
    import tensorflow as tf  # deferred: session.start times TensorFlow's import

    strategy, feed, accumulate = ctx.strategy, ctx.feed, ctx.config.accumulate
    noise, replicas = (ctx.noise if allreduce else None), ctx.replicas
    step_fn, micro_fn, finish_fn, replica_zeros = replica_functions(ctx, allreduce)

    def one_step(iterator):
        """One optimizer step from ``iterator``: (loss, examples, [noise estimate]) per replica."""
        if accumulate == 1:
            return strategy.run(step_fn, args=feed.args(next(iterator)))

        def body(k, acc, loss_sum, n_sum, noise_sum):
            out = strategy.run(micro_fn, args=(acc, loss_sum, n_sum, noise_sum) + feed.args(next(iterator)))
            return (k + 1,) + tuple(out)

        start = (tf.constant(0),) + tuple(strategy.run(replica_zeros))
        # One micro-batch at a time: a micro-step's forward and backward pass do not depend on the sum so far, so
        # tf.while_loop's default (10 iterations in flight) would hold up to 10 micro-batches' activations at once,
        # memory growing with K, and update batch norm's moving statistics in any order.
        _, acc, loss_sum, n_sum, noise_sum = tf.while_loop(lambda k, *_: k < accumulate, body, start,
                                                           parallel_iterations=1)
        return strategy.run(finish_fn, args=(acc, loss_sum, n_sum, noise_sum))

    local_replicas = len(strategy.extended.worker_devices)

    def all_counts(counts):
        """This worker's per-replica example counts -> every replica's, the same list on every worker."""
        if local_replicas == replicas:
            return counts

        def own(c):  # replica r of worker w is global replica w * local + r
            return c[tf.distribute.get_replica_context().replica_id_in_sync_group % local_replicas][None]

        return strategy.gather(strategy.run(own, args=(counts,)), axis=0)

    # autograph=False here and in evaluate: the loops are written as tf.while_loop and DistributedDataset.reduce
    # (what autograph would generate), and no function a step calls branches on a tensor in Python. Converting
    # the 18 functions a run reaches cost about 1 s at the start of every process (BENCHMARKS.md); Keras' own
    # trainer skips autograph the same way (do_not_convert on its step, a while_loop over steps_per_execution).
    @tf.function(autograph=False)
    def train_loop(iterator, n):
        def body(i, losses, counts, noise_rows):
            out = one_step(iterator)
            loss_pr, n_pr = out[0], out[1]
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss_pr, axis=None)
            losses = losses.write(i, tf.cast(loss, tf.float32))
            counts += tf.cast(tf.stack(strategy.experimental_local_results(n_pr)), tf.int64)
            if noise is not None:
                # Every replica computed the same estimate from all-reduced values; take the first.
                noise_rows = noise_rows.write(i, noise.update(strategy.experimental_local_results(out[2])[0]))
            return i + 1, losses, counts, noise_rows

        start = (tf.constant(0, n.dtype), tf.TensorArray(tf.float32, size=n), tf.zeros([local_replicas], tf.int64),
                 tf.TensorArray(tf.float32, size=n if noise is not None else 0))
        _, losses, counts, noise_rows = tf.while_loop(lambda i, *_: i < n, body, start)
        if noise is not None:
            noise.last.assign(noise_rows.stack())
        return losses.stack(), all_counts(counts)

    return train_loop
