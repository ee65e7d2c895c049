"""Execute every notebook in smoke mode for the site: ``python docs/hooks/execute_notebooks.py OUT``.

Each runs as its own first cell tells a user to smoke-run it (``papermill notebooks/NAME.ipynb out.ipynb -p smoke
True ...``), from the repository root, with ``out_dir`` set to OUT/runs/NAME; the executed copy goes to
OUT/notebooks/NAME.ipynb, where docs/hooks/reference.py picks it up (TFTOOLKIT_DOCS_EXECUTED=OUT). A copy newer
than its notebook is kept, so a second ``make docs`` only builds the site.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


def smoke_args(notebook: Path) -> list[str]:
    first = nbformat.read(str(notebook), as_version=4).cells[0].source
    m = re.search(rf"`papermill notebooks/{notebook.stem}\.ipynb out\.ipynb (-p smoke True[^`]*)`", first)
    if not m:
        raise SystemExit(f"{notebook}: its first cell gives no smoke command (papermill ... -p smoke True)")
    return shlex.split(m.group(1))


def main(out: str) -> int:
    out_dir = (ROOT / out).resolve()
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    papermill = Path(sys.executable).with_name("papermill")
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        executed = out_dir / "notebooks" / nb.name
        if executed.exists() and executed.stat().st_mtime > nb.stat().st_mtime:
            continue
        print(f"executing {nb.relative_to(ROOT)} in smoke mode", flush=True)
        cmd = [str(papermill), "--no-progress-bar", str(nb.relative_to(ROOT)), str(executed), *smoke_args(nb),
               "-p", "out_dir", str(out_dir / "runs" / nb.stem)]
        if subprocess.run(cmd, cwd=ROOT).returncode:
            executed.unlink(missing_ok=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/docs"))
