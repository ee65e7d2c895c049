"""The input path against plain TensorFlow, cold against cached, host against device placement.

    python benchmarks/bench_input.py pipelines [--rounds 5] [--seconds 3]   # input alone, interleaved, one process
    python benchmarks/bench_input.py training  [--rounds 3]                 # training throughput, host vs device
    python benchmarks/bench_input.py wall [--repo DIR] [--out DIR]          # the demo's scaling points' wall time

pipelines: shapes16k, 4 simulated replicas, global batch 400 (the issue's setting). In one process, round after
round, each timed for about --seconds:
  toolkit-host    engine.feed + data.pipeline, host placement: per-replica gathers on the CPU, uint8 to float in
                  the replica function;
  toolkit-device  device placement: indices from the host, the gather and the conversion in the replica function;
  plain-tf        what a user writes with TensorFlow alone over the same records: cache, shuffle (whole set),
                  batch, cast per batch, prefetch, experimental_distribute_dataset;
each pulled in a tf.function through the same MirroredStrategy (the replica function makes the float batch and
touches its last pixel, so nothing is pruned). Prints medians and the toolkit / plain ratio (target >= 1.0), and
the cold read (TFRecords -> memory, data.store.materialize) against the cached rate.
training: `tftoolkit.train` small_cnn, 4 x 100, 60 steps, no measurement, host vs device placement, interleaved.
wall: the demo's scaling points (notebook 01's settings as of 2026-12-04: small_cnn, 64 per replica, 60 steps, measure
on; it runs 150 steps since) at 1, 2
and 4 replicas as fresh `tftoolkit train` processes, with summary.json's wall_breakdown; --repo runs another
checkout (an older commit, for "before") and reads what its summary has.

Benchmarks are not tests: this prints figures measured in one run; they go into BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _quiet_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pipelines(rounds: int, seconds: float) -> None:
    _quiet_tf()
    from tftoolkit.config import RunConfig
    from tftoolkit.data import home, manifest as manifest_mod, tfrecords
    from tftoolkit.engine import feed as feed_mod, session
    from tftoolkit.measure.input.bench import puller

    import tensorflow as tf

    config = RunConfig(replicas=4, per_replica_batch=100, dataset="shapes16k")
    t0 = time.perf_counter()
    sess = session.start(config)
    strategy, source, config = sess.strategy, sess.source, sess.config
    store = source.store("train")
    cold_s = source.info["train_read_s"]
    print(f"set-up {time.perf_counter() - t0:.1f} s; cold read {store.n} images in {cold_s:.2f} s = "
          f"{store.n / cold_s:.0f} images/sec (TFRecords -> memory)")

    # plain TensorFlow over the same records
    path = home.default_dir()
    manifest = manifest_mod.read_manifest(path)
    raw, n, _ = tfrecords.split_dataset(path, manifest, "train", cache=False)
    plain = (raw.map(lambda x, y, i: (x, y)).cache().shuffle(n, seed=0).batch(config.global_batch_size,
             drop_remainder=True).map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y)).prefetch(tf.data.AUTOTUNE)
             .repeat())
    plain_feed = feed_mod.host()
    pulls = {
        "toolkit-host": (feed_mod.host(), lambda f: iter(f.train_input(strategy, source, config))),
        "toolkit-device": (feed_mod.make(config.replace(data_placement="device"), sess.setup, strategy, source),
                           lambda f: iter(f.train_input(strategy, source, config))),
        "plain-tf": (plain_feed, lambda f: iter(strategy.experimental_distribute_dataset(plain))),
    }
    state = {}
    steps_per_epoch = n // config.global_batch_size
    for name, (feed, make) in pulls.items():
        it = make(feed)
        pull = puller(strategy, feed)  # what `tftoolkit bench input` pulls with
        pull(it, tf.constant(steps_per_epoch)).numpy()  # trace, and fill plain-tf's cache (one epoch)
        state[name] = (it, pull)
    rates = {name: [] for name in pulls}
    for r in range(rounds):
        for name, (it, pull) in state.items():
            images, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                images += int(pull(it, tf.constant(20)).numpy())
            rates[name].append(images / (time.perf_counter() - t0))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()), flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("\n| pipeline | images/sec, median of rounds | min | max |\n|---|---|---|---|")
    for k, v in rates.items():
        print(f"| {k} | {med[k]:.0f} | {min(v):.0f} | {max(v):.0f} |")
    ratios = [a / b for a, b in zip(rates["toolkit-host"], rates["plain-tf"])]
    print(f"\ntoolkit-host / plain-tf: median {statistics.median(ratios):.2f} (per round {', '.join(f'{x:.2f}' for x in ratios)});"
          f" target >= 1.0")
    print(f"toolkit-device / toolkit-host: {med['toolkit-device'] / med['toolkit-host']:.2f}")
    print(f"cached / cold: {med['toolkit-host'] / (store.n / cold_s):.1f}x")


def training(rounds: int) -> None:
    _quiet_tf()
    import tftoolkit
    from tftoolkit.config import RunConfig

    import tempfile

    out = Path(tempfile.mkdtemp(prefix="bench-input-"))
    base = RunConfig(replicas=4, per_replica_batch=100, model="small_cnn", steps=60, measure=False,
                     timing_warmup_steps=10, warmup_epochs=0.0, schedule="constant")
    ips = {"host": [], "device": []}
    for r in range(rounds):
        for placement in ips:
            s = tftoolkit.train(base.replace(data_placement=placement, seed=r), out / f"{placement}-{r}", quiet=True)
            ips[placement].append(s["images_per_sec"])
        print(f"round {r + 1}: host {ips['host'][-1]:.0f}, device {ips['device'][-1]:.0f} images/sec", flush=True)
    h, d = statistics.median(ips["host"]), statistics.median(ips["device"])
    print(f"\ntraining images/sec, median of {rounds}: host {h:.0f}, device {d:.0f}; device / host {d / h:.2f}")


def wall(repo: Path, out: Path) -> None:
    rows = []
    for replicas in (1, 2, 4):
        run = out / f"r{replicas}"
        cmd = [sys.executable, "-m", "tftoolkit", "train", "--replicas", str(replicas), "--per-replica-batch", "64",
               "--model", "small_cnn", "--optimizer", "momentum", "--base-lr", "0.02", "--lr-rule", "linear",
               "--warmup-epochs", "0", "--schedule", "constant", "--steps", "60", "--timing-warmup-steps", "10", "--out", str(run), "--quiet"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo), "TF_CPP_MIN_LOG_LEVEL": "2"},
                       stdout=subprocess.DEVNULL)
        process_s = time.perf_counter() - t0
        s = json.loads((run / "summary.json").read_text())
        steps_s = s["step_time_mean_s"] * s["timed_steps"] if "wall_breakdown" not in s else s["wall_breakdown"]["train_steps_s"]
        rows.append((replicas, process_s, s["wall_time_s"], s.get("measure_time_s", float("nan")), steps_s,
                     s.get("wall_breakdown")))
    print("| replicas | process (s) | wall_time_s | measurement (s) | training steps (s) | outside measurement (s) | "
          "limit 2 x steps + 3 (s) |\n|---|---|---|---|---|---|---|")
    for replicas, process_s, wall_s, meas, steps_s, _ in rows:
        outside = wall_s - meas
        print(f"| {replicas} | {process_s:.1f} | {wall_s:.1f} | {meas:.1f} | {steps_s:.1f} | {outside:.1f} | "
              f"{2 * steps_s + 3:.1f} |")
    for replicas, *_, breakdown in rows:
        if breakdown:
            print(f"{replicas} replica(s): " + ", ".join(f"{k} {v:.2f}" for k, v in breakdown.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pipelines", help="input alone: toolkit host / device vs plain tf.data, interleaved")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per pipeline per round (default 3)")
    p = sub.add_parser("training", help="training throughput, host vs device placement")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p = sub.add_parser("wall", help="the demo's scaling points' wall time, as fresh processes")
    p.add_argument("--repo", type=Path, default=ROOT, help="checkout to run (default: this one)")
    p.add_argument("--out", type=Path, default=Path("/tmp/bench-input-wall"), help="run directories")
    args = ap.parse_args()
    if args.what == "pipelines":
        pipelines(args.rounds, args.seconds)
    elif args.what == "training":
        training(args.rounds)
    else:
        wall(args.repo, args.out / args.repo.name)


if __name__ == "__main__":
    main()
