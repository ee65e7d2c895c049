"""How far N replicas drift from one device in float32: resnet20, 1 vs 2 replicas, the same global batch.

    python benchmarks/bench_float32_drift.py [--steps 10] [--model resnet20]

Both runs start from the same weights and see the same examples per step; only how each batch is cut over devices
(and so the order of float32 sums: convolutions over 16 or 32 examples, the all-reduce) differs. Prints the loss
per step of each and their relative difference. In float64 the same pair agrees to 1e-6
(tests/engine/test_equivalence.py); in float32 the first step agrees to rounding and the difference then grows
with each step of a high-LR momentum run: rounding amplified by training, not a bias of the arithmetic.

Benchmarks are not tests: this prints figures measured in one run; they go into BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", default="resnet20")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import pandas as pd

    import tftoolkit
    from tftoolkit.config import RunConfig

    tftoolkit.init_devices(2)
    losses = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in (1, 2):
            cfg = RunConfig(replicas=r, global_batch=32, model=args.model, optimizer="momentum", base_lr=0.05,
                            lr_rule="none", warmup_epochs=0.0, schedule="constant", steps=args.steps,
                            steps_per_loop=args.steps, dataset="synthetic", train_images=1024, measure=False,
                            eval_every_epoch=False, seed=0)
            tftoolkit.train(cfg, f"{tmp}/r{r}", quiet=True)
            losses[r] = pd.read_csv(f"{tmp}/r{r}/steps.csv")["loss"].to_numpy()
    rel = np.abs(losses[1] - losses[2]) / np.abs(losses[1])
    print("| step | loss, 1 device | loss, 2 replicas | relative difference |")
    print("|---|---|---|---|")
    for i, (a, b, d) in enumerate(zip(losses[1], losses[2], rel), 1):
        print(f"| {i} | {a:.5f} | {b:.5f} | {d:.1e} |")


if __name__ == "__main__":
    main()
