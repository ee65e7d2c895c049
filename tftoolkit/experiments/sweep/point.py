"""One sweep point's process: how the sweep starts and stops it (``spawn``, ``stop``), and what it runs (``main``:
the notebook with papermill, recording how it ended).

    python -m tftoolkit.experiments.sweep.point NOTEBOOK OUTPUT_NOTEBOOK PARAMETERS_JSON OUTCOME_JSON PARENT_PID

``spawn`` starts this in a new process group (so a timeout can stop it and everything it started), and the sweep
reads OUTCOME_JSON afterwards: ``{"status": "ok" | "failed" | "interrupted", "error": ..., "wall_s": ...}``.
A notebook that raises is ``failed`` with the exception's first line; a kernel that dies (killed by the OS,
typically out of memory) is ``failed`` with that said. Diverged runs are not failures here: the sweep reads
their status from the run summaries the notebook wrote.

On Linux the process asks the kernel to SIGKILL it when the sweep process dies (PR_SET_PDEATHSIG), and the
Jupyter kernel it starts exits within a second when its parent goes: a sweep killed with SIGKILL leaves no
orphan still writing into the point's folder.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ... import fileio, gpus
from ...cluster import procs
from ..startup import skip_slow_format_checkers
from .folder import OUTCOME_JSON, PARAMS_JSON

STOP_GRACE_S = 10.0   # after SIGTERM, how long a point gets to shut its kernel down before SIGKILL


# --- the sweep's side: start and stop a point's process ------------------------------------------------------
def child_env(devices: list[str] | None) -> dict:
    """The point's environment: this one, unbuffered, with only ``devices`` visible (untouched for None)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if devices is not None:
        env.update(gpus.child_env(devices))
    return env


def spawn(notebook: Path, output: Path, params: dict, pdir: Path, gpus, log_file,
          cwd: Path | None = None) -> subprocess.Popen:
    """Start ``notebook`` with ``params`` in its own process (``main``), writing into ``pdir``."""
    params_path = pdir / PARAMS_JSON
    fileio.write_json(params_path, params)
    cmd = [sys.executable, "-m", "tftoolkit.experiments.sweep.point", str(Path(notebook).resolve()),
           str(Path(output).resolve()), str(params_path.resolve()), str((pdir / OUTCOME_JSON).resolve()), str(os.getpid())]
    # A new session: a timeout stops the point's whole process group, never the sweep itself.
    return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=child_env(gpus), start_new_session=True, cwd=cwd)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the point's process group (it shuts its kernel down), SIGKILL what is left after a grace period."""
    procs.stop_group(proc, STOP_GRACE_S)


# --- the point's process ---------------------------------------------------------------------------------------


def _first_line(text) -> str:
    lines = [ln for ln in str(text or "").strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run(notebook: str, output: str, parameters: dict) -> dict:
    """Execute ``notebook`` into ``output`` with ``parameters``; never raises, returns the outcome."""
    # Deferred: papermill imports nbformat's validator, which must come after skip_slow_format_checkers() (run
    # first in this process, see startup.py); the sweep's side (spawn, stop) never needs papermill at all.
    import papermill
    from papermill.exceptions import PapermillExecutionError

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    t0 = time.time()
    outcome = {"status": "ok", "error": None}
    try:
        # log_output streams each cell's output to this process's stderr (the point's log.txt), so a point
        # killed half-way still shows how far it got.
        papermill.execute_notebook(notebook, output, parameters=parameters, progress_bar=False, log_output=True)
    except PapermillExecutionError as e:
        where = f" (cell {e.exec_count})" if getattr(e, "exec_count", None) else ""
        outcome = {"status": "failed", "error": f"{e.ename}: {_first_line(e.evalue)}{where}"}
    except KeyboardInterrupt:
        outcome = {"status": "interrupted", "error": "stopped by the sweep (timeout or interrupt)"}
    except Exception as e:  # noqa: BLE001 - every ending is recorded, none is raised
        name = type(e).__name__
        if name == "DeadKernelError":
            outcome = {"status": "failed", "error": "DeadKernelError: the notebook's kernel died (killed by the OS, "
                                                    "e.g. out of memory); see log.txt"}
        else:
            outcome = {"status": "failed", "error": f"{name}: {_first_line(e)}"}
    outcome["wall_s"] = round(time.time() - t0, 3)
    return outcome


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    notebook, output, params_path, outcome_path, parent_pid = argv
    if not procs.die_with_parent(int(parent_pid)):
        os._exit(3)  # the sweep died before the death signal was armed
    signal.signal(signal.SIGTERM, _interrupt)
    with open(params_path) as f:
        parameters = json.load(f)
    outcome = run(notebook, output, parameters)
    fileio.write_json(outcome_path, outcome)
    return 0


if __name__ == "__main__":
    skip_slow_format_checkers()
    sys.exit(main())
