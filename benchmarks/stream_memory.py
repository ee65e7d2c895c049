"""Peak RSS of a streamed training run against the number of records: does the stream hold per-record data?

    python benchmarks/stream_memory.py [--images 8000 32000] [--steps 30] [--size 64]

Data: ImageNet-layout JPEG TFRecords (tests/formats.py), 16 training shards, so 4x the records is 4x the records
per shard, made once each into the data home (``bench-stream-memory-<images>``). Each size trains the same run in
its own process (small_cnn, 2 replicas, ``--steps`` steps, ``--data-memory-gb 0.001``: streamed), whose peak RSS is
its ru_maxrss (wait4). The same steps read the same number of records whatever the set's size, so a stream whose
memory is independent of the dataset shows the same peak; the last line prints the growth, in all and per added
record.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def dataset(images: int) -> Path:
    from bench_stream import dataset as imagenet_records  # the same generator, smaller images

    return imagenet_records(images, sizes=(96, 160), name="bench-stream-memory")


def peak_rss(data: Path, steps: int, size: int) -> tuple[int, dict]:
    """(peak RSS in bytes, summary.json) of one streamed training run in its own process."""
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile("w+") as err:
        cmd = [sys.executable, "-m", "tftoolkit", "train", "--dataset", str(data), "--out", f"{tmp}/run",
               "--model", "small_cnn", "--replicas", "2", "--global-batch", "64", "--image-size", str(size),
               "--steps", str(steps), "--data-memory-gb", "0.001", "--no-measure"]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            raise SystemExit(f"the run on {data} failed:\n{err.read()[-3000:]}")
        return usage.ru_maxrss * 1024, json.loads((Path(tmp) / "run" / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, nargs="+", default=[8000, 32000])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--size", type=int, default=64)
    args = ap.parse_args()
    rows = []
    print("| records | files MB | input_source | peak RSS MB |")
    print("|---|---|---|---|")
    for n in args.images:
        data = dataset(n)
        files_mb = sum(f.stat().st_size for f in data.glob("train-*")) / 1e6
        rss, summary = peak_rss(data, args.steps, args.size)
        rows.append((n, rss))
        print(f"| {n} | {files_mb:.0f} | {summary['input_source']} | {rss / 1e6:.0f} |", flush=True)
    (n0, r0), (n1, r1) = rows[0], rows[-1]
    print(f"growth from {n0} to {n1} records: {(r1 - r0) / 1e6:+.0f} MB, {(r1 - r0) / max(1, n1 - n0):+.0f} bytes "
          "per added record")


if __name__ == "__main__":
    main()
