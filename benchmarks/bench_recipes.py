"""The defaults learn, and the batch-size study shows Goyal et al.'s result.

    python benchmarks/bench_recipes.py defaults [--out DIR]          # the README's reference commands, defaults
    python benchmarks/bench_recipes.py batch-study [--out DIR]       # sweeps/batch_lr.yaml, then its table
    python benchmarks/bench_recipes.py demo [--out DIR]              # `tftoolkit demo` from scratch, wall time

defaults: `tftoolkit train` with every option at its default on shapes16k, at 4 replicas x 100 and at 1 x 128,
5 epochs each; prints validation accuracy after epochs 1, 3 and 5 (target: >= 0.80 after 5 at both).
batch-study: the demo's batch x LR-rule x warmup sweep (momentum SGD, small_cnn_bn, 2 epochs at every batch);
prints batch x rule x warmup -> final accuracy and the noise scale, and checks the paper's claim: at the largest
batch that holds, linear + warmup is within 5 points of the smallest batch and >= 5 points above no scaling.
Every run resumes: rerunning with the same --out prints the table without training again.

Benchmarks are not tests: this prints figures measured in one run; they go into BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TFTOOLKIT = [sys.executable, "-m", "tftoolkit"]
REFERENCE = {"4x100": ["--replicas", "4", "--per-replica-batch", "100"],
             "1x128": ["--replicas", "1", "--per-replica-batch", "128"]}


def _run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return time.perf_counter() - t0


def defaults(out: Path) -> None:
    rows = []
    for name, args in REFERENCE.items():
        run = out / name
        wall = _run(TFTOOLKIT + ["train", *args, "--epochs", "5", "--out", str(run)])
        with open(run / "evals.csv") as f:
            acc = [float(r["val_accuracy"]) for r in csv.DictReader(f)]
        s = json.loads((run / "summary.json").read_text())
        rows.append((name, acc, s["images_per_sec"], wall))
    print("| run | epoch 1 | epoch 3 | epoch 5 | images/sec | wall (s) |\n|---|---|---|---|---|---|")
    for name, acc, ips, wall in rows:
        print(f"| {name} | {acc[0]:.3f} | {acc[2]:.3f} | {acc[4]:.3f} | {ips:.0f} | {wall:.0f} |")
    print("target: epoch 5 >= 0.80 at both:", all(acc[4] >= 0.80 for _, acc, _, _ in rows))


def batch_study(out: Path) -> None:
    wall = _run(TFTOOLKIT + ["sweep", str(ROOT / "sweeps" / "batch_lr.yaml"), "--out", str(out)])
    from tftoolkit.experiments import findings
    from tftoolkit.experiments.report import results

    res = results.load([out])
    _, _, runs = results.batch_frames(res)
    print(f"sweep wall time {wall:.0f} s (less when it resumed finished points)")
    print("| global batch | LR rule | warmup epochs | LR | status | final val_accuracy | noise scale B_simple |")
    print("|---|---|---|---|---|---|---|")
    for _, r in runs.sort_values(["global_batch", "lr_rule", "warmup_epochs"]).iterrows():
        print(f"| {int(r['global_batch'])} | {r['lr_rule']} | {r['warmup_epochs']:g} | {r['learning_rate']:.4g} | "
              f"{r['status']} | {r['val_accuracy']:.3f} | {r.get('noise_scale', float('nan')):.0f} |")
    for line in findings.batch_and_lr(res):
        print("finding:", line)


def demo(out: Path) -> None:
    wall = _run(TFTOOLKIT + ["demo", "--out", str(out)])
    print(f"tftoolkit demo --out {out}: {wall:.0f} s wall ({wall / 60:.1f} min)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["defaults", "batch-study", "demo"], help="which measurement (see above)")
    p.add_argument("--out", type=Path, default=None, help="where the runs go (default: runs/bench_<what>)")
    args = p.parse_args()
    out = (args.out or ROOT / "runs" / f"bench_{args.what.replace('-', '_')}").resolve()
    {"defaults": defaults, "batch-study": batch_study, "demo": demo}[args.what](out)


if __name__ == "__main__":
    main()
