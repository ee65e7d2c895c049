"""Overhead of --noise-scale: the training step with and without it, interleaved on the same machine state.

For each case two engines are built on the same strategy (noise scale off / on), then timed alternately on
one cached batch (no input pipeline), ``steps`` steps per tf.function call, after one warm-up call each.
The figure is the median of the per-round ratios on/off (> 1 means slower with the noise scale), with the
quartiles: on a shared machine single rounds swing, the ratio of interleaved neighbours much less. It is
given per wall second and per CPU second of this process (which other processes' load does not inflate).

    .venv/bin/python benchmarks/bench_noise_scale.py [--rounds 30] [--steps 20] [--cases 2x32,4x32,1x64,1x256]

Cases: several replicas (norms only, four extra scalars in the gradient all-reduce) and one replica (the
batch runs as two halves, the same examples in two smaller forward/backward passes).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

DEFAULT_CASES = "2x32,4x32,1x64,1x256"  # replicas x per-replica batch, small_cnn on 32x32 images


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"replicas x per-replica batch (default: {DEFAULT_CASES})")
    ap.add_argument("--model", default="small_cnn")
    ap.add_argument("--image-size", type=int, default=32)
    args = ap.parse_args()
    cases = [(int(c.split("x")[0]), int(c.split("x")[1]), args.model, args.image_size) for c in args.cases.split(",")]

    import tensorflow as tf

    from tftoolkit.config import RunConfig
    from tftoolkit.data import source as source_mod
    from tftoolkit.engine import devices, feed as feed_mod, session
    from tftoolkit.engine.step import build_engine
    from tftoolkit.measure.breakdown import Replay

    setup_all = devices.init(max(c[0] for c in cases))
    print(f"# {platform.processor() or platform.machine()}, {devices.host_cores()} cores, TF {tf.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {setup_all.kind}")
    print("                                    wall ms/step: off, on, ratio on/off median (quartiles)"
          "   CPU ms/step: off, on, ratio median (quartiles)")
    print("replicas  per_replica  model")
    for replicas, b, model, size in cases:
        # Momentum at a constant LR, as when the row was measured (the defaults became Adam, warmup and cosine).
        cfg = RunConfig(replicas=replicas, per_replica_batch=b, model=model, image_size=size, steps=100,
                        steps_per_loop=args.steps, seed=1, optimizer="momentum", base_lr=0.02, lr_rule="linear", warmup_epochs=0.0, schedule="constant")
        x, y = source_mod.synthetic_arrays(cfg.global_batch_size * 4, size, 10, seed=3)
        sess = session.start(cfg, data=(x, y))
        strat, source = sess.strategy, sess.source
        # One batch already on the devices, replayed (as measure.breakdown does): the noise scale's cost alone.
        it = Replay(feed_mod.host().replay(strat, source, cfg))
        off = build_engine(cfg, strat, source, source.train_examples)
        on = build_engine(cfg.replace(noise_scale=True), strat, source, source.train_examples)

        def timed(eng):
            # Wall time, and this process's CPU time (all TensorFlow threads; other processes' load not counted).
            t0, c0 = time.perf_counter(), time.process_time()
            losses, _ = eng.train_loop(it, tf.constant(args.steps, tf.int32))
            losses.numpy()
            return np.array([time.perf_counter() - t0, time.process_time() - c0]) / args.steps

        timed(off), timed(on)  # trace and warm up
        t_off, t_on = [], []
        for r in range(args.rounds):
            first, second = (off, on) if r % 2 == 0 else (on, off)  # alternate the order within a round
            a, b2 = timed(first), timed(second)
            (t_off, t_on)[first is on].append(a)
            (t_off, t_on)[second is on].append(b2)
        t_off, t_on = np.array(t_off), np.array(t_on)
        cols = []
        for k in (0, 1):  # wall, cpu
            ratios = t_on[:, k] / t_off[:, k]
            q1, med, q3 = np.percentile(ratios, [25, 50, 75])
            cols.append(f"{np.median(t_off[:, k]) * 1e3:8.2f} {np.median(t_on[:, k]) * 1e3:8.2f}  {med:6.3f} "
                        f"({q1:.3f}-{q3:.3f})")
        print(f"{replicas:8d}  {b:11d}  {model:9s}  " + "   ".join(cols))
        assert on.noise is not None and int(on.noise.count.numpy()) > 0


if __name__ == "__main__":
    main()
