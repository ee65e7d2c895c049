"""The sweep folder (sweep.json, runs/<id>/) and each point's record (point.json): which sweep a folder holds, each
point's status, what its notebook produced (the run summaries under it, the values it recorded in results.json),
and which points are left to run.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from ... import fileio, rundir
from ... import summary as summary_schema
from ...errors import SweepError
from .spec import Point, Spec

log = logging.getLogger("tftoolkit")

SWEEP_JSON = "sweep.json"
RESULTS_CSV = "results.csv"
RUNS = "runs"
POINT_JSON = "point.json"
PARAMS_JSON = "parameters.json"
OUTCOME_JSON = ".outcome.json"
LOG_TXT = "log.txt"
SLURM_JOBS = "slurm/jobs.json"  # the Slurm backend's submissions (slurm.py)

FINISHED = ("ok", "diverged", "failed", "timeout", "cancelled")
RERUNNABLE = ("failed", "timeout", "cancelled")
UNFINISHED = ("pending", "queued", "running")
BAD_STATUSES = ("failed", "timeout", "cancelled")
REPORTED_JSON = ".reported.json"  # when a sweep command last told its caller about the folder's failures
RESULTS_JSON = "results.json"


# --- the sweep folder ----------------------------------------------------------------------------------------
def _identity_diff(old: dict, new: dict) -> str:
    if old.get("notebook") != new.get("notebook"):
        return f"notebook {old.get('notebook')} there, {new.get('notebook')} now"
    a, b = old.get("points", []), new.get("points", [])
    if len(a) != len(b):
        return f"{len(a)} points there, {len(b)} now"
    for x, y in zip(a, b):
        if x != y:
            return f"point {x.get('id')} there has {x.get('params')}, now {y.get('id')} has {y.get('params')}"
    return "unknown difference"


def open_dir(spec: Spec, out: Path, force: bool, create: bool = True) -> bool:
    """Check ``out`` can hold this sweep (create it); returns True when it already holds it (resume).

    A sweep folder is one whose sweep.json this toolkit wrote (``rundir.marked``): only such a folder is resumed or,
    with ``force``, cleared. A folder holding any other sweep.json (the user's, or one that is not JSON) is refused,
    ``force`` or not, and left as it is."""
    sweep_json = out / SWEEP_JSON
    ident = spec.identity()
    if sweep_json.exists() or sweep_json.is_symlink():
        try:
            doc = fileio.read_json(sweep_json)
        except (OSError, ValueError):
            doc = None
        if not rundir.marked(doc) or sweep_json.is_symlink():
            raise SweepError(f"{out} is not a tftoolkit sweep folder: its {SWEEP_JSON} was not written by a sweep "
                             "(a sweep's carries \"written_by\": \"tftoolkit\"), so it is left as it is; choose "
                             "another --out")
        old = doc.get("identity") if isinstance(doc.get("identity"), dict) else {}
        if old == json.loads(json.dumps(ident)):
            if create:
                fileio.remove_stale_temps(out)  # ours, and locked: what a writer killed mid-write left goes
            return True
        if not force:
            raise SweepError(f"{out} holds a different sweep ({_identity_diff(old, ident)}); choose another --out, "
                             "or pass --force to delete it and start over")
        if create:
            rundir.clear(out)  # all but the lock this sweep holds
    elif out.exists() and [p for p in out.iterdir() if p.name != rundir.LOCK_FILE]:
        raise SweepError(f"{out} is not empty and holds no {SWEEP_JSON}: it is not a sweep folder; choose a new or "
                         "empty --out")
    if create:
        fileio.ensure_dir(out, "sweep folder")
        fileio.write_json(sweep_json, {
            **rundir.MARK,
            "identity": ident,
            "spec": {"notebook": str(spec.notebook), "report": str(spec.report) if spec.report else None,
                     "fixed": spec.fixed, "grid": spec.grid, "zip": spec.zip, "source": spec.source,
                     "description": spec.description},
            "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        })
    return False


def point_dir(out: Path, point: Point) -> Path:
    return out / RUNS / point.id


def read_record(out: Path, point: Point) -> dict | None:
    path = point_dir(out, point) / POINT_JSON
    try:
        return fileio.read_json(path)
    except (OSError, ValueError):
        return None


def point_status(out: Path, point: Point) -> str:
    rec = read_record(out, point)
    return rec.get("status", "running") if rec else "pending"


# --- what a point produced -----------------------------------------------------------------------------------
def _flatten(d: dict, prefix: str = "", depth: int = 0) -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if depth < 1:
                out.update(_flatten(v, key + ".", depth + 1))
        elif isinstance(v, (list, tuple)):
            continue  # per-replica lists live in the run directory; the table keeps scalars
        else:
            out[key] = v
    return out


def collect_runs(pdir: Path) -> dict:
    """The training runs a point's notebook wrote (every summary.json under its folder), summarised."""
    paths = sorted(p for p in pdir.rglob("summary.json") if ".ipynb_checkpoints" not in p.parts)
    summaries = []
    for p in paths:
        try:
            summaries.append((p.parent, summary_schema.read(p)))
        except (OSError, ValueError):
            summaries.append((p.parent, {"status": "failed", "error": f"unreadable {p.name}"}))
    info = {"runs": len(summaries), "run_status": "ok", "run_error": None, "run_dir": None, "figures": {}}
    bad = [(d, s) for d, s in summaries if s.get("status", "ok") != "ok"]
    if bad:
        order = {"failed": 0, "diverged": 1}
        d, s = min(bad, key=lambda ds: order.get(ds[1].get("status"), 2))
        info["run_status"] = s.get("status")
        info["run_error"] = (f"{d.relative_to(pdir)}: " if len(summaries) > 1 else "") + str(s.get("error") or "")
    if len(summaries) == 1:
        d, s = summaries[0]
        info["run_dir"] = str(d.relative_to(pdir))
        info["figures"] = {k: v for k, v in _flatten(s).items() if k not in ("status", "error")}
    return info


def recorded_values(pdir: Path) -> dict:
    """The scalars a notebook recorded in ``results.json`` in its point folder (a JSON object), if it wrote one."""
    path = pdir / RESULTS_JSON
    if not path.exists():
        return {}
    try:
        data = fileio.read_json(path)
    except (OSError, ValueError) as e:
        log.warning("%s is not readable JSON (%s); its values are not in results.csv", path, e)
        return {}
    if not isinstance(data, dict):
        log.warning("%s holds a %s, not an object of named values; not in results.csv", path, type(data).__name__)
        return {}
    return {str(k): v for k, v in _flatten(data).items()}


def plan(spec: Spec, out: Path, rerun_failed: bool) -> tuple[list[Point], dict[str, str]]:
    """(points to run, current status of every point)."""
    status = {p.id: point_status(out, p) for p in spec.points}
    todo = [p for p in spec.points
            if status[p.id] not in FINISHED or (rerun_failed and status[p.id] in RERUNNABLE)]
    return todo, status


def new_failures(spec: Spec, out: Path) -> int:
    """Points that failed, timed out or were cancelled since the last sweep command over ``out`` reported: what
    this command's exit code is about. A failure kept from an earlier run was reported by the command that saw it
    end (a Slurm point submitted with --no-wait is reported by the command that collects it). Marks them reported."""
    since = (fileio.read_json(out / REPORTED_JSON).get("at", 0.0) if (out / REPORTED_JSON).exists() else 0.0)
    count = 0
    for point in spec.points:
        rec = read_record(out, point) or {}
        if rec.get("status") in BAD_STATUSES and float(rec.get("finished") or 0.0) > since:
            count += 1
    fileio.write_json(out / REPORTED_JSON, {"at": time.time()})
    return count


def counts_of(status: dict[str, str]) -> dict[str, int]:
    return {s: sum(1 for v in status.values() if v == s) for s in FINISHED + UNFINISHED}
