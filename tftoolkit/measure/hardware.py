"""What machine is this? Host, TensorFlow build, GPUs, and how the GPUs are wired together.

``collect()`` returns a JSON-able report (saved as ``env.json`` in every run directory, printed by
``tftoolkit env``). It never imports TensorFlow, so it runs before TensorFlow initialises its devices and on a
laptop that only reads results, and it never raises because of the hardware: every NVML failure ends up in
``report["errors"]`` and the field it was for is ``None``.

GPU facts and their wiring come from ``measure.host_topology`` (NVML, with ``nvidia-smi topo -m`` as the fallback), the
rated peaks from ``measure.peaks``; this module adds the host, the TensorFlow build (read from its files), the data
home and the Slurm allocation, and formats the whole as text.
"""

from __future__ import annotations

import ast
import datetime as _dt
import importlib.metadata
import importlib.util
import os
import platform
import socket
import sys
from pathlib import Path

import psutil

from .. import nvml as nvml_api
from ..data import home
from . import host_topology, peaks

_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tensorflow-macos",
                     "tensorflow-intel")


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


def toolkit_version() -> str:
    """The installed tftoolkit's version, from its distribution's metadata (env.json and the report's header)."""
    try:
        return importlib.metadata.version("tftoolkit")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


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
    host = _host(errors)
    tf = _tensorflow(tf_info, errors)
    driver, gpus, topo, notes = host_topology.read(errors)
    report = {
        "schema": 1,
        "collected_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host,
        "tensorflow": tf,
        "env_vars": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")},
        "driver": driver,
        "gpus": gpus,
        "topology": topo,
        "data": _data_home(errors),
        "slurm": slurm_allocation(),
    }
    report["nccl"] = _nccl(host, tf, gpus)
    if gpus:
        names = sorted({g["name"] or "unknown GPU" for g in gpus})
        links = sorted({p["link"] for p in report["topology"]["pairs"]})
        report["summary"] = (f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({', '.join(names)}), driver "
                             f"{report['driver']['driver_version']}"
                             + (f", links between GPUs: {', '.join(links)}" if links else "") + ".")
        unknown = [n for n in names if peaks.peak_tflops(n) is None]
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
        return home.describe_home()
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
                meaning = host_topology.LABEL_MEANING.get(label, label)
            out.append(f"  {label:<5} = {meaning}")
    out += ["", report["summary"]]
    for note in report.get("notes", []):
        out.append(f"note: {note}")
    for e in report.get("errors", []):
        out.append(f"error: {e['where']}: {e['error']}")
    return "\n".join(out)
