"""Execute every notebook in smoke mode for the site: ``python docs/hooks/execute_notebooks.py OUT``.

Each runs as its own first cell tells a user to smoke-run it (``papermill notebooks/NAME.ipynb out.ipynb -p smoke
True ...``), from the repository root, with ``out_dir`` set to OUT/runs/NAME; the executed copy goes to
OUT/notebooks/NAME.ipynb, where docs/hooks/reference.py picks it up (TFTOOLKIT_DOCS_EXECUTED=OUT). A copy newer
than its notebook is kept, so a second ``make docs`` only builds the site. The copies are shown as papermill wrote
them, exactly what a user gets: nothing is stripped (tests/docs/test_site.py checks they hold none of TensorFlow's
start-up lines, which tftoolkit.engine.devices.import_tensorflow keeps out at the cause).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


def smoke_args(notebook: Path) -> list[str]:
    first = nbformat.read(str(notebook), as_version=4).cells[0].source
    m = re.search(rf"`papermill notebooks/{notebook.stem}\.ipynb [\w.-]+\.ipynb (-p smoke True[^`]*)`", first)
    if not m:
        raise SystemExit(f"{notebook}: its first cell gives no smoke command (papermill ... -p smoke True)")
    return shlex.split(m.group(1))


def execute(notebook: Path, out: Path, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run ``notebook`` in smoke mode into OUT/notebooks/, its results into OUT/runs/<name> (``timeout``: seconds,
    then subprocess.TimeoutExpired; none for make docs)."""
    executed = out / "notebooks" / notebook.name
    executed.parent.mkdir(parents=True, exist_ok=True)
    runs = out / "runs" / notebook.stem
    runs = runs.relative_to(ROOT) if runs.is_relative_to(ROOT) else runs  # the page shows it: keep it short
    cmd = [str(Path(sys.executable).with_name("papermill")), "--no-progress-bar", str(notebook.relative_to(ROOT)),
           str(executed), *smoke_args(notebook), "-p", "out_dir", str(runs)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=timeout)
    if done.returncode:
        executed.unlink(missing_ok=True)
    return done


def main(out: str) -> int:
    out_dir = (ROOT / out).resolve()
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        executed = out_dir / "notebooks" / nb.name
        if executed.exists() and executed.stat().st_mtime > nb.stat().st_mtime:
            continue
        print(f"executing {nb.relative_to(ROOT)} in smoke mode", flush=True)
        done = execute(nb, out_dir)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/docs"))
