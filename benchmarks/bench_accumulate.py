"""What does gradient accumulation cost? Images/sec at K = 1, 2, 4 for the same global batch on 4 simulated
replicas (the cost per example should be near zero), and peak memory at K = 1, 2 and 4 for the same per-replica batch
(it must not grow with K).

Throughput: one engine per K in one process, on the same model and global batch (per-replica batch = global /
(4 x K)), and one of plain steps (K = 1) at each K's micro-batch, each fed by the training pipeline exactly as a run
is. After two warm-up calls of each, --rounds rounds time one call of --steps optimizer steps of every engine, in a
rotated order, with engine.timer's synchronised clock. Prints images/sec per K (median over rounds) and, per round,
each K's time per example against K = 1's at the same global batch (what a user pays for the larger batch), and
against plain steps of the same micro-batch (what accumulating itself adds: a micro-batch is a smaller batch, and
what the model's kernels make of a smaller batch is paid without accumulation too).

Memory: one fresh process per K at the same per-replica batch (so a larger K is a larger global batch) and the same
data, training --steps steps; the peak resident set of the process (ru_maxrss). On CPU replicas device memory is host memory, so
this is where accumulation's buffers show: one float32 copy of the gradients per replica (4 x params bytes each),
whatever K > 1 is.

    python benchmarks/bench_accumulate.py [--rounds 7] [--steps 10] [--model small_vgg] [--global-batch 256]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys

KS = (1, 2, 4)
REPLICAS = 4


def throughput(args) -> None:
    import tftoolkit

    tftoolkit.init_devices(REPLICAS)
    from tftoolkit.config import RunConfig
    from tftoolkit.data import pipeline
    from tftoolkit.engine import loop, session
    from tftoolkit.engine.step import build_engine

    base = dict(replicas=REPLICAS, model=args.model, dataset="synthetic", image_size=32, measure=False,
                optimizer="momentum", base_lr=0.01, warmup_epochs=0.0, schedule="constant", seed=0)
    g = args.global_batch
    # (K, global batch): each K at the same global batch, and plain steps (K = 1) of each K's micro-batch, so a
    # micro-batch's cost splits into what a smaller batch costs anyway and what accumulating adds.
    cases = [(k, g) for k in KS] + [(1, g // k) for k in KS[1:]]
    engines = {}
    for k, batch in cases:
        sess = session.start(RunConfig(**base, global_batch=batch, accumulate=k))
        eng = build_engine(sess.config, sess.strategy, sess.source, sess.source.train_examples)
        it = iter(pipeline.train_input(sess.strategy, sess.source, sess.config, 0))
        for _ in range(2):  # warm-up: the trace, then a call at speed
            loop.timed_call(eng.train_loop, it, args.steps)
        engines[(k, batch)] = (eng, it)
        print(f"K={k}, global batch {batch}: per-replica batch {sess.config.per_replica_batch_size}", flush=True)
    per_example = {c: [] for c in cases}
    for r in range(args.rounds):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for k, batch in order:
            eng, it = engines[(k, batch)]
            per_example[(k, batch)].append(loop.timed_call(eng.train_loop, it, args.steps)[1] / args.steps / batch)
        print(f"round {r + 1}: " + ", ".join(f"K={k}/{b} {per_example[(k, b)][-1] * 1e6:.0f} us/example"
                                             for k, b in cases), flush=True)
    print(f"\nmodel {args.model}, {REPLICAS} simulated replicas, {args.steps} optimizer steps per call, {args.rounds} "
          f"rounds, order rotated; {platform.node()}")
    med = {c: statistics.median(v) for c, v in per_example.items()}
    for k in KS:
        ratios = [t / t1 for t, t1 in zip(per_example[(k, g)], per_example[(1, g)])]
        line = (f"K={k}, global batch {g} (micro-batch {g // (REPLICAS * k)} per replica): {1 / med[(k, g)]:7.0f} "
                f"img/s; per example / K=1's, per round: median {statistics.median(ratios):.3f} "
                f"({min(ratios):.3f}-{max(ratios):.3f})")
        if k > 1:
            own = [t / p for t, p in zip(per_example[(k, g)], per_example[(1, g // k)])]
            line += (f"; / plain steps of the same micro-batch (global {g // k}, {1 / med[(1, g // k)]:.0f} img/s): "
                     f"median {statistics.median(own):.3f} ({min(own):.3f}-{max(own):.3f})")
        print(line)


MEMORY_CHILD = r"""
import json, resource, sys, tempfile
import tftoolkit
from tftoolkit.config import RunConfig
k, per_replica, steps, model = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = RunConfig(replicas=4, per_replica_batch=per_replica, accumulate=k, model=model, dataset="synthetic",
                image_size=32, train_images=per_replica * 4 * 4 * steps, steps=steps, measure=False,
                eval_every_epoch=False, optimizer="momentum", base_lr=0.01, warmup_epochs=0.0, schedule="constant")
s = tftoolkit.train(cfg, tempfile.mkdtemp(), quiet=True)
print(json.dumps({"k": k, "status": s["status"], "params": s["params"],
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def memory(args) -> None:
    rows = []
    for k in KS + KS:  # twice each, alternating: RSS varies a little from process to process
        out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(k), str(args.per_replica_batch), str(args.steps),
                              args.model], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    params = rows[0]["params"]
    by_k = {k: [r["maxrss_mb"] for r in rows if r["k"] == k] for k in KS}
    print(f"\npeak RSS at per-replica batch {args.per_replica_batch} on {REPLICAS} replicas ({args.model}, "
          f"{params} params: one float32 gradient copy per replica = {4 * params * REPLICAS / 2**20:.1f} MiB in all):")
    for k, v in by_k.items():
        print(f"K={k}: {', '.join(f'{x:.0f}' for x in v)} MiB (global batch {args.per_replica_batch * REPLICAS * k})")
    print(f"K=2 - K=1: {min(by_k[2]) - min(by_k[1]):+.0f} MiB, K=4 - K=2: {min(by_k[4]) - min(by_k[2]):+.0f} MiB "
          "(min of each)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per timed call (and per memory run)")
    ap.add_argument("--model", default="small_vgg")
    ap.add_argument("--global-batch", type=int, default=256, help="throughput: the same for every K")
    ap.add_argument("--per-replica-batch", type=int, default=64, help="memory: the same for every K")
    ap.add_argument("--only", choices=("throughput", "memory"))
    args = ap.parse_args(argv)
    if args.only != "memory":
        throughput(args)
    if args.only != "throughput":
        memory(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
