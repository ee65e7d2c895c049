"""How long the command line takes to answer: ``tftoolkit --help``, every command's ``--help``, and a ``predict``
without a run directory or a model count (the planner's arithmetic alone), first with an empty cache of the
validation's results (tftoolkit/planner/kept.py: the first command after an install or a catalogue change) and
then with it kept.

    python benchmarks/bench_cli_startup.py [--rounds 5]

Each figure is the median over ``--rounds`` fresh processes (``python -m tftoolkit ...``, as the console script
runs it) of the wall time and of the CPU time (user + system, from the OS), which a loaded machine inflates less.
The targets (issue: a CLI that starts at once): every help under 0.5 s, ``predict`` without a model count under 1 s.

Benchmarks are not tests: this prints figures measured in one run; they go into BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tftoolkit.cli import COMMANDS  # noqa: E402  (the table only: importing it imports no command)

PREDICT = ["predict", "--gpu", "a100-sxm4-80", "--params", "25600000", "--images-per-sec", "1000",
           "--per-replica-batch", "256", "--interconnect", "dgx-a100", "--replica-counts", "1,8"]


def one(argv: list[str], env: dict) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tftoolkit", *argv], env=env, cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"tftoolkit {' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per command (default 5)")
    a = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="tftoolkit-bench-cache-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TFTOOLKIT_CACHE": str(cache), "TF_CPP_MIN_LOG_LEVEL": "2"}
    cases = [("--help", ["--help"])] + [(f"{name} --help", [name, "--help"]) for name in COMMANDS]
    rows = []
    try:
        one(["--help"], env)  # the interpreter's and the package's files into the OS's page cache
        for label, argv in cases:
            times = [one(argv, env) for _ in range(a.rounds)]
            rows.append((label, times))
        cold = []
        for _ in range(a.rounds):
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(one(PREDICT, env))
        rows.append(("predict, no model, cache empty", cold))
        rows.append(("predict, no model, cache kept", [one(PREDICT, env) for _ in range(a.rounds)]))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{'command':<36} {'wall s (median)':>16} {'CPU s (median)':>15}")
    for label, times in rows:
        print(f"{label:<36} {statistics.median(w for w, _ in times):>16.2f} "
              f"{statistics.median(c for _, c in times):>15.2f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
