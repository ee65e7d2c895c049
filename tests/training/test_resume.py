"""A run killed with SIGKILL at random moments (during a checkpoint's write or between two) resumes from its
last checkpoint and ends where an uninterrupted run ends (same seed, deterministic ops): weights, losses step by
step, and every step in steps.csv once."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tftoolkit
from tftoolkit.config import RunConfig

from helpers import FAST, checkpoint_variables, checkpointed_step, config_option

# --- killed anywhere, four times ----------------------------------------------------------------------------
KILL_ARGS = dict(replicas=2, per_replica_batch=16, steps=48, steps_per_loop=2, checkpoint_every=2, measure=False,
                 dataset="synthetic", image_size=8, train_images=384, optimizer="momentum", base_lr=0.05,
                 timing_warmup_steps=0, **FAST)


def _kill_at_a_random_moment(out, rng, during_save: bool) -> str:
    """Start the run, SIGKILL it at a moment chosen by ``rng`` (while a checkpoint is being written, when
    ``during_save``); returns when it happened ("finished" if the run ended first)."""
    cmd = [sys.executable, "-m", "tftoolkit", "train", "--out", str(out), "--quiet",
           *config_option(RunConfig(**KILL_ARGS), out.parent)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ck = out / "checkpoints"
    start = checkpointed_step(out)
    wait_saves = rng.randint(1, 4)
    deadline = time.time() + 120
    moment = "finished"
    while proc.poll() is None and time.time() < deadline:
        if during_save:
            saving = ck.is_dir() and any(p.name.startswith(".tmp-ckpt-") for p in ck.iterdir())
            if saving and checkpointed_step(out) >= start + 2 * (wait_saves - 1):
                moment = f"during the save after step {checkpointed_step(out)}"
                break
        elif checkpointed_step(out) >= start + 2 * wait_saves:
            time.sleep(rng.uniform(0, 0.05))
            moment = f"between saves after step {checkpointed_step(out)}"
            break
        time.sleep(0.003)  # a save takes tens of ms here: 3 ms still lands inside one, without busy-waiting a core
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        summary = out / "summary.json"
        assert not summary.exists() or json.loads(summary.read_text())["status"] != "ok", "a killed run claimed ok"
    else:
        assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
    return moment


@pytest.mark.slow
def test_killed_at_four_random_moments_a_rerun_always_resumes_and_ends_as_if_never_interrupted(tmp_path):
    ref = tftoolkit.train(RunConfig(**KILL_ARGS), tmp_path / "ref", quiet=True)
    out = tmp_path / "killed"
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # Four kills (two during a save, two between): each costs a process start (about 9 s on 2 cores), and every
    # seed draws new moments, so CI runs cover more of them over time than any one run.
    moments = [_kill_at_a_random_moment(out, rng, during_save=i % 2 == 0) for i in range(4)]
    print(f"seed {seed}: killed {moments}")
    last_saved = checkpointed_step(out)
    # Plain reruns, never --force: each resumes; the last one finishes, from the newest checkpoint.
    final = tftoolkit.train(RunConfig(**KILL_ARGS), out, quiet=True)
    assert final["status"] == "ok" and final["steps"] == 48, (seed, moments)
    if "finished" not in moments:  # else a rerun found the run done and returned its summary
        assert final["resumed_from_step"] == last_saved, (seed, moments)
    assert final["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-6), (seed, moments)
    assert final["examples_per_replica"] == ref["examples_per_replica"] == [768, 768]  # 48 steps x 32 / 2 replicas
    a, b = checkpoint_variables(tmp_path / "ref"), checkpoint_variables(out)
    assert a.keys() == b.keys() and len([n for n in a if "_trainable_variables" in n]) == 10
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=f"{name} (seed {seed}: {moments})")
    # steps.csv holds every step once, with the loss the uninterrupted run had at that step.
    import pandas as pd

    steps, ref_steps = pd.read_csv(out / "steps.csv"), pd.read_csv(tmp_path / "ref" / "steps.csv")
    assert steps["step"].tolist() == list(range(1, 49))
    np.testing.assert_allclose(steps["loss"], ref_steps["loss"], rtol=1e-6, err_msg=f"seed {seed}: {moments}")


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_and_the_run_still_ends_as_if_never_interrupted(tmp_path, caplog):
    args = {**KILL_ARGS, "steps": 12, "checkpoint_every": 4}
    out = tmp_path / "run"
    ref = tftoolkit.train(RunConfig(**args), out, quiet=True)  # uninterrupted: the reference the rerun must end at
    # As a crash right after the last checkpoint leaves it, with that checkpoint's data file then truncated.
    (out / "summary.json").unlink()
    data = out / "checkpoints" / "ckpt-12.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[: len(data.read_bytes()) // 2])
    with caplog.at_level("WARNING", logger="tftoolkit"):
        s = tftoolkit.train(RunConfig(**args), out, quiet=True)
    assert "ckpt-12 does not restore" in caplog.text and "falling back" in caplog.text
    assert s["status"] == "ok" and s["resumed_from_step"] == 8 and s["steps"] == 12
    assert s["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-6)
    import pandas as pd

    assert pd.read_csv(out / "steps.csv")["step"].tolist() == list(range(1, 13))


def test_when_no_checkpoint_restores_the_rerun_exits_2_naming_them(tmp_path, capsys):
    from tftoolkit import cli

    argv = ["train", "--out", str(tmp_path / "run"), "--quiet",
            *config_option(RunConfig(**{**KILL_ARGS, "steps": 4, "checkpoint_every": 2}), tmp_path)]
    assert cli.main(argv) == 0
    (tmp_path / "run" / "summary.json").unlink()
    for index in (tmp_path / "run" / "checkpoints").glob("*.index"):
        index.write_bytes(b"")
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no checkpoint in" in err[0] and "ckpt-4 (" in err[0] and "--force" in err[0]


# --- gradient accumulation across a resume ---------------------------------------------------------------
@pytest.mark.slow  # a training of ~5 s (test-fast's budget; make test runs it)
def test_accumulating_two_replicas_resumed_mid_epoch_equal_one_device_at_four_times_the_batch(tmp_path):
    # 2 replicas x --accumulate 2 x 8 = one device x 32. Checkpoints fall between optimizer steps (the micro-batches'
    # sums live inside one compiled step), so a run stopped after step 6 of 12 per epoch resumes exactly there.
    args = {**KILL_ARGS, "steps": 8, "checkpoint_every": 2, "per_replica_batch": 8, "accumulate": 2}
    one = tftoolkit.train(RunConfig(**{**args, "replicas": 1, "per_replica_batch": 32, "accumulate": 1}),
                          tmp_path / "one", quiet=True)
    out = tmp_path / "run"
    tftoolkit.train(RunConfig(**args), out, quiet=True)
    (out / "summary.json").unlink()  # as a crash after step 6's checkpoint leaves it
    for f in (out / "checkpoints").glob("ckpt-8.*"):
        f.unlink()
    s = tftoolkit.train(RunConfig(**args), out, quiet=True)
    assert s["status"] == "ok" and s["resumed_from_step"] == 6 and s["steps"] == 8
    assert (s["global_batch"], s["per_replica_batch"], s["accumulate"]) == (32, 8, 2) and one["global_batch"] == 32
    assert s["examples_per_replica"] == [128, 128]  # 8 steps x 2 micro-batches x 8
    a, b = checkpoint_variables(tmp_path / "one"), checkpoint_variables(out)
    moved = [n for n in a if "_trainable_variables" in n]
    assert len(moved) == 10
    for name in moved:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)
    import pandas as pd

    np.testing.assert_allclose(pd.read_csv(out / "steps.csv")["loss"], pd.read_csv(tmp_path / "one" / "steps.csv")["loss"],
                               rtol=1e-5)


# --- SIGTERM: what timeout, scancel and a Slurm time limit send ----------------------------------------------
@pytest.mark.slow  # three trainings of 8 steps (~2 s each)
def test_sigterm_checkpoints_records_interrupted_exits_143_and_a_rerun_ends_as_if_never_stopped(tmp_path, monkeypatch,
                                                                                                  capsys):
    from tftoolkit import cli
    from tftoolkit.engine import loop

    args = {**KILL_ARGS, "steps": 8, "checkpoint_every": 4}
    ref = tftoolkit.train(RunConfig(**args), tmp_path / "ref", quiet=True)
    real, calls = loop.timed_call, []

    def sigterm_during_the_third_call(*a, **k):  # steps 5-6, after step 4's checkpoint
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(loop, "timed_call", sigterm_during_the_third_call)
    before = signal.getsignal(signal.SIGTERM)
    argv = ["train", "--out", str(tmp_path / "run"), "--quiet", *config_option(RunConfig(**args), tmp_path)]
    capsys.readouterr()
    assert cli.main(argv) == 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
    assert signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err.strip().splitlines() == ["tftoolkit train: interrupted (SIGTERM)"]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    # The call in flight finished and was saved: nothing trained is lost.
    assert s["status"] == "interrupted" and s["steps"] == 6 and checkpointed_step(tmp_path / "run") == 6
    assert s["error"] == "interrupted by SIGTERM at step 6; run the same command again to resume"
    monkeypatch.setattr(loop, "timed_call", real)
    assert cli.main(argv) == 0
    final = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert final["status"] == "ok" and final["resumed_from_step"] == 6 and final["steps"] == 8
    assert [seg["status"] for seg in final["segments"]] == ["interrupted", "ok"]
    assert final["examples_per_replica"] == ref["examples_per_replica"] == [128, 128]
    assert final["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-6)
    import pandas as pd

    assert pd.read_csv(tmp_path / "run" / "steps.csv")["step"].tolist() == list(range(1, 9))


# --- a kill at an epoch's end, and after the last checkpoint ---------------------------------------------------
class _Killed(BaseException):
    """As a SIGKILL leaves a run: nothing after this point runs, no summary is written (not an Exception)."""


@pytest.mark.slow  # two trainings of 12 steps and a resumed half (~2 s each)
def test_killed_right_after_an_epoch_end_checkpoint_the_rerun_has_that_epochs_evaluation(tmp_path, monkeypatch):
    from tftoolkit.engine.checkpoint import Checkpoints

    # 200 examples, global batch 32: 6 steps an epoch, 8 examples dropped from each; a checkpoint every epoch.
    args = {**KILL_ARGS, "train_images": 200, "steps": 12, "checkpoint_every": 6}
    ref = tftoolkit.train(RunConfig(**args), tmp_path / "ref", quiet=True)
    real = Checkpoints.save

    def killed_after_the_first_epochs_save(self, step):
        real(self, step)
        if step == 6:
            raise _Killed

    monkeypatch.setattr(Checkpoints, "save", killed_after_the_first_epochs_save)
    with pytest.raises(_Killed):
        tftoolkit.train(RunConfig(**args), tmp_path / "run", quiet=True)
    assert checkpointed_step(tmp_path / "run") == 6 and not (tmp_path / "run" / "summary.json").exists()
    monkeypatch.setattr(Checkpoints, "save", real)
    s = tftoolkit.train(RunConfig(**args), tmp_path / "run", quiet=True)
    import pandas as pd

    evals, ref_evals = pd.read_csv(tmp_path / "run" / "evals.csv"), pd.read_csv(tmp_path / "ref" / "evals.csv")
    assert ref_evals["step"].tolist() == [6, 12]
    pd.testing.assert_frame_equal(evals, ref_evals, rtol=1e-6)
    assert s["status"] == "ok" and s["resumed_from_step"] == 6
    assert s["dropped_examples"] == ref["dropped_examples"] == 16
    for k in ("steps", "examples_per_replica", "val_loss", "val_accuracy", "final_loss"):
        assert s[k] == pytest.approx(ref[k], rel=1e-6), k


@pytest.mark.slow  # two trainings of 2 steps (~3-8 s on a busy 2-core host)
def test_a_run_finished_by_its_resume_says_it_measured_nothing_in_valid_fields(tmp_path, caplog):
    from helpers import strict_json

    args = {**KILL_ARGS, "steps": 2, "checkpoint_every": 2}
    tftoolkit.train(RunConfig(**args), tmp_path / "run", quiet=True)
    (tmp_path / "run" / "summary.json").unlink()  # as a kill after the last checkpoint leaves it
    with caplog.at_level("INFO", logger="tftoolkit"):
        s = tftoolkit.train(RunConfig(**args), tmp_path / "run")
    assert s["status"] == "ok" and s["resumed_from_step"] == 2 and s["steps"] == 2 and s["timed_steps"] == 0
    assert "input capacity not measured" not in caplog.text and "TypeError" not in caplog.text
    assert s["input_capacity_method"] == "not measured (this process trained no steps: the run was already trained)"
    assert "images/sec not measured: this process trained no steps (the run was already trained)" in caplog.text
    on_disk = strict_json((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["images_per_sec"] is None and on_disk["input_capacity_images_per_sec"] is None
    assert on_disk["input_verdict"] == ""


@pytest.mark.slow  # two trainings of 8 steps, the second only measuring (~10 s on a busy 2-core host)
def test_a_kill_after_the_last_step_loses_no_measurement_its_rerun_takes_them_again(tmp_path, caplog):
    # SIGKILL while the run measured (after the last step's checkpoint, before the summary) left the rerun "ok" with
    # images/sec, the step times, compute and MFU null for good. Now steps.csv says which calls were timed, so the
    # rerun computes the rates from them, and it measures the input and the breakdown itself.
    args = {**KILL_ARGS, "steps": 8, "checkpoint_every": 8, "measure": True, "measure_budget": 1.0}  # 8 steps: the
    # whole run may go to measuring, so that the rerun takes a breakdown
    ref = tftoolkit.train(RunConfig(**args), tmp_path / "run", quiet=True)
    assert ref["timed_steps"] > 0
    (tmp_path / "run" / "summary.json").unlink()  # as a kill after the last checkpoint leaves it
    with caplog.at_level("INFO", logger="tftoolkit"):
        s = tftoolkit.train(RunConfig(**args), tmp_path / "run")
    assert s["status"] == "ok" and s["resumed_from_step"] == 8 and s["steps"] == 8
    assert s["timed_steps"] == ref["timed_steps"]
    for k in ("images_per_sec", "images_per_sec_uncertainty", "step_time_s", "step_time_p90_s"):
        assert s[k] == pytest.approx(ref[k], rel=1e-9), k  # the same calls, read back from steps.csv
    assert "the earlier process timed" in caplog.text
    assert s["input_capacity_method"].startswith("measured"), s["input_capacity_method"]
    assert s["compute_time_s"] > 0 and s["mfu"] > 0 and "not timed" not in (s.get("measure_error") or "")


def test_the_timed_calls_are_read_back_from_steps_rows():
    from tftoolkit.training.records.files import timed_loops

    nan = float("nan")
    rows = [{"step": 1, "step_time_s": 0.5, "call": 1, "timed": 0}, {"step": 2, "step_time_s": 0.5, "call": 1, "timed": 0},
            {"step": 3, "step_time_s": 0.25, "call": 3, "timed": 1}, {"step": 4, "step_time_s": 0.25, "call": 3, "timed": 1},
            {"step": 5, "step_time_s": 0.2, "call": 5, "timed": 1.0}]
    assert timed_loops(rows) == [(0.5, 2), (0.2, 1)]  # the warm-up call left out; one (seconds, steps) per call
    assert timed_loops([{"step": 1, "step_time_s": 0.3, "call": nan, "timed": nan}]) == []  # an older steps.csv
    assert timed_loops([{"step": 1, "step_time_s": 0.3}]) == []


# --- a signal after the last step, while the run measures ------------------------------------------------------
@pytest.mark.slow  # two trainings of 4 steps with the input probe (~3 s each)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_measuring_after_the_last_step_still_writes_the_summary(tmp_path, monkeypatch, capsys, signum):
    from tftoolkit import cli
    from tftoolkit.measure.input import bench as inputbench

    args = {**KILL_ARGS, "steps": 4, "checkpoint_every": 0}
    real, signals_sent = inputbench.probe, []

    def probe_then_signal(*a, **k):  # the measurement after the last step, as Ctrl-C or SIGTERM meets it
        os.kill(os.getpid(), signum)
        signals_sent.append(signum)
        return real(*a, **k)

    monkeypatch.setattr(inputbench, "probe", probe_then_signal)
    argv = ["train", "--out", str(tmp_path / "run"), "--quiet", *config_option(RunConfig(**args), tmp_path)]
    capsys.readouterr()
    assert cli.main(argv) == 128 + signum and signals_sent == [signum]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    # Measured, then written, then stopped: the rerun has nothing left to do.
    assert s["status"] == "ok" and s["steps"] == 4 and s["timed_steps"] > 0 and s["images_per_sec"] > 0
    assert s["input_capacity_images_per_sec"] is not None and checkpointed_step(tmp_path / "run") == 4
    # Asked twice: it stops at once, and the summary says the measurement is not in it.
    monkeypatch.setattr(inputbench, "probe", lambda *a, **k: (os.kill(os.getpid(), signum), os.kill(os.getpid(), signum)))
    argv[2] = str(tmp_path / "twice")
    assert cli.main(argv) == 128 + signum
    s = json.loads((tmp_path / "twice" / "summary.json").read_text())
    assert s["status"] == "interrupted" and "while measuring after the last step" in s["error"]
    assert s["images_per_sec"] > 0 and checkpointed_step(tmp_path / "twice") == 4
