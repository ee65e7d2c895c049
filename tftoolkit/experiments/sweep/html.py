"""The report of a sweep: the report notebook executed on sweep folders (in its own process, as a point is), and
rendered as report.html with its results only (no code, no stderr), figures embedded.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

from ... import fileio
from . import point as point_process
from .folder import LOG_TXT, OUTCOME_JSON
from .spec import OUT_PARAM

log = logging.getLogger("tftoolkit")

NOTEBOOK_ONLY = "notebook-only"  # cells tagged so (notebooks/make_notebooks.py) stay out of HTML reports


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
    with fileio.open_for_writing(work / LOG_TXT) as log_file:
        proc = point_process.spawn(notebook, executed, params, work, None, log_file)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            point_process.stop(proc)
        except BaseException:
            point_process.stop(proc)
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
