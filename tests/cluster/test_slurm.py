"""Slurm: the sweep backend (job arrays) and multi-worker training under srun / sbatch, against a real one-node
Slurm (the slurm_cluster fixture, tests/slurm.py), plus the pieces that need no Slurm: the generated script, how
a task's end maps to a status, the shared-filesystem check and the bad-input messages."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import psutil
import pytest

from tftoolkit import cli
from tftoolkit.cluster import slurm
from tftoolkit.engine import devices
from tftoolkit.errors import SweepError

from helpers import FAST_ARGS, ROOT, checkpoint_variables, checkpointed_step, env_with_tests_on_path


# --- no Slurm needed ------------------------------------------------------------------------------------------
def test_array_script_maps_every_option_onto_sbatch(tmp_path):
    opts = slurm.ArrayOptions(max_concurrent=2, gpus_per_task=4, time="30", partition="gpu", account="proj",
                              extra=["--mem=16G", "--constraint=a100"])
    text = slurm.array_script(["/env/bin/python", "-m", "tftoolkit.experiments.sweep.task", "/s", "/s/a.json"], 5,
                              opts, tmp_path / "logs", tmp_path)
    lines = text.splitlines()
    for want in ("#SBATCH --array=0-4%2", "#SBATCH --gres=gpu:4", "#SBATCH --time=30", "#SBATCH --partition=gpu",
                 "#SBATCH --account=proj", "#SBATCH --mem=16G", "#SBATCH --constraint=a100", "#SBATCH --ntasks=1",
                 f"#SBATCH --output={tmp_path / 'logs'}/%A_%a.out", f"#SBATCH --chdir={tmp_path}"):
        assert want in lines, want
    assert lines[-1] == ('exec /env/bin/python -m tftoolkit.experiments.sweep.task /s /s/a.json '
                         '"$SLURM_ARRAY_TASK_ID"')
    assert "%" not in slurm.array_script(["x"], 3, slurm.ArrayOptions(), tmp_path, tmp_path).split("--array=")[1][:6]


def test_time_limit_follows_the_sweep_timeout_unless_given():
    assert slurm.time_limit(None, None) is None
    assert slurm.time_limit(600, None) == "15"      # 10 min of notebook + 5 of start-up, in minutes
    assert slurm.time_limit(600, "2:00:00") == "2:00:00"


@pytest.mark.parametrize("state, status, words", [
    ({"state": "TIMEOUT", "time_limit": "00:01:00"}, "timeout", "time limit (00:01:00"),
    ({"state": "CANCELLED", "reason": "None"}, "cancelled", "scancel"),
    ({"state": "OUT_OF_MEMORY", "reason": "OutOfMemory", "exit_code": "0:125"}, "failed", "OUT_OF_MEMORY"),
    ({"state": "NODE_FAIL", "reason": "NodeDown"}, "failed", "NodeDown"),
    ({"state": "COMPLETED"}, "failed", "without writing its result"),
    (None, "failed", "no longer in Slurm's queue"),
])
def test_a_task_that_ended_without_a_result_gets_slurms_reason(state, status, words):
    got, error = slurm.describe_end(state)
    assert got == status and words in error


MOUNTS = """\
/dev/sda1 / ext4 rw 0 0
tmpfs /tmp tmpfs rw 0 0
server:/export /home nfs4 rw 0 0
/dev/sdb1 /scratch/local xfs rw 0 0
"""


def test_sweep_folder_must_be_on_a_filesystem_the_nodes_share():
    assert slurm.filesystem_type(Path("/home/me/sweep"), MOUNTS) == "nfs4"
    assert slurm.filesystem_type(Path("/tmp/x"), MOUNTS) == "tmpfs"
    assert slurm.check_shared(Path("/home/me/sweep"), nodes=8, mounts_text=MOUNTS) is None
    assert slurm.check_shared(Path("/tmp/x"), nodes=1, mounts_text=MOUNTS) is None  # one node: it is there
    with pytest.raises(slurm.SlurmError, match="tmpfs filesystem, which exists on this host only"):
        slurm.check_shared(Path("/tmp/x"), nodes=8, mounts_text=MOUNTS)
    assert "local to this host" in slurm.check_shared(Path("/scratch/local/s"), nodes=8, mounts_text=MOUNTS)


def test_tftoolkit_env_says_whether_a_slurm_allocation_is_present(monkeypatch):
    from tftoolkit.measure import hardware

    assert hardware.slurm_allocation({}) is None
    a = hardware.slurm_allocation({"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]",
                                   "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_PARTITION": "gpu", "SLURM_NTASKS": "8"})
    assert a["job_id"] == "42" and a["nodes"] == "2" and a["gpus_per_node"] == "4" and a["partition"] == "gpu"
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    assert "no allocation (not inside a Slurm job)" in hardware.format_report(hardware.collect())
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    text = hardware.format_report(hardware.collect())
    assert "job 42, 2 node(s)" in text and "GPUs per node: 4" in text


def _notebook(path: Path) -> Path:
    """A researcher's own notebook: no out_dir, writes results.json where it runs, fails or sleeps on request."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("x: int = 1  # the value\nfail: bool = False  # raise\n"
                                       "sleep_s: float = 0.0  # seconds to sleep first")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import json, time\ntime.sleep(sleep_s)\nassert not fail, 'asked to fail'\n"
        "json.dump({'square': x * x}, open('results.json', 'w'))")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def _spec(tmp_path: Path, name: str, zip_: dict) -> Path:
    import yaml

    nb = _notebook(tmp_path / "mine.ipynb")
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"notebook": nb.name, "zip": zip_}))
    return spec


def test_slurm_backend_without_sbatch_says_so_and_names_the_local_alternative(tmp_path, monkeypatch, capsys):
    spec = _spec(tmp_path, "s", {"x": [1, 2]})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--backend", "slurm"]) == 2
    err = capsys.readouterr().err
    assert "Slurm not found" in err and "--backend local" in err


def test_slurm_options_without_the_slurm_backend_are_refused(tmp_path, capsys):
    spec = _spec(tmp_path, "s", {"x": [1, 2]})
    assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--partition", "gpu"]) == 2
    assert "--partition is a Slurm option: add --backend slurm" in capsys.readouterr().err


def test_a_cancel_at_the_time_limit_becomes_timeout_when_collected(tmp_path, monkeypatch):
    # The task writes "cancelled" on SIGTERM (it cannot tell scancel from the time limit); collecting asks Slurm.
    from tftoolkit.experiments.sweep import folder, slurm as sweep_slurm
    from tftoolkit.experiments.sweep.spec import load

    spec = load(_spec(tmp_path, "s", {"x": [1, 2]}))
    out = tmp_path / "out"
    folder.open_dir(spec, out, force=False)
    a, b = spec.points
    for p in (a, b):
        (out / "runs" / p.id).mkdir(parents=True)
        (out / "runs" / p.id / "point.json").write_text(json.dumps(
            {"id": p.id, "params": p.params, "status": "cancelled", "error": "stopped by Slurm (SIGTERM)",
             "slurm": {"job_id": "7", "task": p.index}}))
    states = {0: {"state": "TIMEOUT", "time_limit": "00:01:00", "reason": "TimeLimit"},
              1: {"state": "CANCELLED", "reason": "None"}}
    monkeypatch.setattr(slurm, "final_states", lambda job: states)
    sweep_slurm.reconcile(spec, out, [{"job_id": "7", "points": [a.id, b.id]}], active={})
    ra, rb = folder.read_record(out, a), folder.read_record(out, b)
    assert ra["status"] == "timeout" and "time limit (00:01:00" in ra["error"]
    assert rb["status"] == "cancelled" and rb["slurm"]["state"] == "CANCELLED"


def test_the_local_backend_refuses_a_folder_submitted_to_slurm(tmp_path):
    from tftoolkit.experiments.sweep import folder, local
    from tftoolkit.experiments.sweep.spec import load

    spec = load(_spec(tmp_path, "s", {"x": [1]}))
    out = tmp_path / "out"
    folder.open_dir(spec, out, force=False)
    (out / "slurm").mkdir()
    (out / "slurm" / "jobs.json").write_text('{"jobs": []}')
    with pytest.raises(SweepError, match="continue it with --backend slurm"):
        local.run(spec, out, report=False, quiet=True)


# --- a real Slurm ------------------------------------------------------------------------------------------------
def _sweep(cluster, spec: Path, out: Path, *args) -> subprocess.CompletedProcess:
    env = env_with_tests_on_path(SLURM_CONF=str(cluster.conf), TFTOOLKIT_SLURM_POLL_S="0.5")
    return subprocess.run([sys.executable, "-m", "tftoolkit", "sweep", str(spec), "--out", str(out), "--backend",
                           "slurm", "--no-report", *args], capture_output=True, text=True, env=env, timeout=300)


def _jobs(out: Path) -> list[dict]:
    return json.loads((out / "slurm" / "jobs.json").read_text())["jobs"]


@pytest.mark.slow
def test_a_sweep_as_a_slurm_job_array_records_failures_and_resumes_without_resubmitting(slurm_cluster, tmp_path):
    spec = _spec(tmp_path, "s", {"x": [1, 2, 3], "fail": [False, True, False]})
    out = tmp_path / "sweep"
    r = _sweep(slurm_cluster, spec, out)
    assert r.returncode == 1, r.stderr[-3000:]  # a point failed: recorded, and said in the exit status
    assert "submitted Slurm job array" in r.stdout
    table = pd.read_csv(out / "results.csv")
    assert table["status"].tolist() == ["ok", "failed", "ok"]
    assert "asked to fail" in table.loc[1, "error"]
    assert table.loc[[0, 2], "square"].tolist() == [1, 9]  # the notebook's results.json, as columns
    jobs = _jobs(out)
    assert len(jobs) == 1 and len(jobs[0]["points"]) == 3
    for i, pid in enumerate(jobs[0]["points"]):
        rec = json.loads((out / "runs" / pid / "point.json").read_text())
        assert rec["slurm"]["job_id"] == jobs[0]["job_id"] and rec["slurm"]["task"] == i
        assert (out / "slurm" / f"{jobs[0]['job_id']}_{i}.out").exists()
        assert (out / "runs" / pid / "mine.ipynb").exists()  # the point's outputs stay in its folder
    # Again: everything is finished, so nothing is submitted; the failure was reported by the run above, so this
    # one exits 0 and lists it as kept.
    r = _sweep(slurm_cluster, spec, out)
    assert r.returncode == 0 and "nothing to submit" in r.stderr and len(_jobs(out)) == 1
    assert "1 point(s) failed, timed out or were cancelled in an earlier run" in r.stdout
    # --rerun-failed submits the failed point alone, as a new array.
    r = _sweep(slurm_cluster, spec, out, "--rerun-failed")
    jobs = _jobs(out)
    assert len(jobs) == 2 and jobs[1]["points"] == [jobs[0]["points"][1]]
    assert pd.read_csv(out / "results.csv")["status"].tolist() == ["ok", "failed", "ok"]


def _status(out: Path, pid: str) -> str | None:
    """A point's status, None while its record is being replaced (a task starting clears the point's folder)."""
    try:
        return json.loads((out / "runs" / pid / "point.json").read_text())["status"]
    except (OSError, ValueError):
        return None


def _wait_for(cond, timeout=120, what=""):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.slow
def test_scancel_of_a_running_and_of_a_queued_task_shows_as_cancelled(slurm_cluster, tmp_path):
    spec = _spec(tmp_path, "s", {"x": [1, 2, 3], "sleep_s": [0.0, 300.0, 300.0]})
    out = tmp_path / "sweep"
    # One task at a time: task 2 stays queued while task 1 sleeps.
    r = _sweep(slurm_cluster, spec, out, "--no-wait", "--max-concurrent", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    job = _jobs(out)[0]
    job_id, pids = job["job_id"], job["points"]
    _wait_for(lambda: _status(out, pids[1]) == "running", what="task 1 to run")
    # Submitting again while tasks are queued or running submits nothing.
    r = _sweep(slurm_cluster, spec, out, "--no-wait")
    assert r.returncode == 0 and "nothing to submit" in r.stderr and len(_jobs(out)) == 1, r.stderr[-2000:]
    assert "2 point(s) queued or running" in r.stdout
    slurm_cluster.run("scancel", f"{job_id}_2")   # queued: it never starts
    slurm_cluster.run("scancel", f"{job_id}_1")   # running: SIGTERM to the task
    slurm_cluster.wait_idle(120)
    r = _sweep(slurm_cluster, spec, out)           # collect
    assert r.returncode == 1, r.stderr[-3000:]
    table = pd.read_csv(out / "results.csv").set_index("id")
    assert table.loc[pids[0], "status"] == "ok"
    assert table.loc[pids[1], "status"] == "cancelled" and table.loc[pids[2], "status"] == "cancelled"
    assert "cancelled in Slurm" in table.loc[pids[2], "error"]
    assert len(_jobs(out)) == 1  # cancelled points are finished: not resubmitted without --rerun-failed


# --- multi-worker training under srun and sbatch ------------------------------------------------------------------
TRAIN = ["--replicas", "2", "--per-replica-batch", "16", "--steps", "30", "--steps-per-loop", "5",
         "--checkpoint-every", "5", "--dataset", "synthetic", "--image-size", "16", "--train-images", "512",
         "--optimizer", "momentum", "--base-lr", "0.05", "--no-measure", "--quiet", *FAST_ARGS]


def _srun_env(cluster) -> dict:
    return env_with_tests_on_path(SLURM_CONF=str(cluster.conf), TFTOOLKIT_BASE_PORT=str(_free_base_port()),
                                  TFTOOLKIT_JOIN_TIMEOUT="120")


def _free_base_port() -> int:
    import socket

    for _ in range(50):
        base = int(np.random.default_rng().integers(20000, 40000))
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise RuntimeError("no two free ports in a row")


def _srun_train(out: Path) -> list[str]:
    return ["srun", "-n", "2", "--kill-on-bad-exit=1", sys.executable, "-m", "tftoolkit", "train", "--workers", "2",
            *TRAIN, "--out", str(out)]


@pytest.fixture(scope="module")
def sbatch_example(slurm_cluster, tmp_path_factory):
    """The shipped sbatch example, submitted with small settings (TRAIN): (its run directory, its job's state line,
    its log). Its one command is `srun --kill-on-bad-exit=1 tftoolkit train --workers 2 TRAIN --out OUT`, what
    _srun_train runs by hand, so its run directory is also the uninterrupted 2-worker run the srun tests compare
    with (one 2-worker training fewer than a run of each)."""
    folder = tmp_path_factory.mktemp("sbatch")
    out = folder / "example"
    env = {**_srun_env(slurm_cluster), "OUT": str(out), "TFTOOLKIT": f"{sys.executable} -m tftoolkit",
           "TRAIN_ARGS": " ".join(a for a in TRAIN if a != "--quiet")}
    # The example asks for 2 nodes with 4 GPUs; this cluster has one CPU node: the command line overrides it.
    done = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                           "--gpus-per-node=0", f"--output={folder}/%x-%j.out", "--time=10",
                           str(ROOT / "examples" / "slurm_multiworker.sbatch")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    slurm_cluster.wait_idle(300)  # (sbatch --wait polls with a growing interval: tens of seconds lost)
    logs = "".join(p.read_text() for p in folder.glob("tftoolkit-mw-*.out"))
    state = slurm_cluster.run("scontrol", "-o", "show", "job", job).stdout
    return out, state, logs


@pytest.fixture(scope="module")
def srun_2x1(sbatch_example):
    """An uninterrupted 2-worker run of TRAIN under srun (2 workers of 1 replica): the sbatch example's."""
    out, state, logs = sbatch_example
    assert "JobState=COMPLETED" in state, state + logs[-3000:]
    return out


def _assert_same_run(a_dir: Path, b_dir: Path) -> None:
    a, b = checkpoint_variables(a_dir), checkpoint_variables(b_dir)
    assert a.keys() == b.keys()
    for name in a:
        if a[name].dtype.kind in "fc":
            scale = max(np.abs(a[name]).max(), 1e-3)
            np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-5 * scale, err_msg=name)
        else:
            np.testing.assert_array_equal(b[name], a[name], err_msg=name)


@pytest.mark.slow
def test_srun_two_workers_equal_one_process_with_two_replicas(srun_2x1, tmp_path):
    s = json.loads((srun_2x1 / "summary.json").read_text())
    assert s["status"] == "ok" and s["workers"] == 2 and s["replicas"] == 2 and s["steps"] == 30
    one = tmp_path / "1x2"
    assert cli.main(["train", *TRAIN, "--out", str(one)]) == 0
    _assert_same_run(one, srun_2x1)
    assert s["final_loss"] == pytest.approx(json.loads((one / "summary.json").read_text())["final_loss"], rel=1e-5)


@pytest.mark.slow
def test_the_shipped_sbatch_example_runs_with_small_settings(sbatch_example):
    out, state, logs = sbatch_example
    assert "JobState=COMPLETED" in state, state + logs[-3000:]
    assert "tftoolkit: 2 workers on" in logs
    # Each worker's first import of TensorFlow is through SlurmClusterResolver: its start-up lines are held there too
    noise = [line for line in logs.splitlines(keepends=True) if devices.startup_noise(line)]
    assert not noise, noise[:4]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok" and s["workers"] == 2 and s["steps"] == 30


def _worker_pids(rank: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "tftoolkit" in " ".join(p.info["cmdline"] or []) and "train" in (p.info["cmdline"] or []):
                if p.environ().get("SLURM_PROCID") == rank and "SLURM_STEP_ID" in p.environ():
                    found.append(p.pid)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_a_worker_killed_under_srun_fails_the_step_and_a_rerun_resumes(srun_2x1, slurm_cluster, tmp_path):
    out = tmp_path / "killed"
    env = _srun_env(slurm_cluster)
    log = open(tmp_path / "srun.log", "w")
    step = subprocess.Popen(_srun_train(out), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_for(lambda: step.poll() is None and checkpointed_step(out) >= 10, 180, "a step-10 checkpoint")
        victims = _worker_pids("1")
        assert victims, "worker 1 not found"
        os.kill(victims[0], signal.SIGKILL)
        assert step.wait(timeout=120) != 0  # srun --kill-on-bad-exit stops the chief, the step fails
    finally:
        if step.poll() is None:
            os.killpg(step.pid, signal.SIGKILL)
        log.close()
    text = (tmp_path / "srun.log").read_text()
    assert "task 1" in text and "Killed" in text, text[-3000:]  # srun names the worker and how it died
    summary = out / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["status"] != "ok"
    killed_at = checkpointed_step(out)
    assert 10 <= killed_at < 30
    # The same command again resumes from the last checkpoint and ends where the uninterrupted run ended.
    done = subprocess.run(_srun_train(out), capture_output=True, text=True, env=_srun_env(slurm_cluster), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert s["status"] == "ok" and s["resumed_from_step"] >= killed_at - 5
    _assert_same_run(srun_2x1, out)
