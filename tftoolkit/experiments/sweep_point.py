"""One sweep point, in its own process: run the notebook with papermill and record how it ended.

    python -m tftoolkit.experiments.sweep_point NOTEBOOK OUTPUT_NOTEBOOK PARAMETERS_JSON OUTCOME_JSON PARENT_PID

``tftoolkit.experiments.sweep`` starts this in a new process group (so a timeout can stop it and everything it started)
and reads OUTCOME_JSON afterwards: ``{"status": "ok" | "failed" | "interrupted", "error": ..., "wall_s": ...}``.
A notebook that raises is ``failed`` with the exception's first line; a kernel that dies (killed by the OS,
typically out of memory) is ``failed`` with that said. Diverged runs are not failures here: the sweep reads
their status from the run summaries the notebook wrote.

On Linux the process asks the kernel to SIGKILL it when the sweep process dies (PR_SET_PDEATHSIG), and the
Jupyter kernel it starts exits within a second when its parent goes: a sweep killed with SIGKILL leaves no
orphan still writing into the point's folder.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from .. import fileio
from ..cluster import procs


def _first_line(text) -> str:
    lines = [ln for ln in str(text or "").strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run(notebook: str, output: str, parameters: dict) -> dict:
    """Execute ``notebook`` into ``output`` with ``parameters``; never raises, returns the outcome."""
    import logging

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
    from .startup import skip_slow_format_checkers

    skip_slow_format_checkers()
    sys.exit(main())
