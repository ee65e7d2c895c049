"""The planner against the published tables: every row's published and forecast rate, the error and the interval.

    python benchmarks/planner_validation.py            validation/published.csv (what the planner is fitted to)
    python benchmarks/planner_validation.py heldout    validation/heldout.csv (kept back, checks only)

First the summary (efficiency and rate errors, the interval's coverage, per case and per all-reduce), then the table
of every rate-case row. docs/benchmarks/planner.md holds its output.
"""

import sys

from tftoolkit.science import validation


def summary(res, bands) -> str:
    lines = ["| case | all-reduce | rows | efficiency error median / p90 | rate error median / p90 | interval covers |",
             "|---|---|---|---|---|---|"]
    for case in ("rate", "flops"):
        g = res[res["case"] == case]
        if g.empty:
            continue
        lo, hi, _ = bands[case]
        for alg, h in [("all", g)] + list(g.groupby("algorithm")):
            err = (h["forecast"] / h["published"] - 1).abs()
            eff = h["efficiency_error"]
            covered = ((h["log_ratio"] >= lo) & (h["log_ratio"] <= hi)).mean()
            lines.append(f"| {case} | {alg} | {len(h)} | {eff.median():.1%} / {eff.quantile(0.9):.1%} | "
                         f"{err.median():.1%} / {err.quantile(0.9):.1%} | {covered:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    path = validation.HELDOUT if sys.argv[1:] == ["heldout"] else validation.PUBLISHED
    v = validation.release()
    res = validation.residuals(validation.read(path), v["fractions"], v["straggler"], v["overhead_ms"])
    print(f"{path.name}: straggler sigma {v['straggler']:g}, fixed cost {v['overhead_ms']:g} ms per step (fitted to published.csv); rate interval "
          f"x{2.718281828 ** v['bands']['rate'][0]:.3f} .. x{2.718281828 ** v['bands']['rate'][1]:.3f}\n")
    print(summary(res, v["bands"]))
    print()
    print(validation.table(res))
