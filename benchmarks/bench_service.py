"""Input through the tf.data service at 1 and 2 workers, against the local pipeline.

    python benchmarks/bench_service.py [--rounds 3] [--seconds 8]

Each round runs, in its own process and alternated, ``tftoolkit bench input --json`` on the same input:
- local: the run's pipeline in the training process;
- service, 1 worker / 2 workers: ``--data-service`` to a ``tftoolkit data-service start --service-workers K`` on this
  machine (a fresh dispatcher per measurement, so no job outlives its run).
Two inputs: ImageNet-layout TFRecords streamed with Inception crops (2048 JPEGs of 256-512 px, 224 px out: the
decode-heavy case the service exists for; bench_stream.py's data) and shapes16k in memory (32 px gathers: almost
no work, so its rate through the service is the service's own cost per batch). 2 simulated replicas, global batch
128.

On this 2-core machine the service's workers share the cores with the trainer: they cannot add CPUs, so the figure
is the service's cost, not its gain. On a GPU server the workers run on other hosts' cores.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_stream  # noqa: E402 - the same data and child runner

REPLICAS, GLOBAL_BATCH = 2, 128


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


class Service:
    """``tftoolkit data-service start --service-workers K`` on a free port, for one measurement."""

    def __init__(self, workers: int):
        self.port = _free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "tftoolkit", "data-service", "start", "--port",
                                      str(self.port), "--service-workers", str(workers)], cwd=ROOT, env=bench_stream._env(),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                socket.create_connection(("localhost", self.port), timeout=1).close()
                time.sleep(1.0)  # the workers register after the dispatcher listens
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise SystemExit(f"data-service start exited with {self.proc.returncode}")
                time.sleep(0.3)
        raise SystemExit("data-service start did not listen within 120 s")

    def __enter__(self):
        return f"localhost:{self.port}"

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def bench(data: str, seconds: float, service: str | None, stream: bool) -> float:
    cmd = [sys.executable, "-m", "tftoolkit", "bench", "input", "--dataset", data, "--replicas", str(REPLICAS),
           "--global-batch", str(GLOBAL_BATCH), "--seconds", str(seconds), "--json"]
    if stream:
        cmd += ["--image-size", "224", "--augment", "--data-memory-gb", "0.001"]
    if service:
        cmd += ["--data-service", service]
    return bench_stream._run(cmd)[0]["images_per_sec"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    inputs = {"ImageNet-layout, streamed, 224 px": (str(bench_stream.dataset(2048)), True),
              "shapes16k, in memory, 32 px": ("shapes16k", False)}
    rows = {(name, how): [] for name in inputs for how in ("local", "service, 1 worker", "service, 2 workers")}
    for r in range(args.rounds):
        for name, (data, stream) in inputs.items():
            rows[(name, "local")].append(bench(data, args.seconds, None, stream))
            for k in (1, 2):
                with Service(k) as address:
                    rows[(name, f"service, {k} worker{'s' if k > 1 else ''}")].append(
                        bench(data, args.seconds, address, stream))
            print(f"round {r + 1}: {name}: " + ", ".join(f"{how} {v[-1]:.0f}" for (n, how), v in rows.items()
                                                        if n == name), file=sys.stderr)
    print(f"| input | pipeline | images/sec (median of {args.rounds}) | min | max | / local (median of per-round ratios) |")
    print("|---|---|---|---|---|---|")
    for (name, how), v in rows.items():
        local = rows[(name, "local")]
        ratio = statistics.median(a / b for a, b in zip(v, local))
        print(f"| {name} | {how} | {statistics.median(v):.0f} | {min(v):.0f} | {max(v):.0f} | {ratio:.2f} |")
    for name in inputs:
        local, one = statistics.median(rows[(name, "local")]), statistics.median(rows[(name, "service, 1 worker")])
        per_batch = (1 / one - 1 / local) * GLOBAL_BATCH
        print(f"{name}: the service adds {per_batch * 1e3:.2f} ms per global batch of {GLOBAL_BATCH} at 1 worker")


if __name__ == "__main__":
    main()
