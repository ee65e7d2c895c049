"""tftoolkit.engine.checkpoint: saves a kill cannot half-write, and a resume that falls back past a damaged one."""

import errno
import os

import numpy as np
import pytest

from tftoolkit import fileio
from tftoolkit.engine import checkpoint
from tftoolkit.errors import RunDirError


def _objects(value=0.0):
    import tensorflow as tf

    return {"w": tf.Variable(np.full(1000, value, np.float32)), "step": tf.Variable(0, dtype=tf.int64)}


def _save(ckpts, objs, step, value):
    objs["w"].assign(np.full(1000, value, np.float32))
    objs["step"].assign(step)
    ckpts.save(step)


def test_saves_keep_the_two_newest_and_the_state_file(tmp_path):
    import tensorflow as tf

    objs = _objects()
    c = checkpoint.Checkpoints(tmp_path / "ck", objs)
    for step in (2, 4, 6):
        _save(c, objs, step, step)
    assert checkpoint.steps_on_disk(tmp_path / "ck") == [6, 4]
    assert tf.train.latest_checkpoint(str(tmp_path / "ck")).endswith("ckpt-6")
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".tmp")]
    fresh = _objects()
    assert checkpoint.Checkpoints(tmp_path / "ck", fresh).restore_latest().endswith("ckpt-6")
    assert int(fresh["step"].numpy()) == 6 and float(fresh["w"].numpy()[0]) == 6.0


def test_what_a_kill_mid_save_leaves_is_ignored_and_cleaned(tmp_path):
    objs = _objects()
    c = checkpoint.Checkpoints(tmp_path / "ck", objs)
    _save(c, objs, 2, 2.0)
    # A kill during the next save: a temporary folder, and a data file renamed before its index.
    (tmp_path / "ck" / ".tmp-ckpt-4-999").mkdir()
    (tmp_path / "ck" / ".tmp-ckpt-4-999" / "ckpt-4.index").write_bytes(b"half")
    (tmp_path / "ck" / "ckpt-4.data-00000-of-00001").write_bytes(b"half")
    fresh = _objects()
    assert checkpoint.Checkpoints(tmp_path / "ck", fresh).restore_latest().endswith("ckpt-2")
    assert float(fresh["w"].numpy()[0]) == 2.0
    _save(c, objs, 6, 6.0)
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert not [n for n in names if n.startswith(".tmp") or n.startswith("ckpt-4")], names


@pytest.mark.parametrize("damage", ["truncated data", "empty index", "a tensor missing"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog, damage):
    import tensorflow as tf

    objs = _objects()
    c = checkpoint.Checkpoints(tmp_path / "ck", objs)
    _save(c, objs, 2, 2.0)
    _save(c, objs, 4, 4.0)
    ck = tmp_path / "ck"
    if damage == "truncated data":
        data = ck / "ckpt-4.data-00000-of-00001"
        data.write_bytes(data.read_bytes()[:1000])
    elif damage == "empty index":
        (ck / "ckpt-4.index").write_bytes(b"")
    else:  # a checkpoint of other objects under the newest name: the run's variables are not all in it
        other = tf.train.Checkpoint(other=tf.Variable(1.0))
        other.save_counter.assign(3)
        other.save(str(ck / "ckpt"))
    fresh = _objects()
    with caplog.at_level("WARNING", logger="tftoolkit"):
        path = checkpoint.Checkpoints(ck, fresh).restore_latest()
    assert path.endswith("ckpt-2") and float(fresh["w"].numpy()[0]) == 2.0 and int(fresh["step"].numpy()) == 2
    assert "ckpt-4 does not restore" in caplog.text and "falling back" in caplog.text


def test_when_no_checkpoint_restores_the_error_names_them_and_the_way_out(tmp_path):
    objs = _objects()
    c = checkpoint.Checkpoints(tmp_path / "ck", objs)
    _save(c, objs, 2, 2.0)
    _save(c, objs, 4, 4.0)
    for step in (2, 4):
        (tmp_path / "ck" / f"ckpt-{step}.index").write_bytes(b"")
    with pytest.raises(RunDirError) as e:
        checkpoint.Checkpoints(tmp_path / "ck", _objects()).restore_latest()
    assert "ckpt-4 (" in str(e.value) and "ckpt-2 (" in str(e.value) and "--force" in str(e.value)


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoints(tmp_path, monkeypatch):
    objs = _objects()
    c = checkpoint.Checkpoints(tmp_path / "ck", objs)
    _save(c, objs, 2, 2.0)

    def full(prefix, *a, **k):
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        raise OSError(errno.ENOSPC, "No space left on device", prefix)

    monkeypatch.setattr(c.checkpoint, "save", full)
    with pytest.raises(RunDirError, match=r"cannot write checkpoint .*ckpt-4: No space left on device \(ENOSPC\)"):
        _save(c, objs, 4, 4.0)
    assert checkpoint.steps_on_disk(tmp_path / "ck") == [2]
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".tmp")]


def test_a_non_chief_saves_nothing_that_stays(tmp_path):
    objs = _objects()
    checkpoint.Checkpoints(tmp_path / "ck", objs, worker_id=1).save(2)
    assert not (tmp_path / "ck" / "workertemp_1").exists() and checkpoint.steps_on_disk(tmp_path / "ck") == []


def test_a_state_file_s_temporary_left_by_a_kill_goes_on_resume_and_on_the_next_save(tmp_path):
    objs = _objects()
    c = checkpoint.Checkpoints(tmp_path / "ck", objs)
    _save(c, objs, 2, 2.0)
    # Killed while rewriting the ``checkpoint`` state file (fileio.atomic_write's temporary name).
    (tmp_path / "ck" / f".checkpoint.{fileio.TEMP_TAG}k1ll3d.tmp").write_text('model_checkpoint_path: "ckpt')
    checkpoint.Checkpoints(tmp_path / "ck", _objects()).restore_latest()  # the resume
    assert not list((tmp_path / "ck").glob(".*.tmp"))
    (tmp_path / "ck" / f".checkpoint.{fileio.TEMP_TAG}4g41n.tmp").write_text("")  # a second run in this process, killed the same way
    _save(c, objs, 4, 4.0)
    assert not list((tmp_path / "ck").glob(".*.tmp"))
    assert checkpoint.steps_on_disk(tmp_path / "ck") == [4, 2]
