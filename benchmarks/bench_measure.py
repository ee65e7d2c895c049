"""Measurement benchmark: all-reduce bandwidth on simulated replicas, and the cost of timing.

    .venv/bin/python benchmarks/bench_measure.py [--replicas 4] [--repeats 10] [--rounds 7]

1. All-reduce of one 64 MiB float32 buffer across 4 logical CPU devices, per implementation (median of
   --repeats after warm-up), as busbw = size/time x 2(n-1)/n, next to a plain NumPy sum of four 64 MiB
   arrays (np.sum over a (4, N) array: the least memory traffic any all-reduce on one host needs, so the
   "interconnect's" ceiling here is memory bandwidth).
2. TensorFlow's default CPU choice (MirroredStrategy with no cross_device_ops = CollectiveAllReduce RING) vs
   reduce_to_one at 16 MiB: engine/strategy.py says the former is ~25x slower; this measures the ratio.
3. Instrumentation overhead: train_loop calls timed as the training loop times them (perf_counter around
   each call, wait on the returned losses) vs the same calls back to back with one wait at the end.
   Interleaved rounds; the median of the per-round ratios, in wall time and in this process's CPU time
   (less disturbed by other jobs on a shared machine). Target <= 3%.
4. What measure.summary_fields costs after a run (seconds), for scale.

Prints one table per part and the figures BENCHMARKS.md records.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MIB = 2**20


def numpy_sum(size_bytes: int, replicas: int, repeats: int, threads: int = 1) -> float:
    """Median seconds of np.sum over a (replicas, N) float32 array; ``threads`` > 1 splits the columns over
    threads (NumPy releases the GIL in the ufunc loop), as TensorFlow's AddN uses the intra-op pool."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    n = size_bytes // 4
    stack = np.random.default_rng(0).standard_normal((replicas, n)).astype(np.float32)
    out = np.empty(n, np.float32)
    bounds = [(i * n // threads, (i + 1) * n // threads) for i in range(threads)]
    pool = ThreadPoolExecutor(threads)

    def run():
        list(pool.map(lambda b: np.sum(stack[:, b[0]:b[1]], axis=0, out=out[b[0]:b[1]]), bounds))

    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    pool.shutdown()
    return statistics.median(times)


def allreduce_part(replicas: int, repeats: int) -> dict:
    from tftoolkit.engine import devices
    from tftoolkit.measure import allreduce

    setup = devices.init(replicas)
    print(f"\n## 1. all-reduce of 64 MiB across {replicas} logical CPU devices (median of {repeats})")
    print(f"{'impl':18s} {'detail':28s} {'time ms':>9s} {'algbw GB/s':>11s} {'busbw GB/s':>11s}")
    rows = {}
    for impl in allreduce.IMPLS:
        ok, why = allreduce.availability(impl, setup)
        if not ok:
            print(f"{impl:18s} skipped: {why}")
            continue
        strategy, options, detail = allreduce.make_strategy(impl, setup)
        t = allreduce.time_allreduce(strategy, [(64 * MIB // 4,)], options=options, repeats=repeats, warmup=2)
        rows[impl] = t["time_s"]
        print(f"{impl:18s} {detail:28s} {t['time_s'] * 1e3:9.2f} {allreduce.algbw_gbps(64 * MIB, t['time_s']):11.3f} "
              f"{allreduce.busbw_gbps(64 * MIB, t['time_s'], replicas):11.3f}")
    t_np = None  # the single-thread NumPy sum's time, the reference
    for threads in (1, devices.host_cores()):
        t = numpy_sum(64 * MIB, replicas, repeats, threads)
        t_np = t if t_np is None else t_np
        label = f"np.sum ({replicas}, 16Mi) f32, {threads} thr"
        print(f"{'numpy sum':18s} {label:28s} {t * 1e3:9.2f} "
              f"{allreduce.algbw_gbps(64 * MIB, t):11.3f} {allreduce.busbw_gbps(64 * MIB, t, replicas):11.3f}"
              f"   (reads {replicas * 64} MiB, writes 64 MiB: {(replicas + 1) * 64 * MIB / t / 1e9:.2f} GB/s of memory)")
    best = min(rows, key=rows.get)
    print(f"fastest: {best}, {rows[best] / t_np:.2f}x the single-thread NumPy sum's time")

    print(f"\n## 2. TF's default CPU all-reduce vs reduce_to_one, 16 MiB, {replicas} replicas (median of {repeats})")
    ratios = {}
    for size in (16 * MIB, 64 * MIB):
        times = {}
        for impl in ("tf_default", "reduce_to_one"):
            strategy, options, _ = allreduce.make_strategy(impl, setup)
            times[impl] = allreduce.time_allreduce(strategy, [(size // 4,)], options=options, repeats=repeats,
                                                   warmup=2)["time_s"]
        ratios[size] = times["tf_default"] / times["reduce_to_one"]
        print(f"{size // MIB:3d} MiB: tf_default {times['tf_default'] * 1e3:.2f} ms, reduce_to_one "
              f"{times['reduce_to_one'] * 1e3:.2f} ms -> ratio {ratios[size]:.2f}")
    return {"allreduce_64MiB_s": rows, "numpy_64MiB_s": t_np, "default_vs_rto": ratios}


def overhead_part(replicas: int, rounds: int, loops: int = 5, steps_per_loop: int = 10) -> dict:
    import tensorflow as tf

    from tftoolkit.config import RunConfig
    from tftoolkit.data import pipeline
    from tftoolkit.engine import session
    from tftoolkit.engine.step import build_engine

    # small_cnn with momentum, as the page says and the figures were measured (the defaults changed on 2026-12-01).
    sess = session.start(RunConfig(replicas=replicas, per_replica_batch=32, steps_per_loop=steps_per_loop,
                                   dataset="synthetic", train_images=4096, model="small_cnn", optimizer="momentum", base_lr=0.02, lr_rule="linear", warmup_epochs=0.0, schedule="constant"))
    cfg, source, strat, impl = sess.config, sess.source, sess.strategy, sess.impl
    engine = build_engine(cfg, strat, source, source.train_examples)
    it = iter(pipeline.train_input(strat, source, cfg))
    n = tf.constant(steps_per_loop, tf.int32)
    for _ in range(3):  # trace, autotune
        engine.train_loop(it, n)[0].numpy()

    def timed() -> tuple[float, float]:  # what engine.loop.drive does around each call
        times = []
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(loops):
            t0 = time.perf_counter()
            losses, counts = engine.train_loop(it, n)
            losses = losses.numpy()
            times.append(time.perf_counter() - t0)
        return time.perf_counter() - w0, time.process_time() - c0

    def bare() -> tuple[float, float]:  # the same work with nothing around it and one wait at the end
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(loops):
            losses, counts = engine.train_loop(it, n)
        losses.numpy()
        return time.perf_counter() - w0, time.process_time() - c0

    # The timing work alone, per loop: two perf_counter calls, reading the (already finished) losses, an append.
    losses, _ = engine.train_loop(it, n)
    losses.numpy()
    k, times = 20000, []
    t_all = time.perf_counter()
    for _ in range(k):
        t0 = time.perf_counter()
        losses.numpy()
        times.append(time.perf_counter() - t0)
    per_loop_work = (time.perf_counter() - t_all) / k

    wall, cpu, bare_loop = [], [], []
    for r in range(rounds):
        pair = (timed, bare) if r % 2 == 0 else (bare, timed)
        res = {f.__name__: f() for f in pair}
        wall.append(res["timed"][0] / res["bare"][0])
        bare_loop.append(res["bare"][0] / loops)
        cpu.append(res["timed"][1] / res["bare"][1])
    print(f"\n## 3. instrumentation overhead: small_cnn, {replicas} replicas ({impl}), {loops} loops x "
          f"{steps_per_loop} steps per round, {rounds} rounds, timed/bare alternating first")
    loop_s = statistics.median(bare_loop)
    print(f"timing work per loop {per_loop_work * 1e6:.1f} us vs a {loop_s * 1e3:.1f} ms loop: "
          f"{100 * per_loop_work / loop_s:.4f}% (upper bound of what timing adds on CPU, where calls are synchronous)")
    out = {"per_loop_work_s": per_loop_work, "loop_s": loop_s}
    for name, ratios in (("wall", wall), ("cpu", cpu)):
        q = statistics.quantiles(ratios, n=4)
        med = statistics.median(ratios)
        print(f"{name:4s} time, timed / bare: median {100 * (med - 1):+.2f}% (quartiles {100 * (q[0] - 1):+.2f}% .. "
              f"{100 * (q[2] - 1):+.2f}%, min {100 * (min(ratios) - 1):+.2f}%, max {100 * (max(ratios) - 1):+.2f}%)")
        out[name] = ratios
    return out


def measure_cost_part(replicas: int, models=("small_cnn", "resnet20")) -> dict:
    import tempfile

    import tftoolkit
    from tftoolkit.config import RunConfig

    out = {}
    with tempfile.TemporaryDirectory() as d:
        for model in models:
            cfg = RunConfig(replicas=replicas, model=model, per_replica_batch=32, steps=40, steps_per_loop=10,
                            dataset="synthetic", train_images=4096, eval_every_epoch=False)
            s = tftoolkit.train(cfg, os.path.join(d, model), quiet=True)
            out[model] = s
    print(f"\n## 4. measure.summary_fields after a 40-step run, {replicas} replicas")
    print(f"{'model':10s} {'measure s':>9s} {'run s':>7s} {'step ms':>8s} {'compute':>8s} {'allred.':>8s} "
          f"{'direct':>8s} {'input':>8s} {'comm%':>6s} {'MFU%':>6s}")
    for model, s in out.items():
        print(f"{model:10s} {s['measure_time_s']:9.1f} {s['wall_time_s']:7.1f} {s['step_time_s'] * 1e3:8.2f} "
              f"{s['compute_time_s'] * 1e3:8.2f} {s['allreduce_time_s'] * 1e3:8.2f} "
              f"{s['allreduce_direct_time_s'] * 1e3:8.2f} {s['input_wait_s'] * 1e3:8.2f} "
              f"{100 * s['communication_fraction']:6.1f} {100 * s['mfu']:6.1f}")
        print(f"           {s['communication_note']}; peak: {s['peak_flops_source']}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=10, help="timed all-reduce calls per figure")
    ap.add_argument("--rounds", type=int, default=20, help="timed/bare pairs for the overhead")
    ap.add_argument("--parts", default="1,3,4", help="which parts to run (2 runs with 1)")
    ap.add_argument("--models", default="small_cnn,resnet20", help="models for part 4")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error(f"--rounds {args.rounds}: give at least 2; the overhead is a median and quartiles over the pairs")
    from tftoolkit.engine import devices

    devices.init(args.replicas)
    print(f"load average before: {os.getloadavg()}; host cores: {devices.host_cores()}; "
          f"threads: {devices.thread_settings()}; {time.strftime('%Y-%m-%d %H:%M %Z')}")
    parts = set(args.parts.split(","))
    if "1" in parts or "2" in parts:
        allreduce_part(args.replicas, args.repeats)
    if "3" in parts:
        overhead_part(2, args.rounds)
    if "4" in parts:
        measure_cost_part(args.replicas, args.models.split(","))
    print(f"\nload average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
