"""Every run writes TensorBoard events (read back here with TensorBoard's own reader), HParams, and on request a
profiler trace of chosen steps; a range outside the run is one line and exit code 2."""

import subprocess
import sys
import time
import urllib.request

import pytest

import tftoolkit
from tftoolkit import cli
from tftoolkit.config import RunConfig
from tftoolkit.errors import ConfigError

from helpers import event_accumulator, event_series

SMALL = dict(replicas=2, per_replica_batch=16, steps=12, steps_per_loop=2, dataset="synthetic", image_size=8,
             train_images=128, measure=False, model="small_cnn", timing_warmup_steps=2)





@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("tb") / "run"
    s = tftoolkit.train(RunConfig(**SMALL, profile_steps="5-6", noise_scale=True), out, quiet=True)
    return out, s


def test_scalars_per_step_and_per_epoch_read_back_with_tensorboard(profiled):
    import pandas as pd

    out, s = profiled
    train = event_accumulator(out / "tensorboard" / "train")
    assert {"loss", "learning_rate", "images_per_sec", "step_time_s", "noise_scale"} <= set(train.Tags()["tensors"])
    loss = event_series(train, "loss")
    steps = pd.read_csv(out / "steps.csv")
    assert [st for st, _ in loss] == list(range(1, 13))
    assert [v for _, v in loss] == pytest.approx(steps["loss"].tolist(), rel=1e-6)
    assert [v for _, v in event_series(train, "learning_rate")] == pytest.approx(steps["learning_rate"].tolist(), rel=1e-6)
    assert all(v > 0 for _, v in event_series(train, "images_per_sec"))
    val = event_accumulator(out / "tensorboard" / "validation")
    evals = pd.read_csv(out / "evals.csv")
    assert [st for st, _ in event_series(val, "accuracy")] == evals["step"].tolist()
    assert [v for _, v in event_series(val, "accuracy")] == pytest.approx(evals["val_accuracy"].tolist(), rel=1e-6)
    final = dict(event_series(train, "final/val_accuracy"))
    assert final == {12: pytest.approx(s["val_accuracy"], rel=1e-6)}


def test_the_config_is_written_as_hparams(profiled):
    from tensorboard.plugins.hparams import plugin_data_pb2

    out, _ = profiled
    acc = event_accumulator(out / "tensorboard" / "train")
    content = acc.PluginTagToContent("hparams")
    assert content, "no HParams summary"
    data = plugin_data_pb2.HParamsPluginData.FromString(next(iter(content.values())))
    hp = data.session_start_info.hparams
    assert "global_batch" not in hp and hp["per_replica_batch"].number_value == 16  # None values are left out
    assert hp["model"].string_value == "small_cnn" and hp["replicas"].number_value == 2


def test_a_profiler_trace_of_the_chosen_steps_left_out_of_the_throughput(profiled):
    out, s = profiled
    assert s["profiled_steps"] == "5-6"
    assert s["profile_traces"] and all((out / t).exists() and (out / t).stat().st_size > 0 for t in s["profile_traces"])
    assert s["profile_traces"][0].endswith(".xplane.pb") and "plugins/profile" in s["profile_traces"][0]
    # 12 steps in calls of 2: steps 1-2 warm up, 5-6 are traced: 8 steps are timed.
    assert s["timed_steps"] == 8


@pytest.mark.parametrize("span, message", [
    ("8-20", "profile_steps 8-20 is outside the run: this run has 12 steps"),
    ("6-3", "profile_steps: need 1 <= A <= B, got 6-3"),
    ("five", "profile_steps: expected A-B"),
])
def test_a_bad_profile_range_is_one_line_and_exit_2(tmp_path, capsys, span, message):
    argv = ["train", "--out", str(tmp_path / "r"), "--replicas", "1", "--steps", "12", "--dataset", "synthetic",
            "--image-size", "8", "--train-images", "64", "--no-measure", "--quiet", "--profile-steps", span]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_profile_steps_is_checked_by_the_config():
    with pytest.raises(ConfigError, match="need 1 <= A <= B"):
        RunConfig(profile_steps="0-3")
    assert RunConfig(profile_steps=" 2 - 4 ").profile_range() == (2, 4)


@pytest.mark.slow
def test_the_tensorboard_command_serves_a_run(profiled, tmp_path):
    import socket

    out, _ = profiled
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tftoolkit", "tensorboard", str(out), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=2) as r:
                    runs = r.read().decode()
                if "train" in runs:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()[-2000:]
            time.sleep(0.5)
        assert "train" in runs and "validation" in runs
        # SIGTERM to the command stops TensorBoard and its data server with it (they used to run on under init).
        import psutil

        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
        proc.send_signal(15)
        assert proc.wait(timeout=30) == 0
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        import os
        import signal

        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _sessions(run_dir):
    """(trial ids of the HParams sessions, final/* tags) in a run's train events, over every event file."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    ids, finals = [], set()
    for f in sorted((run_dir / "tensorboard" / "train").glob("events.out.tfevents.*")):
        acc = event_accumulator(f)
        try:
            contents = acc.PluginTagToContent("hparams").values()
        except KeyError:  # this event file holds no HParams
            contents = []
        for content in contents:
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            if data.HasField("session_start_info"):
                ids.append(data.session_start_info.group_name)
        finals |= {t for t in acc.Tags()["tensors"] if t.startswith("final/")}
    return ids, finals


@pytest.mark.slow
def test_every_run_of_a_sweep_is_its_own_hparams_row(tmp_path):
    # Every sweep point's run folder is called "run": the trial id (which TensorBoard groups sessions by) used to be
    # that name, so a whole sweep became one row. Now it is the run's own path.
    for point in ("p0", "p1"):
        tftoolkit.train(RunConfig(**{**SMALL, "steps": 2, "seed": int(point[1])}), tmp_path / point / "run", quiet=True)
    a, _ = _sessions(tmp_path / "p0" / "run")
    b, _ = _sessions(tmp_path / "p1" / "run")
    assert len(a) == len(b) == 1 and a != b and a[0].endswith("p0/run")


@pytest.mark.slow
def test_a_failed_run_writes_no_final_figures_and_a_resumed_run_one_session(tmp_path, monkeypatch):
    from tftoolkit.training import hooks

    out = tmp_path / "run"
    cfg = RunConfig(**{**SMALL, "checkpoint_every": 4, "steps_per_loop": 2})
    real = hooks.LoopHooks.diverged  # the divergence check after each loop call (training/hooks.py)

    def crash(self, losses, first_step):  # a fault at step 8, after the step-4 checkpoint
        if first_step + len(losses) >= 8:
            raise RuntimeError("a node went away")
        return real(self, losses, first_step)

    monkeypatch.setattr(hooks.LoopHooks, "diverged", crash)
    with pytest.raises(RuntimeError):
        tftoolkit.train(cfg, out, quiet=True)
    ids, finals = _sessions(out)
    assert len(ids) == 1 and finals == set()  # failed: no "final" metrics
    monkeypatch.undo()
    s = tftoolkit.train(cfg, out, quiet=True)  # resumes from the step-4 checkpoint
    ids, finals = _sessions(out)
    assert len(ids) == 1 and "final/val_accuracy" in finals  # one session, final figures once it finished
    segs = s["segments"]
    assert [(g["from_step"], g["to_step"], g["status"]) for g in segs] == [(0, 8, "failed"), (4, 12, "ok")]
    assert s["run_wall_time_s"] == pytest.approx(segs[0]["wall_time_s"] + segs[1]["wall_time_s"])
