"""tftoolkit.fileio: a write is all or nothing, and readable by others."""

import os
import stat

import pandas as pd
import pytest

from tftoolkit import fileio
from tftoolkit.errors import RunDirError

from helpers import strict_json


def test_text_bytes_and_writer_functions(tmp_path):
    fileio.atomic_write(tmp_path / "a.txt", "hello")
    fileio.atomic_write(tmp_path / "b.bin", b"\x00\x01")
    fileio.atomic_write(tmp_path / "sub" / "c.txt", lambda f: f.write("x,y\n"))
    fileio.write_json(tmp_path / "d.json", {"n": 1})
    fileio.write_csv(tmp_path / "e.csv", pd.DataFrame({"x": [1, 2]}))
    assert (tmp_path / "a.txt").read_text() == "hello" and (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "sub" / "c.txt").read_text() == "x,y\n" and fileio.read_json(tmp_path / "d.json") == {"n": 1}
    assert pd.read_csv(tmp_path / "e.csv")["x"].tolist() == [1, 2]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    fileio.write_json(path, {"status": "ok"})

    def half_then_fail(f):
        f.write('{"status": "fa')
        raise OSError(28, "No space left on device")

    with pytest.raises(RunDirError, match="No space left on device"):
        fileio.atomic_write(path, half_then_fail)
    assert fileio.read_json(path) == {"status": "ok"}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_files_are_readable_by_others_unless_private(tmp_path):
    old = os.umask(0o022)
    try:
        fileio.atomic_write(tmp_path / "public", "x")
        fileio.atomic_write(tmp_path / "private", "x", public=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "public").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600


def test_numpy_values_become_json(tmp_path):
    import numpy as np

    fileio.write_json(tmp_path / "n.json", {"a": np.float32(1.5), "b": np.arange(3), "c": (np.int64(2),)})
    assert fileio.read_json(tmp_path / "n.json") == {"a": 1.5, "b": [0, 1, 2], "c": [2]}


def test_json_files_are_strict_with_null_for_numbers_that_are_not_finite(tmp_path):
    import math

    import numpy as np

    fileio.write_json(tmp_path / "s.json", {"rate": math.nan, "interval": [math.inf, -math.inf], "ok": 2.5,
                                            "np": np.float32("nan"), "nested": {"a": np.array([1.0, np.nan])}})
    assert strict_json((tmp_path / "s.json").read_text()) == {"rate": None, "interval": [None, None], "ok": 2.5,
                                                             "np": None, "nested": {"a": [1.0, None]}}


def test_sizes_are_written_with_the_digits_that_say_something():
    from tftoolkit.fileio import size_text

    assert [size_text(b) for b in (1e6, 5.2e6, 1.25e9, 23.4e9, 640e9, 900e3, 12)] == \
        ["1.00 MB", "5.20 MB", "1.25 GB", "23.4 GB", "640 GB", "900 kB", "12 B"]  # --data-memory-gb 0.001: 1.00 MB
