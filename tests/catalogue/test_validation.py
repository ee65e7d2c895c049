"""The validation tables: published multi-GPU throughput rows, each with its source, named in catalogue terms."""

import csv
import re
from collections import defaultdict
from pathlib import Path

import pytest

from tftoolkit import catalogue

VALIDATION = Path(__file__).resolve().parents[2] / "validation"
COLUMNS = ["source", "commit", "table", "hardware", "system", "gpu", "gpus", "hosts", "gpus_per_host", "interconnect",
           "inter_host", "model", "per_gpu_batch", "precision", "framework", "allreduce", "data", "images_per_sec",
           "baseline", "notes"]
FILES = ["published.csv", "heldout.csv"]


def _rows(name):
    with open(VALIDATION / name, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        return list(reader)


@pytest.mark.parametrize("name", FILES)
def test_every_row_names_its_source_commit_and_table(name):
    rows = _rows(name)
    assert rows
    for r in rows:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+:\S+", r["source"]), r["source"]      # owner/repo:path
        assert re.fullmatch(r"[0-9a-f]{40}", r["commit"]), r["commit"]
        assert r["table"] and r["hardware"] and r["framework"] and r["allreduce"], r


@pytest.mark.parametrize("name", FILES)
def test_every_name_resolves_in_the_catalogue_and_numbers_are_numbers(name):
    for r in _rows(name):
        catalogue.gpu(r["gpu"])
        catalogue.link(r["interconnect"])
        if r["system"]:
            assert catalogue.system(r["system"]).gpu == catalogue.gpu(r["gpu"]).key
        if r["inter_host"]:
            catalogue.link(r["inter_host"])
        gpus, hosts, per_host = int(r["gpus"]), int(r["hosts"]), int(r["gpus_per_host"])
        assert gpus == hosts * per_host, r
        assert (hosts > 1) == bool(r["inter_host"]), r
        assert int(r["per_gpu_batch"]) > 0 and float(r["images_per_sec"]) > 0, r
        assert r["precision"] in ("fp32", "tf32", "amp"), r
        catalogue.matmul_tflops(catalogue.gpu(r["gpu"]), "mixed_float16" if r["precision"] == "amp" else r["precision"])


@pytest.mark.parametrize("name", FILES)
def test_every_multi_gpu_series_has_its_one_gpu_row(name):
    by_baseline = defaultdict(list)
    for r in _rows(name):
        by_baseline[r["baseline"]].append(r)
    for baseline, rows in by_baseline.items():
        ones = [r for r in rows if r["gpus"] == "1"]
        assert len(ones) == 1, baseline
        for r in rows:   # rows of one series differ only in the GPU count and how the GPUs are joined
            assert (r["source"], r["commit"], r["gpu"], r["model"], r["per_gpu_batch"], r["precision"], r["data"]) == (
                ones[0]["source"], ones[0]["commit"], ones[0]["gpu"], ones[0]["model"], ones[0]["per_gpu_batch"],
                ones[0]["precision"], ones[0]["data"]), baseline


def test_held_out_rows_share_no_source_with_the_fitted_ones():
    assert not {r["source"] for r in _rows("published.csv")} & {r["source"] for r in _rows("heldout.csv")}


def test_published_rows_copy_the_tables_exactly():
    rows = {(r["baseline"], r["gpus"]): r["images_per_sec"] for r in _rows("published.csv")}
    assert rows[("tf2017 dgx1 synthetic batch64 vgg16", "8")] == "1081"
    assert rows[("tf2017 aws-distributed main resnet50", "64")] == "2744"
    assert rows[("dle2020 DGX-2 amp", "16")] == "17250"
    assert rows[("dle2019 DGX-1 fp32", "4")] == "1419.4"
    held = {(r["baseline"], r["gpus"], r["interconnect"]): r for r in _rows("heldout.csv")}
    row = held[("lambda fp32 RTX 2080Ti vgg16", "8", "pcie3")]
    assert row["images_per_sec"] in ("961", "1081") and row["per_gpu_batch"] == "56"
