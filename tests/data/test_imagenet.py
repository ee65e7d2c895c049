"""ImageNet-layout TFRecord folders, as tensorflow/models' build_imagenet_data.py writes them: loaded with their
counts, synsets and labels, in memory or streamed, every broken folder named in one line, the index kept, bad
records named or skipped, and the streamed order a function of the seed."""

import json
import os
import re
import shutil

import numpy as np
import pytest

import formats
import tftoolkit
from tftoolkit import RunConfig
from tftoolkit.data import registry, imagenet
from tftoolkit.errors import DataError

from helpers import FAST, examples, load_dataset as load

TINY_BUDGET = 1e-6   # GB: any folder is over it, so it streams
AMPLE_BUDGET = 1.0   # GB: every folder here fits, so it is decoded into memory
SMALL = dict(classes=4, train=48, validation=12, train_shards=4, validation_shards=2, sizes=(24, 48), seed=0)
SIZE = 16


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A small ImageNet-layout folder: 4 shards of 12 training records, 2 of 6 validation records, JPEGs of 24 to
    48 pixels a side, labels 1..4 on disk. Tests that change it work on a copy (``copy``)."""
    root = tmp_path_factory.mktemp("imagenet") / "imagenet"
    out = formats.imagenet_tfrecords(root, **SMALL)
    return {"path": root, **out}


@pytest.fixture()
def copy(written, tmp_path):
    """A private copy of the folder (mtimes kept, so its index stays valid), to break."""
    dst = tmp_path / "copy"
    shutil.copytree(written["path"], dst)
    return dst




def records(shard):
    """The tf.train.Examples of one shard, in order (read with TensorFlow's own reader, not the toolkit's)."""
    import tensorflow as tf

    return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(shard))]


def encoded(folder, split):
    """(JPEG bytes, label on disk) of every record of ``split``, in file order."""
    out = []
    for shard in sorted(folder.glob(f"{split}-*-of-*")):
        for ex in records(shard):
            f = ex.features.feature
            out.append((f["image/encoded"].bytes_list.value[0], f["image/class/label"].int64_list.value[0]))
    return out


def _decoded(data):
    """The whole JPEG, by TensorFlow's decoder (PIL's differs from it by up to 5 levels)."""
    import tensorflow as tf

    return tf.io.decode_jpeg(data, channels=3).numpy()


def _resized(array, size, antialias):
    import tensorflow as tf

    out = tf.image.resize(array, [size, size], method="bilinear", antialias=antialias)
    return tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8).numpy()


def whole(data, size):
    """The whole image squashed to size x size: what a split held in memory stores."""
    return _resized(_decoded(data), size, antialias=True)


def centre(data, size):
    """The centre square of 87.5% of the shorter side, resized: the evaluation transform of mixed-size images.
    Decoded as a window (libjpeg decodes a window's edges a few levels from the whole image's)."""
    import tensorflow as tf

    h, w = _decoded(data).shape[:2]
    side = int(min(h, w) * 0.875)
    y, x = (h - side) // 2, (w - side) // 2
    return _resized(tf.io.decode_and_crop_jpeg(data, [y, x, side, side], channels=3).numpy(), size, antialias=False)


def assert_same(images, expected):
    expected = np.asarray(expected)
    assert images.shape == expected.shape and images.dtype == expected.dtype == np.uint8
    diff = np.abs(images.astype(np.int16) - expected.astype(np.int16))
    assert diff.max() == 0, (diff.max(), diff.mean())


# --- a folder as build_imagenet_data.py writes it ------------------------------------------------------------
def test_an_imagenet_folder_is_recognised_as_that_layout(written):
    assert registry.layouts(written["path"]) == [("imagenet", "ImageNet-layout shards (train-00000-of-00004, ...)")]
    assert sorted(imagenet.shards(written["path"])) == ["train", "validation"]
    assert [f.name for f in imagenet.shards(written["path"])["validation"]] == [
        "validation-00000-of-00002", "validation-00001-of-00002"]


def test_an_imagenet_folder_loads_its_counts_synsets_and_labels_shifted_to_start_at_zero(written):
    src = load(written["path"], image_size=SIZE, data_memory_gb=AMPLE_BUDGET)
    assert (src.name, src.train_examples, src.val_examples) == ("imagenet", 48, 12)
    assert src.num_classes == 4 and src.class_names == written["synsets"] == formats.synsets(4)
    assert src.input_shape == (SIZE, SIZE, 3) and not src.info["streamed"]
    info = src.info
    assert (info["format"], info["shards"], info["val_shards"]) == ("imagenet tfrecord", 4, 2)
    assert info["labels"] == "1-based, shifted to 0..3" and info["image_formats_sampled"] == ["JPEG"]
    assert info["sampled_records"] == 60  # every record: no shard holds more than SAMPLE_RECORDS
    assert info["class_text"] == {s: f"class {k} thing" for k, s in enumerate(formats.synsets(4))}
    assert "note" not in info
    x, y, ids = examples(src.train)
    assert x.dtype == np.uint8 and x.shape == (48, SIZE, SIZE, 3) and sorted(ids.tolist()) == list(range(48))
    order = np.argsort(ids)  # ids number the records in file order (the shards are read interleaved)
    assert min(written["labels"]["train"]) == 1  # 1-based on disk ...
    assert y[order].tolist() == [v - 1 for v in written["labels"]["train"]]  # ... 0-based here
    assert_same(x[order], [whole(data, SIZE) for data, _ in encoded(written["path"], "train")])
    _, vy, vids = examples(src.val)
    assert sorted(vids.tolist()) == list(range(12))
    assert vy[np.argsort(vids)].tolist() == [v - 1 for v in written["labels"]["validation"]]


def test_image_size_left_unset_is_the_median_shorter_side_of_mixed_sizes_at_most_224(written, tmp_path):
    import tensorflow as tf

    src = load(written["path"], data_memory_gb=TINY_BUDGET)  # streamed: only headers of the sample are read
    sides = sorted(min(tf.image.extract_jpeg_shape(d).numpy()[:2]) for split in ("train", "validation")
                   for d, _ in encoded(written["path"], split))  # every record is in the 16-per-shard sample
    side = int(np.median(sides))
    assert 24 <= side <= 48 and src.input_shape == (side, side, 3) == src.streams["train"].shape
    assert src.info["decoded_bytes"] == 60 * side * side * 3  # what the memory budget was compared with
    images, labels = src.streams["train"].first_batch(2)
    assert tuple(images.shape) == (2, side, side, 3) and set(labels.numpy().tolist()) <= {0, 1, 2, 3}
    # ImageNet's own sizes (a few hundred pixels) give its 224.
    formats.imagenet_tfrecords(tmp_path / "big", classes=2, train=4, validation=2, train_shards=1,
                               validation_shards=1, sizes=(240, 320))
    assert load(tmp_path / "big", data_memory_gb=TINY_BUDGET).input_shape == (224, 224, 3)


def test_image_size_left_unset_is_the_size_imagenet_images_share(tmp_path):
    formats.imagenet_tfrecords(tmp_path / "same", classes=2, train=4, validation=2, train_shards=1,
                               validation_shards=1, sizes=(20, 20))
    src = load(tmp_path / "same", data_memory_gb=TINY_BUDGET)
    assert src.input_shape == (20, 20, 3)


# --- in memory or streamed ------------------------------------------------------------------------------------
def test_a_split_streams_exactly_when_its_decoded_pixels_exceed_the_memory_budget(written):
    need = 60 * SIZE * SIZE * 3  # 46,080 bytes: 60 images decoded at 16x16x3
    under = load(written["path"], image_size=SIZE, data_memory_gb=47_000 / 1e9)
    over = load(written["path"], image_size=SIZE, data_memory_gb=46_000 / 1e9)
    assert (under.info["decoded_bytes"], over.info["decoded_bytes"]) == (need, need)
    assert (under.info["streamed"], under.info["input_source"], under.streamed) == (False, "memory", False)
    assert (over.info["streamed"], over.info["input_source"], over.streamed) == (True, "stream", True)
    assert under.info["memory_budget_bytes"] == 47_000 and over.info["memory_budget_bytes"] == 46_000
    assert under.store("train").in_memory and not over.store("train").in_memory
    assert over.info["transform"] == "inception" and (over.train_examples, over.val_examples) == (48, 12)


def test_in_memory_and_streamed_give_the_same_examples_and_the_same_validation_labels(written):
    mem = load(written["path"], image_size=SIZE, data_memory_gb=AMPLE_BUDGET)
    st = load(written["path"], image_size=SIZE, data_memory_gb=TINY_BUDGET)
    assert not mem.info["streamed"] and st.info["streamed"]
    for split in ("train", "val"):  # the examples a source lists are the same, decoded whole, in file order
        for a, b in zip(examples(getattr(mem, split)), examples(getattr(st, split))):
            np.testing.assert_array_equal(a, b)
    # Streamed evaluation reads every validation record once, in the order the source lists them, as the centre
    # 87.5% square (held in memory, the split is the whole image squashed: the transforms differ by design).
    cfg = RunConfig(replicas=1, per_replica_batch=8)
    batches = list(st.store("val").eval_dataset(cfg, (1, 1, 0)).as_numpy_iterator())
    assert [len(y) for _, y in batches] == [8, 4]  # a short last batch is kept
    images, labels = np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])
    val = mem.store("val")
    on_disk = encoded(written["path"], "validation")
    assert labels.tolist() == val.labels.tolist() == [on_disk[i][1] - 1 for i in val.ids]
    assert_same(images, [centre(on_disk[i][0], SIZE) for i in val.ids])
    first, first_labels = st.streams["train"].first_batch(8)
    train = mem.store("train")
    assert first_labels.numpy().tolist() == train.labels[:8].tolist()
    on_disk = encoded(written["path"], "train")
    assert_same(np.round(first.numpy() * 255).astype(np.uint8), [centre(on_disk[i][0], SIZE) for i in train.ids[:8]])


# --- labels: shifted, kept, or 0-based already ----------------------------------------------------------------
def test_imagenet_labels_keep_keeps_the_stored_labels_with_an_output_for_the_background_class(written):
    src = load(written["path"], image_size=SIZE, imagenet_labels="keep", data_memory_gb=AMPLE_BUDGET)
    assert src.num_classes == 5 and src.class_names == ["(background: no example)", *formats.synsets(4)]
    assert src.info["labels"] == "1-based, kept: 5 outputs, output 0 never a target"
    _, y, ids = examples(src.train)
    assert y[np.argsort(ids)].tolist() == written["labels"]["train"] and 0 not in y
    _, vy, vids = examples(src.val)
    assert vy[np.argsort(vids)].tolist() == written["labels"]["validation"]


def _zero_based(folder, labels, val_labels, names):
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True)
    for split, ls in (("train", labels), ("validation", val_labels)):
        formats.write_records(folder / f"{split}-00000-of-00001", [
            formats.imagenet_example(f"{i}.JPEG", formats.jpeg(rng, 30, 26), k, names[k], f"thing {k}", [], 30, 26)
            for i, k in enumerate(ls)])
    return folder


@pytest.mark.parametrize("mode", ["shift", "keep"])
def test_labels_stored_from_zero_are_read_as_they_are(tmp_path, mode):
    names = ["n001", "n002", "n003"]
    folder = _zero_based(tmp_path / "zero", [0, 2, 1, 0, 2, 1, 1], [2, 0, 1], names)
    src = load(folder, image_size=SIZE, imagenet_labels=mode, data_memory_gb=AMPLE_BUDGET)
    assert src.num_classes == 3 and src.class_names == names
    assert src.info["labels"] == "0-based: read as stored"
    assert examples(src.train)[1].tolist() == [0, 2, 1, 0, 2, 1, 1]
    assert examples(src.val)[1].tolist() == [2, 0, 1]


# --- broken folders: one line, naming the file ------------------------------------------------------------------
def _unlink(name):
    return lambda p: (p / name).unlink()


def _add_copy(src, dst):
    return lambda p: shutil.copyfile(p / src, p / dst)


def _garbage(name):
    return lambda p: (p / name).write_bytes(b"these are not the records you are looking for\n" * 20)


def _no_train(p):
    for f in p.glob("train-*"):
        f.unlink()


@pytest.mark.parametrize("breaks, match", [
    (_unlink("train-00001-of-00004"),
     r"imagenet-folder: the train shards say -of-00004 but 1 is missing \(first: train-00001-of-00004\); "
     r"copy the whole set$"),
    (_add_copy("train-00000-of-00004", "train-00000-of-00002"),
     r"imagenet-folder mixes train shards of 2 and 4 \(the -of-N in their names\); keep one set of train shards"),
    (_add_copy("validation-00000-of-00002", "validation-00002-of-00002"),
     r"the validation shards say -of-00002 but 1 is beyond it \(first: validation-00002-of-00002\)"),
    (_garbage("validation-00001-of-00002"),
     r"imagenet-folder/validation-00001-of-00002 is not a TFRecord file \(.+\); keep only shards in the folder$"),
    (_no_train, r"imagenet-folder has validation shards but no train-\*-of-\* shards; the training split is needed"),
], ids=["missing-shard", "mixed-of-n", "beyond-of-n", "not-a-tfrecord", "no-train-split"])
def test_a_broken_imagenet_folder_is_one_line_naming_the_file(copy, breaks, match):
    folder = copy.rename(copy.parent / "imagenet-folder")
    breaks(folder)
    with pytest.raises(DataError, match=match) as e:
        load(folder, image_size=SIZE)
    assert "\n" not in str(e.value)


def test_a_folder_mixing_imagenet_shards_and_class_folders_names_both(copy):
    (copy / "n01440764").mkdir()
    (copy / "n01440764" / "a.JPEG").write_bytes(formats.jpeg(np.random.default_rng(0), 20, 20))
    with pytest.raises(DataError, match=r"mixes dataset layouts: ImageNet-layout shards \(train-00000-of-00004, "
                                        r"\.\.\.\) and class sub-folders of images \(n01440764/\); keep one dataset"):
        load(copy, image_size=SIZE)


def _example(i, label=1, drop=()):
    ex = formats.imagenet_example(f"{i}.JPEG", formats.jpeg(np.random.default_rng(i), 24, 24), label, "n001",
                                  "thing", [], 24, 24)
    for key in drop:
        del ex.features.feature[key]
    return ex


@pytest.mark.parametrize("drop, bad, match", [
    ("image/encoded", 1, r"train-00000-of-00001: record 1 has no image/encoded \(its features: image/channels, "
                         r"image/class/label, .*\); an ImageNet-layout record needs the encoded image and "
                         r"image/class/label$"),
    ("image/class/label", 2, r"train-00000-of-00001: record 2 has no image/class/label; an ImageNet-layout record "
                             r"needs one$"),
], ids=["no-encoded-image", "no-label"])
def test_a_record_without_the_image_or_the_label_is_named(tmp_path, drop, bad, match):
    formats.write_records(tmp_path / "train-00000-of-00001",
                          [_example(i, drop=(drop,) if i == bad else ()) for i in range(4)])
    with pytest.raises(DataError, match=match) as e:
        load(tmp_path, image_size=SIZE)
    assert "\n" not in str(e.value)


def _beyond_the_sample(folder):
    """18 records labelled 1 and 2, but for record 17, labelled 5: after the first SAMPLE_RECORDS records, those the
    class count is taken from."""
    labels = [1, 2] * 8 + [2, 5]
    formats.write_records(folder / "train-00000-of-00001", [_example(i, label=k) for i, k in enumerate(labels)])
    return f"{folder / 'train-00000-of-00001'}: record 17"


def test_a_label_beyond_the_sampled_classes_stops_the_load_naming_its_record_unless_skipped(tmp_path):
    where = _beyond_the_sample(tmp_path)
    with pytest.raises(DataError, match=rf"^cannot use {re.escape(where)}: .*; --skip-bad-images skips such images"):
        load(tmp_path, image_size=SIZE, data_memory_gb=AMPLE_BUDGET)
    src = load(tmp_path, image_size=SIZE, data_memory_gb=AMPLE_BUDGET, skip_bad_images=True)
    assert src.num_classes == 2 and src.train_examples == 17
    assert src.info["skipped_images"] == 1 and src.info["skipped_image_examples"] == [where]


def test_a_label_beyond_the_sampled_classes_is_explained_as_out_of_range(tmp_path):
    where = _beyond_the_sample(tmp_path)
    with pytest.raises(DataError, match=rf"^cannot use {re.escape(where)}: its label 5 is out of range "
                                        r"\(0\.\.1, less 1\); --skip-bad-images skips such images"):
        load(tmp_path, image_size=SIZE, data_memory_gb=AMPLE_BUDGET)


def test_shards_that_hold_no_records_are_a_data_error(tmp_path):
    formats.write_records(tmp_path / "train-00000-of-00001", [])
    with pytest.raises(DataError, match=r"train-00000-of-00001"):
        load(tmp_path, image_size=SIZE)


def test_a_truncated_shard_is_named_as_cut_short(copy):
    f = copy / "train-00002-of-00004"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"train-00002-of-00004 is truncated: record 11 needs bytes up to"):
        load(copy, image_size=SIZE)


# --- the index of the shards ------------------------------------------------------------------------------------
@pytest.fixture()
def fresh(copy):
    (copy / imagenet.INDEX).unlink(missing_ok=True)
    return copy


def _counting(monkeypatch):
    indexed, real = [], imagenet._index_shard

    def counted(f):
        indexed.append(f.name)
        return real(f)

    monkeypatch.setattr(imagenet, "_index_shard", counted)
    return indexed


def test_the_index_is_kept_beside_the_shards_and_not_rebuilt_on_the_next_load(fresh, monkeypatch):
    indexed = _counting(monkeypatch)
    first = load(fresh, image_size=SIZE, data_memory_gb=TINY_BUDGET)
    assert len(indexed) == 6  # every shard, once
    kept = json.loads((fresh / imagenet.INDEX).read_text())
    assert kept["version"] == imagenet.INDEX_VERSION and kept["sample_records"] == imagenet.SAMPLE_RECORDS
    assert {k: v["records"] for k, v in kept["shards"].items()} == {
        **{f"train-0000{i}-of-00004": 12 for i in range(4)}, **{f"validation-0000{i}-of-00002": 6 for i in range(2)}}

    def refuse(f):
        raise AssertionError(f"indexed {f.name} again")

    monkeypatch.setattr(imagenet, "_index_shard", refuse)
    again = load(fresh, image_size=SIZE, data_memory_gb=TINY_BUDGET)
    assert (again.train_examples, again.val_examples, again.num_classes) == (48, 12, 4)
    assert again.class_names == first.class_names and again.info["labels"] == first.info["labels"]
    assert again.info["class_text"] == first.info["class_text"]


def test_a_shard_touched_or_rewritten_since_is_indexed_again_alone(fresh, monkeypatch):
    load(fresh, image_size=SIZE, data_memory_gb=TINY_BUDGET)
    indexed = _counting(monkeypatch)
    touched = fresh / "validation-00001-of-00002"
    st = touched.stat()
    os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, a new mtime
    assert load(fresh, image_size=SIZE, data_memory_gb=TINY_BUDGET).val_examples == 12
    assert indexed == ["validation-00001-of-00002"]
    indexed.clear()
    rewritten = fresh / "train-00002-of-00004"
    formats.write_records(rewritten, records(rewritten)[:5])  # 5 of its 12 records
    src = load(fresh, image_size=SIZE, data_memory_gb=TINY_BUDGET)
    assert indexed == ["train-00002-of-00004"] and src.train_examples == 48 - 7
    assert json.loads((fresh / imagenet.INDEX).read_text())["shards"]["train-00002-of-00004"]["records"] == 5
    assert load(fresh, image_size=SIZE, data_memory_gb=TINY_BUDGET).train_examples == 41  # and kept so
    assert indexed == ["train-00002-of-00004"]


def test_an_index_that_cannot_be_written_beside_the_shards_is_kept_in_the_data_home(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("TFTOOLKIT_DATA_DIR", str(tmp_path / "home"))
    (fresh / imagenet.INDEX).mkdir()  # neither readable nor writable as a file (root ignores permissions)
    load(fresh, image_size=SIZE, data_memory_gb=TINY_BUDGET)
    kept = list((tmp_path / "home" / "indexes").glob("imagenet-*.json"))
    assert len(kept) == 1 and len(json.loads(kept[0].read_text())["shards"]) == 6
    indexed = _counting(monkeypatch)
    assert load(fresh, image_size=SIZE, data_memory_gb=TINY_BUDGET).train_examples == 48
    assert indexed == []


def test_a_folder_on_a_read_only_filesystem_keeps_its_index_in_the_data_home(fresh, tmp_path, monkeypatch):
    import errno
    import tempfile

    monkeypatch.setenv("TFTOOLKIT_DATA_DIR", str(tmp_path / "home"))
    real = tempfile.mkstemp

    def read_only(*args, **kw):  # what mkstemp meets in a folder on a read-only mount (root or not)
        if str(kw.get("dir")) == str(fresh):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*args, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    assert load(fresh, image_size=SIZE, data_memory_gb=TINY_BUDGET).train_examples == 48
    assert not (fresh / imagenet.INDEX).exists()
    assert len(list((tmp_path / "home" / "indexes").glob("imagenet-*.json"))) == 1


# --- a record whose JPEG does not decode ------------------------------------------------------------------------
BAD_SHARD, BAD_RECORD = "train-00001-of-00004", 2


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory):
    """16 training records in 4 shards, 4 validation; record 2 of train-00001-of-00004 holds a JPEG cut in half
    (its header intact: it is found to be bad only when decoded)."""
    root = tmp_path_factory.mktemp("corrupt") / "imagenet"
    formats.imagenet_tfrecords(root, classes=2, train=16, validation=4, train_shards=4, validation_shards=1,
                               sizes=(24, 48), seed=1)
    shard = root / BAD_SHARD
    exs = records(shard)
    feature = exs[BAD_RECORD].features.feature["image/encoded"].bytes_list
    data = feature.value[0]
    feature.value[0] = data[:len(data) // 2]
    formats.write_records(shard, exs)
    return root


def _where(root):
    return f"{root / BAD_SHARD}: record {BAD_RECORD}"


def test_a_corrupt_jpeg_decoded_into_memory_is_named_unless_skipped(corrupt):
    with pytest.raises(DataError, match=rf"^cannot use {re.escape(_where(corrupt))}: .+; --skip-bad-images skips "
                                        r"such images, counts them and names them in summary\.json$"):
        load(corrupt, image_size=SIZE, data_memory_gb=AMPLE_BUDGET)
    src = load(corrupt, image_size=SIZE, data_memory_gb=AMPLE_BUDGET, skip_bad_images=True)
    assert src.info["skipped_images"] == 1 and src.info["skipped_image_examples"] == [_where(corrupt)]
    assert (src.train_examples, src.val_examples) == (15, 4)
    assert 4 + BAD_RECORD not in examples(src.train)[2].tolist()  # its id (record 2 of the second shard) is gone


def _streamed_run(root, **kw):
    return RunConfig(dataset=str(root), image_size=SIZE, replicas=1, per_replica_batch=16, steps=2,
                     data_memory_gb=TINY_BUDGET, measure=False, eval_every_epoch=False, **FAST, **kw)


@pytest.mark.slow
def test_a_corrupt_jpeg_met_while_streaming_fails_the_run_naming_its_shard_and_record(corrupt, tmp_path):
    # A batch of 16 is the whole training split: the first step meets the bad record whatever the order.
    with pytest.raises(DataError, match=rf"^cannot use {re.escape(_where(corrupt))}: .+; --skip-bad-images") as e:
        tftoolkit.train(_streamed_run(corrupt), tmp_path / "run", quiet=True)
    assert "\n" not in str(e.value)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == str(e.value)


@pytest.mark.slow
def test_skip_bad_images_streams_past_a_corrupt_jpeg_counting_and_naming_it(corrupt, tmp_path):
    summary = tftoolkit.train(_streamed_run(corrupt, skip_bad_images=True), tmp_path / "run", quiet=True)
    assert summary["status"] == "ok" and summary["input_source"] == "stream"
    # Met in both steps (each a whole epoch), counted once.
    assert summary["skipped_images"] == 1 and summary["skipped_image_examples"] == [_where(corrupt)]
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["skipped_images"] == 1 and on_disk["skipped_image_examples"] == [_where(corrupt)]


# --- the streamed order ---------------------------------------------------------------------------------------
def _batches(split, config, start_step, n):
    ds = split.train_dataset(config, (1, 1, 0), start_step, split.n, deterministic=True)
    out = list(ds.take(n).as_numpy_iterator())
    return np.concatenate([x for x, _ in out]), np.concatenate([y for _, y in out])


def test_a_streamed_epoch_is_the_same_batches_for_a_seed_and_another_order_for_another_epoch_or_seed(written):
    cfg = RunConfig(replicas=1, per_replica_batch=8, seed=3, augment=True)
    steps = 48 // 8
    a = load(written["path"], image_size=SIZE, data_memory_gb=TINY_BUDGET).streams["train"]
    b = load(written["path"], image_size=SIZE, data_memory_gb=TINY_BUDGET).streams["train"]
    xa, ya = _batches(a, cfg, 0, 2 * steps)  # epochs 0 and 1
    xb, yb = _batches(b, cfg, 0, steps)
    np.testing.assert_array_equal(xa[:48], xb)  # same order, same crops and flips
    np.testing.assert_array_equal(ya[:48], yb)
    on_disk = sorted(v - 1 for v in written["labels"]["train"])
    assert sorted(ya[:48].tolist()) == sorted(ya[48:].tolist()) == on_disk  # every record once per epoch
    assert ya[48:].tolist() != ya[:48].tolist() and not np.array_equal(xa[48:], xa[:48])
    _, other = _batches(a, cfg.replace(seed=4), 0, steps)
    assert sorted(other.tolist()) == on_disk and other.tolist() != ya[:48].tolist()


def test_the_streamed_training_pipeline_holds_no_stateful_op(written):
    # Under op determinism (on by default on CPU replicas) tf.data runs every parallel map and interleave of a
    # pipeline that holds a stateful op serially: a seeded Dataset.shuffle (its seed generator) halved the
    # throughput. Serialising the pipeline with external state refused finds any such op.
    import tensorflow as tf

    from helpers import ops_that_serialise_the_pipeline

    fail = tf.data.experimental.ExternalStatePolicy.FAIL.value

    def serialise(ds):
        tf.raw_ops.DatasetToGraphV2(input_dataset=ds._variant_tensor, external_state_policy=fail)

    cfg = RunConfig(replicas=2, per_replica_batch=4, seed=3, augment=True)
    split = load(written["path"], image_size=SIZE, data_memory_gb=TINY_BUDGET).streams["train"]
    # A fresh run, one resumed mid-epoch, a worker keeping its replicas' slices (exact sharding), and one reading
    # its own shards (file sharding).
    cases = ((0, (2, 2, 0), None), (3, (2, 2, 0), None), (0, (4, 2, 2), None), (0, (2, 2, 0), (1, 2)))
    for start, layout, shard in cases:
        ds = split.train_dataset(cfg, layout, start, split.n, deterministic=True, worker_shard=shard)
        serialise(ds)
        # Nor one that tf.data's make_deterministic rewrite counts (a TensorDataset among them, which serialises)
        assert ops_that_serialise_the_pipeline(ds) == set(), (start, layout, shard)
    # The check catches the op that slowed the pipeline (it is tf.data's external-state check, not the determinism
    # rewrite itself, so it vouches for this kind of op): the same pipeline shuffled with a seed, inside a
    # function as the epochs are, is refused.
    ds = split.train_dataset(cfg, (2, 2, 0), 0, split.n, deterministic=True)
    with pytest.raises(tf.errors.FailedPreconditionError, match="stateful"):
        serialise(tf.data.Dataset.range(1).flat_map(lambda _: ds.shuffle(64, seed=7)))


def test_the_streamed_order_ignores_the_global_seed_leaves_it_alone_and_a_mid_epoch_start_carries_on(written):
    # The shuffle is stateless and keyed by (seed, epoch) (stream._block_shuffle), so a notebook's
    # tf.random.set_seed neither changes the order nor is changed by building the pipeline.
    import tensorflow as tf

    from tensorflow.python.eager import context  # the global seed has no public getter

    cfg = RunConfig(replicas=1, per_replica_batch=8, seed=3, augment=True)
    split = load(written["path"], image_size=SIZE, data_memory_gb=TINY_BUDGET).streams["train"]
    before = context.global_seed()  # an earlier run in this process may have set one: put it back after
    try:
        # Unseeded draws take their op seed from a counter set_seed resets: a build that drew an op seed (or set
        # the global seed) would move the draw after it.
        tf.random.set_seed(5)
        x5, y5 = _batches(split, cfg, 0, 6)
        drawn_after = tf.random.uniform([4]).numpy()
        tf.random.set_seed(6)
        x6, y6 = _batches(split, cfg, 0, 6)
        tf.random.set_seed(5)
        np.testing.assert_array_equal(tf.random.uniform([4]).numpy(), drawn_after)
    finally:
        tf.random.set_seed(before)
    np.testing.assert_array_equal(x5, x6)
    np.testing.assert_array_equal(y5, y6)
    xs, ys = _batches(split, cfg, 2, 4)  # what a run resumed at step 2 of this epoch builds
    np.testing.assert_array_equal(xs, x5[16:])
    np.testing.assert_array_equal(ys, y5[16:])


def test_a_streamed_epoch_without_augment_is_every_record_once_as_evaluated(written):
    st = load(written["path"], image_size=SIZE, data_memory_gb=TINY_BUDGET)
    split = st.streams["train"]
    x, y = _batches(split, RunConfig(replicas=1, per_replica_batch=8, seed=0, augment=False), 0, 6)
    ex, ey = split.first_batch(48)
    ex = np.round(ex.numpy() * 255).astype(np.uint8)
    # The same 48 (image, label) pairs as the evaluation transform gives in file order, in another order.
    key = lambda imgs, labels: sorted((int(lab), img.tobytes()) for img, lab in zip(imgs, labels))  # noqa: E731
    assert key(x, y) == key(ex, ey.numpy())
    assert y.tolist() != ey.numpy().tolist()


# --- multi-worker file sharding -------------------------------------------------------------------------------
def test_file_sharding_gives_each_worker_every_other_imagenet_shard(written):
    cfg = RunConfig(dataset=str(written["path"]), image_size=SIZE, input_sharding="file", workers=2, replicas=2)
    for me, mine in ((0, ["train-00000-of-00004", "train-00002-of-00004"]),
                     (1, ["train-00001-of-00004", "train-00003-of-00004"])):
        src = registry.load_source(cfg, worker=(me, 2))
        sharding = src.info["input_sharding"]
        assert (sharding["policy"], sharding["worker"], sharding["shards"]) == ("file", me, mine)
        assert (sharding["examples_per_worker"], sharding["left_out_per_epoch"]) == (24, 0)
        assert src.worker_shard == (me, 2) and src.local_examples == 24 and src.train_examples == 48
        _, y, ids = examples(src.train)  # this worker's records only: ids of its own two shards
        assert sorted(ids.tolist()) == list(range(24))


def test_a_streamed_worker_under_file_sharding_reads_each_of_its_records_once_an_epoch(written, monkeypatch):
    import tensorflow as tf

    from tftoolkit.data import pipeline

    # 2 workers x 1 replica, global batch 8: worker 0 holds 24 records (2 shards), 4 of each global batch, so an
    # epoch is 6 steps and shows it every one of its records once.
    cfg = RunConfig(dataset=str(written["path"]), image_size=SIZE, input_sharding="file", workers=2, replicas=2,
                    global_batch=8, data_memory_gb=TINY_BUDGET)
    src = registry.load_source(cfg, worker=(0, 2))
    split = src.store("train")
    # What the training input hands the stream: all workers' examples (it takes this worker's share itself).
    handed = []
    monkeypatch.setattr(type(split), "train_dataset", lambda self, c, layout, start, examples, *a: handed.append(
        examples) or tf.data.Dataset.range(1))
    pipeline.train_input(tf.distribute.OneDeviceStrategy("/cpu:0"), src, cfg, 0)
    monkeypatch.undo()
    assert handed == [src.train_examples] == [48]
    batches = list(split.train_dataset(cfg, (2, 1, 0), 0, src.train_examples, True, src.worker_shard).take(12))
    assert all(b[0].shape[0] == 4 for b in batches)
    epoch = [bytes(x) for b in batches[:6] for x in b[0].numpy().reshape(4, -1)]
    assert len(set(epoch)) == 24  # every record of the worker's shards, none twice
    nxt = [bytes(x) for b in batches[6:] for x in b[0].numpy().reshape(4, -1)]
    assert set(nxt) == set(epoch) and nxt != epoch  # epoch 2: the same records (no --augment), another order


def test_a_streamed_split_refuses_a_partial_last_batch(written):
    import tensorflow as tf

    from tftoolkit.data import pipeline
    from tftoolkit.errors import ConfigError

    cfg = RunConfig(dataset=str(written["path"]), image_size=SIZE, replicas=1, global_batch=10,
                    last_batch="partial", data_memory_gb=TINY_BUDGET)
    with pytest.raises(ConfigError, match=r"--last-batch partial: imagenet streams from its files"):
        pipeline.train_input(tf.distribute.OneDeviceStrategy("/cpu:0"), registry.load(cfg), cfg, 0)
