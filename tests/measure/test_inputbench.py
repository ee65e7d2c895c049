"""`tftoolkit bench input` on a dataset that streams: its rate, per core, and against the decode-only ceiling."""

import json
import math

import pytest

from tftoolkit import cli
from tftoolkit.data import stream

import formats


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("inet")
    formats.imagenet_tfrecords(out, classes=3, train=96, validation=8, train_shards=4, validation_shards=1,
                               sizes=(40, 80), seed=1)
    return out


def _bench(capsys, path, *extra):
    rc = cli.main(["bench", "input", "--dataset", str(path), "--replicas", "2", "--global-batch", "16",
                   "--image-size", "32", "--augment", "--seconds", "0.5", "--json", *extra])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out[out.index("{"):])


def test_a_streamed_dataset_reports_its_rate_per_core_and_against_decoding_alone(shards, capsys):
    r = _bench(capsys, shards, "--data-memory-gb", "1e-6")
    assert r["source"] == "stream" and r["input_transform"] == "inception + augment"
    assert r["cores"] == stream.cores() and r["input_threads"]["decode_threads"] == r["cores"]
    assert r["input_threads"]["interleave_cycle"] == 4  # one per shard, at most 16
    assert r["images_per_sec"] > 0 and r["images_per_sec_per_core"] == pytest.approx(r["images_per_sec"] / r["cores"])
    # The ceiling is the same files decoded alone: the whole pipeline cannot be much faster than that.
    assert r["decode_images_per_sec"] > 0
    assert r["decode_ceiling_fraction"] == pytest.approx(r["images_per_sec"] / r["decode_images_per_sec"])
    assert 0 < r["decode_ceiling_fraction"] < 1.5
    assert r["warm_images"] >= 16 and r["train_examples"] == 96


def test_the_same_dataset_in_memory_has_no_decode_ceiling(shards, capsys):
    r = _bench(capsys, shards, "--data-memory-gb", "64")
    assert r["source"] == "memory" and r["input_transform"] == "" and r["input_threads"] == {}
    assert r["decode_images_per_sec"] is None or math.isnan(r["decode_images_per_sec"])
    assert r["cold_images"] == 96 and r["cold_s"] > 0  # decoded once, when it loaded
