"""Figures for the GPU-truth changes: the input path's placements, small all-reduces, and doctor.

    python benchmarks/bench_gpu_truth.py input [--rounds 3] [--seconds 4] [--repo DIR]
    python benchmarks/bench_gpu_truth.py allreduce [--replicas 4] [--repeats 20]
    python benchmarks/bench_gpu_truth.py doctor [--rounds 3]

input: `tftoolkit bench input --json` on shapes16k, 4 simulated replicas, global batch 400, as fresh processes,
rounds interleaved: host placement; host with the GPU path's per-replica prefetch to the devices forced on
(``pipeline.on_gpus`` patched: a MultiDeviceIterator per replica, here copying to logical CPU devices); device
placement (int64 words, unpacked on the device); each with and without --augment (device placement augments the
float batch now, 4x the bytes of the uint8 one). --repo runs another checkout (e.g. the previous main) the same
way, for before/after.
allreduce: one `bench allreduce` run per implementation at small sizes: ``time_raw_s`` is what the bench
reported before (a chained call / its length, the call's overhead included) and ``time_s`` what it reports now
(the same call without its all-reduces subtracted, with its standard error; ``unresolved`` where the difference
stays within two of them), side by side, with the overhead.
doctor: the wall time of `tftoolkit doctor --replicas N --json` at 1 and 4 simulated replicas, fresh processes.

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
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}

FORCE_PREFETCH = ("import sys; from tftoolkit.data import pipeline; pipeline.on_gpus = lambda s: True; "
                  "from tftoolkit.cli import main; sys.exit(main(sys.argv[1:]))")
PLAIN = "import sys; from tftoolkit.cli import main; sys.exit(main(sys.argv[1:]))"


def _bench_input(repo: Path, code: str, placement: str, augment: bool, seconds: float) -> dict:
    argv = ["bench", "input", "--replicas", "4", "--per-replica-batch", "100", "--data-placement", placement,
            "--seconds", str(seconds), "--json"] + (["--augment"] if augment else [])
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=repo, env={**ENV, "PYTHONPATH": str(repo)},
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout)


def input_rates(rounds: int, seconds: float, repo: Path | None) -> None:
    cases = [("host", PLAIN, "host"), ("host + prefetch to devices", FORCE_PREFETCH, "host"),
             ("device", PLAIN, "device")]
    repos = [("this checkout", ROOT)] + ([("other", repo)] if repo else [])
    rates: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for augment in (False, True):
            for label, code, placement in cases:
                for name, where in repos:
                    if name != "this checkout" and code is FORCE_PREFETCH:
                        continue
                    r = _bench_input(where, code, placement, augment, seconds)
                    rates.setdefault((name, label, augment), []).append(r["warm_images_per_sec"])
    print("| checkout | placement | augment | warm images/sec (median) | min | max |")
    print("|---|---|---|---|---|---|")
    for (name, label, augment), v in rates.items():
        print(f"| {name} | {label} | {'yes' if augment else 'no'} | {statistics.median(v):,.0f} | {min(v):,.0f} | "
              f"{max(v):,.0f} |")


def allreduce_latency(replicas: int, repeats: int) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.update(TF_CPP_MIN_LOG_LEVEL="2")
    from tftoolkit.measure.allreduce import bench as allreduce_bench

    frame = allreduce_bench.bench(replicas, "4KiB,16KiB,64KiB,256KiB,1MiB", "reduce_to_one,collective", repeats=repeats,
                            warmup=2, models=(), quiet=True)
    timed = frame[frame["status"].isin(["ok", "unresolved"])]
    print(f"{replicas} replicas, {repeats} repeats asked, medians; before = time_raw_s (call / chain), "
          "after = time_s ± time_err_s (unresolved: within the call's noise, no bandwidth)")
    print("| impl | size | chain | repeats | before us | after us | call overhead us | status |")
    print("|---|---|---|---|---|---|---|---|")
    for _, r in timed.iterrows():
        print(f"| {r['impl']} | {int(r['size_bytes'])} | {int(r['iters'])} | {int(r['repeats'])} | "
              f"{r['time_raw_s'] * 1e6:.1f} | {r['time_s'] * 1e6:.1f} ± {r['time_err_s'] * 1e6:.1f} | "
              f"{r['overhead_s'] * 1e6:.1f} | {r['status']} |")


def doctor_wall(rounds: int) -> None:
    times: dict[int, list[float]] = {}
    for _ in range(rounds):
        for n in (1, 4):
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "tftoolkit", "doctor", "--replicas", str(n), "--json"],
                                  cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
            times.setdefault(n, []).append(time.perf_counter() - t0)
            checks = json.loads(done.stdout)["checks"]
            per = {c["name"]: c["seconds"] for c in checks}
            print(f"replicas {n}: exit {done.returncode}, {times[n][-1]:.1f} s wall; per check {per}")
    for n, v in times.items():
        print(f"doctor --replicas {n}: median {statistics.median(v):.1f} s (min {min(v):.1f}, max {max(v):.1f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("input")
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--seconds", type=float, default=4.0)
    a.add_argument("--repo", type=Path, default=None)
    b = sub.add_parser("allreduce")
    b.add_argument("--replicas", type=int, default=4)
    b.add_argument("--repeats", type=int, default=20)
    c = sub.add_parser("doctor")
    c.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.what == "input":
        input_rates(args.rounds, args.seconds, args.repo)
    elif args.what == "allreduce":
        allreduce_latency(args.replicas, args.repeats)
    else:
        doctor_wall(args.rounds)


if __name__ == "__main__":
    main()
