"""``tftoolkit sweep SPEC --out DIR --backend slurm``: the points still to run, as one Slurm job array.

    DIR/slurm/jobs.json          every submission: job id, its array file, the point of each task index
    DIR/slurm/array-<n>.json     what task i of submission n runs (task reads it)
    DIR/slurm/array-<n>.sbatch   the script that was submitted (cluster.slurm.array_script)
    DIR/slurm/<job>_<i>.out      each task's Slurm log

Each array task runs exactly one point into DIR/runs/<id>/ through the local backend's own functions
(``task``), so statuses, failure isolation, the timeout and results.csv are the same. The folder must be
on a filesystem the nodes share (checked where it can be: cluster.slurm.check_shared).

Resume: every run of the command first *reconciles*: a task that left Slurm's queue without writing its result
(cancelled while pending, killed at its time limit, lost with its node) gets a record from what ``scontrol``
says of it; a task that wrote ``cancelled`` on SIGTERM becomes ``timeout`` if Slurm says TIMEOUT. Then it
submits only the points that are neither finished nor queued or running in Slurm (squeue), so no point is
ever submitted twice. ``--wait`` (default) polls until the arrays are done, showing each point as it ends, then
writes the report; ``--no-wait`` submits, prints the job id and returns: the same command later collects.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from ... import fileio, logs, rundir
from ...cluster import slurm
from ...errors import SweepError
from . import folder
from .html import render_report
from .results_csv import write_results
from .spec import OUT_PARAM, Spec
from .spec import load as load_spec

log = logging.getLogger("tftoolkit")

# How often --wait asks squeue; a site that minds its scheduler's load can raise it.
POLL_S = float(os.environ.get("TFTOOLKIT_SLURM_POLL_S", "2.0"))


def _jobs_path(out: Path) -> Path:
    return out / folder.SLURM_JOBS


def load_jobs(out: Path) -> list[dict]:
    path = _jobs_path(out)
    if not path.exists():
        return []
    try:
        return list(fileio.read_json(path).get("jobs", []))
    except (OSError, ValueError) as e:
        raise SweepError(f"{path} is unreadable ({e}); it lists this sweep's Slurm jobs: check squeue before "
                         "deleting it") from None


def _owned_by(rec: dict | None, job_id: str) -> bool:
    return bool(rec) and str((rec.get("slurm") or {}).get("job_id")) == str(job_id)


def reconcile(spec: Spec, out: Path, jobs: list[dict], active: dict) -> list[str]:
    """Give every task that ended without a result its record (see the module docstring); returns their ids."""
    by_id = {p.id: p for p in spec.points}
    changed = []
    for job in jobs:
        job_id = str(job["job_id"])
        states = None
        for idx, pid in enumerate(job["points"]):
            point = by_id.get(pid)
            if point is None or (job_id, idx) in active:
                continue
            rec = folder.read_record(out, point)
            if rec and not _owned_by(rec, job_id):
                continue  # a later submission owns this point now
            status = rec.get("status") if rec else "pending"
            refine = status == "cancelled" and not (rec.get("slurm") or {}).get("state")
            if status in folder.FINISHED and not refine:
                continue
            if states is None:
                states = slurm.final_states(job_id)
            state = states.get(idx)
            new_status, error = slurm.describe_end(state)
            if refine and new_status != "timeout":
                new_status, error = "cancelled", rec.get("error")  # it was a cancel: keep the task's own words
                if state and state["state"] == "CANCELLED":
                    error = slurm.describe_end(state)[1]
            record = {**(rec or {"id": pid, "params": point.params}), "status": new_status, "error": error,
                      "finished": (rec or {}).get("finished") or time.time()}
            record["slurm"] = {**(record.get("slurm") or {}), "job_id": job_id, "task": idx,
                               "state": state["state"] if state else "unknown"}
            pdir = folder.point_dir(out, point)
            pdir.mkdir(parents=True, exist_ok=True)
            fileio.write_json(pdir / folder.POINT_JSON, record)
            changed.append(pid)
    return changed


def _submit(spec: Spec, out: Path, todo, opts: slurm.ArrayOptions, timeout, jobs: list[dict]) -> dict:
    sdir = out / "slurm"
    sdir.mkdir(parents=True, exist_ok=True)
    n = len(jobs)
    array_json = sdir / f"array-{n}.json"
    entries = []
    for p in todo:
        entries.append({"index": p.index, "id": p.id, "params": p.params, "inject": p.inject})
    fileio.write_json(array_json, {"notebook": str(Path(spec.notebook).resolve()), "takes_out_dir": spec.takes_out_dir,
                                   "out_param": OUT_PARAM, "timeout": timeout, "points": entries})
    command = [sys.executable, "-m", "tftoolkit.experiments.sweep.task", str(out.resolve()), str(array_json.resolve())]
    script = sdir / f"array-{n}.sbatch"
    fileio.atomic_write(script, slurm.array_script(command, len(todo), opts, sdir.resolve(), Path.cwd().resolve()))
    job_id = slurm.submit(script)
    job = {"job_id": job_id, "array": array_json.name, "script": script.name, "points": [p.id for p in todo],
           "submitted": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    fileio.write_json(_jobs_path(out), {"jobs": jobs + [job]})
    for i, p in enumerate(todo):
        rec = folder.read_record(out, p)
        if _owned_by(rec, job_id):
            continue  # its task already started and wrote its own record
        pdir = folder.point_dir(out, p)
        pdir.mkdir(parents=True, exist_ok=True)
        fileio.write_json(pdir / folder.POINT_JSON, {"id": p.id, "params": p.params, "status": "queued",
                                                    "slurm": {"job_id": job_id, "task": i}})
    return job


def run(spec, out, *, opts: slurm.ArrayOptions | None = None, timeout: float | None = None,
        rerun_failed: bool = False, force: bool = False, wait: bool = True, report: bool = True,
        quiet: bool = False) -> dict:
    """Submit what is left of the sweep as a job array (and, with ``wait``, collect it); returns a summary dict
    as ``local.run`` does, plus ``jobs`` (the job ids submitted now) and ``in_flight`` (points queued or running)."""
    logs.ensure_logging(quiet)
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    opts = opts or slurm.ArrayOptions()
    opts.check()
    if timeout is not None and not timeout > 0:
        raise SweepError(f"--timeout must be > 0 seconds, got {timeout}")
    opts.time = slurm.time_limit(timeout, opts.time)
    slurm.require()
    out = rundir.path(out, "sweep folder")  # "" would be the working folder
    with rundir.lock(out, "sweep folder"):
        resuming = folder.open_dir(spec, out, force)
        if not resuming and _jobs_path(out).exists():
            _jobs_path(out).unlink()  # --force started the sweep over
        warning = slurm.check_shared(out, slurm.partition_nodes(opts.partition))
        if warning:
            log.warning("%s", warning)
        jobs = load_jobs(out)
        active = slurm.active_tasks([str(j["job_id"]) for j in jobs])
        reconcile(spec, out, jobs, active)
        in_flight = _points_of(jobs, active)
        todo, status = folder.plan(spec, out, rerun_failed)
        todo = [p for p in todo if p.id not in in_flight]
        submitted = None
        if todo:
            submitted = _submit(spec, out, todo, opts, timeout, jobs)
            jobs = load_jobs(out)
            log.info("sweep %s: submitted %d point(s) as Slurm job array %s%s", spec.notebook.name, len(todo),
                     submitted["job_id"], f"; {len(in_flight)} already queued or running" if in_flight else "")
        else:
            log.info("sweep %s: nothing to submit (%d point(s) queued or running in Slurm, the rest finished)",
                     spec.notebook.name, len(in_flight))
        write_results(spec, out)
        waiting = set(in_flight) | ({p.id for p in todo} if submitted else set())
    if wait and waiting:
        _wait(spec, out, waiting, quiet)
    with rundir.lock(out, "sweep folder"):
        jobs = load_jobs(out)
        active = slurm.active_tasks([str(j["job_id"]) for j in jobs])
        reconcile(spec, out, jobs, active)
        results = write_results(spec, out)
        final = {p.id: folder.point_status(out, p) for p in spec.points}
        summary = {"out": str(out), "points": len(spec.points), "ran": len(todo), "counts": folder.counts_of(final),
                   "new_failures": folder.new_failures(spec, out),
                   "results": str(results), "report": None, "report_error": None,
                   "jobs": [submitted["job_id"]] if submitted else [], "in_flight": sorted(_points_of(jobs, active))}
        if report and spec.report is not None and not summary["in_flight"]:
            summary["report"], summary["report_error"] = render_report(spec.report, [out], out, timeout=timeout)
    return summary


def _points_of(jobs: list[dict], active: dict) -> set[str]:
    ids = set()
    for job in jobs:
        for idx, pid in enumerate(job["points"]):
            if (str(job["job_id"]), idx) in active:
                ids.add(pid)
    return ids


def _wait(spec: Spec, out: Path, waiting: set[str], quiet: bool) -> None:
    """Poll squeue until none of these points is queued or running; each point is shown as it ends."""
    by_id = {p.id: p for p in spec.points}
    bar = logs.progress_bar(len(waiting), quiet=quiet, unit="point")
    left = set(waiting)
    try:
        while left:
            time.sleep(POLL_S)
            jobs = load_jobs(out)
            active = slurm.active_tasks([str(j["job_id"]) for j in jobs])
            reconcile(spec, out, jobs, active)
            still = _points_of(jobs, active)
            for pid in sorted(left - still):
                rec = folder.read_record(out, by_id[pid]) or {}
                if rec.get("status") not in folder.FINISHED:
                    continue  # not written yet: the next poll sees it
                left.discard(pid)
                line = f"{pid}: {rec['status']}" + (f" ({rec['error']})" if rec.get("error") else "")
                bar.update(1)
                if bar.disable:
                    log.info("%s", line)
                else:
                    bar.write(line)
            write_results(spec, out)
            if not still and left:
                # Ended without any record even after reconciling: nothing more will come.
                break
    except KeyboardInterrupt:
        ids = ", ".join(sorted({str(j["job_id"]) for j in load_jobs(out)}))
        log.warning("stopped waiting; the job array(s) %s keep running in Slurm: run the same command again to "
                    "collect them, or `scancel %s` to stop them", ids, ids)
        raise
    finally:
        bar.close()
