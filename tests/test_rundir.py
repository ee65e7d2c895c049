"""tftoolkit.rundir: a run directory holds one run, and one live process at a time (its lock)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

import tftoolkit
from tftoolkit import cli, fileio, rundir
from tftoolkit.config import RunConfig
from tftoolkit.errors import RunDirError

from helpers import FAST

TINY = dict(replicas=1, per_replica_batch=16, steps=2, steps_per_loop=2, dataset="synthetic", image_size=8,
            train_images=64, measure=False, timing_warmup_steps=0, **FAST)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _plant(folder, **record) -> None:
    """A lock file left by a holder that no longer holds the flock (as a SIGKILL leaves it)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = {"pid": _dead_pid(), "host": socket.gethostname(), "command": "tftoolkit train ...",
            "started_at": time.time() - 60, "pid_started": None}
    (folder / rundir.LOCK_FILE).write_text(json.dumps({**base, **record}))


def test_a_second_holder_is_refused_with_the_first_one_named(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    with rundir.lock(tmp_path / "run"):
        with pytest.raises(RunDirError) as e:
            rundir.lock(tmp_path / "run")
        assert f"locked by pid {os.getpid()} on {socket.gethostname()}" in str(e.value)
        record = json.loads((tmp_path / "run" / rundir.LOCK_FILE).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname() and record["command"]
        (tmp_path / "run" / "steps.csv").write_text("step\n")
    # Released: empty record, and the next holder gets it without a warning.
    assert (tmp_path / "run" / rundir.LOCK_FILE).read_text() == ""
    rundir.lock(tmp_path / "run").release()


def test_a_live_run_refuses_a_second_train_even_with_force(tmp_path, capsys):
    out = tmp_path / "run"
    with rundir.lock(out):
        (out / "keep.txt").write_text("the first run's file")
        with pytest.raises(RunDirError, match="is in use.*--force never breaks a live lock"):
            tftoolkit.train(RunConfig(**TINY), out, quiet=True, force=True)
        argv = ["train", "--out", str(out), "--replicas", "1", "--steps", "2", "--dataset", "synthetic",
                "--image-size", "8", "--train-images", "64", "--no-measure", "--quiet", "--force"]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"locked by pid {os.getpid()}" in err[0]
        assert (out / "keep.txt").read_text() == "the first run's file"


def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    out = tmp_path / "run"
    _plant(out)
    with caplog.at_level("WARNING", logger="tftoolkit"):
        s = tftoolkit.train(RunConfig(**TINY), out, quiet=True)
    assert s["status"] == "ok"
    assert "taking over the lock of pid" in caplog.text and "no longer running" in caplog.text


def test_another_host_s_fresh_record_is_refused_and_an_old_one_taken_over(tmp_path, caplog):
    out = tmp_path / "run"
    _plant(out, host="node-elsewhere", pid=4242)
    with pytest.raises(RunDirError, match="node-elsewhere.*refreshed 0 s ago"):
        rundir.lock(out)
    old = time.time() - 2 * rundir.STALE_AFTER_S
    os.utime(out / rundir.LOCK_FILE, (old, old))
    with caplog.at_level("WARNING", logger="tftoolkit"):
        rundir.lock(out).release()
    assert "another host, silent for" in caplog.text


def test_a_holder_refreshes_its_record(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir, "HEARTBEAT_S", 0.05)
    with rundir.lock(tmp_path / "run"):
        path = tmp_path / "run" / rundir.LOCK_FILE
        old = time.time() - 100
        os.utime(path, (old, old))
        time.sleep(0.3)
        assert time.time() - path.stat().st_mtime < 5


@pytest.mark.slow
def test_the_kernel_releases_the_lock_of_a_killed_process(tmp_path):
    code = ("import sys, time; from tftoolkit import rundir; rundir.lock(sys.argv[1]); print('held', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(RunDirError, match=f"pid {proc.pid}"):
        rundir.lock(tmp_path / "run")
    proc.kill()
    proc.wait()
    rundir.lock(tmp_path / "run").release()  # taken over: the holder died


def test_opening_a_sweep_folder_removes_temp_files_a_killed_writer_left(tmp_path):
    from tftoolkit.experiments.sweep import folder
    from tftoolkit.experiments.sweep.spec import Spec

    out = tmp_path / "sweep"
    spec = Spec(notebook=tmp_path / "nb.ipynb", report=None, fixed={}, grid={}, zip={}, declared={})
    with rundir.lock(out, "sweep folder"):
        assert folder.open_dir(spec, out, force=False) is False
    (out / "runs" / "p1").mkdir(parents=True)
    (out / "results.csv").write_text("the last complete table")
    (out / f".results.csv.{fileio.TEMP_TAG}abc12345.tmp").write_text("half a tab")  # killed before the rename
    (out / "runs" / "p1" / f".steps.csv.{fileio.TEMP_TAG}x.tmp").write_text("a point's own: its lock, not ours")
    with rundir.lock(out, "sweep folder"):
        assert (out / f".results.csv.{fileio.TEMP_TAG}abc12345.tmp").exists()  # the lock alone removes nothing
        assert folder.open_dir(spec, out, force=False) is True
        assert not (out / f".results.csv.{fileio.TEMP_TAG}abc12345.tmp").exists()
        assert (out / "results.csv").read_text() == "the last complete table"
        assert (out / "runs" / "p1" / f".steps.csv.{fileio.TEMP_TAG}x.tmp").exists()


@pytest.fixture(scope="module")
def finished_tiny(tmp_path_factory):
    """A finished run of TINY; each test that needs one works on its own copy."""
    out = tmp_path_factory.mktemp("tiny") / "r"
    tftoolkit.train(RunConfig(**TINY), out, quiet=True)
    return out


def test_force_clears_a_run_but_keeps_the_lock_file(tmp_path, finished_tiny):
    out = tmp_path / "run"
    shutil.copytree(finished_tiny, out)
    s = tftoolkit.train(RunConfig(**{**TINY, "seed": 1}), out, quiet=True, force=True)
    assert s["status"] == "ok" and (out / rundir.LOCK_FILE).exists()
    assert json.loads((out / "config.json").read_text())["config"]["seed"] == 1


def test_an_empty_folder_with_only_a_lock_is_a_new_run_directory(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / rundir.LOCK_FILE).write_text("")  # as a holder killed before it wrote anything leaves it
    assert rundir.prepare(out, RunConfig(replicas=1).to_dict()) == (out, False)
    (out / "notes.txt").write_text("x")
    (out / "config.json").unlink(missing_ok=True)
    with pytest.raises(RunDirError, match="not a tftoolkit run directory"):
        rundir.prepare(out, RunConfig(replicas=1).to_dict())


def test_a_folder_the_lock_made_for_a_run_that_never_began_is_removed(tmp_path):
    rundir.lock(tmp_path / "new").release()
    assert not (tmp_path / "new").exists()


# Another valid value for every RunConfig field: the identity test below needs one for each, so a new field must be
# listed here (and so decided: does it define the run?).
OTHER_VALUE = {
    "replicas": 2, "gpus": [0], "workers": 2, "cross_device_ops": "reduce_to_one", "per_replica_batch": 32,
    "global_batch": 64, "base_lr": 0.01, "base_batch": 128, "lr_rule": "linear", "warmup_epochs": 0.5,
    "schedule": "step", "optimizer": "sgd", "weight_decay": 0.1, "epochs": 2.0, "steps": 7, "model": "small_cnn_bn",
    "dataset": "synthetic", "train_images": 100, "image_size": 16, "num_classes": 3, "augment": True,
    "verify": "full", "imagenet_labels": "keep", "skip_bad_images": True, "input_sharding": "file", "data_memory_gb": 1.0, "data_placement": "device",
    "data_service": "localhost:5050", "data_service_timeout": 60.0, "loss": "mse", "metrics": "mae",
    "last_batch": "partial", "precision": "mixed_bfloat16", "jit": True, "steps_per_loop": 3, "seed": 1,
    "deterministic": False, "checkpoint_every": 5, "eval_every_epoch": False, "timing_warmup_steps": 2,
    "divergence_factor": 3.0, "measure": False, "measure_budget": 0.5, "profile_steps": "2-3", "noise_scale": True,
    "accumulate": 2, "allreduce_dtype": "bfloat16", "allreduce_packs": 2,
}


def test_which_fields_define_a_run_is_decided_for_every_field_both_ways(tmp_path):
    import dataclasses

    from tftoolkit.config import NON_IDENTITY_KEYS

    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    assert set(OTHER_VALUE) == set(fields), "list the new field in OTHER_VALUE"
    base = RunConfig().to_dict()
    out, _ = rundir.prepare(tmp_path / "r", base)
    (out / "config.json").write_text(json.dumps(rundir.config_record(base)))
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "ckpt-1.index").write_text("")  # it trained: a different config is refused
    for name, value in OTHER_VALUE.items():
        changed = {**base, name: value}
        assert changed != base, name
        if name in NON_IDENTITY_KEYS:
            assert rundir.prepare(out, changed) == (out, True), f"{name}: resumes"  # how it runs, not what
        else:
            with pytest.raises(RunDirError, match=rf"holds a different run \(it differs in {name} "):
                rundir.prepare(out, changed)
    # What cuts the same steps into other calls, or says how a run is measured and reported, is not the run.
    assert {"steps_per_loop", "checkpoint_every", "measure", "timing_warmup_steps", "workers"} <= NON_IDENTITY_KEYS
    assert not {"seed", "deterministic", "jit", "num_classes", "global_batch", "imagenet_labels"} & NON_IDENTITY_KEYS
    # A run stopped by a bad image resumes from its checkpoint with --skip-bad-images.
    assert "skip_bad_images" in NON_IDENTITY_KEYS


@pytest.mark.slow
def test_a_finished_run_is_left_as_it_is_and_says_what_a_changed_option_would_need(tmp_path, caplog, finished_tiny):
    out = tmp_path / "r"
    shutil.copytree(finished_tiny, out)
    before = (out / "config.json").read_text()
    with caplog.at_level("INFO", logger="tftoolkit"):
        s = tftoolkit.train(RunConfig(**{**TINY, "measure": True, "steps_per_loop": 1}), out)
    assert s["status"] == "ok" and "compute_time_s" not in s
    assert (out / "config.json").read_text() == before  # nothing ran, nothing rewritten
    assert "nothing to do; it ran with measure=False, steps_per_loop=2" in caplog.text and "--force" in caplog.text


def _user_folder(folder):
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "train.py").write_text("print('mine')")
    (folder / "notes.txt").write_text("my notes")


def _sweep_folder(folder):
    (folder / "runs" / "p1").mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({"identity": {"notebook": "nb.ipynb", "points": []}}))
    (folder / "runs" / "p1" / "point.json").write_text(json.dumps({"status": "ok"}))
    (folder / "results.csv").write_text("id,status\np1,ok\n")


def _files(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("make, why", [
    (_user_folder, "is not a tftoolkit run directory"),
    (_sweep_folder, "is not a tftoolkit run directory"),
    (lambda f: (f.mkdir(), (f / "config.json").write_text("my own config, not a run's")), "config.json is not a run's"),
    (lambda f: (f.mkdir(), (f / "config.json").write_text('{"lr": 0.1}')), "config.json is not a run's"),
])
def test_force_replaces_only_a_run_directory(tmp_path, make, why):
    out = tmp_path / "folder"
    make(out)
    before = _files(out)
    for force in (False, True):
        with pytest.raises(RunDirError, match=why) as e:
            rundir.prepare(out, RunConfig(**TINY).to_dict(), force=force)
        assert "--force" not in str(e.value) and "choose another --out" in str(e.value)
        assert _files(out) == before


def test_train_force_through_the_cli_leaves_a_user_folder_as_it_was(tmp_path, capsys):
    out = tmp_path / "mine"
    _user_folder(out)
    before = _files(out)
    argv = ["train", "--out", str(out), "--replicas", "1", "--steps", "2", "--dataset", "synthetic",
            "--image-size", "8", "--train-images", "64", "--no-measure", "--quiet", "--force"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a tftoolkit run directory" in err[0] and "--force" not in err[0]
    assert _files(out) == before


def test_an_empty_out_is_refused_and_the_working_folder_left_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _user_folder(tmp_path)
    before = _files(tmp_path)
    with pytest.raises(RunDirError, match="--out is empty"):
        tftoolkit.train(RunConfig(**TINY), "", quiet=True, force=True)
    argv = ["train", "--out", "", "--replicas", "1", "--steps", "2", "--dataset", "synthetic", "--image-size", "8",
            "--train-images", "64", "--no-measure", "--quiet", "--force"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out is empty" in err[0]
    with pytest.raises(RunDirError, match="--out is empty"):
        rundir.lock("  ")
    assert _files(tmp_path) == before and not (tmp_path / rundir.LOCK_FILE).exists()


@pytest.mark.slow
def test_a_run_that_stopped_at_set_up_does_not_block_the_corrected_command(tmp_path, caplog):
    from tftoolkit.errors import ModelError

    # A misspelt model name is refused before the run directory is written (models.resolve at set-up)...
    with pytest.raises(ModelError, match="unknown model 'small_vg'"):
        tftoolkit.train(RunConfig(**{**TINY, "model": "small_vg"}), tmp_path / "typo", quiet=True)
    assert not (tmp_path / "typo" / "config.json").exists()

    # ...and a builder that fails while the run is set up stops after the config is recorded.
    out = tmp_path / "run"
    with pytest.raises(ModelError, match="a builder that fails"):
        tftoolkit.train(RunConfig(**{**TINY, "model": "models_for_tests:broken"}), out, quiet=True)
    assert (out / "config.json").exists()  # it got as far as recording its config
    with caplog.at_level("INFO", logger="tftoolkit"):
        s = tftoolkit.train(RunConfig(**TINY), out)  # no --force needed
    assert s["status"] == "ok" and json.loads((out / "config.json").read_text())["config"]["model"] == "small_cnn"
    assert "never trained a step" in caplog.text


def test_only_a_run_that_trained_a_step_is_protected(tmp_path):
    base, other = RunConfig(**TINY).to_dict(), RunConfig(**{**TINY, "seed": 7}).to_dict()

    def folder(name, **files):
        out = tmp_path / name
        (out / "checkpoints").mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(rundir.config_record(base)))
        for rel, text in files.items():
            (out / rel.replace("__", "/")).write_text(text)
        return out

    # Stopped before its first step: a failed summary at step 0, or files of set-up only.
    for out in (folder("setup"), folder("first_step_failed", **{"summary.json": json.dumps({"status": "failed",
                                                                                            "steps": 0}),
                                                                 "env.json": "{}", "monitor.csv": "t\n"})):
        assert rundir.prepare(out, other) == (out, False)
        assert sorted(p.name for p in out.iterdir()) == []  # cleared for the new run
    # A checkpoint, or a summary of steps trained (the checkpoints may be elsewhere): a run to protect.
    for out in (folder("checkpointed", **{"checkpoints__ckpt-2.index": "", "checkpoints__ckpt-2.data-00000-of-00001": ""}),
                folder("summarised", **{"summary.json": json.dumps({"status": "failed", "steps": 3})}),
                folder("unreadable_summary", **{"summary.json": "{half"})):
        with pytest.raises(RunDirError, match="holds a different run .*--force"):
            rundir.prepare(out, other)
        assert (out / "config.json").exists()


def _hold(folder, record: str = ""):
    """Another holder that has the flock but has not written (all of) its record yet, as in a race of two starts."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / rundir.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, record.encode())
    return fd


def test_a_lock_being_taken_is_named_so_and_a_record_written_meanwhile_is_read(tmp_path):
    import threading

    for record in ("", '{"pid": 12'):  # nothing yet, or half a record
        fd = _hold(tmp_path / "run", record)
        with pytest.raises(RunDirError) as e:
            rundir.lock(tmp_path / "run")
        os.close(fd)
        assert "None" not in str(e.value) and "1970" not in str(e.value)
        assert "is being taken by another process" in str(e.value)
    fd = _hold(tmp_path / "run")
    whole = json.dumps({"pid": 4321, "host": "here", "command": "tftoolkit sweep s.yaml --out k", "started_at": time.time()})
    later = threading.Timer(0.2, lambda: os.pwrite(fd, whole.encode(), 0))
    later.start()
    with pytest.raises(RunDirError, match=r"run directory is locked by pid 4321 on here since .*\(tftoolkit sweep s.yaml --out k\)"):
        rundir.lock(tmp_path / "run")
    later.join()
    os.close(fd)


def test_the_holder_s_command_is_recorded_whole_or_its_cut_marked(tmp_path, monkeypatch):
    long = ["tftoolkit", "sweep", "sweeps/" + "x" * 200 + ".yaml", "--out", "k_step45"]
    monkeypatch.setattr(sys, "argv", long)
    with rundir.lock(tmp_path / "a"):
        assert json.loads((tmp_path / "a" / rundir.LOCK_FILE).read_text())["command"] == " ".join(long)
    monkeypatch.setattr(sys, "argv", ["tftoolkit", "x" * 5000])
    with rundir.lock(tmp_path / "b"):
        command = json.loads((tmp_path / "b" / rundir.LOCK_FILE).read_text())["command"]
        assert command.endswith("…") and command.startswith("tftoolkit xxx") and len(command) < 5000


# --- what a run directory is, what the lock opens, whose temporary files go ----------------------------------
def _user_folder_with_a_keras_config(folder):
    """notes, data, weights and a Keras model.to_json() saved as config.json: it has a "config" object."""
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes")
    (folder / "sub" / "data.bin").write_bytes(b"\x00\x01")
    (folder / "model.weights.h5").write_bytes(b"HDF")
    (folder / "config.json").write_text(json.dumps({"class_name": "Sequential", "config": {"name": "m", "layers": []},
                                                    "keras_version": "3.10.0", "backend": "tensorflow"}))


@pytest.mark.parametrize("make", [_user_folder_with_a_keras_config,
                                  lambda f: (f.mkdir(), (f / "config.json").write_text('{"config": {}}'))])
def test_a_config_object_alone_does_not_make_a_run_directory(tmp_path, make, capsys):
    out = tmp_path / "user3"
    make(out)
    before = _files(out)
    for force in (False, True):
        with pytest.raises(RunDirError, match="not a tftoolkit run directory.*left as it is"):
            rundir.prepare(out, RunConfig(**TINY).to_dict(), force=force)
        assert _files(out) == before
    argv = ["train", "--out", str(out), "--replicas", "1", "--steps", "2", "--dataset", "synthetic",
            "--image-size", "8", "--train-images", "64", "--no-measure", "--quiet"]
    assert cli.main(argv) == 2
    assert "not a tftoolkit run directory" in capsys.readouterr().err
    assert _files(out) == before and not (out / rundir.LOCK_FILE).exists()


def test_what_the_toolkit_writes_is_marked_and_recognised():
    record = rundir.config_record({"model": "small_cnn"}, derived={})
    assert rundir.marked(record) and record["config"] == {"model": "small_cnn"}
    assert not rundir.marked({"config": {}}) and not rundir.marked([]) and not rundir.marked({"written_by": "me"})


def test_a_symlinked_lock_is_refused_and_its_target_left_whole(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    out = tmp_path / "lk1"
    out.mkdir()
    (out / rundir.LOCK_FILE).symlink_to(victim)
    with pytest.raises(RunDirError, match="is a link or not a file.*remove it"):
        rundir.lock(out)
    argv = ["train", "--out", str(out), "--replicas", "1", "--steps", "2", "--dataset", "synthetic",
            "--image-size", "8", "--train-images", "64", "--no-measure", "--quiet"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a link or not a file" in err[0]
    assert victim.read_text() == "the user's file" and (out / rundir.LOCK_FILE).is_symlink()
    (out / rundir.LOCK_FILE).unlink()
    (out / rundir.LOCK_FILE).symlink_to(tmp_path / "nowhere")  # a dangling link: not created through either
    with pytest.raises(RunDirError, match="is a link or not a file"):
        rundir.lock(out)
    assert not (tmp_path / "nowhere").exists()
    assert not rundir.held(out)
    (out / rundir.LOCK_FILE).unlink()
    os.link(victim, out / rundir.LOCK_FILE)  # a hard link: the same file under the lock's name
    with pytest.raises(RunDirError, match="is a link or not a file"):
        rundir.lock(out)
    assert victim.read_text() == "the user's file"


def test_a_refused_folder_keeps_its_temporary_files(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    mine = [home / ".bashrc.tmp", home / ".draft.abc123.tmp", home / ".notes.txt.x1y2z3w4.tmp"]
    for p in mine:
        p.write_text("the user's")
    with pytest.raises(RunDirError, match="not a tftoolkit run directory"):
        with rundir.lock(home):
            rundir.prepare(home, RunConfig(**TINY).to_dict(), force=True)
    assert all(p.read_text() == "the user's" for p in mine)
    assert sorted(p.name for p in home.iterdir()) == sorted(p.name for p in mine)


def test_opening_a_run_directory_removes_only_the_temporary_files_the_toolkit_names(tmp_path):
    from tftoolkit import fileio

    out, _ = rundir.prepare(tmp_path / "run", RunConfig(**TINY).to_dict())
    fileio.write_json(out / "config.json", rundir.config_record(RunConfig(**TINY).to_dict()))
    ours = out / f".summary.json.{fileio.TEMP_TAG}k1ll3d00.tmp"  # killed between its write and the rename
    ours.write_text("half")
    users = out / ".scratch.tmp"
    users.write_text("the user's")
    with rundir.lock(out):
        assert rundir.prepare(out, RunConfig(**TINY).to_dict()) == (out, True)
    assert not ours.exists() and users.read_text() == "the user's"


def test_a_damaged_summary_in_a_run_directory_is_rewritten_by_the_rerun(tmp_path, finished_tiny, caplog):
    out = tmp_path / "r"
    shutil.copytree(finished_tiny, out)
    (out / "summary.json").write_text("[]")
    with caplog.at_level("WARNING", logger="tftoolkit"):
        s = tftoolkit.train(RunConfig(**TINY), out, quiet=True)
    assert s["status"] == "ok" and "holds a JSON list" in caplog.text
    assert json.loads((out / "summary.json").read_text())["status"] == "ok"
