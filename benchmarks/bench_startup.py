"""What a fresh ``tftoolkit train`` process costs before and around its training steps, optionally against another
checkout of the toolkit (an A/B of a change to the start-up path).

    python benchmarks/bench_startup.py [--rounds 3] [--against /path/to/other/checkout]

Every sweep point, worker, Slurm task, resumed run and notebook kernel pays these costs once, so on a short run they
are most of its wall time. Each measurement is one fresh process (8 px synthetic images, 2 replicas, 48 steps in
chunks of 2, a checkpoint every 2 steps, 4 evaluations of 4000 images, no measurement steps): the process's wall
and CPU time (user + system, from the OS), and summary.json's ``wall_breakdown``. With ``--against``, the two
checkouts alternate round by round (the machine's speed drifts), both with this interpreter and its packages.
Medians over the rounds; both must train the same numbers (the final loss is printed).

Make an old checkout with ``git worktree add /tmp/old <commit>``.

Benchmarks are not tests: this prints figures measured in one run; they go into BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--replicas", "2", "--per-replica-batch", "16", "--base-lr", "0.05", "--warmup-epochs", "0",
        "--schedule", "constant", "--optimizer", "momentum", "--lr-rule", "linear", "--steps", "48", "--model", "small_cnn",
        "--dataset", "synthetic", "--train-images", "384", "--image-size", "8", "--steps-per-loop", "2",
        "--checkpoint-every", "2", "--timing-warmup-steps", "0", "--no-measure", "--quiet"]
PARTS = ("import_s", "setup_s", "tracing_s", "evaluation_s", "checkpoints_s", "train_steps_s")


def one_run(tree: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "TF_CPP_MIN_LOG_LEVEL": "2"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tftoolkit", "train", "--out", str(out), *ARGS], env=env,
                          cwd=tree, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: tftoolkit train failed:\n{done.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, **{k: s["wall_breakdown"][k] for k in PARTS}, "final_loss": s["final_loss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per checkout (default 3)")
    ap.add_argument("--against", type=Path, default=None,
                    help="another checkout of the toolkit to compare with (e.g. a git worktree of an older commit)")
    a = ap.parse_args()
    trees = {"this": ROOT} if a.against is None else {"this": ROOT, "against": a.against.resolve()}
    rows = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for r in range(a.rounds):
            for name, tree in trees.items():
                run = one_run(tree, Path(tmp) / f"{name}-{r}")
                rows[name].append(run)
                print(f"round {r + 1} {name}: wall {run['wall_s']:.2f} s, cpu {run['cpu_s']:.2f} s", flush=True)
    cols = ("wall_s", "cpu_s", *PARTS)
    print("\n| checkout | " + " | ".join(cols) + " | final loss |")
    print("|---|" + "---|" * (len(cols) + 1))
    for name, runs in rows.items():
        med = [statistics.median(run[c] for run in runs) for c in cols]
        losses = sorted({f"{run['final_loss']:.7g}" for run in runs})
        print(f"| {name} ({trees[name]}) | " + " | ".join(f"{m:.2f}" for m in med) + f" | {', '.join(losses)} |")


if __name__ == "__main__":
    main()
