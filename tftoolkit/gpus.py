"""Which GPUs this process may use: the one reading of CUDA_VISIBLE_DEVICES, without importing TensorFlow.

CUDA's rules (CUDA C Programming Guide, "CUDA Environment Variables"), followed here:
- unset: every GPU is visible; set to "" : none is.
- a comma-separated list of integer indices, GPU UUIDs (``GPU-8932f937-...``, any unique prefix) or MIG
  instances (``MIG-<GPU-UUID>/<gi>/<ci>``, or ``MIG-<uuid>``); devices are enumerated in list order.
- the first invalid entry ends the list: ``0,2,-1,1`` makes 0 and 2 visible; "-1" alone hides every GPU.
  An entry of another kind than the first (a UUID after indices) is invalid too.
- an index is read like strtoul (``1gpu`` is 1); a repeated entry makes no device visible at all (what
  PyTorch observed of the driver, torch.cuda._parse_visible_devices).

Integer indices count in CUDA's order, which is NVML's (nvidia-smi's) when CUDA_DEVICE_ORDER=PCI_BUS_ID and,
on machines with one kind of GPU, also under CUDA's default (fastest first, ties by PCI bus).

Who asks: ``engine.devices`` (which physical GPU a replica is), ``measure.monitor`` (which GPUs to sample),
``cluster.launch`` and ``experiments.sweep`` (which GPUs to hand to child processes).
"""

from __future__ import annotations

import os
import re
import subprocess

from . import nvml as nvml_api

ENV = "CUDA_VISIBLE_DEVICES"
ORDER_ENV = "CUDA_DEVICE_ORDER"


def _kind(token: str) -> str:
    if token.startswith("GPU-"):
        return "uuid"
    if token.startswith("MIG-"):
        return "mig"
    return "index"


def parse(text: str | None) -> list[str] | None:
    """The visible devices ``text`` (a CUDA_VISIBLE_DEVICES value) names, in order; None = all of them.

    Indices come back normalised (``"01"`` -> ``"1"``), UUIDs and MIG names as written.
    """
    if text is None:
        return None
    out: list[str] = []
    kind = None
    for raw in text.split(","):
        tok = raw.strip()
        if not tok:
            break
        k = _kind(tok)
        if kind is None:
            kind = k
        elif k != kind:
            break
        if k == "index":
            m = re.match(r"\+?(\d+)", tok)  # strtoul: leading digits; "-1", "x" are invalid
            if not m:
                break
            tok = str(int(m.group(1)))
        if tok in out:
            return []
        out.append(tok)
    return out


def visible(environ=None) -> list[str] | None:
    """This process's visible devices (CUDA_VISIBLE_DEVICES parsed); None when it does not restrict them."""
    environ = os.environ if environ is None else environ
    return parse(environ.get(ENV))


def machine_count() -> int:
    """GPUs on this machine, without initialising CUDA: NVML, else ``nvidia-smi -L``, else 0."""
    try:
        with nvml_api.session() as nvml:
            return int(nvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - no NVML, no driver: ask nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def ids(environ=None) -> list[str]:
    """The GPUs this process may hand to others, as CUDA_VISIBLE_DEVICES entries it can pass on.

    Its own CUDA_VISIBLE_DEVICES entries when that is set (so under ``4,5,6,7`` children get 4..7, never
    0..3), else the machine's GPUs as NVML indices ``"0"``..``"n-1"``.
    """
    seen = visible(environ)
    if seen is not None:
        return seen
    return [str(i) for i in range(machine_count())]


def child_env(devices: list[str], environ=None) -> dict:
    """Environment entries that give a child process exactly ``devices`` (entries of ``ids()``)."""
    environ = os.environ if environ is None else environ
    env = {ENV: ",".join(devices)}
    if visible(environ) is None and ORDER_ENV not in environ:
        # The entries are NVML's numbers: make CUDA number GPUs the same way, so "GPU 2" is one card everywhere.
        # Entries taken from our own CUDA_VISIBLE_DEVICES keep the numbering they were given in.
        env[ORDER_ENV] = "PCI_BUS_ID"
    return env


def physical(local: list[int], environ=None) -> list[str]:
    """CUDA_VISIBLE_DEVICES entries of the process-local GPU numbers ``local`` (TensorFlow's /gpu:N)."""
    seen = visible(environ)
    if seen is None:
        return [str(i) for i in local]
    return [seen[i] for i in local]


def mig_parent(tok: str, nvml, uuids: list[str]) -> int | None:
    """The NVML index of the GPU a MIG instance lives on, or None when NVML cannot say.

    ``MIG-GPU-<gpu uuid>/<gi>/<ci>`` (CUDA 11.0's form) names its parent; ``MIG-<uuid>`` (later drivers) is asked
    of NVML: the instance's handle by UUID, its parent device, that device's index."""
    if tok.startswith("MIG-GPU-"):
        parent = tok[len("MIG-"):].split("/", 1)[0]
        match = [i for i, u in enumerate(uuids) if u == parent]
        return match[0] if len(match) == 1 else None
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(tok)
        return int(nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)))
    except Exception:  # noqa: BLE001 - an old driver or binding: the caller falls back to every GPU
        return None


def nvml_indices(devices: list[str], nvml) -> list[int] | None:
    """NVML indices of ``devices`` (integer, GPU-UUID or MIG entries); None when one cannot be mapped.

    UUID prefixes match as CUDA matches them; an ambiguous or unknown one ends the list, as in CUDA. A MIG
    instance maps to the GPU it is a slice of (NVML's utilisation, power and temperature are that GPU's).
    """
    out: list[int] = []
    uuids = None
    count = nvml.nvmlDeviceGetCount()

    def gpu_uuids() -> list[str]:
        found = []
        for i in range(count):
            try:
                u = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
                found.append(nvml_api.text(u))
            except Exception:  # noqa: BLE001 - a GPU whose UUID cannot be read matches nothing
                found.append("")
        return found

    for tok in devices:
        kind = _kind(tok)
        if kind == "mig":
            if uuids is None:
                uuids = gpu_uuids()
            parent = mig_parent(tok, nvml, uuids)
            if parent is None:
                return None
            out.append(parent)
            continue
        if kind == "index":
            k = int(tok)
            if k >= count:
                break
            out.append(k)
            continue
        if uuids is None:
            uuids = gpu_uuids()
        match = [i for i, u in enumerate(uuids) if u.startswith(tok)]
        if len(match) != 1:
            break
        out.append(match[0])
    return list(dict.fromkeys(out))
