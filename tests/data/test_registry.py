"""File-backed sources: shapes16k by name, TFRecord folders (every way they can be broken), image folders."""

import io
import json
import logging
import shutil

import numpy as np
import pytest

from tftoolkit import RunConfig
from tftoolkit.data import registry, manifest as manifest_mod, shapes, tfrecords
from tftoolkit.errors import DataError

from helpers import examples, load_dataset as load

SMALL = dict(images=400, val_images=100, size=32, seed=0, shard_size=100)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds") / "shapes16k"
    shapes.prepare(out, **SMALL)
    return out


@pytest.fixture()
def copy(prepared, tmp_path):
    """A private copy of the small dataset, to break."""
    dst = tmp_path / "copy"
    shutil.copytree(prepared, dst)
    return dst




# --- shapes16k by name ----------------------------------------------------------------------------------------
def test_shapes16k_is_made_in_a_fresh_data_home_on_first_use_then_loaded(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TFTOOLKIT_DATA_DIR", str(tmp_path))
    prepare = shapes.prepare
    calls = []
    monkeypatch.setattr(shapes, "prepare", lambda out, **kw: calls.append(out) or prepare(out, **{**SMALL, **kw}))
    with caplog.at_level(logging.INFO, logger="tftoolkit"):
        src = registry.load(RunConfig(dataset="shapes16k"))
    assert calls == [tmp_path / "shapes16k"] and "shapes16k is not in the data home yet: making it" in caplog.text
    assert (src.train_examples, src.val_examples) == (400, 100)
    registry.load(RunConfig(dataset="shapes16k"))
    assert len(calls) == 1  # made once


def test_ensure_shapes16k_prepares_on_first_use_then_loads_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("TFTOOLKIT_DATA_DIR", str(tmp_path))
    path = registry.ensure_shapes16k(images=200, val_images=50, shard_size=100)
    assert path == tmp_path / "shapes16k" and (path / "manifest.json").exists()
    src = registry.load(RunConfig(dataset="shapes16k"))
    assert src.name == "shapes16k" and src.train_examples == 200 and src.val_examples == 50


# --- TFRecord folders -----------------------------------------------------------------------------------------
def test_tfrecord_source_yields_every_example_once_with_its_label(prepared):
    src = load(prepared)
    assert (src.name, src.train_examples, src.val_examples) == ("shapes16k", 400, 100)
    assert src.input_shape == (32, 32, 3) and src.num_classes == 10 and src.class_names == shapes.CLASS_NAMES
    assert src.info["shards"] == 4 and src.info["val_shards"] == 1 and src.info["sha256_verified"]
    x, y, ids = examples(src.train)
    assert x.dtype == np.uint8 and x.shape == (400, 32, 32, 3)
    assert sorted(ids) == list(range(400))
    order = np.argsort(ids)
    assert np.array_equal(y[order], shapes.split_labels(400, 0, "train"))
    first = shapes.render_shard(0, "train", 0, shapes.split_labels(400, 0, "train")[:100], 32)
    assert np.array_equal(x[order][:100], first)  # the bytes written are the pixels rendered
    _, vy, vids = examples(src.val)
    assert sorted(vids) == list(range(100)) and np.bincount(vy).tolist() == [10] * 10


def test_tfrecords_are_resized_to_image_size_with_a_warning(prepared, caplog):
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        src = load(prepared, image_size=16)
    assert src.input_shape == (16, 16, 3) and "resizing them to 16x16" in caplog.text
    x, _, _ = examples(src.train.take(10))
    assert x.shape == (10, 16, 16, 3)


def test_a_manifest_set_over_the_memory_budget_streams_the_same_images(prepared):
    in_memory = load(prepared, image_size=16)
    streamed = load(prepared, image_size=16, data_memory_gb=1e-6)
    assert (in_memory.info["input_source"], streamed.info["input_source"]) == ("memory", "stream")
    assert streamed.streamed and not streamed.store("train").in_memory and streamed.store("val") is not None
    assert (streamed.train_examples, streamed.val_examples, streamed.input_shape) == (400, 100, (16, 16, 3))
    assert streamed.info["format"] == "tfrecord" and streamed.class_names == shapes.CLASS_NAMES
    for split in ("train", "val"):
        a, b = examples(getattr(in_memory, split)), examples(getattr(streamed, split))
        order_a, order_b = np.argsort(a[2]), np.argsort(b[2])
        for x, y in zip(a, b):  # the same pixels, labels and ids (in memory the shards interleave otherwise)
            np.testing.assert_array_equal(x[order_a], y[order_b])


def test_sha256_mismatch_names_the_shard(copy):
    f = copy / "train-00002-of-00004.tfrecord"
    data = bytearray(f.read_bytes())
    data[5000] ^= 0xFF  # same length, one byte changed
    f.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"train-00002-of-00004\.tfrecord does not match the sha256 .*re-create it "
                                        r"with `tftoolkit data prepare --images 400"):
        load(copy)


def _no_hashing(monkeypatch):
    def refuse(path):
        raise AssertionError(f"hashed {path}")

    monkeypatch.setattr(manifest_mod, "sha256", refuse)


def test_cached_verification_hashes_a_shard_once_until_it_changes(copy, monkeypatch):
    load(copy)  # first use: every shard hashed, the result recorded beside the manifest
    recorded = json.loads((copy / manifest_mod.VERIFIED).read_text())
    assert sorted(recorded) == sorted(p.name for p in copy.glob("*.tfrecord"))
    with monkeypatch.context() as m:
        _no_hashing(m)
        src = load(copy)  # nothing changed: nothing hashed again
        assert src.info["verify"] == "cached" and src.train_examples == 400
    # A shard written since (new mtime) is checked again, and a damaged one is named.
    f = copy / "train-00002-of-00004.tfrecord"
    data = bytearray(f.read_bytes())
    data[5000] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"train-00002-of-00004\.tfrecord does not match the sha256"):
        load(copy)


def test_full_verification_catches_what_size_and_mtime_cannot(copy, monkeypatch):
    import os

    load(copy)
    f = copy / "train-00001-of-00004.tfrecord"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[5000] ^= 0xFF
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: what cached trusts
    manifest = manifest_mod.read_manifest(copy)
    manifest_mod.verify(copy, manifest, "cached")  # passes: the change is invisible to size and mtime ...
    with pytest.raises(DataError, match=r"cannot read .*train-00001-of-00004\.tfrecord: .*corrupted record"):
        load(copy, verify="cached")  # ... but the record scan reads the damaged record and names its file
    with pytest.raises(DataError, match=r"train-00001-of-00004\.tfrecord does not match the sha256"):
        load(copy, verify="full")


def test_verify_off_hashes_nothing_but_still_wants_every_shard(copy, monkeypatch):
    _no_hashing(monkeypatch)
    src = load(copy, verify="off")
    assert src.info["verify"] == "off" and not src.info["sha256_verified"]
    (copy / "val-00000-of-00001.tfrecord").unlink()
    with pytest.raises(DataError, match=r"val-00000-of-00001\.tfrecord named in .* is missing"):
        load(copy, verify="off")


def test_an_unknown_verify_mode_names_the_choices():
    from tftoolkit.errors import ConfigError

    with pytest.raises(ConfigError, match="verify: unknown value 'some'; choose one of full, cached, off"):
        RunConfig(verify="some")


def test_truncated_tfrecord_is_named(copy):
    f = copy / "train-00001-of-00004.tfrecord"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"train-00001-of-00004\.tfrecord is truncated: record 99 needs bytes up to"):
        load(copy)


def test_missing_shard_is_named(copy):
    (copy / "val-00000-of-00001.tfrecord").unlink()
    with pytest.raises(DataError, match=r"shard val-00000-of-00001\.tfrecord named in .* is missing"):
        load(copy)


def test_record_count_differing_from_the_manifest(copy):
    m = json.loads((copy / "manifest.json").read_text())
    m["splits"]["train"]["shards"][0]["records"] = 99
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"train-00000-of-00004\.tfrecord has 100 records but the manifest says 99"):
        load(copy)


def _write(path, images, labels, class_names=("a", "b", "c")):
    w = tfrecords.DatasetWriter(path, name="custom", class_names=list(class_names), image_shape=images.shape[1:])
    w.write_shard("train", 0, 1, images, np.asarray(labels), 0)
    w.finish(per_class={})


def test_label_out_of_range_is_named(tmp_path):
    _write(tmp_path, np.zeros((6, 8, 8, 3), np.uint8), [0, 1, 2, 0, 7, 1])
    with pytest.raises(DataError, match=r"label out of range in .*train-00000-of-00001\.tfrecord: record 4 has label 7 "
                                        r"but the manifest has 3 classes"):
        load(tmp_path, image_size=8)


def test_a_manifest_whose_training_labels_are_all_one_class_is_refused(tmp_path):
    _write(tmp_path, np.zeros((6, 8, 8, 3), np.uint8), [1] * 6)
    with pytest.raises(DataError, match=r"training records .* all have label 1 \('b'\); a classifier needs at "
                                        r"least two classes"):
        load(tmp_path, image_size=8)


def test_image_size_mismatch_with_the_manifest(tmp_path):
    _write(tmp_path, np.zeros((4, 8, 8, 3), np.uint8), [0, 1, 2, 0])
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["image_shape"] = [10, 10, 3]
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"image size mismatch in .*record 0 is 8x8x3 but the manifest says 10x10x3"):
        load(tmp_path, image_size=10)


def test_user_written_tfrecords_load_and_keep_their_ids(tmp_path):
    imgs = np.arange(5 * 8 * 8 * 3, dtype=np.uint8).reshape(5, 8, 8, 3)
    _write(tmp_path, imgs, [0, 1, 2, 0, 1])
    src = load(tmp_path, image_size=8)
    assert src.name == "custom" and src.val is None and src.class_names == ["a", "b", "c"]
    x, y, ids = examples(src.train)
    assert ids.tolist() == [0, 1, 2, 3, 4] and y.tolist() == [0, 1, 2, 0, 1] and np.array_equal(x, imgs)


def _touch(path, data=b""):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("make, match", [
    (lambda p: p / "nope", r"is not 'synthetic', 'shapes16k', one of cifar10, cifar100, mnist, fashion_mnist or an existing folder"),
    (lambda p: _touch(p / "f.txt"), r"is a file; give the folder"),
    (lambda p: _touch(p / "x.tfrecord").parent, r"holds \.tfrecord files but no manifest\.json; .*or name them as "
                                                r"ImageNet's \(train-00000-of-00004 \.\.\.\)"),
    (lambda p: _touch(p / "manifest.json", b"{not json").parent, r"manifest\.json is not valid JSON"),
])
def test_bad_dataset_paths(tmp_path, make, match):
    with pytest.raises(DataError, match=match):
        load(make(tmp_path))


# --- image folders --------------------------------------------------------------------------------------------
def _png(size=(20, 14), mode="RGB", colour=(200, 30, 30)):
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size, colour if mode == "RGB" else 128).save(buf, format="PNG")
    return buf.getvalue()


def _jpg(size=(30, 30)):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 10)).save(buf, format="JPEG")
    return buf.getvalue()


def _folder(root, layout):
    for rel, data in layout.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


BAD_FOLDER = {
    "cat/1.png": _png(), "cat/2.jpg": _jpg(), "cat/3.PNG": _png(mode="L"),
    "dog/1.png": _png((50, 10)), "dog/sub/2.jpeg": _jpg((8, 8)),
    "dog/broken.jpg": b"\xff\xd8\xff\xe0 definitely not a jpeg",
    "dog/cut.png": _png()[:40],
    "cat/notes.txt": b"labels are folder names",
    "owl/1.png": _png(colour=(0, 0, 255)),
}


def test_an_image_folder_file_that_does_not_decode_is_named_before_anything_trains(tmp_path):
    root = _folder(tmp_path / "imgs", BAD_FOLDER)
    with pytest.raises(DataError, match=r"^cannot use \S*dog/broken\.jpg: .* \(1 more do not decode either\); "
                                        r"--skip-bad-images skips such images"):
        load(root, image_size=12)


def test_image_folder_skips_and_reports_bad_files_when_asked(tmp_path, caplog):
    root = _folder(tmp_path / "imgs", BAD_FOLDER)
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        src = load(root, image_size=12, skip_bad_images=True)
    assert src.class_names == ["cat", "dog", "owl"] and src.num_classes == 3
    assert src.train_examples == 6 and src.input_shape == (12, 12, 3) and src.val is None
    info = src.info
    assert info["val_shards"] == 0 and "no validation split" in info["note"]  # not "1 shard" of nothing
    assert (info["skipped_images"], info["skipped_not_image"]) == (2, 1)
    assert [n.rsplit("/", 2)[-2:] for n in info["skipped_image_examples"]] == [["dog", "broken.jpg"], ["dog", "cut.png"]]
    assert info["per_class"] == {"cat": 3, "dog": 4, "owl": 1}  # files found, before decoding
    assert "skipped 2 image(s)" in caplog.text and "dog/broken.jpg" in caplog.text and "cat/notes.txt" in caplog.text
    x, y, ids = examples(src.train)
    assert x.shape == (6, 12, 12, 3) and sorted(y) == [0, 0, 0, 1, 1, 2]
    assert sorted(ids) == [0, 1, 2, 3, 6, 7]  # ids are places in the file list: the skipped ones (4, 5) are gaps


def test_image_folder_with_train_and_val_subfolders(tmp_path):
    root = _folder(tmp_path, {"train/a/1.png": _png(), "train/b/1.png": _png(), "train/b/2.png": _png(),
                              "val/a/1.png": _png(), "val/b/1.png": _png()})
    src = load(root, image_size=8)
    assert src.train_examples == 3 and src.val_examples == 2 and src.class_names == ["a", "b"]


@pytest.mark.parametrize("layout, match", [
    ({"a/readme.txt": b"x", "b/x.csv": b"1"}, r"found no images \(\.jpg, \.jpeg, \.png, \.bmp, \.gif\) in the class "),
    ({"only/1.png": _png(), "only/2.png": _png()}, r"images in only one class sub-folder \('only'\)"),
    ({"loose.png": _png()}, r"has no class sub-folders"),
    ({"a/1.png": _png(), "empty/bad.jpg": b"nope"}, r"cannot use \S*empty/bad\.jpg: Unknown image file format"),
])
def test_image_folder_errors(tmp_path, layout, match):
    with pytest.raises(DataError, match=match):
        load(_folder(tmp_path / "f", layout), image_size=8)
