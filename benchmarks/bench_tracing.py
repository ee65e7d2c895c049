"""Tracing the training step with synchronized batch norm: the toolkit's SyncBatchNorm and engine.collectives
against Keras' ``BatchNormalization(synchronized=True)`` and plain ``ReplicaContext.all_reduce``.

    python benchmarks/bench_tracing.py [--models small_cnn_bn,resnet20] [--replicas 1,2,4] [--rounds 1]

Each measurement is a fresh ``tftoolkit train`` process (tracing costs are per process): 4 steps of synthetic
16 px images, 16 per replica, no measurement; the figure is summary.json's ``wall_breakdown.tracing_s``.
"keras" runs the same command with the models' batch-norm layer swapped for Keras' own and every
collectives sum replaced by ``ctx.all_reduce`` (what the toolkit did before), so the difference is the
custom-gradient graph walks collectives.py explains. Both give the same training (tests/engine/test_collectives.py).

Benchmarks are not tests: this prints figures measured in one run; they go into BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs `tftoolkit train` with what the toolkit had before SyncBatchNorm and engine.collectives.
KERAS_VARIANT = """
import sys
import tensorflow as tf
from tftoolkit.engine import collectives, models, step

def keras_bn():
    return lambda **kw: tf.keras.layers.BatchNormalization(synchronized=True, **kw)

def plain_sum(values, options=None):  # collectives.all_sum_no_gradient's signature, without its stop_gradient
    return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, values, options=options)

models._sync_bn_layer = keras_bn
collectives.all_sum_no_gradient = step.all_sum_no_gradient = plain_sum
from tftoolkit import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def trace_seconds(variant: str, model: str, replicas: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        args = ["train", "--out", str(out), "--quiet", "--model", model, "--replicas", str(replicas),
                "--per-replica-batch", "16", "--steps", "4", "--steps-per-loop", "2", "--no-measure",
                "--dataset", "synthetic", "--image-size", "16", "--train-images", "512"]
        cmd = [sys.executable, "-m", "tftoolkit", *args] if variant == "toolkit" else \
            [sys.executable, "-c", KERAS_VARIANT, *args]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"{variant} {model} x{replicas} failed: {done.stderr[-2000:]}")
        return json.loads((out / "summary.json").read_text())["wall_breakdown"]["tracing_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="small_cnn_bn,resnet20", help="comma-separated model names")
    p.add_argument("--replicas", default="1,2,4", help="comma-separated replica counts")
    p.add_argument("--rounds", type=int, default=1, help="measurements per setting (the median is printed)")
    a = p.parse_args()
    print(f"{'model':14s} {'replicas':>8s} {'keras s':>9s} {'toolkit s':>10s} {'ratio':>7s}")
    for model in a.models.split(","):
        for r in (int(x) for x in a.replicas.split(",")):
            got = {}
            for variant in ("keras", "toolkit"):  # interleaved rounds: a busy moment hits both
                got[variant] = sorted(trace_seconds(variant, model, r) for _ in range(a.rounds))[a.rounds // 2]
            print(f"{model:14s} {r:8d} {got['keras']:9.2f} {got['toolkit']:10.2f} "
                  f"{got['keras'] / got['toolkit']:7.2f}", flush=True)


if __name__ == "__main__":
    main()
