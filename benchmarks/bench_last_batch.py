"""The host's input rate with a short last batch kept (--last-batch partial) against it dropped, under op determinism.

    python benchmarks/bench_last_batch.py [--rounds 5] [--seconds 3]

One replica's training elements (data.pipeline.train_elements: the per-epoch gather, augmentation, prefetch) over
2040 synthetic 64 px images in batches of 200, so each epoch ends in a short batch of 40 that `partial` keeps and
`drop` leaves out. Op determinism is on, as session.start turns it on for a deterministic run (the default on CPU
replicas): tf.data's make_deterministic rewrite then runs a pipeline's parallel map serially and its prefetch at 0
when a dataset function holds a stateful op off its allow-list, which the short batch's pieces once were
(tests/data/test_pipeline.py says which). The two alternate round by round in one process; prints images/sec per
round and the medians' ratio partial / drop (about 1: keeping the short batch costs the input nothing).

Benchmarks are not tests: this prints figures measured in one run; they go into BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def rate(it, seconds: float) -> float:
    """Images/sec pulled from ``it`` for about ``seconds``."""
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        n += int(next(it)[0].shape[0])
    return n / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per pipeline per round (default 3)")
    args = p.parse_args()

    import tensorflow as tf

    from tftoolkit.config import RunConfig
    from tftoolkit.data import pipeline, registry

    tf.config.experimental.enable_op_determinism()
    source = registry.load_source(RunConfig(dataset="synthetic", image_size=64, train_images=2040))
    ctx = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)
    its = {}
    for mode in ("drop", "partial"):
        config = RunConfig(dataset="synthetic", replicas=1, per_replica_batch=200, last_batch=mode, augment=True)
        its[mode] = iter(pipeline.train_elements(source.store("train"), config, ctx))
        for _ in range(5):  # warm-up: the first elements start the pipeline's threads
            next(its[mode])
    rates = {mode: [] for mode in its}
    for r in range(args.rounds):
        for mode, it in its.items():
            rates[mode].append(rate(it, args.seconds))
        print(f"round {r + 1}: " + ", ".join(f"{m} {v[-1]:.0f} images/s" for m, v in rates.items()), flush=True)
    med = {m: statistics.median(v) for m, v in rates.items()}
    print(f"medians: drop {med['drop']:.0f}, partial {med['partial']:.0f} images/s; "
          f"partial / drop {med['partial'] / med['drop']:.3f}")


if __name__ == "__main__":
    main()
