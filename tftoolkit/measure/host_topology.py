"""This host's GPUs as NVML sees them and how they are wired together, for the environment report (``measure.hardware``).

``read(errors)`` opens one NVML session (``tftoolkit.nvml``) and returns the driver, one dict per GPU and the
GPU x GPU topology (NVLink counts and versions, the PCIe level between each pair). It never raises because of the
hardware: every failed query is appended to ``errors`` and its field is ``None``. ``nvidia-smi topo -m`` is the
fallback for the topology when NVML's topology calls fail (``parse_topo_matrix`` reads its output).
It imports no TensorFlow.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from .. import nvml as nvml_api
from . import peaks

# ----------------------------------------------------------------------------------------------------------------------
# NVML constants we rely on, with the values of the documented API, so a missing attribute in an old pynvml never
# stops the report.
# ----------------------------------------------------------------------------------------------------------------------
# nvmlGpuTopologyLevel_t -> the nvidia-smi topo -m label and what it means for all-reduce traffic.
TOPO_LEVELS = {
    0: ("PIX", "same board"),                                      # NVML_TOPOLOGY_INTERNAL (e.g. K80)
    10: ("PIX", "one PCIe switch"),                                # NVML_TOPOLOGY_SINGLE
    20: ("PXB", "several PCIe switches, no host bridge"),          # NVML_TOPOLOGY_MULTIPLE
    30: ("PHB", "through one CPU host bridge"),                    # NVML_TOPOLOGY_HOSTBRIDGE
    40: ("NODE", "across host bridges within one NUMA node"),      # NVML_TOPOLOGY_NODE
    50: ("SYS", "across CPU sockets (QPI/UPI/Infinity Fabric)"),   # NVML_TOPOLOGY_SYSTEM
}
LABEL_MEANING = {label: meaning for label, meaning in TOPO_LEVELS.values()}
LABEL_MEANING["PIX"] = "one PCIe switch"

# nvmlNvlinkVersion_t is an enum, not the version number: an A100 returns 5 for NVLink 3.1 (hwloc reads it the same way).
NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
_NVLINK_DEVICE_TYPE_GPU, _NVLINK_DEVICE_TYPE_SWITCH = 0, 2



def norm_bus_id(bus_id) -> str:
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
        "peak_tflops": peaks.peak_tflops(name) if name else None,
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
               else LABEL_MEANING.get(link, link))
    return {"gpus": [a, b], "link": link, "nvlink_links": nvlink_links, "nvlink_version": nvlink_version,
            "pcie_level": pcie_level, "meaning": meaning}


def _nvml_topology(nvml, gpus: list[dict], handles: list, errors: list) -> dict:
    n = len(gpus)
    by_bus = {norm_bus_id(g["pci_bus_id"]): g["index"] for g in gpus if g["pci_bus_id"]}
    direct: dict[tuple[int, int], dict[int, list]] = {}  # (lo, hi) -> {reporting GPU: [link versions]}
    switched: dict[int, list] = {}                        # GPU -> [versions of its links into NVSwitches]
    for g, h in zip(gpus, handles):
        for ln in _nvlinks(nvml, g["index"], h, errors):
            g["nvlink_active_links"] += 1
            peer = by_bus.get(norm_bus_id(ln["remote_bus_id"])) if ln["remote_bus_id"] else None
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
                level = TOPO_LEVELS.get(int(code), (f"level{code}", ""))[0]
            except Exception as exc:
                failed = True
                errors.append({"where": f"topology.gpu{i}-gpu{j}", "error": nvml_api.error_text(exc)})
            version = next((NVLINK_VERSIONS.get(v, str(v)) for v in versions if v is not None), None)
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
# All of it, in one NVML session
# ----------------------------------------------------------------------------------------------------------------------
def read(errors: list) -> tuple[dict, list[dict], dict, list[str]]:
    """(driver, gpus, topology, notes) as the environment report carries them; failures go to ``errors``."""
    driver = {"nvml_available": False, "driver_version": None, "cuda_driver_version": None, "reason": None}
    topology = {"source": None, "matrix": [], "pairs": [], "complete": False}
    gpus: list[dict] = []
    notes: list[str] = []
    try:
        with nvml_api.session() as nvml:
            driver["nvml_available"] = True
            version = _call(errors, "driver.version", nvml.nvmlSystemGetDriverVersion)
            driver["driver_version"] = nvml_api.text(version) if version is not None else None
            cuda = _call(errors, "driver.cuda_version", nvml.nvmlSystemGetCudaDriverVersion)
            if cuda:  # encoded as 1000*major + 10*minor
                driver["cuda_driver_version"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
            count = _call(errors, "gpu.count", nvml.nvmlDeviceGetCount) or 0
            handles = []
            for i in range(count):
                h = _call(errors, f"gpu{i}.handle", nvml.nvmlDeviceGetHandleByIndex, i)
                if h is None:
                    continue
                handles.append(h)
                gpus.append(_gpu(nvml, i, h, errors))
            if count == 0:
                driver["reason"] = "the NVIDIA driver reports no GPUs"
            if gpus:
                topology = _nvml_topology(nvml, gpus, handles, errors)
    except Exception as exc:  # noqa: BLE001 - no pynvml, no driver, no permission: the report says which
        if driver["nvml_available"]:
            raise
        driver["reason"] = _nvml_unavailable_reason(exc)
    if ((len(gpus) > 1 and not topology["complete"])
            or (not driver["nvml_available"] and shutil.which("nvidia-smi"))):
        topo = _smi_topology(errors)
        if topo is not None:
            topology = topo
            notes.append("topology read from `nvidia-smi topo -m` because NVML could not give it")
    return driver, gpus, topology, notes
