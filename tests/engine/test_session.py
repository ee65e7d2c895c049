"""tftoolkit.engine.session: every entry point's set-up, with the run's seed, determinism and precision."""

import numpy as np
import pytest

from tftoolkit.config import RunConfig
from tftoolkit.engine import session
from tftoolkit.errors import ConfigError

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
