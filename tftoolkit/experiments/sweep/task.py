"""One sweep point as one Slurm array task (the Slurm backend's job script runs this).

    python -m tftoolkit.experiments.sweep.task SWEEP_DIR ARRAY_JSON TASK_INDEX

ARRAY_JSON (written by ``slurm`` before sbatch) lists the array's points in task order, with the notebook
and the sweep's --timeout. The task runs its point exactly as the local backend does: ``local.start_point`` (a
fresh point folder, the notebook in its own process group through ``point``), the same timeout, then
``local.finish_point`` writes point.json. GPUs are Slurm's to bind (CUDA_VISIBLE_DEVICES from --gres), so the
environment is passed on untouched.

Slurm stops a task with SIGTERM (scancel, or its time limit) and SIGKILL KillWait seconds later: the task
writes a ``cancelled`` record at once, then stops the notebook; the submitting side later asks Slurm which of the
two it was (``slurm.reconcile``: TIMEOUT becomes ``timeout``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ... import fileio
from ...logs import ensure_logging
from ..startup import skip_slow_format_checkers
from . import local
from . import point as point_process
from .folder import POINT_JSON, point_dir
from .spec import Point

log = logging.getLogger("tftoolkit")


@dataclass
class _TaskSpec:
    """What ``local.start_point`` needs of a spec."""

    notebook: Path
    takes_out_dir: bool


def run(out: Path, array_json: Path, index: int) -> dict:
    arr = fileio.read_json(array_json)
    entry = arr["points"][index]
    point = Point(index=entry["index"], id=entry["id"], params=entry["params"], inject=entry["inject"])
    spec = _TaskSpec(Path(arr["notebook"]), bool(arr["takes_out_dir"]))
    timeout = arr.get("timeout")
    job_id = os.environ.get("SLURM_ARRAY_JOB_ID") or arr.get("job_id")
    extra = {"slurm": {"job_id": job_id, "task": index, "node": os.uname().nodename,
                       "slurm_job_id": os.environ.get("SLURM_JOB_ID")}}
    stopped = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    job = local.start_point(spec, out, point, None, timeout, extra=extra)
    while job.proc.poll() is None and not stopped:
        if job.deadline is not None and time.time() > job.deadline:
            job.timed_out = True
            point_process.stop(job.proc)
            break
        time.sleep(local.POLL_S)
    if stopped:
        # Written first: Slurm's SIGKILL may follow within seconds.
        record = {"id": point.id, "params": point.params, "status": "cancelled",
                  "error": "stopped by Slurm (SIGTERM: scancel, or the task's time limit)", "started": job.started,
                  "finished": time.time(), "wall_s": round(time.time() - job.started, 2), **extra}
        fileio.write_json(point_dir(out, point) / POINT_JSON, record)
        point_process.stop(job.proc)
        return record
    return local.finish_point(out, job, timeout)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out, array_json, index = argv
    ensure_logging()  # to stderr: the task's Slurm log
    rec = run(Path(out), Path(array_json), int(index))
    log.info("sweep task %s: point %s: %s%s", index, rec["id"], rec["status"],
             f" ({rec['error']})" if rec.get("error") else "")
    return 0


if __name__ == "__main__":
    skip_slow_format_checkers()
    sys.exit(main())
