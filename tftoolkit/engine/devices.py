"""Which devices a run uses: real GPUs, or N logical CPU devices that simulate N replicas.

TensorFlow fixes its device list (logical CPU devices, visible GPUs, memory growth, thread pools) the
first time it initialises its runtime, which happens on the first op, not at import. So everything here
must run before any tensor is created. ``init`` is idempotent: a later call that asks for no more than
what was set up is fine; one that needs more raises a DeviceError saying to call ``init`` first (in a
notebook: in the first cell, or restart the kernel).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from .. import gpus as visibility
from ..errors import DeviceError
# TensorFlow's one door (tftoolkit/tfimport.py), named here too: every engine path and its callers use it from here
from ..tfimport import frozen_import, holding_stderr, import_tensorflow, startup_noise  # noqa: F401

log = logging.getLogger("tftoolkit")

# The most replicas simulated on CPU. Each is a logical device with its own copy of the model, traced into one step
# graph, and MirroredStrategy's set-up alone grows with the square of the count (it lists every device for each
# one). At 64, two steps of small_cnn took 3.6 minutes and 3.5 GB on 2 cores, nearly all of it set-up and tracing;
# 100000 ran for minutes with no output. A study of scaling needs far fewer: more replicas belong on GPUs.
MAX_CPU_REPLICAS = 64


@dataclass(frozen=True)
class DeviceSetup:
    kind: str                 # "GPU" or "CPU-simulated"
    devices: tuple[str, ...]  # TensorFlow device names the strategy mirrors over
    gpu_indices: tuple[int, ...] | None  # NVML (nvidia-smi) numbers, for the monitor (None on CPU)
    host_cores: int
    # Positions in TensorFlow's list of physical GPUs (what CUDA_VISIBLE_DEVICES leaves, numbered from 0), one per
    # replica: what indexes tf.config.list_physical_devices("GPU"). Under CUDA_VISIBLE_DEVICES=4,5 replica 0 is
    # TensorFlow's GPU 0 and NVML's GPU 4. None on CPU.
    tf_gpus: tuple[int, ...] | None = None

    @property
    def replicas(self) -> int:
        return len(self.devices)


_state: dict = {}


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def quiet_tensorflow_info(logger, interactive: bool | None = None) -> None:
    """Keep TensorFlow's INFO lines out of notebooks: in an interactive shell (Jupyter, IPython, ``python -i``)
    TensorFlow sets its own logger to INFO and prints to stdout, so every MirroredStrategy and every eager reduce
    adds a line ("Reduce to /job:localhost/... then broadcast to ...") to a cell's output. That default goes back to
    WARNING; any other level is someone's choice and stays (``tf.get_logger().setLevel("INFO")`` after
    ``init_devices`` brings the lines back)."""
    if interactive is None:
        interactive = bool(getattr(sys, "ps1", None)) or bool(sys.flags.interactive)
    if interactive and logger.level == logging.INFO:
        logger.setLevel(logging.WARNING)


def physical_gpus() -> list:
    """GPUs TensorFlow can see. Listing physical devices does not initialise the runtime."""
    return import_tensorflow().config.list_physical_devices("GPU")


def init(replicas: int | None = None, gpus: list[int] | None = None, *, cpu_devices: int | None = None) -> DeviceSetup:
    """Set up devices for ``replicas`` replicas (or the GPUs named in ``gpus``) and return what to use.

    Simulated replicas are exactly ``replicas`` logical CPU devices, so a plain ``tf.distribute.MirroredStrategy()``
    (which mirrors over every logical CPU device when there is no GPU) runs the count asked for; ``cpu_devices``
    creates more, for a process that runs several counts (a test suite, doctor's odd count beside yours).
    Must run before TensorFlow creates its first tensor; later calls reuse the first set-up.
    """
    if replicas is not None and replicas <= 0:
        raise DeviceError(f"replicas must be > 0, got {replicas}")
    # CUDA numbers GPUs fastest first unless told otherwise; nvidia-smi, NVML and CUDA_VISIBLE_DEVICES as users
    # write it number them by PCI bus. Read when CUDA initialises, so it is set before TensorFlow lists GPUs
    # (child processes get the same from gpus.child_env). A value the user set is kept.
    os.environ.setdefault(visibility.ORDER_ENV, "PCI_BUS_ID")
    tf = import_tensorflow()
    quiet_tensorflow_info(tf.get_logger())
    phys = physical_gpus()
    if phys:
        return _init_gpus(tf, phys, replicas, gpus)
    if gpus:
        raise DeviceError(f"--gpus {','.join(map(str, gpus))} asked for GPUs, but this machine has none visible to "
                          "TensorFlow; drop --gpus to simulate replicas on CPU (or install tensorflow[and-cuda])")
    n = replicas or 1
    if n > MAX_CPU_REPLICAS:
        raise DeviceError(f"{n} simulated replicas asked; this machine has no GPU, and at most {MAX_CPU_REPLICAS} "
                          "replicas are simulated on CPU (each is a logical CPU device holding a copy of the model, "
                          "sharing the host's cores, and the set-up grows with the square of the count: 64 took "
                          f"minutes); use --replicas {MAX_CPU_REPLICAS} or fewer, or run on GPUs")
    return _init_cpu(tf, n, max(n, cpu_devices or 0))


def _init_gpus(tf, phys, replicas, wanted_gpus) -> DeviceSetup:
    n_phys = len(phys)
    if wanted_gpus:
        missing = [g for g in wanted_gpus if g >= n_phys]
        if missing:
            mask = visibility.visible()
            if mask is not None:
                inside = ", ".join(f"{i} (the machine's {e})" for i, e in enumerate(mask[:n_phys]))
                raise DeviceError(f"--gpus {','.join(map(str, wanted_gpus))}: GPU(s) {missing} are not visible: "
                                  f"{visibility.ENV}={os.environ.get(visibility.ENV)} leaves {n_phys} GPU(s), numbered inside this "
                                  f"process as {inside or 'none'}; name GPUs by those numbers, or change the mask")
            raise DeviceError(f"GPU(s) {missing} are not there; this machine has {n_phys} GPU(s): "
                              f"{', '.join(str(i) for i in range(n_phys))}")
        # TensorFlow numbers the GPUs it makes visible in physical order whatever order they are named in, so
        # replica k runs on the k-th of them: sorting keeps "replica k is GPU g" true in every label.
        wanted = sorted(wanted_gpus)
        if wanted != list(wanted_gpus):
            log.info("--gpus %s: replicas take the GPUs in TensorFlow's order, %s", ",".join(map(str, wanted_gpus)),
                     ",".join(map(str, wanted)))
    else:
        n = replicas or n_phys
        if n > n_phys:
            raise DeviceError(f"{n} replicas asked but this machine has {n_phys} GPU(s); use --replicas {n_phys} or fewer")
        wanted = list(range(n))
    if "gpu" not in _state:
        try:
            # Only the chosen GPUs become visible, so TensorFlow does not reserve memory on the others, and
            # memory grows on demand so the monitor's memory figures show what the run really uses.
            tf.config.set_visible_devices([phys[i] for i in wanted], "GPU")
            for i in wanted:
                tf.config.experimental.set_memory_growth(phys[i], True)
            _state["gpu"] = {"visible": wanted}
        except RuntimeError:
            _state["gpu"] = {"visible": list(range(n_phys))}  # initialised already: all GPUs stay visible
            log.warning("TensorFlow was initialised before tftoolkit set up the GPUs: all %d GPU(s) stay visible "
                        "and TensorFlow reserves most of each one's memory up front (no memory growth), so memory "
                        "figures show its pool, not the run. Call tftoolkit.init_devices() first (in a notebook: "
                        "the first cell, or restart the kernel)", n_phys)
    visible = _state["gpu"]["visible"]
    not_visible = [g for g in wanted if g not in visible]
    if not_visible:
        raise DeviceError(f"TensorFlow was initialised with GPUs {visible} visible; GPUs {not_visible} cannot be "
                          "added now. Restart the process (or the notebook kernel) and run again.")
    names = tuple(f"/gpu:{visible.index(g)}" for g in wanted)
    return DeviceSetup("GPU", names, nvml_indices(wanted), host_cores(), tuple(wanted))


def nvml_indices(local: list[int]) -> tuple[int, ...] | None:
    """The NVML (nvidia-smi) numbers of TensorFlow's GPUs ``local``, for the monitor.

    TensorFlow numbers the GPUs CUDA_VISIBLE_DEVICES leaves visible from 0; under ``CUDA_VISIBLE_DEVICES=4,5``
    its GPU 0 is NVML's 4. None when the entries are UUIDs or MIG instances (the monitor then maps
    CUDA_VISIBLE_DEVICES itself, through NVML).
    """
    entries = visibility.physical(list(local))
    if not all(e.isdigit() for e in entries):
        return None
    return tuple(int(e) for e in entries)


def configured() -> int | None:
    """How many devices the first ``init`` set up (logical CPU devices, or visible GPUs); None before it ran."""
    if "cpu" in _state:
        return _state["cpu"]["count"]
    return len(_state["gpu"]["visible"]) if "gpu" in _state else None


def _init_cpu(tf, n: int, count: int) -> DeviceSetup:
    if "cpu" not in _state:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
            _configure_cpu_threads(tf)
            _state["cpu"] = {"count": count}
        except RuntimeError:
            # TensorFlow was initialised by someone else first: use what it has.
            _state["cpu"] = {"count": len(tf.config.list_logical_devices("CPU"))}
    have = _state["cpu"]["count"]
    if n > have:
        raise DeviceError(f"{n} simulated replicas asked, but TensorFlow was already initialised with {have} CPU "
                          f"device(s). Call tftoolkit.init_devices({n}) before anything else touches TensorFlow "
                          "(in a notebook: first cell, or restart the kernel).")
    return DeviceSetup("CPU-simulated", tuple(f"/cpu:{i}" for i in range(n)), None, host_cores())


def _configure_cpu_threads(tf) -> None:
    """Size TensorFlow's thread pools for replicas that share the host's cores.

    Each simulated replica runs its ops from the shared inter-op pool, and every op may fan out over the
    intra-op pool. Left at TensorFlow's defaults both pools are sized to the core count, so N replicas can
    run N x cores threads on cores threads' worth of CPU: throughput then swings run to run with the
    scheduler. One intra-op pool the size of the machine, and an inter-op pool just large enough for the
    replicas plus the input pipeline, keeps the machine busy without oversubscribing it.
    """
    cores = host_cores()
    intra = int(os.environ.get("TFTOOLKIT_INTRA_OP_THREADS", cores))
    inter = int(os.environ.get("TFTOOLKIT_INTER_OP_THREADS", max(2, cores)))
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    _state["threads"] = {"intra_op": intra, "inter_op": inter}


def memory_peaks(setup: DeviceSetup) -> list[int] | None:
    """Per replica, the peak bytes TensorFlow's allocator held on its GPU so far (None on CPU, or unreadable).

    This is the run's own memory: NVML's "used" also counts the CUDA context and whatever TensorFlow's pool
    reserved beyond what tensors took."""
    if setup.kind != "GPU":
        return None
    tf = import_tensorflow()
    try:
        return [int(tf.config.experimental.get_memory_info(d.strip("/").upper())["peak"]) for d in setup.devices]
    except (ValueError, RuntimeError) as e:  # an allocator without stats (cuda_malloc_async in old versions)
        log.info("device memory peak unavailable: %s", e)
        return None


def thread_settings() -> dict:
    return dict(_state.get("threads", {}))


def resolve_replicas(replicas: int | None, gpus: list[int] | None) -> int:
    """The replica count a config means on this machine (None = all GPUs, or 1 CPU replica)."""
    if gpus:
        return len(gpus)
    if replicas is not None:
        return replicas
    return len(physical_gpus()) or 1
