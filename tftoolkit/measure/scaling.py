"""Scaling within configurations: which runs are one configuration measured at several replica counts, and their
speed-up and efficiency within that group (pandas only, no TensorFlow: the report and ``advise`` read files).

    groups = scaling.with_groups(runs)        # + "mode" and "group" ("model=small_cnn", or "" for one configuration)
    rates = scaling.group_rates(runs)         # one row per group and replica count: mean images/sec, its error, spread
    table = scaling.speedups(runs)            # every run + its group's speed-up and efficiency: scaling.csv's columns

``runs`` is a frame of runs as the report's ``runs.csv`` has them: ``source``, ``replicas``, ``images_per_sec``,
``images_per_sec_uncertainty``, ``status``, and either ``point_params`` (a sweep point's parameters, JSON) or the
``config.<field>`` columns of run directories; ``mode`` ("weak"/"strong") and ``per_replica_batch`` when known.

A group is the runs of one source and scaling mode that differ only in the replica count, in what follows from it in
that mode (the global batch grows with N in weak scaling; each replica's share shrinks with N in strong scaling), in
the layout of the replicas over processes, and in ``REPEAT_AXES`` (seeds: repeats, averaged with their spread). A
second grid axis (model, batch, dataset, ...) makes one group per value; its runs are never compared with another
group's.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from ..config import NON_IDENTITY_KEYS
from . import stats

REPEAT_AXES = ("seed",)        # runs that differ only in these are repeats of one configuration: averaged
FOLLOWS_REPLICAS = {"weak": ("global_batch",), "strong": ("per_replica_batch",),
                    "": ("global_batch", "per_replica_batch")}
NOT_AN_AXIS = ("replicas", "gpus", "workers", "mode", *REPEAT_AXES)
GROUP_KEYS = ["source", "mode", "group"]
COUNTED = ("ok", "diverged")   # statuses whose throughput counts (a diverged run still ran at its speed)


def one_value(v):
    """A swept value as a sentence names it: a one-element list (a notebook's list parameter, one per point) as its
    element, "replicas=4" rather than "replicas=[4]"."""
    return v[0] if isinstance(v, list) and len(v) == 1 else v


def configuration_axes(runs: pd.DataFrame, mode: str) -> tuple[list[str], pd.DataFrame]:
    """The parameters that tell configurations apart in ``runs`` (one source, one mode), and the table of every
    run's parameters they are read from: a sweep point's parameters, or for run directories outside a sweep their
    config fields; an axis is a parameter that takes more than one value there."""
    skip = set(NOT_AN_AXIS) | set(FOLLOWS_REPLICAS.get(mode, ())) | set(NON_IDENTITY_KEYS)
    params = runs["point_params"].map(lambda v: json.loads(v) if isinstance(v, str) and v else {}) \
        if "point_params" in runs.columns else pd.Series([{}] * len(runs), index=runs.index)
    if params.map(bool).all():
        table = pd.DataFrame(params.tolist(), index=runs.index)
    else:
        table = runs[[c for c in runs.columns if c.startswith("config.")]].rename(columns=lambda c: c[len("config."):])
    axes = [c for c in table.columns if c not in skip
            and table[c].map(lambda v: json.dumps(v, sort_keys=True, default=str)).nunique() > 1]
    return axes, table


def group_labels(runs: pd.DataFrame, mode: str) -> pd.Series:
    """Each run's configuration, as "model=small_cnn, dataset=shapes16k" (what its group varies in), or "" when the
    runs (one source, one mode) are one configuration."""
    axes, table = configuration_axes(runs, mode)
    if not axes:
        return pd.Series("", index=runs.index)
    return table[axes].apply(lambda r: ", ".join(f"{a}={one_value(r[a])}" for a in axes), axis=1)


def with_groups(runs: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``runs`` with ``mode`` (filled in where missing: "weak" when every run has one per-replica batch,
    else "strong") and ``group`` (see ``group_labels``); ``GROUP_KEYS`` then names one group."""
    df = runs.copy()
    if df.empty:
        return df.assign(mode=pd.Series(dtype=str), group=pd.Series(dtype=str))
    if "mode" not in df.columns or df["mode"].isna().all():
        df["mode"] = "weak" if df.get("per_replica_batch", pd.Series(dtype=float)).nunique() == 1 else "strong"
    df["mode"] = df["mode"].fillna("")
    df["group"] = ""
    for (_, mode), g in df.groupby(["source", "mode"]):
        df.loc[g.index, "group"] = group_labels(g, mode)
    return df


def group_rates(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per group (``GROUP_KEYS``) and replica count, over the runs that finished (``COUNTED``) with a rate:
    ``images_per_sec`` (the repeats' mean), ``uncertainty`` (the mean's standard error: the repeats' spread over
    sqrt(n) when there are repeats, else the run's own uncertainty), ``spread`` (the repeats' standard deviation,
    NaN for one run), ``repeats``."""
    df = runs if "group" in runs.columns else with_groups(runs)
    cols = [*GROUP_KEYS, "replicas", "images_per_sec", "uncertainty", "spread", "repeats"]
    if df.empty or "images_per_sec" not in df.columns:
        return pd.DataFrame(columns=cols)
    ok = df[df["status"].isin(COUNTED) & (pd.to_numeric(df["images_per_sec"], errors="coerce") > 0)]
    rows = []
    for (src, mode, group, n), at in ok.groupby([*GROUP_KEYS, "replicas"]):
        ips = at["images_per_sec"].astype(float)
        spread = float(ips.std(ddof=1)) if len(ips) > 1 else math.nan
        own = pd.to_numeric(at.get("images_per_sec_uncertainty", pd.Series(math.nan, index=at.index))).iloc[0]
        err = spread / math.sqrt(len(ips)) if len(ips) > 1 else float(own)
        rows.append([src, mode, group, int(n), float(ips.mean()), err, spread, len(ips)])
    return pd.DataFrame(rows, columns=cols)


def speedups(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run of ``runs`` with its group's scaling, sorted by mode, group and replicas: the columns of
    ``scaling.csv``. ``group_images_per_sec``, ``images_per_sec_spread`` and ``repeats`` are the group's figures at
    the run's replica count (``group_rates``); ``speedup`` is that mean over the group's mean at its smallest count
    (``baseline_replicas``), so that count's rows have speedup 1.0; ``efficiency`` = speedup / (N / N_base);
    ``speedup_uncertainty`` propagates the standard errors of both means. Runs whose group has no finished run at
    their count keep NaN there."""
    df = with_groups(runs)
    df["uncertainty"] = df.get("images_per_sec_uncertainty", math.nan)
    for col in ("group_images_per_sec", "images_per_sec_spread", "speedup", "speedup_uncertainty", "efficiency",
                "baseline_replicas"):
        df[col] = math.nan
    df["repeats"] = 0
    rates = group_rates(df)
    for key, at in rates.groupby(GROUP_KEYS):
        base = at.loc[at["replicas"].idxmin()]
        means = {int(r["replicas"]): r for _, r in at.iterrows()}
        g = df[(df[GROUP_KEYS] == pd.Series(key, index=GROUP_KEYS)).all(axis=1)]
        for i, r in g.iterrows():
            m = means.get(int(r["replicas"]))
            if m is None:
                continue
            s = stats.speedup(m["images_per_sec"], base["images_per_sec"])
            df.loc[i, ["group_images_per_sec", "images_per_sec_spread", "repeats", "baseline_replicas"]] = \
                [m["images_per_sec"], m["spread"], m["repeats"], base["replicas"]]
            df.loc[i, "speedup"] = s
            df.loc[i, "speedup_uncertainty"] = 0.0 if m["replicas"] == base["replicas"] else \
                stats.ratio_uncertainty(m["images_per_sec"], m["uncertainty"], base["images_per_sec"],
                                        base["uncertainty"])
            df.loc[i, "efficiency"] = stats.scaling_efficiency(s, int(m["replicas"]), int(base["replicas"]))
    df["repeats"] = df["repeats"].astype(int)
    df["baseline_replicas"] = df["baseline_replicas"].astype("Int64")
    return df.sort_values(["mode", "group", "replicas"]).reset_index(drop=True)
