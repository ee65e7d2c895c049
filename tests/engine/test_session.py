"""tftoolkit.engine.session: every entry point's set-up, with the run's seed, determinism and precision."""

import numpy as np
import pytest

from tftoolkit.config import RunConfig
from tftoolkit.engine import session
from tftoolkit.errors import ConfigError, ModelError

SMALL = dict(dataset="synthetic", image_size=8, train_images=64, per_replica_batch=8)


def test_start_resolves_sets_up_and_loads(cpu_devices):
    sess = session.start(RunConfig(replicas=2, **SMALL))
    assert sess.config.replicas == 2 and sess.setup.replicas == 2 and sess.strategy.num_replicas_in_sync == 2
    assert sess.source.train_examples == 64 and sess.impl == "reduce_to_one"
    assert sess.derived["global_batch"] == 16 and sess.derived["steps_per_epoch"] == 4


def test_start_applies_the_run_s_seed_and_determinism(cpu_devices):
    import keras
    from tensorflow.python.framework import config as tf_config  # is_op_determinism_enabled is not exported

    session.start(RunConfig(replicas=1, seed=3, deterministic=True, **SMALL))
    a = keras.random.uniform((4,)).numpy()
    assert tf_config.is_op_determinism_enabled()
    session.start(RunConfig(replicas=1, seed=3, deterministic=False, **SMALL))
    b = keras.random.uniform((4,)).numpy()
    assert not tf_config.is_op_determinism_enabled()
    np.testing.assert_array_equal(a, b)
    session.start(RunConfig(replicas=1, **SMALL))  # back to the default for later tests


def test_arrays_instead_of_the_dataset_and_no_data(cpu_devices):
    x = np.zeros((40, 4, 4, 3), np.uint8)
    y = np.arange(40) % 10
    sess = session.start({"replicas": 1, "num_classes": 10}, data=(x, y))
    assert sess.source.name == "arrays" and sess.source.train_examples == 40
    assert session.start(RunConfig(replicas=1, **SMALL), load_data=False).source is None


def test_bad_configs_are_config_errors(cpu_devices):
    with pytest.raises(ConfigError, match="unknown config key"):
        session.start({"replica": 2})
    with pytest.raises(ConfigError, match="expected a RunConfig or a dict"):
        session.start(42)


def test_determinism_is_on_where_it_is_free_and_off_where_it_costs():
    from tftoolkit.engine.devices import DeviceSetup

    cpu = DeviceSetup("CPU-simulated", ("/cpu:0", "/cpu:1"), None, 2)
    gpu = DeviceSetup("GPU", ("/gpu:0", "/gpu:1"), (0, 1), 16, (0, 1))
    auto = RunConfig(replicas=2)
    assert auto.deterministic is None
    on, why = session.deterministic_effective(auto, cpu, jit=False)
    assert on and "free on CPU" in why
    on, why = session.deterministic_effective(auto, gpu, jit=False)
    assert not on and "fastest" in why and "--deterministic" in why  # deterministic cuDNN kernels cost throughput
    assert session.deterministic_effective(RunConfig(replicas=2, deterministic=True), gpu, jit=False)[0]
    assert not session.deterministic_effective(RunConfig(replicas=2, deterministic=False), cpu, jit=False)[0]
    # XLA (when it really compiles the step) has no deterministic MaxPool gradient.
    on, why = session.deterministic_effective(RunConfig(replicas=2, deterministic=True, jit=True), gpu, jit=True)
    assert not on and "XLA" in why and "ignored" in why


@pytest.mark.slow
def test_a_run_records_what_determinism_and_jit_it_ran_with(tmp_path):
    import tftoolkit

    s = tftoolkit.train(RunConfig(replicas=2, jit=True, steps=2, measure=False, eval_every_epoch=False,
                                  model="small_cnn", **SMALL), tmp_path / "r", quiet=True)
    assert s["jit"] is True and s["jit_effective"] is False
    assert s["deterministic"] is True and "free on CPU" in s["deterministic_reason"]
    assert s["cross_device_ops"] == "reduce_to_one" and s["cross_device_ops_requested"] == "auto"
    assert s["device_memory_peak_bytes"] is None


def test_an_image_size_whose_batch_cannot_fit_is_refused_before_anything_is_allocated(cpu_devices):
    # 64 images of 100000 x 100000 x 3 float32 are 7.68 TB: refused by name, not a MemoryError from NumPy.
    with pytest.raises(ConfigError, match=r"--image-size 100000: one global batch \(64 images\) is 7680.0 GB as "
                                          r"float32.*free; lower --image-size"):
        session.start(RunConfig(replicas=1, dataset="synthetic", image_size=100_000, model="small_cnn"))


def test_the_memory_check_counts_the_batch_and_the_synthetic_set_against_what_is_free():
    gb = 1e9
    c = RunConfig(replicas=2, per_replica_batch=32, dataset="cifar10", image_size=1000)
    session.check_memory(c, available=gb)  # 64 x 1000 x 1000 x 3 float32 = 0.77 GB
    with pytest.raises(ConfigError, match=r"one global batch \(64 images\) is 0.8 GB as float32.*0.5 GB free"):
        session.check_memory(c, available=0.5 * gb)
    session.check_memory(c, available=None)  # free memory unknown: nothing to check against
    s = RunConfig(replicas=1, dataset="synthetic", image_size=100)
    session.check_memory(s.replace(train_images=64), available=0.3 * gb)  # (64 + 4000) x 30 KB = 0.12 GB
    with pytest.raises(ConfigError, match=r"the synthetic set at --image-size 100 \(16000 \+ 4000 images\) is "
                                          r"0.6 GB.*0.3 GB free; .*--train-images"):
        session.check_memory(s, available=0.3 * gb)  # (16000 + 4000) x 30 KB = 0.6 GB


def test_an_address_space_limit_is_named_at_set_up_with_what_it_risks(cpu_devices, monkeypatch, caplog):
    import logging
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda what: (3_000_000 * 1024, resource.RLIM_INFINITY))
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        session.start(RunConfig(replicas=1, **SMALL))
    said = [r.getMessage() for r in caplog.records if "ulimit -v" in r.getMessage()]
    assert len(said) == 1 and "address-space limit of 3.1 GB" in said[0] and "cgroup" in said[0], said
    monkeypatch.setattr(resource, "getrlimit", lambda what: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        session.start(RunConfig(replicas=1, **SMALL))
    assert not [r for r in caplog.records if "ulimit -v" in r.getMessage()]


def test_a_model_package_in_the_working_folder_is_found_and_a_bad_one_stops_before_the_data(
        tmp_path, monkeypatch, cpu_devices):
    # As a user types it: `tftoolkit train --model mypackage.models:build` beside mypackage/. The console script
    # puts its own folder on sys.path, not the working folder (failed before the fix: ModuleNotFoundError).
    (tmp_path / "mypackage").mkdir()
    (tmp_path / "mypackage" / "__init__.py").write_text("")
    (tmp_path / "mypackage" / "models.py").write_text("def build(input_shape, num_classes):\n    return 'built'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(__import__("sys").modules, "mypackage", raising=False)
    from tftoolkit.engine import models

    assert models.resolve("mypackage.models:build")((8, 8, 3), 10) == "built"

    def read(*args, **kwargs):
        raise AssertionError("the data was read before the model was checked")

    monkeypatch.setattr(session.registry, "load_source", read)
    with pytest.raises(ModelError, match=r"cannot import 'nopackage.models' .*looked in the working folder"):
        session.start(RunConfig(replicas=1, model="nopackage.models:build", **SMALL))
    with pytest.raises(ModelError, match="mypackage.models has no function 'nobuild'"):
        session.start(RunConfig(replicas=1, model="mypackage.models:nobuild", **SMALL))


def test_every_model_name_the_toolkit_lists_passes_the_check_before_the_data():
    # models.resolve runs at set-up, before any data is read: a name models.names() offers (a headless
    # keras.applications variant included) must pass it, and an unknown one must not.
    from tftoolkit.engine import models
    from tftoolkit.errors import ModelError

    for name in models.names():
        assert models.resolve(name) is None, name
    with pytest.raises(ModelError, match="unknown model 'vgg17'"):
        models.resolve("vgg17")


def test_train_resolves_its_config_once_and_names_its_model_once(tmp_path, monkeypatch, cpu_devices):
    # The single-process path resolves before the set-up (the run directory's name and lock need the replicas) and
    # hands the result to start(resolved=True): one resolution of what the user asked, one naming of the callable.
    from tftoolkit.training import api
    from models_for_tests import dense_net  # tests/ is on the path

    calls = {"resolve": 0, "with_model": 0}
    real_resolve, real_with_model = session.resolve, session.with_model

    def resolve(*args, **kwargs):
        calls["resolve"] += 1
        return real_resolve(*args, **kwargs)

    def with_model(*args, **kwargs):
        calls["with_model"] += 1
        return real_with_model(*args, **kwargs)

    monkeypatch.setattr(session, "resolve", resolve)
    monkeypatch.setattr(session, "with_model", with_model)
    ran = []
    monkeypatch.setattr(api, "_run", lambda sess, out, quiet, **kw: ran.append(sess) or {})  # no training
    api.train({"replicas": 2, "steps": 1, **SMALL}, tmp_path / "r", model=dense_net, quiet=True)
    assert calls == {"resolve": 1, "with_model": 1}
    config = ran[0].config
    assert config.replicas == 2 and config.model.endswith("dense_net") and config.num_classes == 10
    assert config.deterministic is True  # decided at set-up (free on CPU replicas) and recorded


def test_start_takes_a_resolved_config_only_when_it_is_one(cpu_devices):
    with pytest.raises(ConfigError, match="resolved=True"):
        session.start({"replicas": 1, **SMALL}, resolved=True)
    sess = session.start(session.resolve(RunConfig(**SMALL)), resolved=True, load_data=False)
    assert sess.config.replicas >= 1 and sess.config.per_replica_batch == 8
