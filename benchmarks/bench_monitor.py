"""How much throughput does the background Monitor cost? Target: <= 1%.

Two CPU-bound workloads, each run in windows of --seconds with and without a Monitor sampling at --interval,
alternating off/on and on/off so slow drift of the machine cancels:
  - numpy matmuls (BLAS threads, the GIL released: like TF kernels)
  - a pure-Python loop (holds the GIL: the sampler thread has to take it away)
Prints the throughput ratio (with / without) as median, quartiles and range over the pairs, both per wall
second and per CPU second of the whole process (which counts the sampler thread's own CPU but not time lost
to other processes, so it stays readable on a shared machine), and the sampler's own cost per sample.

    python benchmarks/bench_monitor.py [--seconds 1] [--repeats 12] [--interval 0.5]
"""

from __future__ import annotations

import os

# One BLAS thread: multi-threaded BLAS spin-waits at its barriers, so on a shared machine its speed tracks the
# other processes far more than it tracks the monitor. Set before numpy loads; override from the shell.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from tftoolkit.measure.monitor.sampler import Monitor  # noqa: E402


def matmul_work(seconds: float) -> int:
    a = np.random.default_rng(0).standard_normal((256, 256))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            a @ a
        n += 20
    return n


def python_work(seconds: float) -> int:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x = 0
        for i in range(20_000):
            x += i * i
        n += 1
    return n


def timed(work, seconds: float) -> tuple[float, float]:
    """(work per wall second, work per CPU second of this whole process, sampler thread included)."""
    w0, c0 = time.perf_counter(), time.process_time()
    n = work(seconds)
    return n / (time.perf_counter() - w0), n / (time.process_time() - c0)


def _count_sampler_cpu(mon: Monitor) -> list[float]:
    """Wrap the monitor's sample step so each call adds its thread CPU time (ns clock) to the returned list."""
    spent, sample = [0.0], mon._sample

    def counted():
        c0 = time.thread_time()
        sample()
        spent[0] += time.thread_time() - c0
    mon._sample = counted
    return spent


def measure(work, seconds: float, repeats: int, interval: float, out: Path):
    """Per off/on pair: ratios with/without monitor (wall-clock throughput, CPU-time throughput), and the
    share of one core the sampler thread itself used during the monitored window."""
    wall, cpu, share = [], [], []
    work(min(seconds, 1.0))  # warm caches
    for r in range(repeats):
        res = {}
        for with_monitor in ((False, True) if r % 2 == 0 else (True, False)):
            if with_monitor:
                mon = Monitor(out / f"monitor_{work.__name__}_{r}.csv", interval_s=interval)
                spent = _count_sampler_cpu(mon)
                # Started before and stopped after the timed window: a run pays start/stop once, not per step.
                with mon:
                    c0, w0 = spent[0], time.perf_counter()
                    res[True] = timed(work, seconds)
                    share.append((spent[0] - c0) / (time.perf_counter() - w0))
            else:
                res[False] = timed(work, seconds)
        wall.append(res[True][0] / res[False][0])
        cpu.append(res[True][1] / res[False][1])
    return wall, cpu, share


def describe(ratios: list[float]) -> str:
    q1, med, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return (f"median {med:.4f} (overhead {1 - med:+.2%}), quartiles {q1:.4f}..{q3:.4f}, "
            f"min {min(ratios):.4f}, max {max(ratios):.4f}")


def sample_cost_s(interval: float, out: Path, n: int = 200) -> float:
    mon = Monitor(out / "cost.csv", interval_s=interval)
    mon.start()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            mon._sample()  # the exact work the sampler thread does each tick
        return (time.perf_counter() - t0) / n
    finally:
        mon.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one measurement window")
    ap.add_argument("--repeats", type=int, default=12, help="off/on pairs per workload")
    ap.add_argument("--interval", type=float, default=0.5, help="monitor interval (s)")
    args = ap.parse_args(argv)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}, python {platform.python_version()}, numpy {np.__version__}, "
          f"BLAS threads {os.environ['OPENBLAS_NUM_THREADS']}; windows of {args.seconds:g} s, {args.repeats} pairs, "
          f"interval {args.interval:g} s")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cost = sample_cost_s(args.interval, out)
        print(f"sampler cost: {cost * 1e6:.0f} us per sample -> {cost / args.interval:.3%} of one core "
              f"at {args.interval:g} s")
        for work in (matmul_work, python_work):
            wall, cpu, share = measure(work, args.seconds, args.repeats, args.interval, out)
            print(f"{work.__name__}, {args.repeats} pairs, throughput with/without monitor")
            print(f"  per wall second: {describe(wall)}")
            print(f"  per CPU second:  {describe(cpu)}")
            print(f"  sampler thread CPU: median {statistics.median(share):.3%} of one core "
                  f"(max {max(share):.3%}) during the monitored windows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
