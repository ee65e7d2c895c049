"""The planner against the published tables, out of sample: every row forecast by a model not fitted to it.

    python benchmarks/planner_validation.py            the leave-one-source-out table, then every rate-case row
    python benchmarks/planner_validation.py heldout    the same, rows of validation/heldout.csv only
    python benchmarks/planner_validation.py insample   published.csv forecast by the model fitted to all of it
                                                       (in-sample: labelled as such wherever quoted)

Out of sample (intervals.out_of_sample): each source of validation/published.csv forecast by a model fitted to the
others; validation/heldout.csv by the model fitted to all of published.csv (never fitted to). Each row's interval
comes from the other sources' residuals (nested), widened by its spread (intervals.spread). docs/benchmarks/planner.md
holds its output.
"""

import math
import sys

import numpy as np

from tftoolkit.planner import intervals, validation


def summary(res) -> str:
    lines = ["| set | case | all-reduce | rows | relative error median / p90 | efficiency error (points) median / "
             "p90 | interval covers |", "|---|---|---|---|---|---|---|"]
    for case in ("rate", "flops"):
        cov = intervals.nested_coverage(res, case)
        for name, s in res[res["case"] == case].groupby("set", sort=False):
            for alg, h in [("all", s)] + list(s.groupby("algorithm")):
                eff = h["efficiency_error"] if case == "rate" else h["relative_error"] * math.nan
                lines.append(f"| {name} | {case} | {alg} | {len(h)} | {h['relative_error'].median():.1%} / "
                             f"{h['relative_error'].quantile(0.9):.1%} | {eff.median():.1%} / {eff.quantile(0.9):.1%} | "
                             f"{cov.loc[h.index].mean():.0%} |")
    return "\n".join(lines).replace("nan% / nan%", "-")


def rows(res, case="rate") -> str:
    """Every row of ``case``: published, forecast (out of sample), its interval (nested), error."""
    g = res[res["case"] == case]
    lines = ["| series | GPUs | published img/s | forecast img/s | interval | error | efficiency published / forecast |"
             " hardware class |", "|---|---|---|---|---|---|---|---|"]
    for source, rows_ in g.groupby("source", sort=False):
        others = g[g["source"] != source]["scaled"]
        lo, hi = np.quantile(others, intervals.QUANTILES[0]), np.quantile(others, intervals.QUANTILES[1])
        for _, r in rows_.iterrows():
            lines.append(f"| {r['case_id']} | {r['gpus']} | {r['published']:,.0f} | {r['forecast']:,.0f} | "
                         f"{r['forecast'] * math.exp(lo * r['spread']):,.0f} .. "
                         f"{r['forecast'] * math.exp(hi * r['spread']):,.0f} | {r['forecast'] / r['published'] - 1:+.1%} "
                         f"| {r['efficiency_published']:.0%} / {r['efficiency_forecast']:.0%} | {r['hardware_class']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    arg = sys.argv[1:]
    if arg == ["insample"]:
        v = validation.release()
        res = v["residuals"]
        g = res[res["case"] == "rate"]
        err = (g["forecast"] / g["published"] - 1).abs()
        print(f"IN-SAMPLE (published.csv, the rows sigma {v['straggler']:g} and the fractions were fitted to): "
              f"{len(g)} rate rows, relative error median {err.median():.1%}, p90 {err.quantile(0.9):.1%}; "
              f"efficiency error (points) median {g['efficiency_error'].median():.1%}, "
              f"p90 {g['efficiency_error'].quantile(0.9):.1%}")
        sys.exit(0)
    res = intervals.out_of_sample()
    if arg == ["heldout"]:
        res = res[res["set"] == "heldout"]
    print("## Leave one source out (rate case: the series' 1-GPU rate given)\n")
    print(intervals.table(res, "rate"))
    print("\n## Leave one source out (flops case: no rate, FLOPs over the peak)\n")
    print(intervals.table(res, "flops"))
    print("\n## Per set and all-reduce\n")
    print(summary(res))
    print("\n## Every rate-case row\n")
    print(rows(res))
