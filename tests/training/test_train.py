import json
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest

import tftoolkit
from tftoolkit import fileio
from tftoolkit.config import RunConfig
from tftoolkit.errors import ModelError, RunDirError

from helpers import FAST, strict_json

SMALL = dict(dataset="synthetic", image_size=16, train_images=1024, steps_per_loop=8, measure=False, **FAST)


@pytest.mark.slow
def test_short_run_learns_and_writes_the_run_directory(tmp_path):
    cfg = RunConfig(replicas=2, global_batch=64, optimizer="adam", base_lr=0.005, lr_rule="none", epochs=3, **SMALL)
    s = tftoolkit.train(cfg, tmp_path / "run", quiet=True)
    assert s["status"] == "ok" and s["error"] is None
    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    assert list(steps.columns) == ["step", "epoch", "loss", "learning_rate", "step_time_s", "call", "timed"]
    assert steps["step"].tolist() == list(range(1, 49))
    first, last = steps["loss"].iloc[:4].mean(), steps["loss"].iloc[-4:].mean()
    assert last < 0.5 * first, (first, last)  # "really learns": loss falls by half
    assert s["val_accuracy"] > 0.3  # 10 classes: chance is 0.1
    # What the summary promises, with the numbers this run implies.
    assert s["replicas"] == 2 and s["device_kind"] == "CPU-simulated"
    assert s["global_batch"] == 64 and s["per_replica_batch"] == 32 and s["learning_rate"] == pytest.approx(0.005)
    assert s["steps"] == 48 and s["epochs"] == pytest.approx(3.0)
    assert s["examples_per_replica"] == [1536, 1536] and s["dropped_examples"] == 0
    assert s["images_per_sec"] > 0 and s["images_per_sec_uncertainty"] >= 0
    assert s["timed_steps"] == 32  # 6 loops of 8 steps; the first two (>= 10 warm-up steps) are not timed
    # steps.csv says which call each step ran in and which calls were timed: a rerun after a kill reads them back.
    assert steps["call"].tolist() == [1 + 8 * (i // 8) for i in range(48)]
    assert steps["timed"].tolist() == [0] * 16 + [1] * 32
    assert s["final_loss"] == pytest.approx(steps["loss"].iloc[-1])
    # The input verdict: the run's own pipeline pulled alone after training, against what training consumed.
    assert s["input_capacity_images_per_sec"] > s["images_per_sec"] and s["input_cores"] >= 1
    assert s["input_headroom"] == pytest.approx(s["input_capacity_images_per_sec"] / s["images_per_sec"])
    # its error: a line through the probe's calls where there were enough of them (measure.input.verdict.rate)
    from tftoolkit.measure.input.verdict import MIN_CALLS

    calls = int(re.search(r" in (\d+) calls", s["input_capacity_method"]).group(1))
    if calls >= MIN_CALLS:
        assert s["input_capacity_uncertainty"] > 0 and " ± " in s["input_note"]
        ips_se = s["images_per_sec_uncertainty"]
        assert s["input_headroom_uncertainty"] > 0 or ips_se is None or math.isnan(ips_se)
    else:
        assert all(s[k] is None or math.isnan(s[k]) for k in ("input_capacity_uncertainty",
                                                               "input_headroom_uncertainty"))
    assert s["input_capacity_per_core"] == pytest.approx(s["input_capacity_images_per_sec"] / s["input_cores"])
    assert s["input_capacity_method"].startswith("measured: ") and s["data_service"] is None
    assert s["input_verdict"] in ("fed", "near") and "share the cores" in s["input_note"]
    cfg_file = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg_file["derived"]["global_batch"] == 64 and cfg_file["config"]["replicas"] == 2
    assert (tmp_path / "run" / "evals.csv").exists()


def test_divergence_stops_the_run_and_is_recorded(tmp_path):
    cfg = RunConfig(replicas=2, per_replica_batch=32, optimizer="sgd", base_lr=300.0, lr_rule="none", epochs=3, **SMALL)
    s = tftoolkit.train(cfg, tmp_path / "div", quiet=True)
    assert s["status"] == "diverged"
    assert "at step" in s["error"]
    assert s["steps"] < 48
    on_disk = json.loads((tmp_path / "div" / "summary.json").read_text())
    assert on_disk["status"] == "diverged"


# One finished run of this config serves the three tests of what a second train() into its folder does; each test
# gets its own copy of the folder.
FINISHED = RunConfig(replicas=1, per_replica_batch=64, steps=2, lr_rule="linear", **SMALL)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "r"
    return out, tftoolkit.train(FINISHED, out, quiet=True)


def _copy_of(finished_run, to):
    shutil.copytree(finished_run[0], to)
    return finished_run[1]


def test_run_directory_with_a_different_config_is_refused_unless_forced(tmp_path, finished_run):
    cfg = FINISHED
    _copy_of(finished_run, tmp_path / "r")
    with pytest.raises(RunDirError, match="differs in base_lr"):
        tftoolkit.train(cfg.replace(base_lr=0.5), tmp_path / "r", quiet=True)
    s = tftoolkit.train(cfg.replace(base_lr=0.5), tmp_path / "r", quiet=True, force=True)
    assert s["learning_rate"] == pytest.approx(0.5 * 64 / 256)


def test_same_config_on_a_finished_run_returns_it_without_training(tmp_path, finished_run):
    first = _copy_of(finished_run, tmp_path / "r")
    again = tftoolkit.train(FINISHED, tmp_path / "r", quiet=True)
    # What the file holds, its nulls (2 steps time nothing) read back as NaN: equal once written the same way.
    assert fileio.jsonable(again) == json.loads((tmp_path / "r" / "summary.json").read_text())
    assert math.isnan(again["images_per_sec"])
    assert again["wall_time_s"] == first["wall_time_s"]


def test_numpy_arrays_through_the_api(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (200, 8, 8, 1)).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) > 0.5).astype("int32")
    cfg = RunConfig(replicas=2, per_replica_batch=25, num_classes=2, steps=4, steps_per_loop=2, measure=False, **FAST)
    s = tftoolkit.train(cfg, tmp_path / "np", quiet=True, data=(x, y))
    assert s["status"] == "ok" and s["dataset"] == "arrays" and math.isnan(s["val_loss"])


def test_mixed_float16_on_cpu_warns_but_runs(tmp_path, caplog):
    cfg = RunConfig(replicas=1, per_replica_batch=32, steps=2, precision="mixed_float16", **SMALL)
    with caplog.at_level("WARNING", logger="tftoolkit"):
        s = tftoolkit.train(cfg, tmp_path / "fp16", quiet=True)
    assert s["status"] == "ok" and "mixed_float16 on CPU" in caplog.text
    import keras

    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("model, match", [
    ("no_such_model", "unknown model 'no_such_model'"),
    ("no_such_pkg.mod:fn", "cannot import 'no_such_pkg.mod'"),
    ("json:dumps", "failed"),
    ("math:pi", "has no function 'pi'"),
])
def test_bad_models_are_clear_errors_and_write_no_ok_summary(tmp_path, model, match):
    cfg = RunConfig(replicas=1, per_replica_batch=32, steps=2, **{**SMALL, "model": model})
    with pytest.raises(ModelError, match=match):
        tftoolkit.train(cfg, tmp_path / "bad", quiet=True)
    summary = tmp_path / "bad" / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["status"] != "ok"


def test_import_path_model(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(
        "import keras\n"
        "def tiny(input_shape, num_classes):\n"
        "    i = keras.Input(input_shape)\n"
        "    return keras.Model(i, keras.layers.Dense(num_classes)(keras.layers.Flatten()(i)))\n"
        "def not_a_model(input_shape, num_classes):\n"
        "    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = RunConfig(replicas=2, per_replica_batch=32, steps=2, **{**SMALL, "model": "mymodels:tiny"})
    assert tftoolkit.train(cfg, tmp_path / "ok", quiet=True)["status"] == "ok"
    with pytest.raises(ModelError, match="returned int, not a keras.Model"):
        tftoolkit.train(cfg.replace(model="mymodels:not_a_model"), tmp_path / "nm", quiet=True)


def test_run_directory_from_before_a_new_config_field_still_resumes(tmp_path, finished_run):
    cfg = FINISHED
    _copy_of(finished_run, tmp_path / "old")
    path = tmp_path / "old" / "config.json"
    written = json.loads(path.read_text())
    del written["config"]["divergence_factor"]  # as if written by a version without that field (default 5.0)
    path.write_text(json.dumps(written))
    assert tftoolkit.train(cfg, tmp_path / "old", quiet=True)["status"] == "ok"


def test_too_few_timed_steps_say_why_there_is_no_rate(tmp_path, caplog):
    with caplog.at_level("INFO", logger="tftoolkit"):
        s = tftoolkit.train(RunConfig(replicas=1, steps=2, steps_per_loop=2, timing_warmup_steps=10,
                                      eval_every_epoch=False, **{k: v for k, v in SMALL.items() if k != "steps_per_loop"}),
                            tmp_path / "r")
    assert math.isnan(s["images_per_sec"]) and s["timed_steps"] == 0
    on_disk = strict_json((tmp_path / "r" / "summary.json").read_text())  # a strict reader takes it: null, not NaN
    assert on_disk["images_per_sec"] is None and on_disk["timed_steps"] == 0
    assert "images/sec not measured: all 2 steps fell in the timing warm-up (--timing-warmup-steps 10" in caplog.text
    assert "nan ± nan" not in caplog.text


@pytest.mark.slow  # a training of ~5 s (test-fast's budget; make test runs it)
def test_accumulation_and_a_16_bit_exchange_are_said_measured_and_recorded(tmp_path, caplog):
    # Through the CLI as a user types it: the derived-arithmetic line, the summary's fields, the breakdown's split.
    from tftoolkit import cli

    argv = ["train", "--out", str(tmp_path / "run"), "--replicas", "2", "--per-replica-batch", "16", "--accumulate",
            "2", "--allreduce-dtype", "bfloat16", "--allreduce-packs", "2", "--dataset", "synthetic", "--image-size",
            "16", "--train-images", "512", "--steps", "12", "--steps-per-loop", "4", "--timing-warmup-steps", "4",
            "--model", "small_cnn", "--warmup-epochs", "0", "--schedule", "constant", "--measure-budget", "1"]
    with caplog.at_level("INFO", logger="tftoolkit"):
        assert cli.main(argv) == 0
    assert "global batch 64 = 16 per replica x 2 x 2 micro-batches accumulated (one all-reduce per optimizer step)" \
        in caplog.text
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (s["global_batch"], s["per_replica_batch"], s["accumulate"]) == (64, 16, 2)
    assert (s["allreduce_dtype"], s["allreduce_packs"]) == ("bfloat16", 2)
    assert s["gradient_bytes"] == 2 * s["params"]  # as moved: two bytes a gradient
    assert s["examples_per_replica"] == [12 * 32, 12 * 32]
    assert s["images_per_sec"] == pytest.approx(64 / s["step_time_s"], rel=0.05)  # examples per optimizer step
    assert s["micro_step_time_s"] == pytest.approx(s["compute_time_s"] / 2)
    assert "(2 micro-steps of" in caplog.text


def test_more_packs_than_gradient_tensors_exit_2_naming_the_most(tmp_path, capsys):
    from tftoolkit import cli

    argv = ["train", "--out", str(tmp_path / "run"), "--replicas", "2", "--allreduce-packs", "99", "--dataset",
            "synthetic", "--image-size", "8", "--train-images", "128", "--steps", "1", "--quiet", "--model",
            "small_cnn", "--no-measure"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--allreduce-packs 99: the model has 10 gradient tensors, so at most 10 packs" in err[0]
