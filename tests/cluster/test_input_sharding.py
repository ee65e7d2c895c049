"""Per-worker input: --input-sharding file gives each worker its own TFRecord shards; streamed folders and file
sharding on 2 localhost workers."""

import io
import json

import numpy as np
import pytest

import tftoolkit
from tftoolkit.config import RunConfig
from tftoolkit.data import registry, shapes
from tftoolkit.errors import ConfigError, DataError

from helpers import FAST


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "shapes"
    shapes.prepare(out, images=400, val_images=40, size=16, seed=0, shard_size=100)  # 4 training shards
    return out


def _ids(source):
    return np.sort(source.store("train").ids)


def test_each_worker_reads_only_its_own_shards(sharded):
    cfg = RunConfig(dataset=str(sharded), input_sharding="file")
    a = registry.load_source(cfg, worker=(0, 2))
    b = registry.load_source(cfg, worker=(1, 2))
    assert a.info["input_sharding"]["shards"] == ["train-00000-of-00004.tfrecord", "train-00002-of-00004.tfrecord"]
    assert b.info["input_sharding"]["shards"] == ["train-00001-of-00004.tfrecord", "train-00003-of-00004.tfrecord"]
    assert a.store("train").n == b.store("train").n == 200 and a.train_examples == 400
    assert not set(_ids(a)) & set(_ids(b)) and sorted(set(_ids(a)) | set(_ids(b))) == list(range(400))
    assert a.store("val").n == 40  # validation is read whole by every worker
    # exact (the default), or one worker: every shard
    assert registry.load_source(RunConfig(dataset=str(sharded)), worker=(0, 2)).store("train").n == 400


def test_too_few_shards_for_the_workers_is_refused_before_any_worker_starts(tmp_path):
    one = tmp_path / "one"
    shapes.prepare(one, images=100, val_images=0, size=16, seed=0, shard_size=100)
    cfg = RunConfig(dataset=str(one), input_sharding="file", workers=2, replicas=2, steps=1)
    with pytest.raises(DataError, match=r"has 1 training shard\(s\) for 2 workers; every worker needs at least one"):
        registry.load_source(cfg, worker=(1, 2))
    with pytest.raises(DataError, match=r"1 training shard\(s\) for 2 workers"):
        tftoolkit.train(cfg, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_file_sharding_needs_tfrecords_and_whole_shards(tmp_path, sharded):
    def refused(match, **kw):
        with pytest.raises(DataError, match=match):
            registry.load_source(RunConfig(input_sharding="file", **kw), worker=(0, 2))

    refused("synthetic data have none", dataset="synthetic")
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    refused(r"divides TFRecord shards among the workers, and \S*imgs has none \(an image folder, TFDS or CIFAR "
            r"folder\); use --input-sharding exact", dataset=str(tmp_path / "imgs"))
    refused("a prefix of the set cannot be taken", dataset=str(sharded), train_images=100)
    with pytest.raises(DataError, match="in-memory and synthetic data have none"):
        registry.check_sharding(RunConfig(input_sharding="file", workers=2), data=(np.zeros((4, 8, 8, 3)), np.zeros(4)))


def test_an_unknown_sharding_names_the_choices():
    with pytest.raises(ConfigError, match="input_sharding: unknown value 'rows'; choose one of exact, file"):
        RunConfig(input_sharding="rows")


@pytest.mark.slow
def test_two_localhost_workers_with_file_sharding_train_their_own_shards(sharded, tmp_path):
    base = dict(dataset=str(sharded), workers=2, replicas=2, per_replica_batch=25, epochs=1.0, steps_per_loop=4,
                optimizer="momentum", base_lr=0.05, lr_rule="none", measure=False, **FAST)
    s = tftoolkit.train(RunConfig(**base, input_sharding="file"), tmp_path / "file", quiet=True)
    assert s["status"] == "ok" and s["input_sharding"] == "file" and s["workers"] == 2
    # An epoch: 8 steps of 50, each worker 25 a step from its own 200 examples, all of them once.
    assert s["steps"] == 8 and s["examples_per_replica"] == [200, 200] and s["dropped_examples"] == 0
    info = json.loads((tmp_path / "file" / "config.json").read_text())["dataset"]["input_sharding"]
    assert info["worker"] == 0 and info["shards"] == ["train-00000-of-00004.tfrecord", "train-00002-of-00004.tfrecord"]
    assert info["examples_per_worker"] == 200 and info["left_out_per_epoch"] == 0


def _png(rng, size):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.slow
def test_a_streamed_folder_on_two_localhost_workers_equals_one_process(tmp_path):
    rng = np.random.default_rng(1)
    root = tmp_path / "imgs"
    for k in range(2):
        for i in range(32):
            p = root / f"c{k}" / f"{i}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(_png(rng, 10 + i % 5))
    base = dict(dataset=str(root), image_size=12, replicas=2, per_replica_batch=8, steps=6, steps_per_loop=3,
                data_memory_gb=1e-6, optimizer="momentum", base_lr=0.05, lr_rule="none", measure=False,
                eval_every_epoch=False, **FAST)
    two = tftoolkit.train(RunConfig(**base, workers=2), tmp_path / "two", quiet=True)
    one = tftoolkit.train(RunConfig(**base), tmp_path / "one", quiet=True)
    assert two["status"] == one["status"] == "ok" and two["workers"] == 2
    assert json.loads((tmp_path / "two" / "config.json").read_text())["dataset"]["streamed"]
    # The ring all-reduce sums in another order than one process: float32 rounding, nothing more.
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=1e-5)
    assert two["examples_per_replica"] == one["examples_per_replica"] == [48, 48]  # 6 steps of 2 x 8
