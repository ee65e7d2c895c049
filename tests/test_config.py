import json
import math

import pytest

from tftoolkit.cli.sections import SECTIONS
from tftoolkit.config import RunConfig, accumulation_plan, cli_fields
from tftoolkit.errors import ConfigError


def test_derived_quantities_linear_rule():
    c = RunConfig(replicas=4, per_replica_batch=100, base_lr=0.1, base_batch=256, lr_rule="linear")
    assert c.global_batch_size == 400
    assert c.per_replica_batch_size == 100
    assert c.learning_rate == pytest.approx(0.1 * 400 / 256)
    assert c.steps_per_epoch(16000) == 40
    assert c.total_steps(16000) == 40


def test_sqrt_and_none_rules_and_global_batch():
    c = RunConfig(replicas=4, global_batch=1024, base_lr=0.001, base_batch=256, lr_rule="sqrt")
    assert c.per_replica_batch_size == 256
    assert c.learning_rate == pytest.approx(0.002)
    assert RunConfig(replicas=2, per_replica_batch=64, lr_rule="none", base_lr=0.3).learning_rate == 0.3


def test_partial_last_batch_counts_a_step_and_drop_does_not():
    assert RunConfig(replicas=3, per_replica_batch=100).steps_per_epoch(1000) == 3
    assert RunConfig(replicas=3, per_replica_batch=100, last_batch="partial").steps_per_epoch(1000) == 4


def test_warmup_and_steps_override():
    c = RunConfig(replicas=1, per_replica_batch=100, epochs=3, warmup_epochs=0.5)
    assert c.total_steps(1000) == 30 and c.warmup_steps(1000) == 5
    assert c.replace(steps=7).total_steps(1000) == 7


def test_from_dict_rejects_unknown_key_by_name():
    with pytest.raises(ConfigError, match="unknown config key.*per_replica_bach"):
        RunConfig.from_dict({"per_replica_bach": 3})


@pytest.mark.parametrize("params, match", [
    ({"replicas": 0}, "replicas must be > 0"),
    ({"per_replica_batch": -1}, "per_replica_batch must be > 0"),
    ({"base_lr": 0.0}, "base_lr must be a finite number > 0"),
    ({"base_lr": -1e-3}, "base_lr"),
    ({"replicas": 3, "global_batch": 100}, "does not divide by replicas=3"),
    ({"lr_rule": "cubic"}, "lr_rule: unknown value 'cubic'"),
    ({"optimizer": "adagrad"}, "optimizer: unknown value"),
    ({"precision": "float8"}, "precision: unknown value"),
    ({"per_replica_batch": "64"}, "per_replica_batch: expected int"),
    ({"per_replica_batch": 6.4}, "per_replica_batch: expected int"),
    ({"jit": 1}, "jit: expected bool"),
    ({"replicas": True}, "replicas: expected int or None"),
    ({"gpus": [0, 0]}, "distinct"),
    ({"gpus": [0, 1], "replicas": 3}, "replicas=3 but gpus names 2"),
    ({"accumulate": 0}, "accumulate must be > 0"),
    ({"accumulate": -2}, "accumulate must be > 0"),
    ({"replicas": 2, "accumulate": 4, "global_batch": 100}, "does not divide by replicas=2 x accumulate=4; use a "
                                                            "multiple of 8, or give --per-replica-batch"),
    ({"replicas": 2, "accumulate": 2, "global_batch": 64, "per_replica_batch": 32}, r"32 x 2 x 2 = 128"),
    ({"accumulate": 2, "last_batch": "partial"}, "--accumulate needs whole batches.*--last-batch drop"),
    ({"allreduce_dtype": "int8"}, "allreduce_dtype: unknown value 'int8'; choose one of float32, bfloat16, float16"),
    ({"allreduce_packs": 0}, "allreduce_packs must be > 0"),
    ({"seed": -1}, r"seed must be a whole number from 0 to 2\*\*32 - 1 = 4294967295"),
    ({"seed": 2**32}, r"seed must be a whole number from 0 to 2\*\*32 - 1 = 4294967295, got 4294967296"),
    ({"seed": 99999999999999999999}, r"seed must be .* got 99999999999999999999"),
])
def test_bad_values_name_the_key(params, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_dict(params)


def test_the_largest_seed_keras_accepts_is_accepted():
    assert RunConfig(seed=2**32 - 1).seed == 2**32 - 1


def test_replicas_unresolved_is_an_error_for_derived_numbers():
    with pytest.raises(ConfigError, match="replicas is not resolved"):
        RunConfig().global_batch_size


def test_ints_accepted_for_floats_and_roundtrip_through_json():
    c = RunConfig.from_dict({"base_lr": 1, "epochs": 2, "gpus": (0, 2)})
    assert isinstance(c.base_lr, float) and c.gpus == [0, 2]
    again = RunConfig.from_dict(json.loads(c.to_json()))
    assert again == c


def test_config_is_frozen():
    c = RunConfig()
    with pytest.raises(Exception):
        c.replicas = 3  # type: ignore[misc]
    assert math.isclose(RunConfig(replicas=1, per_replica_batch=256, base_lr=0.5).learning_rate, 0.5)


def test_accumulation_multiplies_the_global_batch_and_everything_derived_from_it():
    c = RunConfig(replicas=2, per_replica_batch=16, accumulate=4, base_batch=64, lr_rule="linear", base_lr=0.1)
    assert (c.global_batch_size, c.per_replica_batch_size, c.micro_batch_size) == (128, 16, 32)
    assert c.learning_rate == pytest.approx(0.2)  # the LR rule sees the global batch: 128 / 64
    assert c.steps_per_epoch(1000) == 7
    d = c.derived(1000)
    assert (d["global_batch"], d["per_replica_batch"], d["accumulate"]) == (128, 16, 4)
    # Given as a global batch, the micro-batch is what is left after replicas and K.
    g = RunConfig(replicas=2, global_batch=128, accumulate=4)
    assert (g.per_replica_batch_size, g.global_batch_size) == (16, 128)


def test_the_bytes_of_each_all_reduce_dtype_are_tensorflow_s():
    import tensorflow as tf

    from tftoolkit.config import ALLREDUCE_DTYPES, DTYPE_BYTES

    assert set(DTYPE_BYTES) == set(ALLREDUCE_DTYPES)
    assert {d: tf.as_dtype(d).size for d in ALLREDUCE_DTYPES} == DTYPE_BYTES


# --- how a global batch is reached past the memory cap (find-batch, advise, notebook 02) ----------------------
@pytest.mark.parametrize("global_batch, replicas, cap, fixed, per_replica, k", [
    (16384, 64, 128, None, 128, 2),   # 256 per replica in 2 micro-batches of the 128 that fit
    (96, 4, 10, None, 8, 3),          # 24 per replica: 8 is its largest divisor under 10
    (100, 4, 7, None, 5, 5),          # 25: 5 x 5
    (512, 4, 1000, None, 128, 1),     # fits in one pass
    (256, 4, 100, 16, 16, 4),         # the per-replica batch fixed by the user: only K is chosen
])
def test_accumulation_plan_takes_the_largest_per_replica_batch_that_fits(global_batch, replicas, cap, fixed,
                                                                          per_replica, k):
    plan = accumulation_plan(global_batch, replicas, cap, fixed)
    assert (plan["per_replica_batch"], plan["accumulate"]) == (per_replica, k)
    assert plan["per_replica_batch"] * replicas * plan["accumulate"] == global_batch
    # What fits may be narrower than the cap (on CPU: the estimate with the accumulator).
    assert accumulation_plan(1024, 1, 1024, fits=lambda b, k: b <= 300)["per_replica_batch"] == 256


@pytest.mark.parametrize("args, message", [
    ((100, 8, 64), "--target-global-batch 100 does not divide among 8 replica(s): use a multiple of 8 (96 or 104)"),
    ((3, 4, 64), "use a multiple of 4 (4)"),
    ((0, 2, 8), "--target-global-batch must be a whole number of examples > 0, got 0"),
    ((-64, 2, 8), "must be a whole number of examples > 0, got -64"),
    ((100, 4, 64, 16), "--target-global-batch 100 is not a multiple of --per-replica-batch 16 x 4 replica(s) = 64: "
                       "use 64 or 128, or drop --per-replica-batch"),
    ((256, 4, 8, 16), "--per-replica-batch 16 does not fit: the most a replica holds is 8"),
])
def test_accumulation_plan_bad_input_names_the_fix(args, message):
    with pytest.raises(ConfigError) as e:
        accumulation_plan(*args)
    assert message in str(e.value)


def test_a_tensorflow_error_s_first_line_loses_its_wrapping():
    from tftoolkit.errors import first_line

    raw = ValueError("{{function_node __wrapped__Sub_device_/job:localhost/replica:0/task:0/device:CPU:0}} "
                     "Incompatible shapes: [4] vs. [4,10] [Op:Sub] name: \nmore")
    assert first_line(raw) == "Incompatible shapes: [4] vs. [4,10]"
    assert first_line(ValueError("")) == "ValueError" and first_line(KeyError("x" * 400)) == ("'" + "x" * 299)


def test_every_option_is_in_exactly_one_help_section():
    listed = [n for _, names in SECTIONS for n in names]
    assert sorted(listed) == sorted(f.name for f in cli_fields())  # each once, none missing, none unknown
