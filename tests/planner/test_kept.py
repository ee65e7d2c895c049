"""planner.kept: a result computed once, read back by later processes while its inputs are unchanged."""

import os

import pytest

from tftoolkit.planner import kept as kept_mod
from tftoolkit.planner.kept import kept


def _counted(inputs):
    calls = []

    def table():
        calls.append(1)
        return {"rows": [1.5, 2.5], "n": len(calls)}

    return calls, table, (lambda: inputs)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TFTOOLKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_second_process_reads_the_kept_result_instead_of_computing_it(tmp_path, cache):
    data = tmp_path / "published.csv"
    data.write_text("gpus,images_per_sec\n1,100\n")
    calls, table, files = _counted([data])
    first = kept(table, files=files)
    assert first() == {"rows": [1.5, 2.5], "n": 1} and first() is first()  # once per process
    assert len(list(cache.glob("*.pkl"))) == 1
    again = kept(table, files=files)  # a new command: a new process's function, the same files
    assert again() == {"rows": [1.5, 2.5], "n": 1} and len(calls) == 1


def test_a_changed_input_computes_it_again_and_drops_the_old_file(tmp_path, cache):
    data = tmp_path / "published.csv"
    data.write_text("gpus,images_per_sec\n1,100\n")
    calls, table, files = _counted([data])
    kept(table, files=files)()
    data.write_text("gpus,images_per_sec\n1,101\n")  # one published figure corrected
    assert kept(table, files=files)()["n"] == 2 and len(calls) == 2
    assert len(list(cache.glob("*.pkl"))) == 1  # only the current key's file is kept


def test_a_corrupt_or_unwritable_cache_costs_only_the_time(tmp_path, cache, monkeypatch):
    data = tmp_path / "t.csv"
    data.write_text("x\n")
    calls, table, files = _counted([data])
    kept(table, files=files)()
    (path,) = cache.glob("*.pkl")
    path.write_bytes(b"\x80\x05 truncated")
    assert kept(table, files=files)()["rows"] == [1.5, 2.5] and len(calls) == 2  # recomputed, and kept again
    assert kept(table, files=files)()["n"] == 2 and len(calls) == 2
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("TFTOOLKIT_CACHE", str(blocked / "cache"))
    assert kept(table, files=files)()["rows"] == [1.5, 2.5] and len(calls) == 3


def test_the_key_covers_the_tables_the_catalogue_and_the_planner_s_code():
    names = {p.name for p in kept_mod.key_files()}
    assert {"published.csv", "heldout.csv", "gpus.toml", "links.toml", "systems.toml", "rates.toml", "reader.py",
            "validation.py", "intervals.py", "plan.py", "forecast.py", "comms.py", "config.py"} <= names


def test_the_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TFTOOLKIT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kept_mod.folder() == tmp_path / "tftoolkit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert kept_mod.folder() == kept_mod.Path(os.path.expanduser("~")) / ".cache" / "tftoolkit"
