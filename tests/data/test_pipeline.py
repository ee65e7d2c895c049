"""Split accounting on a file-backed dataset: over one epoch every example id reaches exactly one replica.

Iterates the real pipeline (TFRecords -> store -> pipeline.train_input) under MirroredStrategy over
1-4 simulated CPU replicas and looks at what each replica received; then trains end to end and checks the
run summary's examples_per_replica and dropped_examples against the same arithmetic.
"""


import numpy as np
import pytest

import tftoolkit
from tftoolkit.engine import devices
from tftoolkit.data import registry, pipeline, shapes
from tftoolkit.config import RunConfig

from helpers import FAST, lazy

strategy_mod = lazy("tftoolkit.engine.strategy")  # collected without TensorFlow (tests/helpers.py)

N = 400  # training images; 4 shards of 100
# The post-training step-time breakdown (RunConfig.measure, where present) is not what these tests are about
# and costs about 30 s per run on 2 cores.
NO_MEASURE = {"measure": False, **FAST}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("split") / "shapes"
    shapes.prepare(out, images=N, val_images=40, size=32, seed=0, shard_size=100)
    return out


@pytest.fixture(scope="module")
def source(prepared):
    return registry.load(RunConfig(dataset=str(prepared)))


def _ids_per_replica(source, config, epoch=0):
    strategy, _ = strategy_mod.make_strategy(devices.init(config.replicas), "auto")
    per_replica = [[] for _ in range(config.replicas)]
    spe = config.steps_per_epoch(source.train_examples)
    # The input runs on across epochs (one iterator per run): take one epoch's steps of it.
    it = iter(pipeline.train_input(strategy, source, config, start_step=epoch * spe, with_ids=True))
    for _ in range(spe):
        _, labels, ids = next(it)
        ids_r = strategy.experimental_local_results(ids)
        labels_r = strategy.experimental_local_results(labels)
        assert len(ids_r) == config.replicas
        for r, (i, y) in enumerate(zip(ids_r, labels_r)):
            assert i.shape == y.shape  # images, labels and ids are sliced together
            per_replica[r].extend(i.numpy().tolist())
    return per_replica


@pytest.mark.parametrize("last_batch", ["drop", "partial"])
def test_the_training_input_is_endless_so_a_step_takes_its_elements_without_checking_for_the_end(source, last_batch):
    # tf.distribute checks before every step that some replica still has an element (a cond and dummy values; between
    # workers an all-reduce of the counts, every step) unless the dataset is infinite or, on one worker, statically
    # shaped (distribute/input_lib.py's _enable_get_next_as_optional). The epochs' flat_map reads as of unknown
    # length; declared infinite, neither a short last batch's shapes nor several workers bring the check back.
    import tensorflow as tf

    strategy, _ = strategy_mod.make_strategy(devices.init(4), "auto")
    config = RunConfig(replicas=4, per_replica_batch=16, last_batch=last_batch)
    dist = pipeline.train_input(strategy, source, config)
    assert dist.cardinality == tf.data.INFINITE_CARDINALITY
    it = iter(dist)
    assert it._enable_get_next_as_optional is False  # TensorFlow's own switch: renamed, this fails and says so
    # 400 images in global batches of 64: 6 full steps, then (partial) the short one of 16, 4 per replica.
    steps = [[int(x.shape[0]) for x in strategy.experimental_local_results(next(it)[0])] for _ in range(7)]
    assert steps == [[16] * 4] * 6 + [[4] * 4 if last_batch == "partial" else [16] * 4]


def test_evaluation_takes_its_counted_batches_directly_and_every_pass_is_the_split_once(source):
    # The validation split's batches go to every replica, the last one in even pieces (some empty), so each replica
    # has ceil(n / batch) elements a pass; the dataset repeats them, so tf.distribute takes each directly (it would
    # otherwise ask before every batch which replicas still have one: its own switch, as in training above), and
    # one iterator serves every evaluation of a run, each pass starting where the last ended.
    import tensorflow as tf

    strategy, _ = strategy_mod.make_strategy(devices.init(3), "auto")
    config = RunConfig(replicas=3, per_replica_batch=6)  # 40 validation images in batches of 18: 18, 18, 4
    split = pipeline.eval_input(strategy, source, config, with_ids=True)
    assert split.steps == 3 and split.dataset.cardinality == tf.data.INFINITE_CARDINALITY
    it = iter(split.dataset)
    assert it._enable_get_next_as_optional is False
    passes = []
    for _ in range(3):
        batches = [[x.numpy().tolist() for x in strategy.experimental_local_results(next(it)[2])]
                   for _ in range(split.steps)]
        assert [[len(x) for x in b] for b in batches] == [[6] * 3, [6] * 3, [1, 1, 2]]
        passes.append([i for b in batches for x in b for i in x])
    assert sorted(passes[0]) == list(range(40)) and passes[1] == passes[2] == passes[0]


@pytest.mark.parametrize("last_batch", ["drop", "partial"])
def test_a_short_last_batch_keeps_the_input_parallel_under_op_determinism(source, last_batch, capfd):
    # 400 images in global batches of 90 leave a short one of 40. Its pieces were once Dataset.from_tensors inside
    # the epoch's flat_map: a TensorDataset, which tf.data's make_deterministic rewrite (op determinism is on by
    # default on CPU replicas) takes for a nondeterministic stateful op, so it ran the gather serially and the
    # prefetch at 0 (half the host's input rate) and TensorFlow logged "NodeDef mentions attribute
    # use_unbounded_threadpool" at error level, in front of the user.
    import tensorflow as tf

    from helpers import ops_that_serialise_the_pipeline

    tf.config.experimental.enable_op_determinism()  # as session.start does for a deterministic run
    config = RunConfig(dataset="synthetic", replicas=3, per_replica_batch=30, last_batch=last_batch)
    ctx = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=3)
    ds = pipeline.train_elements(source.store("train"), config, ctx)
    assert ops_that_serialise_the_pipeline(ds) == set()
    # Five steps of 3 replicas: an epoch's 4 full steps, then the short one (partial) or the next epoch's first.
    pieces = [len(x[0]) for x in ds.take(3 * 5).as_numpy_iterator()]
    assert pieces == [30] * 12 + ([13, 13, 14] if last_batch == "partial" else [30] * 3)
    assert "use_unbounded_threadpool" not in capfd.readouterr().err


@pytest.mark.parametrize("last_batch", ["drop", "partial"])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_every_example_is_seen_exactly_once_per_epoch(source, replicas, last_batch):
    # Per-replica batch 30: global batch 30/60/90/120, so 400 never divides and there is a short last batch.
    config = RunConfig(dataset="unused", replicas=replicas, per_replica_batch=30, last_batch=last_batch)
    per_replica = _ids_per_replica(source, config)
    seen = [i for ids in per_replica for i in ids]
    dropped = pipeline.dropped_per_epoch(config, N)
    assert len(seen) == len(set(seen)), "an example reached two replicas, or one replica twice"
    assert set(seen) <= set(range(N))
    assert len(seen) == N - dropped  # none lost except the reported drops
    counts = [len(ids) for ids in per_replica]
    full_batches = N // config.global_batch_size
    if last_batch == "drop":
        assert dropped == N % config.global_batch_size and counts == [full_batches * 30] * replicas
    else:
        assert dropped == 0 and set(seen) == set(range(N))
        assert max(counts) - min(counts) <= 1  # the short batch is split as evenly as it can be


def test_global_batch_that_divides_the_set_gives_equal_shares_and_no_drops(source):
    # The reference experiment in miniature: 16000 on 4 x 100 -> 4000 each; here 400 on 4 x 25 -> 100 each.
    config = RunConfig(dataset="unused", replicas=4, per_replica_batch=25)
    per_replica = _ids_per_replica(source, config)
    assert [len(ids) for ids in per_replica] == [100] * 4
    assert sorted(i for ids in per_replica for i in ids) == list(range(N))


def test_each_epoch_is_a_new_order_of_the_same_examples(source):
    config = RunConfig(dataset="unused", replicas=2, per_replica_batch=50)
    e0, e1 = _ids_per_replica(source, config, 0), _ids_per_replica(source, config, 1)
    assert sorted(e0[0] + e0[1]) == sorted(e1[0] + e1[1]) == list(range(N))
    assert e0 != e1
    assert _ids_per_replica(source, config, 0) == e0  # and the same seed gives the same order again


@pytest.mark.slow
@pytest.mark.parametrize("last_batch, replicas, per_replica, dropped, steps", [
    ("drop", 4, [90] * 4, 40, 3),
    ("partial", 3, [133, 133, 134], 0, 5),
])
def test_training_summary_counts_what_each_replica_trained_on(prepared, tmp_path, last_batch, replicas, per_replica,
                                                               dropped, steps):
    # drop: global batch 120 on 4 replicas, 3 full batches (90 per replica) and a short one of 40, dropped.
    # partial: global batch 90 on 3 replicas, 4 full batches (120 per replica) and a short one of 40 that cannot be
    # split evenly (13, 13, 14), trained. These two trainings are also what tests/training/test_train.py's
    # drop and partial tests (3 replicas x 1000 synthetic images each) checked: counted on the devices.
    cfg = RunConfig(dataset=str(prepared), replicas=replicas, per_replica_batch=30, epochs=1, last_batch=last_batch,
                    optimizer="adam", base_lr=0.002, lr_rule="none", steps_per_loop=4,
                    eval_every_epoch=(last_batch == "partial"), **NO_MEASURE)
    s = tftoolkit.train(cfg, tmp_path / last_batch, quiet=True)
    assert s["status"] == "ok" and s["dataset"] == "shapes16k" and s["train_examples"] == N
    assert s["examples_per_replica"] == per_replica and s["dropped_examples"] == dropped
    assert sum(s["examples_per_replica"]) + s["dropped_examples"] == N
    assert dropped == pipeline.dropped_per_epoch(cfg, N)
    if last_batch == "partial":
        assert max(s["examples_per_replica"]) - min(s["examples_per_replica"]) <= 1  # split as evenly as it can be
    assert s["steps"] == steps
    assert np.isfinite(s["val_loss"]) == (last_batch == "partial")  # evaluated on the 40 val images


@pytest.mark.parametrize("replicas", range(1, 9))
def test_every_remainder_is_split_once_over_any_replica_count(replicas):
    # The one split every batch goes through (training, --last-batch partial, evaluation): replica counts 1-8 and
    # every remainder 0..R-1 of a short last batch. Each replica's pieces, gathered in replica order, are the batch
    # order itself; a short batch's slices differ by at most one example, and one of fewer examples than replicas
    # leaves the first replicas empty (the step pads those: engine.feed.pad_empty).
    import tensorflow as tf

    per = 3
    for rest in range(replicas):
        n = 2 * per * replicas + rest
        order = tf.range(n, dtype=tf.int64)
        pieces = [list(pipeline._pieces(order, per * replicas, replicas, r, 1, True).as_numpy_iterator())
                  for r in range(replicas)]
        steps = 2 + (1 if rest else 0)
        assert all(len(p) == steps for p in pieces)
        for step in range(steps):
            got = np.concatenate([pieces[r][step] for r in range(replicas)])
            start = step * per * replicas
            np.testing.assert_array_equal(got, np.arange(start, min(start + per * replicas, n)))
        if rest:
            sizes = [len(pieces[r][-1]) for r in range(replicas)]
            assert sum(sizes) == rest and max(sizes) - min(sizes) <= 1
            assert sizes.count(0) == max(0, replicas - rest)
        # Without partial batches the short one is left out, the full ones are the same.
        dropped = [list(pipeline._pieces(order, per * replicas, replicas, r, 1, False).as_numpy_iterator())
                   for r in range(replicas)]
        assert all(len(p) == 2 for p in dropped)
