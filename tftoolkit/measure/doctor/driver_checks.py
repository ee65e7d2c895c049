"""The doctor's checks of the NVIDIA driver side, which import no TensorFlow: NVML readings and NCCL's transport.

    nvml            power, energy, memory, temperature and clocks readable through NVML
    nccl_transport  per GPU pair: NVLink / PCIe from the topology, and NCCL's own transport from its log (from a
                    child process that runs one NCCL all-reduce with NCCL_DEBUG=INFO)
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

from ... import gpus as visibility
from ... import nvml as nvml_api
from .check import Check, Context


NCCL_EDGE = re.compile(r"(?:Channel|Ring)\s+\d+(?:/\d+)?\s*:\s*(\d+)\[([0-9a-fx]+)\]\s*->\s*(\d+)\[([0-9a-fx]+)\]"
                       r"(?:\[\w+\])?\s+via\s+(\S+)", re.IGNORECASE)


def parse_nccl_transports(log_text: str) -> dict[tuple[int, int], str]:
    """{(rank, peer rank): transport} from an NCCL_DEBUG=INFO log: each "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"
    line (or the older "Ring 00 : ..."). The transport is NCCL's own name, first part: P2P (NVLink or PCIe
    peer-to-peer), SHM (through host memory), NET (a network, between hosts), CollNet/NVLS for switch offload."""
    out: dict[tuple[int, int], str] = {}
    for m in NCCL_EDGE.finditer(log_text):
        a, b, how = int(m.group(1)), int(m.group(3)), m.group(5)
        out.setdefault((min(a, b), max(a, b)), how)
    return out


def transport_verdict(link: str, transport: str) -> tuple[str, str]:
    """(pass|fail, why) for one GPU pair: NVLink-connected GPUs should talk P2P; SHM means host memory."""
    kind = transport.split("/", 1)[0].upper()
    if link.startswith("NV") and kind != "P2P" and kind != "NVLS":
        return "fail", f"NVLink ({link}) but NCCL uses {transport}"
    if kind == "SHM":
        return "pass", f"{link}: through host memory ({transport}); peer-to-peer is off or unsupported"
    return "pass", f"{link}: {transport}"


def check_nvml(ctx: Context) -> Check:
    try:
        with nvml_api.session() as nvml:
            return _nvml_readings(nvml)
    except Exception as e:  # noqa: BLE001 - nvmlInit failed (no library, no driver, no permission), or NVML broke
        return Check("nvml", "skip", detail=f"NVML unavailable ({nvml_api.error_text(e)}): no GPU metrics here")


def _nvml_readings(nvml) -> Check:
    count = int(nvml.nvmlDeviceGetCount())
    seen = visibility.visible()
    indices = list(range(count)) if seen is None else (visibility.nvml_indices(seen, nvml) or list(range(count)))
    if not indices:
        return Check("nvml", "skip", detail="NVML lists no GPU")
    probes = {
        "power": lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "energy": lambda h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0,
        "memory": lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used,
        "temperature": lambda h: nvml.nvmlDeviceGetTemperature(h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
        "sm_clock": lambda h: nvml.nvmlDeviceGetClockInfo(h, getattr(nvml, "NVML_CLOCK_SM", 1)),
    }
    missing, sample = [], {}
    for i in indices:
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        for name, fn in probes.items():
            try:
                value = fn(h)
                sample.setdefault(name, value)
            except Exception as e:  # noqa: BLE001
                missing.append(f"gpu{i} {name} ({nvml_api.error_text(e)})")
    figure = (f"gpu{indices[0]}: {sample.get('power', math.nan):.0f} W, {sample.get('temperature', math.nan)} C, "
              f"{sample.get('sm_clock', math.nan)} MHz" if sample else "")
    if missing:
        only_energy = all(" energy " in f" {m} " for m in missing)
        return Check("nvml", "pass" if only_energy else "fail", figure,
                     f"{len(indices)} GPU(s); unreadable: {'; '.join(missing[:6])}"
                     + (" (energy falls back to integrating power)" if only_energy else ""),
                     "run as a user allowed to query the GPUs, or update the driver")
    return Check("nvml", "pass", figure, f"{len(indices)} GPU(s): power, energy, memory, temperature, clocks")


def check_nccl_transport(ctx: Context, nccl_log: str | None = None) -> Check:
    report = ctx.report
    gpus = report.get("gpus", [])
    if len(gpus) < 2:
        return Check("nccl_transport", "skip", detail=f"{len(gpus)} GPU(s): no pair to connect")
    pairs = {tuple(p["gpus"]): p["link"] for p in report.get("topology", {}).get("pairs", [])}
    if nccl_log is None:
        nccl_log = nccl_probe_log()
    transports = parse_nccl_transports(nccl_log or "")
    if not transports:
        return Check("nccl_transport", "fail", f"{len(pairs)} pair(s) in the topology",
                     "NCCL logged no channel (NCCL_DEBUG=INFO): its all-reduce did not run",
                     "install tensorflow[and-cuda] (NCCL), and check `tftoolkit env`'s nccl line")
    # NCCL's ranks are the probe's GPUs in CUDA's order: the GPUs the mask leaves, numbered from 0; the topology
    # is keyed by NVML's numbers.
    mask = visibility.visible()
    nvml_of = {r: (int(e) if e.isdigit() else r) for r, e in enumerate(mask)} if mask else {}
    lines, bad = [], []
    for (a, b), how in sorted(transports.items()):
        na, nb = nvml_of.get(a, a), nvml_of.get(b, b)
        status, why = transport_verdict(pairs.get((min(na, nb), max(na, nb)), "?"), how)
        lines.append(f"{a}-{b} {why}")
        if status == "fail":
            bad.append(f"{a}-{b} {why}")
    figure = ", ".join(sorted({h.split('/')[0] for h in transports.values()}))
    if bad:
        return Check("nccl_transport", "fail", figure, "; ".join(bad),
                     "NVLink pairs should talk P2P: check NCCL_P2P_DISABLE / NCCL_P2P_LEVEL and the driver's P2P "
                     "support (`nvidia-smi topo -p2p r`)")
    return Check("nccl_transport", "pass", figure, "; ".join(lines))


def nccl_probe_log(timeout: float = 120.0) -> str:
    """Run one NCCL all-reduce over every visible GPU in a child process with NCCL_DEBUG=INFO; its stderr."""
    code = "from tftoolkit.measure.doctor.driver_checks import nccl_probe; nccl_probe()"
    env = {**os.environ, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P,SHM,NET,GRAPH",
           "TF_CPP_MIN_LOG_LEVEL": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return f"probe failed: {e}"
    return done.stdout + done.stderr


def nccl_probe() -> None:
    """One NCCL all-reduce over every visible GPU with NCCL's answer checked: nccl_probe_log's child runs it."""
    # Deferred on purpose: only the child process needs TensorFlow; the checks here run without it.
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    strategy = tf.distribute.MirroredStrategy([d.name for d in gpus], cross_device_ops=tf.distribute.NcclAllReduce())
    out = strategy.run(tf.function(lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.ones([1024]))))
    got = {float(v.numpy()[0]) for v in strategy.experimental_local_results(out)}
    if got != {float(len(gpus))}:
        raise SystemExit(f"NCCL all-reduce gave {sorted(got)}, expected {len(gpus)} on every GPU")
