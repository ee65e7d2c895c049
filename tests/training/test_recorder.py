"""tftoolkit.RunRecorder: a user's own model.fit, under any strategy or none, becomes a run directory with the
numbers the fit implies, locked as train's are, read by the report, the plots, TensorBoard, advise and predict."""

import json
import math
import threading
import time

import numpy as np
import pandas as pd
import pytest

import tftoolkit
from tftoolkit import cli, rundir
from tftoolkit.config import RunConfig
from tftoolkit.errors import ConfigError, RunDirError

from helpers import FAST, assert_no_tensorflow, event_accumulator, event_series, lazy

strategy_mod = lazy("tftoolkit.engine.strategy")
timer = lazy("tftoolkit.engine.timer")  # collected without TensorFlow (tests/helpers.py)

# Every test here runs a model.fit (1-3 s each on 2 cores): make test runs them, make test-fast leaves them out.
pytestmark = pytest.mark.slow

TINY_TRAIN = dict(replicas=1, per_replica_batch=16, steps=2, steps_per_loop=2, dataset="synthetic", image_size=8,
                  train_images=64, measure=False, timing_warmup_steps=0, **FAST)
PARAMS = 8 * 8 * 3 * 3 + 3  # the tiny model: one Dense layer on 8x8x3 inputs, 3 classes


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 8, 8, 3), dtype=np.float32), rng.integers(0, 3, n)


def _model(strategy=None, *, lr=0.1, metrics=("accuracy",), spe=1, name="tiny"):
    import keras
    import tensorflow as tf

    with (strategy or tf.distribute.get_strategy()).scope():
        model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(3)], name=name)
        model.compile(optimizer=keras.optimizers.SGD(lr), metrics=list(metrics), steps_per_execution=spe,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _fit(out, model=None, n=128, batch=32, epochs=1, callbacks=(), **recorder):
    x, y = _data(n)
    rec = tftoolkit.RunRecorder(out, **recorder)
    (model or _model()).fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0,
                            callbacks=[rec, *callbacks])
    return rec


@pytest.fixture(scope="module")
def mirrored2(cpu_devices):
    return strategy_mod.mirrored(cpu_devices.devices[:2])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, mirrored2):
    """A fit under MirroredStrategy over 2 simulated replicas, with validation and two metrics. LR 0 keeps the
    weights where they started, so every step's loss can be computed afresh from its batch."""
    import keras

    out = tmp_path_factory.mktemp("recorder") / "run"
    model = _model(mirrored2, lr=0.0, metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(2, name="top2")])
    x, y = _data(256)
    xv, yv = _data(64, seed=1)
    rec = tftoolkit.RunRecorder(out, warmup_steps=3)
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, validation_data=(xv, yv), verbose=0,
                        callbacks=[rec])
    return out, model, history.history, rec.summary, (x, y)


def test_a_mirrored_fit_writes_the_run_directory_with_its_numbers(recorded):
    out, model, history, s, (x, y) = recorded
    assert {"config.json", "summary.json", "steps.csv", "evals.csv", "monitor.csv", "env.json",
            "tensorboard"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "summary.json").read_text())["steps"] == s["steps"] == 16  # 2 epochs of 256 / 32
    assert s["status"] == "ok" and s["error"] is None
    assert s["replicas"] == 2 and s["replicas_per_worker"] == 2 and s["workers"] == 1
    assert s["devices"] == ["/cpu:0", "/cpu:1"] and s["device_kind"] == "CPU-simulated"
    assert s["global_batch"] == 32 and s["per_replica_batch"] == 16  # counted by Keras' loss tracker
    assert s["steps_per_epoch"] == 8 and s["epochs"] == 2.0 and s["train_examples"] == 256
    assert s["model"] == "tiny" and s["params"] == PARAMS and s["gradient_bytes"] == 4 * PARAMS
    assert s["optimizer"] == "sgd" and s["lr_rule"] == "none"
    steps = pd.read_csv(out / "steps.csv")
    assert list(steps.columns) == ["step", "epoch", "loss", "learning_rate", "step_time_s"]
    assert steps["step"].tolist() == list(range(1, 17)) and steps["epoch"].tolist() == [0] * 8 + [1] * 8
    # The first 3 steps warm up; every other step is timed, and images/sec is the global batch over their mean.
    assert s["timed_steps"] == 13
    assert s["images_per_sec"] == pytest.approx(32 / steps["step_time_s"].iloc[3:].mean(), rel=1e-9)
    assert s["examples_per_sec"] == s["images_per_sec"] and s["images_per_sec_uncertainty"] > 0
    assert s["step_time_p50_s"] == pytest.approx(steps["step_time_s"].iloc[3:].median(), rel=1e-9)
    # Keras logs running means; the recorder's per-step losses are each batch's own loss.
    import keras

    logits = model.predict(x, batch_size=32, verbose=0)
    per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True).numpy()
    expected = per_example.reshape(8, 32).mean(axis=1)
    assert steps["loss"].to_numpy() == pytest.approx(np.tile(expected, 2), rel=1e-4)
    assert s["final_loss"] == pytest.approx(expected[-1], rel=1e-4) and s["initial_loss"] == steps["loss"].iloc[0]
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["strategy"] == "MirroredStrategy" and config["replicas"] == 2 and config["epochs"] == 2
    assert config["steps_per_epoch"] == 8 and config["loss"] == "sparse_categorical_crossentropy"
    assert config["metrics"] == ["accuracy", "top2"] and config["learning_rate"] == 0.0
    env = json.loads((out / "env.json").read_text())
    assert env["tftoolkit"]["devices"] == ["/cpu:0", "/cpu:1"] and env["tensorflow"]["version"]


def test_validation_and_the_given_metrics_reach_the_summary_and_evals(recorded):
    out, _, history, s, _ = recorded
    assert s["val_loss"] == pytest.approx(history["val_loss"][-1]) and s["val_accuracy"] == history["val_accuracy"][-1]
    assert s["val_top2"] == pytest.approx(history["val_top2"][-1])
    assert s["train_accuracy"] == pytest.approx(history["accuracy"][-1])
    assert s["train_top2"] == pytest.approx(history["top2"][-1])
    evals = pd.read_csv(out / "evals.csv")
    assert list(evals.columns)[:5] == ["epoch", "step", "val_loss", "val_accuracy", "val_examples"]
    assert evals["epoch"].tolist() == [0, 1] and evals["step"].tolist() == [8, 16]
    assert evals["val_examples"].tolist() == [64, 64]
    assert evals["val_top2"].tolist() == pytest.approx(history["val_top2"])





def test_tensorboard_events_carry_every_step_and_evaluation(recorded):
    out, _, _, s, _ = recorded
    steps = pd.read_csv(out / "steps.csv")
    train = event_accumulator(out / "tensorboard" / "train")
    tags = set(train.Tags()["tensors"])
    assert {"loss", "learning_rate", "step_time_s", "images_per_sec", "final/images_per_sec"} <= tags
    loss = event_series(train, "loss")
    assert [st for st, _ in loss] == list(range(1, 17))
    assert [v for _, v in loss] == pytest.approx(steps["loss"].tolist(), rel=1e-6)
    assert [v for _, v in event_series(train, "step_time_s")] == pytest.approx(steps["step_time_s"].tolist(), rel=1e-6)
    assert train.PluginTagToContent("hparams")  # the recorded config, as a run's HParams
    val = event_accumulator(out / "tensorboard" / "validation")
    assert [st for st, _ in event_series(val, "top2")] == [8, 16]
    assert event_series(val, "loss")[-1][1] == pytest.approx(s["val_loss"], rel=1e-6)


def test_the_monitor_samples_the_fit_in_its_phases(recorded):
    from tftoolkit.measure.monitor.analysis import read_monitor

    out, _, _, s, _ = recorded
    df = read_monitor(out)
    assert {"warmup", "train"} <= set(df["phase"]) and (df["device"] == "host").any()
    assert s["monitor"]["samples"] >= 1 and s["monitor"]["host"]["cpu_util_mean_pct"] is not None


def test_steps_per_execution_is_timed_per_executed_step(tmp_path):
    # No strategy (Keras 3.15 on TF 2.21 fails steps_per_execution > 1 under MirroredStrategy: keras#19246).
    # 10 steps an epoch in calls of 4, 4 and 2; 4 warm-up steps are the first call.
    rec = _fit(tmp_path / "run", _model(spe=4), n=320, batch=32, epochs=2, warmup_steps=4)
    s = rec.summary
    assert s["steps"] == 20 and s["steps_per_epoch"] == 10 and s["timed_steps"] == 16
    assert s["replicas"] == 1 and s["devices"] == ["/cpu:0"] and s["cross_device_ops"] is None
    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    assert steps["step"].tolist() == list(range(1, 21))
    calls = [(0, 4), (4, 8), (8, 10), (10, 14), (14, 18), (18, 20)]
    for a, b in calls:  # the steps of one call share its time, divided by the steps it ran
        assert steps["step_time_s"].iloc[a:b].nunique() == 1
    per_step = [steps["step_time_s"].iloc[a] for a, _ in calls[1:]]
    assert s["images_per_sec"] == pytest.approx(32 / np.mean(per_step), rel=1e-9)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["steps_per_execution"] == 4
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["strategy"] == "default"


def test_data_of_unknown_length_counts_the_steps_the_last_call_really_ran(tmp_path):
    import tensorflow as tf

    x, y = _data(320)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(32)  # cardinality unknown
    rec = tftoolkit.RunRecorder(tmp_path / "run", warmup_steps=0)
    _model(spe=4).fit(data, epochs=2, verbose=0, callbacks=[rec])
    s = rec.summary
    # Keras numbers the last call's batches as if it ran 4 steps; the optimizer ran 2.
    assert s["steps"] == 20 and s["steps_per_epoch"] == 10 and s["epochs"] == 2.0 and s["global_batch"] == 32
    assert len(pd.read_csv(tmp_path / "run" / "steps.csv")) == 20


class FakeDevice:
    """Asynchronous devices (as tests/engine/test_timer.py has them): work launched by a call goes on after it
    returns, and only timer.sync waits for it."""

    def __init__(self, monkeypatch):
        self.pending, self.syncs = [], 0
        monkeypatch.setattr(timer, "sync", self.sync)

    def launch(self, seconds):
        t = threading.Thread(target=time.sleep, args=(seconds,))
        t.start()
        self.pending.append(t)

    def sync(self):
        self.syncs += 1
        while self.pending:
            self.pending.pop().join()


def test_each_call_is_timed_through_the_synchronising_timer(tmp_path, monkeypatch):
    work = 0.05
    model = _model()
    model.make_train_function()
    real = model.train_function
    dev = FakeDevice(monkeypatch)

    def train_function(iterator):  # returns before the "devices" have finished its work
        dev.launch(work)
        return real(iterator)

    model.train_function = train_function
    rec = _fit(tmp_path / "run", model, n=128, batch=32, epochs=2, warmup_steps=0)
    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    assert len(steps) == 8 and (steps["step_time_s"] >= work).all()
    assert dev.syncs == 8 + 2  # one per call, and one before each epoch's first call
    assert rec.summary["step_time_p50_s"] >= work


def test_a_locked_run_directory_refuses_the_fit_as_it_refuses_train(tmp_path):
    out = tmp_path / "run"
    with rundir.lock(out):
        with pytest.raises(RunDirError, match="is in use.*--force never breaks a live lock") as fit_error:
            _fit(out, force=True)
        with pytest.raises(RunDirError) as train_error:
            tftoolkit.train(RunConfig(**TINY_TRAIN), out, quiet=True)
    assert str(fit_error.value) == str(train_error.value)
    assert not (out / "summary.json").exists()


def test_a_fit_being_recorded_holds_the_lock_against_train(tmp_path):
    import keras

    out, seen = tmp_path / "run", []

    class TrainMeanwhile(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            try:
                tftoolkit.train(RunConfig(**TINY_TRAIN), out, quiet=True)
            except RunDirError as e:
                seen.append(str(e))

    _fit(out, callbacks=[TrainMeanwhile()])
    assert len(seen) == 1 and "is in use" in seen[0]
    rundir.lock(out).release()  # released once the fit has ended


def test_another_run_s_folder_is_refused_unless_forced_and_the_same_fit_is_recorded_again(tmp_path):
    trained, recorded = tmp_path / "trained", tmp_path / "recorded"
    tftoolkit.train(RunConfig(**TINY_TRAIN), trained, quiet=True)
    with pytest.raises(RunDirError, match="holds a different run"):
        _fit(trained)
    assert _fit(trained, force=True).summary["status"] == "ok"
    assert json.loads((trained / "config.json").read_text())["config"]["recorded_with"] == "tftoolkit.RunRecorder"
    _fit(recorded)
    with pytest.raises(RunDirError, match="holds a different run"):
        tftoolkit.train(RunConfig(**TINY_TRAIN), recorded, quiet=True)
    assert _fit(recorded).summary["status"] == "ok"  # the same fit again: recorded again
    with pytest.raises(RunDirError, match=r"holds a different run \(it differs in model \('tiny' there, 'other' now\)"):
        _fit(recorded, _model(name="other"))


def test_an_error_in_a_step_leaves_status_failed_and_the_folder_unlocked(tmp_path):
    import tensorflow as tf

    x, y = _data(320)
    x[150] = np.nan  # in the 5th batch of 32
    data = tf.data.Dataset.from_tensor_slices((x, y)).map(
        lambda a, b: (tf.debugging.check_numerics(a, "a bad image"), b)).batch(32)
    model = _model()
    model.make_train_function()
    keras_own = model.train_function
    rec = tftoolkit.RunRecorder(tmp_path / "run", warmup_steps=0)
    with pytest.raises(tf.errors.InvalidArgumentError):
        model.fit(data, epochs=1, verbose=0, callbacks=[rec])
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    # The node's message, not only TensorFlow's "Graph execution error:" (what it prefixes it with varies).
    assert s["status"] == "failed" and s["error"].startswith("InvalidArgumentError: Graph execution error: ")
    assert "a bad image : Tensor had NaN values" in s["error"] and s["error"].endswith("(after step 4)")
    assert s["steps"] == 4 and len(pd.read_csv(tmp_path / "run" / "steps.csv")) == 4
    assert model.train_function is keras_own  # the recorder's wrapper is gone with the fit
    rundir.lock(tmp_path / "run").release()


def test_ctrl_c_in_a_step_leaves_status_interrupted(tmp_path):
    model = _model()
    model.make_train_function()
    real, calls = model.train_function, []

    def train_function(iterator):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(iterator)

    model.train_function = train_function
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path / "run", model, warmup_steps=0)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["error"] == "interrupted after step 2" and s["steps"] == 2
    assert model.train_function is train_function  # the recorder's wrapper is gone with the fit


def _raise_at_epoch_end():
    import keras

    class Boom(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("a callback after the recorder failed")

    return Boom()


def test_a_fit_that_raises_outside_a_step_is_recorded_as_interrupted_at_exit(tmp_path):
    from tftoolkit.training import recorder

    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="a callback after"):
        _fit(out, callbacks=[_raise_at_epoch_end()])
    assert not (out / "summary.json").exists()  # Keras never called on_train_end
    with pytest.raises(RunDirError, match="is in use"):
        rundir.lock(out)
    recorder._finish_abandoned()  # what runs at exit
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["error"] == recorder.ABANDONED and s["steps"] == 4
    rundir.lock(out).release()


def test_recording_into_the_folder_again_finishes_an_abandoned_recording_first(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError):
        _fit(out, callbacks=[_raise_at_epoch_end()])
    assert _fit(out).summary["status"] == "ok"  # not "in use" by this very process


def test_a_loss_that_blows_up_is_diverged(tmp_path):
    import keras

    model = _model(lr=1e38)
    rec = _fit(tmp_path / "run", model, n=256, callbacks=[keras.callbacks.TerminateOnNaN()], warmup_steps=0)
    assert rec.summary["status"] == "diverged" and "loss became nan" in rec.summary["error"]


def test_only_the_chief_writes(tmp_path, monkeypatch):
    import tensorflow as tf

    extended = type(tf.distribute.get_strategy().extended)
    monkeypatch.setattr(extended, "should_checkpoint", property(lambda self: False), raising=False)
    rec = _fit(tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert rec.summary["steps"] == 4 and rec.summary["global_batch"] == 32


def test_an_explicit_global_batch_is_used_and_bad_arguments_are_refused(tmp_path):
    assert _fit(tmp_path / "run", global_batch=32, warmup_steps=0).summary["images_per_sec"] > 0
    with pytest.raises(ConfigError, match="global_batch must be an integer >= 1"):
        tftoolkit.RunRecorder(tmp_path / "x", global_batch=0)
    with pytest.raises(ConfigError, match="warmup_steps"):
        tftoolkit.RunRecorder(tmp_path / "x", warmup_steps=-1)


def test_importing_tftoolkit_does_not_import_keras_for_the_recorder():
    assert_no_tensorflow("import tftoolkit; assert 'RunRecorder' in tftoolkit.__all__")
    from tftoolkit.training.recorder import RunRecorder

    assert tftoolkit.RunRecorder is RunRecorder


# --- the readers ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scaling_folder(tmp_path_factory, mirrored2):
    """Weak scaling of a user's fit: 32 examples per replica at 1 and 2 replicas, one run directory each."""
    folder = tmp_path_factory.mktemp("fits")
    for replicas, strategy in ((1, None), (2, mirrored2)):
        _fit(folder / f"r{replicas}", _model(strategy), n=256, batch=32 * replicas, epochs=2, warmup_steps=2)
    return folder


def test_the_report_and_the_plots_read_recorded_fits(scaling_folder, tmp_path):
    from matplotlib.figure import Figure

    from tftoolkit.experiments.report import figures as report_figures, results, tables
    from tftoolkit.plots import training

    res = results.load([scaling_folder])
    assert sorted(res.runs["replicas"]) == [1, 2] and (res.runs["status"] == "ok").all()
    table = results.scaling_frame(res)
    assert table["speedup"].iloc[0] == 1.0 and table["efficiency"].notna().all()
    figures = {name: report_figures.figure(res, name) for name in report_figures.FIGURES}  # each draws or says why not
    assert all(f is None or isinstance(f, Figure) for f in figures.values())
    assert all(isinstance(figures[n], Figure) for n in ("throughput", "efficiency", "monitor"))
    assert isinstance(training.plot_loss_curves(res.steps), Figure)
    assert len(tables.overview(res)) == 2
    tables.save_tables(res, tmp_path)
    assert len(pd.read_csv(tmp_path / "runs.csv")) == 2


def test_advise_and_predict_read_a_recorded_fit_and_refuse_in_one_line(scaling_folder, capsys):
    for command in ("advise", "predict"):
        code = cli.main([command, str(scaling_folder / "r1")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code in (0, 2), err  # 1 would be a crash
        if code == 2:
            assert len(err) == 1, err
    assert cli.main(["advise", str(scaling_folder / "r1")]) == 2
    assert "lacks field(s) noise_scale" in capsys.readouterr().err  # a fit records no noise scale


def test_tensorboard_command_finds_a_recorded_fit(scaling_folder, monkeypatch):
    from tftoolkit.cli import experiments

    ran = []
    monkeypatch.setattr(experiments, "run_in_group", lambda cmd: ran.append(cmd) or 0)
    assert cli.main(["tensorboard", str(scaling_folder / "r2")]) == 0
    cmd = ran[0]
    assert cmd[cmd.index("--logdir") + 1] == str(scaling_folder / "r2" / "tensorboard")
    for run in ("r1", "r2"):  # each run's steps in its own event file (one compiled writer serves every run)
        steps = pd.read_csv(scaling_folder / run / "steps.csv")
        loss = event_series(event_accumulator(scaling_folder / run / "tensorboard" / "train"), "loss")
        assert [st for st, _ in loss] == steps["step"].tolist()


def test_a_sweep_point_collects_a_recorded_fit(scaling_folder):
    from tftoolkit.experiments.sweep import folder

    info = folder.collect_runs(scaling_folder / "r2")
    assert info["run_status"] == "ok" and info["figures"]["replicas"] == 2
    assert math.isfinite(info["figures"]["images_per_sec"])


def test_a_strategy_of_another_count_than_init_devices_set_up_is_warned(tmp_path, mirrored2, cpu_devices, caplog,
                                                                        monkeypatch):
    from tftoolkit.engine import devices

    assert devices.configured() == 4  # the suite's set-up (conftest): the 2-replica strategy runs another count
    _fit(tmp_path / "two", _model(mirrored2), n=64)
    assert "the strategy runs 2 replica(s) but tftoolkit.init_devices set up 4 device(s)" in caplog.text
    caplog.clear()
    monkeypatch.setattr(devices, "configured", lambda: 2)  # as after init_devices(2): the same count, no warning
    _fit(tmp_path / "same", _model(mirrored2), n=64)
    assert "init_devices set up" not in caplog.text and (tmp_path / "same" / "summary.json").exists()


def test_hosts_are_the_distinct_machines_of_the_cluster():
    from tftoolkit.training import keras_facts

    class Resolver:
        def __init__(self, spec):
            self.spec = spec

        def cluster_spec(self):
            return type("Spec", (), {"as_dict": lambda _self: self.spec})()

    class Strategy:
        def __init__(self, spec):
            self.cluster_resolver = Resolver(spec)

    two_hosts = Strategy({"chief": ["a:2222"], "worker": ["a:2223", "b:2222", "b:2223"]})
    assert keras_facts.fit_hosts(two_hosts) == 2 and keras_facts.fit_workers(two_hosts) == 4
    assert keras_facts.fit_hosts(object()) == 1  # no cluster: one machine
