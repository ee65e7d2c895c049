"""The hardware catalogue: every figure sourced, names resolve the way NVML prints them, units consistent."""

import subprocess
import sys

import pytest

from tftoolkit import catalogue
from tftoolkit.catalogue import reader
from tftoolkit.errors import ConfigError

KINDS = ("gpu", "link", "system", "rate")
ENTRIES = [(kind, key) for kind in KINDS for key in reader.read_file(kind)[kind]]


def _source_ok(text: str, keys: set[str]) -> bool:
    low = text.lower()
    if low.startswith(("unconfirmed", "n/a", "definition")):
        return True
    words = text.split("(")[0].split()
    return bool(words) and all(w in keys for w in words)


@pytest.mark.parametrize("kind,key", ENTRIES)
def test_every_figure_names_a_source_or_says_unconfirmed(kind, key):
    raw = reader.read_file(kind)
    sources = set(raw["sources"])
    body = raw[kind][key]
    source = body.get("source", {})
    present = [f for f in reader.FIGURES[kind] if f in body and body[f] != ""]
    missing = [f for f in present if f not in source]
    assert not missing, f"{kind} {key}: figures without a source: {missing}"
    bad = {f: t for f, t in source.items() if not _source_ok(t, sources)}
    assert not bad, f"{kind} {key}: sources that are neither keys of [sources] nor 'unconfirmed'/'n/a': {bad}"
    # A figure marked n/a is not given a value.
    assert not [f for f, t in source.items() if t.lower().startswith("n/a") and f in body]


# The workplace's folders outside the repository, spelt in two parts so the repository-wide scan for such citations
# (tests/test_layout.py) does not flag this test itself.
LOCAL_FOLDERS = ("/work" + "/", "shared" + "/")


def test_sources_are_urls_or_citations_never_local_paths():
    for kind in KINDS:
        for key, text in reader.read_file(kind)["sources"].items():
            assert not any(local in text for local in LOCAL_FOLDERS), (kind, key)


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("Tesla V100-SXM2-16GB", "v100-sxm2-16"), ("h100-sxm", "h100-sxm"),
    ("v100", "v100-sxm2-16"), ("Tesla K80", "k80"), ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80"), ("NVIDIA A100-PCIE-80GB", "a100-pcie-80"),
    ("NVIDIA GeForce RTX 2080 Ti", "rtx-2080-ti"), ("GeForce RTX 2080 Ti", "rtx-2080-ti"),
    ("Quadro RTX 8000", "quadro-rtx-8000"), ("NVIDIA RTX A6000", "rtx-a6000"), ("nvidia  geforce rtx 4090", "rtx-4090"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"), ("NVIDIA H200", "h200-sxm"), ("Tesla T4", "t4"),
    ("NVIDIA L40S", "l40s"), ("NVIDIA A10G", "a10g"), ("Tesla V100-SXM3-32GB", "v100-sxm3-32"),
])
def test_gpu_names_resolve_as_nvml_prints_them_and_by_alias(name, key):
    assert catalogue.gpu(name).key == key


def test_every_issue_gpu_is_covered():
    keys = {g.key for g in catalogue.gpus()}
    assert {"k80", "p100-pcie", "p100-sxm2", "v100-pcie-16", "v100-sxm2-16", "v100-sxm2-32", "v100-sxm3-32", "t4",
            "a100-pcie-40", "a100-pcie-80", "a100-sxm4-40", "a100-sxm4-80", "a10", "a10g", "l4", "l40s",
            "h100-pcie", "h100-sxm", "h100-nvl", "h200-sxm", "h200-nvl", "rtx-2080-ti", "quadro-rtx-6000",
            "quadro-rtx-8000", "rtx-a6000", "rtx-3090", "rtx-4090", "rtx-6000-ada"} <= keys


@pytest.mark.parametrize("lookup,kind", [(catalogue.gpu, "gpu"), (catalogue.link, "link"),
                                         (catalogue.system, "system")])
def test_unknown_name_is_one_line_listing_the_known_ones(lookup, kind):
    with pytest.raises(ConfigError) as info:
        lookup("no-such-thing")
    text = str(info.value)
    assert "\n" not in text and "no-such-thing" in text
    known = {"gpu": ["h100-sxm", "k80", "rtx-4090"], "link": ["pcie3", "nvlink2", "ib-hdr"],
             "system": ["dgx1-v100", "dgx2", "pcie-8x-2switch"]}[kind]
    assert all(k in text for k in known)


def test_gpu_units_are_consistent():
    for g in catalogue.gpus():
        for unit in ("tf32", "fp16", "bf16"):
            value = getattr(g, f"{unit}_tflops")
            if value is not None and g.fp32_tflops is not None:
                assert value >= g.fp32_tflops, (g.key, unit)
        if g.fp64_tflops is not None:
            assert g.fp64_tflops <= g.fp32_tflops, g.key
        assert g.memory_gb is None or 8 <= g.memory_gb <= 200, g.key
        assert g.memory_bandwidth_gbs is None or 200 <= g.memory_bandwidth_gbs <= 6000, g.key
        assert g.pcie_gen in (None, 3, 4, 5), g.key
        if g.nvlink_links and g.nvlink_gbs:
            assert g.nvlink_gbs / g.nvlink_links in (20.0, 25.0), g.key
        assert g.segment in ("datacenter", "workstation", "geforce"), g.key
        assert g.peer_to_peer is (g.segment != "geforce"), g.key


def test_links_are_per_direction_with_achieved_below_rated():
    for lk in catalogue.links():
        assert lk.gbs > 0, lk.key
        assert lk.achieved_gbs is None or lk.achieved_gbs <= lk.gbs, lk.key
        if lk.per_link_gbs and lk.links:
            assert lk.per_link_gbs * lk.links == pytest.approx(lk.gbs), lk.key
    assert catalogue.link("pcie3").gbs < catalogue.link("pcie4").gbs < catalogue.link("pcie5").gbs
    assert catalogue.link("ib-hdr").gbs == 2 * catalogue.link("ib-edr").gbs == 25.0


def test_systems_name_catalogue_entries_and_their_nvlink_mesh_adds_up():
    for s in catalogue.systems():
        if not s.generic:
            g = s.gpu_entry
            assert s.gpus in (8, 16)
        s.intra_link, s.nic_link, catalogue.link(s.host_link)
        if s.topology == "hybrid-cube-mesh":
            for i in range(s.gpus):
                assert sum(s.neighbours(i).values()) == g.nvlink_links, (s.key, i)
                assert len(s.neighbours(i)) == 4, (s.key, i)
        if s.topology == "pcie-tree":
            assert s.pcie_switches * s.gpus_per_switch == s.gpus
    v = catalogue.system("dgx1-v100")
    assert v.neighbours(0) == {1: 1, 2: 1, 3: 2, 4: 2}
    assert 5 not in v.neighbours(0)           # not every pair has NVLink: the mesh is not all-to-all


def test_matmul_rate_follows_tensorflows_defaults():
    assert catalogue.matmul_tflops(catalogue.gpu("a100"), "float32") == (156.0, "tf32")    # TF32 by default
    assert catalogue.matmul_tflops(catalogue.gpu("v100"), "float32") == (15.7, "fp32")    # no TF32 on Volta
    assert catalogue.matmul_tflops(catalogue.gpu("v100"), "mixed_float16") == (125.0, "fp16")
    assert catalogue.matmul_tflops(catalogue.gpu("k80"), "mixed_float16") == (4.37, "fp32")
    assert catalogue.matmul_tflops(catalogue.gpu("h100-nvl"), "float32") == (None, "tf32")  # unknown, no fallback
    with pytest.raises(ConfigError):
        catalogue.matmul_tflops(catalogue.gpu("a100"), "int3")


def test_files_parse_without_tensorflow():
    code = ("import sys; from tftoolkit import catalogue; catalogue.gpus(); catalogue.links(); catalogue.systems(); "
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
