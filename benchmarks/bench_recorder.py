"""What does tftoolkit.RunRecorder cost a model.fit? Target: at most 2% less throughput.

The same fit (notebook 06's model and data: small_cnn on 32x32 shapes, MirroredStrategy over --replicas simulated
replicas, 64 examples per replica per step) without (A) and with (B) the recorder, in one process, alternating
A B / B A over --rounds rounds after one warm-up fit of each, so that the slow drift of a shared machine cancels.
Each fit is timed from the call of model.fit to its return: what a user waits for, the recorder's set-up and its
files included. Prints:
  - the throughput ratio with / without over all rounds (examples per wall second of all recorded fits over all
    plain ones), and the median and range of the per-round ratios, per wall second and per CPU second of the
    process (which other processes on a shared machine disturb less);
  - the recorder's own time in fit's thread (its hooks, timed): once per fit (on_train_begin: lock, config, env,
    TensorBoard, monitor; on_train_end: rows, summary, files) and per step (the device sync and the clock per call,
    an epoch's rows and events), as a share of the plain fit. On a machine whose speed drifts, this is the figure
    to trust; the ratio of a longer fit follows from it: overhead = (once + steps x per step) / the fit's time.
    What it leaves out: the monitor's thread (benchmarks/bench_monitor.py), and Keras running the callbacks in the
    training thread once one needs batch ends (no effect on CPU replicas, which run synchronously).

    python benchmarks/bench_recorder.py [--rounds 10] [--epochs 2] [--train-images 2048] [--replicas 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

HOOKS = ("on_train_begin", "on_epoch_begin", "on_train_batch_begin", "on_train_batch_end", "on_test_begin",
         "on_test_end", "on_epoch_end", "on_train_end")
FIXED = ("on_train_begin", "on_train_end")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="A/B pairs after the warm-up")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of each fit")
    ap.add_argument("--train-images", type=int, default=2048, help="examples per epoch")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--replicas", type=int, default=2, help="simulated replicas (MirroredStrategy)")
    ap.add_argument("--per-replica-batch", type=int, default=64)
    args = ap.parse_args(argv)
    if args.epochs < 2:
        ap.error(f"--epochs {args.epochs}: give at least 2; the first epoch holds the tracing and is not timed")

    import tftoolkit

    setup = tftoolkit.init_devices(args.replicas)
    import keras
    import tensorflow as tf

    from tftoolkit.experiments import your_fit
    from tftoolkit.training.recorder import RunRecorder

    class Timed(RunRecorder):
        """The recorder, with the time fit's thread spends in its hooks counted: once per fit (on_train_begin,
        on_train_end), per epoch, per call."""

        own = {}

    def timed_hook(name):
        base = getattr(RunRecorder, name)

        def hook(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return base(self, *a, **k)
            finally:
                self.own[name] = self.own.get(name, 0.0) + time.perf_counter() - t0

        return hook

    for name in HOOKS:
        setattr(Timed, name, timed_hook(name))

    (x, y), _ = your_fit.example_data(args.train_images, 0, args.image_size)
    strategy = your_fit.mirrored(setup)
    with strategy.scope():
        model = your_fit.example_model(args.image_size)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batch = args.per_replica_batch * strategy.num_replicas_in_sync
    steps = args.epochs * (args.train_images // batch)
    examples = steps * batch
    x, y = x[:args.train_images // batch * batch], y[:args.train_images // batch * batch]  # whole batches only

    tmp = Path(tempfile.mkdtemp(prefix="bench_recorder-"))
    count = [0]

    class EpochClock(keras.callbacks.Callback):
        """Wall time of each epoch, in both arms (epoch hooks leave Keras' dispatch of batch ends as it is)."""

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.t0)

    def fit(with_recorder: bool) -> dict:
        """Wall and CPU seconds of model.fit, of its epochs after the first, and the recorder's own seconds."""
        clock = EpochClock()
        clock.seconds = []
        callbacks = [clock]
        if with_recorder:
            count[0] += 1
            Timed.own = {}
            callbacks.insert(0, Timed(tmp / f"run{count[0]}", quiet=True))
        w0, c0 = time.perf_counter(), time.process_time()
        model.fit(x, y, batch_size=batch, epochs=args.epochs, verbose=0, callbacks=callbacks)
        own = dict(Timed.own) if with_recorder else {}
        return {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0, "epochs": sum(clock.seconds[1:]),
                "fixed": sum(own.get(k, 0.0) for k in FIXED), "own": sum(own.values()), "hooks": own}

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}, python {platform.python_version()}, tensorflow {tf.__version__}, "
          f"keras {keras.__version__}")
    print(f"fit: small_cnn {args.image_size}x{args.image_size}, {strategy.num_replicas_in_sync} replica(s) "
          f"({setup.kind}), global batch {batch}, {args.epochs} epochs x {args.train_images // batch} steps = "
          f"{steps} steps per fit; {args.rounds} rounds after one warm-up fit of each")
    fit(False), fit(True)  # warm-up: tracing, the data adapter
    rounds = []
    for r in range(args.rounds):
        res = {}
        for with_recorder in ((False, True) if r % 2 == 0 else (True, False)):
            res[with_recorder] = fit(with_recorder)
        a, b = res[False], res[True]
        rounds.append({"a": a, "b": b, "wall": a["wall"] / b["wall"], "cpu": a["cpu"] / b["cpu"],
                       "epochs": a["epochs"] / b["epochs"]})
        print(f"  round {r + 1}: without {a['wall']:.2f} s, with {b['wall']:.2f} s (the recorder's own "
              f"{b['own']:.3f} s): throughput ratio {rounds[-1]['wall']:.4f} per wall second, "
              f"{rounds[-1]['cpu']:.4f} per CPU second, {rounds[-1]['epochs']:.4f} over epochs 2-{args.epochs}")
    total = sum(r["a"]["wall"] for r in rounds) / sum(r["b"]["wall"] for r in rounds)
    print(f"throughput with / without the recorder, whole fits: {total:.4f} (overhead {1 - total:+.2%}) over "
          f"{args.rounds} rounds")
    for key, what in (("wall", "whole fits per wall second"), ("cpu", "whole fits per CPU second"),
                      ("epochs", f"epochs 2-{args.epochs} (set-up and the first epoch left out)")):
        v = [r[key] for r in rounds]
        print(f"  per round, {what}: median {statistics.median(v):.4f}, min {min(v):.4f}, max {max(v):.4f}")
    a = statistics.median(r["a"]["wall"] for r in rounds)
    own = statistics.median(r["b"]["own"] for r in rounds)
    fixed = statistics.median(r["b"]["fixed"] for r in rounds)
    per_step = (own - fixed) / steps
    print(f"without: {examples / a:.1f} examples/s ({a / steps * 1e3:.1f} ms a step). The recorder's own time in "
          f"fit's thread (median): {own:.3f} s a fit = {own / a:.2%} of it; {fixed:.3f} s once (set-up, files) and "
          f"{per_step * 1e3:.3f} ms a step = {per_step / (a / steps):.2%} of a step")
    hooks = {k: statistics.median(r["b"]["hooks"].get(k, 0.0) for r in rounds) for k in HOOKS}
    print("  by hook (median s a fit): " + ", ".join(f"{k} {v:.4f}" for k, v in hooks.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
