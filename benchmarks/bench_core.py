"""Core loop benchmark: the toolkit's custom loop vs Keras ``model.fit``, at 1 and 4 replicas, same global batch.

Every measurement runs in a fresh process (thread pools and logical devices are fixed per process), and
the configurations are interleaved over several rounds so that drift in the machine's load hits all of
them alike. Throughput = images of the last epoch / the wall time of that epoch (tracing and warm-up are
in the first epoch; evaluation is off for both).

    .venv/bin/python benchmarks/bench_core.py [--rounds 3] [--epochs 2] [--global-batch 256]

Prints a table and the ratios the core issue asks for:
  toolkit / fit (same replicas)            target >= 1.0, aim 1.2
  toolkit epoch time, 4 replicas / 1       target <= 1.10
  run-to-run spread (max/min over rounds)  the toolkit must be far steadier than fit
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

N_TRAIN = 16000


def one(kind: str, replicas: int, epochs: int, global_batch: int, steps_per_loop: int) -> dict:
    """Run one measurement in this process and return its figures."""
    if kind == "toolkit":
        import tempfile

        import pandas as pd

        import tftoolkit
        from tftoolkit.config import RunConfig

        # The same model, optimiser, learning rate and images as the fit below, not the toolkit's defaults (small_vgg
        # and Adam since 2026-12-01): the comparison is of the loops.
        cfg = RunConfig(replicas=replicas, global_batch=global_batch, epochs=epochs, dataset="synthetic",
                        image_size=32, model="small_cnn", optimizer="momentum", base_lr=0.02, base_batch=256,
                        lr_rule="linear", warmup_epochs=0.0, schedule="constant", augment=False,
                        train_images=N_TRAIN, deterministic=False,  # fit runs without op determinism
                        eval_every_epoch=False, steps_per_loop=steps_per_loop, **_measure_off())
        with tempfile.TemporaryDirectory() as d:
            tftoolkit.train(cfg, os.path.join(d, "run"), quiet=True)
            steps = pd.read_csv(os.path.join(d, "run", "steps.csv"))
        last = steps[steps["epoch"] == epochs - 1]
        return {"images_per_sec": len(last) * global_batch / last["step_time_s"].sum()}

    # Keras model.fit with its defaults: logical CPU devices as TensorFlow documents them, default thread
    # pools, a MirroredStrategy over those devices with its default cross-device ops.
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * max(replicas, 4))
    import keras

    from tftoolkit.engine import models
    from tftoolkit.data import source as data

    keras.utils.set_random_seed(0)
    x, y = data.synthetic_arrays(N_TRAIN, 32, 10, seed=0)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    with strategy.scope():
        model = models.build("small_cnn", (32, 32, 3), 10)
        model.compile(keras.optimizers.SGD(0.02 * global_batch / 256, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (tf.cast(a, tf.float32) / 255.0, b))
    ds = ds.shuffle(N_TRAIN, seed=0).batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.last = time.perf_counter() - self.t0

    timer = EpochTimer()
    model.fit(ds, epochs=epochs, verbose=0, callbacks=[timer])
    return {"images_per_sec": (N_TRAIN // global_batch) * global_batch / timer.last}


def _measure_off() -> dict:
    """Turn off post-training measurements where the config has them (they add steps outside the timing)."""
    from tftoolkit.config import RunConfig

    fields = RunConfig.__dataclass_fields__
    return {k: False for k in ("measure", "noise_scale") if k in fields}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of every configuration")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per run; the last one is timed")
    ap.add_argument("--global-batch", type=int, default=256, help="global batch, the same for every run")
    ap.add_argument("--steps-per-loop", type=int, default=20, help="toolkit steps per tf.function call")
    ap.add_argument("--one", nargs=2, metavar=("KIND", "REPLICAS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.epochs < 2:
        ap.error(f"--epochs {args.epochs}: give at least 2; the last epoch is timed, and the first holds the tracing")
    if args.one:
        res = one(args.one[0], int(args.one[1]), args.epochs, args.global_batch, args.steps_per_loop)
        print("RESULT " + json.dumps(res))
        return 0

    configs = [("toolkit", 1), ("toolkit", 4), ("fit", 1), ("fit", 4)]
    results: dict = {c: [] for c in configs}
    for r in range(args.rounds):
        for kind, reps in configs:
            cmd = [sys.executable, __file__, "--one", kind, str(reps), "--epochs", str(args.epochs),
                   "--global-batch", str(args.global_batch), "--steps-per-loop", str(args.steps_per_loop)]
            out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
            line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
            if not line:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            ips = json.loads(line[0][7:])["images_per_sec"]
            results[(kind, reps)].append(ips)
            print(f"round {r + 1}: {kind:7s} x{reps}: {ips:8.1f} images/sec", flush=True)

    print("\nconfiguration       median img/s   min     max    spread(max/min)")
    med = {}
    for (kind, reps), v in results.items():
        med[(kind, reps)] = statistics.median(v)
        print(f"{kind:7s} {reps} replica(s) {med[(kind, reps)]:10.1f} {min(v):8.1f} {max(v):8.1f}   {max(v) / min(v):.3f}")
    print("\nratios (medians):")
    print(f"  toolkit / fit, 1 replica : {med[('toolkit', 1)] / med[('fit', 1)]:.3f}   (target >= 1.0)")
    print(f"  toolkit / fit, 4 replicas: {med[('toolkit', 4)] / med[('fit', 4)]:.3f}   (target >= 1.0)")
    print(f"  toolkit epoch time 4 vs 1 replica (same global batch): "
          f"{med[('toolkit', 1)] / med[('toolkit', 4)]:.3f}   (target <= 1.10)")
    print(f"  fit epoch time 4 vs 1 replica: {med[('fit', 1)] / med[('fit', 4)]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
