"""shapes16k generation: deterministic bytes, balanced classes, the manifest, atomic writes, the CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tftoolkit import cli
from tftoolkit.data import manifest as manifest_mod, shapes, tfrecords
from tftoolkit.errors import DataError

SMALL = dict(images=400, val_images=100, size=32, seed=0, shard_size=100)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes") / "shapes16k"
    return out, shapes.prepare(out, **SMALL)


def _files(path):
    # The dataset's files; verified.json records local modification times, which differ from copy to copy.
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != manifest_mod.VERIFIED}


def test_same_seed_gives_byte_identical_files_and_another_seed_does_not(small, tmp_path):
    out, manifest = small
    again = shapes.prepare(tmp_path / "again", **SMALL)
    assert _files(out) == _files(tmp_path / "again")
    assert again == manifest
    other = shapes.prepare(tmp_path / "other", **{**SMALL, "seed": 1})
    shas = lambda m: [s["sha256"] for s in m["splits"]["train"]["shards"]]  # noqa: E731
    assert not set(shas(other)) & set(shas(manifest))


@pytest.mark.slow
def test_another_process_writes_the_same_bytes(tmp_path):
    # A different string-hash seed changes the order of any unordered map; the files must not depend on it.
    out = tmp_path / "sub"
    code = f"from tftoolkit.data import shapes; shapes.prepare({str(out)!r}, images=60, val_images=20, shard_size=30)"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
    shapes.prepare(tmp_path / "here", images=60, val_images=20, shard_size=30)
    assert _files(out) == _files(tmp_path / "here")


def test_manifest_lists_balanced_classes_shards_and_provenance(small):
    out, m = small
    assert m == json.loads((out / "manifest.json").read_text())
    assert m["name"] == "shapes16k" and m["format"] == manifest_mod.FORMAT
    assert m["class_names"] == shapes.CLASS_NAMES and m["num_classes"] == 10
    assert m["image_shape"] == [32, 32, 3] and m["image_encoding"] == "raw"
    assert m["splits"]["train"]["per_class"] == {c: 40 for c in shapes.CLASS_NAMES}
    assert m["splits"]["val"]["per_class"] == {c: 10 for c in shapes.CLASS_NAMES}
    train = m["splits"]["train"]["shards"]
    assert [s["file"] for s in train] == [f"train-0000{i}-of-00004.tfrecord" for i in range(4)]
    assert [s["records"] for s in train] == [100] * 4 and [s["first_id"] for s in train] == [0, 100, 200, 300]
    assert [s["file"] for s in m["splits"]["val"]["shards"]] == ["val-00000-of-00001.tfrecord"]
    for s in train + m["splits"]["val"]["shards"]:
        assert manifest_mod.sha256(out / s["file"]) == s["sha256"]
        assert manifest_mod.check_framing(out / s["file"]) == s["records"]
    gen = m["generator"]
    assert gen["version"] == shapes.GENERATOR_VERSION and gen["seed"] == 0 and gen["params"]["images"] == 400
    assert gen["command"].startswith("tftoolkit data prepare --images 400 --val-images 100 --size 32 --seed 0")
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left


def test_labels_are_balanced_for_any_count_and_images_vary():
    labels = shapes.split_labels(1003, seed=3, split="train")
    counts = np.bincount(labels, minlength=10)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 1003
    imgs = shapes.render_shard(0, "train", 0, np.arange(20) % 10, 32)
    assert imgs.shape == (20, 32, 32, 3) and imgs.dtype == np.uint8
    assert len({im.tobytes() for im in imgs}) == 20 and imgs.std() > 20


def test_prepare_is_a_no_op_when_the_same_dataset_is_there(small):
    out, manifest = small
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert shapes.prepare(out, **SMALL) == manifest
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_interrupted_prepare_leaves_no_manifest_pointing_at_missing_shards(small, tmp_path, monkeypatch):
    out = tmp_path / "ds"
    shapes.prepare(out, **SMALL)
    written = []
    real = tfrecords.DatasetWriter.write_shard

    def failing(self, *args, **kwargs):
        if len(written) == 2:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C while the third shard was written
        written.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tfrecords.DatasetWriter, "write_shard", failing)
    with pytest.raises(KeyboardInterrupt):
        shapes.prepare(out, **{**SMALL, "seed": 5})
    assert not (out / "manifest.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert manifest_mod.read_manifest_if_valid(out) is None
    monkeypatch.undo()
    shapes.prepare(out, **{**SMALL, "seed": 5})  # a rerun completes it
    assert manifest_mod.read_manifest_if_valid(out)["generator"]["seed"] == 5


def test_prepare_rejects_bad_arguments(tmp_path):
    with pytest.raises(DataError, match="images must be > 0"):
        shapes.prepare(tmp_path, images=0)


def test_fewer_shards_on_a_rerun_removes_the_old_ones(tmp_path):
    shapes.prepare(tmp_path, images=200, val_images=0, shard_size=50)
    shapes.prepare(tmp_path, images=200, val_images=0, shard_size=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "train-00000-of-00002.tfrecord",
                                                          "train-00001-of-00002.tfrecord", "verified.json"]
    assert sorted(json.loads((tmp_path / "verified.json").read_text())) == ["train-00000-of-00002.tfrecord",
                                                                            "train-00001-of-00002.tfrecord"]


def test_cli_data_prepare(tmp_path, capsys, monkeypatch):
    from tftoolkit.data import shapes

    # TensorFlow is imported through the toolkit's door (tftoolkit/tfimport.py: start-up lines held, objects frozen)
    # when shards are written, and not at all when the folder already holds them: it had printed its start-up lines
    imports = []
    monkeypatch.setattr(shapes, "import_tensorflow", lambda: imports.append(1))
    out = tmp_path / "cli"
    argv = ["data", "prepare", "--out", str(out), "--images", "100", "--val-images", "20", "--size", "16", "--seed",
            "2", "--shard-size", "50"]
    rc = cli.main(argv)
    assert rc == 0 and imports == [1]
    printed = capsys.readouterr().out
    assert "100 train images in 2 shard(s), 20 val images in 1 shard(s), 16x16 RGB, 10 classes" in printed
    assert json.loads((out / "manifest.json").read_text())["image_shape"] == [16, 16, 3]
    assert cli.main(argv) == 0 and imports == [1]  # already prepared: nothing rendered, nothing imported


def test_one_data_home_whatever_the_working_directory(tmp_path, monkeypatch, caplog):
    from tftoolkit.data import home

    monkeypatch.setenv("TFTOOLKIT_DATA_DIR", str(tmp_path / "mine"))
    assert home.default_dir() == tmp_path / "mine" / "shapes16k"
    monkeypatch.delenv("TFTOOLKIT_DATA_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    seen = set()
    for cwd in (tmp_path, tmp_path / "notebooks", tmp_path / "runs" / "sweep" / "runs" / "00"):
        cwd.mkdir(parents=True, exist_ok=True)
        monkeypatch.chdir(cwd)
        seen.add(home.default_dir())
    assert seen == {tmp_path / "cache" / "tftoolkit" / "datasets" / "shapes16k"}
    # A checkout that made ./data/shapes16k before keeps it, with a note.
    (tmp_path / "old" / "data" / "shapes16k").mkdir(parents=True)
    (tmp_path / "old" / "data" / "shapes16k" / "manifest.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "old")
    with caplog.at_level("INFO", logger="tftoolkit"):
        assert home.default_dir() == Path("data") / "shapes16k"
    assert "found in the working directory" in caplog.text
    assert home.describe_home()["shapes16k_prepared"] is True
