"""The tf.data service, client side (data/service.py): a run's training input through a dispatcher's workers.

The servers are processes of `tftoolkit data-service start`, started by fixtures and stopped by pid."""

import socket

import numpy as np
import pandas as pd
import pytest

import tftoolkit
from tftoolkit import cli
from tftoolkit.config import RunConfig
from tftoolkit.errors import ConfigError

from helpers import FAST

SMALL = dict(dataset="synthetic", image_size=16, train_images=512, steps_per_loop=4, measure=False, **FAST)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# --- bad input: one line, exit 2, before anything trains -------------------------------------------------------
@pytest.mark.parametrize("address", ["localhost", "localhost:0", "http://localhost:5050", "a b:1", "host:123456"])
def test_a_malformed_address_is_refused_by_the_config(address):
    with pytest.raises(ConfigError, match="^--data-service .*HOST:PORT"):
        RunConfig(data_service=address)


@pytest.mark.parametrize("seconds", [0, -1, float("inf"), float("nan")])
def test_the_service_deadline_must_be_a_finite_number_of_seconds(seconds):
    with pytest.raises(ConfigError, match="data_service_timeout must be a finite number > 0"):
        RunConfig(data_service="localhost:5050", data_service_timeout=seconds)


def test_a_partial_last_batch_cannot_travel_through_the_service():
    with pytest.raises(ConfigError, match="--last-batch partial cannot go through --data-service"):
        RunConfig(data_service="localhost:5050", last_batch="partial")


def test_an_address_nothing_listens_on_stops_the_run_before_it_reads_data(tmp_path, capsys):
    port = _free_port()
    rc = cli.main(["train", "--replicas", "2", "--dataset", "synthetic", "--data-service", f"localhost:{port}",
                   "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"--data-service localhost:{port}: no tf.data service dispatcher answers there" in err[0]
    assert not (tmp_path / "run" / "config.json").exists()


def test_data_placement_device_is_refused_with_the_service():
    from tftoolkit.engine.feed import choose
    from tftoolkit.engine.devices import DeviceSetup

    setup = DeviceSetup(kind="GPU", devices=("/gpu:0", "/gpu:1"), gpu_indices=(0, 1), host_cores=16)
    assert choose("auto", setup, 10, gpu_memory=10**12, service=True)[0] == "host"
    with pytest.raises(ConfigError, match="--data-placement device cannot go with --data-service"):
        choose("device", setup, 10, gpu_memory=10**12, service=True)


def test_a_pipeline_that_runs_python_per_element_is_refused():
    import tensorflow as tf

    from tftoolkit.data import service

    pure = tf.data.Dataset.range(8).map(lambda i: i * 2)
    service.check_pure(pure)  # no error
    python = tf.data.Dataset.range(8).map(lambda i: tf.py_function(lambda x: x, [i], tf.int64))
    with pytest.raises(ConfigError, match=r"runs Python per element \(EagerPyFunc"):
        service.check_pure(python)
    gen = tf.data.Dataset.from_generator(lambda: iter(range(3)), output_signature=tf.TensorSpec([], tf.int64))
    with pytest.raises(ConfigError, match="needs a pure tf.data pipeline"):
        service.through(gen, "localhost:5050", 1, "job")


# --- training through the service ------------------------------------------------------------------------------
@pytest.mark.slow
def test_one_service_worker_trains_exactly_what_the_local_pipeline_trains(tmp_path):
    """One worker makes the epochs in order, so the run through the service is the local run, loss for loss."""
    import tensorflow as tf

    svc = tf.data.experimental.service
    dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=0))
    worker = svc.WorkerServer(svc.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1],
                                               heartbeat_interval_ms=500))
    try:
        losses = {}
        for name, extra in (("local", {}), ("served", {"data_service": dispatcher.target})):
            cfg = RunConfig(replicas=2, global_batch=64, epochs=2, augment=True, **SMALL, **extra)
            s = tftoolkit.train(cfg, tmp_path / name, quiet=True)
            assert s["status"] == "ok"
            losses[name] = pd.read_csv(tmp_path / name / "steps.csv")["loss"].to_numpy()
        assert s["data_service"] == {"address": dispatcher.target, "mode": "distributed_epoch", "workers": None}
        assert s["data_placement"] == "host" and "tf.data service" in s["data_placement_reason"]
        assert len(losses["served"]) == 16
        np.testing.assert_array_equal(losses["served"], losses["local"])
    finally:
        worker.stop()
        dispatcher.stop()


@pytest.fixture(scope="module")
def two_workers():
    from helpers import data_service

    with data_service(2) as service:
        yield service


@pytest.mark.slow
def test_a_run_through_two_service_workers_learns(two_workers, tmp_path):
    # 4 epochs: at 3 the same recipe run locally ends at 0.43 of its first loss, too near the bar for an order that
    # changes from run to run (two workers: epochs interleave in arrival order); at 4 it ends at 0.18.
    cfg = RunConfig(replicas=2, global_batch=64, optimizer="adam", base_lr=0.005, lr_rule="none", epochs=4,
                    data_service=two_workers.address, **{**SMALL, "train_images": 1024})
    s = tftoolkit.train(cfg, tmp_path / "run", quiet=True)
    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    assert s["status"] == "ok" and s["steps"] == 64
    first, last = steps["loss"].iloc[:4].mean(), steps["loss"].iloc[-4:].mean()
    assert last < 0.5 * first, (first, last)
    assert s["val_accuracy"] > 0.3  # 10 classes: chance is 0.1
    # Every step's global batch whole and split as without the service: each replica trained B/R per step.
    assert s["examples_per_replica"] == [64 * 32, 64 * 32]
    assert s["data_service"]["address"] == two_workers.address and s["input_capacity_images_per_sec"] > 0


@pytest.mark.slow
def test_a_service_worker_killed_mid_run_leaves_the_run_to_the_other(two_workers, tmp_path):
    """The client skips a worker that no longer answers and reads on from the rest: the run finishes (the epoch
    the dead worker was making is lost with it; data/service.py says so). It uses up a worker: only the run whose
    dispatcher is stopped (below) uses this service after it."""
    import threading
    import time

    out = tmp_path / "run"
    killed = {}

    def kill_at_first_checkpoint():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list((out / "checkpoints").glob("*.index")):
            time.sleep(0.05)
        two_workers.workers[0].kill()
        killed["at"] = time.monotonic()

    killer = threading.Thread(target=kill_at_first_checkpoint, daemon=True)
    killer.start()
    cfg = RunConfig(replicas=2, global_batch=64, epochs=6, checkpoint_every=8, data_service=two_workers.address,
                    **SMALL)
    s = tftoolkit.train(cfg, out, quiet=True)
    finished = time.monotonic()
    killer.join(timeout=5)
    assert "at" in killed and killed["at"] < finished, "the worker was not killed while the run trained"
    assert two_workers.workers[0].proc.poll() is not None  # it really is gone
    assert s["status"] == "ok" and s["steps"] == 48  # 6 epochs of 8 steps, all trained after the loss


LOSSES = ("worker-sigkill", "dispatcher-sigterm")


@pytest.fixture(scope="module")
def runs_whose_service_went(two_workers, tmp_path_factory):
    """One run per way of losing the service, side by side: the losses are independent, and most of each run's time
    is a wait (the trainer starting, then the deadline), which the two then share. The killed worker's run has a
    one-worker service of its own; the stopped dispatcher's is the module's (a dispatcher stopped is the whole
    service lost, however many workers it had, and nothing uses that service after it).
    {loss: (service address, trainer's exit code, stderr, run directory)}."""
    import subprocess
    import sys
    import time

    from helpers import FAST_ARGS, ROOT, data_service, env_with_tests_on_path

    runs, trainers = {}, {}
    with data_service(1) as own:
        try:
            for loss, service in zip(LOSSES, (own, two_workers)):
                out = tmp_path_factory.mktemp(loss) / "run"
                args = ["--replicas", "2", "--dataset", "synthetic", "--image-size", "16", "--train-images", "512",
                        "--global-batch", "64", "--epochs", "100", "--steps-per-loop", "4", "--checkpoint-every",
                        "8", "--no-measure", *FAST_ARGS, "--data-service", service.address,
                        "--data-service-timeout", "15"]
                trainers[loss] = (subprocess.Popen(
                    [sys.executable, "-m", "tftoolkit", "train", *args, "--out", str(out), "--quiet"], cwd=ROOT,
                    env=env_with_tests_on_path(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                    service, out)
            deadline = time.monotonic() + 180
            waiting = dict(trainers)
            while waiting:  # each service is lost once its run has a checkpoint
                for loss, (trainer, service, out) in list(waiting.items()):
                    if list((out / "checkpoints").glob("*.index")) or trainer.poll() is not None:
                        if trainer.poll() is None:
                            if loss == "worker-sigkill":
                                service.workers[0].kill()
                            else:
                                service.dispatcher.stop()
                        del waiting[loss]
                assert time.monotonic() < deadline, f"no checkpoint within 180 s: {sorted(waiting)}"
                time.sleep(0.1)
            for loss, (trainer, service, out) in trainers.items():
                # A hang-guard, not a timing: without the deadline the trainer never ends.
                _, stderr = trainer.communicate(timeout=120)
                runs[loss] = (service.address, trainer.returncode, stderr, out)
        finally:
            for trainer, _, _ in trainers.values():
                if trainer.poll() is None:
                    trainer.kill()
                    trainer.wait(timeout=10)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("loss", LOSSES)
def test_a_run_whose_service_is_gone_ends_failed_with_its_checkpoints(runs_whose_service_went, loss):
    """TensorFlow's client waits forever once its only worker is gone, and once its dispatcher is (the worker then
    gets no more of the epoch to make); the run's deadline (--data-service-timeout) ends it: one line naming the
    dispatcher, status failed, the checkpoints kept for a rerun."""
    import json

    address, returncode, stderr, out = runs_whose_service_went[loss]
    line = (f"the tf.data service at {address} delivered nothing for 15 s (--data-service-timeout): check "
            "that its dispatcher runs and that at least one of its workers does (tftoolkit data-service start "
            f"--dispatcher {address}); the checkpoints are kept: run the same command again to resume")
    assert returncode == 1, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].endswith(f"failed: {line}"), stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == line
    assert summary["steps"] >= 8 and summary["steps"] % 4 == 0  # the calls that returned, each of 4 steps
    assert list((out / "checkpoints").glob("*.index"))
