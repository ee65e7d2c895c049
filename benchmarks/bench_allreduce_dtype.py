"""What does a bfloat16 gradient all-reduce save against float32?

For each model (resnet20 and small_vgg at 32x32x3, 10 classes: their full gradient sets, every trainable tensor),
one all-reduce of all its gradients over --replicas simulated replicas, as the training step does it with
``--allreduce-dtype``: cast each float32 gradient to the dtype, one SUM all-reduce of them all, cast back
(collectives.all_reduce_gradients through measure.allreduce.time_allreduce, the timing `tftoolkit bench allreduce`
uses). A = float32, B = bfloat16, interleaved in one process: each round times A and B of each model back to back,
the order alternated A B / B A from round to round, so the slow drift of a shared machine cancels in the per-round
ratio B / A. The strategy is the one training builds (engine.strategy.make_strategy with --cross-device-ops, auto:
reduce_to_one between CPU replicas).

Each figure is time_allreduce's time_s: (a call of `iters` chained all-reduces - the same call without them) /
iters, median of --repeats interleaved pairs. The casts are in the timed part (they are what bfloat16 costs a
step); the call's dispatch and copies are not. `iters` follows the float32 size, as in `bench allreduce`, so A and
B run calls of the same shape. A figure the call's noise swallows is marked "(unresolved)".

On CPU replicas there is no link: the "transfer" is memory traffic on one host, and bfloat16 adds casts and
bfloat16 additions the CPU may not do natively. What a halved message buys on a real interconnect is for a GPU run.

    python benchmarks/bench_allreduce_dtype.py [--rounds 10] [--replicas 4] [--models resnet20,small_vgg]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
A, B = "float32", "bfloat16"


def machine_speed() -> str:
    """benchmarks/machine_speed.py's figure, in a child process (its loop is single-threaded)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "machine_speed.py")], capture_output=True,
                         text=True, check=True).stdout
    return out.split()[-2] + " s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="A/B pairs per model")
    ap.add_argument("--replicas", type=int, default=4, help="simulated replicas (MirroredStrategy)")
    ap.add_argument("--models", default="resnet20,small_vgg", help="models whose gradient sets are all-reduced")
    ap.add_argument("--repeats", type=int, default=10, help="timed pairs per figure (time_allreduce)")
    ap.add_argument("--cross-device-ops", default="auto", help="as in training (default: auto)")
    args = ap.parse_args(argv)

    speed_before = machine_speed()
    from tftoolkit.engine import devices

    setup = devices.init(args.replicas)
    import tensorflow as tf

    from tftoolkit.config import DTYPE_BYTES
    from tftoolkit.engine.strategy import make_strategy
    from tftoolkit.measure.allreduce import (EXTRA_REPEATS, FLOAT32_BYTES, MAX_CHAIN, chain_length,
                                             model_gradient_set, time_allreduce)

    strategy, impl = make_strategy(setup, args.cross_device_ops)
    models = {}
    for name in [m for m in args.models.split(",") if m]:
        shapes, dtypes = model_gradient_set(name)
        elements = sum(math.prod(s) for s in shapes)
        models[name] = (shapes, dtypes, elements, chain_length(elements * FLOAT32_BYTES, MAX_CHAIN))

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}, python {platform.python_version()}, tensorflow {tf.__version__}; "
          f"machine_speed {speed_before} before; {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"all-reduce: {impl} over {strategy.num_replicas_in_sync} replicas ({setup.kind}); {args.rounds} rounds, "
          f"A = {A}, B = {B}, order A B / B A alternating; each figure the median of {args.repeats} pairs")
    for name, (shapes, _, elements, iters) in models.items():
        print(f"  {name}: {len(shapes)} tensors, {elements:,} parameters: {A} {elements * DTYPE_BYTES[A]:,} B, "
              f"{B} {elements * DTYPE_BYTES[B]:,} B per all-reduce; {iters} chained per timed call")

    def measure(name: str, dtype: str) -> dict:
        shapes, dtypes, _, iters = models[name]
        return time_allreduce(strategy, shapes, dtypes=dtypes, repeats=args.repeats, warmup=1, iters=iters,
                              max_repeats=EXTRA_REPEATS * args.repeats, allreduce_dtype=dtype)

    def shown(t: dict) -> str:
        return f"{t['time_s'] * 1e3:.3f} ms" + ("" if t["resolved"] else " (unresolved)")

    results = {name: [] for name in models}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for name in models:
            got = {}
            for dtype in ((A, B) if r % 2 == 0 else (B, A)):
                got[dtype] = measure(name, dtype)
            a, b = got[A], got[B]
            ratio = b["time_s"] / a["time_s"] if a["time_s"] > 0 else float("nan")
            results[name].append((a, b, ratio))
            print(f"  round {r + 1} {name}: {A} {shown(a)}, {B} {shown(b)}: {B}/{A} {ratio:.3f}", flush=True)

    print(f"rounds took {time.perf_counter() - t0:.0f} s; machine_speed {machine_speed()} after")
    for name, rows in results.items():
        ratios = [x for _, _, x in rows if x == x]
        a_ms = statistics.median(a["time_s"] for a, _, _ in rows) * 1e3
        b_ms = statistics.median(b["time_s"] for _, b, _ in rows) * 1e3
        unresolved = sum(not a["resolved"] for a, _, _ in rows) + sum(not b["resolved"] for _, b, _ in rows)
        print(f"{name}: median {B}/{A} {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max "
              f"{max(ratios):.3f}, {len(ratios)} rounds); median time {A} {a_ms:.3f} ms, {B} {b_ms:.3f} ms per "
              f"all-reduce; {unresolved} of {2 * len(rows)} figures unresolved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
