"""What crossing process boundaries costs: 2 workers x 2 replicas vs 1 process x 4 replicas, on one machine.

1. Training throughput. The same run (model, data, global batch, seed) as ``tftoolkit train --replicas 4`` and as
   ``tftoolkit launch --workers 2 --replicas-per-worker 2 -- train ...`` (MultiWorkerMirroredStrategy, collective
   ring all-reduce over gRPC on localhost), alternating A/B/A/B so drift of a shared machine cancels. Reports
   each run's images/sec (warm-up excluded, from summary.json) and the ratio 2x2 / 1x4 per pair.
2. All-reduce alone, with tftoolkit.measure.allreduce.time_allreduce (what ``tftoolkit bench allreduce`` times): SUM of one
   float32 buffer per size, and of small_cnn's gradient set, across 4 replicas as
     - 2 workers x 2 logical CPU devices, collective ring over gRPC (the multi-worker path),
     - 1 process x 4 logical CPU devices, collective ring (in-process) and reduce_to_one (what a single
       process uses on CPU by default).
   algbw = size / time, busbw = algbw x 2(n-1)/n with n = 4 (nccl-tests' definitions, GB = 10^9 B).

    python benchmarks/bench_multiworker.py [--pairs 2] [--steps 60] [--sizes 4KiB,64KiB,1MiB,16MiB] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = ["--model", "small_cnn", "--dataset", "synthetic", "--image-size", "32", "--per-replica-batch", "32",
         "--steps-per-loop", "10", "--no-eval-every-epoch", "--no-measure", "--quiet", "--timing-warmup-steps", "10",
         # momentum at a constant LR, as when the row was measured (the defaults became Adam, warmup and cosine)
         "--optimizer", "momentum", "--base-lr", "0.02", "--lr-rule", "linear", "--warmup-epochs", "0",
         "--schedule", "constant"]


# --- workers for part 2 (run as subprocesses of this script) -----------------------------------------------
def allreduce_rows(strategy, label, sizes, repeats, options=None):
    from tftoolkit.measure import allreduce

    payloads = [(f"{s} B", [(s // 4,)], ["float32"], s) for s in sizes]
    shapes, dtypes = allreduce.model_gradient_set("small_cnn")
    payloads.append(("grads:small_cnn", shapes, dtypes, sum(4 * max(1, _prod(s)) for s in shapes)))
    rows = []
    for name, shapes, dtypes, size in payloads:
        r = allreduce.time_allreduce(strategy, shapes, dtypes=dtypes, options=options, repeats=repeats, warmup=2)
        rows.append({"impl": label, "payload": name, "size_bytes": size, "tensors": len(shapes), "time_s": r["time_s"],
                     "algbw_GBps": allreduce.algbw_gbps(size, r["time_s"]),
                     "busbw_GBps": allreduce.busbw_gbps(size, r["time_s"], strategy.num_replicas_in_sync)})
    return rows


def _prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def worker_main(args) -> int:
    """One worker of the 2 x 2 all-reduce timing (TF_CONFIG set by the driver)."""
    from tftoolkit.cluster import spec, workers
    from tftoolkit.engine import devices
    from tftoolkit.engine.strategy import make_multiworker_strategy

    cluster = spec.cluster_from_env()
    workers.mark("started", cluster)
    setup = devices.init(2)
    strategy, _ = make_multiworker_strategy(setup, "auto")
    workers.mark("joined", cluster)
    rows = allreduce_rows(strategy, "2 workers x 2, collective ring (gRPC)", args.sizes, args.repeats)
    if cluster.is_chief:
        Path(args.worker_out).write_text(json.dumps(rows))
    workers.mark("finished", cluster)
    return 0


def local_main(args) -> int:
    """1 process x 4 devices: collective ring and reduce_to_one, made as ``tftoolkit bench allreduce`` makes them."""
    from tftoolkit.engine import devices
    from tftoolkit.measure import allreduce

    setup = devices.init(4)
    rows = []
    for impl, label in (("collective", "1 process x 4, collective ring"), ("reduce_to_one", "1 process x 4, reduce_to_one")):
        strategy, options, _ = allreduce.make_strategy(impl, setup)
        rows += allreduce_rows(strategy, label, args.sizes, args.repeats, options=options)
    Path(args.worker_out).write_text(json.dumps(rows))
    return 0


# --- the driver ----------------------------------------------------------------------------------------------
def run_train(kind: str, out: Path, steps: int) -> dict:
    py = [sys.executable, "-m", "tftoolkit"]
    common = ["--out", str(out), "--steps", str(steps), *TRAIN]
    if kind == "1x4":
        cmd = py + ["train", "--replicas", "4", *common]
    else:
        cmd = py + ["launch", "--workers", "2", "--replicas-per-worker", "2", "--", "train", *common]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{r.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"kind": kind, "images_per_sec": s["images_per_sec"], "uncertainty": s["images_per_sec_uncertainty"],
            "step_time_s": s["step_time_s"], "timed_steps": s["timed_steps"], "wall_s": time.perf_counter() - t0,
            "threads": s.get("threads")}


def throughput(pairs: int, steps: int, tmp: Path) -> list[dict]:
    rows = []
    for i in range(pairs):
        order = ["1x4", "2x2"] if i % 2 == 0 else ["2x2", "1x4"]
        for kind in order:
            r = run_train(kind, tmp / f"{kind}-{i}", steps)
            r["pair"] = i
            rows.append(r)
            print(f"  pair {i} {kind}: {r['images_per_sec']:.1f} ± {r['uncertainty']:.1f} images/sec, "
                  f"median step {r['step_time_s'] * 1e3:.1f} ms ({r['wall_s']:.0f} s wall)", flush=True)
    return rows


def allreduce_part(sizes, repeats, tmp: Path) -> list[dict]:
    from tftoolkit.cluster import launch, spec as multiworker

    me = [sys.executable, os.path.abspath(__file__), "--sizes", ",".join(map(str, sizes)), "--repeats", str(repeats)]
    local_out = tmp / "local.json"
    subprocess.run(me + ["--local-allreduce", "--worker-out", str(local_out)], check=True)
    mw_out = tmp / "mw.json"
    launch_dir = tempfile.mkdtemp(prefix="tftoolkit-bench-")
    addresses = [f"localhost:{p}" for p in multiworker.free_ports(2)]
    envs = [{**os.environ, "TF_CONFIG": multiworker.tf_config(addresses, k), multiworker.ENV_LAUNCH_DIR: launch_dir,
             "TFTOOLKIT_INTRA_OP_THREADS": os.environ.get("TFTOOLKIT_INTRA_OP_THREADS", "1")} for k in range(2)]
    code = launch.spawn([me + ["--worker-allreduce", "--worker-out", str(mw_out)]] * 2, envs, launch_dir,
                        join_timeout=300)
    if code != 0:
        raise SystemExit(f"all-reduce workers failed ({code})")
    return json.loads(mw_out.read_text()) + json.loads(local_out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="A/B pairs of training runs (default 2)")
    ap.add_argument("--steps", type=int, default=60, help="steps per training run (default 60; 10 are warm-up)")
    ap.add_argument("--sizes", default="4KiB,64KiB,1MiB,16MiB", help="all-reduce buffer sizes")
    ap.add_argument("--repeats", type=int, default=10, help="timed all-reduce calls per size (median reported)")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--out", help="write bench_multiworker.json here")
    ap.add_argument("--worker-allreduce", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--local-allreduce", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.skip_train and args.steps < 30:
        ap.error(f"--steps {args.steps}: give at least 30; the first 10 are warm-up, a loop call is 10 steps, and "
                 f"the rate's error needs two timed calls")
    from tftoolkit.measure.allreduce import parse_sizes

    args.sizes = parse_sizes(args.sizes) if isinstance(args.sizes, str) else args.sizes
    if args.worker_allreduce:
        return worker_main(args)
    if args.local_allreduce:
        return local_main(args)

    import platform

    print(f"bench_multiworker: {platform.node()}, {os.cpu_count()} CPU(s), {time.strftime('%Y-%m-%d %H:%M %Z')}")
    result = {"argv": sys.argv, "date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench-mw-") as tmp:
        tmp = Path(tmp)
        if not args.skip_train:
            print(f"1. training throughput, small_cnn 32x32, global batch 128 (32 x 4 replicas), {args.steps} steps:")
            rows = throughput(args.pairs, args.steps, tmp)
            ratios = []
            for i in range(args.pairs):
                a = next(r for r in rows if r["pair"] == i and r["kind"] == "1x4")
                b = next(r for r in rows if r["pair"] == i and r["kind"] == "2x2")
                ratios.append(b["images_per_sec"] / a["images_per_sec"])
            print(f"   ratio 2x2 / 1x4 images/sec per pair: {', '.join(f'{r:.3f}' for r in ratios)}; "
                  f"median {statistics.median(ratios):.3f}")
            result["train"] = rows
            result["ratios"] = ratios
        print(f"2. all-reduce (SUM over 4 replicas), median of {args.repeats}:")
        ar = allreduce_part(args.sizes, args.repeats, tmp)
        print(f"   {'implementation':42s} {'payload':>16s} {'bytes':>10s} {'time ms':>9s} {'algbw GB/s':>11s} "
              f"{'busbw GB/s':>11s}")
        for r in ar:
            print(f"   {r['impl']:42s} {r['payload']:>16s} {r['size_bytes']:>10d} {r['time_s'] * 1e3:>9.3f} "
                  f"{r['algbw_GBps']:>11.4f} {r['busbw_GBps']:>11.4f}")
        result["allreduce"] = ar
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "bench_multiworker.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
