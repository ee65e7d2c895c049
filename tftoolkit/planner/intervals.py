"""The interval every catalogue forecast carries, made from errors on rows the model was not fitted to.

**Leave one source out.** validation/published.csv holds the rows the planner is fitted to (the achieved fractions
of peak, the straggler σ and the fixed cost per step, validation.release); each of its sources (a published table:
the ``source`` column) is forecast by a model fitted to the others only (out_of_sample). validation/heldout.csv is
never fitted to: its rows are forecast by the release's model. Together these are the out-of-sample residuals
r = ln(published / forecast), one per multi-GPU row (rate case: the series' 1-GPU rate given, so r is also the
error of the scaling efficiency) or per row (flops case).

**What the interval widens with** (spread): a row's residual is divided by its expected spread

    spread = (1 + N_WIDTH · log2 N) · (1 + COMM_WIDTH · communication's share of the step)
             · UNKNOWN_EXCHANGE (where the row's exchange is not known) · UNFITTED_CLASS (a hardware class with no
             fitted rows: "pcie via host memory", or NVLink where only PCIe was fitted, ...)

and the interval is [forecast · e^(q5 · spread), forecast · e^(q95 · spread)], q the 5th and 95th percentiles of the
divided residuals. The four widths are fixed here, not fitted: a forecast at more GPUs, with more of its step
in communication, with an exchange nobody stated or on hardware no fitted row ran on is less certain, by a factor
chosen as a round number; the coverage each choice gets is checked (coverage: nested, each source's coverage from
the quantiles of the other sources' residuals) and written in docs/guides/planner.md.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import validation
from .kept import kept

N_WIDTH = 0.25          # per doubling of the GPUs
COMM_WIDTH = 2.0        # a step all communication is three times as uncertain as one with none
UNKNOWN_EXCHANGE = 1.5  # the row's source does not say how it combined gradients
UNFITTED_CLASS = 2.0    # no fitted row ran on this hardware class
QUANTILES = validation.QUANTILES


def spread(gpus, comm_share, exchange_known, fitted_class) -> np.ndarray:
    """The expected spread of a row's ln(published / forecast), in units of the pooled quantiles (the docstring)."""
    n = np.asarray(gpus, dtype=float)
    out = (1 + N_WIDTH * np.log2(np.maximum(n, 1))) * (1 + COMM_WIDTH * np.asarray(comm_share, dtype=float))
    out = out * np.where(np.asarray(exchange_known, dtype=bool), 1.0, UNKNOWN_EXCHANGE)
    return out * np.where(np.asarray(fitted_class, dtype=bool), 1.0, UNFITTED_CLASS)


def fitted_classes(rows: pd.DataFrame) -> set[str]:
    """The hardware classes of the multi-GPU rows a model was fitted to (residuals' ``hardware_class``)."""
    return set(rows.loc[rows["gpus"] > 1, "hardware_class"])


def _with_spread_inputs(res: pd.DataFrame, fitted: set[str]) -> pd.DataFrame:
    res = res.copy()
    res["comm_share"] = (res["allreduce_s"] / res["step_time_s"]).where(res["gpus"] > 1, 0.0)
    res["fitted_class"] = res["hardware_class"].isin(fitted)
    return res


@kept  # one refit per published source, about 2 s: kept between commands (planner.kept)
def out_of_sample() -> pd.DataFrame:
    """Every validation row forecast by a model not fitted to it: published.csv's rows leaving their source out,
    heldout.csv's rows by the release's model (fitted to all of published.csv). ``set``: which file.

    The rate case's forecasts do not depend on the fractions of peak, only on σ and the fixed cost, which
    validation.at_step_costs applies to forecasts made without them: published.csv is forecast once (the release's
    ``residuals_unfitted``) and each fold refits σ and the cost on the other sources' rows of it; only the flops
    case is forecast again per fold, with the fractions fitted without the source."""
    if not validation.PUBLISHED.exists():
        return pd.DataFrame()
    v = validation.release()
    pub = validation.read(validation.PUBLISHED)
    res0 = v["residuals_unfitted"]
    rate0 = res0[res0["case"] == "rate"]
    parts = []
    for source, rows in pub.groupby("source", sort=False):
        fit_rate = rate0[rate0["source"] != source]
        sigma, overhead = validation.fit_step_costs(fit_rate)
        fitted = fitted_classes(fit_rate)
        rate = validation.at_step_costs(rate0[rate0["source"] == source], sigma, overhead)
        fractions = validation.achieved_fractions(pub[pub["source"] != source])
        flops = validation.residuals(rows, fractions, cases=("flops",))  # none where no fraction is left
        flops = validation.at_step_costs(flops, sigma, overhead) if len(flops) else flops
        for part in (rate, flops):
            if len(part):
                parts.append(_with_spread_inputs(part, fitted).assign(set="published", left_out=source))
    if validation.HELDOUT.exists():
        held = validation.at_step_costs(validation.residuals(validation.read(validation.HELDOUT), v["fractions"]),
                                        v["straggler"], v["overhead_ms"])
        parts.append(_with_spread_inputs(held, fitted_classes(v["residuals"])).assign(set="heldout",
                                                                                     left_out="(never fitted to)"))
    res = pd.concat(parts, ignore_index=True)
    res["spread"] = spread(res["gpus"], res["comm_share"], res["exchange_known"], res["fitted_class"])
    res["scaled"] = res["log_ratio"] / res["spread"]
    res["relative_error"] = (res["forecast"] / res["published"] - 1).abs()
    return res


def quantiles(res: pd.DataFrame) -> dict[str, tuple[float, float, int]]:
    """case -> (q5, q95, rows) of the scaled out-of-sample residuals."""
    return {case: (float(np.quantile(g["scaled"], QUANTILES[0])), float(np.quantile(g["scaled"], QUANTILES[1])),
                   int(len(g)))
            for case, g in res.groupby("case")}


def nested_coverage(res: pd.DataFrame, case: str = "rate") -> pd.Series:
    """Per row of ``case``: whether its interval, made from the quantiles of the *other* sources' residuals
    (validation's ``source`` column), covers its published rate."""
    g = res[res["case"] == case]
    covered = pd.Series(False, index=g.index)
    for source, rows in g.groupby("source", sort=False):
        others = g[g["source"] != source]["scaled"]
        lo, hi = np.quantile(others, QUANTILES[0]), np.quantile(others, QUANTILES[1])
        covered.loc[rows.index] = (rows["scaled"] >= lo) & (rows["scaled"] <= hi)
    return covered


def summary(res: pd.DataFrame, case: str = "rate") -> dict:
    """The out-of-sample figures: relative efficiency error (rate case; relative rate error in the flops case)
    median and 90th percentile, and the nested interval coverage, over ``res``'s rows of ``case``."""
    g = res[res["case"] == case]
    cov = nested_coverage(res, case)
    return {"rows": int(len(g)), "median": float(g["relative_error"].median()),
            "p90": float(g["relative_error"].quantile(0.9)), "coverage": float(cov.mean())}


def table(res: pd.DataFrame, case: str = "rate") -> str:
    """Markdown: the out-of-sample figures per source left out, then all together."""
    lines = ["| rows forecast | fitted to | rows | relative error median / p90 | interval covers |",
             "|---|---|---|---|---|"]
    cov = nested_coverage(res, case)
    g = res[res["case"] == case]
    for source, rows in g.groupby("source", sort=False):
        fitted = "published.csv without this source" if rows["set"].iloc[0] == "published" else "all of published.csv"
        lines.append(f"| {source} | {fitted} | {len(rows)} | {rows['relative_error'].median():.1%} / "
                     f"{rows['relative_error'].quantile(0.9):.1%} | {cov.loc[rows.index].mean():.0%} |")
    s = summary(res, case)
    lines.append(f"| all | | {s['rows']} | {s['median']:.1%} / {s['p90']:.1%} | {s['coverage']:.0%} |")
    return "\n".join(lines)


def headline(case: str = "rate") -> str:
    """One line for predict's summary: the out-of-sample figures, naming the metric."""
    res = out_of_sample()
    if res.empty or case not in set(res["case"]):
        return "not checked: no validation rows"
    s = summary(res, case)
    metric = "relative efficiency error" if case == "rate" else "relative rate error"
    return (f"out of sample (each source forecast by a model fitted without it; heldout.csv never fitted to), "
            f"{s['rows']} rows: {metric} median {s['median']:.1%}, 90th percentile {s['p90']:.1%}; "
            f"interval coverage {s['coverage']:.0%}")


def with_interval(frame: pd.DataFrame, case: str, exchange_known: bool = True) -> tuple[pd.DataFrame, dict]:
    """``frame`` (plan.forecast's) with images_per_sec_low/high and efficiency_low/high from the out-of-sample
    residuals, each row's interval widened by its spread; efficiency capped at 100% (weak scaling: N GPUs cannot
    do more than N times one GPU's work), the cap stated."""
    out = frame.copy()
    res = out_of_sample()
    if res.empty or case not in set(res["case"]):
        out["images_per_sec_low"] = out["images_per_sec_high"] = math.nan
        return out, {"method": "none: no published validation rows for this case", "checked": "not checked"}
    lo, hi, n = quantiles(res)[case]
    fitted = fitted_classes(validation.release()["residuals"])
    share = out["comm_share"] if "comm_share" in out.columns else 0.0
    cls = out["hardware_class"] if "hardware_class" in out.columns else pd.Series("single GPU", index=out.index)
    s = spread(out["replicas"], share, exchange_known, cls.isin(fitted) | (out["replicas"] == 1))
    out["images_per_sec_low"] = out["images_per_sec"] * np.exp(lo * s)
    out["images_per_sec_high"] = out["images_per_sec"] * np.exp(hi * s)
    one = out["replicas"] == 1
    if case == "rate":  # the given rate at one GPU is not a forecast
        out.loc[one, "images_per_sec_low"] = out.loc[one, "images_per_sec_high"] = out.loc[one, "images_per_sec"]
    # Efficiency is against the same forecast's 1-GPU rate, so the compute's own error cancels: its band is the
    # scaling error alone (the rate case's), and at one GPU it is 100% exactly.
    e_lo, e_hi, _ = quantiles(res).get("rate", (lo, hi, n))
    s_eff = spread(out["replicas"], share, exchange_known, cls.isin(fitted) | one)
    out["efficiency_low"] = out["efficiency"].where(one, out["efficiency"] * np.exp(e_lo * s_eff))
    out["efficiency_high"] = out["efficiency"].where(one, validation.efficiency_cap(out["efficiency"] * np.exp(e_hi * s_eff)))
    unfitted = sorted(set(cls[~cls.isin(fitted) & ~one]))
    words = []
    if unfitted:
        words.append(f"no fitted rows ran on {', '.join(unfitted)}: the interval is {UNFITTED_CLASS:g}x wider there")
    if not exchange_known:
        words.append(f"the exchange is not known: {UNKNOWN_EXCHANGE:g}x wider")
    method = (f"{int(QUANTILES[0] * 100)}th-{int(QUANTILES[1] * 100)}th percentiles of out-of-sample "
              f"ln(published / forecast) over {n} rows ({case} case), each row's widened by (1 + {N_WIDTH:g} log2 N)"
              f" x (1 + {COMM_WIDTH:g} x communication's share of the step); {validation.EFFICIENCY_CAP_NOTE}" + ("; " + "; ".join(words) if words else ""))
    return out, {"method": method, "checked": headline(case), "unfitted_classes": unfitted}
