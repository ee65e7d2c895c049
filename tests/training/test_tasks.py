"""Tasks other than image classification through tftoolkit.train (examples/tasks.py): each trains the same on 1 and
2 replicas (the per-example rule of engine/losses.py) and learns; what does not fit is one line before training."""

import sys

import numpy as np
import pandas as pd
import pytest

import tftoolkit
from tftoolkit.config import RunConfig
from tftoolkit.errors import ConfigError

from helpers import ROOT

sys.path.insert(0, str(ROOT))
from examples import tasks  # noqa: E402

RECIPE = dict(global_batch=64, optimizer="adam", base_lr=0.01, lr_rule="none", warmup_epochs=0.0, measure=False,
              steps_per_loop=8)
# epochs, and what "learns" means for each task (chance in brackets)
LEARNS = {
    "regression": (4, lambda s: s["val_loss"] < 0.1 * s["initial_loss"] and s["val_mae"] < 0.8),
    "segmentation": (8, lambda s: s["val_accuracy"] > 0.97),           # [0.86: every pixel background]
    "multi_label": (4, lambda s: s["val_accuracy"] > 0.85),            # [about 0.5 per label]
    "two_inputs": (4, lambda s: s["val_accuracy"] > 0.8 and s["val_loss"] < 0.2 * s["initial_loss"]),  # [0.5]
    "text_classifier": (4, lambda s: s["val_accuracy"] > 0.95),        # [0.5]
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(tasks.ALL))
def test_the_task_trains_alike_on_one_and_two_replicas_and_learns(name, tmp_path):
    data, model, loss, metrics = tasks.ALL[name]()
    epochs, learned = LEARNS[name]
    runs = {}
    for replicas in (1, 2):
        s = tftoolkit.train(RunConfig(replicas=replicas, epochs=epochs, **RECIPE), tmp_path / f"r{replicas}",
                            data=data, model=model, loss=loss, metrics=metrics, quiet=True)
        assert s["status"] == "ok", s["error"]
        runs[replicas] = (s, pd.read_csv(tmp_path / f"r{replicas}" / "steps.csv")["loss"].to_numpy())
    (s1, l1), (s2, l2) = runs[1], runs[2]
    np.testing.assert_allclose(l2, l1, rtol=1e-5)  # N replicas = 1 device, step for step
    assert s2["val_loss"] == pytest.approx(s1["val_loss"], rel=1e-5)
    assert learned(s2), {k: v for k, v in s2.items() if k.startswith(("val_", "initial_loss"))}
    # The given metrics by their names, in summary.json and evals.csv; throughput named for any data.
    evals = pd.read_csv(tmp_path / "r2" / "evals.csv")
    for metric in s2["metrics"]:
        assert f"val_{metric}" in s2 and f"val_{metric}" in evals.columns
    assert s2["examples_per_sec"] == s2["images_per_sec"] > 0


def _regression_run(tmp_path, **kw):
    data, model, loss, metrics = tasks.regression()
    args = dict(data=data, model=model, loss=loss, metrics=metrics, quiet=True)
    args.update(kw)
    return tftoolkit.train(RunConfig(replicas=2, epochs=1, **RECIPE), tmp_path / "run", **args)


def test_a_loss_keras_does_not_know_is_one_line_before_training(tmp_path):
    with pytest.raises(ConfigError, match="unknown loss 'msqe'"):
        _regression_run(tmp_path, loss="msqe")
    assert not (tmp_path / "run" / "steps.csv").exists()


def test_a_loss_without_per_example_values_is_refused_with_the_reason(tmp_path):
    import tensorflow as tf

    def mean_loss(y_true, y_pred):
        return tf.reduce_mean(tf.square(tf.cast(y_true, tf.float32) - y_pred[:, 0]))  # one value for the batch

    with pytest.raises(ConfigError, match="one value for the whole batch, which hides the per-example values"):
        _regression_run(tmp_path, loss=mean_loss)
    assert not (tmp_path / "run" / "steps.csv").exists()


def test_targets_that_do_not_fit_the_outputs_are_named_before_training(tmp_path):
    (x, y, vx, vy), model, _, _ = tasks.regression()
    three = np.stack([y, y, y], 1)  # three targets per example for a model with one output
    with pytest.raises(ConfigError, match=r"loss mse does not fit the model's outputs \(4, 1\) and the targets \(4, 3\)"):
        _regression_run(tmp_path, data=(x, three, vx, np.stack([vy, vy, vy], 1)), model=model)


def test_a_metric_keras_does_not_know_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown metric 'maee'"):
        _regression_run(tmp_path, metrics=["maee"])


def test_a_metric_that_does_not_fit_the_outputs_is_named_before_training(tmp_path):
    with pytest.raises(ConfigError, match=r"metric categorical_crossentropy does not fit the model's outputs \(4, 1\)"):
        _regression_run(tmp_path, metrics=["categorical_crossentropy"])  # one output unit: no classes to cross
    assert not (tmp_path / "run" / "steps.csv").exists()


def test_a_metric_that_does_not_fit_sparse_labels_is_one_line_before_the_first_step(tmp_path, capsys):
    from tftoolkit import cli

    # The default classification task: class indices against 10 logits, which top-k of one-hot targets cannot read.
    rc = cli.main(["train", "--dataset", "synthetic", "--train-images", "64", "--image-size", "8", "--model",
                   "small_cnn", "--per-replica-batch", "16", "--steps", "2", "--metrics", "top_k_categorical_accuracy",
                   "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "metric top_k_categorical_accuracy does not fit the model's outputs (4, 10) and the targets (4,)" in err[0]
    assert not (tmp_path / "run" / "steps.csv").exists()


def test_the_cli_names_a_loss_and_refuses_an_unknown_one_in_one_line(tmp_path, capsys):
    from tftoolkit import cli

    rc = cli.main(["train", "--dataset", "synthetic", "--train-images", "256", "--image-size", "16", "--model",
                   "small_cnn", "--epochs", "1", "--loss", "msqe", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "unknown loss 'msqe'" in err[0], err


@pytest.mark.slow
def test_a_compiled_model_brings_its_loss_and_metrics(tmp_path):
    data, build, _, _ = tasks.regression()

    def compiled(input_shape, num_classes):
        m = build(input_shape, num_classes)
        m.compile(loss="mse", metrics=["mae"])  # the builder compiles; the toolkit's optimizer still trains it
        return m

    s = _regression_run(tmp_path, model=compiled, loss=None, metrics=None)
    assert s["loss"] == "mse" and s["metrics"] == ["mae"] and s["val_mae"] > 0


@pytest.mark.slow
def test_a_callable_loss_gives_its_per_example_values(tmp_path):
    import tensorflow as tf

    def squared(y_true, y_pred):
        return tf.square(tf.cast(y_true, tf.float32) - y_pred[:, 0])  # one value per example

    s = _regression_run(tmp_path, loss=squared, metrics=None)
    named = _regression_run(tmp_path / "named", loss="mse", metrics=None)
    assert s["loss"] == "squared" and s["final_loss"] == pytest.approx(named["final_loss"], rel=1e-5)


def test_augment_and_device_placement_refuse_another_tasks_data(tmp_path):
    data, model, loss, _ = tasks.regression()
    with pytest.raises(ConfigError, match="--augment flips and shifts images"):
        tftoolkit.train(RunConfig(replicas=1, epochs=1, augment=True, **RECIPE), tmp_path / "a", data=data,
                        model=model, loss=loss, quiet=True)
    with pytest.raises(ConfigError, match="--data-placement device holds one image array"):
        tftoolkit.train(RunConfig(replicas=1, epochs=1, data_placement="device", **RECIPE), tmp_path / "d",
                        data=data, model=model, loss=loss, quiet=True)


@pytest.mark.slow
def test_datasets_of_inputs_and_targets_train_as_their_arrays(tmp_path):
    """Several inputs and outputs as tf.data datasets of (inputs, targets) pairs: read once into memory, then the
    same training as the arrays (the same examples, in the same order)."""
    import tensorflow as tf

    (x, y, vx, vy), model, loss, metrics = tasks.two_inputs()
    config = RunConfig(replicas=2, epochs=1, **RECIPE)
    arrays = tftoolkit.train(config, tmp_path / "arrays", data=(x, y, vx, vy), model=model, loss=loss,
                             metrics=metrics, quiet=True)
    pair = (tf.data.Dataset.from_tensor_slices((x, y)), tf.data.Dataset.from_tensor_slices((vx, vy)))
    datasets = tftoolkit.train(config, tmp_path / "datasets", data=pair, model=model, loss=loss, metrics=metrics,
                               quiet=True)
    assert datasets["train_examples"] == arrays["train_examples"] == 1024
    np.testing.assert_array_equal(pd.read_csv(tmp_path / "datasets" / "steps.csv")["loss"],
                                  pd.read_csv(tmp_path / "arrays" / "steps.csv")["loss"])
    assert datasets["val_accuracy"] == arrays["val_accuracy"]
