"""The notebooks: committed clean and thin, generated from notebooks/make_notebooks.py, and each one runs
under papermill in smoke mode and writes what it promises (the slow tests).
"""

import ast
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import papermill
import pytest

from helpers import ROOT, executed_notebook

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NAMES = [p.stem for p in NOTEBOOKS]
# Modules whose functions train or touch TensorFlow: a notebook using them must set up devices first.
TF_MODULES = ("scale", "grid", "allreduce", "finders", "noise", "tftoolkit.train", "training")


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _python(source: str) -> str:
    """Cell source without IPython magics, so it parses as Python."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def test_there_are_the_notebooks():
    assert {"00_environment", "01_data_parallel_scaling", "02_batch_and_lr_scaling", "03_communication",
            "04_report", "05_batch_science", "06_your_fit"} <= set(NAMES)


@pytest.mark.slow
def test_notebooks_match_their_generator():
    done = subprocess.run([sys.executable, str(ROOT / "notebooks" / "make_notebooks.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_committed_notebook_is_clean_thin_and_parameterised(path):
    nb = nbformat.read(str(path), as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, f"{path.name} was committed with outputs"
    cells = _code_cells(nb)
    first = cells[0]
    assert "parameters" in first.metadata.get("tags", []), "the first code cell must be tagged 'parameters'"

    # Only typed, commented literal defaults, each visible to papermill (--help-notebook, sweeps).
    declared = papermill.inspect_notebook(str(path))
    tree = ast.parse(first.source)
    for stmt in tree.body:
        assert isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name), \
            f"{path.name}: parameters cell line {stmt.lineno} is not `name: type = literal  # comment`"
        name = stmt.target.id
        ast.literal_eval(stmt.value)  # a literal, not an expression
        assert name in declared, f"{path.name}: papermill cannot read {name!r} (an '=' in its comment?)"
        assert declared[name]["inferred_type_name"] == ast.unparse(stmt.annotation)
        assert declared[name]["help"], f"{path.name}: {name} has no comment saying what it is"
    assert declared["smoke"]["inferred_type_name"] == "bool" and declared["smoke"]["default"] == "False"
    assert declared["out_dir"]["inferred_type_name"] == "str"

    # Thin: no function or class definitions anywhere.
    for c in cells:
        for node in ast.walk(ast.parse(_python(c.source))):
            assert not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)), \
                f"{path.name}: define {getattr(node, 'name', 'lambda')} in tftoolkit/, not in the notebook"

    # Devices are set up in the first cell after the parameters, before anything touches TensorFlow.
    body = "\n".join(c.source for c in cells[1:])
    uses_tf = any(re.search(rf"\b{re.escape(m)}\b", body) for m in TF_MODULES)
    if uses_tf or "init_devices" in body:
        assert "init_devices" in cells[1].source, f"{path.name}: call tftoolkit.init_devices in the cell after the parameters"
        # ... and before TensorFlow is imported: an `import keras` above it started TensorFlow outside the toolkit's
        # hold on its start-up lines (notebook 06 showed "failed call to cuInit" and oneDNN's lines).
        lines = _python(cells[1].source).splitlines()
        first_init = next(i for i, line in enumerate(lines) if "init_devices(" in line)
        early = [line for line in lines[:first_init]
                 if re.match(r"\s*(import|from)\s+(keras|tensorflow)\b", line)]
        assert not early, f"{path.name}: {early} imports TensorFlow before tftoolkit.init_devices"


# --- the helpers the notebooks call (tftoolkit.experiments.notebook) ----------------------------------------------------
@pytest.mark.parametrize("value, item, expected", [
    ([1, 2], int, [1, 2]), ("[1, 2]", int, [1, 2]), ("1,2,4", int, [1, 2, 4]), (4, int, [4]),
    ("['linear', 'sqrt']", str, ["linear", "sqrt"]), ("linear,sqrt", str, ["linear", "sqrt"]),
    ("[0, 0.5]", float, [0.0, 0.5]), ((64, 128), int, [64, 128]),
])
def test_as_list_reads_what_papermill_and_sweeps_pass(value, item, expected):
    from tftoolkit.experiments.notebook import as_list

    assert as_list(value, item) == expected


@pytest.mark.parametrize("value", ["[1.5]", "[True]", "[]", "[1, 2", "one,two"])
def test_as_list_refuses_what_is_not_a_list_of_ints(value):
    from tftoolkit.errors import ConfigError
    from tftoolkit.experiments.notebook import as_list

    with pytest.raises(ConfigError, match="replicas"):
        as_list(value, int, "replicas")


def test_smoke_shrinks_configs_and_lists_and_nothing_otherwise():
    from tftoolkit.experiments import notebook as nb

    cfg = nb.training_config(False, dataset="shapes16k", steps=60, global_batch=0, train_images=0)
    assert cfg == {"dataset": "shapes16k", "steps": 60, "global_batch": None, "train_images": None}
    smoke = nb.training_config(True, dataset="shapes16k", steps=60)
    assert smoke["dataset"] == "synthetic" and smoke["steps"] < 10 and smoke["measure"] is False
    assert nb.smoke_values([1, 2, 4], True) == [1, 2] and nb.smoke_values([1, 2, 4], False) == [1, 2, 4]


# --- executing every notebook in smoke mode (slow) -------------------------------------------------------------
_EXECUTED: dict = {}


def hint_args(name: str) -> list[str]:
    """The papermill arguments the notebook's own first cell tells a user to smoke-run it with (README shows the
    same): ``-p smoke True`` and whatever that command adds."""
    nb = nbformat.read(str(ROOT / "notebooks" / f"{name}.ipynb"), as_version=4)
    m = re.search(rf"`papermill notebooks/{name}\.ipynb out\.ipynb (-p smoke True[^`]*)`", nb.cells[0].source)
    assert m, f"{name}: no smoke command in its first cell"
    return shlex.split(m.group(1))


def _execute(name: str, out_root: Path) -> tuple[Path, nbformat.NotebookNode]:
    """Run notebook ``name`` once per session exactly as its first cell (and the README) says: the papermill
    command line with its own smoke parameters, from the repository root, with ``out_dir`` in the session's folder
    (helpers.executed_notebook: tests/docs/test_site.py reads the same run of 00_environment)."""
    if name not in _EXECUTED:
        executed, out = executed_notebook(name, out_root.parent)  # out_root: mktemp's, in the basetemp
        _EXECUTED[name] = (out, nbformat.read(str(executed), as_version=4))
    return _EXECUTED[name]


@pytest.fixture(scope="session")
def out_root(tmp_path_factory):
    return tmp_path_factory.mktemp("notebooks")


def _figures(out: Path, *names):
    for n in names:
        for ext in ("png", "svg"):
            f = out / "figures" / f"{n}.{ext}"
            assert f.exists() and f.stat().st_size > 1000, f"missing figure {f}"


def _shows_images(nb) -> int:
    return sum(1 for c in _code_cells(nb) for o in c.get("outputs", []) if "image/png" in o.get("data", {}))


@pytest.mark.slow
def test_00_environment_smoke(out_root):
    out, nb = _execute("00_environment", out_root)
    env = json.loads((out / "env.json").read_text())
    assert "host" in env and "gpus" in env
    # Doctor first: its quick checks, each passing or skipped with the reason on these CPU replicas.
    checks = {c["name"]: c for c in json.loads((out / "doctor.json").read_text())["checks"]}
    assert set(checks) == {"build", "visibility", "allreduce_sum", "placement", "timing", "nvml", "nccl_transport"}
    assert all(c["status"] in ("pass", "skip") and (c["status"] == "pass" or c["detail"]) for c in checks.values()), \
        [c for c in checks.values() if c["status"] not in ("pass", "skip")]
    table = pd.read_csv(out / "allreduce.csv")
    assert (table["status"] == "ok").any() and (table.loc[table["status"] == "ok", "busbw_GBps"] > 0).all()
    _figures(out, "busbw", "allreduce_time")
    assert _shows_images(nb) == 2
    assert not _tensorflow_noise(nb)  # the all-reduce sweep's per-size functions warned of retracing


@pytest.mark.slow
def test_01_scaling_smoke_through_the_papermill_cli(out_root):
    # Exactly as a user would: the papermill CLI, a list parameter given as text (README's command).
    assert hint_args("01_data_parallel_scaling") == ["-p", "smoke", "True", "-p", "replicas", "[1, 2]"]
    out, nb = _execute("01_data_parallel_scaling", out_root)
    table = pd.read_csv(out / "scaling.csv")
    assert table["replicas"].tolist() == [1, 2] and (table["status"] == "ok").all()
    assert table["images_per_sec"].gt(0).all() and table.loc[0, "speedup"] == pytest.approx(1.0)
    _figures(out, "throughput", "efficiency", "images_per_replica", "monitor")
    assert (out / "runs.csv").exists()
    assert _shows_images(nb) >= 4  # figures render inline, so they reach the HTML report too


@pytest.mark.slow
def test_02_batch_and_lr_smoke(out_root):
    out, nb = _execute("02_batch_and_lr_scaling", out_root)
    table = pd.read_csv(out / "results.csv")
    # Its smoke command's two batches, smoke's first two rules, no warmup: four runs, each recorded with its status.
    assert sorted(zip(table["global_batch"], table["lr_rule"])) == [(32, "linear"), (32, "none"), (128, "linear"),
                                                                     (128, "none")]
    # Past the memory cap: the smoke command says a replica holds 32, so 128 on 2 replicas runs 2 micro-batches of 32
    # per optimizer step (the LR rules and the global batch unchanged), and 32 runs in one pass.
    assert dict(zip(table["global_batch"], zip(table["per_replica_batch"], table["accumulate"]))) == {
        32: (16, 1), 128: (32, 2)}
    # Every run measured the gradient noise scale (6 smoke steps can leave the |G|^2 estimate below zero, which
    # the summary reports as NaN rather than as a made-up number; the full runs give values).
    assert "noise_scale" in table.columns and (table["noise_scale_steps"] == 6).all()
    assert set(table["status"]) <= {"ok", "diverged"}
    _figures(out, "loss_curves", "val_accuracy", "final_accuracy")


@pytest.mark.slow
def test_03_communication_smoke(out_root):
    out, nb = _execute("03_communication", out_root)
    table = pd.read_csv(out / "allreduce.csv")
    assert table["payload"].astype(str).str.startswith("grads:small_cnn").any()  # the model's own gradients
    compute = pd.read_csv(out / "compute" / "scaling.csv")
    assert compute["compute_time_s"].gt(0).all()
    # Each all-reduce time is what it was measured as: a time (>= 0), within noise (either sign: not known), or a
    # failed measurement (NaN), as its status says.
    a, status = compute["allreduce_time_s"], compute["allreduce_time_status"]
    assert ((status.eq("measured") & a.ge(0)) | status.eq("within noise") | (status.eq("failed") & a.isna())).all()
    _figures(out, "allreduce_time", "busbw", "comm_vs_compute")
    assert not _tensorflow_noise(nb)


@pytest.mark.slow
def test_04_report_on_the_other_notebooks_outputs_as_a_sweep_renders_it(out_root):
    from tftoolkit.experiments.sweep.html import render_report

    scaling_out, _ = _execute("01_data_parallel_scaling", out_root)
    batch_out, _ = _execute("02_batch_and_lr_scaling", out_root)
    comm_out, _ = _execute("03_communication", out_root)
    # The way `tftoolkit sweep` and `tftoolkit demo` run it: its own process, then HTML.
    html, error = render_report(ROOT / "notebooks" / "04_report.ipynb", [scaling_out, batch_out, comm_out],
                                      out_root / "rep", timeout=300)
    assert error is None
    out = out_root / "rep" / "report"
    _figures(out, "throughput", "efficiency", "images_per_replica", "loss_curves", "val_accuracy", "final_accuracy",
             "allreduce_time", "busbw", "comm_vs_compute")
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 2 + 4 + 2
    page = Path(html).read_text()
    assert page.count("data:image/png;base64") >= 10 and "Traceback" not in page
    assert (out_root / "rep" / "report.ipynb").exists()  # the code stays in the executed notebook beside it
    _REPORTS["rendered"] = Path(html)


@pytest.mark.slow
def test_06_your_fit_smoke(out_root):
    # A user's model.fit under MirroredStrategy with tftoolkit.RunRecorder: the run directory and its images/sec.
    assert hint_args("06_your_fit") == ["-p", "smoke", "True", "-p", "replicas", "2"]
    out, nb = _execute("06_your_fit", out_root)
    s = json.loads((out / "run" / "summary.json").read_text())
    # Smoke: 512 images in global batches of 64 x 2 replicas, 2 epochs: 8 steps, the first 2 warming up.
    assert s["status"] == "ok" and s["replicas"] == 2 and s["global_batch"] == 128 and s["steps"] == 8
    assert s["timed_steps"] == 6 and s["images_per_sec"] > 0 and s["images_per_sec_uncertainty"] > 0
    assert s["val_accuracy"] >= 0 and s["train_accuracy"] >= 0
    steps = pd.read_csv(out / "run" / "steps.csv")
    assert steps["step"].tolist() == list(range(1, 9))
    written = {p.name for p in (out / "run").iterdir()}
    assert {"env.json", "monitor.csv", "evals.csv", "config.json", "tensorboard"} <= written
    assert (out / "runs.csv").exists()
    _figures(out, "monitor")
    shown = "".join(o.get("data", {}).get("text/plain", "") for c in _code_cells(nb) for o in c.get("outputs", []))
    assert "'images_per_sec'" in shown and _shows_images(nb) >= 1
    assert not _tensorflow_noise(nb)  # `import keras` before init_devices showed TensorFlow's start-up lines


@pytest.mark.slow
def test_07_choosing_hardware_smoke(out_root):
    # Candidate servers side by side: every forecast with its interval, time, energy and cost per epoch, one figure.
    out, nb = _execute("07_choosing_hardware", out_root)
    choice = pd.read_csv(out / "choice.csv")
    assert set(choice["candidate"]) == {"DGX-1 V100", "8x RTX 2080 Ti PCIe", "dgx-a100"}
    assert set(choice["replicas"]) == {1, 2, 4, 8}
    assert (choice["images_per_sec_low"] <= choice["images_per_sec"]).all()
    assert (choice["images_per_sec"] <= choice["images_per_sec_high"]).all()
    assert (choice["energy_kwh_per_epoch"] > 0).all()
    priced = choice["candidate"] != "dgx-a100"  # the catalogue system comes without a price
    assert (choice.loc[priced, "cost_per_epoch"] > 0).all() and choice.loc[~priced, "cost_per_epoch"].isna().all()
    # The DGX A100 has no rate given: its compute is ResNet-50's counted FLOPs over the A100's TF32 peak.
    a100 = choice[~priced].set_index("replicas")
    assert (a100["compute_from"] == "FLOPs over the peak").all() and 500 < a100.loc[1, "images_per_sec"] < 2000
    # ResNet-50 at 64 per GPU fits each candidate's GPU (the memory check, planner/memory.py), with room to spare.
    assert choice["fits"].all() and (choice["largest_per_replica_batch"] > 64).all()
    _figures(out, "hardware_choice")
    assert _shows_images(nb) >= 1


def test_06_sweep_spec_runs_it_at_1_2_and_4_replicas(capsys):
    from tftoolkit import cli
    from tftoolkit.experiments.sweep.spec import load

    spec = load(ROOT / "sweeps" / "your_fit.yaml")
    assert spec.notebook == ROOT / "notebooks" / "06_your_fit.ipynb"
    assert [p.params["replicas"] for p in spec.points] == [1, 2, 4]
    argv = ["sweep", str(ROOT / "sweeps" / "your_fit.yaml"), "--out", "/nonexistent/your_fit", "--dry-run"]
    assert cli.main(argv) == 0
    assert "3 points, 3 would run" in capsys.readouterr().out


_REPORTS: dict = {}


@pytest.mark.slow
def test_the_report_page_in_a_real_browser_shows_findings_and_figures_and_no_code(out_root, chromium):
    if "rendered" not in _REPORTS:
        test_04_report_on_the_other_notebooks_outputs_as_a_sweep_renders_it(out_root)
    chromium.open(_REPORTS["rendered"].resolve().as_uri())
    # Every image has decoded (naturalWidth > 0 only once the PNG has been read).
    chromium.wait_for("Array.from(document.images).every(i => i.complete)")
    images = chromium.evaluate("Array.from(document.images).map(i => [i.naturalWidth, i.naturalHeight])")
    assert len(images) >= 10 and all(w > 100 and h > 100 for w, h in images), images
    text = chromium.evaluate("document.body.innerText")
    assert "What we found" in text and "Scaling" in text and "Best LR rule per global batch" in text
    assert "Figure: Images per second against replicas" in text
    code_areas = chromium.evaluate("document.querySelectorAll('.jp-CodeCell .jp-InputArea, .jp-CodeMirrorEditor, "
                                   ".input_area').length")
    headings = chromium.evaluate("Array.from(document.querySelectorAll('h1, h2')).map(h => h.innerText)")
    # The page opens with what ran where (devices, machine, date, version), then the findings.
    assert headings[0].startswith("What ran where") and headings[1].startswith("What we found"), headings
    stderr = chromium.evaluate("document.querySelectorAll('[data-mime-type=\"application/vnd.jupyter.stderr\"]').length")
    assert code_areas == 0 and stderr == 0
    assert "import tftoolkit" not in text and "from tftoolkit" not in text
    assert "NaN" not in text  # a column another sweep lacks is blank in the tables, not "NaN"


@pytest.mark.slow
def test_04_with_no_arguments_reports_what_ran_next_to_it(out_root):
    """Run after 01-03 in the same folder with nothing but -p smoke True, 04 reports on their folders: its first
    call, results.discover, finds them (rendering those folders is the test above; 04 executing with no
    arguments through papermill, the test below)."""
    from tftoolkit.experiments.report import results, tables

    comm_out = [_execute(name, out_root)[0] for name in ("02_batch_and_lr_scaling", "03_communication")][-1]
    from tftoolkit.experiments import findings

    # Its own folder holds results too once it has run (here: an all-reduce table); it is still left out.
    mine = comm_out.parent / "04_default"  # beside the others' out_dirs, as runs/04_report would be
    mine.mkdir(exist_ok=True)
    (mine / "allreduce.csv").write_bytes((comm_out / "allreduce.csv").read_bytes())
    found = results.discover([], mine)
    assert {"02_batch_and_lr_scaling", "03_communication"} <= {p.name for p in found}
    assert "04_default" not in {p.name for p in found}
    # What the notebook's next cells do with them: load, findings, tables.
    res = results.load(found)
    text = findings.markdown(res)
    assert "What we found" in text and "Best LR rule per global batch" in text
    runs = pd.read_csv(tables.save_tables(res, mine)["runs"])
    assert "02_batch_and_lr_scaling" in set(runs["source"])


@pytest.mark.slow
def test_04_with_nothing_to_report_says_so_and_does_not_raise(tmp_path):
    executed = tmp_path / "04_empty.ipynb"
    papermill.execute_notebook(str(ROOT / "notebooks" / "04_report.ipynb"), str(executed),
                               parameters={"smoke": True, "out_dir": str(tmp_path / "runs" / "04_report")},
                               cwd=str(tmp_path), progress_bar=False)
    nb = nbformat.read(str(executed), as_version=4)
    text = "\n".join(o.get("data", {}).get("text/markdown", "") for c in _code_cells(nb) for o in c.get("outputs", []))
    assert "Nothing to report yet" in text and "run notebooks 01-03" in text.lower()


def _tensorflow_noise(nb) -> list:
    """TensorFlow's start-up and retracing lines in an executed notebook's output streams."""
    streams = [o.get("text", "") for c in _code_cells(nb) for o in c.get("outputs", [])
               if o.get("output_type") == "stream"]
    return [m.group(0) for text in streams for m in [NOISE.search(text)] if m]


NOISE = re.compile(r"^(WARNING: All log messages before absl|[IWE]\d{4} \d\d:\d\d:|.*triggered tf\.function retracing)", re.M)
TRAINS = ("scale.scale(", "grid.train_grid(", "tftoolkit.train(")


@pytest.mark.slow  # the notebooks test_01 and test_02 ran (one papermill run each per session)
@pytest.mark.parametrize("name", ["01_data_parallel_scaling", "02_batch_and_lr_scaling"])
def test_an_executed_notebook_shows_progress_and_none_of_tensorflow_s_noise(out_root, name):
    # Failed before the fix: the first cell held TensorFlow's start-up lines (I0000 ... E0000 failed call to cuInit),
    # and the cells that train showed nothing while they trained.
    _, nb = _execute(name, out_root)
    assert not _tensorflow_noise(nb)
    for cell in _code_cells(nb):
        if any(call in cell.source for call in TRAINS):
            said = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stderr")
            assert re.search(r"\| +\d+/\d+ \[", said), f"{name}: no progress in\n{cell.source}\n{said[-500:]}"


MINE = ("00_environment", "01_data_parallel_scaling", "02_batch_and_lr_scaling", "03_communication", "04_report",
        "06_your_fit", "07_choosing_hardware")


def test_every_notebook_is_executed_by_a_test():
    """A notebook added to notebooks/ without a smoke test fails here (05 has tests/experiments of its own)."""
    here = Path(__file__).resolve()
    others = "".join(p.read_text() for p in here.parent.glob("test_*.py") if p != here)
    untested = [n for n in NAMES if n not in MINE and f"{n}.ipynb" not in others]
    assert not untested, f"no test executes {untested}"


def test_batch_points_accumulate_exactly_the_batches_past_the_cap():
    from tftoolkit.experiments import notebook as nb

    # 2 replicas holding 32 each: 32 and 64 fit in one pass, 128 needs 2 micro-batches, 384 needs 6 (192 per replica:
    # 32 x 6), and 100 is 25 per micro-batch x 2.
    assert nb.batch_points([32, 64, 128, 384, 100], 2, 1, 32) == {"global_batch": [32, 64, 128, 384, 100],
                                                                  "accumulate": [1, 1, 2, 6, 2]}
    assert nb.batch_points([32, 128], 2) == {"global_batch": [32, 128]}  # no cap: nothing accumulates
    assert nb.batch_points([32, 128], 2, accumulate=4) == {"global_batch": [32, 128], "accumulate": [4, 4]}
    assert nb.batch_points([33], 2, 1, 8) == {"global_batch": [33]}  # refused by the run itself, and recorded
