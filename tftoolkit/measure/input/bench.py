"""How fast the input pipeline alone delivers images: engine.feed + data.pipeline through the strategy, no model.

    cold    the one read of the files into memory (data.store.materialize: parallel reads, batched parsing and
            decoding); for sources that are arrays already (synthetic, NumPy, keras.datasets) there is none
    warm    training epochs served from memory, pulled through the strategy as the training loop pulls them:
            host placement = the per-replica gathers on the CPU and the copies to the replicas' devices;
            device placement = the indices from the host and the gather on each device
    stream  a split over --data-memory-gb: training batches read and decoded from the files (data/stream.py),
            pulled the same way; ``decode_images_per_sec`` is the same files read and decoded alone (the same
            windows, nothing after), the ceiling of the pipeline on these cores

``images_per_sec`` is the rate of the path training uses (warm, or stream), ``images_per_sec_per_core`` that over
the cores the process may use.

Compare with the images/sec a training run consumes (its summary's ``images_per_sec``): the pipeline keeps the
replicas fed when it is several times faster. Files just written are usually in the OS page cache, so "cold"
means not decoded yet, not necessarily read from disk.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ...data.stream import cores
from ...engine import feed as feed_mod, session
from .verdict import rate as input_rate

log = logging.getLogger("tftoolkit")


def puller(strategy, feed, local: bool = False):
    """A tf.function that pulls ``n`` steps of per-replica batches from an iterator, as the training loop does,
    and makes each replica's float batch (what the step would compute on) without a model. It returns the images
    pulled: all replicas' (a cross-replica sum), or with ``local`` this process's replicas' only (no collective, so
    each worker of a multi-worker run can time its own pipeline)."""
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts

    def replica(*args):
        images, labels = feed.batch(*args)
        # Depend on the last value of every input so the gathers and conversions are not pruned; count the examples.
        last = tf.add_n([tf.cast(tf.reshape(t, [-1])[-1], tf.float32) for t in tf.nest.flatten(images)])
        return tf.shape(tf.nest.flatten(labels)[0], out_type=tf.int64)[0] + tf.cast(last * 0, tf.int64)

    def total(per_replica):
        if local:
            return tf.add_n(strategy.experimental_local_results(per_replica))
        return strategy.reduce("SUM", per_replica, axis=None)

    @tf.function(autograph=False)  # the training loop's while_loop, written out (engine/step.py says why)
    def pull(iterator, n):
        def body(i, images):
            return i + 1, images + total(strategy.run(replica, args=feed.args(next(iterator))))

        return tf.while_loop(lambda i, _: i < n, body, (tf.constant(0, n.dtype), tf.constant(0, tf.int64)))[1]

    return pull


# --- the input capacity every run carries (measure.input.verdict reads it) --------------------------------------------
PROBE_S = 0.5          # seconds of pulling a single-process run spends on its capacity probe, at most...
PROBE_SHARE = 0.03     # ...and at most this share of the run's training time (a short run's probe is shorter)
PROBE_STEPS_WORKERS = 8  # a multi-worker run's fixed probe: every worker must pull as many steps (see probe)


def probe(strategy, feed, iterator, workers: int = 1, seconds: float = PROBE_S) -> dict:
    """The run's input capacity: its own training iterator pulled after the last step, with no model.

    The pipeline is warm and is the one the run trained on (data, image size, augmentation, placement, a tf.data
    service), so nothing is rebuilt; it is endless, so pulling past the run's last step costs nothing but time.
    Each replica makes its float batch, as ``bench input`` does. A single process pulls for ``seconds`` (at least
    two steps). In a multi-worker run the distributed iterator's get_next may agree across workers on whether data
    is left (a collective), so every worker pulls the same PROBE_STEPS_WORKERS steps; each times its own pipeline,
    and the run's capacity is the chief's rate x workers (every worker's host feeds its own replicas).
    """
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts
    from ...engine import timer  # deferred with TensorFlow, which it imports: training.run imports this module first

    pull = puller(strategy, feed, local=True)
    pull(iterator, tf.constant(1)).numpy()  # tracing is not input time
    images, secs, steps, chunk = [], [], 0, 1  # each timed call's images and seconds
    while (steps < PROBE_STEPS_WORKERS) if workers > 1 else (sum(secs) < seconds or steps < 2):
        if workers > 1:
            chunk = min(chunk, PROBE_STEPS_WORKERS - steps)
        got, dt = timer.timed(pull, iterator, tf.constant(chunk))
        images.append(int(got.numpy()))
        secs.append(dt)
        steps += chunk
        chunk = min(2 * chunk, 32)  # a few calls, each longer: the call's own cost stays out of the rate

    rate, rate_se = input_rate(images, secs)
    n_cores = cores()
    return {"input_capacity_images_per_sec": rate * workers, "input_capacity_uncertainty": rate_se * workers,
            "input_capacity_method": (f"measured: {steps} steps ({sum(images)} images) of the run's own input pulled "
                                      f"alone after training in {len(images)} calls, {sum(secs):.2f} s"
                                      + (f"; the chief's rate and error x {workers} workers (the other hosts' "
                                         "differences not in it)" if workers > 1 else "")),
            "input_cores": n_cores,
            "input_capacity_per_core": rate / n_cores}


def measure(config, seconds: float = 10.0, cache: bool = True) -> dict:
    """Images/sec through the pipeline for ``config`` (dataset, replicas, batch, data placement), cold and warm.

    Batches are pulled inside a tf.function, as the training loop pulls them, so Python adds nothing per step.
    Warm passes continue one iterator over whole epochs until they add up to ``seconds`` (at least one epoch).
    ``cache=False``: the files are read again for every warm epoch (how fast the cold path alone streams).
    """
    t0 = time.perf_counter()
    # The run's own set-up (seed, determinism, precision policy).
    sess = session.start(config, cache=cache)
    config, setup, source, strategy, impl = sess.config, sess.setup, sess.source, sess.strategy, sess.impl
    load_s = time.perf_counter() - t0

    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts

    store, cold = _cold_read(source)
    feed = feed_mod.make(config, setup, strategy, source)
    pull = puller(strategy, feed)
    # Elements per epoch: one per step, or one per micro-batch with --accumulate (the iterator's unit).
    steps = config.steps_per_epoch(source.train_examples) * config.accumulate
    streamed = not store.in_memory
    # Memory: whole epochs. Streamed: calls of at most STREAM_CALL_STEPS steps (an ImageNet epoch takes hours).
    call = min(steps, STREAM_CALL_STEPS) if streamed else steps
    # Trace on the real iterator's first step (tracing is not input time), then time whole epochs.
    iterator = iter(feed.train_input(strategy, source, config, 0))
    pull(iterator, tf.constant(1)).numpy()
    warm = _warm_passes(pull, iterator, source, call, seconds, cache)
    traces = pull.experimental_get_tracing_count()
    if traces > 1:
        log.warning("input benchmark: the pull loop was traced %d times; tracing time is in the figures", traces)
    del iterator

    rate = warm.images / warm.seconds if warm.seconds else float("nan")
    n_cores = cores()
    decode_rate = decode_only_rate(store, config, seconds / 2) if streamed else float("nan")
    result = {
        "source": "stream" if streamed else "memory",
        "images_per_sec": rate,
        "cores": n_cores,
        "images_per_sec_per_core": rate / n_cores,
        "decode_images_per_sec": decode_rate,
        "decode_ceiling_fraction": rate / decode_rate if decode_rate == decode_rate and decode_rate else float("nan"),
        "input_threads": source.info.get("input_threads", {}) if streamed else {},
        "input_transform": (f"{store.mode}{' + augment' if config.augment else ''}") if streamed else "",
        "dataset": source.name,
        "replicas": setup.replicas,
        "device_kind": setup.kind,
        "global_batch": config.global_batch_size,
        "per_replica_batch": config.per_replica_batch_size,
        "accumulate": config.accumulate,
        "train_examples": source.train_examples,
        "data_placement": feed.placement,
        "data_placement_reason": feed.reason,
        "cached": bool(cache),
        "load_s": load_s,                    # verify shards + scan records (file sources)
        **_pass_figures(cold, warm, streamed, source.train_examples),
        "cross_device_ops": impl,
        "data_service": config.data_service,
    }
    log.info("input pipeline %s (%s placement): cold %.0f images/sec (%d in %.2f s), warm%s %.0f images/sec "
             "(%d in %.2f s)", source.name, feed.placement, result["cold_images_per_sec"], cold.images, cold.seconds,
             "" if cache else " (no cache)", result["warm_images_per_sec"], warm.images, warm.seconds)
    return result


@dataclass
class _Pass:
    """What one timed pass moved: images, wall seconds, CPU seconds of this process, and epochs (warm only)."""
    images: int
    seconds: float
    cpu_s: float
    epochs: int = 0


def _cold_read(source) -> tuple:
    """(the training split's store, the cold pass): the one read of the files into memory, none (0 images) for
    sources that are in memory already."""
    t0, c0 = time.perf_counter(), time.process_time()
    store = source.store("train")  # the cold read (none for sources already in memory)
    cold_s, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
    cold_n = store.n if "train_read_s" in source.info and store.in_memory else 0
    if cold_n and source.streams:  # decoded when it was loaded (data.source.from_streams): that was the cold read
        cold_s, cold_cpu = source.info["train_read_s"], float("nan")
    return store, _Pass(cold_n, cold_s, cold_cpu)


def _warm_passes(pull, iterator, source, call: int, seconds: float, cache: bool) -> _Pass:
    """Calls of ``call`` steps on the traced iterator until they add up to ``seconds`` (at least one); without
    ``cache`` the files are read again before every call after the first, and that read is counted."""
    import tensorflow as tf  # deferred: the devices are configured (engine.devices) before TensorFlow starts
    from ...engine import timer  # deferred with TensorFlow, which it imports: training.run imports this module first

    warm = _Pass(0, 0.0, 0.0)
    while warm.seconds < seconds or warm.epochs == 0:
        if not cache and warm.epochs:
            source.stores.pop("train", None)
            t1 = time.perf_counter()
            source.store("train")
            warm.seconds += time.perf_counter() - t1
        c1 = time.process_time()
        n = call - 1 if warm.epochs == 0 and call > 1 else call  # the first call's first step was the trace
        pulled, pass_s = timer.timed(pull, iterator, tf.constant(n))
        warm.images += int(pulled.numpy())
        warm.seconds += pass_s
        warm.cpu_s += time.process_time() - c1
        warm.epochs += 1
    return warm


def _pass_figures(cold: _Pass, warm: _Pass, streamed: bool, train_examples: int) -> dict:
    """The result's cold and warm fields: images, seconds and rates per wall and per CPU second."""
    return {
        "cold_images": cold.images,
        "cold_s": cold.seconds,
        "cold_images_per_sec": cold.images / cold.seconds if cold.images and cold.seconds else float("nan"),
        "warm_images": warm.images,
        "warm_s": warm.seconds,
        "warm_images_per_sec": warm.images / warm.seconds if warm.seconds else float("nan"),
        "warm_epochs": warm.epochs if not streamed else warm.images / max(train_examples, 1),
        # CPU seconds of this process (all its threads) per pass: what the pipeline costs, whatever else
        # the machine is doing at the time (wall-clock figures on a shared machine are not).
        "cold_cpu_s": cold.cpu_s,
        "warm_cpu_s": warm.cpu_s,
        "cold_images_per_cpu_s": cold.images / cold.cpu_s if cold.images and cold.cpu_s else float("nan"),
        "warm_images_per_cpu_s": warm.images / warm.cpu_s if warm.cpu_s else float("nan"),
    }


STREAM_CALL_STEPS = 20


def decode_only_rate(split, config, seconds: float) -> float:
    """Images/sec of ``split.decode_only`` (the files read and decoded alone) over about ``seconds``."""
    ds = split.decode_only(train=True, augment=config.augment, seed=config.seed)
    it = iter(ds)
    next(it)  # the reader started, the functions traced
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < max(seconds, 0.5):
        n += len(next(it))  # a batch's length, no op of its own in the timed loop
    return n / (time.perf_counter() - t0)


def _accumulated(r: dict) -> str:
    k = r.get("accumulate", 1)
    return f" x {r['replicas']} x {k} micro-batches" if k > 1 else ""


def format_result(r: dict) -> str:
    if r["source"] == "stream":
        return "\n".join([
            f"dataset            {r['dataset']} ({r['train_examples']} training images, streamed from the files)",
            f"replicas           {r['replicas']} ({r['device_kind']}), global batch {r['global_batch']} = "
            f"{r['per_replica_batch']} per replica{_accumulated(r)}",
            f"threads            {r['input_threads']}"
            + (f" on the tf.data service at {r['data_service']}" if r.get("data_service") else ""),
            f"stream             {r['images_per_sec']:10.0f} images/sec  ({r['warm_images']} images in {r['warm_s']:.2f} s; "
            f"{r['images_per_sec_per_core']:.0f} per core on {r['cores']}; {r['input_transform']})",
            f"decode alone       {r['decode_images_per_sec']:10.0f} images/sec  (the ceiling: the pipeline reaches "
            f"{r['decode_ceiling_fraction']:.0%} of it)",
        ])
    return "\n".join([
        f"dataset            {r['dataset']} ({r['train_examples']} training images)",
        f"replicas           {r['replicas']} ({r['device_kind']}), global batch {r['global_batch']} = "
        f"{r['per_replica_batch']} per replica{_accumulated(r)}",
        f"load               {r['load_s']:.2f} s (verify + scan)",
        f"placement          {r['data_placement']} ({r['data_placement_reason']})"
        + (f", from the tf.data service at {r['data_service']}" if r.get("data_service") else ""),
        (f"cold (read files) {r['cold_images_per_sec']:10.0f} images/sec  ({r['cold_images']} images in "
         f"{r['cold_s']:.2f} s)" if r["cold_images"] else "cold               none: the source is in memory already"),
        f"warm ({'cached' if r['cached'] else 'no cache'})"
        f"{' ' * (6 if r['cached'] else 4)}{r['warm_images_per_sec']:10.0f} images/sec  "
        f"({r['warm_images']} images in {r['warm_s']:.2f} s, {r['warm_epochs']} epoch(s))",
        f"CPU cost           cold {r['cold_images_per_cpu_s']:.0f}, warm {r['warm_images_per_cpu_s']:.0f} images per "
        f"CPU-second (all threads)",
    ])
