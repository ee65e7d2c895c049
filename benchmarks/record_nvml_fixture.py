"""Record the raw NVML readings that tftoolkit.measure.host_topology and tftoolkit.measure.monitor.sampler parse, as a JSON fixture.

Run on a GPU machine; needs only Python and nvidia-ml-py (no TensorFlow, no tftoolkit install):

    pip install nvidia-ml-py
    python benchmarks/record_nvml_fixture.py --seconds 5 --load-cmd "python my_gpu_job.py"
    # -> tests/fixtures/nvml_<gpu-name>_<n>gpu_<date>.json

Start something that loads the GPUs (``--load-cmd``, or a training run in another shell) so the samples show
real utilisation, power and PCIe/NVLink traffic. tests/test_hardware.py and tests/test_monitor.py replay every
``tests/fixtures/nvml_*.json`` through their fake pynvml, so commit the file. Failures are recorded too
({"error": "NVMLError_NotSupported"}): they are part of what the parser must handle.

GPU UUIDs and the host name are left out unless ``--keep-ids``; PCI bus ids stay (the topology needs them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

FORMAT = "tftoolkit-nvml-fixture/1"
NVLINK_TX, NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, cumulative KiB, scopeId = link

STATIC = ["nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetMemoryInfo",
          "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetEnforcedPowerLimit",
          "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetCurrPcieLinkGeneration",
          "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth"]
LINK = ["nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetNvLinkVersion"]


def _json(value):
    """NVML results (ctypes structs, bytes, tuples) as plain JSON values."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if hasattr(value, "_fields_"):  # ctypes structure
        return {name: _json(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, (int, float, str, bool, dict)) or value is None:
        return value
    if hasattr(value, "__dict__"):  # struct-like objects from other bindings (and the tests' fake)
        return {k: _json(v) for k, v in vars(value).items() if not k.startswith("_")}
    return str(value)


def _call(fn, *args):
    try:
        return _json(fn(*args))
    except Exception as exc:  # a failure is a reading too: the parser must cope with it
        return {"error": type(exc).__name__, "message": str(exc)}


def _failed(value) -> bool:
    return isinstance(value, dict) and "error" in value and set(value) <= {"error", "message"}


def record(nvml, seconds: float = 5.0, interval: float = 0.5, keep_ids: bool = False) -> dict:
    nvml.nvmlInit()
    try:
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        devices, active = [], []
        for i, h in enumerate(handles):
            d = {fn: _call(getattr(nvml, fn), h) for fn in STATIC if hasattr(nvml, fn)}
            if not keep_ids and not _failed(d.get("nvmlDeviceGetUUID")):
                d["nvmlDeviceGetUUID"] = f"GPU-recorded-{i}"
            links, mine = [], []
            for link in range(max_links):
                state = _call(nvml.nvmlDeviceGetNvLinkState, h, link)
                entry = {"nvmlDeviceGetNvLinkState": state}
                if _failed(state):
                    if state["error"] != "NVMLError_InvalidArgument":
                        links.append(entry)  # e.g. NotSupported: "no NVLink" is worth replaying
                    break
                if state:
                    mine.append(link)
                    for fn in LINK[1:]:
                        if hasattr(nvml, fn):
                            entry[fn] = _call(getattr(nvml, fn), h, link)
                links.append(entry)
            d["nvlink"] = links
            d["nvmlDeviceGetTopologyCommonAncestor"] = {
                str(j): _call(nvml.nvmlDeviceGetTopologyCommonAncestor, h, handles[j]) for j in range(count) if j != i}
            devices.append(d)
            active.append(mine)
        samples, t0 = [], time.monotonic()
        while True:
            t = time.monotonic() - t0
            per_dev = []
            for h, links in zip(handles, active):
                r = {
                    "t": round(t, 3),
                    "nvmlDeviceGetUtilizationRates": _call(nvml.nvmlDeviceGetUtilizationRates, h),
                    "nvmlDeviceGetMemoryInfo": _call(nvml.nvmlDeviceGetMemoryInfo, h),
                    "nvmlDeviceGetTemperature": _call(nvml.nvmlDeviceGetTemperature, h,
                                                      getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
                    "nvmlDeviceGetPowerUsage": _call(nvml.nvmlDeviceGetPowerUsage, h),
                    "nvmlDeviceGetClockInfo": _call(nvml.nvmlDeviceGetClockInfo, h, getattr(nvml, "NVML_CLOCK_SM", 1)),
                    "nvmlDeviceGetCurrentClocksThrottleReasons":
                        _call(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, h),
                    "nvmlDeviceGetPcieThroughput": [
                        _call(nvml.nvmlDeviceGetPcieThroughput, h, getattr(nvml, "NVML_PCIE_UTIL_TX_BYTES", 0)),
                        _call(nvml.nvmlDeviceGetPcieThroughput, h, getattr(nvml, "NVML_PCIE_UTIL_RX_BYTES", 1))],
                }
                if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
                    r["nvmlDeviceGetCurrentClocksEventReasons"] = _call(nvml.nvmlDeviceGetCurrentClocksEventReasons, h)
                if any(_failed(x) for x in r["nvmlDeviceGetPcieThroughput"]):
                    r["nvmlDeviceGetPcieThroughput"] = next(x for x in r["nvmlDeviceGetPcieThroughput"] if _failed(x))
                if links:
                    ids = [(NVLINK_TX, k) for k in links] + [(NVLINK_RX, k) for k in links]
                    try:
                        values = nvml.nvmlDeviceGetFieldValues(h, ids)
                        r["nvmlDeviceGetFieldValues"] = {f"{f}:{k}": {"nvmlReturn": int(v.nvmlReturn),
                                                                       "value": int(v.value.ullVal)}
                                                         for (f, k), v in zip(ids, values)}
                    except Exception as exc:
                        r["nvmlDeviceGetFieldValues"] = {"error": type(exc).__name__, "message": str(exc)}
                per_dev.append(r)
            samples.append(per_dev)
            if t >= seconds:
                break
            time.sleep(interval)
        system = {"nvmlSystemGetDriverVersion": _call(nvml.nvmlSystemGetDriverVersion),
                  "nvmlSystemGetCudaDriverVersion": _call(nvml.nvmlSystemGetCudaDriverVersion)}
    finally:
        nvml.nvmlShutdown()
    meta = {"recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "platform": platform.platform(),
            "interval_s": interval, "seconds": seconds}
    try:
        from importlib.metadata import version
        meta["nvidia_ml_py"] = version("nvidia-ml-py")
    except Exception:
        meta["nvidia_ml_py"] = None
    if keep_ids:
        meta["hostname"] = platform.node()
    return {"format": FORMAT, "meta": meta, "system": system, "devices": devices, "samples": samples,
            "nvidia_smi_topo_m": _topo_text()}


def _topo_text() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30)
        return out.stdout if out.returncode == 0 else None
    except Exception:
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="how long to sample (default 5)")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    ap.add_argument("--load-cmd", default=None, help="a command that loads the GPUs, run while sampling")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds to let --load-cmd ramp up first")
    ap.add_argument("--keep-ids", action="store_true", help="keep GPU UUIDs and the host name")
    ap.add_argument("--out", default=None, help="output file (default tests/fixtures/nvml_<gpu>_<n>gpu_<date>.json)")
    args = ap.parse_args(argv)
    import pynvml

    load = subprocess.Popen(shlex.split(args.load_cmd)) if args.load_cmd else None
    try:
        if load is not None:
            time.sleep(args.warmup)
        fixture = record(pynvml, args.seconds, args.interval, args.keep_ids)
    finally:
        if load is not None:
            load.terminate()
            try:
                load.wait(timeout=10)
            except subprocess.TimeoutExpired:
                load.kill()
    fixture["meta"]["load_cmd"] = args.load_cmd
    if args.out:
        out = Path(args.out)
    else:
        name = fixture["devices"][0].get("nvmlDeviceGetName") if fixture["devices"] else "nogpu"
        slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
        out = (Path(__file__).resolve().parent.parent / "tests" / "fixtures" /
               f"nvml_{slug}_{len(fixture['devices'])}gpu_{dt.date.today():%Y%m%d}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {out}: {len(fixture['devices'])} GPU(s), {len(fixture['samples'])} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
