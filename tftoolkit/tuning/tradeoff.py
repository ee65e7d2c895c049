"""The steps-vs-examples trade-off of a global batch, and the replica count recommended from a noise scale.

McCandlish et al. 2018 (eq. 2.11 and §2.3): training to a given loss takes S steps and E examples with

    (S/S_min − 1)(E/E_min − 1) = 1,   S = S_min (1 + B_crit/B),   E = E_min (1 + B/B_crit)

for global batch B, with S_min the fewest steps (infinite batch) and E_min the fewest examples (batch → 0).
At B = B_crit both cost twice their minimum: below it, a bigger batch buys almost proportionally fewer
steps (perfect data-parallel scaling); above it, it mostly burns examples. ``recommend`` picks the replica count
from B_crit (tuning/advise.py says how, and where the noise scale comes from), ``tradeoff_frame`` tabulates both
ratios per count, ``pick_by_time`` takes timetoloss's pick instead where a link's time model is given. It imports no
TensorFlow.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..config import DEFAULT_MAX_REPLICAS, accumulation_plan
from ..errors import ConfigError
from . import timetoloss


def steps_ratio(batch, b_crit):
    """S/S_min = 1 + B_crit/B."""
    return 1.0 + np.asarray(b_crit, dtype=float) / np.asarray(batch, dtype=float)


def examples_ratio(batch, b_crit):
    """E/E_min = 1 + B/B_crit."""
    return 1.0 + np.asarray(batch, dtype=float) / np.asarray(b_crit, dtype=float)


def recommend(b_crit: float, per_replica_batch: int, max_replicas: int = DEFAULT_MAX_REPLICAS,
              max_per_replica_batch: int | None = None) -> dict:
    """The replica count (power of two) whose global batch is closest to B_crit in log scale. When that count is
    over ``max_replicas`` and ``max_per_replica_batch`` (the memory cap) is known, the same global batch on
    max_replicas GPUs, with the per-replica batch and accumulate K that reach it (accumulation_plan)."""
    if not (isinstance(b_crit, (int, float)) and math.isfinite(b_crit) and b_crit > 0):
        raise ConfigError(f"noise scale must be a finite number > 0, got {b_crit!r}")
    if per_replica_batch < 1 or max_replicas < 1:
        raise ConfigError(f"per-replica batch and max replicas must be >= 1, got {per_replica_batch}, {max_replicas}")
    if max_per_replica_batch is not None and per_replica_batch > max_per_replica_batch:
        raise ConfigError(f"per-replica batch {per_replica_batch} is over the {max_per_replica_batch} that fits; give "
                          f"--per-replica-batch {max_per_replica_batch} or less")
    ratio = b_crit / per_replica_batch
    k = 1
    if ratio < 1:
        n = 1
        # Halve the batch towards B_crit (powers of two, at least 2 so the noise scale stays measurable).
        batch = max(2, 2 ** round(math.log2(b_crit))) if b_crit >= 2 else 2
        batch = min(batch, per_replica_batch)
        note = (f"the per-replica batch {per_replica_batch} alone exceeds the critical batch {b_crit:.3g}: more GPUs "
                f"would only use more examples per step. Train on 1 GPU, with a global batch near {batch}")
    else:
        want = 2 ** round(math.log2(ratio))
        n = int(min(want, 2 ** int(math.log2(max_replicas))))
        batch = n * per_replica_batch
        capped = want > n
        note = (f"{n} GPU(s) x {per_replica_batch} = global batch {batch}, closest to the critical batch "
                f"{b_crit:.3g}" + (f" (capped at {max_replicas} GPUs)" if capped else ""))
        if capped and max_per_replica_batch is not None:
            # The GPUs stop short of B_crit; the memory does not have to: the batch B_crit asks for, in micro-batches.
            batch = int(want * per_replica_batch)
            plan = accumulation_plan(batch, n, max_per_replica_batch)
            per_replica_batch, k = plan["per_replica_batch"], plan["accumulate"]
            note = (f"{n} GPU(s) x {per_replica_batch}" + (f" x accumulate {k}" if k > 1 else "")
                    + f" = global batch {batch}, closest to the critical batch {b_crit:.3g}: {n} GPUs is the "
                    f"--max-replicas cap and {max_per_replica_batch} the most a replica holds, so "
                    + (f"each replica sums {k} micro-batches of {per_replica_batch} per step" if k > 1
                       else f"the per-replica batch rises to {per_replica_batch}"))
    return {**_recommendation(n, batch, per_replica_batch, k, max_per_replica_batch, b_crit), "note": note}


def _recommendation(n: int, batch: int, per_replica_batch: int, k: int, cap: int | None, b_crit: float) -> dict:
    """advice.json's ``recommended`` (less its note) for ``n`` GPUs at global ``batch`` in ``k`` micro-batches."""
    b = int(min(per_replica_batch, batch))
    return {"replicas": n, "global_batch": int(batch), "per_replica_batch": b, "accumulate": int(k),
            "max_per_replica_batch": cap,
            "train_with": f"--replicas {n} --per-replica-batch {b}" + (f" --accumulate {k}" if k > 1 else ""),
            "steps_ratio": float(steps_ratio(batch, b_crit)), "examples_ratio": float(examples_ratio(batch, b_crit))}


def _point(p) -> tuple[int, int, int, int] | None:
    """(replicas, global batch, per-replica batch, accumulate) of a (replicas, global batch[, per-replica[, K]])."""
    if p is None:
        return None
    n, g, *rest = (int(x) for x in p)
    k = rest[1] if len(rest) > 1 else 1
    return n, g, rest[0] if rest else g // (n * k), k


def tradeoff_frame(b_crit: float, per_replica_batch: int, max_replicas: int = DEFAULT_MAX_REPLICAS,
                   current: tuple | None = None, recommended: tuple | None = None,
                   interval=None) -> pd.DataFrame:
    """One row per power-of-two replica count (global batch N x per-replica batch) with S/S_min and E/E_min;
    ``current`` and ``recommended`` are (replicas, global batch[, per-replica batch[, accumulate]]), flagged, and
    added when not on that grid (whose rows do not accumulate); ``interval``, the noise scale's 90% [lo, hi], rides
    along as b_crit_lo and b_crit_hi."""
    points = []
    n = 1
    while n <= max_replicas:
        points.append((n, n * per_replica_batch, per_replica_batch, 1))
        n *= 2
    current, recommended = _point(current), _point(recommended)
    for extra in (current, recommended):
        if extra is not None and extra not in points:
            points.append(extra)
    lo, hi = interval or (math.nan, math.nan)
    rows = [{"replicas": n, "global_batch": g, "per_replica_batch": b, "accumulate": k,
             "steps_ratio": float(steps_ratio(g, b_crit)), "examples_ratio": float(examples_ratio(g, b_crit)),
             "b_crit": b_crit, "b_crit_lo": lo, "b_crit_hi": hi,
             "current": (n, g, b, k) == current, "recommended": (n, g, b, k) == recommended}
            for n, g, b, k in points]
    return pd.DataFrame(rows).sort_values(["global_batch", "replicas"], ignore_index=True)


def pick_by_time(frame: pd.DataFrame, rec: dict, b_crit: float, per_replica_batch: int) -> tuple[pd.DataFrame, dict, dict]:
    """timetoloss.rank's pick as the recommendation: recommend()'s ``rec`` where it is the pick, else the picked
    count at ``per_replica_batch`` with a note saying what the critical batch alone asked for and why not. Returns
    (the ranked frame, the recommendation, advice.json's ``time_model`` figures)."""
    out, best, fields = timetoloss.rank(frame, per_replica_batch)
    row, n0 = out.loc[best], rec["replicas"]
    if not out.at[best, "critical_batch"]:
        n = int(row["replicas"])
        pick = out.loc[out["critical_batch"]].iloc[0]
        asked = f"global batch {rec['global_batch']} ({rec['train_with']})"
        if n < n0:
            why = (f"would ask for {asked}, but with the all-reduce there a doubling past {n} GPU(s) cuts the time by "
                   f"less than {timetoloss.DOUBLING_PAYS:.2f}x")
        elif n == n0:
            why = (f"would ask for {asked}, which takes {pick['time_ratio'] / row['time_ratio']:.2f}x the time: on the "
                   "same GPUs a larger batch takes more examples, so more time, to the same loss")
        else:
            why = f"would ask for {asked}; over this link more GPUs still pay"
        rec = {**_recommendation(n, n * per_replica_batch, per_replica_batch, 1, rec["max_per_replica_batch"], b_crit),
               "note": (f"{n} GPU(s) x {per_replica_batch} = global batch {n * per_replica_batch}, the least time x "
                        f"GPU-time to the same loss over {row['interconnect']} (the critical batch {b_crit:.3g} alone "
                        f"{why})")}
    return out, rec, {**fields, "critical_batch_replicas": int(n0)}


def ratio_intervals(batch: int, interval) -> dict:
    """The 90% intervals of S/S_min and E/E_min at ``batch`` that the noise scale's 90% ``interval`` [lo, hi] implies
    (S/S_min rises with B_crit, E/E_min falls): {} when the interval is not known."""
    lo, hi = (float(x) for x in (interval or [math.nan, math.nan]))
    if not (lo > 0 and hi >= lo):
        return {}
    return {"steps_ratio_interval": [float(steps_ratio(batch, lo)), float(steps_ratio(batch, hi))],
            "examples_ratio_interval": [float(examples_ratio(batch, hi)), float(examples_ratio(batch, lo))]}
