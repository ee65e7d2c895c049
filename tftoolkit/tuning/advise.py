"""From a measured gradient noise scale to a recommended global batch and GPU count.

McCandlish et al. 2018 (eq. 2.11 and §2.3): training to a given loss takes S steps and E examples with

    (S/S_min − 1)(E/E_min − 1) = 1,   S = S_min (1 + B_crit/B),   E = E_min (1 + B/B_crit)

for global batch B, with S_min the fewest steps (infinite batch) and E_min the fewest examples (batch → 0).
At B = B_crit both cost twice their minimum: below it, a bigger batch buys almost proportionally fewer
steps (perfect data-parallel scaling); above it, it mostly burns examples. The paper's B_simple =
tr(Σ)/|G|² (what ``--noise-scale`` measures) estimates B_crit, well when the Hessian is close to a
multiple of the identity and within a small factor otherwise; the noise scale also grows as the loss
falls, so a value measured early in training understates the batch that pays off later.

The recommendation: the replica count N whose global batch N × per-replica batch is closest to B_crit on
a log scale (a power of two, as GPU counts come), capped at ``max_replicas``. If the per-replica batch
alone exceeds B_crit, more GPUs only burn examples: one GPU, and a smaller batch if its memory allows.
With an interconnect (``interconnect=``), the count with the least time x GPU-time to the same loss from predict's
model (``timetoloss``: recommend()'s count where communication does not lengthen the step, fewer where it does),
and the fastest count beside it in its terms: how much sooner, at how many times its GPU-time.

Past the memory cap: when the GPUs are capped (``max_replicas``) below the count B_crit asks for, the batch B_crit
asks for is still reachable by gradient accumulation, if advise knows how much a replica holds (the cap:
``max_per_replica_batch``, or find-batch's batch_find.json). The recommended global batch G is then the
power-of-two multiple of the per-replica batch closest to B_crit, as without the cap, reached on the capped GPU
count N as G = b × N × K with the largest per-replica batch b that fits (fewest micro-steps: accumulation_plan);
advice.json's ``recommended`` holds ``accumulate`` K and ``per_replica_batch`` b. Without the cap the
recommendation stops at max_replicas × the per-replica batch, as before.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .. import fileio
from .. import noise_scale as noise
from .. import summary as summary_schema
from ..config import DEFAULT_MAX_REPLICAS, whole_number
from ..errors import ConfigError, DataError, RunDirError
from ..fileio import read_json
from ..plots import batch as bplots
from ..plots.theme import save_figure
from ..planner import inputlimit
from . import timetoloss
from ..planner.calibration import calibrate_summary, gpu_forecast_refusal, handwritten
from ..planner.comms import parse_link
from ..planner.forecast import layouts
from ..planner.inputlimit import add_input_limit, host_fields, input_host
from .tradeoff import examples_ratio, pick_by_time, ratio_intervals, recommend, steps_ratio, tradeoff_frame
from .advice_text import advice_text  # noqa: F401 - what advise found, in words (the CLI and notebook 05 print it)

# What advise's own options can do about a GPU forecast refused (predict's remedy names options advise lacks).
ADVISE_REMEDY = ("Advise a run trained on a GPU for the time model, or leave out --interconnect: the batch and GPU "
                 "count recommendation needs no GPU time")
BATCH_FIND = "batch_find.json"  # what find-batch writes into its --out folder

# The summary.json fields the advice is made from.
READS = summary_schema.names("noise_scale", "noise_scale_steps", "per_replica_batch", "replicas", "global_batch",
                             "final_loss_mean10", "num_classes", "noise_scale_ema", "accumulate")


def read_memory_cap(path) -> tuple[int, str]:
    """(the largest per-replica batch that fits, where that comes from) from find-batch's batch_find.json (or the
    folder it is in)."""
    p = Path(path)
    if p.is_dir():
        p = p / BATCH_FIND
    if not p.exists():
        raise DataError(f"{p} does not exist; write it with `tftoolkit find-batch --out DIR` and pass DIR")
    r = read_json(p)
    cap = r.get("max_per_replica_batch") if isinstance(r, dict) else None
    if not (whole_number(cap) and cap >= 1):
        raise DataError(f"{p} has no max_per_replica_batch >= 1 (it is {cap!r}); write it with `tftoolkit find-batch`")
    source = f"find-batch ({p}, on {r.get('device_kind') or 'unknown devices'})"
    if r.get("capped_at_max_batch"):
        source += ": its --max-batch, so at least this fits"
    return int(cap), source

def input_limit(s: dict, per_replica_batch: int, max_replicas: int, interconnect: str | None, inter_host: str,
                gpus_per_host: int, host_cores: int | None = None, written_by_hand: str = "",
                ) -> tuple[pd.DataFrame | None, dict]:
    """At which GPU count the input of hosts like the run's (or of ``host_cores`` cores) becomes the limit, at
    ``per_replica_batch``: (the frame per GPU count with predict's input columns, advice.json's ``input_limit``).

    The images/sec each count consumes come from predict's model, over ``interconnect`` when given (the time model
    above). Without one, from the compute alone: N x the batch over one GPU's step, the most N GPUs could consume,
    so the count it names is the earliest at which input could become the limit. ``written_by_hand``: why the
    summary is taken as written by hand (calibration.handwritten), so that no refusal calls its figures measured."""
    host, why = input_host(s, host_cores)
    if host is None:
        return None, {"forecast": False, "why": why}
    try:
        cal = calibrate_summary(s, "summary.json", handwritten=written_by_hand)
    except RunDirError as e:
        return None, {**host_fields(host), "forecast": False, "why": f"no throughput to compare it with: {e}"}
    refusal = gpu_forecast_refusal(cal, "dedicated", ADVISE_REMEDY)
    if refusal:
        return None, {**host_fields(host), "forecast": False,
                      "why": f"no GPU throughput to compare it with: {refusal}"}
    intra = parse_link(interconnect) if interconnect else None
    inter = parse_link(inter_host) if interconnect else None
    rows = []
    for hosts, g in layouts(max_replicas, gpus_per_host):
        n = hosts * g
        t = timetoloss.step_time(cal, n, per_replica_batch, gpus_per_host, intra, inter)
        rows.append({"replicas": n, "hosts": hosts, "global_batch": n * per_replica_batch, "step_time_s": t,
                     "images_per_sec": n * per_replica_batch / t})
    frame = add_input_limit(pd.DataFrame(rows), host, gpus_per_host)
    model = (f"predict's model over {intra.name}" + (f" + {inter.name}" if inter else "") if intra
             else "compute alone: no all-reduce, the most the GPUs could consume")
    return frame, {**host_fields(host), "throughput_model": model, **inputlimit.input_limit(frame, host)}


def read_run(run_dir) -> tuple[dict, pd.DataFrame | None]:
    run_dir = Path(run_dir)
    path = run_dir / "summary.json"
    if not path.exists():
        raise RunDirError(f"{run_dir} has no summary.json; give a run directory written by `tftoolkit train`")
    s = summary_schema.read(path)
    missing = [k for k in ("noise_scale", "per_replica_batch", "replicas") if k not in s]
    if missing:
        hint = " (train with --noise-scale)" if "noise_scale" in missing else ""
        raise RunDirError(f"{path} lacks field(s) {', '.join(missing)}{hint}")
    steps = pd.read_csv(run_dir / "steps.csv") if (run_dir / "steps.csv").exists() else None
    return s, steps


def estimate(s: dict, steps: pd.DataFrame | None) -> dict:
    """The run's noise scale, its 90% interval, where in training it was measured (``phase``, and ``early`` when it was
    still growing there: noise_scale.growth) and the reasons not to trust it: noise_scale.robust_estimate over the
    per-step estimates in steps.csv (the ratio of their averages over the later half of the run), or, for a run
    written before steps.csv kept them, the summary's figure, flagged."""
    phase, early, grew, from_step = "", None, {"ratio": math.nan, "interval": [math.nan, math.nan]}, None
    if steps is not None and {"noise_grad_sq", "noise_trace"} <= set(steps.columns):
        est = noise.robust_estimate(steps["noise_grad_sq"], steps["noise_trace"])
        warnings = noise.reliability(est, s.get("final_loss_mean10"), s.get("num_classes"))
        source = "ratio of the per-step estimates averaged over the later half of the run"
        numbers = steps["step"] if "step" in steps.columns else pd.Series(range(1, len(steps) + 1))
        if len(steps) and est["from_index"] < len(steps):
            grew = noise.growth(steps["noise_grad_sq"], steps["noise_trace"])
            last = int(numbers.iloc[-1])
            from_step = int(numbers.iloc[est["from_index"]])
            phase, early = noise.phase_text([from_step, last, last], grew), grew["early"]
    else:
        value = s.get("noise_scale_ema", s.get("noise_scale"))
        value = float(value) if isinstance(value, (int, float)) else math.nan
        est = {"noise_scale": value if value > 0 else math.nan, "interval": [math.nan, math.nan],
               "steps": int(s.get("noise_scale_steps") or 0)}
        warnings = noise.reliability(est, s.get("final_loss_mean10"), s.get("num_classes"))
        warnings.insert(0, "steps.csv has no per-step |G|^2 and tr(Sigma) (a run from an older version): this is the "
                           "EMAs' ratio at the end of the run, without an interval")
        source = "the EMAs' ratio at the end of the run"
    return {"noise_scale": est["noise_scale"], "interval": est["interval"], "window_steps": est["steps"],
            "source": source, "reliable": not warnings, "warnings": warnings, "phase": phase, "early": early,
            "growth": grew["ratio"], "growth_interval": grew["interval"], "from_step": from_step}


def advise(run_dir, out=None, *, per_replica_batch: int | None = None, max_replicas: int = DEFAULT_MAX_REPLICAS,
           interconnect: str | None = None, inter_host: str = "ib200", gpus_per_host: int = 8,
           figures: bool = True, host_cores: int | None = None, max_per_replica_batch: int | None = None,
           batch_find=None) -> dict:
    """``tftoolkit advise``: advice.json, tradeoff.csv and figures in ``out`` (default: RUN_DIR).

    The advice says first whether it can be trusted (``reliable``, ``warnings``); without a positive noise scale
    there is no recommendation (``recommended`` is None), rather than one made from noise. Either way it says at
    which GPU count the host's input becomes the limit (``input_limit``, input_limit.csv).

    The memory cap, the largest per-replica batch a replica holds, comes from ``max_per_replica_batch`` or from
    find-batch's ``batch_find`` (batch_find.json or its folder); with it a recommendation past ``max_replicas`` GPUs
    reaches its global batch by accumulation (recommend), and the per-replica batch planned with defaults to the
    run's or the cap, whichever is smaller."""
    cap, cap_source = memory_cap(max_per_replica_batch, batch_find)
    s, steps = read_run(run_dir)
    est = estimate(s, steps)
    b_crit = est["noise_scale"]
    if per_replica_batch is not None and cap is not None and per_replica_batch > cap:
        raise ConfigError(f"--per-replica-batch {per_replica_batch} is over the {cap} a replica holds ({cap_source}); "
                          f"give {cap} or less")
    b = int(per_replica_batch or (s["per_replica_batch"] if cap is None else min(s["per_replica_batch"], cap)))
    by_hand = handwritten(run_dir)
    input_frame, input_fields = input_limit(s, b, max_replicas, interconnect, inter_host, gpus_per_host, host_cores,
                                            by_hand)
    run_k = int(s.get("accumulate") or 1)
    current_batch = int(s.get("global_batch", s["per_replica_batch"] * s["replicas"] * run_k))
    usable = math.isfinite(b_crit) and b_crit > 0
    time_refused, time_fields = None, {}
    if usable:
        rec = recommend(b_crit, b, max_replicas, cap)
        if cap is not None:
            rec["max_per_replica_batch_source"] = cap_source
        frame = tradeoff_frame(b_crit, b, max_replicas,
                               current=(int(s["replicas"]), current_batch, int(s["per_replica_batch"]), run_k),
                               recommended=(rec["replicas"], rec["global_batch"], rec["per_replica_batch"],
                                            rec["accumulate"]), interval=est["interval"])
        if interconnect:
            refusal = gpu_forecast_refusal(calibrate_summary(s, "summary.json", handwritten=by_hand), "dedicated",
                                           ADVISE_REMEDY)
            if refusal:
                time_refused = f"no time-to-loss model over {interconnect}: {refusal}"
                interconnect = None
            else:
                frame = timetoloss.add_time(frame, s, interconnect, inter_host, gpus_per_host, b)
                frame, rec, time_fields = pick_by_time(frame, rec, b_crit, b)
                if cap is not None:
                    rec["max_per_replica_batch_source"] = cap_source
        current = _current(s, current_batch, run_k, b_crit, est["interval"])
        rec.update(ratio_intervals(rec["global_batch"], est["interval"]))
    else:
        rec, current = None, {"replicas": s["replicas"], "global_batch": current_batch}
        frame = pd.DataFrame(columns=["replicas", "global_batch", "steps_ratio", "examples_ratio", "b_crit",
                                      "current", "recommended"])
        frame.attrs["why"] = est["warnings"][-1] if est["warnings"] else "no noise scale"
    result = {
        "run_dir": str(run_dir), **_estimate_fields(est), "per_replica_batch": b, "max_replicas": max_replicas,
        "max_per_replica_batch": cap, "max_per_replica_batch_source": cap_source,
        "current": current,
        "recommended": rec,
        "input_limit": input_fields,
        "notes": list(NOTES),
    }
    if time_refused:
        result["time_model_refused"] = time_refused
    if interconnect and usable:
        # A plan that never leaves one host names no link between hosts.
        result["time_model"] = {"interconnect": interconnect,
                                "inter_host": inter_host if max_replicas > gpus_per_host else None,
                                "gpus_per_host": gpus_per_host, **time_fields}
    _write(Path(out) if out is not None else Path(run_dir), result, frame, input_frame,
           (steps, est) if figures else None, usable)
    result["frame"] = frame
    result["input_frame"] = input_frame
    return result


NOTES = (
    "B_crit is taken as the measured B_simple = tr(Sigma)/|G|^2 (McCandlish et al. 2018); it can be off by a "
    "small factor when the Hessian is far from a multiple of the identity.",
    "The noise scale grows as the loss falls: measured early in training it understates the batch that pays "
    "off later. Measure again later in training, and retune the learning rate for the new batch "
    "(tftoolkit find-lr).",
)  # advice.json's notes, whatever the run


def _estimate_fields(est: dict) -> dict:
    """advice.json's noise-scale fields: the estimate, its interval, where it was measured, whether to trust it."""
    b_crit = est["noise_scale"]
    return {"noise_scale": b_crit, "b_crit": b_crit, "noise_scale_interval": est["interval"],
            "noise_scale_source": est["source"], "reliable": est["reliable"], "warnings": est["warnings"],
            "noise_scale_steps": est["window_steps"], "noise_scale_phase": est["phase"],
            "noise_scale_early": est["early"], "noise_scale_growth": est["growth"],
            "noise_scale_growth_interval": est["growth_interval"]}


def _current(s: dict, current_batch: int, run_k: int, b_crit: float, interval) -> dict:
    """advice.json's ``current``: the run's own layout and what its global batch costs in steps and examples."""
    return {"replicas": s["replicas"], "global_batch": current_batch,
            **({"per_replica_batch": s["per_replica_batch"], "accumulate": run_k} if run_k > 1 else {}),
            "steps_ratio": float(steps_ratio(current_batch, b_crit)),
            "examples_ratio": float(examples_ratio(current_batch, b_crit)),
            **ratio_intervals(current_batch, interval)}


def _write(out: Path, result: dict, frame, input_frame, figures, usable: bool) -> None:
    """tradeoff.csv, advice.json, input_limit.csv (when there is one) and, given ``figures`` = (steps, estimate),
    the trade-off (with a recommendation) and the noise scale's trace (where steps.csv has it)."""
    fileio.write_csv(out / "tradeoff.csv", frame)
    fileio.write_json(out / "advice.json", result)
    if input_frame is not None:
        fileio.write_csv(out / "input_limit.csv", input_frame)
    if figures is None:
        return
    steps, est = figures
    if usable:
        save_figure(bplots.tradeoff(frame), out, "tradeoff", formats=("png",))
    if steps is not None and "noise_scale" in steps.columns and steps["noise_scale"].notna().any():
        save_figure(bplots.noise_scale_trace(steps, est), out, "noise_scale", formats=("png",))


def memory_cap(max_per_replica_batch: int | None = None, batch_find=None) -> tuple[int | None, str | None]:
    """(the largest per-replica batch a replica holds, where it comes from), or (None, None) when neither is given."""
    if max_per_replica_batch is not None and batch_find is not None:
        raise ConfigError("give --max-per-replica-batch or --batch-find, not both (they say the same thing)")
    if batch_find is not None:
        return read_memory_cap(batch_find)
    if max_per_replica_batch is None:
        return None, None
    if not (whole_number(max_per_replica_batch) and max_per_replica_batch >= 1):
        raise ConfigError(f"--max-per-replica-batch must be a whole number of examples >= 1, got "
                          f"{max_per_replica_batch!r}")
    return int(max_per_replica_batch), "--max-per-replica-batch"
