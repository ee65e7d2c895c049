"""A catalogue file edited to be invalid is one line naming the file, the entry and the field, never a traceback
or a silently wrong figure."""

import shutil

import pytest

from tftoolkit.catalogue import reader
from tftoolkit.cli import main
from tftoolkit.errors import ConfigError


@pytest.fixture
def catalogue_copy(tmp_path, monkeypatch):
    """The catalogue's files copied to tmp_path and read from there; the reader's cache cleared around the test."""
    for name in ("gpus.toml", "links.toml", "systems.toml", "rates.toml"):
        shutil.copy(reader.HERE / name, tmp_path / name)
    monkeypatch.setattr(reader, "HERE", tmp_path)
    reader._load.cache_clear()
    yield tmp_path
    reader._load.cache_clear()


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_every_entry_of_the_real_catalogue_passes_the_checks():
    reader._load.cache_clear()
    for kind in ("gpu", "link", "system", "rate"):
        assert reader._load(kind)[0]


@pytest.mark.parametrize("value,words", [
    ("nan", "finite number"), ("inf", "finite number"), ("-15.7", "finite number"), ('"fast"', "finite number"),
])
def test_a_bad_figure_is_refused_naming_the_file_entry_and_field(catalogue_copy, value, words):
    _edit(catalogue_copy / "gpus.toml", "fp32_tflops = 15.7\n", f"fp32_tflops = {value}\n")
    with pytest.raises(ConfigError) as e:
        reader.gpu("v100")
    text = str(e.value)
    assert "gpus.toml" in text and "[gpu.v100-sxm2-16]" in text and "fp32_tflops" in text and words in text


def test_an_unknown_field_is_refused(catalogue_copy):
    _edit(catalogue_copy / "gpus.toml", "fp32_tflops = 15.7\n", "fp32_tflops = 15.7\nfp33_tflops = 3\n")
    with pytest.raises(ConfigError, match=r"gpus.toml: \[gpu.v100-sxm2-16\] has an unknown field.*fp33_tflops"):
        reader.gpu("v100")


def test_a_syntax_error_is_refused_naming_the_file(catalogue_copy):
    _edit(catalogue_copy / "links.toml", "[link.pcie3]", "[link.pcie3")
    with pytest.raises(ConfigError, match=r"links.toml: not valid TOML"):
        reader.link("pcie3")


def test_the_cli_says_it_in_one_line_with_exit_code_2(catalogue_copy, capsys):
    _edit(catalogue_copy / "gpus.toml", "fp32_tflops = 15.7\n", "fp32_tflops = nan\n")
    assert main(["predict", "--gpu", "v100", "--params", "1000", "--per-replica-batch", "8",
                 "--images-per-sec", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "[gpu.v100-sxm2-16] fp32_tflops = nan" in err
