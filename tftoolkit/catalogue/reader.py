"""Read the catalogue's TOML files into frozen dataclasses and look entries up by name.

Schema (the files' own headers say the same): each file has a ``[sources]`` table (key -> URL or citation) and one
table per entry (``[gpu.<key>]``, ``[link.<key>]``, ``[system.<key>]``) with the entry's figures and a
``source`` sub-table naming, for every figure present, the source keys it comes from (space-separated) or a text
beginning with "unconfirmed". A figure a GPU does not have (no TF32 unit on a V100) is left out of the entry and its
``source`` says "n/a: why".

Names resolve case- and space-insensitively against the entry key, its ``names`` (what NVML prints) and its
``aliases``; a leading "NVIDIA ", "Tesla " or "GeForce " may be left out ("RTX 4090", "V100-SXM2-16GB").
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

HERE = Path(__file__).parent

# Figures an entry may carry; each present one needs a source. Units are in the names: TFLOP/s dense (no 2:4
# sparsity), GB = 10^9 B, GB/s per direction, W.
FIGURES = {
    "gpu": ("architecture", "chip", "compute_capability", "fp64_tflops", "fp32_tflops", "tf32_tflops", "fp16_tflops",
            "bf16_tflops", "memory_gb", "memory_type", "memory_bandwidth_gbs", "tdp_w", "pcie_gen",
            "nvlink_version", "nvlink_links", "nvlink_gbs", "peer_to_peer", "gpus_per_board"),
    "link": ("gbs", "achieved_gbs", "latency_us", "per_link_gbs", "links"),
    "system": ("gpu", "gpus", "intra_host", "topology", "nvlink_edges", "nvswitches", "pcie_switches",
               "gpus_per_switch", "cpus", "nics", "nic", "host_link"),
    "rate": ("gpu", "model", "precision", "per_gpu_batch", "images_per_sec", "framework", "date"),
}
_PREFIXES = ("nvidia ", "tesla ", "geforce ")


def normalise(name: str) -> str:
    """Lower case, runs of spaces and underscores as one space: "NVIDIA  A100_PCIE" -> "nvidia a100 pcie"."""
    return re.sub(r"[\s_]+", " ", str(name).strip().lower())


def _stripped(name: str) -> str:
    text = normalise(name)
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if text.startswith(prefix):
                text, changed = text[len(prefix):], True
    return text


@dataclass(frozen=True)
class Entry:
    key: str
    description: str
    names: tuple[str, ...]
    aliases: tuple[str, ...]
    source: dict[str, str] = field(repr=False)
    note: str = ""

    @property
    def unconfirmed(self) -> tuple[str, ...]:
        """The figures whose source says "unconfirmed"."""
        return tuple(k for k, v in self.source.items() if v.lower().startswith("unconfirmed"))


@dataclass(frozen=True)
class GPU(Entry):
    """One GPU as the device NVML reports (a K80 board is two of these)."""
    segment: str = ""                  # datacenter | workstation | geforce
    form_factor: str = ""              # SXM2, PCIe, ...
    architecture: str = ""
    chip: str = ""                     # the die (GA100, GA102, ...): an achieved fraction transfers only within one
    compute_capability: str = ""
    fp64_tflops: float | None = None
    fp32_tflops: float | None = None   # CUDA cores
    tf32_tflops: float | None = None   # tensor cores, TF32 (Ampere and later)
    fp16_tflops: float | None = None   # tensor cores (Volta on), FP32 accumulate; P100: packed FP16 on CUDA cores
    bf16_tflops: float | None = None   # tensor cores, FP32 accumulate (Ampere and later)
    memory_gb: float | None = None
    memory_type: str = ""
    memory_bandwidth_gbs: float | None = None
    tdp_w: float | None = None
    pcie_gen: int | None = None
    nvlink_version: int | None = None
    nvlink_links: int | None = None
    nvlink_gbs: float | None = None    # all links together, per direction
    peer_to_peer: bool | None = None   # GPU-to-GPU over PCIe in one host; False: traffic goes through host memory
    gpus_per_board: int = 1            # GPUs on one card, sharing its PCIe connector (K80: two GK210)

    @property
    def tf32_by_default(self) -> bool:
        """TensorFlow runs float32 matmuls and convolutions as TF32 on Ampere and later unless told not to
        (``tf.config.experimental.enable_tensor_float_32_execution``): that is compute capability 8.0 and up."""
        return float(self.compute_capability or 0) >= 8.0


@dataclass(frozen=True)
class Link(Entry):
    """A link preset: the bandwidth one GPU (or one NIC) has on it, per direction."""
    kind: str = ""                     # pcie | nvlink | nvswitch | infiniband | ethernet
    gbs: float | None = None           # rated, per direction
    achieved_gbs: float | None = None  # what a ring/all-reduce reaches in practice, where a source says
    latency_us: float | None = None    # per hop, where a source says
    per_link_gbs: float | None = None  # NVLink: one link, per direction
    links: int | None = None           # NVLink: links per GPU that make up gbs


@dataclass(frozen=True)
class System(Entry):
    """A named server: which GPUs, how many, how they are wired, and what leaves the host."""
    gpu: str = ""                      # a gpus.toml key
    gpus: int = 0
    intra_host: str = ""               # a links.toml key: what the GPUs talk over inside the host
    topology: str = ""                 # switch | hybrid-cube-mesh | pcie-tree
    nvlink_edges: tuple[tuple[int, int, int], ...] = ()   # (gpu a, gpu b, NVLink links between them)
    nvswitches: int | None = None
    pcie_switches: int | None = None
    gpus_per_switch: int | None = None
    cpus: int | None = None
    nics: int | None = None            # NICs per host for traffic between hosts
    nic: str = ""                      # a links.toml key
    host_link: str = ""                # links.toml key of each GPU's (and NIC's) PCIe link to its switch/CPU
    host_staging_gbs: float | None = None  # per CPU socket: what GPU-to-GPU traffic staged through its memory shares
    socket_link_gbs: float | None = None   # between the CPU sockets, per direction (a ring spanning them crosses it)
    generic: bool = False              # a layout, not a product: the caller names the GPU

    def neighbours(self, index: int) -> dict[int, int]:
        """GPU ``index``'s direct NVLink peers -> number of links to each (empty for switch or PCIe systems)."""
        out: dict[int, int] = {}
        for a, b, n in self.nvlink_edges:
            if index in (a, b):
                out[b if a == index else a] = out.get(b if a == index else a, 0) + n
        return out

    @property
    def gpu_entry(self) -> GPU:
        return gpu(self.gpu)

    @property
    def intra_link(self) -> Link:
        return link(self.intra_host)

    @property
    def nic_link(self) -> Link | None:
        return link(self.nic) if self.nic else None


@dataclass(frozen=True)
class Rate(Entry):
    """One published or measured single-GPU training rate (rates.toml): what a model reached on a GPU."""
    gpu: str = ""                      # a gpus.toml key
    model: str = ""                    # a validation model name (resnet50v1.5, vgg16, ...)
    precision: str = ""                # the Keras policy it corresponds to
    per_gpu_batch: int | None = None
    images_per_sec: float | None = None
    framework: str = ""                # what ran it ("PyTorch 2.11 (not TensorFlow)")
    date: str = ""


_KINDS = {"gpu": ("gpus.toml", GPU), "link": ("links.toml", Link), "system": ("systems.toml", System),
          "rate": ("rates.toml", Rate)}


def read_file(kind: str) -> dict:
    """The raw TOML of one catalogue file (``kind`` = gpu | link | system); a file that is not TOML is a
    ConfigError naming it and the line."""
    path = HERE / _KINDS[kind][0]
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e}); fix the file or restore it from the repository") from None


_TEXT = {"key", "description", "note"}


def _check_entry(path, kind: str, key: str, body: dict, cls) -> None:
    """Every field of a catalogue entry known to ``cls`` and of its type: figures are finite numbers >= 0, flags
    true/false, text text. A ConfigError names the file, the entry and the field."""
    where = f"{path}: [{kind}.{key}]"
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    for name, value in body.items():
        if name not in types or name in ("key", "names", "aliases", "source"):
            if name in ("names", "aliases") and isinstance(value, list) and all(isinstance(v, str) for v in value):
                continue
            if name == "source" and isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
                continue
            raise ConfigError(f"{where} has an unknown field or a wrong kind of value: {name} = {value!r}; known "
                              f"fields: {', '.join(t for t in types if t != 'key')}")
        kind_of = types[name]
        if "float" in kind_of or kind_of.startswith("int"):
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                  and value >= 0)
            if not ok:
                raise ConfigError(f"{where} {name} = {value!r}: a figure is a finite number >= 0 (leave out a figure "
                                  f"the entry lacks, with source.{name} = \"n/a: why\" or \"unconfirmed\")")
        elif "bool" in kind_of and not isinstance(value, bool):
            raise ConfigError(f"{where} {name} = {value!r}: write true or false")
        elif kind_of == "str" and not isinstance(value, str):
            raise ConfigError(f"{where} {name} = {value!r}: write it as text in quotes")
        elif name == "nvlink_edges" and not (isinstance(value, list) and all(
                isinstance(e, list) and len(e) == 3 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                            for x in e) for e in value)):
            raise ConfigError(f"{where} nvlink_edges = {value!r}: write [[gpu a, gpu b, links], ...] in whole numbers")


@functools.cache
def _load(kind: str) -> tuple[dict, dict[str, str]]:
    """(entries by key, lookup: every normalised name -> key)."""
    filename, cls = _KINDS[kind]
    raw = read_file(kind)
    stray = [t for t in raw if t not in ("sources", kind)]
    if stray:
        raise ConfigError(f"{HERE / filename}: unknown table(s) {', '.join(stray)}; the file holds [sources] and "
                          f"[{kind}.<key>] entries")
    entries, lookup = {}, {}
    for key, body in raw.get(kind, {}).items():
        _check_entry(HERE / filename, kind, key, body, cls)
        body = dict(body)
        kwargs = {"key": key, "description": body.pop("description", key),
                  "names": tuple(body.pop("names", ())), "aliases": tuple(body.pop("aliases", ())),
                  "source": dict(body.pop("source", {})), "note": body.pop("note", "")}
        if "nvlink_edges" in body:
            body["nvlink_edges"] = tuple(tuple(e) for e in body["nvlink_edges"])
        entries[key] = cls(**kwargs, **body)
        for name in (key, *kwargs["names"], *kwargs["aliases"]):
            for spelling in {normalise(name), _stripped(name)}:
                if lookup.get(spelling, key) != key:
                    raise ConfigError(f"{filename}: the name {name!r} is given to both {lookup[spelling]} and {key}")
                lookup[spelling] = key
    return entries, lookup


def _find(kind: str, name: str):
    entries, lookup = _load(kind)
    key = lookup.get(normalise(name)) or lookup.get(_stripped(name))
    if key is None:
        raise ConfigError(f"unknown {kind} {name!r}; known {kind}s: {', '.join(entries)} "
                          f"(or the names NVML prints, see tftoolkit/catalogue/{_KINDS[kind][0]})")
    return entries[key]


def gpu(name: str) -> GPU:
    """The GPU called ``name``: a catalogue key, an NVML / nvidia-smi name or an alias."""
    return _find("gpu", name)


def link(name: str) -> Link:
    return _find("link", name)


def system(name: str) -> System:
    return _find("system", name)


def gpus() -> list[GPU]:
    return list(_load("gpu")[0].values())


def links() -> list[Link]:
    return list(_load("link")[0].values())


def systems() -> list[System]:
    return list(_load("system")[0].values())


def rates() -> list[Rate]:
    """The single-GPU training rates of rates.toml, each with its source."""
    return list(_load("rate")[0].values())


# Keras precision policies -> the unit the matmuls and convolutions run on, in order of preference.
_POLICY_UNITS = {
    "float32": ("tf32", "fp32"), "fp32": ("tf32", "fp32"),
    "mixed_float16": ("fp16", "fp32"), "float16": ("fp16", "fp32"), "fp16": ("fp16", "fp32"), "amp": ("fp16", "fp32"),
    "mixed_bfloat16": ("bf16", "fp32"), "bfloat16": ("bf16", "fp32"), "bf16": ("bf16", "fp32"),
    "tf32": ("tf32", "fp32"),
}


def matmul_tflops(g: GPU, policy: str) -> tuple[float | None, str]:
    """(peak dense TFLOP/s, unit) the matmuls of Keras ``policy`` run at on ``g``.

    float32 runs as TF32 where TensorFlow does that by default (``GPU.tf32_by_default``), else on CUDA cores;
    mixed_float16/bfloat16 use the tensor-core rate, or the FP32 rate on a GPU without that unit (a K80's FP16 is
    not faster than its FP32). None when the catalogue has no figure for that unit.
    """
    units = _POLICY_UNITS.get(normalise(policy).replace(" ", "_"))
    if units is None:
        raise ConfigError(f"unknown precision {policy!r}; use one of {', '.join(sorted(_POLICY_UNITS))}")
    for unit in units:
        if unit == "tf32" and not g.tf32_by_default and normalise(policy) != "tf32":
            continue
        value = getattr(g, f"{unit}_tflops")
        if value is not None:
            return value, unit
        if g.source.get(f"{unit}_tflops", "n/a").lower().startswith("unconfirmed"):
            return None, unit        # the unit exists but its figure is unknown: no silent fallback
    return None, units[-1]
