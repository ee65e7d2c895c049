"""What does measuring (``--measure``, the default) cost a run? Target: at most 10% of a default run and of each
``scale`` run. The figure is a ratio inside one run, so a shared machine's load moves it less than a before/after pair
of runs: each run's wall_breakdown.measurement_s (the input probe, the breakdown's rounds with their traces, the
all-reduce timed alone, FLOPs and the peak, the monitor's and noise scale's summaries) over its wall_time_s, as the
run records them (summary.json's measure_share), with where the seconds went (measure_cost) and how the parts were
timed (breakdown_method). The README's two commands, each a fresh process, one after the other:

  train  tftoolkit train --replicas 4 --per-replica-batch 100 --epochs 5   (the README's first command)
  scale  tftoolkit scale --replica-counts 1,2,4 --epochs 1                 (the README's scale command)

The 1-minute load average is sampled every 2 s while each command runs (other processes change every figure).

    python benchmarks/measure_share.py [--only train|scale] [--epochs 5] [--counts 1,2,4] [--out /tmp/measure_share]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TARGET = 0.10


def run(argv: list[str]) -> tuple[float, list[float]]:
    """Runs ``tftoolkit argv`` in a fresh process; returns its wall seconds and the load averages seen meanwhile."""
    loads, done = [os.getloadavg()[0]], threading.Event()

    def sample():
        while not done.wait(2.0):
            loads.append(os.getloadavg()[0])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-m", "tftoolkit", *argv], check=True, cwd=HERE,
                       env={**os.environ, "PYTHONPATH": str(HERE)})
    finally:
        done.set()
        thread.join()
    return time.perf_counter() - t0, loads


def _number(v) -> float:
    return float("nan") if v is None else float(v)


def row(name: str, s: dict, loads: list[float]) -> dict:
    wall, measured = s["wall_time_s"], s["wall_breakdown"].get("measurement_s", float("nan"))
    return {"run": name, "replicas": s.get("replicas"), "steps": s.get("steps"), "wall_s": wall,
            "measurement_s": measured, "share": measured / wall, "measure_share": s.get("measure_share"),
            "budget_s": s.get("measure_budget_s"), "cost": s.get("measure_cost", ""),
            "method": s.get("breakdown_method", ""), "rounds": s.get("breakdown_rounds"),
            "load": (min(loads), max(loads)), "step_ms": 1e3 * _number(s.get("step_time_s")),
            "breakdown_step_ms": 1e3 * _number(s.get("breakdown_step_time_s")),  # null where it was not measured
            "note": s.get("breakdown_note", "")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("train", "scale"))
    p.add_argument("--epochs", default="5", help="the train command's epochs (the README's: 5)")
    p.add_argument("--counts", default="1,2,4", help="the scale command's replica counts (the README's: 1,2,4)")
    p.add_argument("--out", default="/tmp/measure_share")
    args = p.parse_args()
    out, rows = Path(args.out), []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.only in (None, "train"):
        argv = ["train", "--replicas", "4", "--per-replica-batch", "100", "--epochs", args.epochs]
        _, loads = run([*argv, "--out", str(out / "train"), "--force"])
        rows.append(row(" ".join(argv), json.loads((out / "train" / "summary.json").read_text()), loads))
    if args.only in (None, "scale"):
        argv = ["scale", "--replica-counts", args.counts, "--epochs", "1"]
        _, loads = run([*argv, "--out", str(out / "scale"), "--force"])
        for run_dir in sorted((out / "scale" / "runs").iterdir(), key=lambda d: int(d.name.lstrip("r"))):
            rows.append(row(f"{' '.join(argv)}: {run_dir.name}", json.loads((run_dir / "summary.json").read_text()),
                            loads))
    print(f"machine: {platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), "
          f"{started} to {time.strftime('%H:%M UTC', time.gmtime())}")
    for r in rows:
        verdict = "within" if r["share"] <= TARGET else "OVER"
        print(f"tftoolkit {r['run']}: {r['measurement_s']:.1f} s of {r['wall_s']:.1f} s = {r['share']:.1%} "
              f"({verdict} {TARGET:.0%}); budget {r['budget_s']:.1f} s; load {r['load'][0]:.1f}-{r['load'][1]:.1f}; "
              f"{r['rounds']} rounds; step {r['breakdown_step_ms']:.1f} ms (training's {r['step_ms']:.1f} ms)\n"
              f"    {r['cost']}\n    method: {r['method']}\n    {r['note']}")
    (out / "results.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
