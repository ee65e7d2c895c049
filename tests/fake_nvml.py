"""A stand-in for the ``pynvml`` module (nvidia-ml-py), driven by a fixture dict.

It follows the documented NVML API as nvidia-ml-py exposes it: the same function names and arguments
(tests/test_hardware.py checks them against the installed pynvml), the same return shapes (struct-like objects
with ``.total/.free/.used``, ``.gpu/.memory``, ``.busId`` as bytes, field values with ``.nvmlReturn`` and
``.value.ullVal``), the same units (power in mW, temperature in C, PCIe throughput in KB/s, NVLink counters in
KiB), the same error classes (``NVMLError`` subclasses chosen by error code) and the rule that every call
but ``nvmlInit`` fails with ``NVMLError_Uninitialized`` when NVML is not initialised.

The fixture format is the one ``benchmarks/record_nvml_fixture.py`` writes on a real GPU machine, so a
recorded fixture replays through the same fake. ``synthetic_fixture()`` builds one by hand from the API
documentation; it is not a recording.
"""

from __future__ import annotations

import types

# NVML return codes (nvml.h), and the class names pynvml derives from them.
ERROR_CODES = {
    1: "Uninitialized", 2: "InvalidArgument", 3: "NotSupported", 4: "NoPermission", 6: "NotFound",
    9: "DriverNotLoaded", 12: "LibraryNotFound", 13: "FunctionNotFound", 15: "GpuIsLost", 999: "Unknown",
}
ERROR_MESSAGES = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions", 6: "Not Found",
    9: "Driver Not Loaded", 12: "NVML Shared Library Not Found", 13: "Function Not Found", 15: "GPU is lost",
    999: "Unknown Error",
}

CONSTANTS = {
    "NVML_SUCCESS": 0,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "NVML_TOPOLOGY_INTERNAL": 0,
    "NVML_TOPOLOGY_SINGLE": 10,
    "NVML_TOPOLOGY_MULTIPLE": 20,
    "NVML_TOPOLOGY_HOSTBRIDGE": 30,
    "NVML_TOPOLOGY_NODE": 40,
    "NVML_TOPOLOGY_SYSTEM": 50,
    "NVML_NVLINK_MAX_LINKS": 18,  # 12 in old headers, 36 in new ones: version-dependent on purpose
    "NVML_NVLINK_DEVICE_TYPE_GPU": 0,
    "NVML_NVLINK_DEVICE_TYPE_SWITCH": 2,
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": 138,
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": 139,
}

# Readings that change while a run goes on; each call takes the next recorded sample for that device.
DYNAMIC = {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature",
           "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons",
           "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetFieldValues",
           "nvmlDeviceGetTotalEnergyConsumption"}


class _Struct(types.SimpleNamespace):
    """Looks like a ctypes structure to code that reads fields by name."""


class _Handle:
    def __init__(self, index: int):
        self.index = index

    def __repr__(self):
        return f"<fake nvmlDevice_t {self.index}>"


def _make_errors(mod):
    class NVMLError(Exception):
        _valClassMapping: dict = {}

        def __new__(typ, value=999):
            if typ is NVMLError:
                typ = NVMLError._valClassMapping.get(value, typ)
            obj = Exception.__new__(typ)
            obj.value = value
            return obj

        def __init__(self, value=999):
            super().__init__()

        def __str__(self):
            return ERROR_MESSAGES.get(self.value, f"NVML Error with code {self.value}")

    NVMLError.__module__ = "pynvml"
    mod.NVMLError = NVMLError
    for code, name in ERROR_CODES.items():
        def new(typ, *args, _code=code):
            return NVMLError.__new__(typ, _code)
        cls = type(f"NVMLError_{name}", (NVMLError,), {"__new__": new})
        cls.__module__ = "pynvml"
        NVMLError._valClassMapping[code] = cls
        setattr(mod, cls.__name__, cls)


def build(fixture: dict, *, init_error: str | None = None) -> types.ModuleType:
    """A pynvml-like module answering from ``fixture``.

    ``init_error``: name of an NVMLError subclass that nvmlInit raises (e.g. "NVMLError_LibraryNotFound").
    ``mod.fail``: {function name or (function name, device index): error class name} to inject failures later.
    ``mod.calls``: {function name: number of calls}.
    """
    mod = types.ModuleType("pynvml")
    mod.__file__ = "<fake pynvml>"
    _make_errors(mod)
    for k, v in CONSTANTS.items():
        setattr(mod, k, v)
    mod.fail = {}
    mod.calls = {}
    mod._initialised = 0
    devices = fixture["devices"]
    samples = fixture.get("samples") or []
    counters: dict[tuple[str, int], int] = {}

    def raise_named(name: str):
        cls = getattr(mod, name, None) or mod.NVMLError_Unknown
        raise cls()

    def answer(value):
        if isinstance(value, dict) and set(value) <= {"error", "message"} and "error" in value:
            raise_named(value["error"])
        return value

    def enter(fn: str, index: int | None = None):
        mod.calls[fn] = mod.calls.get(fn, 0) + 1
        if fn not in ("nvmlInit", "nvmlShutdown") and mod._initialised <= 0:
            raise mod.NVMLError_Uninitialized()
        for key in ((fn, index), fn):
            if key in mod.fail:
                raise_named(mod.fail[key])

    def device(handle) -> dict:
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(devices):
            raise mod.NVMLError_InvalidArgument()
        return devices[handle.index]

    def reading(fn: str, handle):
        d = device(handle)
        enter(fn, handle.index)
        if fn in DYNAMIC and samples:
            k = counters.get((fn, handle.index), 0)
            counters[(fn, handle.index)] = k + 1
            per_dev = samples[k % len(samples)][handle.index]
            if fn in per_dev:
                return answer(per_dev[fn])
        if fn not in d:
            raise mod.NVMLError_NotSupported()
        return answer(d[fn])

    # -- init -------------------------------------------------------------------------------------------------------
    def nvmlInit():
        enter("nvmlInit")
        if init_error:
            raise_named(init_error)
        mod._initialised += 1

    def nvmlShutdown():
        enter("nvmlShutdown")
        if mod._initialised <= 0:
            raise mod.NVMLError_Uninitialized()
        mod._initialised -= 1

    # -- system -----------------------------------------------------------------------------------------------------
    def nvmlSystemGetDriverVersion():
        enter("nvmlSystemGetDriverVersion")
        return answer(fixture["system"]["nvmlSystemGetDriverVersion"])

    def nvmlSystemGetCudaDriverVersion():
        enter("nvmlSystemGetCudaDriverVersion")
        return answer(fixture["system"]["nvmlSystemGetCudaDriverVersion"])

    def nvmlDeviceGetCount():
        enter("nvmlDeviceGetCount")
        return len(devices)

    def nvmlDeviceGetHandleByIndex(index):
        enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(devices):
            raise mod.NVMLError_InvalidArgument()
        return _Handle(index)

    def nvmlDeviceGetIndex(handle):
        device(handle)
        enter("nvmlDeviceGetIndex", handle.index)
        return handle.index

    # MIG instances: fixture["mig"] = {"MIG-<uuid>": parent index}. An instance handle is a _Handle with .mig set.
    def nvmlDeviceGetHandleByUUID(uuid):
        enter("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        mig = fixture.get("mig", {})
        if text in mig:
            h = _Handle(mig[text])
            h.mig = text
            return h
        for i, d in enumerate(devices):
            if d.get("nvmlDeviceGetUUID") == text:
                return _Handle(i)
        raise mod.NVMLError_NotFound()

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice):
        enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        if not getattr(migDevice, "mig", None):
            raise mod.NVMLError_InvalidArgument()
        return _Handle(migDevice.index)

    # -- static device facts ----------------------------------------------------------------------------------------
    def nvmlDeviceGetName(handle):
        return reading("nvmlDeviceGetName", handle)

    def nvmlDeviceGetUUID(handle):
        return reading("nvmlDeviceGetUUID", handle)

    def nvmlDeviceGetPciInfo(handle):
        v = reading("nvmlDeviceGetPciInfo", handle)
        return _Struct(**{k: (x.encode() if isinstance(x, str) else x) for k, x in v.items()})

    def nvmlDeviceGetCudaComputeCapability(handle):
        return tuple(reading("nvmlDeviceGetCudaComputeCapability", handle))

    def nvmlDeviceGetEnforcedPowerLimit(handle):
        return reading("nvmlDeviceGetEnforcedPowerLimit", handle)

    def nvmlDeviceGetPowerManagementLimit(handle):
        return reading("nvmlDeviceGetPowerManagementLimit", handle)

    def nvmlDeviceGetCurrPcieLinkGeneration(handle):
        return reading("nvmlDeviceGetCurrPcieLinkGeneration", handle)

    def nvmlDeviceGetMaxPcieLinkGeneration(handle):
        return reading("nvmlDeviceGetMaxPcieLinkGeneration", handle)

    def nvmlDeviceGetCurrPcieLinkWidth(handle):
        return reading("nvmlDeviceGetCurrPcieLinkWidth", handle)

    def nvmlDeviceGetMaxPcieLinkWidth(handle):
        return reading("nvmlDeviceGetMaxPcieLinkWidth", handle)

    def _link(fn: str, handle, link: int):
        d = device(handle)
        enter(fn, handle.index)
        links = d.get("nvlink", [])
        if not links:
            raise mod.NVMLError_NotSupported()
        if not 0 <= link < len(links):
            raise mod.NVMLError_InvalidArgument()  # what NVML answers past a GPU's last link
        entry = links[link]
        if fn not in entry:
            # A GPU without NVLink answers NotSupported for every link query, not just the state.
            state = entry.get("nvmlDeviceGetNvLinkState")
            answer(state)
            raise mod.NVMLError_NotSupported()
        return answer(entry[fn])

    def nvmlDeviceGetNvLinkState(device, link):
        return _link("nvmlDeviceGetNvLinkState", device, link)

    def nvmlDeviceGetNvLinkVersion(device, link):
        return _link("nvmlDeviceGetNvLinkVersion", device, link)

    def nvmlDeviceGetNvLinkRemoteDeviceType(handle, link):
        return _link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)

    def nvmlDeviceGetNvLinkRemotePciInfo(device, link):
        v = _link("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        return _Struct(**{k: (x.encode() if isinstance(x, str) else x) for k, x in v.items()})

    def nvmlDeviceGetTopologyCommonAncestor(device1, device2):
        d = device(device1)
        device(device2)
        enter("nvmlDeviceGetTopologyCommonAncestor", device1.index)
        table = d.get("nvmlDeviceGetTopologyCommonAncestor", {})
        if str(device2.index) not in table:
            raise mod.NVMLError_NotSupported()
        return answer(table[str(device2.index)])

    # -- readings -----------------------------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(handle):
        return _Struct(**reading("nvmlDeviceGetUtilizationRates", handle))

    def nvmlDeviceGetMemoryInfo(handle, version=None):
        return _Struct(**reading("nvmlDeviceGetMemoryInfo", handle))

    def nvmlDeviceGetTemperature(handle, sensor):
        if sensor != 0:
            raise mod.NVMLError_InvalidArgument()
        return reading("nvmlDeviceGetTemperature", handle)

    def nvmlDeviceGetPowerUsage(handle):
        return reading("nvmlDeviceGetPowerUsage", handle)

    def nvmlDeviceGetTotalEnergyConsumption(handle):
        return reading("nvmlDeviceGetTotalEnergyConsumption", handle)  # mJ since the driver loaded

    def nvmlDeviceGetClockInfo(handle, type):
        if type != 1:
            raise mod.NVMLError_NotSupported()
        return reading("nvmlDeviceGetClockInfo", handle)

    def nvmlDeviceGetCurrentClocksEventReasons(handle):
        return reading("nvmlDeviceGetCurrentClocksEventReasons", handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
        return reading("nvmlDeviceGetCurrentClocksThrottleReasons", handle)

    def nvmlDeviceGetPcieThroughput(device, counter):
        tx_rx = reading("nvmlDeviceGetPcieThroughput", device)
        return tx_rx[counter]

    def nvmlDeviceGetFieldValues(handle, fieldIds):
        table = reading("nvmlDeviceGetFieldValues", handle)
        out = []
        for fid in fieldIds:
            field, scope = fid if isinstance(fid, tuple) else (fid, 0)
            entry = table.get(f"{field}:{scope}", {"nvmlReturn": 3, "value": 0})
            out.append(_Struct(fieldId=field, scopeId=scope, timestamp=0, latencyUsec=0, valueType=3,
                               nvmlReturn=entry["nvmlReturn"], value=_Struct(ullVal=entry["value"])))
        return out

    for name, fn in list(locals().items()):
        if name.startswith("nvml") and callable(fn):
            setattr(mod, name, fn)
    return mod


# ----------------------------------------------------------------------------------------------------------------------
# A synthetic machine, written from the API documentation (not a recording): 4 GPUs, 0-1 joined by 12 NVLink 3.0
# links (A100 SXM4), 2-3 two T4s behind one PCIe switch without NVLink, the pairs across sockets otherwise.
# ----------------------------------------------------------------------------------------------------------------------
NOT_SUPPORTED = {"error": "NVMLError_NotSupported"}


def install(monkeypatch, fixture: dict | None = None, **build_kw) -> types.ModuleType:
    """Build a fake from ``fixture`` (the synthetic one by default) and make ``tftoolkit.nvml.load`` return it, so
    every NVML user in the toolkit (they all open NVML through ``tftoolkit.nvml.session``) sees the fake."""
    from tftoolkit import nvml

    mod = build(synthetic_fixture() if fixture is None else fixture, **build_kw)
    monkeypatch.setattr(nvml, "load", lambda: mod)
    return mod


def _bus(i: int) -> str:
    return f"00000000:{0x07 + 0x10 * i:02X}:00.0"


def synthetic_fixture(power_mw=(250_000, 240_000, 60_000, 55_000), util=(90, 88, 40, 35), samples: int = 4) -> dict:
    a100 = dict(nvmlDeviceGetName="NVIDIA A100-SXM4-80GB", nvmlDeviceGetCudaComputeCapability=[8, 0],
                nvmlDeviceGetEnforcedPowerLimit=400_000, nvmlDeviceGetPowerManagementLimit=400_000,
                nvmlDeviceGetCurrPcieLinkGeneration=4, nvmlDeviceGetMaxPcieLinkGeneration=4,
                nvmlDeviceGetCurrPcieLinkWidth=16, nvmlDeviceGetMaxPcieLinkWidth=16, mem_total=80 * 2**30)
    t4 = dict(nvmlDeviceGetName="Tesla T4", nvmlDeviceGetCudaComputeCapability=[7, 5],
              nvmlDeviceGetEnforcedPowerLimit=70_000, nvmlDeviceGetPowerManagementLimit=70_000,
              nvmlDeviceGetCurrPcieLinkGeneration=1, nvmlDeviceGetMaxPcieLinkGeneration=3,
              nvmlDeviceGetCurrPcieLinkWidth=16, nvmlDeviceGetMaxPcieLinkWidth=16, mem_total=16 * 2**30)
    # (i, j) -> nvmlGpuTopologyLevel_t
    levels = {(0, 1): 40, (2, 3): 10}
    devices = []
    for i, spec in enumerate([a100, a100, t4, t4]):
        spec = dict(spec)
        total = spec.pop("mem_total")
        d = dict(spec, nvmlDeviceGetUUID=f"GPU-00000000-0000-0000-0000-00000000000{i}",
                 nvmlDeviceGetPciInfo={"busId": _bus(i)},
                 nvmlDeviceGetMemoryInfo={"total": total, "free": total - 2**30, "used": 2**30})
        if i < 2:
            peer = 1 - i
            d["nvlink"] = [{"nvmlDeviceGetNvLinkState": 1, "nvmlDeviceGetNvLinkRemotePciInfo": {"busId": _bus(peer)},
                            "nvmlDeviceGetNvLinkRemoteDeviceType": 0, "nvmlDeviceGetNvLinkVersion": 4}
                           for _ in range(12)]
        else:
            d["nvlink"] = [{"nvmlDeviceGetNvLinkState": NOT_SUPPORTED}]
        d["nvmlDeviceGetTopologyCommonAncestor"] = {
            str(j): levels.get((min(i, j), max(i, j)), 50) for j in range(4) if j != i}
        devices.append(d)
    rows = []
    for k in range(samples):
        per_dev = []
        for i, d in enumerate(devices):
            total = d["nvmlDeviceGetMemoryInfo"]["total"]
            used = (k + 1) * 2**30
            r = {"nvmlDeviceGetUtilizationRates": {"gpu": util[i], "memory": util[i] // 2},
                 "nvmlDeviceGetMemoryInfo": {"total": total, "free": total - used, "used": used},
                 "nvmlDeviceGetTemperature": 60 + i + k,
                 "nvmlDeviceGetPowerUsage": power_mw[i],
                 # mJ since the driver loaded; only the A100s' readings have it, so the T4s exercise the power-sample fallback.
                 **({"nvmlDeviceGetTotalEnergyConsumption": 10**9 + 200_000 * (i + 1) * k} if i < 2 else {}),
                 "nvmlDeviceGetClockInfo": 1410 if i < 2 else 1590,
                 "nvmlDeviceGetCurrentClocksEventReasons": 0,
                 "nvmlDeviceGetCurrentClocksThrottleReasons": 0,
                 "nvmlDeviceGetPcieThroughput": [1000 * (i + 1), 2000 * (i + 1)]}
            if i < 2:
                # Cumulative KiB per link; each reading adds 1024 KiB per link.
                r["nvmlDeviceGetFieldValues"] = {f"{f}:{link}": {"nvmlReturn": 0, "value": 1024 * (k + 1)}
                                                 for f in (138, 139) for link in range(12)}
            per_dev.append(r)
        rows.append(per_dev)
    return {"format": "tftoolkit-nvml-fixture/1",
            "meta": {"synthetic": True, "note": "written from the NVML API documentation, not recorded"},
            "system": {"nvmlSystemGetDriverVersion": "550.54.15", "nvmlSystemGetCudaDriverVersion": 12040},
            "devices": devices, "samples": rows, "nvidia_smi_topo_m": None}


def nvswitch_fixture(n: int = 4, links: int = 18) -> dict:
    """n H100 SXM GPUs whose NVLinks all go into NVSwitches (as on an HGX board)."""
    fx = synthetic_fixture(samples=1)
    devices = []
    for i in range(n):
        d = dict(fx["devices"][0], nvmlDeviceGetName="NVIDIA H100 80GB HBM3",
                 nvmlDeviceGetUUID=f"GPU-h100-{i}", nvmlDeviceGetPciInfo={"busId": _bus(i)})
        d["nvlink"] = [{"nvmlDeviceGetNvLinkState": 1,
                        "nvmlDeviceGetNvLinkRemotePciInfo": {"busId": f"00000000:{0xA0 + k:02X}:00.0"},  # a switch
                        "nvmlDeviceGetNvLinkRemoteDeviceType": 2, "nvmlDeviceGetNvLinkVersion": 6}
                       for k in range(links)]
        d["nvmlDeviceGetTopologyCommonAncestor"] = {str(j): 50 if (i < n // 2) != (j < n // 2) else 40
                                                    for j in range(n) if j != i}
        devices.append(d)
    return dict(fx, devices=devices, samples=[])
