"""The standard dataset formats by their behaviour: keras.datasets by name (cifar10, cifar100, mnist, fashion_mnist),
CIFAR's python folders, a TFDS-prepared directory, ImageNet-style image folders, and folders mixing two layouts.

The data is written by tests/formats.py (from each format's own definition) or here, tiny; nothing is downloaded:
Keras' download is attempted with name resolution blocked, so an offline failure is immediate, never a hang.
"""

import gzip
import logging
import os
import pickle
import re
import shutil
import socket
import sys

import numpy as np
import pytest

import formats
from tftoolkit.data import registry, keras_sets
from tftoolkit.errors import DataError

from helpers import examples, load_dataset as load




def in_file_order(ds):
    x, y, ids = examples(ds)
    order = np.argsort(ids)
    return x[order], y[order]


# --- keras.datasets by name -----------------------------------------------------------------------------------
KERAS = {  # name: (image shape Keras gives, label shape suffix, classes)
    "cifar10": ((32, 32, 3), (1,), 10),
    "cifar100": ((32, 32, 3), (1,), 100),
    "mnist": ((28, 28), (), 10),
    "fashion_mnist": ((28, 28), (), 10),
}


def test_every_keras_set_the_toolkit_names_is_covered_here():
    assert sorted(keras_sets.NAMES) == sorted(KERAS)


def fake_keras_arrays(name, n_train=7, n_test=5, seed=0):
    """What keras.datasets.<name>.load_data() returns, shrunk: uint8 images, uint8 labels ((N, 1) for CIFAR)."""
    shape, label_tail, k = KERAS[name]
    rng = np.random.default_rng(seed)

    def split(n):
        return (rng.integers(0, 256, (n, *shape), dtype=np.uint8),
                rng.integers(0, k, (n, *label_tail)).astype(np.uint8))

    return split(n_train), split(n_test)


@pytest.mark.parametrize("name, input_shape, classes, first_names", [
    ("cifar10", (32, 32, 3), 10, ["airplane", "automobile", "bird"]),
    ("cifar100", (32, 32, 3), 100, ["0", "1", "2"]),
    ("mnist", (28, 28, 1), 10, ["0", "1", "2"]),
    ("fashion_mnist", (28, 28, 1), 10, ["T-shirt/top", "Trouser", "Pullover"]),
])
def test_keras_sets_by_name_keep_counts_labels_and_pixels(monkeypatch, name, input_shape, classes, first_names):
    import keras

    (x, y), (xt, yt) = fake_keras_arrays(name)
    monkeypatch.setattr(getattr(keras.datasets, name), "load_data", lambda: ((x, y), (xt, yt)))
    src = load(name)
    assert (src.name, src.train_examples, src.val_examples) == (name, 7, 5)
    assert src.num_classes == classes and src.input_shape == input_shape
    assert len(src.class_names) == classes and src.class_names[:3] == first_names
    assert src.info["format"] == "keras.datasets" and src.info["origin"] == f"keras.datasets.{name}.load_data()"
    tx, ty = in_file_order(src.train)
    assert tx.dtype == np.uint8 and tx.shape == (7, *input_shape)
    assert np.array_equal(tx, x.reshape(tx.shape)) and ty.tolist() == y.reshape(-1).tolist()
    vx, vy = in_file_order(src.val)
    assert np.array_equal(vx, xt.reshape(vx.shape)) and vy.tolist() == yt.reshape(-1).tolist()


def test_mnist_by_name_is_resized_to_image_size_keeping_one_channel(monkeypatch, caplog):
    import keras

    (x, y), (xt, yt) = fake_keras_arrays("mnist")
    monkeypatch.setattr(keras.datasets.mnist, "load_data", lambda: ((x, y), (xt, yt)))
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        src = load("mnist", image_size=16)
    assert src.input_shape == (16, 16, 1) and "mnist holds 28x28 images; resizing them to 16x16" in caplog.text
    tx, _ = in_file_order(src.train)
    assert tx.shape == (7, 16, 16, 1) and tx.dtype == np.uint8


@pytest.fixture()
def keras_home(tmp_path, monkeypatch):
    """An empty Keras cache (Keras reads $KERAS_HOME once, at import: its module variable is what get_file uses),
    with name resolution refused as on a machine without network: a download fails at once."""
    from keras.src.backend import config as keras_config

    home = tmp_path / "keras_home"
    home.mkdir()
    monkeypatch.setenv("KERAS_HOME", str(home))
    monkeypatch.setattr(keras_config, "_KERAS_DIR", str(home))
    assert keras_config.keras_home() == str(home)

    def offline(*args, **kwargs):
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", offline)
    return home


@pytest.fixture()
def asked(monkeypatch):
    """Every (url, target) Keras' download is called with; the real urlretrieve still runs (and fails offline)."""
    from keras.src.utils import file_utils

    calls = []
    real = file_utils.urlretrieve

    def recording(url, filename, *args, **kwargs):
        calls.append((url, filename))
        return real(url, filename, *args, **kwargs)

    monkeypatch.setattr(file_utils, "urlretrieve", recording)
    return calls


def test_offline_mnist_names_the_url_and_the_exact_path_to_put_it_at(keras_home, asked):
    from keras.src.utils import file_utils

    before = file_utils.urlretrieve
    with pytest.raises(DataError) as err:
        load("mnist")
    text = str(err.value)
    url = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
    target = keras_home / "datasets" / "mnist.npz"
    assert asked == [(url, str(target))]  # Keras really tried, and failed at once
    assert text.startswith(f"mnist: Keras could not download {url} (")
    assert "Temporary failure in name resolution" in text
    assert f"; put that file at {target} (Keras' cache: $KERAS_HOME, else ~/.keras) and run again" in text
    assert "\n" not in text
    assert file_utils.urlretrieve is before  # the recording wrapper is taken off again
    assert not target.exists()


@pytest.mark.parametrize("name, alternative", [
    ("cifar10", "(or download cifar-10-python.tar.gz, unpack it and give --dataset PATH/cifar-10-batches-py)"),
    ("cifar100", "(or download cifar-100-python.tar.gz, unpack it and give --dataset PATH/cifar-100-python)"),
    ("fashion_mnist", None),
])
def test_offline_keras_sets_name_what_keras_asked_for_in_one_line(keras_home, asked, name, alternative):
    with pytest.raises(DataError) as err:
        load(name)
    text = str(err.value)
    assert len(asked) == 1
    url, target = asked[0]
    assert url.startswith("https://") and target.startswith(str(keras_home / "datasets") + os.sep)
    assert f"{name}: Keras could not download {url} (" in text and f"put that file at {target} (" in text
    assert "\n" not in text
    if alternative:
        assert text.endswith(alternative)
    else:
        assert text.endswith("and run again")


def test_a_keras_failure_that_is_not_a_download_is_not_reworded(monkeypatch):
    import keras

    def broken():
        raise ValueError("cannot reshape array of size 3 into shape (28,28)")

    monkeypatch.setattr(keras.datasets.mnist, "load_data", broken)
    with pytest.raises(ValueError, match=r"cannot reshape array"):
        load("mnist")


def _idx(path, array):
    """An IDX file as the MNIST site defines it (big-endian header: 0, 0, type 0x08 = ubyte, dims; then each
    dimension's size as a 4-byte int), gzipped as the site serves it."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_files_placed_in_the_keras_cache_are_used_without_a_download(keras_home, asked):
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8), rng.integers(0, 10, 6).astype(np.uint8)
    xt, yt = rng.integers(0, 256, (4, 28, 28), dtype=np.uint8), rng.integers(0, 10, 4).astype(np.uint8)
    cache = keras_home / "datasets" / "fashion-mnist"
    cache.mkdir(parents=True)
    for fname, array in (("train-images-idx3-ubyte.gz", x), ("train-labels-idx1-ubyte.gz", y),
                         ("t10k-images-idx3-ubyte.gz", xt), ("t10k-labels-idx1-ubyte.gz", yt)):
        _idx(cache / fname, array)
    src = load("fashion_mnist")
    assert asked == []  # nothing downloaded (and nothing could be)
    assert (src.train_examples, src.val_examples, src.input_shape) == (6, 4, (28, 28, 1))
    assert src.class_names[-1] == "Ankle boot"
    tx, ty = in_file_order(src.train)
    assert np.array_equal(tx[..., 0], x) and ty.tolist() == y.tolist()
    vx, vy = in_file_order(src.val)
    assert np.array_equal(vx[..., 0], xt) and vy.tolist() == yt.tolist()


# --- CIFAR's python folders -------------------------------------------------------------------------------------
def _repickled(root, protocol=pickle.DEFAULT_PROTOCOL):
    """The folder's files pickled again by this Python at ``protocol``. The CIFAR site's files are Python 2 pickles
    (strings as BINSTRING: no global but NumPy's); Python 3 at protocol <= 2 writes every bytes object as a call
    to _codecs.encode (see test_a_cifar_folder_pickled_at_protocol_2_by_python_3_loads), at 3 and above as bytes,
    like the originals."""
    for f in root.iterdir():
        obj = _batch(f)
        with open(f, "wb") as out:
            pickle.dump(obj, out, protocol=protocol)
    return root


@pytest.fixture(scope="module")
def cifar10_dir(tmp_path_factory):
    return _repickled(formats.cifar_python(tmp_path_factory.mktemp("c10"), "cifar10", train_per_batch=4, test=6,
                                           seed=1))


@pytest.fixture(scope="module")
def cifar100_dir(tmp_path_factory):
    return _repickled(formats.cifar_python(tmp_path_factory.mktemp("c100"), "cifar100", train_per_batch=3, test=5,
                                           seed=2))


def _batch(path):
    with open(path, "rb") as f:
        return pickle.load(f, encoding="bytes")  # written by the test: trusted


def _cifar_pixels(batch):
    """Pixels from the format's definition: each row is 1024 red, then 1024 green, then 1024 blue values, row-major."""
    data = np.asarray(batch[b"data"])
    out = np.empty((len(data), 32, 32, 3), np.uint8)
    for c in range(3):
        out[..., c] = data[:, c * 1024:(c + 1) * 1024].reshape(-1, 32, 32)
    return out


def test_cifar10_python_folder_loads_every_batch_with_its_labels_and_names(cifar10_dir):
    src = load(cifar10_dir)
    assert (src.name, src.train_examples, src.val_examples) == ("cifar10", 20, 6)
    assert src.input_shape == (32, 32, 3) and src.num_classes == 10
    assert src.class_names == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                               "truck"]
    assert src.info["format"] == "cifar10 python folder"
    batches = [_batch(cifar10_dir / f"data_batch_{i}") for i in range(1, 6)]
    x, y = in_file_order(src.train)
    assert x.dtype == np.uint8
    assert y.tolist() == [v for b in batches for v in b[b"labels"]]
    assert np.array_equal(x, np.concatenate([_cifar_pixels(b) for b in batches]))
    test = _batch(cifar10_dir / "test_batch")
    vx, vy = in_file_order(src.val)
    assert vy.tolist() == test[b"labels"] and np.array_equal(vx, _cifar_pixels(test))


def test_cifar100_python_folder_uses_the_fine_labels_and_their_names(cifar100_dir):
    src = load(cifar100_dir)
    assert (src.name, src.train_examples, src.val_examples, src.num_classes) == ("cifar100", 15, 5, 100)
    assert src.class_names[:2] == ["fine0", "fine1"] and src.class_names[-1] == "fine99"
    _, y = in_file_order(src.train)
    assert y.tolist() == _batch(cifar100_dir / "train")[b"fine_labels"]
    _, vy = in_file_order(src.val)
    assert vy.tolist() == _batch(cifar100_dir / "test")[b"fine_labels"]


class RunsCode:
    """What a hostile pickle holds: unpickling it calls os.system."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture()
def cifar10_copy(cifar10_dir, tmp_path):
    return shutil.copytree(cifar10_dir, tmp_path / "cifar-10-batches-py")


@pytest.mark.parametrize("victim", ["data_batch_3", "batches.meta"])
def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(cifar10_copy, tmp_path, victim):
    marker = tmp_path / "pwned"
    hostile = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"label_names": [b"x"] * 10,
               b"payload": RunsCode(f"touch '{marker}'")}
    with open(cifar10_copy / victim, "wb") as f:
        pickle.dump(hostile, f, protocol=pickle.DEFAULT_PROTOCOL)
    with pytest.raises(DataError, match=rf"{victim}: refusing to unpickle it: it asks for (posix|os|nt)\.system, "
                                        r"which CIFAR's data never does \(unpickling would run code\)"):
        load(cifar10_copy)
    assert not marker.exists()
    # The payload is live: an ordinary unpickler runs it (what the refusal prevented).
    with open(cifar10_copy / victim, "rb") as f:
        pickle.load(f, encoding="bytes")
    assert marker.exists()


def test_a_cifar_batch_that_is_not_a_pickle_is_named(cifar10_copy):
    (cifar10_copy / "test_batch").write_bytes(b"this is not a pickle")
    with pytest.raises(DataError, match=r"test_batch: not a CIFAR python batch \("):
        load(cifar10_copy)


def test_a_cifar_folder_pickled_at_protocol_2_by_python_3_loads(tmp_path):
    root = formats.cifar_python(tmp_path, "cifar10", train_per_batch=2, test=3)  # protocol 2, as formats.py writes
    src = load(root)
    assert (src.train_examples, src.val_examples) == (10, 3)


def test_a_missing_cifar_batch_file_is_named(cifar10_copy):
    (cifar10_copy / "data_batch_4").unlink()
    with pytest.raises(DataError, match=r"data_batch_4"):
        load(cifar10_copy)


# --- a TFDS-prepared directory -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tfds_fixed(tmp_path_factory):
    pytest.importorskip("tensorflow_datasets")
    return formats.tfds_directory(tmp_path_factory.mktemp("tfds"), name="tiny_images", train=12, test=5, size=16,
                                  classes=3, seed=0)


def _tfds_in_file_order(vdir, split):
    import tensorflow_datasets as tfds

    ds = tfds.builder_from_directory(str(vdir)).as_dataset(split=split, shuffle_files=False)
    rows = list(tfds.as_numpy(ds))
    return np.stack([r["image"] for r in rows]), [int(r["label"]) for r in rows]


def test_tfds_directory_of_one_image_size_loads_whole_images_and_its_splits(tfds_fixed):
    src = load(tfds_fixed.parent)  # <data_dir>/<name>/: its newest version is taken
    assert (src.name, src.train_examples, src.val_examples) == ("tiny_images", 12, 5)
    assert src.num_classes == 3 and src.class_names == ["c0", "c1", "c2"] and src.input_shape == (16, 16, 3)
    info = src.info
    assert (info["format"], info["tfds_name"], info["tfds_version"]) == ("tfds", "tiny_images", "1.0.0")
    assert info["path"] == str(tfds_fixed) and info["splits"] == {"train": "train", "val": "test"}
    assert info["transform"] == "fixed" and (info["shards"], info["val_shards"]) == (1, 1)
    for split, ds in (("train", src.train), ("test", src.val)):
        x, y = in_file_order(ds)
        want_x, want_y = _tfds_in_file_order(tfds_fixed, split)
        assert y.tolist() == want_y and np.array_equal(x, want_x)  # declared size: decoded whole, pixel for pixel


@pytest.fixture(scope="module")
def tfds_any_size(tmp_path_factory):
    """A TFDS directory whose Image feature declares no size (as ImageNet's does), images of several sizes."""
    tfds = pytest.importorskip("tensorflow_datasets")
    rng = np.random.default_rng(5)
    labels = {"train": [0, 1, 1, 0, 1, 0], "validation": [1, 0]}
    splits = {split: [(f"{split}{i}", {"image": formats.image_array(rng, 20 + 7 * i, 40 - 3 * i), "label": k})
                      for i, k in enumerate(ks)] for split, ks in labels.items()}
    features = tfds.features.FeaturesDict({"image": tfds.features.Image(shape=(None, None, 3)),
                                           "label": tfds.features.ClassLabel(names=["cat", "dog"])})
    data_dir = tmp_path_factory.mktemp("tfds_any")
    tfds.dataset_builders.store_as_tfds_dataset(name="any_size", version="2.0.1", features=features,
                                                split_datasets=splits, data_dir=str(data_dir))
    return data_dir / "any_size" / "2.0.1", labels


def test_tfds_directory_of_any_image_size_defaults_to_224_inception_crops(tfds_any_size):
    vdir, labels = tfds_any_size
    src = load(vdir)
    assert (src.train_examples, src.val_examples, src.class_names) == (6, 2, ["cat", "dog"])
    assert src.input_shape == (224, 224, 3) and src.info["transform"] == "inception"
    assert src.info["splits"] == {"train": "train", "val": "validation"}
    _, y = in_file_order(src.train)
    assert sorted(y.tolist()) == sorted(labels["train"])
    src = load(vdir, image_size=24)
    assert src.input_shape == (24, 24, 3)


def test_tfds_directory_without_tensorflow_datasets_says_what_to_install(tmp_path, monkeypatch):
    vdir = tmp_path / "some_set" / "1.0.0"
    vdir.mkdir(parents=True)
    (vdir / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import tensorflow_datasets -> ImportError
    with pytest.raises(DataError, match=r"some_set is a TFDS-prepared directory; reading it needs tensorflow-datasets: "
                                        r"pip install -e \"\.\[tfds\]\" \(or pip install tensorflow-datasets\)"):
        load(tmp_path / "some_set")


# --- ImageNet-style image folders ------------------------------------------------------------------------------
SYNSETS = formats.synsets(3)


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory):
    return formats.image_folder(tmp_path_factory.mktemp("imgs") / "imagenet", classes=3, train=6, val=2,
                                sizes=(20, 60), seed=0, png_every=3)


def test_image_folder_of_mixed_jpeg_and_png_sizes_loads_at_their_median_shorter_side(mixed_folder, caplog):
    from PIL import Image

    assert len(list(mixed_folder.glob("train/*/*.png"))) == 6 and len(list(mixed_folder.glob("train/*/*.JPEG"))) == 12
    with caplog.at_level("INFO", logger="tftoolkit"):
        src = load(mixed_folder)
    assert (src.name, src.train_examples, src.val_examples) == ("imagenet", 18, 6)
    assert src.class_names == SYNSETS and src.num_classes == 3
    # 18 training images (all sampled): not blown up to 224, nor cut to the smallest
    side = int(np.median([min(Image.open(p).size) for p in sorted(mixed_folder.glob("train/*/*"))]))
    assert 20 <= side <= 60 and src.input_shape == (side, side, 3) and src.info["transform"] == "inception"
    shorter = [min(Image.open(p).size) for p in mixed_folder.glob("train/*/*")]
    assert (f"imagenet: images decoded at {side} px (the median shorter side of 18 sampled images of mixed sizes, "
            f"{min(shorter)}-{max(shorter)} px; set --image-size to choose)") in caplog.text  # the choice is said
    assert src.info["per_class"] == {s: 6 for s in SYNSETS} and src.info["skipped_not_image"] == 0
    assert len(src.info["image_sizes_sampled"]) > 1
    x, y = in_file_order(src.train)
    assert x.shape == (18, side, side, 3) and x.dtype == np.uint8 and y.tolist() == [0] * 6 + [1] * 6 + [2] * 6
    assert all(img.std() > 0 for img in x)  # decoded pictures, PNGs included, not blank
    _, vy = in_file_order(src.val)
    assert vy.tolist() == [0, 0, 1, 1, 2, 2]


def test_image_folder_of_one_image_size_defaults_to_its_shorter_side(tmp_path, caplog):
    rng = np.random.default_rng(1)
    for k, name in enumerate(["a", "b"]):
        d = tmp_path / "same" / name
        d.mkdir(parents=True)
        for i in range(3):
            fmt = "PNG" if i == 2 else "JPEG"
            (d / f"{i}.{fmt.lower()}").write_bytes(formats.encode(formats.image_array(rng, 20, 30), fmt))
    with caplog.at_level("INFO", logger="tftoolkit"):
        src = load(tmp_path / "same")
    assert src.input_shape == (20, 20, 3) and src.info["transform"] == "fixed"
    assert "same: images decoded at 20 px (the images' shorter side: all 6 sampled are 30x20)" in caplog.text
    assert src.info["image_sizes_sampled"] == [(30, 20)] and src.train_examples == 6 and src.val is None
    x, _ = in_file_order(src.train)
    assert x.shape == (6, 20, 20, 3)


@pytest.fixture()
def folder_copy(mixed_folder, tmp_path):
    return shutil.copytree(mixed_folder, tmp_path / "imagenet")


def test_files_that_are_not_images_are_counted_and_left_out(folder_copy, caplog):
    (folder_copy / "train" / SYNSETS[0] / "LICENSE.txt").write_text("not an image")
    (folder_copy / "val" / SYNSETS[2] / "boxes.xml").write_text("<annotation/>")
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        src = load(folder_copy, image_size=16)
    assert (src.train_examples, src.val_examples) == (18, 6)
    assert src.info["skipped_not_image"] == 2
    assert src.info["skipped_not_image_examples"] == [f"train/{SYNSETS[0]}/LICENSE.txt", f"val/{SYNSETS[2]}/boxes.xml"]
    assert "left out 2 file(s)" in caplog.text and f"train/{SYNSETS[0]}/LICENSE.txt" in caplog.text


def test_a_corrupt_image_stops_the_load_naming_the_file(folder_copy):
    bad = folder_copy / "train" / SYNSETS[1] / "broken.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG after all")
    with pytest.raises(DataError, match=rf"cannot use {re.escape(str(bad))}: .*; --skip-bad-images skips such images"):
        load(folder_copy, image_size=16)


def test_skip_bad_images_counts_and_logs_the_corrupt_image(folder_copy, caplog):
    bad = folder_copy / "train" / SYNSETS[1] / "broken.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG after all")
    with caplog.at_level(logging.WARNING, logger="tftoolkit"):
        src = load(folder_copy, image_size=16, skip_bad_images=True)
    assert src.train_examples == 18 and src.val_examples == 6
    assert src.info["skipped_images"] == 1 and src.info["skipped_image_examples"] == [str(bad)]
    assert f"skipped 1 image(s) that do not decode (--skip-bad-images): {bad}" in caplog.text
    _, y = in_file_order(src.train)
    assert np.bincount(y).tolist() == [6, 6, 6]


# --- one folder, two layouts -----------------------------------------------------------------------------------
def _imagenet_shards_and_class_folders(root):
    formats.image_folder(root, classes=2, train=1, val=1, sizes=(20, 20))
    (root / "train-00000-of-00001").write_bytes(b"")
    return root, ["imagenet", "folders"], (r"ImageNet-layout shards \(train-00000-of-00001, \.\.\.\) and class "
                                           r"sub-folders of images \(train/, val/\)")


def _manifest_and_cifar(root):
    path = formats.cifar_python(root, "cifar10", train_per_batch=1, test=1)
    (path / "manifest.json").write_text("{}")
    return path, ["manifest", "cifar"], r"manifest\.json and CIFAR's python files \(batches\.meta, \.\.\.\)"


def _tfds_and_class_folders(root):
    (root / "1.0.0").mkdir(parents=True)
    (root / "1.0.0" / "dataset_info.json").write_text("{}")
    for name in ("a", "b"):
        (root / name).mkdir()
        (root / name / "0.png").write_bytes(formats.encode(np.zeros((8, 8, 3), np.uint8), "PNG"))
    return root, ["tfds", "folders"], (r"a TFDS directory \(dataset_info\.json\) and class sub-folders of images "
                                       r"\(.*a/, b/\)")


@pytest.mark.parametrize("make", [_imagenet_shards_and_class_folders, _manifest_and_cifar, _tfds_and_class_folders])
def test_a_folder_mixing_two_layouts_is_refused_naming_both(tmp_path, make):
    path, kinds, both = make(tmp_path / "mixed")
    assert [k for k, _ in registry.layouts(path)] == kinds
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))} mixes dataset layouts: {both}; keep one dataset "
                                        r"per folder$"):
        load(path)


def test_a_tfds_data_root_is_recognised_and_its_datasets_named(tmp_path):
    for sub in ("mnist/3.0.1", "cifar10/3.0.2", "imagenette/320px-v2/1.0.0"):
        (tmp_path / "tensorflow_datasets" / sub).mkdir(parents=True)
        (tmp_path / "tensorflow_datasets" / sub / "dataset_info.json").write_text("{}")
    root = tmp_path / "tensorflow_datasets"
    with pytest.raises(DataError) as e:
        load(root)
    assert str(e.value) == (f"{root} is a TFDS data root holding cifar10/3.0.2, imagenette/320px-v2/1.0.0, "
                            f"mnist/3.0.1; give one of them: --dataset {root}/cifar10/3.0.2")
