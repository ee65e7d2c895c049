"""Time to the same loss on N GPUs over a link, and the GPU count advise recommends by it.

From the noise scale, S(B)/S_min = 1 + B_crit/B steps reach a given loss at global batch B (``advise``); predict's
model (``forecast.step_parts``) gives the step time t(N) on N GPUs, calibrated from the run. Relative to one GPU
at the per-replica batch b, the time to the same loss is T(N) = S(N·b)/S(b) × t(N)/t(1), and the GPU-time to it
N × T(N) (add_time).

The rule (TIME_RULE, rank): the count with the least T(N) × N·T(N), the time to the same loss times the GPU-time it
takes. While the step time does not grow with N, T × GPU-time ∝ S/S_min × E/E_min (E = S·B examples), which
McCandlish et al. 2018 show is smallest at B = B_crit, each at twice its minimum; over powers of two its smallest
value is at the global batch closest to B_crit in log scale (B + B_crit²/B compared at B and 2B), the count
``tradeoff.recommend`` names from the noise scale alone. Where the all-reduce lengthens the step (a slow link between
hosts), a doubling of GPUs must cut T by at least √2 (DOUBLING_PAYS), so that the GPU-time grows by at most √2, and
the count stops lower. The count with the least T alone, the fastest, is always the largest allowed (steps keep
falling, if ever more slowly), so it is reported in the recommendation's terms: how much sooner, at how many times
its GPU-time, and the speedup of each doubling past it (time_lines, ``time_vs_recommended``,
``gpu_time_vs_recommended`` in tradeoff.csv). The compute is linear in the per-replica batch in this model, so a
larger batch on the same GPUs (accumulation) never shortens T: it is costed like any other candidate.
"""

from __future__ import annotations

import math

import pandas as pd

from ..planner.calibration import calibrate_summary
from ..planner.comms import parse_link
from ..planner import validation
from ..planner.forecast import exchange, step_parts

# A doubling of GPUs pays under TIME_RULE while it cuts the time to the same loss by at least this: N x T^2 falls.
DOUBLING_PAYS = math.sqrt(2.0)
TIME_RULE = ("the GPU count with the least (time to the same loss) x (GPU-time to it): a doubling of GPUs is worth it "
             f"while it cuts the time by at least {DOUBLING_PAYS:.2f}x; where the step time does not grow with the GPUs "
             "this is the count whose global batch is closest to the critical batch")


def add_time(frame: pd.DataFrame, summary: dict, interconnect: str, inter_host: str = "ib200",
             gpus_per_host: int = 8, per_replica_batch: int | None = None) -> pd.DataFrame:
    """Predicted step time and time-to-the-same-loss relative to one GPU at ``per_replica_batch`` (default:
    the run's), from the scaling model."""
    cal = calibrate_summary(summary, "summary.json")
    intra, inter = parse_link(interconnect), parse_link(inter_host)
    out = frame.copy()
    if "accumulate" not in out.columns:
        out["accumulate"], out["per_replica_batch"] = 1, out["global_batch"] / out["replicas"]
    out["step_time_s"] = [step_time(cal, int(n), b, gpus_per_host, intra, inter, int(k))
                          for n, b, k in zip(out["replicas"], out["per_replica_batch"], out["accumulate"])]
    b1 = per_replica_batch or summary["per_replica_batch"]
    base = out.loc[(out["replicas"] == 1) & (out["global_batch"] == b1) & (out["accumulate"] == 1)].iloc[0]
    out["time_ratio"] = out["steps_ratio"] / base["steps_ratio"] * out["step_time_s"] / base["step_time_s"]
    out["gpu_time_ratio"] = out["time_ratio"] * out["replicas"]
    out["interconnect"] = intra.name
    return out


def step_time(cal, n: int, per_replica_batch: float, gpus_per_host: int, intra=None, inter=None,
              accumulate: int = 1) -> float:
    """predict's step time on ``n`` GPUs (whole hosts of ``gpus_per_host`` past one) of ``accumulate`` micro-steps,
    all-reducing as the run did (its dtype and packs); compute alone without ``intra``."""
    g, hosts = (n, 1) if n <= gpus_per_host else (gpus_per_host, int(math.ceil(n / gpus_per_host)))
    if intra is None:
        return cal.compute_at(n, per_replica_batch, "dedicated", accumulate)
    ex = exchange(cal, accumulate=accumulate)
    # The same step as predict's GPU forecast: the wait for the slowest replica with the published rows' sigma.
    return step_parts(cal, hosts, g, per_replica_batch, intra, inter, ex,
                      straggler=validation.release().get("straggler", 0.0))["step_time_s"]


def rank(frame: pd.DataFrame, per_replica_batch: int) -> tuple[pd.DataFrame, int, dict]:
    """TIME_RULE over add_time's frame, whose ``recommended`` row is the critical-batch pick: (the frame with
    ``critical_batch`` flagging that pick, ``recommended`` moved to the least time x GPU-time, ``fastest`` the least
    time, each row's time and GPU-time relative to the pick; the pick's index; advice.json's ``time_model`` figures).
    The candidates are the power-of-two counts at ``per_replica_batch`` and the critical-batch pick; the fastest is
    taken among the power-of-two counts."""
    out = frame.copy()
    grid = ((out["accumulate"] == 1) & (out["per_replica_batch"] == per_replica_batch)
            & (out["global_batch"] == out["replicas"] * per_replica_batch))
    out["critical_batch"] = out["recommended"].astype(bool)
    out["time_x_gpu_time"] = out["time_ratio"] * out["gpu_time_ratio"]
    # Fewest GPUs first, so a tie goes to the smaller count.
    order = out.sort_values(["replicas", "global_batch"]).index
    candidates = [i for i in order if grid[i] or out.at[i, "critical_batch"]]
    best = min(candidates, key=lambda i: out.at[i, "time_x_gpu_time"])
    fastest = min((i for i in order if grid[i]), key=lambda i: out.at[i, "time_ratio"])
    row, f = out.loc[best], out.loc[fastest]
    out["recommended"] = out.index == best
    out["fastest"] = out.index == fastest
    out["time_vs_recommended"] = out["time_ratio"] / row["time_ratio"]
    out["gpu_time_vs_recommended"] = out["gpu_time_ratio"] / row["gpu_time_ratio"]
    on_grid = out.loc[[i for i in order if grid[i]]]
    doublings = ({int(r): float(t_prev / t) for r, t, t_prev in
                  zip(on_grid["replicas"][1:], on_grid["time_ratio"][1:], on_grid["time_ratio"][:-1])
                  if r > row["replicas"]} if grid[best] else {})
    fields = {"rule": TIME_RULE, "recommended_replicas": int(row["replicas"]),
              "recommended_time_ratio": float(row["time_ratio"]),
              "recommended_gpu_time_ratio": float(row["gpu_time_ratio"]),
              "fastest_replicas": int(f["replicas"]), "fastest_time_ratio": float(f["time_ratio"]),
              "fastest_gpu_time_ratio": float(f["gpu_time_ratio"]),
              "fastest_speedup_vs_recommended": float(row["time_ratio"] / f["time_ratio"]),
              "fastest_gpu_time_vs_recommended": float(f["gpu_time_ratio"] / row["gpu_time_ratio"]),
              "doubling_speedups_past_recommended": doublings, **_intervals(out, row, f, per_replica_batch)}
    return out, best, fields


def _intervals(out: pd.DataFrame, row, f, b1: int) -> dict:
    """The time model's multiples at the two ends of the noise scale's 90% interval (the frame's b_crit_lo, b_crit_hi):
    each is monotone in B_crit, so its interval runs between them. {} without an interval."""
    lo, hi = (float(out[c].iloc[0]) if c in out.columns else math.nan for c in ("b_crit_lo", "b_crit_hi"))
    base = out.loc[(out["replicas"] == 1) & (out["global_batch"] == b1) & (out["accumulate"] == 1)]
    if not (0 < lo <= hi < math.inf) or base.empty:
        return {}
    base = base.iloc[0]

    def t(r, bc):  # T(N) = S(B)/S(b) x t(N)/t(1) at B_crit = bc
        return (1 + bc / r["global_batch"]) / (1 + bc / base["global_batch"]) * r["step_time_s"] / base["step_time_s"]

    ends = [(t(row, bc), t(f, bc)) for bc in (lo, hi)]
    return {"recommended_time_ratio_interval": sorted(a for a, _ in ends),
            "recommended_gpu_time_ratio_interval": sorted(a * row["replicas"] for a, _ in ends),
            "fastest_speedup_vs_recommended_interval": sorted(a / b for a, b in ends),
            "fastest_gpu_time_vs_recommended_interval": sorted(b * f["replicas"] / (a * row["replicas"])
                                                               for a, b in ends)}


def _iv(tm: dict, key: str) -> str:
    """' (90% interval a-b)' of a time-model multiple, or nothing when the noise scale had no interval."""
    lo, hi = tm.get(f"{key}_interval") or (math.nan, math.nan)
    return f" (90% interval {lo:.3g}-{hi:.3g})" if lo == lo and hi == hi else ""


def time_lines(tm: dict) -> list[str]:
    """The time model's lines: the recommendation's time and GPU-time, the rule that picked it, and the fastest count
    in the recommendation's terms (how much sooner, at how many times its GPU-time)."""
    n, fast = tm["recommended_replicas"], tm["fastest_replicas"]
    between = f" (+ {tm['inter_host']} between hosts of {tm['gpus_per_host']} GPUs)" if tm.get("inter_host") else ""
    lines = [f"time model over {tm['interconnect']}{between}: the recommended {n} GPU(s) reach the same loss in "
             f"{tm['recommended_time_ratio']:.3g} x{_iv(tm, 'recommended_time_ratio')} the time of 1 GPU, at "
             f"{tm['recommended_gpu_time_ratio']:.3g} x{_iv(tm, 'recommended_gpu_time_ratio')} its GPU-time",
             f"recommended by {tm['rule']}"]
    if fast == n:
        lines.append(f"fastest to the same loss: the recommended {n} GPU(s) themselves")
        return lines
    past = tm.get("doubling_speedups_past_recommended") or {}
    each = (f"each doubling past {n} cuts the time by less than {DOUBLING_PAYS:.2f}x"
            if all(x < DOUBLING_PAYS for x in past.values()) else f"the doublings past {n} cut the time by")
    why = f" ({each}: " + ", ".join(f"{x:.2f}x to {r}" for r, x in past.items()) + ")" if past else ""
    lines.append(f"fastest to the same loss: {fast} GPUs, {tm['fastest_speedup_vs_recommended']:.2f}x"
                 f"{_iv(tm, 'fastest_speedup_vs_recommended')} sooner than the recommended {n} at "
                 f"{tm['fastest_gpu_time_vs_recommended']:.2f}x{_iv(tm, 'fastest_gpu_time_vs_recommended')} its "
                 f"GPU-time{why}")
    return lines
