"""Image folders over the memory budget stream from disk: same pixels, same training, bad files named."""

import io

import numpy as np
import pytest

import tftoolkit
from tftoolkit import RunConfig
from tftoolkit.data import catalog, store
from tftoolkit.errors import ConfigError

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


def test_a_folder_over_the_budget_streams_the_same_pixels(folder, caplog):
    in_memory = catalog.load(RunConfig(dataset=str(folder), image_size=16))
    with caplog.at_level("INFO", logger="tftoolkit"):
        streamed = catalog.load(RunConfig(dataset=str(folder), image_size=16, data_memory_gb=TINY_BUDGET))
    assert not in_memory.info["streamed"] and streamed.info["streamed"]
    assert "over the memory budget" in caplog.text and "streaming them from disk" in caplog.text
    assert isinstance(streamed.store("train"), store.FileStore) and not streamed.store("train").in_memory
    assert (streamed.train_examples, streamed.val_examples) == (72, 18)
    for a, b in zip(_examples(in_memory), _examples(streamed)):
        np.testing.assert_array_equal(a, b)


def test_training_on_a_streamed_folder_equals_training_on_it_in_memory(folder, tmp_path):
    base = RunConfig(dataset=str(folder), image_size=16, replicas=2, per_replica_batch=8, epochs=2.0, augment=True,
                     optimizer="momentum", base_lr=0.05, lr_rule="none", measure=False, steps_per_loop=3, **FAST)
    a = tftoolkit.train(base, tmp_path / "memory", quiet=True)
    b = tftoolkit.train(base.replace(data_memory_gb=TINY_BUDGET), tmp_path / "stream", quiet=True)
    assert a["status"] == b["status"] == "ok" and a["data_placement"] == b["data_placement"] == "host"
    assert b["data_placement_reason"] == "auto: the split streams from disk (larger than the memory budget)"
    assert a["final_loss"] == b["final_loss"] and a["val_loss"] == b["val_loss"]
    assert a["examples_per_replica"] == b["examples_per_replica"] == [64, 64]  # 2 epochs of 4 x 16 (8 dropped)


def test_device_placement_of_a_streamed_folder_is_refused(folder, tmp_path):
    cfg = RunConfig(dataset=str(folder), image_size=16, replicas=1, per_replica_batch=8, steps=1,
                    data_memory_gb=TINY_BUDGET, data_placement="device", measure=False, **FAST)
    with pytest.raises(ConfigError, match="streams from disk .*use --data-placement host"):
        tftoolkit.train(cfg, tmp_path / "r", quiet=True)


def test_a_streamed_file_that_does_not_decode_fails_the_run_naming_it(folder, tmp_path):
    import json
    import shutil

    root = tmp_path / "imgs"
    shutil.copytree(folder, root)
    bad = root / "train" / "b" / "3.png"
    bad.write_bytes(bad.read_bytes()[:60])  # the header still parses (what load checks), the pixels are gone
    cfg = RunConfig(dataset=str(root), image_size=16, replicas=1, per_replica_batch=72, steps=2,
                    data_memory_gb=TINY_BUDGET, measure=False, eval_every_epoch=False, **FAST)
    assert catalog.load(cfg).info["skipped_files"] == 0
    with pytest.raises(Exception, match=r"cannot decode .*train/b/3\.png"):
        tftoolkit.train(cfg, tmp_path / "run", quiet=True)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "train/b/3.png" in summary["error"]
