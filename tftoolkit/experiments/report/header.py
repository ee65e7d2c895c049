"""The report's opening lines: what was measured, on which devices and machine, when, by which toolkit version.

A report's figures get copied into papers and slides without the folders they came from; the header is what says
where they came from. Everything here is read from the run directories' env.json (written by the run as it started)
and summary.json, so it says what the runs recorded, not what the machine rendering the report has.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ...measure.hardware import toolkit_version
from .results import Results, batch_runs, scaling_runs


def _env(run_dir) -> dict:
    try:
        return json.loads((Path(run_dir) / "env.json").read_text())
    except (OSError, ValueError, TypeError):
        return {}


def _span(values) -> str:
    values = sorted(set(values))
    if not values:
        return "not recorded"
    return values[0] if len(values) == 1 else f"{values[0]} to {values[-1]}"


def facts(res: Results) -> dict:
    """The header's facts: devices (kind, names, replica counts), machine(s), dates, toolkit and TensorFlow versions,
    and what was measured (runs per study, statuses, all-reduce benches)."""
    runs = res.runs if not res.runs.empty else pd.DataFrame(columns=["run_dir"])
    envs = [_env(d) for d in runs.get("run_dir", pd.Series(dtype=str)).dropna()]
    kinds = sorted(set(runs["device_kind"].dropna().astype(str))) if "device_kind" in runs.columns else []
    gpus = sorted({g.get("name", "GPU") for e in envs for g in (e.get("gpus") or []) if isinstance(g, dict)})
    hosts = sorted({(e.get("host") or {}).get("hostname", "") for e in envs} - {""})
    cpus = sorted({f"{(e.get('host') or {}).get('cpu_model', '?')}, {(e.get('host') or {}).get('cpu_logical_cores', '?')}"
                   f" logical cores" for e in envs if e.get("host")})
    replicas = sorted({int(r) for r in runs["replicas"].dropna()}) if "replicas" in runs.columns else []
    versions = sorted({str((e.get("tftoolkit") or {}).get("version")) for e in envs
                       if (e.get("tftoolkit") or {}).get("version")})
    measured = []
    if not scaling_runs(res).empty:
        measured.append(f"data-parallel scaling ({len(scaling_runs(res))} runs at {', '.join(map(str, replicas))} "
                        "replicas)")
    if not batch_runs(res).empty:
        measured.append(f"batch size and learning rate ({len(batch_runs(res))} runs)")
    if not res.allreduce.empty:
        measured.append(f"all-reduce benchmarks ({len(res.allreduce)} rows)")
    statuses = runs["status"].value_counts().to_dict() if "status" in runs.columns else {}
    return {
        "devices": ", ".join(kinds) or "not recorded",
        "gpus": ", ".join(gpus),
        "replicas": replicas,
        "machines": ", ".join(hosts) or "not recorded",
        "cpus": "; ".join(cpus),
        "dates": _span([str(e["collected_at"])[:16].replace("T", " ") + " UTC" for e in envs if e.get("collected_at")]),
        "toolkit": ", ".join(versions) if versions else "not recorded by these runs",
        "report_toolkit": toolkit_version(),
        "tensorflow": ", ".join(sorted({str((e.get("tensorflow") or {}).get("version")) for e in envs
                                        if (e.get("tensorflow") or {}).get("version")})) or "not recorded",
        "measured": measured or ["no study these figures draw"],
        "runs": len(runs),
        "statuses": statuses,
        "sources": [Path(s).name for s in res.sources],
    }


def markdown(res: Results) -> str:
    """The header as Markdown, for the report's first cell."""
    f = facts(res)
    devices = f["devices"] + (f" ({f['gpus']})" if f["gpus"] else "")
    if f["devices"] == "CPU-simulated":
        devices += (": logical CPU devices sharing the host's cores; times and speed-ups are not those of GPUs, every "
                    "figure says so")
    status = ", ".join(f"{n} {s}" for s, n in sorted(f["statuses"].items()))
    lines = [
        f"**What was measured:** {'; '.join(f['measured'])}, from {', '.join(f['sources']) or 'no folder'} "
        f"({f['runs']} runs: {status or 'none'}).",
        f"**Devices:** {devices}" + (f"; replicas {', '.join(map(str, f['replicas']))}" if f["replicas"] else "") + ".",
        f"**Machine:** {f['machines']}" + (f" ({f['cpus']})" if f["cpus"] else "") + ".",
        f"**When:** {f['dates']}.",
        f"**Software:** tftoolkit {f['toolkit']} measured (this report: tftoolkit {f['report_toolkit']}), "
        f"TensorFlow {f['tensorflow']}.",
    ]
    return "\n\n".join(["## What ran where"] + lines)
