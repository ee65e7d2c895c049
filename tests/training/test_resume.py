"""A run killed with SIGKILL at a random step resumes from its last checkpoint and ends where an
uninterrupted run ends (same seed, deterministic ops)."""

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

from helpers import checkpoint_variables, checkpointed_step

ARGS = dict(replicas=2, per_replica_batch=32, steps=60, steps_per_loop=5, checkpoint_every=5, measure=False, dataset="synthetic",
            image_size=24, train_images=1280, optimizer="momentum", base_lr=0.05)


def _cli_args(out):
    from tftoolkit.cluster.launch import config_args

    return [sys.executable, "-m", "tftoolkit", "train", "--out", str(out), "--quiet", *config_args(RunConfig(**ARGS))]


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_matches_uninterrupted(tmp_path):
    ref = tftoolkit.train(RunConfig(**ARGS), tmp_path / "ref", quiet=True)
    assert ref["status"] == "ok"

    target = random.Random().choice([10, 20, 30, 40])
    out = tmp_path / "killed"
    proc = subprocess.Popen(_cli_args(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while (out / "checkpoints").exists() is False or checkpointed_step(out) < target:
        assert proc.poll() is None, f"run ended before step {target}: {proc.stderr.read().decode()[-2000:]}"
        assert time.time() < deadline
        time.sleep(0.02)
    time.sleep(random.uniform(0, 0.2))  # somewhere between two checkpoints
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    summary = out / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["status"] != "ok"
    killed_at = checkpointed_step(out)
    assert target <= killed_at < 60

    resumed = tftoolkit.train(RunConfig(**ARGS), out, quiet=True)
    assert resumed["status"] == "ok"
    assert resumed["resumed_from_step"] == killed_at
    assert resumed["steps"] == 60
    assert resumed["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-6)
    assert resumed["examples_per_replica"] == ref["examples_per_replica"] == [1920, 1920]  # 60 steps x 64 / 2
    a, b = checkpoint_variables(tmp_path / "ref"), checkpoint_variables(out)
    assert a.keys() == b.keys() and len([n for n in a if "_trainable_variables" in n]) == 10
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=name)
    # steps.csv holds every step once, as if never interrupted.
    import pandas as pd

    steps = pd.read_csv(out / "steps.csv")
    assert steps["step"].tolist() == list(range(1, 61))
    ref_steps = pd.read_csv(tmp_path / "ref" / "steps.csv")
    np.testing.assert_allclose(steps["loss"], ref_steps["loss"], rtol=1e-6)
