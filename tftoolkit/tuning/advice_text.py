"""What ``advise`` found, in the words the CLI and notebook 05 print: the reasons not to trust it first, then where in
training the noise scale was measured, the recommendation with every multiple and the interval the noise scale's
implies, the time model and the input limit last. Reads advice.json's dict only."""

from __future__ import annotations

import math

from . import timetoloss
from ..planner.inputlimit import input_lines


def _times(value: float, interval, what: str) -> str:
    """'12.19 x the fewest examples (90% interval 7.1-18.4)': a multiple with the interval the noise scale's implies."""
    text = f"{value:.2f} x the fewest {what}"
    if interval:
        lo, hi = interval
        text += f" (90% interval {lo:.3g}-{hi:.3g})" if math.isfinite(hi) else f" (90% interval {lo:.3g} or more)"
    return text


def _costs(d: dict) -> str:
    return (f"{_times(d['steps_ratio'], d.get('steps_ratio_interval'), 'steps')}, "
            f"{_times(d['examples_ratio'], d.get('examples_ratio_interval'), 'examples')}")


def advice_text(result: dict) -> str:
    """What ``advise`` found, the reasons not to trust it first (before any recommendation), then where in training the
    noise scale was measured (a warning when it was still growing), the input limit last."""

    rec, cur = result["recommended"], result["current"]
    lines = [f"NOT RELIABLE: {w}" for w in result.get("warnings", [])]
    phase = result.get("noise_scale_phase") or ""
    if result.get("noise_scale_early"):
        lines.append(f"EARLY TRAINING: the noise scale was {phase}")
    lo, hi = result.get("noise_scale_interval") or [math.nan, math.nan]
    interval = f", 90% interval {lo:.3g} to {hi:.3g}" if lo == lo and hi == hi else ""
    if rec is None:
        return "\n".join(lines + ["no recommendation: there is no positive noise scale to make one from"]
                         + input_lines(result.get("input_limit")))
    lines += [
        f"noise scale B_simple = {result['noise_scale']:.4g}{interval} (over {result.get('noise_scale_steps')} steps) "
        "~ critical batch",
        ("noise scale " + phase if phase and not result.get("noise_scale_early") else
         "" if phase else "the noise scale grows as the loss falls: one measured early in training understates the "
                          "batch that pays off later"),
        f"current: {cur['replicas']} replica(s), global batch {cur['global_batch']}: {_costs(cur)}",
        f"recommended: {rec['note']}; {_costs(rec)}",
    ]
    lines = [x for x in lines if x]
    if rec.get("accumulate", 1) > 1 or rec.get("max_per_replica_batch") is not None:
        lines.append(f"train with {rec['train_with']}"
                     + (f" (a replica holds at most {rec['max_per_replica_batch']}: "
                        f"{rec.get('max_per_replica_batch_source')})" if rec.get("max_per_replica_batch") else ""))
    if result.get("time_model_refused"):
        lines.append(result["time_model_refused"])
    if "time_model" in result:
        lines += timetoloss.time_lines(result["time_model"])
    return "\n".join(lines + input_lines(result.get("input_limit")))
