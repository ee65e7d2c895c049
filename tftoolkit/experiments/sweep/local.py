"""The local scheduler: each point in its own process (``point``), on its own GPU set, with a timeout; resumable
(points that finished are kept), failure-isolated (a failing point is recorded and the sweep goes on).

GPUs: each point sees its own GPUs through CUDA_VISIBLE_DEVICES. With ``--gpus-per-run K`` the visible GPUs
are cut into disjoint sets of K and that many points run at once; without it each point sees every GPU and
points run one after another. Without GPUs points always run one after another (simulated replicas already
share all the host's cores).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ... import fileio, gpus, logs, rundir
from ...errors import SweepError
from . import point as point_process
from .folder import (FINISHED, LOG_TXT, OUTCOME_JSON, POINT_JSON, SLURM_JOBS, collect_runs, counts_of,
                     new_failures, open_dir, plan, point_dir, point_status, recorded_values)
from .html import render_report
from .results_csv import write_results
from .spec import OUT_PARAM, Point, Spec
from .spec import load as load_spec

log = logging.getLogger("tftoolkit")

POLL_S = 0.2


# --- GPUs --------------------------------------------------------------------------------------------------
def visible_gpus() -> list[str]:
    """GPU ids this process may hand out: its CUDA_VISIBLE_DEVICES entries when set, else every GPU NVML sees."""
    return gpus.ids()


def gpu_slots(gpus: list[str], per_run: int | None) -> list[list[str] | None]:
    """Disjoint GPU sets, one per concurrent point; ``[None]`` (one slot, environment untouched) without GPUs."""
    if per_run is not None and per_run < 1:
        raise SweepError(f"--gpus-per-run must be >= 1, got {per_run}")
    if not gpus:
        return [None]
    if per_run is None:
        return [list(gpus)]
    if per_run > len(gpus):
        raise SweepError(f"--gpus-per-run {per_run} but only {len(gpus)} GPU(s) are visible ({','.join(gpus)}); "
                         f"use --gpus-per-run {len(gpus)} or fewer")
    n = len(gpus) // per_run
    return [list(gpus[i * per_run:(i + 1) * per_run]) for i in range(n)]


# --- running points -------------------------------------------------------------------------------------------
@dataclass
class Job:
    point: Point
    proc: subprocess.Popen
    started: float
    deadline: float | None
    gpus: list[str] | None
    log: object
    timed_out: bool = False
    extra: dict | None = None


def start_point(spec, out: Path, point: Point, gpus, timeout: float | None, extra: dict | None = None) -> Job:
    """Start one point in its own process (``spec`` needs ``notebook`` and ``takes_out_dir``); ``extra`` goes
    into its record (the Slurm task's job and index)."""
    pdir = point_dir(out, point)
    if pdir.exists():
        shutil.rmtree(pdir)  # an unfinished or re-run point starts clean
    pdir.mkdir(parents=True)
    now = time.time()
    fileio.write_json(pdir / POINT_JSON, {"id": point.id, "params": point.params, "status": "running",
                                          "started": now, "gpus": gpus, **(extra or {})})
    if spec.takes_out_dir:
        params, cwd = {**point.inject, OUT_PARAM: str(pdir.resolve())}, None
    else:
        # A notebook with no out_dir writes where it runs: in its point's folder.
        params, cwd = dict(point.inject), pdir.resolve()
    log_file = fileio.open_for_writing(pdir / LOG_TXT)  # a planted link is not followed
    proc = point_process.spawn(spec.notebook, pdir / spec.notebook.name, params, pdir, gpus, log_file, cwd=cwd)
    return Job(point, proc, now, now + timeout if timeout else None, gpus, log_file, extra=extra or {})


def finish_point(out: Path, job: Job, timeout: float | None) -> dict:
    """Read how the point's process ended and write its final record (point.json)."""
    job.log.close()
    pdir = point_dir(out, job.point)
    outcome = None
    try:
        outcome = fileio.read_json(pdir / OUTCOME_JSON)
        (pdir / OUTCOME_JSON).unlink()
    except (OSError, ValueError):
        pass
    if job.timed_out:
        status, error = "timeout", f"ran past --timeout {timeout:g} s and was stopped"
    elif outcome is None:
        status, error = "failed", f"the point's process exited with code {job.proc.returncode} without an outcome; see {LOG_TXT}"
    elif outcome.get("status") == "interrupted":
        status, error = "failed", outcome.get("error")
    else:
        status, error = outcome.get("status", "failed"), outcome.get("error")
    runs = collect_runs(pdir)
    if status == "ok" and runs["run_status"] != "ok":
        status, error = runs["run_status"], runs["run_error"]
    recorded = recorded_values(pdir)
    runs["figures"].update(recorded)
    record = {"id": job.point.id, "params": job.point.params, "status": status, "error": error,
              "recorded": sorted(recorded),  # which columns of results.csv the notebook itself wrote (the report's)
              "started": job.started, "finished": time.time(), "wall_s": round(time.time() - job.started, 2),
              "gpus": job.gpus, "runs": runs["runs"], "run_dir": runs["run_dir"], "figures": runs["figures"],
              **(job.extra or {})}
    fileio.write_json(pdir / POINT_JSON, record)
    return record


def dry_run(spec: Spec, out: Path, rerun_failed: bool = False, force: bool = False) -> list[dict]:
    """What a run would do, point by point; writes nothing."""
    resuming = open_dir(spec, out, force, create=False) if out.exists() else False
    if resuming:
        todo, status = plan(spec, out, rerun_failed)
    else:
        todo, status = list(spec.points), {p.id: "pending" for p in spec.points}
    ids = {p.id for p in todo}
    return [{"id": p.id, "status": status[p.id], "action": "run" if p.id in ids else "skip", "params": p.params}
            for p in spec.points]


def run(spec, out, *, timeout: float | None = None, rerun_failed: bool = False, force: bool = False,
        gpus_per_run: int | None = None, report: bool = True, quiet: bool = False, gpus: list[str] | None = None) -> dict:
    """Run every point that is not finished (see the module docstring); returns a summary dict.

    ``spec``: a Spec, a YAML path or a dict. ``gpus``: GPU ids to hand out (default: ``visible_gpus()``).
    """
    logs.ensure_logging(quiet)
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    if timeout is not None and not timeout > 0:
        raise SweepError(f"--timeout must be > 0 seconds, got {timeout}")
    out = rundir.path(out, "sweep folder")  # "" would be the working folder
    devices = visible_gpus() if gpus is None else [str(g) for g in gpus]
    slots = gpu_slots(devices, gpus_per_run)
    # One sweep process per folder: a second one on the same folder stops here, naming the first.
    with rundir.lock(out, "sweep folder"):
        return _run_locked(spec, out, slots, devices, timeout=timeout, rerun_failed=rerun_failed, force=force,
                           gpus_per_run=gpus_per_run, report=report, quiet=quiet)


def _run_locked(spec, out, slots, devices, *, timeout, rerun_failed, force, gpus_per_run, report, quiet) -> dict:
    if (out / SLURM_JOBS).exists() and not force:
        # Points queued in Slurm would run twice: here and in their array task.
        raise SweepError(f"{out} was submitted to Slurm ({SLURM_JOBS}); continue it with --backend slurm, which "
                         "collects what the job arrays ran and submits only what is left")
    resuming = open_dir(spec, out, force)
    todo, status = plan(spec, out, rerun_failed)
    write_results(spec, out)
    kept = {s: sum(1 for p in spec.points if status[p.id] == s and p not in todo) for s in FINISHED}
    log.info("sweep %s: %d points, %d to run%s; %s", spec.notebook.name, len(spec.points), len(todo),
             f" ({', '.join(f'{n} {s}' for s, n in kept.items() if n)} kept)" if resuming else "",
             "GPU sets " + " | ".join(",".join(s) for s in slots) if slots[0] is not None
             else "no GPUs: points run one after another"
             + (f" (--gpus-per-run {gpus_per_run} ignored)" if gpus_per_run and not devices else ""))
    failed_kept = kept["failed"] + kept["timeout"] + kept["cancelled"]
    if failed_kept and not rerun_failed:
        log.info("%d failed/timed-out point(s) kept as they are; pass --rerun-failed to run them again", failed_kept)

    counts = _execute(spec, out, todo, slots, timeout, quiet)
    results = write_results(spec, out)
    final = {p.id: point_status(out, p) for p in spec.points}
    summary = {"out": str(out), "points": len(spec.points), "ran": len(todo),
               "counts": counts_of(final),
               "results": str(results), "report": None, "report_error": None, "ran_counts": counts,
               "new_failures": new_failures(spec, out)}
    if report and spec.report is not None:
        summary["report"], summary["report_error"] = render_report(spec.report, [out], out, timeout=timeout)
    return summary


def _execute(spec: Spec, out: Path, todo: list[Point], slots, timeout, quiet) -> dict:
    queue = deque(todo)
    free = list(range(len(slots)))
    running: dict[int, Job] = {}
    counts = {s: 0 for s in FINISHED}
    bar = logs.progress_bar(len(todo), quiet=quiet or not todo, unit="point")
    done = 0
    try:
        while queue or running:
            while queue and free:
                slot = free.pop(0)
                point = queue.popleft()
                running[slot] = start_point(spec, out, point, slots[slot], timeout)
                write_results(spec, out)
            time.sleep(POLL_S)
            for slot, job in list(running.items()):
                if job.proc.poll() is None:
                    if job.deadline is not None and time.time() > job.deadline:
                        job.timed_out = True
                        point_process.stop(job.proc)
                    else:
                        continue
                rec = finish_point(out, job, timeout)
                del running[slot]
                free.append(slot)
                done += 1
                counts[rec["status"]] = counts.get(rec["status"], 0) + 1
                write_results(spec, out)
                line = (f"[{done}/{len(todo)}] {rec['id']}: {rec['status']} in {rec['wall_s']:.0f} s"
                        + (f" ({rec['error']})" if rec.get("error") else ""))
                bar.update(1)
                bar.set_postfix(ok=counts["ok"], diverged=counts["diverged"],
                                failed=counts["failed"] + counts["timeout"], refresh=True)
                if bar.disable:
                    log.info("%s", line)
                else:
                    bar.write(line)
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): stop the points in flight; they stay unfinished and a rerun redoes them.
        for job in running.values():
            point_process.stop(job.proc)
            job.log.close()
        write_results(spec, out)
        raise
    finally:
        bar.close()
    return counts
