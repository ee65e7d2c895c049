"""Run a notebook over a parameter grid with papermill: one process per point, resumable, failure-isolated.

    tftoolkit sweep sweeps/scaling.yaml --out runs/scaling [--timeout S] [--gpus-per-run K] [--rerun-failed]

SWEEP_DIR/
  sweep.json              the spec and its points (a different sweep is refused here unless --force)
  runs/<id>/              one folder per point: the executed notebook, parameters.json, point.json (status,
                          error, timings, figures), log.txt, and whatever the notebook wrote (out_dir = here)
  results.csv             one row per point: id, parameters, status, error, wall_s, the run summary's figures
  report.ipynb, report.html, report/   the report notebook run on this sweep

Statuses: ``ok``, ``diverged`` (the run stopped itself: a result, not a crash), ``failed`` (the notebook raised
or its kernel died, e.g. out of memory), ``timeout`` (ran past --timeout, or Slurm's time limit), ``cancelled``
(scancel, Slurm backend), and, for points not finished, ``pending`` / ``queued`` (submitted to Slurm) /
``running``. A failing point is recorded and the sweep goes on. A report on a folder where no sweep works (its
lock is free) reads a point that a killed sweep left ``running`` as ``interrupted``: the rerun runs it again.

Backends: this module runs points on this machine; ``sweep_slurm`` submits them as a Slurm job array whose
tasks (``sweep_task``) run each point through the same ``start_point`` / ``finish_point`` as here.

Resume: running the same command again skips points that finished (ok, diverged, failed, timeout) and runs
those that never finished; ``--rerun-failed`` also runs the failed and timed-out ones again. Each point's
point.json is the record, written atomically when the point ends; results.csv is rebuilt from those records
(atomically) after every point. So a sweep killed at any moment, even with SIGKILL, loses at most the points
in flight, and results.csv is always whole: the old table or the new one.

GPUs: each point sees its own GPUs through CUDA_VISIBLE_DEVICES. With ``--gpus-per-run K`` the visible GPUs
are cut into disjoint sets of K and that many points run at once; without it each point sees every GPU and
points run one after another. Without GPUs points always run one after another (simulated replicas already
share all the host's cores).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from .. import fileio, gpus, logs, rundir
from .. import summary as summary_schema
from ..cluster import procs
from ..errors import SweepError
from .sweep_spec import OUT_PARAM, Point, Spec
from .sweep_spec import load as load_spec

log = logging.getLogger("tftoolkit")

SWEEP_JSON = "sweep.json"
RESULTS_CSV = "results.csv"
RUNS = "runs"
POINT_JSON = "point.json"
PARAMS_JSON = "parameters.json"
OUTCOME_JSON = ".outcome.json"
LOG_TXT = "log.txt"
SLURM_JOBS = "slurm/jobs.json"  # the Slurm backend's submissions (sweep_slurm)

FINISHED = ("ok", "diverged", "failed", "timeout", "cancelled")
RERUNNABLE = ("failed", "timeout", "cancelled")
UNFINISHED = ("pending", "queued", "running")
STOP_GRACE_S = 10.0   # after SIGTERM, how long a point gets to shut its kernel down before SIGKILL
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
    """Check ``out`` can hold this sweep (create it); returns True when it already holds it (resume)."""
    sweep_json = out / SWEEP_JSON
    ident = spec.identity()
    if sweep_json.exists():
        try:
            old = fileio.read_json(sweep_json).get("identity", {})
        except (OSError, ValueError):
            old = {}
        if old == json.loads(json.dumps(ident)):
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


RESULTS_JSON = "results.json"
NOTEBOOK_ONLY = "notebook-only"  # cells tagged so (notebooks/make_notebooks.py) stay out of HTML reports


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


# --- results.csv -----------------------------------------------------------------------------------------
def _cell(v):
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return v


def results_frame(spec: Spec, out: Path):
    """One row per point in spec order: id, parameters, status, error, wall_s, runs, run_dir, summary figures."""
    import pandas as pd

    rows = []
    for p in spec.points:
        rec = read_record(out, p) or {}
        row = {"id": p.id, **{k: _cell(v) for k, v in p.params.items()}}
        row.update({"status": rec.get("status", "pending") if rec else "pending", "error": rec.get("error"),
                    "wall_s": rec.get("wall_s"), "runs": rec.get("runs"), "run_dir": rec.get("run_dir")})
        for k, v in (rec.get("figures") or {}).items():
            # A summary field named like a parameter (replicas, say) keeps the parameter's column.
            row[k if k not in row else f"run_{k}"] = _cell(v)
        rows.append(row)
    # Object columns: a column with a blank (a point not finished, a figure one run lacks) would otherwise turn
    # to floats, and 48 steps would read 48.0.
    return pd.DataFrame(rows, dtype=object)


def write_results(spec: Spec, out: Path) -> Path:
    path = out / RESULTS_CSV
    fileio.write_csv(path, results_frame(spec, out))
    return path


# --- running points -------------------------------------------------------------------------------------------
@dataclass
class _Job:
    point: Point
    proc: subprocess.Popen
    started: float
    deadline: float | None
    gpus: list[str] | None
    log: object
    timed_out: bool = False
    extra: dict | None = None


def _child_env(devices: list[str] | None) -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if devices is not None:
        env.update(gpus.child_env(devices))
    return env


def _spawn(notebook: Path, output: Path, params: dict, pdir: Path, gpus, log_file, cwd: Path | None = None) -> subprocess.Popen:
    params_path = pdir / PARAMS_JSON
    fileio.write_json(params_path, params)
    cmd = [sys.executable, "-m", "tftoolkit.experiments.sweep_point", str(Path(notebook).resolve()),
           str(Path(output).resolve()), str(params_path.resolve()), str((pdir / OUTCOME_JSON).resolve()), str(os.getpid())]
    # A new session: a timeout stops the point's whole process group, never the sweep itself.
    return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=_child_env(gpus), start_new_session=True, cwd=cwd)


def start_point(spec, out: Path, point: Point, gpus, timeout: float | None, extra: dict | None = None) -> _Job:
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
    log_file = open(pdir / LOG_TXT, "w")
    proc = _spawn(spec.notebook, pdir / spec.notebook.name, params, pdir, gpus, log_file, cwd=cwd)
    return _Job(point, proc, now, now + timeout if timeout else None, gpus, log_file, extra=extra or {})


def stop_point(proc: subprocess.Popen) -> None:
    """SIGTERM the point's process group (it shuts its kernel down), SIGKILL what is left after a grace period."""
    procs.stop_group(proc, STOP_GRACE_S)


def finish_point(out: Path, job: _Job, timeout: float | None) -> dict:
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


def plan(spec: Spec, out: Path, rerun_failed: bool) -> tuple[list[Point], dict[str, str]]:
    """(points to run, current status of every point)."""
    status = {p.id: point_status(out, p) for p in spec.points}
    todo = [p for p in spec.points
            if status[p.id] not in FINISHED or (rerun_failed and status[p.id] in RERUNNABLE)]
    return todo, status


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
    from ..logs import ensure_logging

    ensure_logging(quiet)
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


BAD_STATUSES = ("failed", "timeout", "cancelled")
REPORTED_JSON = ".reported.json"  # when a sweep command last told its caller about the folder's failures


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


def _execute(spec: Spec, out: Path, todo: list[Point], slots, timeout, quiet) -> dict:
    queue = deque(todo)
    free = list(range(len(slots)))
    running: dict[int, _Job] = {}
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
                        stop_point(job.proc)
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
            stop_point(job.proc)
            job.log.close()
        write_results(spec, out)
        raise
    finally:
        bar.close()
    return counts


# --- the report ----------------------------------------------------------------------------------------------
def render_report(notebook: Path, sweep_dirs: list, out: Path, timeout: float | None = None,
                  name: str = "report") -> tuple[str | None, str | None]:
    """Execute the report notebook on ``sweep_dirs`` into out/report.ipynb and render out/report.html.

    Returns (html path, error or None). A failing report still gets its HTML (showing the error); it never
    takes the sweep's results with it.
    """
    out = Path(out)
    work = out / f".{name}"
    work.mkdir(parents=True, exist_ok=True)
    params = {"sweep_dirs": [str(Path(d).resolve()) for d in sweep_dirs], OUT_PARAM: str((out / name).resolve())}
    executed = out / f"{name}.ipynb"
    with open(work / LOG_TXT, "w") as log_file:
        proc = _spawn(notebook, executed, params, work, None, log_file)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_point(proc)
        except BaseException:
            stop_point(proc)
            raise
    try:
        outcome = fileio.read_json(work / OUTCOME_JSON)
    except (OSError, ValueError):
        outcome = {"status": "failed", "error": f"the report did not finish; see {work / LOG_TXT}"}
    error = None if outcome.get("status") == "ok" else outcome.get("error") or "report failed"
    if not executed.exists():
        return None, error
    html = out / f"{name}.html"
    try:
        write_html(executed, html)
    except Exception as e:  # noqa: BLE001 - the executed notebook is still there
        return None, f"HTML export failed: {type(e).__name__}: {e}"
    if error:
        log.warning("report notebook failed: %s (the partial report is in %s)", error, html)
    return str(html), error


def write_html(notebook: Path, html: Path) -> None:
    """Render an executed notebook as a report page: its results only (no code, no stderr), figures embedded.

    The code and the log stay in the executed notebook next to the page, for whoever wants them.
    """
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(notebook), as_version=4)
    # A notebook's introduction (how to run it) is for the notebook, not for the page of its results.
    nb.cells = [c for c in nb.cells if NOTEBOOK_ONLY not in c.get("metadata", {}).get("tags", [])]
    for cell in nb.cells:
        if cell.cell_type == "code":
            # The library's log lines reach a notebook as stderr; on a report page they read as errors.
            cell.outputs = [o for o in cell.outputs if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": f"tftoolkit: {notebook.stem}"}})
    fileio.atomic_write(html, body)  # readable by others: a report is for sharing


__all__ = ["run", "dry_run", "plan", "gpu_slots", "visible_gpus", "results_frame", "collect_runs", "render_report",
           "write_html"]
