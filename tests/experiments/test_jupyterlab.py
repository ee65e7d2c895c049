"""JupyterLab, really: a real `jupyter lab` server on a free localhost port with a token, driven in headless
Chromium. It opens notebook 01 (parameters set to smoke by papermill's --prepare-only, as a user would edit the
first cell), runs every cell through the UI's own command, and checks that the figures appear on the page, that
no cell failed, and that the saved notebook holds them. The server and the browser are started here and
stopped by pid; without chromium or jupyterlab the test skips and says why (.ci/run installs chromium).
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import papermill
import pytest

import browser
from helpers import ROOT

NOTEBOOK = "01_data_parallel_scaling.ipynb"
TOKEN = "tftoolkit-test-token"


def _jupyter() -> Path | None:
    exe = Path(sys.executable).parent / "jupyter-lab"
    return exe if exe.exists() else None


@pytest.fixture
def lab(tmp_path):
    """(base URL, notebook folder) of a JupyterLab server of this environment, isolated in tmp_path."""
    if browser.find() is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    if _jupyter() is None:
        pytest.skip("jupyterlab is not installed (pip install -e '.[lab]')")
    work = tmp_path / "lab"
    work.mkdir()
    # The notebook as a user would have it after setting the parameters cell to smoke: papermill --prepare-only
    # injects the values without running anything.
    papermill.execute_notebook(str(ROOT / "notebooks" / NOTEBOOK), str(work / NOTEBOOK), prepare_only=True,
                               parameters={"smoke": True, "replicas": [1, 2], "out_dir": "out"}, progress_bar=False)
    port = browser._free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws"),
           "PYTHONPATH": str(ROOT)}
    cmd = [str(_jupyter()), "--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={TOKEN}",
           f"--ServerApp.root_dir={work}", "--ServerApp.port_retries=0", "--LabApp.expose_app_in_browser=True",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly"] + (["--allow-root"] if os.geteuid() == 0 else [])  # CI runs as root
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"jupyter lab did not start:\n{(tmp_path / 'lab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield base, work
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


# The notebook's panel, found by its path (not as "the current widget", which follows focus).
PANEL = f"Array.from(jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === '{NOTEBOOK}')"
KERNEL = f"{PANEL}.sessionContext.session.kernel"
CODE_CELLS = f"{PANEL}.content.widgets.filter(c => c.model.type === 'code')"


@pytest.mark.slow
def test_notebook_01_runs_in_jupyterlab_and_shows_its_figures(lab, tmp_path):
    base, work = lab
    with browser.Chromium(tmp_path, timeout=120) as page:
        page.open(f"{base}/lab/tree/{NOTEBOOK}?token={TOKEN}")
        # The app, the notebook panel and its kernel (the environment's python3) ready.
        page.wait_for(f"window.jupyterapp && {PANEL} && {PANEL}.sessionContext && "
                      f"{PANEL}.sessionContext.session && {KERNEL} && {KERNEL}.status === 'idle'", timeout=120)
        # Run > Run All Cells, as a user would: the command acts on the notebook that has the focus.
        page.evaluate(f"jupyterapp.shell.activateById({PANEL}.id); true")
        page.wait_for(f"jupyterapp.shell.currentWidget === {PANEL}")
        page.evaluate("jupyterapp.commands.execute('notebook:run-all-cells'); true", await_promise=False)
        page.wait_for(f"{CODE_CELLS}.every(c => c.model.executionCount !== null) && {KERNEL}.status === 'idle'",
                      timeout=300)
        errors = page.evaluate(f"""{CODE_CELLS}.flatMap(c => {{
            const out = []; for (let i = 0; i < c.model.outputs.length; i++) {{
                const o = c.model.outputs.get(i).toJSON(); if (o.output_type === 'error') out.push(o.ename + ': ' + o.evalue); }}
            return out; }})""")
        assert errors == []
        # The figures are on the page, decoded by the browser (not just present in the notebook's JSON).
        page.wait_for("document.querySelectorAll('.jp-OutputArea-output img').length >= 4")
        images = page.evaluate("Array.from(document.querySelectorAll('.jp-OutputArea-output img'))"
                               ".map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
        assert len(images) >= 4 and all(ok and w > 100 and h > 100 for ok, w, h in images), images
        page.evaluate("jupyterapp.commands.execute('docmanager:save').then(() => true)")
    saved = nbformat.read(str(work / NOTEBOOK), as_version=4)
    pngs = sum("image/png" in o.get("data", {}) for c in saved.cells if c.cell_type == "code" for o in c.outputs)
    assert pngs >= 4
    assert (work / "out" / "scaling.csv").exists() and (work / "out" / "figures" / "throughput.png").exists()
