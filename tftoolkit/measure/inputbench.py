"""How fast the input pipeline alone delivers images: pipeline.train_dataset + distribute, no model.

    cold  the first epoch: records read from the files, parsed, decoded and (with caching) cached
    warm  later epochs: served from the in-memory cache (or read again from the files with cache=False)

Compare with the images/sec a training run consumes (its summary's ``images_per_sec``): the pipeline
keeps the replicas fed when it is several times faster. Files just written are usually in the OS page
cache, so "cold" means not decoded yet, not necessarily read from disk.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("tftoolkit")


def _puller(strategy):
    """A tf.function that pulls ``n`` per-replica batches from an iterator, as the training loop does."""
    import tensorflow as tf

    def size(labels):
        return tf.shape(labels, out_type=tf.int64)[0]

    @tf.function
    def pull(iterator, n):
        images = tf.constant(0, tf.int64)
        for _ in tf.range(n):
            _, labels, _ = next(iterator)
            # Count what each replica received; the images are materialised on their devices by then.
            images += strategy.reduce("SUM", strategy.run(size, args=(labels,)), axis=None)
        return images

    return pull


def measure(config, seconds: float = 10.0, cache: bool = True) -> dict:
    """Images/sec through the pipeline for ``config`` (dataset, replicas, batch), cold and warm.

    Batches are pulled inside a tf.function, as the training loop pulls them, so Python adds nothing per
    step. The cold pass is one whole epoch (a cache is only kept once an epoch is complete); warm passes
    repeat whole epochs until they add up to ``seconds``.
    """
    from ..data import pipeline, source as source_mod
    from ..engine import loop, session

    t0 = time.perf_counter()
    # The run's own set-up (seed, determinism, precision policy); the synthetic set is already in memory, so
    # its cold and warm passes are the same thing.
    sess = session.start(config, cache=cache)
    config, setup, source, strategy, impl = sess.config, sess.setup, sess.source, sess.strategy, sess.impl
    load_s = time.perf_counter() - t0

    import numpy as np
    import tensorflow as tf

    pull = _puller(strategy)
    steps = config.steps_per_epoch(source.train_examples)

    def iterator(src, epoch):
        return iter(pipeline.distribute(strategy, pipeline.train_dataset(src, config, epoch)))

    # Trace the puller on a stand-in dataset with the same element spec: tracing is not input time, and
    # an iterator over the real data would start prefetching (and filling the shuffle buffer) meanwhile.
    g = config.global_batch_size
    stand_in = source_mod.from_arrays(np.zeros((g, *source.input_shape), np.uint8), np.zeros(g, np.int32),
                                      num_classes=source.num_classes)
    pull(iterator(stand_in, 0), tf.constant(0))

    def run_epoch(epoch):
        # One call pulls the whole epoch; the time includes making the epoch's iterator.
        t0, c0 = time.perf_counter(), time.process_time()
        counts = []
        loop.drive(pull, lambda e, pos: iterator(source, e), start=epoch * steps, total=(epoch + 1) * steps,
                   steps_per_epoch=steps, steps_per_loop=steps, on_loop=lambda chunk: counts.append(int(chunk.outputs)))
        return sum(counts), time.perf_counter() - t0, time.process_time() - c0

    cold_n, cold_s, cold_cpu = run_epoch(0)
    warm_n, warm_s, warm_cpu, epochs = 0, 0.0, 0.0, 0
    while warm_s < seconds or epochs == 0:
        n, s, c = run_epoch(1 + epochs)
        warm_n, warm_s, warm_cpu, epochs = warm_n + n, warm_s + s, warm_cpu + c, epochs + 1
    traces = pull.experimental_get_tracing_count()
    if traces > 1:
        log.warning("input benchmark: the pull loop was traced %d times; tracing time is in the figures", traces)
    result = {
        "dataset": source.name,
        "replicas": setup.replicas,
        "device_kind": setup.kind,
        "global_batch": config.global_batch_size,
        "per_replica_batch": config.per_replica_batch_size,
        "train_examples": source.train_examples,
        "cached": bool(cache),
        "load_s": load_s,                    # verify shards + scan records (file sources)
        "cold_images": cold_n,
        "cold_s": cold_s,
        "cold_images_per_sec": cold_n / cold_s if cold_s else float("nan"),
        "warm_images": warm_n,
        "warm_s": warm_s,
        "warm_images_per_sec": warm_n / warm_s if warm_s else float("nan"),
        "warm_epochs": epochs,
        # CPU seconds of this process (all its threads) per pass: what the pipeline costs, whatever else
        # the machine is doing at the time (wall-clock figures on a shared machine are not).
        "cold_cpu_s": cold_cpu,
        "warm_cpu_s": warm_cpu,
        "cold_images_per_cpu_s": cold_n / cold_cpu if cold_cpu else float("nan"),
        "warm_images_per_cpu_s": warm_n / warm_cpu if warm_cpu else float("nan"),
        "cross_device_ops": impl,
    }
    log.info("input pipeline %s: cold %.0f images/sec (%d in %.2f s), warm%s %.0f images/sec (%d in %.2f s)",
             source.name, result["cold_images_per_sec"], cold_n, cold_s, "" if cache else " (no cache)",
             result["warm_images_per_sec"], warm_n, warm_s)
    return result


def format_result(r: dict) -> str:
    return "\n".join([
        f"dataset            {r['dataset']} ({r['train_examples']} training images)",
        f"replicas           {r['replicas']} ({r['device_kind']}), global batch {r['global_batch']} = "
        f"{r['per_replica_batch']} per replica",
        f"load               {r['load_s']:.2f} s (verify + scan)",
        f"cold (first epoch) {r['cold_images_per_sec']:10.0f} images/sec  "
        f"({r['cold_images']} images in {r['cold_s']:.2f} s)",
        f"warm ({'cached' if r['cached'] else 'no cache'})"
        f"{' ' * (6 if r['cached'] else 4)}{r['warm_images_per_sec']:10.0f} images/sec  "
        f"({r['warm_images']} images in {r['warm_s']:.2f} s, {r['warm_epochs']} epoch(s))",
        f"CPU cost           cold {r['cold_images_per_cpu_s']:.0f}, warm {r['warm_images_per_cpu_s']:.0f} images per "
        f"CPU-second (all threads)",
    ])
