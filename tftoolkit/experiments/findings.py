"""What a set of results shows, in sentences computed from them: the "what we found" block of a report.

    from tftoolkit.experiments import findings
    from tftoolkit.experiments.report import results
    res = results.load(["runs/demo/scaling", "runs/demo/batch_lr"])
    findings.markdown(res)      # a short Markdown list, for the top of report.html

One finding per question the results can answer, and none for a question they cannot (no scaling runs: no
sentence about speed-up):
- speed-up and efficiency at the largest replica count (and that simulated replicas share the host's cores);
- where the gradient all-reduce overtakes the compute, or that it never does in these runs;
- whether and where the runs were input-bound (input_verdict, input_headroom), and on simulated CPU replicas how
  to read that (input and compute shared the cores), or that these runs did not measure their input;
- the best LR rule per global batch, and how far the linear rule holds as the batch grows (Goyal et al. 2017),
  checked against the measured gradient noise scale (McCandlish et al. 2018) where there is one (batch_findings.py);
- which points or runs failed, diverged or timed out, with their errors.
File readers only: no TensorFlow.
"""

from __future__ import annotations

import math

import pandas as pd

from .. import summary as summary_schema
from ..measure import stats
from ..measure.input import verdict as input_verdict
from ..measure.parts import Part
from .batch_findings import batch_and_lr
from .report import results, tables

def scaling(res: results.Results) -> list[str]:
    """One sentence per group of runs that differ only in replica count (results.scaling_frame): its largest count's
    speed-up and efficiency over its smallest, from the mean of its repeats (seeds), with their spread."""
    df = results.scaling_frame(res)
    if df.empty or "speedup" not in df.columns:
        return []
    out = []
    for (mode, group), g in df.groupby(["mode", "group"], sort=False):
        g = results.finished(g).dropna(subset=["speedup"]).sort_values("replicas")
        if g.empty:
            continue
        top, base = g.iloc[-1], g.iloc[0]
        if int(top["replicas"]) == int(base["replicas"]):
            continue
        kind = str(top.get("device_kind", ""))
        note = (" The replicas are simulated on CPU and share the host's cores, so no speed-up is expected here: "
                "these figures show the method; run the scaling sweep on GPUs for the real curve."
                if kind == "CPU-simulated" else "")
        how = summary_schema.measured_with(top)
        repeats = int(top["repeats"])
        rate = f"{top['group_images_per_sec']:.0f} images/s"
        if repeats > 1:
            rate += f" (mean of {repeats} runs, spread ±{top['images_per_sec_spread']:.0f})"
        base_repeats = int(base["repeats"])
        base_what = f"the {int(base['replicas'])}-replica rate" + (f" (mean of {base_repeats})" if base_repeats > 1 else "")
        err = top.get("speedup_uncertainty")
        plus = f" ± {err:.2f}" if isinstance(err, float) and math.isfinite(err) and err > 0 else ""
        where = ", ".join(x for x in (mode or "as run", group) if x)
        out.append(f"**Scaling ({where}):** {int(top['replicas'])} replicas ran at {rate}, {top['speedup']:.2f}x{plus} "
                   f"{base_what}: {top['efficiency']:.0%} scaling efficiency{f' ({how})' if how else ''}.{note}")
    return out


# The status a summary records for each part ("measured", "within noise", "failed"); older summaries have only the
# value and its uncertainty, from which part_status decides the same way.
MEASURED, WITHIN_NOISE, FAILED, UNKNOWN = "measured", "within noise", "failed", "no uncertainty recorded"


def part_status(rows: pd.DataFrame, key: str) -> tuple[float, float, str]:
    """(mean, standard error of the mean, status) of a breakdown part ``key`` (say "allreduce_time_s") over ``rows``
    (the repeats at one replica count). The status is the summaries' own ``<part>_status`` where they record one (a
    failed measurement in any repeat fails the mean), else the runs' own rule (measure.parts.Part) on the mean and its
    error; without an error, unknown: a part within noise is never a finding."""
    values = pd.to_numeric(rows[key], errors="coerce")
    se = pd.to_numeric(rows.get(key[:-2] + "_uncertainty_s", pd.Series(math.nan, index=rows.index)), errors="coerce")
    recorded = rows.get(key[:-2] + "_status", pd.Series(None, index=rows.index, dtype=object))
    n = int(values.notna().sum())
    mean = float(values.mean()) if n else math.nan
    err = float(math.sqrt((se[values.notna()] ** 2).sum()) / n) if n and se[values.notna()].notna().all() else math.nan
    if (recorded == FAILED).any() or (n and not math.isfinite(mean)):
        return mean, err, FAILED
    if stats.within_noise(mean, err) is None:
        return mean, err, UNKNOWN if n else FAILED
    return mean, err, Part(mean, err).status  # the runs' own rule: negative is never measured


def _ms(value: float, err: float) -> str:
    return f"{value * 1e3:.2f}" + (f" ± {err * 1e3:.2f}" if err == err else "") + " ms"


def communication(res: results.Results) -> list[str]:
    """One sentence per group of runs that differ only in replica count (as ``scaling``): where the all-reduce
    overtakes the compute, or its largest share of the step; repeats (seeds) at one count are averaged. Only a part
    measured above its noise is a finding (part_status): when the all-reduce is within noise at every count, the
    sentence says that these runs do not show its cost, with the figures."""
    df = results.scaling_frame(res)
    need = {"compute_time_s", "allreduce_time_s", "replicas"}
    if df.empty or not need <= set(df.columns):
        return []
    groups = df.groupby(["mode", "group"], sort=False)
    out = []
    for (mode, group), g in groups:
        g = results.finished(g).dropna(subset=list(need))
        g = g[g["replicas"] > 1]
        if g.empty:
            continue
        at = {int(n): (part_status(rows, "compute_time_s"), part_status(rows, "allreduce_time_s"))
              for n, rows in g.groupby("replicas")}
        where = ", ".join(x for x in (mode, group) if x) if groups.ngroups > 1 or group else ""
        head = f"**Communication ({where}):**" if where else "**Communication:**"
        shown = {n: p for n, p in at.items() if p[1][2] in (MEASURED, UNKNOWN) and p[0][2] in (MEASURED, UNKNOWN)}
        figures = "; ".join(f"{n} replicas: {_ms(*ar[:2])} ({ar[2]})" for n, (_, ar) in at.items()
                            if ar[2] in (WITHIN_NOISE, FAILED))
        if not shown:
            out.append(f"{head} the all-reduce's cost is not shown by these runs: it was within noise or its "
                       f"measurement failed at every replica count ({figures}).")
            continue
        caveat = (" These runs recorded no uncertainty for the parts, so the comparison is not checked against noise."
                  if any(p[1][2] == UNKNOWN for p in shown.values()) else "")
        rest = f" Not shown at {figures}." if figures else ""
        over = [n for n, (c, a) in sorted(shown.items()) if stats.differ(a[0], a[1], c[0], c[1]) is not False
                and a[0] > c[0]]
        if over:
            n = over[0]
            (c, _, _), (a, _, _) = shown[n]
            out.append(f"{head} the gradient all-reduce overtakes the compute at {n} replicas "
                       f"({a * 1e3:.2f} ms against {c * 1e3:.2f} ms per step): past that, more replicas buy little. A "
                       f"larger per-replica batch or a faster interconnect moves the point.{rest}{caveat}")
            continue
        share = {n: a[0] / (a[0] + c[0]) for n, (c, a) in shown.items() if a[0] + c[0] > 0}
        if not share:
            continue
        n = max(share, key=share.get)
        (c, ce, _), (a, ae, _) = shown[n]
        err = stats.ratio_uncertainty(a, ae, a + c, math.hypot(ae, ce)) if ae == ae and ce == ce else math.nan
        plus = f" ± {err:.0%}" if err == err else ""
        above = "" if caveat else " measured above noise"
        out.append(f"{head} the all-reduce never overtakes the compute in these runs; its largest share{above} "
                   f"is {share[n]:.0%}{plus} of the step, at {n} replicas ({_ms(a, ae)} against "
                   f"{_ms(c, ce)} of compute).{rest}{caveat}")
    return out


# Points listed by name in the input finding; past this many, a count (the overview table has them all).
LIST_AT_MOST = 6


def _headroom(h: float, se: float, digits: int = 2) -> str:
    """A headroom with its error, and the other verdicts within NOISE_SIGMAS of it (measure.input.verdict): the
    verdict is the figures', not a finding beyond their noise."""
    others = input_verdict.may_be(h, se)
    return stats.plus_minus(h, se, f".{digits}f") + (f", {others}" if others else "")


def _named(rows: pd.DataFrame, labels: pd.Series) -> str:
    """Each run by its label, with its headroom and error (``_headroom``)."""
    se = pd.to_numeric(rows.get("input_headroom_uncertainty", pd.Series(math.nan, index=rows.index)), errors="coerce")

    def one(i, h):
        return f"{labels[i]} (headroom {_headroom(h, se[i])})"

    items = [one(i, h) for i, h in rows["input_headroom"].items()]
    more = len(items) - LIST_AT_MOST
    return "; ".join(items[:LIST_AT_MOST]) + (f"; and {more} more" if more > 0 else "")


def input_capacity(res: results.Results) -> list[str]:
    """Whether and where the runs were input-bound (summary's input_verdict and input_headroom), that every
    measured run was fed, or that these runs did not measure it (written before runs measured their input)."""
    runs = res.runs
    if runs.empty or "images_per_sec" not in runs.columns:
        return []
    runs = runs[runs["images_per_sec"].notna()]  # the runs that trained
    if runs.empty:
        return []
    verdict = runs.get("input_verdict", pd.Series("", index=runs.index)).fillna("").astype(str)
    measured = runs[(verdict != "") & pd.to_numeric(runs.get("input_headroom", pd.Series(math.nan, index=runs.index)),
                                                    errors="coerce").notna()]
    if measured.empty:
        return ["**Input capacity:** not measured for these runs (they were written before runs measured it): "
                "whether the input kept up is not known."]
    labels, verdict = tables.run_labels(res), verdict[measured.index]
    bound = measured[verdict == "input-bound"].sort_values("input_headroom")
    near = measured[verdict == "near"].sort_values("input_headroom")
    unmeasured = len(runs) - len(measured)
    rest = f" Not measured in {unmeasured} older run(s)." if unmeasured else ""
    if bound.empty and near.empty:
        low = measured["input_headroom"].idxmin()
        se = pd.to_numeric(measured.get("input_headroom_uncertainty", pd.Series(math.nan, index=measured.index)),
                           errors="coerce")
        h = measured.loc[low, "input_headroom"]
        said = ", ".join(x for x in (f"± {se[low]:.1f}" if se[low] == se[low] else "",
                                     input_verdict.may_be(h, se[low])) if x)
        text = (f"**Input kept up** in all {len(measured)} measured run(s): the input alone could deliver at least "
                f"{h:.1f}x what training consumed ({said + '; ' if said else ''}the least at {labels[low]}).")
    else:
        fed = len(measured) - len(bound) - len(near)
        parts = ([f"input-bound at {_named(bound, labels)}."] if len(bound) else []) + \
                ([f"Close to the limit at {_named(near, labels)}."] if len(near) else []) + \
                ([f"Fed in the other {fed} measured run(s)."] if fed else [])
        tight = pd.concat([bound, near])
        on_gpus = (tight.get("device_kind", pd.Series("", index=tight.index)) != "CPU-simulated").any()
        text = ("**Input:** " + " ".join(parts)
                + (" There the GPUs waited for an input pipeline that delivered (nearly) no more than they consumed: "
                   "more input cores, or a tf.data service (`--data-service`), would lift it." if on_gpus else ""))
    return [text + rest + _simulated(measured, labels)]


def _simulated(measured: pd.DataFrame, labels: pd.Series) -> str:
    """How to read the headroom of runs on simulated CPU replicas, where input and compute shared the cores."""
    sim = measured[measured.get("device_kind", pd.Series("", index=measured.index)) == "CPU-simulated"]
    if sim.empty:
        return ""
    low = sim["input_headroom"].idxmin()
    return (f" On simulated CPU replicas input and compute shared the host's cores, so there the headroom is not a GPU "
            f"server's verdict: 1 / headroom is the share of the cores' time the input needed ("
            f"{1 / sim.loc[low, 'input_headroom']:.0%} at {labels[low]}). Measure on the GPU server for its verdict.")


def hardware(res: results.Results) -> list[str]:
    """The hardware monitor's flags (an idle GPU, a thermal or hardware slowdown: faults to look at) and its notes (a
    GPU at its software power cap: how data-centre GPUs run at full load, not a fault), kept apart, per run."""
    runs = res.runs
    out = []
    for col, head in (("monitor_flags", "**Hardware monitor flags:**"),
                      ("monitor_notes", "**Power cap (not a fault):**")):
        if runs.empty or col not in runs.columns:
            continue
        said = runs[col].map(_text)
        said = said[said != ""]
        if said.empty:
            continue
        labels = tables.run_labels(res)
        items = [f"{labels[i]}: {'; '.join(text.splitlines())}" for i, text in said.items()]
        more = len(items) - LIST_AT_MOST
        out.append(f"{head} " + " | ".join(items[:LIST_AT_MOST]) + (f" | and {more} more run(s)" if more > 0 else "")
                   + ".")
    return out


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)  # results.csv's blank is NaN


def failures(res: results.Results) -> list[str]:
    df = res.points if not res.points.empty else res.runs
    if df.empty or "status" not in df.columns:
        return []
    bad = df[df["status"].isin(["failed", "diverged", "timeout"])]
    if bad.empty:
        return [f"**Every point finished:** {len(df)} of {len(df)} ok."]
    name = "id" if "id" in bad.columns else "run"
    items = [f"{r[name]} ({r['status']}" + (f": {_text(r.get('error'))[:120]})" if _text(r.get("error")) else ")")
             for _, r in bad.iterrows()]
    return [f"**{len(bad)} of {len(df)} did not finish normally:** " + "; ".join(items) + "."]


def recorded(res: results.Results) -> list[str]:
    """For a sweep of any notebook: the range of each numeric result it recorded, and the point at each end (which
    end is better is the notebook's to say)."""
    table = tables.recorded(res)
    if table.empty:
        return []
    out = []
    ok = table[table["status"] == "ok"] if "status" in table.columns else table
    for src, g in ok.groupby("source", sort=False):
        params = res.point_params.get(src, [])
        for col in res.recorded.get(src, []):
            values = pd.to_numeric(g[col], errors="coerce")
            if values.notna().sum() < 1:
                continue

            def where(i):
                return ", ".join(f"{p}={g.loc[i, p]}" for p in params) or str(g.loc[i, "id"])

            lo, hi = values.idxmin(), values.idxmax()
            out.append(f"**{col}** ({src}, {int(values.notna().sum())} finished point(s)): from {values[lo]:.4g} "
                       f"({where(lo)}) to {values[hi]:.4g} ({where(hi)}).")
    return out


def all_findings(res: results.Results) -> list[str]:
    return (scaling(res) + communication(res) + input_capacity(res) + hardware(res) + batch_and_lr(res) + recorded(res)
            + failures(res))


NOTHING = ("**Nothing to report yet:** no run, sweep or all-reduce folder was found. Run notebooks 01-03, a "
           "sweep (`tftoolkit sweep SPEC --out runs/NAME`) or `make demo`, then this report again.")


def markdown(res: results.Results) -> str:
    """The findings as a Markdown list under a heading; a clear sentence when there is nothing to report."""
    found = all_findings(res)
    if not found and res.runs.empty and res.allreduce.empty and res.points.empty:
        return "## What we found\n\n" + NOTHING
    if not found:
        found = ["These results hold no scaling, communication or batch-size comparison to draw a finding from."]
    return "## What we found\n\n" + "\n".join(f"- {f}" for f in found)
