"""Where a host's input becomes the limit: a run's summary says what its input delivers per core
(``input_capacity_per_core``). Hosts like the run's, or of ``--host-cores`` cores, each feed their own GPUs; the
first GPU count whose predicted images/sec exceed that capacity is where input becomes the limit, and the cores
per host (or tf.data service workers, hosts of the same cores) that would lift it follow from the rate per core.
Neither side is stated where the evidence does not show it: a count whose forecast interval reaches within
NOISE_SIGMAS of the capacity's errors may be on either side, and the note says so.
Used by ``predict`` and ``advise``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import summary
from ..errors import ConfigError
from ..measure.stats import NOISE_SIGMAS, plus_minus  # NOISE_SIGMAS: within this many of its errors, either side
from .calibration import finite

# The summary fields the input limit is made from.
INPUT_READS = summary.names("input_capacity_per_core", "input_cores", "workers", "data_service",
                            "input_capacity_images_per_sec", "input_capacity_uncertainty")
NOT_MEASURED = "input capacity not measured in this run"


@dataclass(frozen=True)
class InputHost:
    """What feeds the GPUs: every GPU host has ``cores`` cores whose input delivers ``per_core`` images/s each, and a
    tf.data service worker is a host like it (the same cores, the same rate per core)."""
    per_core: float   # images/s one core's input delivers (the run's input_capacity_per_core)
    cores: int        # cores of each GPU host, and of each tf.data service worker host
    cores_from: str   # where ``cores`` came from, for every figure made with it
    relative_error: float = math.nan  # the run's input_capacity_uncertainty / its capacity (NaN: not known)

    @property
    def capacity(self) -> float:
        return self.per_core * self.cores


def input_host(s: dict, host_cores: int | None = None) -> tuple[InputHost | None, str]:
    """(the run's input host, "") from its summary, or (None, why not). ``host_cores``: ask about a host with that
    many cores instead of the run's own (input_cores x workers)."""
    if host_cores is not None and not (isinstance(host_cores, int) and not isinstance(host_cores, bool)
                                       and host_cores >= 1):
        raise ConfigError(f"--host-cores must be a whole number of cores >= 1, got {host_cores!r}")
    per_core = s.get("input_capacity_per_core")
    if not (finite(per_core) and per_core > 0):
        return None, NOT_MEASURED
    if s.get("data_service"):
        # The capacity came through tf.data service workers, whose cores input_cores does not count: it is not a
        # rate per core of this host.
        return None, ("input capacity measured through a tf.data service: not a rate per core of this host (measure "
                      "a run without --data-service)")
    # On CPU-simulated replicas the per-core rate is still a planning figure: the probe pulled the input alone
    # after training, with the cores to itself, so it did not share them with the simulated replicas' compute.
    cap, cap_se = s.get("input_capacity_images_per_sec"), s.get("input_capacity_uncertainty")
    rel = cap_se / cap if finite(cap) and cap > 0 and finite(cap_se) and cap_se >= 0 else math.nan
    if host_cores is not None:
        return InputHost(float(per_core), host_cores, "--host-cores", rel), ""
    cores, workers = s.get("input_cores"), s.get("workers") or 1
    if not (finite(cores) and cores >= 1 and finite(workers) and workers >= 1):
        return None, "the run does not say how many cores its input had (input_cores); give --host-cores"
    n = int(cores) * int(workers)
    return InputHost(float(per_core), n, f"this run's host: input_cores {int(cores)} x {int(workers)} worker(s)",
                     rel), ""


def _ceil(x: float) -> int:
    # A rate that is a whole multiple of the per-core rate (1200 / 100 = 12) must not round up on float noise.
    return max(0, int(math.ceil(x * (1 - 1e-9))))


def add_input_limit(frame: pd.DataFrame, host: InputHost, gpus_per_host: int) -> pd.DataFrame:
    """Per GPU count (a frame with ``replicas`` and predicted ``images_per_sec``): the input capacity of its hosts,
    whether the GPUs would consume more than that, the cores per host whose input would keep up, and the tf.data
    service workers (hosts like ``host``) that would add the rest. Past one host every GPU host is like ``host``
    and feeds its own GPUs, as layouts() lays them out."""
    out = frame.copy()
    hosts = np.ceil(out["replicas"].astype(float) / gpus_per_host)
    ips = out["images_per_sec"].astype(float)
    out["input_capacity_images_per_sec"] = host.capacity * hosts
    out["input_capacity_uncertainty"] = out["input_capacity_images_per_sec"] * host.relative_error
    out["input_limited"] = ips > out["input_capacity_images_per_sec"]
    out["input_cores_needed_per_host"] = [_ceil(v / h / host.per_core) for v, h in zip(ips, hosts)]
    out["input_service_workers_needed"] = [_ceil((v - c) / host.capacity)
                                           for v, c in zip(ips, out["input_capacity_images_per_sec"])]
    # Limited, or within the forecast's interval and the capacity's error of it (_either_side): the evidence does
    # not say which side of the limit the count is on.
    out["input_limit_possible"] = [bool(r["input_limited"]) or bool(_either_side(_needs(r))) for _, r in out.iterrows()]
    return out


def _needs(r) -> dict:
    band = [float(r.get(k, math.nan)) for k in ("images_per_sec_low", "images_per_sec_high")]
    return {"replicas": int(r["replicas"]), "images_per_sec": float(r["images_per_sec"]),
            "images_per_sec_low": band[0], "images_per_sec_high": band[1],
            "input_capacity_images_per_sec": float(r["input_capacity_images_per_sec"]),
            "input_capacity_uncertainty": float(r["input_capacity_uncertainty"]),
            "cores_needed_per_host": int(r["input_cores_needed_per_host"]),
            "service_workers_needed": int(r["input_service_workers_needed"])}


def input_limit(frame: pd.DataFrame, host: InputHost) -> dict:
    """The first GPU count whose predicted images/sec exceed the input capacity (None: input keeps up everywhere),
    what it and the largest count considered need, and a sentence saying so. ``frame``: add_input_limit's, of one
    scenario."""
    g = frame.sort_values("replicas")
    limited = g[g["input_limited"]]
    first = _needs(limited.iloc[0]) if len(limited) else None
    largest = _needs(g.iloc[-1])
    # Where the GPUs come closest to the input's capacity: past one host, each host's GPUs consume less (the
    # all-reduce between hosts slows the step), so that is not always the largest count.
    closest = _needs(g.loc[(g["images_per_sec"] / g["input_capacity_images_per_sec"]).idxmax()])
    # The first count at which the input may be the limit: the first limited one, or an earlier one whose forecast
    # interval or capacity error reaches the other side (_either_side).
    maybe = g[g["input_limit_possible"]]
    possible = _needs(maybe.iloc[0]) if len(maybe) else None
    earlier = possible if possible is not None and (first is None or possible["replicas"] < first["replicas"]) else None
    return {"limit_replicas": first["replicas"] if first else None,
            "limit_possible_from_replicas": possible["replicas"] if possible else None,
            "at_limit": first, "at_largest": largest, "note": _limit_note(first, largest, closest, host, earlier)}


def _lift(n: dict, host: InputHost) -> str:
    k = n["service_workers_needed"]
    return (f"{n['cores_needed_per_host']} cores per host would feed them, or {k} more host{'s' if k != 1 else ''} "
            f"of {host.cores} cores as tf.data service workers")


def _capacity(n: dict) -> str:
    """The input's capacity at a count, with its error where the run measured one."""
    return plus_minus(n["input_capacity_images_per_sec"], n["input_capacity_uncertainty"], ",.0f")


def _either_side(n: dict) -> str:
    """Why either side of the limit is possible at a count ("": it is not): the GPUs' forecast interval
    (images_per_sec_low..high, where the forecast has one) reaches within NOISE_SIGMAS of the input's errors of its
    capacity (where the run measured one). Judged on the central figures alone, a forecast 10% over a capacity
    whose own error is 10% would be stated as a limit that the evidence does not show."""
    se, cap = n["input_capacity_uncertainty"], n["input_capacity_images_per_sec"]
    lo, hi = n["images_per_sec_low"], n["images_per_sec_high"]
    interval = lo == lo and hi == hi and lo < hi
    if not interval:
        lo = hi = n["images_per_sec"]
    reach = NOISE_SIGMAS * se if se == se else 0.0
    if not (lo <= cap + reach and hi >= cap - reach) or not (interval or reach > 0):
        return ""
    errors = f"within {NOISE_SIGMAS:g} of the input capacity's errors"
    if not interval:
        return errors
    return f"the GPUs' forecast interval, {lo:,.0f}..{hi:,.0f} images/s, reaches " + (
        errors if reach > 0 else "the input capacity")


def _limit_note(first: dict | None, largest: dict, closest: dict, host: InputHost, earlier: dict | None) -> str:
    """The sentence predict and advise print. ``earlier``: a count before ``first`` (or, where input keeps up, any
    count) at which either side is possible."""
    if first is None:
        why = _either_side(closest)
        text = (f"input keeps up to {largest['replicas']} GPUs: at its closest, {closest['replicas']} GPUs would "
                f"consume {closest['images_per_sec']:,.0f} images/s of the {_capacity(closest)} the input delivers"
                + (f" ({why}: it may be the limit there)" if why else ""))
        if earlier is not None and earlier["replicas"] != closest["replicas"]:
            text += (f"; the first count at which it may be the limit is {earlier['replicas']} GPUs "
                     f"({_either_side(earlier)})")
        return text
    why = _either_side(first)
    text = (f"input becomes the limit at {first['replicas']} GPUs: they would consume {first['images_per_sec']:,.0f} "
            f"images/s, the input delivers {_capacity(first)}"
            + (f" ({why}: it may keep up there)" if why else "") + f"; {_lift(first, host)}")
    if earlier is not None:
        text += (f"; it may already be the limit at {earlier['replicas']} GPUs ({earlier['images_per_sec']:,.0f} "
                 f"images/s; {_either_side(earlier)})")
    if largest["replicas"] != first["replicas"]:
        text += (f"; at {largest['replicas']} GPUs ({largest['images_per_sec']:,.0f} images/s) "
                 f"{_lift(largest, host)}")
    return text


def host_fields(host: InputHost) -> dict:
    """The input host's figures, as advice.json and prediction.json hold them (``input_limit``)."""
    return {"forecast": True, "per_core_images_per_sec": host.per_core, "host_cores": host.cores,
            "host_cores_from": host.cores_from, "host_capacity_images_per_sec": host.capacity,
            "host_capacity_uncertainty": host.capacity * host.relative_error, "service_worker_cores": host.cores}


def input_lines(il: dict | None) -> list[str]:
    """The lines advice_text() (advise) and forecast_text() (predict) print for an ``input_limit``."""
    if not il:
        return []
    lines = []
    if "per_core_images_per_sec" in il:
        capacity = plus_minus(il["host_capacity_images_per_sec"], il.get("host_capacity_uncertainty"), ",.0f")
        lines.append(f"input: {il['per_core_images_per_sec']:,.0f} images/s per core x {il['host_cores']} "
                     f"core{'s' if il['host_cores'] != 1 else ''} ({il['host_cores_from']}) = {capacity} images/s "
                     "per host")
    if not il.get("forecast"):
        return lines + [f"input limit: {il['why']}"]
    if "scenarios" in il:
        return lines + [f"{name}: {r['note']}" for name, r in il["scenarios"].items()]
    return lines + [f"input limit ({il['throughput_model']}): {il['note']}"]


def with_input_limit(frame: pd.DataFrame, host: InputHost | None, why: str, devices: str,
                      gpus_per_host: int) -> tuple[pd.DataFrame, dict]:
    """The forecast with the input columns added (add_input_limit) and prediction.json's ``input_limit``."""
    if host is None:
        return frame, {"forecast": False, "why": why}
    if devices == "shared":
        return frame, {**host_fields(host), "forecast": False,
                       "why": "not forecast for --devices shared: the replicas and the input share the same cores (the "
                              "run's input_headroom says what share of their time the input needed)"}
    frame = add_input_limit(frame, host, gpus_per_host)
    return frame, {**host_fields(host), "scenarios": {name: input_limit(g, host)
                                                      for name, g in frame.groupby("scenario", sort=False)}}

