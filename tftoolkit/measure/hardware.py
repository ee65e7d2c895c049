"""What machine is this? Host, TensorFlow build, GPUs, and how the GPUs are wired together.

``collect()`` returns a JSON-able report (saved as ``env.json`` in every run directory, printed by
``tftoolkit env``). It never imports TensorFlow, so it runs before TensorFlow initialises its devices and on a
laptop that only reads results, and it never raises because of the hardware: every NVML failure ends up in
``report["errors"]`` and the field it was for is ``None``.

GPU facts come from NVML (the ``pynvml`` module of ``nvidia-ml-py``); ``nvidia-smi topo -m`` is the fallback
for the topology when NVML's topology calls fail.
"""

from __future__ import annotations

import ast
import datetime as _dt
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from ..errors import ConfigError
from . import nvml as nvml_api

# ----------------------------------------------------------------------------------------------------------------------
# Peak dense FLOP/s, the MFU denominator. Values in TFLOP/s, copied from /work/shared/reference/hardware.md §1
# (sources named there; keys: LT Lightning throughput.py, TT torchtitan, LC llm.c mfu.h, ML stas00/ml-engineering,
# GK glennklockwood, TC thundercompute, VB ozyphus, TP topcpu, CP composer PR #3889, MP mlcommons v4.1,
# AW Ada whitepaper, G1 GA102 whitepaper, FR thefpsreview, TR triteia; N1..N8 are the reference's row notes).
# Keyed by the NVML/CUDA device name, which is what both NVML and TensorFlow report.
# bf16/fp16 are tensor-core rates with FP32 accumulation (what TF's mixed precision uses). None = the GPU has no such
# unit (V100/T4: no BF16, no TF32) or the figure is unconfirmed in the reference.
# Left out on purpose, because the reference marks them unconfirmed: "NVIDIA A10G" (its tensor figures are the A10's; AWS
# publishes none), AMD MI250X/MI300X (names unconfirmed; NVML cannot see them).
# ----------------------------------------------------------------------------------------------------------------------
PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    # name                               fp32           tf32            fp16            bf16            src
    "NVIDIA H100 80GB HBM3":    {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},   # LT, ML, LC, N1
    "NVIDIA H100 PCIe":         {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},   # LT, ML, LC
    # fp32/tf32 unconfirmed in the reference, so only the 16-bit rate is given.
    "NVIDIA H100 NVL":          {"fp32": None, "tf32": None, "fp16": 835.0, "bf16": 835.0},    # TT, ML, N2
    "NVIDIA H200":              {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},   # ML, CP, MP, N3
    "NVIDIA A100-SXM4-80GB":    {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},   # LT, GK, TC, N4
    "NVIDIA A100-SXM4-40GB":    {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},   # LT, GK, TC, N4
    # Two spellings seen for the 80GB PCIe card (N4: nccl-tests log vs llm.c); the rates are the same.
    "NVIDIA A100 80GB PCIe":    {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},   # LT, TC, N4
    "NVIDIA A100-PCIE-80GB":    {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},   # LC spelling, N4
    "NVIDIA A100-PCIE-40GB":    {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},   # LT, TC, N4
    "Tesla V100-SXM2-16GB":     {"fp32": 15.7, "tf32": None, "fp16": 125.0, "bf16": None},     # LT, LC, VB, N5
    "Tesla V100-SXM2-32GB":     {"fp32": 15.7, "tf32": None, "fp16": 125.0, "bf16": None},     # LT, LC, VB, N5
    "Tesla V100-PCIE-16GB":     {"fp32": 14.0, "tf32": None, "fp16": 112.0, "bf16": None},     # LT, VB, N5
    "Tesla V100-PCIE-32GB":     {"fp32": 14.0, "tf32": None, "fp16": 112.0, "bf16": None},     # LT, VB, N5
    "NVIDIA L4":                {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},    # LT, TP, N6
    "Tesla T4":                 {"fp32": 8.1, "tf32": None, "fp16": 65.0, "bf16": None},       # LT, TP, N7
    # GeForce: FP32-accumulate tensor rate (half the FP16-accumulate one), per N8.
    "NVIDIA GeForce RTX 4090":  {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},    # LC, AW, FR, N8
    "NVIDIA GeForce RTX 3090":  {"fp32": 35.6, "tf32": 35.6, "fp16": 71.2, "bf16": 71.2},      # LC, G1, TR, N8
    # Added 2026-12 (issue 26). Dense = the datasheet's figure without its "* with sparsity" (half the starred one).
    #   D1 NVIDIA L40 / L40S datasheets, as reproduced by resellers (mullet.se product 355414: "L40 | L40S" table,
    #      TF32 90.5|181* / 183|366*, BF16 181.05|362.1* / 362.05|733*); hmc-tech.com's tables agree (L40S TF32
    #      183.21, FP16 366.43 with FP32 accumulate: the datasheet's 362.05 is taken, it is the lower).
    #   D2 NVIDIA A40 datasheet (FP32 37.4, TF32 74.8|149.6*, BF16/FP16 149.7|299.4*); hmc-tech.com agrees.
    #   D3 NVIDIA A10 datasheet as Lightning's throughput.py copies it (the reference's A10G row: 31.2, 62.5, 125).
    #   D4 NVIDIA HGX B200 per-GPU specification (as tabled by zdszero.github.io from nvidia.com: TF32 2.2 PF*,
    #      FP16/BF16 4.5 PF*, FP32 75 TF); glennklockwood.com/garden/processors/B200 gives the same dense 1100 / 2250
    #      (and FP32 80 at 1,000 W: the lower, NVIDIA's 75, is taken).
    #   D5 GH200's GPU is the H100 SXM part (132 SMs, same clocks): the H100 SXM dense rates (glennklockwood.com
    #      garden/processors/h100: 66.9 / 494.7 / 989.4). NVML name "NVIDIA GH200 480GB" (the 96 GB HBM3 module;
    #      the 144 GB HBM3e one is "NVIDIA GH200 144G HBM3e"): seen in public nvidia-smi logs, unconfirmed here.
    #   D6 H200 NVL: only the 16-bit rate is in the reference (835.5, OC); FP32/TF32 unconfirmed, so None (as for
    #      H100 NVL). NVML name unconfirmed.
    "NVIDIA L40S":              {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05},  # D1
    "NVIDIA L40":               {"fp32": 90.5, "tf32": 90.5, "fp16": 181.05, "bf16": 181.05},   # D1
    "NVIDIA A40":               {"fp32": 37.4, "tf32": 74.8, "fp16": 149.7, "bf16": 149.7},     # D2
    "NVIDIA A10":               {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},     # D3
    "NVIDIA B200":              {"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0},  # D4
    "NVIDIA GH200 480GB":       {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},   # D5
    "NVIDIA GH200 144G HBM3e":  {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},   # D5
    "NVIDIA H200 NVL":          {"fp32": None, "tf32": None, "fp16": 835.5, "bf16": 835.5},    # D6
}

# Keras precision policy names map onto the rate of the unit that does the matmuls.
_PRECISION_ALIASES = {
    "fp32": "fp32", "float32": "fp32",
    "tf32": "tf32",
    "fp16": "fp16", "float16": "fp16", "mixed_float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "mixed_bfloat16": "bf16",
}


def peak_flops(name: str, precision: str) -> float | None:
    """Peak dense FLOP/s of one GPU named ``name`` (NVML/CUDA name) at ``precision``, or None if unknown.

    ``precision`` is fp32 | tf32 | fp16 | bf16, or a Keras policy name (float32, mixed_float16, mixed_bfloat16).
    Unknown names give None rather than a guess, because a wrong denominator makes a wrong MFU look right.
    """
    key = _PRECISION_ALIASES.get(str(precision).strip().lower())
    if key is None:
        raise ConfigError(
            f"unknown precision {precision!r}; use one of {sorted(set(_PRECISION_ALIASES))}")
    row = PEAK_TFLOPS.get(name)
    if row is None:
        wanted = " ".join(str(name).split()).lower()
        row = next((r for n, r in PEAK_TFLOPS.items() if n.lower() == wanted), None)
    if row is None or row.get(key) is None:
        return None
    return row[key] * 1e12


# ----------------------------------------------------------------------------------------------------------------------
# NVML constants we rely on, with the values of the documented API, so a missing attribute in an old pynvml never
# stops the report.
# ----------------------------------------------------------------------------------------------------------------------
# nvmlGpuTopologyLevel_t -> the nvidia-smi topo -m label and what it means for all-reduce traffic.
_TOPO_LEVELS = {
    0: ("PIX", "same board"),                                      # NVML_TOPOLOGY_INTERNAL (e.g. K80)
    10: ("PIX", "one PCIe switch"),                                # NVML_TOPOLOGY_SINGLE
    20: ("PXB", "several PCIe switches, no host bridge"),          # NVML_TOPOLOGY_MULTIPLE
    30: ("PHB", "through one CPU host bridge"),                    # NVML_TOPOLOGY_HOSTBRIDGE
    40: ("NODE", "across host bridges within one NUMA node"),      # NVML_TOPOLOGY_NODE
    50: ("SYS", "across CPU sockets (QPI/UPI/Infinity Fabric)"),   # NVML_TOPOLOGY_SYSTEM
}
_LABEL_MEANING = {label: meaning for label, meaning in _TOPO_LEVELS.values()}
_LABEL_MEANING["PIX"] = "one PCIe switch"

# nvmlNvlinkVersion_t is an enum, not the version number: an A100 returns 5 for NVLink 3.1 (hwloc issue #658).
_NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
_NVLINK_DEVICE_TYPE_GPU, _NVLINK_DEVICE_TYPE_SWITCH = 0, 2

_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tensorflow-macos",
                     "tensorflow-intel")


def _norm_bus_id(bus_id) -> str:
    """'00000000:07:00.0' and '0000:07:00.0' name the same device; compare on (domain, bus, device.function)."""
    text = nvml_api.text(bus_id).strip().lower()
    parts = text.split(":")
    try:
        if len(parts) == 3:
            return f"{int(parts[0], 16):x}:{int(parts[1], 16):02x}:{parts[2]}"
        if len(parts) == 2:
            return f"0:{int(parts[0], 16):02x}:{parts[1]}"
    except ValueError:
        pass
    return text


# ----------------------------------------------------------------------------------------------------------------------
# Host and TensorFlow
# ----------------------------------------------------------------------------------------------------------------------
def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _host(errors: list) -> dict:
    import psutil

    info = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "system": platform.system(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_logical_cores": psutil.cpu_count(logical=True),
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "cpu_affinity_cores": None,
        "memory_total_bytes": None,
        "memory_available_bytes": None,
    }
    # Affinity is what this process may actually use (taskset, cgroups, Slurm), which is what simulated
    # replicas on CPU will share.
    try:
        info["cpu_affinity_cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["cpu_affinity_cores"] = info["cpu_logical_cores"]
    try:
        vm = psutil.virtual_memory()
        info["memory_total_bytes"] = int(vm.total)
        info["memory_available_bytes"] = int(vm.available)
    except Exception as exc:  # psutil on exotic platforms
        errors.append({"where": "host.memory", "error": nvml_api.error_text(exc)})
    return info


def parse_build_info(text: str) -> dict:
    """The ``build_info`` dict of TensorFlow's generated ``build_info.py``, read as text (no import).

    The file holds ``build_info = collections.OrderedDict([(key, value), ...])`` (a plain dict literal in some
    builds), so the argument is a Python literal that ``ast.literal_eval`` can read safely.
    """
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "build_info"
                                                for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and value.args:
                value = value.args[0]
            return dict(ast.literal_eval(value))
    return {}


def _tensorflow(tf_info: dict | None, errors: list) -> dict:
    info = {"installed": False, "version": None, "distribution": None, "cuda_version": None, "cudnn_version": None,
            "is_cuda_build": None, "is_rocm_build": None, "cuda_compute_capabilities": None, "source": None}
    for dist in _TF_DISTRIBUTIONS:
        try:
            info["version"] = importlib.metadata.version(dist)
            info["distribution"], info["installed"] = dist, True
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if info["installed"]:
        try:
            spec = importlib.util.find_spec("tensorflow")  # locates the package without running it
            roots = list(spec.submodule_search_locations or []) if spec else []
            path = next((Path(r) / "python" / "platform" / "build_info.py" for r in roots
                         if (Path(r) / "python" / "platform" / "build_info.py").is_file()), None)
            if path is None:
                errors.append({"where": "tensorflow.build_info", "error": "build_info.py not found"})
            else:
                build = parse_build_info(path.read_text())
                for key in ("cuda_version", "cudnn_version", "is_cuda_build", "is_rocm_build",
                            "cuda_compute_capabilities"):
                    if key in build:
                        info[key] = build[key]
                info["source"] = "installed files"
        except Exception as exc:
            errors.append({"where": "tensorflow.build_info", "error": nvml_api.error_text(exc)})
    if tf_info:
        # A caller that has TensorFlow loaded knows better (tf.sysconfig.get_build_info(), tf.__version__).
        info.update({k: v for k, v in tf_info.items() if v is not None})
        info["installed"] = True
        info["source"] = "caller"
    return info


# ----------------------------------------------------------------------------------------------------------------------
# GPUs through NVML
# ----------------------------------------------------------------------------------------------------------------------
def _nvml_unavailable_reason(exc: BaseException | None) -> str:
    name = type(exc).__name__ if exc is not None else ""
    if isinstance(exc, ImportError):
        return "nvidia-ml-py (pynvml) is not installed"
    if "LibraryNotFound" in name:
        return "the NVIDIA driver library libnvidia-ml is not installed"
    if "DriverNotLoaded" in name:
        return "the NVIDIA driver is not loaded"
    if "NoPermission" in name:
        return "no permission to query the NVIDIA driver"
    return f"NVML failed ({nvml_api.error_text(exc)})" if exc is not None else "NVML failed"


def _call(errors: list, where: str, fn, *args):
    """One NVML call; on failure record it and give None, so one unsupported query never hides the others."""
    try:
        return fn(*args)
    except Exception as exc:
        # NotSupported is an answer ("this GPU has no such counter"), not a fault worth shouting about.
        if "NotSupported" not in type(exc).__name__:
            errors.append({"where": where, "error": nvml_api.error_text(exc)})
        return None


def _gpu(nvml, index: int, handle, errors: list) -> dict:
    w = f"gpu{index}"
    mem = _call(errors, f"{w}.memory", nvml.nvmlDeviceGetMemoryInfo, handle)
    cc = _call(errors, f"{w}.compute_capability", nvml.nvmlDeviceGetCudaComputeCapability, handle)
    pci = _call(errors, f"{w}.pci", nvml.nvmlDeviceGetPciInfo, handle)
    # The enforced limit is the one the card obeys (it folds in admin caps); the management limit is the fallback.
    limit_mw = None
    if hasattr(nvml, "nvmlDeviceGetEnforcedPowerLimit"):
        limit_mw = _call([], f"{w}.power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    if limit_mw is None:
        limit_mw = _call(errors, f"{w}.power_limit", nvml.nvmlDeviceGetPowerManagementLimit, handle)
    name = _call(errors, f"{w}.name", nvml.nvmlDeviceGetName, handle)
    name = nvml_api.text(name) if name is not None else None
    uuid = _call(errors, f"{w}.uuid", nvml.nvmlDeviceGetUUID, handle)
    return {
        "index": index,
        "name": name,
        "uuid": nvml_api.text(uuid) if uuid is not None else None,
        "pci_bus_id": nvml_api.text(pci.busId) if pci is not None else None,
        "memory_total_bytes": int(mem.total) if mem is not None else None,
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc is not None else None,
        "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
        # The current PCIe generation drops when the GPU idles (power saving); compare max to max.
        "pcie_gen_current": _call(errors, f"{w}.pcie_gen_current", nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "pcie_gen_max": _call(errors, f"{w}.pcie_gen_max", nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        "pcie_width_current": _call(errors, f"{w}.pcie_width_current", nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        "pcie_width_max": _call(errors, f"{w}.pcie_width_max", nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        "nvlink_active_links": 0,
        "peak_tflops": PEAK_TFLOPS.get(name) if name else None,
    }


def _nvlinks(nvml, index: int, handle, errors: list) -> list[dict]:
    """Active NVLinks of one GPU: [{link, remote_bus_id, remote_type, version}]."""
    links = []
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    for link in range(max_links):
        try:
            active = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception as exc:
            # NotSupported on link 0: no NVLink on this GPU. InvalidArgument: past its last link. Both are answers.
            kind = type(exc).__name__
            if link == 0 and "NotSupported" not in kind and "InvalidArgument" not in kind:
                errors.append({"where": f"gpu{index}.nvlink", "error": nvml_api.error_text(exc)})
            break
        if not active:
            continue
        remote = _call(errors, f"gpu{index}.nvlink{link}.remote", nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        rtype = None
        if hasattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType"):
            rtype = _call([], f"gpu{index}.nvlink{link}.type", nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        version = _call(errors, f"gpu{index}.nvlink{link}.version", nvml.nvmlDeviceGetNvLinkVersion, handle, link)
        links.append({"link": link, "remote_bus_id": nvml_api.text(remote.busId) if remote is not None else None,
                      "remote_type": rtype, "version": version})
    return links


def _pair(a: int, b: int, *, link: str, nvlink_links: int = 0, nvlink_version: str | None = None,
          pcie_level: str | None = None) -> dict:
    meaning = (f"{nvlink_links} NVLink{'s' if nvlink_links != 1 else ''}" if link.startswith("NV")
               else _LABEL_MEANING.get(link, link))
    return {"gpus": [a, b], "link": link, "nvlink_links": nvlink_links, "nvlink_version": nvlink_version,
            "pcie_level": pcie_level, "meaning": meaning}


def _nvml_topology(nvml, gpus: list[dict], handles: list, errors: list) -> dict:
    n = len(gpus)
    by_bus = {_norm_bus_id(g["pci_bus_id"]): g["index"] for g in gpus if g["pci_bus_id"]}
    direct: dict[tuple[int, int], dict[int, list]] = {}  # (lo, hi) -> {reporting GPU: [link versions]}
    switched: dict[int, list] = {}                        # GPU -> [versions of its links into NVSwitches]
    for g, h in zip(gpus, handles):
        for ln in _nvlinks(nvml, g["index"], h, errors):
            g["nvlink_active_links"] += 1
            peer = by_bus.get(_norm_bus_id(ln["remote_bus_id"])) if ln["remote_bus_id"] else None
            if ln["remote_type"] == _NVLINK_DEVICE_TYPE_SWITCH or (peer is None and ln["remote_type"] in (None, 0xFF)):
                switched.setdefault(g["index"], []).append(ln["version"])
            elif peer is not None and peer != g["index"]:
                key = (min(g["index"], peer), max(g["index"], peer))
                direct.setdefault(key, {}).setdefault(g["index"], []).append(ln["version"])
    matrix = [["X" if i == j else "" for j in range(n)] for i in range(n)]
    pairs, failed = [], False
    for i in range(n):
        for j in range(i + 1, n):
            # Both ends report the same physical links: count them from one end.
            ends = direct.get((i, j), {})
            versions = ends.get(i) or ends.get(j) or []
            count = len(versions)
            if switched.get(i) and switched.get(j):
                # Behind NVSwitches every GPU reaches every other at its full link count; nvidia-smi shows NV<n>.
                count += min(len(switched[i]), len(switched[j]))
                versions = versions + switched[i]
            level = None
            try:
                code = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                level = _TOPO_LEVELS.get(int(code), (f"level{code}", ""))[0]
            except Exception as exc:
                failed = True
                errors.append({"where": f"topology.gpu{i}-gpu{j}", "error": nvml_api.error_text(exc)})
            version = next((_NVLINK_VERSIONS.get(v, str(v)) for v in versions if v is not None), None)
            label = f"NV{count}" if count else (level or "?")
            matrix[i][j] = matrix[j][i] = label
            pairs.append(_pair(i, j, link=label, nvlink_links=count, nvlink_version=version, pcie_level=level))
    return {"source": "nvml", "matrix": matrix, "pairs": pairs, "complete": not failed}


# ----------------------------------------------------------------------------------------------------------------------
# nvidia-smi topo -m fallback
# ----------------------------------------------------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def parse_topo_matrix(text: str) -> dict:
    """GPU x GPU labels from ``nvidia-smi topo -m`` output (NIC rows/columns, affinity columns and the legend
    are ignored)."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    # The header names GPU0 but, unlike the GPU0 row, has no "X" (self) cell; leading tabs are not reliable.
    header_at = next((k for k, ln in enumerate(lines) if "GPU0" in ln.split() and "X" not in ln.split()), None)
    if header_at is None:
        return {"source": "nvidia-smi", "matrix": [], "pairs": [], "complete": False}
    columns = lines[header_at].split()
    rows = {}
    for ln in lines[header_at + 1:]:
        tokens = ln.split()
        if not tokens:
            if rows:
                break
            continue
        m = re.fullmatch(r"GPU(\d+)", tokens[0])
        if not m:
            continue
        rows[int(m.group(1))] = {col: cell for col, cell in zip(columns, tokens[1:]) if col.startswith("GPU")}
    n = len(rows)
    matrix = [[rows.get(i, {}).get(f"GPU{j}", "?") for j in range(n)] for i in range(n)]
    pairs = []
    for i in range(n):
        for j in range(i + 1, n):
            label = matrix[i][j]
            m = re.fullmatch(r"NV(\d+)", label)
            pairs.append(_pair(i, j, link=label, nvlink_links=int(m.group(1)) if m else 0,
                               pcie_level=None if m else label))
    return {"source": "nvidia-smi", "matrix": matrix, "pairs": pairs, "complete": n > 0}


def _run_topo_command() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
    return out.stdout if out.returncode == 0 else None


def _smi_topology(errors: list) -> dict | None:
    try:
        text = _run_topo_command()
    except Exception as exc:
        errors.append({"where": "topology.nvidia-smi", "error": nvml_api.error_text(exc)})
        return None
    if not text:
        return None
    topo = parse_topo_matrix(text)
    return topo if topo["matrix"] else None


# ----------------------------------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------------------------------
def _nccl(host: dict, tf: dict, gpus: list) -> dict:
    if host["system"] != "Linux":
        return {"usable": False, "reason": f"NCCL is Linux-only (this is {host['system']}); MirroredStrategy "
                                           "falls back to HierarchicalCopyAllReduce"}
    if not tf["installed"]:
        return {"usable": False, "reason": "TensorFlow is not installed"}
    if tf["is_cuda_build"] is False:
        return {"usable": False, "reason": "this TensorFlow build has no CUDA support"}
    if not gpus:
        return {"usable": False, "reason": "no GPU visible: replicas run on CPU and all-reduce is done on the host"}
    if tf["is_cuda_build"] is None:
        return {"usable": None, "reason": "unknown: TensorFlow's build info could not be read"}
    if len(gpus) == 1:
        return {"usable": True, "reason": "Linux, CUDA build, 1 GPU (one replica: no all-reduce traffic)"}
    return {"usable": True, "reason": f"Linux, CUDA build, {len(gpus)} GPUs"}


def collect(tf_info: dict | None = None) -> dict:
    """The environment report (JSON-able). ``tf_info`` (e.g. ``{"version": tf.__version__,
    **tf.sysconfig.get_build_info()}``) overrides what is read from the installed TensorFlow files."""
    errors: list[dict] = []
    notes: list[str] = []
    host = _host(errors)
    tf = _tensorflow(tf_info, errors)
    report = {
        "schema": 1,
        "collected_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host,
        "tensorflow": tf,
        "env_vars": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")},
        "driver": {"nvml_available": False, "driver_version": None, "cuda_driver_version": None, "reason": None},
        "gpus": [],
        "topology": {"source": None, "matrix": [], "pairs": [], "complete": False},
        "data": _data_home(errors),
        "slurm": slurm_allocation(),
    }
    gpus: list[dict] = []
    handles: list = []
    nvml = None
    try:
        nvml = nvml_api.load()
        nvml.nvmlInit()
    except Exception as exc:
        report["driver"]["reason"] = _nvml_unavailable_reason(exc)
        nvml = None
    if nvml is not None:
        try:
            report["driver"]["nvml_available"] = True
            version = _call(errors, "driver.version", nvml.nvmlSystemGetDriverVersion)
            report["driver"]["driver_version"] = nvml_api.text(version) if version is not None else None
            cuda = _call(errors, "driver.cuda_version", nvml.nvmlSystemGetCudaDriverVersion)
            if cuda:  # encoded as 1000*major + 10*minor
                report["driver"]["cuda_driver_version"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
            count = _call(errors, "gpu.count", nvml.nvmlDeviceGetCount) or 0
            for i in range(count):
                h = _call(errors, f"gpu{i}.handle", nvml.nvmlDeviceGetHandleByIndex, i)
                if h is None:
                    continue
                handles.append(h)
                gpus.append(_gpu(nvml, i, h, errors))
            if count == 0:
                report["driver"]["reason"] = "the NVIDIA driver reports no GPUs"
            if gpus:
                report["topology"] = _nvml_topology(nvml, gpus, handles, errors)
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass
    if (len(gpus) > 1 and not report["topology"]["complete"]) or (nvml is None and shutil.which("nvidia-smi")):
        topo = _smi_topology(errors)
        if topo is not None:
            report["topology"] = topo
            notes.append("topology read from `nvidia-smi topo -m` because NVML could not give it")
    report["gpus"] = gpus
    report["nccl"] = _nccl(host, tf, gpus)
    if gpus:
        names = sorted({g["name"] or "unknown GPU" for g in gpus})
        links = sorted({p["link"] for p in report["topology"]["pairs"]})
        report["summary"] = (f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({', '.join(names)}), driver "
                             f"{report['driver']['driver_version']}"
                             + (f", links between GPUs: {', '.join(links)}" if links else "") + ".")
        unknown = [n for n in names if n not in PEAK_TFLOPS]
        if unknown:
            notes.append(f"no peak FLOP/s on record for {', '.join(unknown)}: MFU will be left empty")
    else:
        cores = host["cpu_affinity_cores"] or host["cpu_logical_cores"]
        reason = report["driver"]["reason"] or "NVML lists none"
        report["summary"] = (f"No NVIDIA GPU found ({reason}). Replicas will be simulated as logical devices on this "
                             f"CPU ({cores} cores): the multi-replica code paths are the same, the speeds are not "
                             "those of GPUs.")
    report["notes"] = notes
    report["errors"] = errors
    return report


def slurm_allocation(environ=None) -> dict | None:
    """The Slurm allocation this process runs in (from Slurm's environment variables); None outside a job."""
    environ = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in environ:
        return None
    gpus = (environ.get("SLURM_GPUS_ON_NODE") or environ.get("SLURM_GPUS_PER_NODE") or environ.get("SLURM_GPUS")
            or environ.get("SLURM_JOB_GPUS"))
    return {"job_id": environ.get("SLURM_JOB_ID"), "array_task": environ.get("SLURM_ARRAY_TASK_ID"),
            "partition": environ.get("SLURM_JOB_PARTITION"), "nodes": environ.get("SLURM_JOB_NUM_NODES"),
            "nodelist": environ.get("SLURM_JOB_NODELIST"), "tasks": environ.get("SLURM_NTASKS"),
            "cpus_on_node": environ.get("SLURM_CPUS_ON_NODE"), "gpus_per_node": gpus}


def _slurm_line(alloc: dict | None) -> str:
    if not alloc:
        return "no allocation (not inside a Slurm job)"
    job = alloc["job_id"] + (f" (array task {alloc['array_task']})" if alloc.get("array_task") else "")
    return (f"job {job}, {alloc.get('nodes') or '?'} node(s) {alloc.get('nodelist') or ''}, "
            f"{alloc.get('tasks') or '?'} task(s), GPUs per node: {alloc.get('gpus_per_node') or 'none'}, "
            f"partition {alloc.get('partition') or '?'}")


def _data_home(errors: list) -> dict:
    try:
        from ..data import home

        return home.describe()
    except Exception as exc:  # noqa: BLE001 - a report never fails on one item
        errors.append({"where": "data.home", "error": nvml_api.error_text(exc)})
        return {}


# ----------------------------------------------------------------------------------------------------------------------
# Human-readable form
# ----------------------------------------------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list]) -> list[str]:
    cells = [[("-" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[k]) for r in cells)) if cells else len(h) for k, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return ["  " + fmt.format(*headers).rstrip()] + ["  " + fmt.format(*r).rstrip() for r in cells]


def _data_line(data: dict) -> str | None:
    if not data:
        return None
    ready = "shapes16k prepared" if data.get("shapes16k_prepared") else "shapes16k not prepared yet"
    return f"{data['data_home']} ({data['set_by']}; {ready})"


def _gib(n) -> str | None:
    return None if n is None else f"{n / 2**30:.1f} GiB"


def format_report(report: dict) -> str:
    """The report as plain-text tables: host, GPUs, topology matrix, then notes and errors."""
    h, tf, drv = report["host"], report["tensorflow"], report["driver"]
    cores = (f"{h['cpu_logical_cores']} logical / {h['cpu_physical_cores'] or '?'} physical, "
             f"{h['cpu_affinity_cores']} usable by this process")
    if tf["installed"]:
        build = ("CUDA " + str(tf["cuda_version"]) + ", cuDNN " + str(tf["cudnn_version"])) if tf["is_cuda_build"] \
            else ("CPU-only build" if tf["is_cuda_build"] is False else "build unknown")
        tf_line = f"{tf['version']} ({build})"
    else:
        tf_line = "not installed"
    driver = (f"{drv['driver_version']} (CUDA {drv['cuda_driver_version']})" if drv["nvml_available"]
              else f"none: {drv['reason']}")
    nccl = report["nccl"]
    out = ["Host"]
    out += _table(["item", "value"], [
        ["hostname", h["hostname"]],
        ["python", f"{h['python']} ({h['python_implementation']})"],
        ["platform", h["platform"]],
        ["cpu", h["cpu_model"]],
        ["cores", cores],
        ["memory", _gib(h["memory_total_bytes"])],
        ["tensorflow", tf_line],
        ["nvidia driver", driver],
        ["nccl", ("yes: " if nccl["usable"] else "no: " if nccl["usable"] is False else "? ") + nccl["reason"]],
        ["data home", _data_line(report.get("data") or {})],
        ["slurm", _slurm_line(report.get("slurm"))],
    ])
    out += ["", "GPUs"]
    if report["gpus"]:
        out += _table(
            ["idx", "name", "memory", "cc", "power limit", "pcie now/max", "nvlinks", "peak bf16"],
            [[g["index"], g["name"], _gib(g["memory_total_bytes"]), g["compute_capability"],
              None if g["power_limit_w"] is None else f"{g['power_limit_w']:.0f} W",
              f"gen{g['pcie_gen_current'] or '?'} x{g['pcie_width_current'] or '?'} / "
              f"gen{g['pcie_gen_max'] or '?'} x{g['pcie_width_max'] or '?'}",
              g["nvlink_active_links"],
              None if not (g["peak_tflops"] or {}).get("bf16") else f"{g['peak_tflops']['bf16']:g} TFLOP/s"]
             for g in report["gpus"]])
    else:
        out.append("  none")
    topo = report["topology"]
    if topo["matrix"]:
        n = len(topo["matrix"])
        out += ["", f"Topology (from {topo['source']})"]
        out += _table([""] + [f"GPU{j}" for j in range(n)],
                      [[f"GPU{i}"] + topo["matrix"][i] for i in range(n)])
        for label in sorted({p["link"] for p in topo["pairs"]}):
            if label.startswith("NV"):
                version = next((p["nvlink_version"] for p in topo["pairs"]
                                if p["link"] == label and p["nvlink_version"]), None)
                meaning = f"a bonded set of {label[2:]} NVLinks" + (f" (NVLink {version})" if version else "")
            else:
                meaning = _LABEL_MEANING.get(label, label)
            out.append(f"  {label:<5} = {meaning}")
    out += ["", report["summary"]]
    for note in report.get("notes", []):
        out.append(f"note: {note}")
    for e in report.get("errors", []):
        out.append(f"error: {e['where']}: {e['error']}")
    return "\n".join(out)
