"""tftoolkit.summary: the one list of summary.json's fields, used by the writer and declared by every reader."""

import importlib
import json

import pytest

from tftoolkit import summary


def test_every_field_has_a_unit_and_a_meaning():
    assert len(summary.FIELDS) > 60
    for f in summary.FIELDS.values():
        assert f.meaning and f.group and isinstance(f.unit, str), f


def test_an_undocumented_field_is_refused_by_the_writer():
    assert summary.check({"status": "ok", "images_per_sec": 1.0}) == {"status": "ok", "images_per_sec": 1.0}
    with pytest.raises(ValueError, match="not documented.*made_up_figure"):
        summary.check({"status": "ok", "made_up_figure": 3})


def test_a_reader_naming_an_unknown_field_fails():
    assert summary.names("images_per_sec", "mfu") == ("images_per_sec", "mfu")
    with pytest.raises(KeyError, match="imagez_per_sec"):
        summary.names("imagez_per_sec")


@pytest.mark.parametrize("reader", ["tftoolkit.experiments.scale", "tftoolkit.experiments.report.tables",
                                    "tftoolkit.tuning.advise", "tftoolkit.planner.predict"])
def test_readers_declare_documented_fields(reader):
    # Each declares its fields with summary.names at import: importing it is the check.
    importlib.import_module(reader)


def test_read_takes_a_run_directory_or_its_file(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "ok", "steps": 3}))
    assert summary.read(tmp_path) == summary.read(tmp_path / "summary.json") == {"status": "ok", "steps": 3}


def test_the_table_lists_every_field():
    text = summary.table()
    assert all(f"`{name}`" in text for name in summary.FIELDS)


def test_a_throughput_says_how_it_was_measured():
    from tftoolkit import summary

    s = {"precision": "mixed_bfloat16", "jit_effective": True, "deterministic": False, "data_placement": "device",
         "cross_device_ops": "collective_nccl (xla)"}
    assert summary.measured_with(s) == ("mixed_bfloat16, XLA, non-deterministic ops, data on the devices, "
                                        "all-reduce collective_nccl (xla)")
    assert summary.measured_with({"precision": "float32", "deterministic": True, "jit_effective": float("nan")}) == \
        "float32, deterministic ops"
    assert summary.measured_with({}) == ""  # a run from before these fields: nothing claimed


def test_a_number_written_as_null_reads_back_as_nan_and_text_stays_none(tmp_path):
    # summary.json is strict JSON, so an unknown number is null there; readers keep getting NaN for it, as the run's
    # own returned summary has, and None for a text field that does not apply.
    import math

    from tftoolkit import fileio

    fileio.write_json(tmp_path / "summary.json", {"status": "ok", "error": None, "images_per_sec": math.nan,
                                                  "val_loss": math.nan, "val_top3": math.nan, "timed_steps": 0,
                                                  "noise_scale_interval": [math.inf, math.inf],
                                                  "segments": [{"images_per_sec": math.nan}]})
    s = summary.read(tmp_path)
    assert s["error"] is None and s["status"] == "ok" and s["timed_steps"] == 0
    assert math.isnan(s["images_per_sec"]) and math.isnan(s["val_loss"]) and math.isnan(s["val_top3"])
    assert all(math.isnan(v) for v in s["noise_scale_interval"])
    assert math.isnan(s["segments"][0]["images_per_sec"])


@pytest.mark.parametrize("text, why", [('{"status": "ok", "replicas": 2', "not readable JSON"),
                                       ("[]", "holds a JSON list"),
                                       ('{"status": "ok", "replicas": "two"}', "field 'replicas' is 'two'"),
                                       ('{"images_per_sec": [1.0, "x"]}', "field 'images_per_sec'"),
                                       (b"\xff\xfe{", "not readable JSON")])
def test_a_summary_not_written_by_a_run_is_one_data_error_for_every_reader(tmp_path, capsys, text, why):
    from tftoolkit import cli
    from tftoolkit.errors import DataError

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DataError, match=why):
        summary.read(run)
    with pytest.raises(ValueError):  # a reader of many runs lists this one as unreadable and goes on
        summary.read(run)
    for argv in (["advise", str(run)], ["predict", str(run)]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "summary.json" in err[0] and "Error:" not in err[0], err
