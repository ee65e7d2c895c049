"""Splits over the memory budget stream from their files (data/stream.py): the same examples as in memory, N
replicas train as one device does, a run resumed mid-epoch as if never interrupted, a bad file named (or skipped,
counted and named)."""

import io
import json
import shutil

import numpy as np
import pandas as pd
import pytest

import tftoolkit
from tftoolkit import RunConfig
from tftoolkit.data import registry, stream
from tftoolkit.errors import ConfigError, DataError

from helpers import FAST

TINY_BUDGET = 1e-6  # GB: any folder is over it


def _png(rng, size):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 classes of random images of mixed sizes, a train/val layout."""
    root = tmp_path_factory.mktemp("stream") / "imgs"
    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("val", 6)):
        for k, name in enumerate(("a", "b", "c")):
            for i in range(n):
                p = root / split / name / f"{i}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(_png(rng, (10 + 3 * i % 17, 12 + k)))
    return root


def _examples(src):
    xs, ys, ids = [], [], []
    for x, y, i in src.train.batch(100).as_numpy_iterator():
        xs.append(x), ys.append(y), ids.append(i)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ids)


def test_a_folder_over_the_budget_streams_the_same_images(folder, caplog):
    in_memory = registry.load(RunConfig(dataset=str(folder), image_size=16))
    with caplog.at_level("INFO", logger="tftoolkit"):
        streamed = registry.load(RunConfig(dataset=str(folder), image_size=16, data_memory_gb=TINY_BUDGET))
    assert not in_memory.info["streamed"] and streamed.info["streamed"]
    assert (in_memory.info["input_source"], streamed.info["input_source"]) == ("memory", "stream")
    assert "over the memory budget" in caplog.text and "streaming them from their files" in caplog.text
    split = streamed.store("train")
    assert isinstance(split, stream.StreamSplit) and not split.in_memory and in_memory.store("train").in_memory
    assert (streamed.train_examples, streamed.val_examples) == (72, 18)
    for a, b in zip(_examples(in_memory), _examples(streamed)):
        np.testing.assert_array_equal(a, b)


def _run(folder, out, **kw):
    base = dict(dataset=str(folder), image_size=16, replicas=1, global_batch=16, epochs=2.0, augment=True,
                optimizer="momentum", base_lr=0.05, base_batch=16, lr_rule="none", measure=False, steps_per_loop=3,
                data_memory_gb=TINY_BUDGET, **{**FAST, "model": "models_for_tests:l2_cnn"})
    return tftoolkit.train(RunConfig(**{**base, **kw}), out, quiet=True)


@pytest.mark.slow
def test_a_stream_on_two_replicas_trains_as_one_device_on_the_same_global_batch(folder, tmp_path):
    # Each global batch is cut into the same consecutive slices on any replica count, and each image's crop and
    # flip are keyed by (seed, epoch, its place in the files), not by who decodes it or when.
    one = _run(folder, tmp_path / "one")
    two = _run(folder, tmp_path / "two", replicas=2)
    assert one["status"] == two["status"] == "ok"
    assert one["input_source"] == two["input_source"] == "stream" and one["input_transform"] == "inception + augment"
    assert two["data_placement_reason"] == "auto: the split streams from disk (larger than the memory budget)"
    assert one["examples_per_replica"] == [128] and two["examples_per_replica"] == [64, 64]  # 2 x 4 steps x 16
    a, b = pd.read_csv(tmp_path / "one" / "steps.csv"), pd.read_csv(tmp_path / "two" / "steps.csv")
    assert len(a) == len(b) == 8 and a["loss"].nunique() == 8  # the loss moved step by step
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-5)


@pytest.mark.slow
def test_a_streamed_run_resumed_mid_epoch_ends_as_if_never_interrupted(folder, tmp_path):
    ref = _run(folder, tmp_path / "ref", checkpoint_every=3)
    out = tmp_path / "run"
    _run(folder, out, checkpoint_every=3)
    # A crash after the step-6 checkpoint, as the damaged-checkpoint test makes one: the rerun starts at step 6,
    # the middle of the second epoch, and re-reads (without decoding) the 2 batches of it already trained on.
    (out / "summary.json").unlink()
    data = out / "checkpoints" / "ckpt-8.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[: len(data.read_bytes()) // 2])
    s = _run(folder, out, checkpoint_every=3)
    assert s["status"] == "ok" and s["resumed_from_step"] == 6 and s["steps"] == 8
    steps, ref_steps = pd.read_csv(out / "steps.csv"), pd.read_csv(tmp_path / "ref" / "steps.csv")
    assert steps["step"].tolist() == list(range(1, 9))
    np.testing.assert_allclose(steps["loss"], ref_steps["loss"], rtol=1e-6)
    assert s["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-6)


def test_device_placement_of_a_streamed_folder_is_refused(folder, tmp_path):
    cfg = RunConfig(dataset=str(folder), image_size=16, replicas=1, per_replica_batch=8, steps=1,
                    data_memory_gb=TINY_BUDGET, data_placement="device", measure=False, **FAST)
    with pytest.raises(ConfigError, match="streams from disk .*use --data-placement host"):
        tftoolkit.train(cfg, tmp_path / "r", quiet=True)


@pytest.mark.slow
def test_a_streamed_file_that_does_not_decode_fails_the_run_naming_it_or_is_skipped_and_counted(folder, tmp_path):
    root = tmp_path / "imgs"
    shutil.copytree(folder, root)
    bad = root / "train" / "b" / "3.png"
    bad.write_bytes(bad.read_bytes()[:60])  # the header still parses (what load reads), the pixels are gone
    cfg = RunConfig(dataset=str(root), image_size=16, replicas=1, per_replica_batch=72, steps=2,
                    data_memory_gb=TINY_BUDGET, measure=False, eval_every_epoch=False, **FAST)
    assert registry.load(cfg).info["skipped_not_image"] == 0  # loading reads headers only: nothing is skipped yet
    with pytest.raises(DataError, match=r"^cannot use \S*train/b/3\.png: .*; --skip-bad-images skips such images"):
        tftoolkit.train(cfg, tmp_path / "strict", quiet=True)
    summary = json.loads((tmp_path / "strict" / "summary.json").read_text())
    assert summary["status"] == "failed" and "train/b/3.png" in summary["error"]

    # --skip-bad-images: the run goes on; every epoch drops the image again, and it is named once.
    s = tftoolkit.train(cfg.replace(skip_bad_images=True), tmp_path / "skip", quiet=True)
    assert s["status"] == "ok" and s["skipped_images"] == 1
    assert len(s["skipped_image_examples"]) == 1 and s["skipped_image_examples"][0].endswith("train/b/3.png")
    log = (tmp_path / "skip" / "skipped-train.tsv").read_text()
    assert "train/b/3.png" in log


@pytest.mark.slow
def test_skip_bad_images_lists_each_bad_file_once_streamed_or_in_memory(folder, tmp_path):
    # Three steps of the whole set: three passes over the two bad files, streamed; one read into memory.
    root = tmp_path / "imgs"
    shutil.copytree(folder, root)
    for bad in (root / "train" / "a" / "5.png", root / "train" / "c" / "9.png"):
        bad.write_bytes(bad.read_bytes()[:60])
    cfg = RunConfig(dataset=str(root), image_size=16, replicas=1, per_replica_batch=70, steps=3, measure=False,
                    eval_every_epoch=False, skip_bad_images=True, **FAST)
    for name, budget in (("stream", TINY_BUDGET), ("memory", None)):
        s = tftoolkit.train(cfg.replace(data_memory_gb=budget), tmp_path / name, quiet=True)
        assert s["status"] == "ok" and s["input_source"] == name and s["skipped_images"] == 2
        rows = (tmp_path / name / "skipped-train.tsv").read_text().splitlines()
        assert sorted(r.split("\t")[0].rsplit("/", 2)[-2] + "/" + r.split("\t")[0].rsplit("/", 1)[-1] for r in rows) \
            == ["a/5.png", "c/9.png"], rows
        assert [r.split("\t")[1] for r in rows] == ["1", "1"]


def test_bad_files_in_a_row_are_each_named_once_however_often_they_are_read(folder, tmp_path):
    root = tmp_path / "imgs"
    shutil.copytree(folder, root)
    for i in (0, 1, 2):  # three in a row in reading order: one gap of 3 before b/3.png
        bad = root / "val" / "b" / f"{i}.png"
        bad.write_bytes(bad.read_bytes()[:60])
    cfg = RunConfig(dataset=str(root), image_size=16, replicas=1, per_replica_batch=8, skip_bad_images=True,
                    data_memory_gb=TINY_BUDGET)
    split = registry.load(cfg).streams["val"]
    split.skip_log = str(tmp_path / "skipped-val.tsv")
    for _ in range(2):  # two passes log each of them twice; the list names each once
        kept = sum(len(y) for _, y in split.eval_dataset(cfg, (1, 1, 0)).as_numpy_iterator())
        assert kept == 15
    n, names = split.skipped()
    assert n == 3 and [p.rsplit("/", 2)[-2:] for p in names] == [["b", "0.png"], ["b", "1.png"], ["b", "2.png"]]
    rows = (tmp_path / "skipped-val.tsv").read_text().splitlines()
    assert [r.rsplit("/", 1)[-1] for r in rows] == ["0.png\t1", "1.png\t1", "2.png\t1"]
    assert split.skipped() == (n, names)  # read again: the same


_PULL = """
import sys, psutil
from tftoolkit.data import stream
split = stream.StreamSplit("s", sys.argv[2:], 8, 2, counts=[int(sys.argv[1])] * (len(sys.argv) - 2))
it = iter(split._unit_records(split._files(), True))
next(it)
before = psutil.Process().memory_info().rss
for _ in range(24):  # every shard open, its read-ahead buffer filled
    next(it)
print(psutil.Process().memory_info().rss - before)
"""


@pytest.mark.slow
def test_the_read_ahead_per_open_shard_is_bounded_not_the_shard(tmp_path):
    # Four open shards of 12 MB against four of 0.5 MB, the same records pulled: the reader's memory must not
    # follow the shards' size (an 8 MB read-ahead per shard held 30 MB more for the large ones).
    import subprocess
    import sys

    import tensorflow as tf

    from helpers import env_with_tests_on_path

    pulls = {}
    for name, per, nbytes in (("small", 8, 64_000), ("large", 192, 64_000)):
        files = [str(tmp_path / f"{name}-{i}") for i in range(4)]
        rng = np.random.default_rng(0)
        for f in files:
            with tf.io.TFRecordWriter(f) as w:
                for _ in range(per):
                    w.write(rng.bytes(nbytes))
        # Each reader its own fresh process (its RSS is its own), the two running side by side.
        pulls[name] = subprocess.Popen([sys.executable, "-c", _PULL, str(per), *files], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True,
                                       env=env_with_tests_on_path(TF_CPP_MIN_LOG_LEVEL="3"))
    growth = {}
    try:
        for name, proc in pulls.items():
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr[-2000:]
            growth[name] = int(stdout.split()[-1])
    finally:
        for proc in pulls.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert growth["large"] - growth["small"] < 12e6, growth
