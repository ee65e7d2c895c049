"""``tftoolkit doctor``: does what the toolkit assumes hold on this machine? The first command on a new GPU server.

Each check is a function that returns a ``Check``: pass, fail or skip, the figure it measured, what it saw, and
what to do when it fails. On a machine without GPUs the checks that apply to CPU replicas run on simulated ones
(``--replicas N``); the GPU-only ones say ``skip`` and why.

    build           TensorFlow's build (tf.sysconfig.get_build_info) against the driver's CUDA, and cuDNN present
    visibility      the GPUs TensorFlow sees are the GPUs NVML sees under CUDA_VISIBLE_DEVICES, in the same order
    allreduce_sum   every all-reduce the toolkit offers sums exactly on every replica, at this replica count and at
                    an odd one (or is refused there, as hierarchical_copy is)
    equivalence     N replicas equal 1 device: a tiny model, 10 steps, the same global batch
    placement       device-placed data lives on each replica's device; without GPUs, TensorFlow's kernel registry
                    says the device path would stay in GPU memory (engine.kernels)
    timing          one and two units of work timed synchronised (engine.timer), interleaved with one unit
                    unsynchronised: twice the work must read about twice the time (a busy host: skip, and why)
    peak            a measured matmul rate against the rated peak for this device and precision (MFU's denominator)
    nvml            power, energy, memory, temperature and clocks readable through NVML
    nccl_transport  per GPU pair: NVLink / PCIe from the topology, and NCCL's own transport from its log

The checks live in ``doctor.tensorflow_checks`` and ``doctor.driver_checks`` (nvml and nccl_transport: no
TensorFlow, so they run on a machine that has only the driver and nvidia-ml-py); ``REGISTRY`` below is the one list
of their names, in the order they run. The TensorFlow ones need the devices set up first, so ``run`` must be the
first thing that touches TensorFlow in the process.
"""

from __future__ import annotations

import importlib
import json
import time

from ...engine import devices
from ...errors import ConfigError
from ...logs import ensure_logging
from .. import hardware
from .check import Check, Context

# The checks by name, in the order they run: the one list (the CLI's choices come from it). Each names its module and
# function, imported when it runs: tensorflow_checks imports TensorFlow, and the CLI reads these names to build its
# parser (`tftoolkit --help` must not start TensorFlow, nor set up devices before `run` does).
REGISTRY = {
    "build": ("tensorflow_checks", "check_build"),
    "visibility": ("tensorflow_checks", "check_visibility"),
    "allreduce_sum": ("tensorflow_checks", "check_allreduce_sum"),
    "equivalence": ("tensorflow_checks", "check_equivalence"),
    "placement": ("tensorflow_checks", "check_placement"),
    "timing": ("tensorflow_checks", "check_timing"),
    "peak": ("tensorflow_checks", "check_peak"),
    "nvml": ("driver_checks", "check_nvml"),
    "nccl_transport": ("driver_checks", "check_nccl_transport"),
}
CHECKS = tuple(REGISTRY)
QUICK = tuple(c for c in CHECKS if c not in ("equivalence", "peak"))  # no training, no long timing


def run(replicas: int | None = None, only=None) -> list[Check]:
    """Every check (or those named in ``only``), in CHECKS order. ``replicas``: simulated CPU replicas, or the
    first N GPUs (default: every GPU, or 4 simulated replicas without one)."""
    if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1):
        raise ConfigError(f"--replicas must be an integer >= 1, got {replicas!r}")
    names = list(CHECKS) if not only else [n for n in CHECKS if n in only]
    unknown = sorted(set(only or ()) - set(CHECKS))
    if unknown:
        raise ConfigError(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    ensure_logging(quiet=True)
    report = hardware.collect()
    n = replicas if replicas is not None else (len(report.get("gpus", [])) or 4)
    # A DeviceError (exit 2) for more replicas than GPUs; on CPU a spare device or two for an odd count beside n.
    setup = devices.init(n, cpu_devices=max(n + 1, 3))
    ctx = Context(n, setup, report)
    out = []
    for name in names:
        t0 = time.perf_counter()
        try:
            module, function = REGISTRY[name]
            check = getattr(importlib.import_module(f"{__package__}.{module}"), function)(ctx)
        except Exception as e:  # noqa: BLE001 - a check that breaks is a failed check, with its reason
            check = Check(name, "fail", detail=f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                          fix="run with TFTOOLKIT_DEBUG=1 and report the traceback")
        check.seconds = round(time.perf_counter() - t0, 2)
        out.append(check)
    return out


def as_json(checks: list[Check]) -> str:
    return json.dumps({"checks": [c.as_dict() for c in checks]}, indent=2)


def format_table(checks: list[Check]) -> str:
    rows = [("check", "result", "figure", "detail / what to do")]
    for c in checks:
        rows.append((c.name, c.status.upper() if c.status == "fail" else c.status, c.figure,
                     (c.detail + (f" -> {c.fix}" if c.status == "fail" and c.fix else ""))))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for r in rows:
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
    failed = [c.name for c in checks if c.status == "fail"]
    lines.append("")
    lines.append(f"{len(checks) - len(failed)} of {len(checks)} checks passed or skipped"
                 + (f"; failed: {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)
