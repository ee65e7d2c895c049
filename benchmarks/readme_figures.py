"""The README's two pictures (docs/images/scaling.png and breakdown.png) from one ``tftoolkit scale`` directory: the
throughput against replicas and the step breakdown of the same runs, drawn by the toolkit's own plot functions from
its scaling.csv. Both describe the same steps: the breakdown's grey tick is the throughput's step (global batch /
images/sec); the black one is the step the parts split, timed beside them after training.

    tftoolkit scale --replica-counts 1,2,4 --epochs 3 --out /tmp/scale   # the README's scale command for 3 epochs (at 1
                                                                          # the 4-replica run is too short to measure)
    python benchmarks/readme_figures.py /tmp/scale [--out docs/images]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from tftoolkit.plots import scaling

HERE = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scale_dir", help="a `tftoolkit scale` output folder (its scaling.csv)")
    p.add_argument("--out", default=str(HERE / "docs" / "images"))
    args = p.parse_args()
    df = pd.read_csv(Path(args.scale_dir) / "scaling.csv")
    out = Path(args.out)
    for name, fig in (("scaling.png", scaling.plot_throughput(df)), ("breakdown.png", scaling.plot_step_breakdown(df))):
        fig.savefig(out / name, dpi=100, bbox_inches="tight")  # about 40 KB each: the README shows them at half width
        print(out / name, (out / name).stat().st_size, "bytes")
    cols = ["replicas", "global_batch", "images_per_sec", "step_time_s", "breakdown_step_time_s"]
    print(df[[c for c in cols if c in df.columns]].assign(
        throughput_step_ms=1e3 * df["global_batch"] / df["images_per_sec"]).to_string(index=False))


if __name__ == "__main__":
    main()
