"""Every dataset format trains through `--dataset` as it comes, with no data flag, and `bench input` reads it.

The data is tiny and written in each format's own layout (tests/formats.py: build_imagenet_data.py's records, CIFAR's
python pickles, tensorflow-datasets' own writer, a folder of mixed-size JPEGs and PNGs); keras.datasets' loader is
replaced by arrays here (tests/data/test_standard_sets.py tests its cache and its offline error)."""

import math

import numpy as np
import pytest

import formats
import tftoolkit
from tftoolkit import RunConfig
from tftoolkit.measure.input import bench as inputbench

from helpers import FAST


def _imagenet(root):
    return formats.imagenet_tfrecords(root / "imagenet", classes=3, train=48, validation=12, train_shards=2,
                                      validation_shards=1, sizes=(24, 48), seed=0) and root / "imagenet"


def _cifar(root):
    return formats.cifar_python(root, kind="cifar10", train_per_batch=10, test=12, seed=0)


def _tfds(root):
    pytest.importorskip("tensorflow_datasets", reason="the tfds extra is not installed")
    return formats.tfds_directory(root / "tfds", train=48, test=12, size=16)


def _folder(root):
    return formats.image_folder(root / "folder", classes=3, train=16, val=4, sizes=(20, 40), seed=0, png_every=3)


def _keras(root, monkeypatch):
    import keras

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 255, (48, 28, 28), dtype=np.uint8), rng.integers(0, 10, 48).astype(np.uint8)
    monkeypatch.setattr(keras.datasets.fashion_mnist, "load_data", lambda: ((x, y), (x[:12], y[:12])))
    return "fashion_mnist"


MAKERS = {"imagenet": _imagenet, "cifar": _cifar, "tfds": _tfds, "folder": _folder}


@pytest.mark.slow
@pytest.mark.parametrize("kind, source, transform", [
    ("imagenet", "imagenet tfrecord", "inception"), ("cifar", "cifar10 python folder", None),
    ("tfds", "tfds", "fixed"), ("folder", "image folder", "inception"), ("keras", "keras.datasets", None)])
def test_each_format_trains_as_it_comes_and_the_input_bench_reads_it(kind, source, transform, tmp_path,
                                                                       monkeypatch):
    dataset = _keras(tmp_path, monkeypatch) if kind == "keras" else MAKERS[kind](tmp_path)
    cfg = RunConfig(dataset=str(dataset), replicas=2, per_replica_batch=4, steps=3, measure=False, **FAST)
    s = tftoolkit.train(cfg, tmp_path / "run", quiet=True)
    assert s["status"] == "ok" and s["steps"] == 3 and s["examples_per_replica"] == [12, 12]
    assert math.isfinite(s["final_loss"]) and math.isfinite(s["val_loss"])  # every format here has a held-out split
    assert s["input_source"] == "memory"  # small: decoded once (the streamed path is tests/data/test_streaming.py)
    import json

    info = json.loads((tmp_path / "run" / "config.json").read_text())["dataset"]
    assert source in info["format"]
    if transform:
        assert info["transform"] == transform
    r = inputbench.measure(cfg, seconds=0.1)
    assert r["source"] == "memory" and r["images_per_sec"] > 0 and r["train_examples"] == s["train_examples"]
