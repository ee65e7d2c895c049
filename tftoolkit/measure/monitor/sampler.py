"""A background sampler of GPU and host metrics, written as a tidy ``monitor.csv`` next to a run.

Columns and metrics are listed once, in ``measure.monitor.metrics``. GPU readings come through one NVML session
(``tftoolkit.nvml``) held from ``start()`` to ``stop()``.

The monitor never takes a run down: without NVML it records the host only; a failing NVML query is logged once
(logger ``tftoolkit``) and that metric is skipped for the rest of the run. It imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import threading
import time
from pathlib import Path

import psutil

from ... import fileio, gpus
from ... import nvml as nvml_api
from ...errors import ConfigError, DeviceError, RunDirError
from . import cpu_times
from .metrics import COLUMNS, THROTTLE_REASONS

logger = logging.getLogger("tftoolkit")

# nvmlDeviceGetPcieThroughput blocks ~20 ms per call (it counts bytes over a 20 ms window), so two calls per
# GPU per sample would keep an 8-GPU sampler busy most of the time; PCIe is read at most this often instead.
PCIE_EVERY_S = 2.0
# Listing child processes scans /proc; children rarely change, so the list is refreshed only this often.
CHILDREN_EVERY_S = 5.0

# Documented NVML constant values, used when an older pynvml lacks the name.
_NVML_TEMPERATURE_GPU, _NVML_CLOCK_SM = 0, 1
_NVML_PCIE_UTIL_TX_BYTES, _NVML_PCIE_UTIL_RX_BYTES = 0, 1
_NVML_FI_NVLINK_DATA_TX, _NVML_FI_NVLINK_DATA_RX = 138, 139  # cumulative KiB; scopeId = link


class Monitor:
    """Samples GPU (NVML) and host (psutil) metrics every ``interval_s`` seconds in a daemon thread.

    ``path``: the CSV to write, or an existing directory (then ``<dir>/monitor.csv``).
    ``gpu_indices``: NVML indices (as nvidia-smi numbers GPUs) to sample; None = the GPUs CUDA_VISIBLE_DEVICES
    leaves visible, all of them if it is unset. ``per_core``: also one ``cpu<N>`` row per core per sample.
    ``flush_s``: how often rows reach the file, so a killed run leaves a readable file at most this stale.
    """

    def __init__(self, path, interval_s: float = 0.5, gpu_indices=None, *, per_core: bool = True,
                 flush_s: float = 1.0, phase: str = "run"):
        if isinstance(interval_s, bool) or not isinstance(interval_s, numbers.Real) \
                or not math.isfinite(interval_s) or interval_s <= 0:
            raise ConfigError(f"monitor interval_s must be a number of seconds > 0, got {interval_s!r}; "
                              "0.5 is a good default")
        if isinstance(flush_s, bool) or not isinstance(flush_s, numbers.Real) or not flush_s > 0:
            raise ConfigError(f"monitor flush_s must be > 0 seconds, got {flush_s!r}")
        path = Path(path)
        self.path = path / "monitor.csv" if path.is_dir() else path
        self.interval_s = float(interval_s)
        self.flush_s = float(flush_s)
        self.per_core = bool(per_core)
        self._phase = self._check_phase(phase)
        self._requested = self._check_indices(gpu_indices)
        self._gpu_indices: list[int] = []
        self._gpu_note: str | None = None
        self._resolve_gpus()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._file = None
        self._nvml = None
        self._session = contextlib.ExitStack()  # holds NVML open from start() to stop()
        self._gpus: list[dict] = []
        self._dead: set[tuple[str, str]] = set()   # (device, probe) pairs that failed: not tried again
        self._logged: set[str] = set()             # probes already logged: one message per probe per run
        self.t0: float | None = None               # time.monotonic() at start; time_s is relative to it
        self.t0_unix: float | None = None          # time.time() at start, to align with other logs

    # -- validation ----------------------------------------------------------------------------------------------------
    @staticmethod
    def _check_phase(name) -> str:
        if not isinstance(name, str) or not name.strip() or any(c in name for c in ',"\n\r'):
            raise ConfigError(f"monitor phase must be a non-empty name without commas, quotes or newlines, "
                              f"got {name!r} (e.g. 'warmup', 'train', 'eval')")
        return name.strip()

    @staticmethod
    def _check_indices(gpu_indices) -> list[int] | None:
        if gpu_indices is None:
            return None
        if isinstance(gpu_indices, numbers.Integral) and not isinstance(gpu_indices, bool):
            gpu_indices = [gpu_indices]
        try:
            items = list(gpu_indices)
        except TypeError:
            raise ConfigError(f"gpu_indices must be a list of GPU numbers or None, got {gpu_indices!r}") from None
        if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in items):
            raise ConfigError(f"gpu_indices must be GPU numbers >= 0 (as nvidia-smi shows them), got {items!r}")
        return list(dict.fromkeys(int(i) for i in items))

    def _resolve_gpus(self) -> None:
        """Pick the GPUs now, so a wrong index fails before the run starts rather than in the sampler."""
        opened = False
        try:
            with nvml_api.session() as nvml:
                opened = True
                self._gpu_indices = self._pick_gpus(nvml)
        except DeviceError:
            raise
        except Exception as exc:
            why = nvml_api.error_text(exc)
            if self._requested:
                said = (f"cannot list GPUs ({why})" if opened else
                        f"GPU(s) {self._requested} requested for monitoring, but no GPU can be queried ({why})")
                raise DeviceError(f"{said}; pass gpu_indices=None to monitor the host only") from None
            self._gpu_note = f"cannot list GPUs ({why})" if opened else f"NVML unavailable ({why})"

    def _pick_gpus(self, nvml) -> list[int]:
        count = nvml.nvmlDeviceGetCount()
        if self._requested is not None:
            missing = [i for i in self._requested if i >= count]
            if missing:
                present = []
                for i in range(count):
                    try:
                        present.append(f"{i} ({nvml_api.text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)))})")
                    except Exception:
                        present.append(str(i))
                raise DeviceError(
                    f"GPU index {', '.join(map(str, missing))} does not exist; GPUs present: "
                    f"{', '.join(present) if present else 'none'}. Use those numbers, or None for all.")
            return self._requested
        # NVML sees every GPU on the machine whatever CUDA_VISIBLE_DEVICES says; monitoring GPUs another
        # job owns would make this run's GPUs look unbalanced and others' look idle.
        seen = gpus.visible()
        visible = None if seen is None else gpus.nvml_indices(seen, nvml)
        return list(range(count)) if visible is None else visible  # unmappable: all

    # -- public API ----------------------------------------------------------------------------------------------------
    @property
    def gpu_indices(self) -> list[int]:
        return list(self._gpu_indices)

    def phase(self, name: str) -> None:
        """Mark the current phase; rows sampled from now on carry it (resolution: one interval)."""
        self._phase = self._check_phase(name)

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Monitor":
        if self._thread is not None:
            raise ConfigError("this Monitor is already running; make a new one for a new run")

        # A large buffer plus explicit flushes: the OS only ever sees whole samples, so a killed run leaves
        # complete lines (read_monitor drops a torn last line anyway).
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = fileio.open_for_writing(self.path, "w", newline="", buffering=1 << 20)  # no link followed
        except OSError as exc:
            raise RunDirError(f"cannot write the monitor file {self.path} ({exc.strerror or exc}); "
                              "choose a writable run directory") from None
        self._file.write(",".join(COLUMNS) + "\n")
        self._file.flush()
        self._proc = psutil.Process()
        self._children: list = []
        self._children_at = -math.inf
        self._last_cpu = psutil.cpu_times(percpu=True)
        self._open_gpus()
        self.t0, self.t0_unix = time.monotonic(), time.time()
        self._last_flush = self._last_pcie = -math.inf
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="tftoolkit-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None or self._file is None:
            return
        self._stop.set()
        self._thread.join(timeout=max(10.0, 5 * self.interval_s))
        if not self._thread.is_alive():
            self._sample()  # a last point at the very end, so short runs still span their whole duration
        try:
            self._file.flush()
            self._file.close()
        except Exception as exc:
            self._log_once("file", f"monitor: could not finish {self.path} ({nvml_api.error_text(exc)})")
        self._file = None
        self._nvml = None
        self._session.close()  # the NVML session opened by _open_gpus, if it opened one

    # -- sampling ------------------------------------------------------------------------------------------------------
    def _log_once(self, key: str, message: str, level: int = logging.WARNING) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.log(level, message)

    def _open_gpus(self) -> None:
        self._gpus = []
        if not self._gpu_indices:
            if self._gpu_note:
                self._log_once("nvml", f"monitor: no GPU metrics, {self._gpu_note}; recording host metrics only",
                               logging.INFO)
            return
        try:
            nvml = self._session.enter_context(nvml_api.session())
        except Exception as exc:
            self._log_once("nvml", f"monitor: NVML failed at start ({nvml_api.error_text(exc)}); recording host metrics only")
            return
        self._nvml = nvml
        for i in self._gpu_indices:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
            except Exception as exc:
                self._log_once("handle", f"monitor: cannot open gpu{i} ({nvml_api.error_text(exc)}); skipping it")
                continue
            links = []
            for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(handle, link):
                        links.append(link)
                except Exception:
                    break  # no NVLink on this GPU, or past its last link
            self._gpus.append({"device": f"gpu{i}", "handle": handle, "links": links, "nvlink_prev": None})

    def _loop(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self._sample()
            # If a sample overran the interval, skip the missed ticks instead of sampling back-to-back.
            next_at += self.interval_s * max(1, math.ceil((time.monotonic() - next_at) / self.interval_s))

    def _probe(self, device: str, probe: str, fn, rows: list) -> None:
        if (device, probe) in self._dead:
            return
        try:
            for metric, value in fn():
                rows.append((device, metric, value))
        except Exception as exc:
            self._dead.add((device, probe))
            kind = type(exc).__name__
            hint = ""
            if "NoPermission" in kind:
                hint = " (no permission: run as a user allowed to query the GPU, or ask the admin)"
            level = logging.INFO if "NotSupported" in kind else logging.WARNING
            self._log_once(probe, f"monitor: reading {probe} failed on {device}: {nvml_api.error_text(exc)}{hint}; "
                                  f"{probe} is skipped for the rest of the run", level)

    def _gpu_rows(self, g: dict, rows: list, t: float, pcie_due: bool) -> None:
        nvml, h, dev = self._nvml, g["handle"], g["device"]

        def util():
            u = nvml.nvmlDeviceGetUtilizationRates(h)
            return [("util_gpu_pct", u.gpu), ("util_mem_pct", u.memory)]

        def memory():
            m = nvml.nvmlDeviceGetMemoryInfo(h)
            return [("mem_used_bytes", m.used), ("mem_total_bytes", m.total)]

        def temperature():
            return [("temp_c", nvml.nvmlDeviceGetTemperature(
                h, getattr(nvml, "NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU)))]

        def power():
            return [("power_w", nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)]  # NVML reports milliwatts

        def energy():
            mj = int(nvml.nvmlDeviceGetTotalEnergyConsumption(h))  # millijoules since the driver loaded
            prev = g.get("energy_prev")
            # Summed reading to reading, so a counter that starts over (a driver reload) loses one interval, not
            # the run's total.
            g["energy_mj"] = g.get("energy_mj", 0) + (mj - prev if prev is not None and mj >= prev else 0)
            g["energy_prev"] = mj
            return [("energy_j", g["energy_mj"] / 1000.0)]

        def sm_clock():
            return [("sm_clock_mhz", nvml.nvmlDeviceGetClockInfo(h, getattr(nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)))]

        def throttle():
            # "Event reasons" is the current name; the "throttle reasons" call is its deprecated twin.
            fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
                or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            try:
                mask = int(fn(h))
            except Exception as exc:
                if "FunctionNotFound" not in type(exc).__name__ or fn is nvml.nvmlDeviceGetCurrentClocksThrottleReasons:
                    raise
                mask = int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))  # driver older than the binding
            return [("throttle_reasons", mask)] + [(f"throttle_{name}", 1) for bit, name in THROTTLE_REASONS.items()
                                                   if mask & bit]

        def pcie():
            tx = nvml.nvmlDeviceGetPcieThroughput(h, getattr(nvml, "NVML_PCIE_UTIL_TX_BYTES", _NVML_PCIE_UTIL_TX_BYTES))
            rx = nvml.nvmlDeviceGetPcieThroughput(h, getattr(nvml, "NVML_PCIE_UTIL_RX_BYTES", _NVML_PCIE_UTIL_RX_BYTES))
            return [("pcie_tx_mb_per_s", tx / 1000.0), ("pcie_rx_mb_per_s", rx / 1000.0)]  # NVML gives KB/s

        def nvlink():
            ids = [(_NVML_FI_NVLINK_DATA_TX, k) for k in g["links"]] + [(_NVML_FI_NVLINK_DATA_RX, k) for k in g["links"]]
            values = nvml.nvmlDeviceGetFieldValues(h, ids)
            for v in values:
                if v.nvmlReturn != 0:
                    raise nvml.NVMLError(v.nvmlReturn)
            n = len(g["links"])
            tx = sum(int(v.value.ullVal) for v in values[:n])
            rx = sum(int(v.value.ullVal) for v in values[n:])
            prev, g["nvlink_prev"] = g["nvlink_prev"], (t, tx, rx)
            if prev is None or t <= prev[0] or tx < prev[1] or rx < prev[2]:
                return []  # cumulative counters: a rate needs two readings, and a reset (driver reload) gives none
            dt = t - prev[0]
            return [("nvlink_tx_mb_per_s", (tx - prev[1]) * 1024 / 1e6 / dt),  # counters are KiB
                    ("nvlink_rx_mb_per_s", (rx - prev[2]) * 1024 / 1e6 / dt)]

        for probe, fn in (("utilisation", util), ("memory", memory), ("temperature", temperature), ("power", power),
                          ("energy", energy), ("sm_clock", sm_clock), ("throttle_reasons", throttle)):
            self._probe(dev, probe, fn, rows)
        if pcie_due:
            self._probe(dev, "pcie_throughput", pcie, rows)
        if g["links"]:
            self._probe(dev, "nvlink_throughput", nvlink, rows)

    def _host_rows(self, rows: list, t: float) -> None:

        def cpu():
            now = psutil.cpu_times(percpu=True)
            # Our own deltas rather than psutil.cpu_percent(), whose baseline is global and reset by any other caller.
            out, busy_all, total_all = [], 0.0, 0.0
            for k, (a, b) in enumerate(zip(self._last_cpu, now)):
                busy, total = cpu_times.busy(b) - cpu_times.busy(a), cpu_times.total(b) - cpu_times.total(a)
                busy_all, total_all = busy_all + busy, total_all + total
                if self.per_core and total > 0:
                    out.append((f"cpu{k}", "cpu_util_pct", cpu_times.pct(busy, total)))
            self._last_cpu = now
            if total_all <= 0:
                return []  # no clock tick since the last reading (the sample at start): no figure, not 0%
            return [("host", "cpu_util_pct", cpu_times.pct(busy_all, total_all))] + out

        def rss():
            if t - self._children_at >= CHILDREN_EVERY_S:
                self._children_at = t
                try:
                    self._children = self._proc.children(recursive=True)
                except psutil.Error:
                    self._children = []
            total = self._proc.memory_info().rss
            for child in self._children:
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    pass
            return [("host", "rss_bytes", total)]

        def sys_mem():
            return [("host", "sys_mem_used_pct", psutil.virtual_memory().percent)]

        for probe, fn in (("cpu_utilisation", cpu), ("rss", rss), ("host_memory", sys_mem)):
            if ("host", probe) in self._dead:
                continue
            try:
                rows.extend(fn())
            except Exception as exc:
                self._dead.add(("host", probe))
                self._log_once(probe, f"monitor: reading {probe} failed ({nvml_api.error_text(exc)}); skipped for the rest of the run")

    def _sample(self) -> None:
        try:
            now = time.monotonic()
            t = now - self.t0
            phase = self._phase
            rows: list = []
            pcie_due = now - self._last_pcie >= PCIE_EVERY_S
            if pcie_due:
                self._last_pcie = now
            for g in self._gpus:
                self._gpu_rows(g, rows, t, pcie_due)
            self._host_rows(rows, t)
            ts = f"{t:.3f}"
            self._file.write("".join(f"{ts},{dev},{metric},{_fmt(value)},{phase}\n" for dev, metric, value in rows))
            if now - self._last_flush >= self.flush_s:
                self._file.flush()
                self._last_flush = now
        except Exception as exc:  # the run matters more than its monitor
            self._log_once("sampler", f"monitor: a sample failed ({nvml_api.error_text(exc)}); monitoring continues")


def _fmt(value) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{float(value):.6g}"

