"""tftoolkit.data.manifest: what a manifest may name (shards inside its folder) and declare (classes that fit)."""

import json

import pytest

from tftoolkit import cli
from tftoolkit.data import manifest, shapes, tfrecords
from tftoolkit.errors import DataError


def _manifest(folder, files=("train-0.tfrecord",), num_classes=10):
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"format": manifest.FORMAT, "image_shape": [8, 8, 3], "num_classes": num_classes,
           "splits": {"train": {"examples": 1, "shards": [{"file": f} for f in files]}}}
    (folder / manifest.MANIFEST).write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize("name", ["../x.tfrecord", "/etc/passwd", "sub/../../x", ""])
def test_a_shard_outside_the_dataset_folder_is_refused_naming_it(tmp_path, name):
    folder = _manifest(tmp_path / "ds", files=("train-0.tfrecord", name))
    with pytest.raises(DataError, match=f"shard {name!r} is not a path inside the dataset's folder"):
        manifest.read_manifest(folder)
    assert manifest.read_manifest(_manifest(tmp_path / "ok", files=("sub/train-0.tfrecord",)))["num_classes"] == 10


def test_a_rewritten_dataset_never_deletes_what_an_old_manifest_names_outside_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    folder = _manifest(tmp_path / "ds", files=("../victim.txt", str(victim)))
    shapes.prepare(folder, images=8, val_images=0, size=8, shard_size=8, force=True)
    assert victim.read_text() == "the user's"


@pytest.mark.parametrize("n", [10**9, 0, -3, 2.5, "10", True])
def test_classes_that_cannot_fit_are_refused_before_training(tmp_path, n):
    with pytest.raises(DataError, match="num_classes .* must be a whole number from 1 to 1,000,000"):
        manifest.read_manifest(_manifest(tmp_path / "ds", num_classes=n))


@pytest.mark.parametrize("doc", ["[]", '{"image_shape": [8, 8, 3], "num_classes": 2, "splits": []}',
                                 '{"image_shape": [8, 8, 3], "num_classes": 2, "splits": {"train": {"shards": 3}}}'])
def test_a_manifest_of_the_wrong_shape_is_one_data_error(tmp_path, doc):
    (tmp_path / manifest.MANIFEST).write_text(doc)
    with pytest.raises(DataError):
        manifest.read_manifest(tmp_path)


@pytest.mark.parametrize("args, why", [(["--images", "1000000000000"], "of memory"),
                                       (["--size", "100000"], "of memory"),
                                       (["--images", "4000000", "--size", "2000", "--shard-size", "1"], "on disk")])
def test_prepare_refuses_what_cannot_fit_here_in_one_line(tmp_path, capsys, args, why):
    assert cli.main(["data", "prepare", "--out", str(tmp_path / "ds"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0] and "lower" in err[0]
    assert not (tmp_path / "ds").exists()


def test_prepare_into_a_file_or_a_link_loop_is_one_line(tmp_path, capsys):
    (tmp_path / "a_file").write_text("mine")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for out, why in ((tmp_path / "a_file", "is a file, not a folder"), (tmp_path / "loop", "symbolic link")):
        assert cli.main(["data", "prepare", "--out", str(out), "--images", "8", "--val-images", "0", "--size", "8"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
    assert (tmp_path / "a_file").read_text() == "mine"
