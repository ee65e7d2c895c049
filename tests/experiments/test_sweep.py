"""tftoolkit.sweep: spec validation, grid expansion, failure isolation, resume, SIGKILL safety, GPU slots.

The mechanics run on a tiny fixture notebook (no TensorFlow): each point sleeps, raises, or writes a
summary.json with status ok / diverged, so a point costs only a kernel start.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tftoolkit import cli
from tftoolkit.experiments.sweep import folder, local
from tftoolkit.experiments.sweep import point as point_process
from tftoolkit.experiments.sweep import results_csv
from tftoolkit.errors import SweepError
from tftoolkit.experiments.sweep.spec import check_value, combinations
from tftoolkit.experiments.sweep.spec import load as load_spec

FIXTURE_PARAMS = """\
x: int = 0  # a number the point echoes into its summary
mode: str = "ok"  # ok | raise | diverge
values: list = [1]  # a list parameter
rate: float = 0.1  # a float parameter
sleep_s: float = 0.0  # seconds to sleep before finishing
out_dir: str = "."  # where the point writes (set by the sweep)"""

FIXTURE_BODY = """\
import json, os, pathlib, time
t0 = time.time()
time.sleep(sleep_s)
if mode == "raise":
    raise ValueError(f"bad x {x}")
run = pathlib.Path(out_dir) / "run"
run.mkdir(parents=True, exist_ok=True)
status = "diverged" if mode == "diverge" else "ok"
(run / "summary.json").write_text(json.dumps({
    "status": status, "error": None if status == "ok" else "loss became nan at step 3", "x": x,
    "final_loss": 1.0 / (x + 1), "values": values, "rate": rate, "t0": t0, "t1": time.time(),
    "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}))"""


def make_notebook(path: Path, params: str = FIXTURE_PARAMS, body: str = FIXTURE_BODY, tagged: bool = True) -> Path:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_code_cell(params, metadata={"tags": ["parameters"] if tagged else []}), new_code_cell(body)]
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def nb(tmp_path) -> Path:
    return make_notebook(tmp_path / "fx.ipynb")


def spec_dict(**sections) -> dict:
    return {"notebook": "fx.ipynb", "report": None, **sections}


def write_spec(tmp_path: Path, spec: dict, name: str = "spec.yaml") -> Path:
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def results(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "results.csv")


# --- expansion -----------------------------------------------------------------------------------------
def test_grid_is_crossed_zip_is_paired_fixed_is_shared():
    pts = combinations({"a": [1, 2], "b": ["x", "y", "z"]}, {"c": [10, 20], "d": [0.1, 0.2]}, {"f": True})
    assert len(pts) == 2 * 3 * 2
    assert all(p["f"] is True for p in pts)
    assert {(p["c"], p["d"]) for p in pts} == {(10, 0.1), (20, 0.2)}  # paired, never (10, 0.2)
    assert pts[0] == {"f": True, "a": 1, "b": "x", "c": 10, "d": 0.1}
    assert [p["a"] for p in pts[:6]] == [1] * 6  # first grid key varies slowest, in the order written
    assert combinations({}, {"c": [1, 2]}) == [{"c": 1}, {"c": 2}]


def test_points_get_readable_unique_ids_naming_what_varies(nb):
    spec = load_spec(spec_dict(fixed={"rate": 0.5}, grid={"x": [1, 2], "values": [[1, 2], 3]}), nb.parent)
    assert [p.id for p in spec.points] == ["00_x-1_values-1+2", "01_x-1_values-3", "02_x-2_values-1+2", "03_x-2_values-3"]
    # A single value for a list parameter becomes a one-element list for the notebook; the table keeps the value.
    p = spec.points[1]
    assert p.params["values"] == 3 and p.inject["values"] == [3]
    assert p.inject["rate"] == 0.5 and p.inject["x"] == 1


def test_type_rules_follow_the_declared_types():
    decl_int = {"inferred_type_name": "int", "default": "0"}
    decl_float = {"inferred_type_name": "float", "default": "0.1"}
    decl_list = {"inferred_type_name": "list", "default": "[1, 2]"}
    assert check_value("n", 3, decl_int) == 3
    assert check_value("lr", 1, decl_float) == 1.0 and isinstance(check_value("lr", 1, decl_float), float)
    assert check_value("r", 4, decl_list) == [4]
    with pytest.raises(SweepError, match="n = True is bool"):
        check_value("n", True, decl_int)
    with pytest.raises(SweepError, match="items must be int"):
        check_value("r", ["a"], decl_list)
    with pytest.raises(SweepError, match="YAML reads 1e-3 as text"):
        check_value("lr", "1e-3", decl_float)
    # No annotation: the default's type decides; a None default accepts anything.
    assert check_value("k", 2, {"inferred_type_name": "None", "default": "5"}) == 2
    with pytest.raises(SweepError):
        check_value("k", "five", {"inferred_type_name": "None", "default": "5"})
    assert check_value("k", "x", {"inferred_type_name": "None", "default": "None"}) == "x"
    assert check_value("g", None, {"inferred_type_name": "list | None", "default": "None"}) is None


# --- bad specs: one-line errors, before anything runs ---------------------------------------------------
@pytest.mark.parametrize("spec, message", [
    ({"notebook": "missing.ipynb", "grid": {"x": [1]}}, "notebook missing.ipynb not found"),
    (spec_dict(grid={"x": [1], "lr": [0.1]}), "parameter(s) lr not declared in fx.ipynb"),
    (spec_dict(fixed={"x": 1}), "empty grid"),
    (spec_dict(grid={"x": []}), "empty grid: grid.x has no values"),
    (spec_dict(grid={"x": ["two"]}), "x = 'two' is str, but the notebook declares x: int"),
    (spec_dict(grid={"rate": ["fast"]}), "rate = 'fast' is str"),
    (spec_dict(grid={"x": 3}), "grid.x must be a list"),
    (spec_dict(zip={"x": [1, 2], "mode": ["ok"]}), "equal lengths"),
    (spec_dict(grid={"x": [1]}, fixed={"out_dir": "/tmp"}), "out_dir is set by the sweep"),
    (spec_dict(grid={"x": [1]}, fixed={"x": 2}), "in both 'fixed:' and 'grid:'"),
    ({**spec_dict(grid={"x": [1]}), "grdi": {}}, "unknown key(s) grdi"),
])
def test_bad_specs_are_refused_with_a_message_naming_the_problem(tmp_path, nb, spec, message):
    with pytest.raises(SweepError) as e:
        load_spec(write_spec(tmp_path, spec))
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_notebook_without_parameters_cell_is_refused_and_out_dir_is_optional(tmp_path):
    make_notebook(tmp_path / "untagged.ipynb", tagged=False)
    with pytest.raises(SweepError, match="no cell tagged 'parameters'"):
        load_spec({"notebook": "untagged.ipynb", "grid": {"x": [1]}}, tmp_path)
    make_notebook(tmp_path / "noout.ipynb", params="x: int = 0  # a number")
    spec = load_spec({"notebook": "noout.ipynb", "grid": {"x": [1, 2]}}, tmp_path)
    assert not spec.takes_out_dir and len(spec.points) == 2  # its points run in their folders instead


def test_cli_turns_a_bad_spec_into_one_line_and_exit_code_2(tmp_path, nb, capsys):
    path = write_spec(tmp_path, spec_dict(grid={"nope": [1]}))
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tftoolkit sweep: error:") and "nope" in err and len(err.splitlines()) == 1


def test_a_folder_holding_another_sweep_is_refused_unless_force(tmp_path, nb):
    out = tmp_path / "out"
    a = load_spec(spec_dict(grid={"x": [1, 2]}), tmp_path)
    b = load_spec(spec_dict(grid={"x": [1, 3]}), tmp_path)
    assert folder.open_dir(a, out, force=False) is False
    assert folder.open_dir(a, out, force=False) is True  # the same sweep: resume
    with pytest.raises(SweepError, match="holds a different sweep .*--force"):
        folder.open_dir(b, out, force=False)
    (out / "runs").mkdir()
    assert folder.open_dir(b, out, force=True) is False
    assert not (out / "runs").exists()
    other = tmp_path / "notes"
    other.mkdir()
    (other / "thesis.tex").write_text("keep me")
    with pytest.raises(SweepError, match="not a sweep folder"):
        folder.open_dir(a, other, force=True)
    assert (other / "thesis.tex").exists()
    # The whole command: refused, and the folder left as it was (no lock file of the refused sweep).
    with pytest.raises(SweepError, match="not a sweep folder"):
        local.run(a, other, force=True, quiet=True)
    assert sorted(p.name for p in other.iterdir()) == ["thesis.tex"]


def test_dry_run_lists_points_and_writes_nothing(tmp_path, nb, capsys):
    path = write_spec(tmp_path, spec_dict(grid={"x": [1, 2]}, zip={"mode": ["ok", "raise"], "rate": [0.1, 0.2]}))
    out = tmp_path / "out"
    assert cli.main(["sweep", str(path), "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "4 points, 4 would run" in text
    assert "00_x-1_mode-ok_rate-0.1" in text and "03_x-2_mode-raise_rate-0.2" in text
    assert not out.exists()


# --- running: failure isolation, resume ------------------------------------------------------------------
@pytest.mark.slow
def test_failures_are_isolated_recorded_and_resume_skips_finished_points(tmp_path, nb):
    spec = spec_dict(grid={"x": [1]}, zip={"mode": ["ok", "raise", "diverge"]})
    path = write_spec(tmp_path, spec)
    out = tmp_path / "out"
    s = local.run(path, out, quiet=True)
    assert (s["counts"]["ok"], s["counts"]["failed"], s["counts"]["diverged"], s["counts"]["timeout"]) == (1, 1, 1, 0)
    assert s["new_failures"] == 1
    rows = {r["id"]: r for _, r in results(out).iterrows()}
    points = load_spec(path).points
    ok, raised, diverged = (rows[p.id] for p in points)
    assert ok["status"] == "ok" and ok["final_loss"] == pytest.approx(0.5) and ok["run_dir"] == "run"
    assert raised["status"] == "failed" and "ValueError: bad x 1" in raised["error"]
    assert diverged["status"] == "diverged" and "loss became nan" in diverged["error"]
    assert len(rows) == 3
    # Each point keeps its executed notebook, parameters and log.
    pdir = out / "runs" / ok["id"]
    assert (pdir / "fx.ipynb").exists() and (pdir / "log.txt").exists()
    params = json.loads((pdir / "parameters.json").read_text())
    assert params["mode"] == "ok" and params["out_dir"] == str(pdir.resolve())

    # Resume: nothing finished runs again; an unfinished point (killed mid-run) does.
    before = {p.id: folder.read_record(out, p)["finished"] for p in points}
    _set_status(out, ok["id"], "running")
    s2 = local.run(path, out, quiet=True)
    assert s2["ran"] == 1 and s2["counts"]["ok"] == 1
    assert s2["new_failures"] == 0  # the kept failure is not this run's: the CLI exits 0 and lists it
    after = {p.id: folder.read_record(out, p)["finished"] for p in points}
    assert [k for k in before if before[k] != after[k]] == [ok["id"]]

    # --rerun-failed runs the failed point again, and only it.
    s3 = local.run(path, out, rerun_failed=True, quiet=True)
    assert s3["ran"] == 1
    assert results(out)["status"].tolist() == ["ok", "failed", "diverged"]


@pytest.mark.slow
def test_a_point_past_the_timeout_is_stopped_with_everything_it_started(tmp_path, nb):
    path = write_spec(tmp_path, spec_dict(fixed={"sleep_s": 600.0}, grid={"x": [0]}))
    out = tmp_path / "out"
    t0 = time.time()
    s = local.run(path, out, timeout=3, quiet=True)
    assert s["counts"]["timeout"] == 1 and time.time() - t0 < 3 + point_process.STOP_GRACE_S + 15
    row = results(out).iloc[0]
    assert row["status"] == "timeout" and "--timeout 3" in row["error"]
    assert _procs_in(out) == []  # the point's process group, its kernel included, is gone


def _set_status(out: Path, pid: str, status: str) -> None:
    path = out / "runs" / pid / "point.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "status": status}))


def test_plan_runs_unfinished_points_and_failed_ones_only_when_asked(tmp_path, nb):
    spec = load_spec(spec_dict(grid={"x": [0, 1, 2, 3, 4, 5]}), tmp_path)
    out = tmp_path / "out"
    folder.open_dir(spec, out, force=False)
    for p, status in zip(spec.points[1:], ["running", "ok", "diverged", "failed", "timeout"]):
        (out / "runs" / p.id).mkdir(parents=True)
        _set_status_new(out, p.id, status)
    todo, status = folder.plan(spec, out, rerun_failed=False)
    assert [p.id[:2] for p in todo] == ["00", "01"]  # never started, and killed mid-run
    todo, _ = folder.plan(spec, out, rerun_failed=True)
    assert [p.id[:2] for p in todo] == ["00", "01", "04", "05"]
    assert status[spec.points[0].id] == "pending"


def _set_status_new(out: Path, pid: str, status: str) -> None:
    (out / "runs" / pid / "point.json").write_text(json.dumps({"id": pid, "status": status}))


def _procs_in(directory: Path) -> list[int]:
    """Processes whose working directory or command line points into ``directory`` (this one excluded)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(directory)) or str(directory) in cmd:
            found.append(int(pid))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and PR_SET_PDEATHSIG")
def test_killed_at_random_moments_every_point_ends_in_results_exactly_once(tmp_path, nb):
    spec = spec_dict(grid={"x": [0, 1, 2, 3]}, fixed={"sleep_s": 0.3})
    path = write_spec(tmp_path, spec)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tftoolkit", "sweep", str(path), "--out", str(out)]
    # Different moments on every run (start-up, mid-point, between points, writing results); the assertion
    # messages give the delays so a failure can be replayed.
    delays = []
    for _ in range(3):
        delays.append(random.uniform(0.3, 7.0))
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delays[-1])
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # Whatever moment it died at, results.csv is either absent (killed before the start) or a whole table.
        if (out / "results.csv").exists():
            df = results(out)
            assert len(df) == 4 and set(df["status"]) <= {"ok", "running", "pending"}, f"killed after {delays}"
        # The point in flight dies with the sweep (its kernel within a second or two): nothing keeps writing.
        deadline = time.time() + 8
        while _procs_in(tmp_path) and time.time() < deadline:
            time.sleep(0.3)
        assert _procs_in(tmp_path) == [], f"orphans after kills at {delays}"

    # A plain rerun, never --force: the dead sweep's lock is taken over and every point ends exactly once.
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    df = results(out)
    assert df["status"].tolist() == ["ok"] * 4, f"killed after {delays}"
    assert df["x"].tolist() == [0, 1, 2, 3] and df["id"].is_unique
    assert df["final_loss"].tolist() == pytest.approx([1.0, 0.5, 1 / 3, 0.25])
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(df["id"])
    assert not list(out.rglob(".*.tmp")), "a temp file survived"


@pytest.mark.slow
def test_a_second_sweep_on_the_same_folder_is_refused_and_another_folder_runs(tmp_path, nb, capsys):
    from tftoolkit import rundir

    path = write_spec(tmp_path, spec_dict(grid={"x": [1]}))
    with rundir.lock(tmp_path / "busy", "sweep folder"):
        assert cli.main(["sweep", str(path), "--out", str(tmp_path / "busy")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "sweep folder is locked by pid" in err[0] and str(os.getpid()) in err[0]
        assert not (tmp_path / "busy" / "results.csv").exists()
        s = local.run(path, tmp_path / "free", quiet=True, report=False)
    assert s["counts"]["ok"] == 1


# --- GPU slots --------------------------------------------------------------------------------------------
def test_gpu_slots_are_disjoint_sets():
    assert local.gpu_slots([], 2) == [None]
    assert local.gpu_slots(["0", "1", "2", "3"], None) == [["0", "1", "2", "3"]]
    assert local.gpu_slots(["0", "1", "2", "3", "4"], 2) == [["0", "1"], ["2", "3"]]
    with pytest.raises(SweepError, match="only 2 GPU"):
        local.gpu_slots(["0", "1"], 3)


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert local.visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local.visible_gpus() == []


@pytest.mark.slow
def test_gpus_per_run_runs_points_concurrently_on_disjoint_gpu_sets(tmp_path, nb):
    path = write_spec(tmp_path, spec_dict(grid={"x": [0, 1]}, fixed={"sleep_s": 4.0}))
    out = tmp_path / "out"
    s = local.run(path, out, gpus_per_run=2, gpus=["0", "1", "2", "3"], quiet=True)
    assert s["counts"]["ok"] == 2
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/run/summary.json"))]
    assert sorted(r["gpus"] for r in runs) == ["0,1", "2,3"]
    a, b = runs
    assert a["t0"] < b["t1"] and b["t0"] < a["t1"], "the two points did not overlap in time"


# --- any parameterised notebook ------------------------------------------------------------------------------
FOREIGN_PARAMS = """\
alpha: float = 1.0  # a researcher's own parameter
label: str = "a"  # and another"""

FOREIGN_BODY = """\
import json, pathlib
pathlib.Path("figure.txt").write_text(f"plot of {alpha}")     # written where it runs
json.dump({"score": alpha * 2, "label": label, "nested": {"depth": 1}}, open("results.json", "w"))"""


@pytest.mark.slow
def test_a_notebook_without_out_dir_runs_in_its_point_folder_and_records_values(tmp_path):
    make_notebook(tmp_path / "mine.ipynb", params=FOREIGN_PARAMS, body=FOREIGN_BODY)
    path = write_spec(tmp_path, {"notebook": "mine.ipynb", "report": None, "grid": {"alpha": [1.5, 2.0]},
                                 "fixed": {"label": "x"}})
    out = tmp_path / "out"
    s = local.run(path, out, quiet=True)
    assert s["counts"]["ok"] == 2
    df = results(out)
    assert df["alpha"].tolist() == [1.5, 2.0] and df["score"].tolist() == [3.0, 4.0]
    assert df["nested.depth"].tolist() == [1, 1] and "label" in df.columns
    for pid in df["id"]:
        pdir = out / "runs" / pid
        assert (pdir / "figure.txt").exists() and (pdir / "mine.ipynb").exists() and (pdir / "results.json").exists()
    assert not (tmp_path / "figure.txt").exists()  # nothing lands where the sweep was started
    assert "out_dir" not in json.loads((out / "runs" / df["id"][0] / "parameters.json").read_text())


def test_a_spec_on_a_notebook_without_parameters_or_without_a_file_is_refused(tmp_path, capsys):
    make_notebook(tmp_path / "plain.ipynb", tagged=False)
    for nb_name, message in (("plain.ipynb", "has no cell tagged 'parameters'"), ("absent.ipynb", "not found")):
        path = write_spec(tmp_path, {"notebook": nb_name, "grid": {"x": [1]}}, name=f"{nb_name}.yaml")
        assert cli.main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_results_csv_keeps_integers_integers_when_a_point_has_no_figures_yet(tmp_path, nb):
    spec = load_spec(spec_dict(grid={"x": [1, 2]}), tmp_path)
    out = tmp_path / "out"
    done, running = spec.points
    for point, record in ((done, {"status": "ok", "runs": 1, "wall_s": 2.5,
                                  "figures": {"steps": 48, "images_per_sec": 10.5}}),
                          (running, {"status": "running", "started": time.time()})):
        folder.point_dir(out, point).mkdir(parents=True)
        (folder.point_dir(out, point) / folder.POINT_JSON).write_text(json.dumps({"id": point.id, **record}))
    lines = results_csv.write_results(spec, out).read_text().splitlines()
    header, first = lines[0].split(","), lines[1].split(",")
    row = dict(zip(header, first))
    assert row["steps"] == "48" and row["runs"] == "1" and row["x"] == "1" and row["images_per_sec"] == "10.5"


def test_a_key_given_twice_in_a_spec_is_refused_naming_it_and_its_lines(tmp_path, nb):
    (tmp_path / "other.ipynb").write_text(nb.read_text())
    twice = {"top.yaml": ("notebook: fx.ipynb\ngrid:\n  x: [1, 2]\nnotebook: other.ipynb\n", "notebook", 4, 1),
             "nested.yaml": ("notebook: fx.ipynb\ngrid:\n  x: [1, 2]\n  x: [3]\n", "x", 4, 3),
             "flow.yaml": ("notebook: fx.ipynb\ngrid: {x: [1], x: [2]}\n", "x", 2, 2)}
    for name, (text, key, line, first) in twice.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(SweepError, match=rf"{name} is not valid YAML \(line {line}\): duplicate key '{key}' "
                                             rf"\(also on line {first}\)"):
            load_spec(tmp_path / name)
    (tmp_path / "once.yaml").write_text("notebook: fx.ipynb\ngrid:\n  x: [1, 2]\n")
    assert [p.params for p in load_spec(tmp_path / "once.yaml").points] == [{"x": 1}, {"x": 2}]


@pytest.mark.parametrize("sweep_json", ['{"identity": {"notebook": "x.ipynb", "points": []}}', "not json", "[1, 2]"])
def test_only_a_folder_whose_sweep_json_a_sweep_wrote_is_resumed_or_cleared(tmp_path, nb, sweep_json, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "sweep.json").write_text(sweep_json)
    (out / "thesis.tex").write_text("keep me")
    spec = load_spec(spec_dict(grid={"x": [1]}), tmp_path)
    for force in (False, True):
        with pytest.raises(SweepError, match="not a tftoolkit sweep folder.*left as it is") as e:
            folder.open_dir(spec, out, force=force)
        assert "--force" not in str(e.value)
    path = write_spec(tmp_path, spec_dict(grid={"x": [1]}))
    assert cli.main(["sweep", str(path), "--out", str(out), "--force"]) == 2
    assert "not a tftoolkit sweep folder" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["sweep.json", "thesis.tex"]
    assert (out / "sweep.json").read_text() == sweep_json


@pytest.mark.parametrize("text, why", [(b"notebook: nb.ipynb\ngrid: &g {x: [1, *g]}\n", "contains itself"),
                                       (b"notebook: nb.ipynb\ngrid: {x: [1]}\n# \xff\xfe\n", "not UTF-8"),
                                       (b"[1, 2]\n", "a sweep spec is a mapping")])
def test_a_spec_the_user_got_wrong_is_one_line_exit_2(tmp_path, nb, capsys, text, why):
    path = tmp_path / "sweep.json"
    path.write_bytes(text)
    with pytest.raises(SweepError, match=why):
        load_spec(path)
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0]
