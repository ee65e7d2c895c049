"""What op determinism costs on CPU replicas, where ``--deterministic`` is on by default (config: "on for CPU
replicas, where it is free").

The same training with ``deterministic`` on and off, each in a fresh process (op determinism is fixed per process),
alternating over rounds so that drift in the machine's load hits both alike. Throughput = images of the last epoch /
the sum of its step times (the first epoch holds the tracing); small_cnn, momentum, 32 px synthetic images, global
batch 256, no evaluation or measurement.

    .venv/bin/python benchmarks/bench_determinism.py [--rounds 3] [--replica-counts 1,4]

Prints every run, then per replica count the median ratio on / off and the ratio pair by pair (target: >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def one(deterministic: bool, replicas: int) -> dict:
    import pandas as pd

    import tftoolkit
    from tftoolkit.config import RunConfig

    cfg = RunConfig(replicas=replicas, global_batch=256, epochs=2, dataset="synthetic", image_size=32, model="small_cnn",
                    optimizer="momentum", base_lr=0.02, base_batch=256, lr_rule="linear", warmup_epochs=0.0,
                    schedule="constant", augment=False, eval_every_epoch=False, steps_per_loop=20, measure=False,
                    deterministic=deterministic)
    with tempfile.TemporaryDirectory() as d:
        summary = tftoolkit.train(cfg, os.path.join(d, "run"), quiet=True)
        steps = pd.read_csv(os.path.join(d, "run", "steps.csv"))
    last = steps[steps["epoch"] == 1]
    return {"images_per_sec": len(last) * 256 / last["step_time_s"].sum(), "deterministic": summary.get("deterministic")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="alternating on/off pairs per replica count")
    ap.add_argument("--replica-counts", default="1,4", help="comma-separated replica counts")
    ap.add_argument("--one", nargs=2, metavar=("ON", "REPLICAS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one[0] == "1", int(args.one[1]))))
        return 0
    counts = [int(c) for c in args.replica_counts.split(",")]
    runs: dict = {}
    for r in range(args.rounds):
        for replicas in counts:
            for on in ("1", "0"):
                done = subprocess.run([sys.executable, __file__, "--one", on, str(replicas)], capture_output=True,
                                      text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
                line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                if not line:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                result = json.loads(line[0][7:])
                if result["deterministic"] is not (on == "1"):
                    print(f"the run recorded deterministic={result['deterministic']}, asked {on == '1'}", file=sys.stderr)
                    return 1
                runs.setdefault((replicas, on), []).append(result["images_per_sec"])
                print(f"round {r + 1}: {replicas} replica(s), deterministic {'on ' if on == '1' else 'off'}: "
                      f"{result['images_per_sec']:8.1f} images/sec", flush=True)
    print()
    for replicas in counts:
        on, off = runs[(replicas, "1")], runs[(replicas, "0")]
        pairs = ", ".join(f"{a / b:.3f}" for a, b in zip(on, off))
        print(f"{replicas} replica(s): on / off {statistics.median(on) / statistics.median(off):.3f} "
              f"(medians {statistics.median(on):.0f} / {statistics.median(off):.0f} images/sec; pairs {pairs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
