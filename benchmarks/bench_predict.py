"""How well the scaling model (tftoolkit.planner.predict) predicts what can be measured here: CPU-simulated replicas.

For each model (``small_cnn``: compute-heavy; ``bench_predict:mlp``, 3.1 M parameters in one dense layer at
a per-replica batch of 8: communication-heavy):

1. ``bench allreduce`` on 2 and 4 replicas with the implementation training uses on CPU (reduce_to_one) gives
   the link: bandwidth and latency fitted on single buffers to the star model (reduce_to_one's shape: every
   buffer through one device, 2(N−1)(S/B + α)); the ring model's fit is shown for comparison.
2. Weak-scaling training runs at 1, 2 and 4 replicas (same per-replica batch, --measure on).
3. Checks, each a relative error (predicted / measured − 1):
   a. full prediction from the 1-replica run alone: compute scaled to N replicas sharing the host's cores
      (``devices="shared"``) + the fitted all-reduce, against the measured step time;
   b. each run's own measured compute_time_s + the fitted all-reduce, against its measured step time without
      input (``step_time_no_input_s``): the additive model with the communication term alone predicted;
   c. the fitted all-reduce against the timed all-reduce of the model's real gradient set (its tensors as the
      step packs them): the communication term alone.

With ``--multiworker``, also the real ring: ``tftoolkit launch`` runs the mlp on 2 and on 4 workers of one
replica each on localhost (MultiWorkerMirroredStrategy, CollectiveAllReduce RING over gRPC). The link is
calibrated from the 2-worker run alone (its measured allreduce_time_s = S/B, α taken as 0) and its compute
(shared cores: scaled by the examples per step); the 4-worker step time is then predicted and compared.

    .venv/bin/python benchmarks/bench_predict.py [--out runs/bench_predict] [--steps 60] [--multiworker]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pandas as pd  # noqa: E402

CASES = (("small_cnn", 32), ("bench_predict:mlp", 8))  # (model, per-replica batch)


def mlp(input_shape, num_classes):
    """Flatten -> Dense(1024) -> logits: many parameters per FLOP, so the all-reduce weighs as much as compute."""
    import keras

    i = keras.Input(input_shape)
    x = keras.layers.Dense(1024, activation="relu")(keras.layers.Flatten()(i))
    return keras.Model(i, keras.layers.Dense(num_classes, dtype="float32")(x), name="mlp")


def check(model: str, per_replica: int, out: Path, steps: int, image_size: int) -> None:
    import tftoolkit
    from tftoolkit.measure.allreduce import bench as allreduce_bench
    from tftoolkit.planner import calibration, comms, forecast, predict

    csvs = []
    for n in (2, 4):
        csvs.append(out / f"allreduce_r{n}")
        allreduce_bench.bench(n, sizes="64KiB..16MiB", impls="reduce_to_one", repeats=7, models=(model,),
                        image_size=image_size, out=csvs[-1], quiet=True)
    runs = {}
    for n in (1, 2, 4):
        cfg = tftoolkit.RunConfig(replicas=n, per_replica_batch=per_replica, model=model, image_size=image_size,
                                  steps=steps, steps_per_loop=10, seed=1, eval_every_epoch=False,
                                  measure_budget=1.0,  # the breakdown is what this checks: never left out for time
                                  # momentum at a constant LR, as when the rows were measured: with today's defaults
                                  # (Adam, sqrt rule, warmup, cosine) the 4-replica run diverged at step 10
                                  optimizer="momentum", base_lr=0.02, lr_rule="linear", warmup_epochs=0.0,
                                  schedule="constant")
        runs[n] = out / f"train_r{n}"
        tftoolkit.train(cfg, runs[n], quiet=True, force=True)
    table = comms.read_allreduce_csvs(csvs)
    grad_mb = json.loads((runs[1] / "summary.json").read_text())["gradient_bytes"] / 1e6
    print(f"\n## {model}, per-replica batch {per_replica}, gradients {grad_mb:.2f} MB")
    links = {}
    for algorithm in ("ring", "star"):
        links[algorithm], fit = comms.fit_link(table, algorithm=algorithm)
        print(f"{algorithm} model fitted to allreduce.csv (single buffers): {links[algorithm].bandwidth_GBps:.2f} GB/s, "
              f"alpha {links[algorithm].latency_us:.1f} us ({fit['rows']} rows, median |error| of the fit "
              f"{fit['median_abs_rel_error']:.1%})")
    # reduce_to_one sends every buffer through one device: the star model is its shape (ring shown in c).
    link = links["star"]
    result = predict.run(runs[1], out / "predict", predict.Scenario(
        allreduce_csv=csvs, interconnects=[], devices="shared", max_replicas=4, gpus_per_host=4, inter_host=None,
        measured=[runs[2], runs[4]], algorithm="star"))
    a = result["comparison_frame"]
    rows = []
    for n in (2, 4):
        s = json.loads((runs[n] / "summary.json").read_text())
        comm = comms.star_allreduce_time(s["gradient_bytes"], n, link)
        rows.append({"replicas": n, "measured_no_input_s": s["step_time_no_input_s"], "compute_s": s["compute_time_s"],
                     "measured_allreduce_s": s["allreduce_time_s"], "predicted_allreduce_s": comm,
                     "predicted_s": s["compute_time_s"] + comm,
                     "error": (s["compute_time_s"] + comm) / s["step_time_no_input_s"] - 1})
    b = pd.DataFrame(rows)
    c = pd.concat([comms.check_gradient_sets(table, links[a], a).assign(model=a) for a in ("star", "ring")])
    print("a. from the 1-replica run (compute shared by N replicas on the same cores + fitted star all-reduce):")
    print(a[["replicas", "step_time_s", "predicted_compute_s", "predicted_allreduce_s", "predicted_step_time_s",
             "error"]].to_string(index=False))
    print("b. each run's own compute + fitted star all-reduce vs its step without input:")
    print(b.to_string(index=False))
    print("c. fitted all-reduce (star, and ring for comparison) vs the timed all-reduce of the model's gradient set:")
    print(c.to_string(index=False))
    print(f"figure: {out / 'predict' / 'predicted_vs_measured.png'}")


def multiworker(out: Path, steps: int, image_size: int) -> None:
    import subprocess
    import sys

    from tftoolkit.planner import calibration, comms, forecast

    runs = {}
    for k in (2, 4):
        runs[k] = out / f"workers{k}"
        cmd = [sys.executable, "-m", "tftoolkit", "launch", "--workers", str(k), "--replicas-per-worker", "1", "--",
               "train", "--model", "bench_predict:mlp", "--per-replica-batch", "8", "--image-size", str(image_size),
               "--steps", str(steps), "--steps-per-loop", "10", "--seed", "1", "--no-eval-every-epoch", "--quiet",
               "--measure-budget", "1", "--optimizer", "momentum", "--base-lr", "0.02", "--lr-rule", "linear",
               "--warmup-epochs", "0", "--schedule", "constant",
               "--force", "--out", str(runs[k])]
        subprocess.run(cmd, check=True, cwd=Path(__file__).parent, stdout=subprocess.DEVNULL)
    s2 = json.loads((runs[2] / "summary.json").read_text())
    link = comms.Link("localhost-grpc", s2["gradient_bytes"] / s2["allreduce_time_s"] / 1e9, 0.0,
                        "2-worker run: allreduce_time_s = S/B")
    cal = calibration.calibrate_summary(s2, "workers2")
    cmp_ = forecast.compare(cal, link, calibration.measured_frame([runs[4]]), devices="shared")
    s4 = json.loads((runs[4] / "summary.json").read_text())
    print(f"\n## multi-worker on localhost (mlp, {s2['cross_device_ops']}): link from 2 workers "
          f"{link.bandwidth_GBps * 1e3:.0f} MB/s; 4 workers predicted vs measured:")
    row = cmp_.iloc[0]
    print(f"step {row['predicted_step_time_s'] * 1e3:.1f} vs {row['step_time_s'] * 1e3:.1f} ms ({row['error']:+.1%}); "
          f"all-reduce {row['predicted_allreduce_s'] * 1e3:.1f} vs {s4['allreduce_time_s'] * 1e3:.1f} ms "
          f"({row['predicted_allreduce_s'] / s4['allreduce_time_s'] - 1:+.1%}); compute "
          f"{row['predicted_compute_s'] * 1e3:.1f} vs {s4['compute_time_s'] * 1e3:.1f} ms "
          f"({row['predicted_compute_s'] / s4['compute_time_s'] - 1:+.1%})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_predict")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--multiworker", action="store_true", help="also check the ring model on localhost workers")
    ap.add_argument("--only-multiworker", action="store_true", help="skip the single-process checks")
    args = ap.parse_args()
    if args.steps < 20:
        ap.error(f"--steps {args.steps}: give at least 20; the first 10 are warm-up and a loop call is 10 steps")

    import tftoolkit

    tftoolkit.init_devices(4)
    pd.set_option("display.width", 200)
    print(f"# {time.strftime('%Y-%m-%d %H:%M %Z')}")
    if not args.only_multiworker:
        for model, b in CASES:
            check(model, b, Path(args.out) / model.replace(":", "_"), args.steps, args.image_size)
    if args.multiworker or args.only_multiworker:
        multiworker(Path(args.out).resolve() / "multiworker", args.steps, args.image_size)


if __name__ == "__main__":
    main()
