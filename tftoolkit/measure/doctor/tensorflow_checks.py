"""The doctor's checks that need TensorFlow: build, visibility, allreduce_sum, equivalence, placement, timing and peak
(each described in ``measure.doctor``, whose ``run`` sets up the devices before the first of them)."""

from __future__ import annotations

import os
import re
import statistics
import time

import numpy as np

from ... import gpus as visibility
from ... import nvml as nvml_api
from ...config import CROSS_DEVICE_OPS, RunConfig
from ...data import pipeline, source as source_mod
from ...engine import devices, feed, kernels, loop, session, timer
from ...engine import strategy as strategy_mod
from ...engine.step import build_engine
from ...engine.strategy import make_strategy
from ...errors import ConfigError
from .. import allreduce, flops
from .check import Check, Context

EQUIVALENCE_STEPS = 10
EQUIVALENCE_RTOL = 1e-4   # of the weight scale; float32 summation order differs between 1 and N replicas
PEAK_TOO_HIGH = 1.05      # measured above 105% of the rated peak: the catalogue's figure is wrong for this device
PEAK_TOO_LOW = 0.25       # below 25%: clocks, power capping or a wrong device name
TIMING_REPEATS = 5        # interleaved rounds of one unit, two units, one unsynchronised unit and no work; medians
TIMING_DOUBLE = (1.4, 2.7)  # twice the work reads 1.4x-2.7x the time: a clock that does not wait for the devices
#                             reads about 1x (fail); above 2.7x the host is too busy to judge (skip)
TIMING_AGREE = 1.5        # CPU replicas: unsynchronised within 1.5x of synchronised agrees; slower is the host's noise


# --- helpers that need no TensorFlow ----------------------------------------------------------------------
def odd_count(replicas: int, available: int) -> int | None:
    """An odd replica count above 1 to check beside ``replicas`` (itself when odd), or None when none fits."""
    if replicas > 1 and replicas % 2:
        return replicas
    for n in (replicas - 1, replicas + 1, 3):
        if 3 <= n <= available and n % 2:
            return n
    return None


def check_build(ctx: Context) -> Check:
    # Deferred on purpose: TensorFlow starts only once doctor.run has set up the devices.
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    cuda, cudnn = info.get("cuda_version"), info.get("cudnn_version")
    figure = f"TensorFlow {tf.__version__}" + (f", built for CUDA {cuda}, cuDNN {cudnn}" if info.get("is_cuda_build")
                                               else ", CPU build")
    driver = ctx.report.get("driver", {})
    if not ctx.report.get("gpus"):
        return Check("build", "skip", figure, f"no GPU ({driver.get('reason') or 'NVML lists none'})")
    if not info.get("is_cuda_build"):
        return Check("build", "fail", figure, "GPUs present but this TensorFlow has no CUDA",
                     "pip install 'tftoolkit[gpu]' (tensorflow[and-cuda])")
    have = driver.get("cuda_driver_version")
    if have and cuda and _version(have) < _version(cuda)[:2]:
        return Check("build", "fail", figure + f"; driver supports CUDA {have}",
                     f"the driver ({driver.get('driver_version')}) is older than the CUDA TensorFlow was built for",
                     "update the NVIDIA driver to one that supports CUDA " + str(cuda))
    if not tf.config.list_physical_devices("GPU"):
        return Check("build", "fail", figure, "NVML sees GPUs but TensorFlow does not (CUDA or cuDNN libraries "
                     "not found)", "pip install 'tensorflow[and-cuda]' in this environment; check LD_LIBRARY_PATH")
    return Check("build", "pass", figure + (f"; driver {driver.get('driver_version')} (CUDA {have})" if have else ""))


def _version(text) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", str(text))[:3])


def check_visibility(ctx: Context) -> Check:
    # Deferred on purpose: TensorFlow starts only once doctor.run has set up the devices.
    import tensorflow as tf

    nvml_gpus = ctx.report.get("gpus", [])
    tf_gpus = tf.config.list_physical_devices("GPU")
    if not nvml_gpus and not tf_gpus:
        return Check("visibility", "skip", detail="no GPU visible to NVML or TensorFlow")
    mask = visibility.visible()
    if mask is None:
        expected = [g["name"] for g in nvml_gpus]
        where = "all GPUs (CUDA_VISIBLE_DEVICES unset)"
    else:
        with nvml_api.session() as nvml:
            indices = visibility.nvml_indices(mask, nvml) or []
        by_index = {g["index"]: g["name"] for g in nvml_gpus}
        expected = [by_index.get(i, "?") for i in indices]
        where = f"CUDA_VISIBLE_DEVICES={os.environ.get(visibility.ENV)}"
    seen = [tf.config.experimental.get_device_details(d).get("device_name", "?") for d in tf_gpus]
    figure = f"TensorFlow {len(seen)}, NVML {len(expected)} under {where}"
    order = os.environ.get(visibility.ORDER_ENV, "FASTEST_FIRST (CUDA's default)")
    if seen != expected:
        return Check("visibility", "fail", figure, f"TensorFlow sees {seen}, NVML under the mask {expected} "
                     f"(CUDA_DEVICE_ORDER={order})",
                     "set CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers GPUs as nvidia-smi does; check the mask")
    return Check("visibility", "pass", figure, f"same GPUs in the same order ({', '.join(seen)}; "
                 f"CUDA_DEVICE_ORDER={order})")


def _allreduce_impls(setup) -> list[str]:
    return [i for i in CROSS_DEVICE_OPS if i != "auto" and (i != "nccl" or setup.kind == "GPU")]


def check_allreduce_sum(ctx: Context) -> Check:
    setup = ctx.setup
    counts = [ctx.replicas]
    available = len(setup.devices) if setup.kind == "GPU" else devices.configured()
    odd = odd_count(ctx.replicas, available)
    if odd and odd not in counts:
        counts.append(odd)
    seen, bad, exact, refused = [], [], 0, 0
    for n in counts:
        sub = devices.DeviceSetup(setup.kind, tuple(_device_names(setup, n)), setup.gpu_indices, setup.host_cores,
                                  setup.tf_gpus)
        for impl in _allreduce_impls(setup):
            try:
                strategy_mod.choose_cross_device_ops(impl, sub)
            except ConfigError:
                # Refused by the toolkit; the sum it would give says why.
                ok, why = allreduce.check_sum(strategy_mod.mirrored(sub.devices,
                                                                    strategy_mod.cross_device_ops_object(impl)))
                seen.append(f"{impl}@{n}: refused by the toolkit ({'exact here' if ok else why})")
                refused += 1
                continue
            strategy, _ = strategy_mod.make_strategy(sub, impl)
            ok, why = allreduce.check_sum(strategy)
            seen.append(f"{impl}@{n}: {'exact' if ok else why}")
            exact += ok
            if not ok:
                bad.append(f"{impl} at {n} replicas: {why}")
    figure = (f"{exact} exact, {len(bad)} wrong, {refused} refused at {' and '.join(map(str, counts))} replicas")
    if odd is None and ctx.replicas % 2 == 0 and ctx.replicas > 1:
        seen.append("no odd replica count above 1 fits these devices")
    if bad:
        return Check("allreduce_sum", "fail", figure, "; ".join(bad), "use --cross-device-ops reduce_to_one (and "
                     "report the implementation that lost values)")
    return Check("allreduce_sum", "pass", figure, "; ".join(seen))


def _device_names(setup, n: int) -> list[str]:
    if setup.kind == "GPU":
        return list(setup.devices[:n])
    return [f"/cpu:{i}" for i in range(n)]


def check_equivalence(ctx: Context) -> Check:
    if ctx.replicas == 1:
        return Check("equivalence", "skip", detail="one replica: nothing to compare with (--replicas N)")
    one, losses_one = _train_tiny(ctx, 1)
    many, losses_many = _train_tiny(ctx, ctx.replicas)
    scale = max(float(np.abs(w).max()) for w in one)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(one, many)) / scale
    moved = max(float(np.abs(a - b).max()) for a, b in zip(one, _train_tiny(ctx, 1, steps=0)[0])) / scale
    loss_diff = float(np.max(np.abs(np.asarray(losses_one) - np.asarray(losses_many))))
    figure = f"max |w_{ctx.replicas} - w_1| = {diff:.1e} of the weight scale after {EQUIVALENCE_STEPS} steps"
    detail = f"losses differ by at most {loss_diff:.1e}; training moved the weights {moved:.2f} of their scale"
    if diff > EQUIVALENCE_RTOL or not moved > 10 * EQUIVALENCE_RTOL:
        return Check("equivalence", "fail", figure, detail, "run `tftoolkit doctor` with --replicas 2 and 3 to "
                     "narrow it down; try --cross-device-ops reduce_to_one")
    return Check("equivalence", "pass", figure, detail)


def _train_tiny(ctx: Context, replicas: int, steps: int = EQUIVALENCE_STEPS):
    """(weights, losses) of small_cnn after ``steps`` momentum-SGD steps at global batch 8 x replicas-to-check."""

    setup = ctx.setup
    sub = type(setup)(setup.kind, tuple(_device_names(setup, replicas)), setup.gpu_indices, setup.host_cores,
                      setup.tf_gpus)
    config = RunConfig(replicas=replicas, global_batch=8 * ctx.replicas, model="small_cnn", optimizer="momentum",
                       base_lr=0.05, lr_rule="none", warmup_epochs=0.0, schedule="constant", steps=max(1, steps),
                       seed=11, measure=False, deterministic=True, steps_per_loop=5)
    x, y = source_mod.synthetic_arrays(16 * ctx.replicas * 4, 16, 10, seed=4)
    sess = session.start(config, data=(x, y), setup=sub)
    eng = build_engine(sess.config, sess.strategy, sess.source, sess.source.train_examples)
    losses: list[float] = []
    if steps:
        loop.drive(eng.train_loop, lambda s: iter(pipeline.train_input(sess.strategy, sess.source, sess.config, s)),
                   start=0, total=steps, steps_per_epoch=sess.derived["steps_per_epoch"], steps_per_loop=5,
                   on_loop=lambda chunk: losses.extend(chunk.outputs[0].tolist()))
    return [w.copy() for w in eng.model.get_weights()], losses


def check_placement(ctx: Context) -> Check:
    problems = kernels.gpu_problems(feed.device_path_graph())
    registry = ("TensorFlow's GPU kernel registry: the device path (placement, gather, unpacking, augmentation) "
                + ("stays in device memory" if not problems else "leaves the device: " + "; ".join(problems[:3])))
    if problems:
        return Check("placement", "fail", f"{len(problems)} op(s) off the device", registry,
                     "report it: --data-placement device would copy through the host on GPUs")
    if ctx.setup.kind != "GPU":
        return Check("placement", "pass", "0 ops off the device (kernel registry)", registry + "; no GPU here to "
                     "place data on")
    # Deferred on purpose: TensorFlow starts only once doctor.run has set up the devices.
    import tensorflow as tf

    strategy, _ = make_strategy(ctx.setup, "auto")
    images, labels, _ = feed.resident_arrays(np.zeros((16, 8, 8, 3), np.uint8), np.zeros(16, np.int32))
    with tf.device("/cpu:0"):
        host = tf.constant(images), tf.constant(labels)
    resident = strategy.experimental_distribute_values_from_function(lambda ctx_: feed.place(*host))
    wrong = []
    for device, (img, lab) in zip(ctx.setup.devices, strategy.experimental_local_results(resident)):
        for t in (img, lab):
            if "GPU" not in t.backing_device.upper() or not t.backing_device.upper().endswith(device.split(":")[-1]):
                wrong.append(f"{device}: {t.dtype.name} on {t.backing_device}")
    if wrong:
        return Check("placement", "fail", f"{len(wrong)} tensor(s) off their device", "; ".join(wrong),
                     "use --data-placement host, and report it")
    return Check("placement", "pass", f"{2 * len(ctx.setup.devices)} tensors on their replicas' devices", registry)


def timing_verdict(kind: str, once: list[float], twice: list[float], unsynced: list[float],
                   idle: list[float]) -> tuple[str, str, str, str]:
    """(status, figure, detail, fix) of the timing check from its rounds, in seconds: ``once[i]`` and ``twice[i]``
    one and two units of device work timed synchronised, ``unsynced[i]`` one unit with the clock stopped when the
    call returns, ``idle[i]`` the same call with no work, timed synchronised, all four in round i.

    The synchronised clock is right when it follows the work: two units must take about twice one. It is what
    every timed region of the toolkit reads, so a clock that stops before the devices finish fails the check
    (images/sec would be overstated). Ratios are taken within each round, whose three calls ran back to back, and
    their median is judged, so a host whose load changes between rounds still gives a fair figure; a ratio far
    above 2, or an unsynchronised call slower than the synchronised one, says the host was too busy to judge
    (skip, with the figures). Without synchronisation GPUs return before the work is done; CPU replicas return
    when it is done, and where they do not the synchronised clock still waits for the rest.

    CPU replicas run synchronously, and a call's own cost (threads waking on cores the host shares) grows with the
    host's load until it hides the doubling (1.34x seen in the suite, three workers on 2 cores): there a low ratio
    whose work beyond a call with no work still doubles is the host's, a skip. On GPUs a call with no work differs
    from one unit in kernel launches, not in waiting, so nothing is taken off there."""

    ratio = statistics.median(t / o for o, t in zip(once, twice))
    share = statistics.median(f / o for o, f in zip(once, unsynced))
    one, two, free = (statistics.median(s) for s in (once, twice, unsynced))
    figure = f"synchronised {one * 1e3:.2f} ms, twice the work {two * 1e3:.2f} ms ({ratio:.2f}x), " \
             f"unsynchronised {free * 1e3:.2f} ms"
    lo, hi = TIMING_DOUBLE
    busy = "rerun on an idle host (check `top` for other jobs)"
    if ratio < lo and kind != "GPU":
        beyond = [(t - z) / (o - z) for o, t, z in zip(once, twice, idle) if o > z]
        marginal = statistics.median(beyond) if len(beyond) > len(once) // 2 else 0.0
        if lo <= marginal <= hi:
            return "skip", figure + f", no work {statistics.median(idle) * 1e3:.2f} ms", (
                f"twice the work read only {ratio:.2f}x the time, but {marginal:.2f}x beyond a call with no work "
                f"({statistics.median(idle) / one:.0%} of one unit's time): the host was too busy to judge the "
                "clock"), busy
    if ratio < lo:
        return "fail", figure, (f"twice the work read only {ratio:.2f}x the time (at least {lo}x expected): the "
                                "synchronised clock stops before the devices finish"), \
            "report it: images/sec and the step breakdown would be overstated on this machine"
    if ratio > hi:
        return "skip", figure, (f"twice the work read {ratio:.2f}x the time (at most {hi}x expected): the host was "
                                "too busy to judge the clock"), busy
    if kind == "GPU":
        return "pass", figure, (f"the synchronised clock follows the work ({ratio:.2f}x for twice as much); without "
                                f"synchronisation it stops after {share:.0%} of it: every timed region synchronises"), ""
    if share > TIMING_AGREE:
        return "skip", figure, (f"the unsynchronised call read {share:.0%} of the synchronised one, though it cannot "
                                "take longer: the host was too busy to judge the clock"), busy
    seen = (f"and the unsynchronised clock agrees ({share:.0%}); on GPUs it would not" if share >= 1 / TIMING_AGREE
            else f"yet calls returned after {share:.0%} of their work: the synchronised clock waits for the rest")
    return "pass", figure, f"the synchronised clock follows the work ({ratio:.2f}x for twice as much); CPU replicas " \
        f"run synchronously, {seen}", ""


def check_timing(ctx: Context) -> Check:
    # Deferred on purpose: TensorFlow starts only once doctor.run has set up the devices.
    import tensorflow as tf

    strategy, _ = make_strategy(ctx.setup, "auto")
    # Large enough that a call's fixed cost (tens of ms for simulated replicas sharing cores) is small beside it.
    n = 768 if ctx.setup.kind != "GPU" else 4096
    # An argument, not a constant inside the function, so Grappler cannot fold the work away.
    x0 = strategy.experimental_distribute_values_from_function(
        lambda _: tf.random.stateless_uniform([n, n], seed=[1, 2]))

    def work(units):
        @tf.function(autograph=False)
        def call(x):
            def replica(y):
                for _ in range(4 * units):
                    y = tf.matmul(y, y) * (1.0 / n)
                return tf.reduce_sum(y[:1, :1])
            return strategy.run(replica, args=(x,))
        return call

    none, once, twice = work(0), work(1), work(2)
    timer.timed(none, x0), timer.timed(once, x0), timer.timed(twice, x0)  # trace all three
    one, two, free, idle = [], [], [], []
    for _ in range(TIMING_REPEATS):  # interleaved, so a change in the host's load reaches every figure alike
        one.append(timer.timed(once, x0)[1])
        two.append(timer.timed(twice, x0)[1])
        timer.sync()
        t0 = time.perf_counter()
        once(x0)
        free.append(time.perf_counter() - t0)
        timer.sync()
        idle.append(timer.timed(none, x0)[1])
    status, figure, detail, fix = timing_verdict(ctx.setup.kind, one, two, free, idle)
    return Check("timing", status, figure, detail, fix)


def check_peak(ctx: Context) -> Check:
    setup = ctx.setup
    if setup.kind != "GPU":
        rate, source = flops.cpu_matmul_peak("float32")
        return Check("peak", "pass", f"{rate / 1e9:.0f} GFLOP/s float32 (measured)",
                     f"the MFU denominator on CPU replicas: {source}")
    table, source = flops.peak_flops(type(setup)(setup.kind, setup.devices[:1], setup.gpu_indices, setup.host_cores,
                                                 setup.tf_gpus), "float32")
    measured = gpu_matmul_rate(setup.devices[0])
    figure = f"{measured / 1e12:.1f} TFLOP/s measured vs {table / 1e12:.1f} in the table" if table == table else \
        f"{measured / 1e12:.1f} TFLOP/s measured; no table figure"
    if not table == table:
        return Check("peak", "fail", figure, source, "add this GPU's datasheet figures to "
                     "tftoolkit/catalogue/gpus.toml (with its source), or MFU stays empty")
    ratio = measured / table
    if ratio > PEAK_TOO_HIGH:
        return Check("peak", "fail", figure, f"measured {ratio:.0%} of the table: the table's figure is too low for "
                     f"this device ({source})", "correct the figure in tftoolkit/catalogue/gpus.toml (MFU would read above 100%)")
    if ratio < PEAK_TOO_LOW:
        return Check("peak", "fail", figure, f"measured {ratio:.0%} of the table ({source})",
                     "check clocks and power capping (`nvidia-smi -q -d CLOCK,POWER`), and that the name matches")
    return Check("peak", "pass", figure, f"{ratio:.0%} of the rated peak ({source})")


def gpu_matmul_rate(device: str, n: int = 8192, repeats: int = 5) -> float:
    """FLOP/s of an n x n float32 matmul (TF32 where TensorFlow enables it) on ``device``, timed synchronised."""
    # Deferred on purpose: TensorFlow starts only once doctor.run has set up the devices.
    import tensorflow as tf

    with tf.device(device):
        a = tf.random.stateless_uniform([n, n], seed=[1, 2])
        b = tf.random.stateless_uniform([n, n], seed=[3, 4])
        mm = tf.function(lambda x, y: tf.matmul(x, y), autograph=False)
        timer.timed(mm, a, b)
        best = min(timer.timed(mm, a, b)[1] for _ in range(repeats))
    return 2.0 * n**3 / best

