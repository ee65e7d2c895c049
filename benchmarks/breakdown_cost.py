"""What does the step breakdown (``--measure``, the default) cost, and how precise are its parts? The README's first
training command, run once with each code tree, side by side: the run's wall time, the measurement's seconds and
share of it, and each part with its uncertainty as summary.json records them.

"before" is another checkout's code (PYTHONPATH pointing at it, e.g. main), "after" this one. Each run is its own
process, one after the other, on the same data; the load average is printed beside each (other processes on a
shared machine change every figure).

    python benchmarks/breakdown_cost.py --before /path/to/other/checkout [--epochs 5] [--out /tmp/breakdown_cost]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
COMMAND = ["train", "--replicas", "4", "--per-replica-batch", "100"]  # README's first command, with --epochs/--out


def _num(value) -> float:
    """A summary's figure, NaN where it is null (not measured). Not tftoolkit.summary.read, which does the same:
    the "before" checkout's summary may hold fields of another type than this checkout's reader accepts."""
    return float("nan") if value is None else value


PARTS = [("step (training)", "step_time_s", None), ("step (breakdown)", "breakdown_step_time_s",
                                                     "breakdown_step_time_uncertainty_s"),
         ("step no input", "step_time_no_input_s", None), ("compute", "compute_time_s", "compute_time_uncertainty_s"),
         ("all-reduce", "allreduce_time_s", "allreduce_time_uncertainty_s"),
         ("input wait", "input_wait_s", "input_wait_uncertainty_s"), ("other", "other_time_s", "other_time_uncertainty_s")]


def run(label: str, tree: str, args) -> dict:
    out = Path(args.out) / label
    env = {**os.environ, "PYTHONPATH": tree}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tftoolkit", *COMMAND, "--epochs", str(args.epochs), "--out", str(out),
                    "--force"], env=env, check=True, cwd=tree)
    wall = time.perf_counter() - t0
    s = json.loads((out / "summary.json").read_text())
    return {"label": label, "tree": tree, "process_wall_s": wall, "load_before": load, "load_after": os.getloadavg()[0],
            "summary": s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the checkout whose code is 'before'")
    p.add_argument("--after", default=str(HERE))
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--out", default="/tmp/breakdown_cost")
    args = p.parse_args()
    results = [run("before", args.before, args), run("after", args.after, args)]
    print(f"machine: {platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("command: tftoolkit " + " ".join(COMMAND) + f" --epochs {args.epochs}")
    rows = [("load average (1 min) before / after", lambda r: f"{r['load_before']:.1f} / {r['load_after']:.1f}"),
            ("process wall s", lambda r: f"{r['process_wall_s']:.1f}"),
            ("summary wall_time_s", lambda r: f"{r['summary']['wall_time_s']:.1f}"),
            ("measurement s (wall_breakdown)", lambda r: f"{_num(r['summary']['wall_breakdown'].get('measurement_s')):.1f}"),
            ("measurement share of the run", lambda r: f"{_num(r['summary']['wall_breakdown'].get('measurement_s')) / r['summary']['wall_time_s']:.0%}"),
            ("breakdown (measure_time_s)", lambda r: f"{_num(r['summary'].get('measure_time_s')):.1f}")]
    for name, key, err in PARTS:
        def cell(r, key=key, err=err):
            s = r["summary"]
            if s.get(key) is None:  # absent, or not measured (a run too short for the measuring budget: see note)
                return "-"
            text = f"{s[key] * 1e3:.1f}"
            return text + (f" ± {s[err] * 1e3:.1f}" if err and s.get(err) is not None else "") + " ms"
        rows.append((name, cell))
    rows.append(("note", lambda r: r["summary"].get("breakdown_note", "")))
    width = max(len(n) for n, _ in rows)
    print(f"{'':{width}}  {'before':>24}  {'after':>24}")
    for name, f in rows:
        print(f"{name:{width}}  {f(results[0]):>24}  {f(results[1]):>24}")
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
