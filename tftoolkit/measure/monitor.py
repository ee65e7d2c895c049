"""A background sampler of GPU and host metrics, written as a tidy ``monitor.csv`` next to a run.

    with Monitor(run_dir / "monitor.csv", interval_s=0.5) as mon:
        mon.phase("warmup"); ...
        mon.phase("train"); ...
    df = read_monitor(run_dir)
    summary = summarize(df, images=n_images, phase="train")

Columns: ``time_s, device, metric, value, phase``. ``device`` is ``gpu<N>`` (N = NVML index, as nvidia-smi
shows it), ``host`` (this process and the whole machine) or ``cpu<N>`` (one core). Metric names and units are
listed once, in ``METRICS``.

The monitor never takes a run down: without NVML it records the host only; a failing NVML query is logged once
(logger ``tftoolkit``) and that metric is skipped for the rest of the run. It imports no TensorFlow.
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
import time
from io import BytesIO
from pathlib import Path

from .. import gpus
from ..errors import ConfigError, DataError, DeviceError, RunDirError
from . import nvml as nvml_api

logger = logging.getLogger("tftoolkit")

COLUMNS = ["time_s", "device", "metric", "value", "phase"]

# metric -> (short name, unit). The one place a metric is documented; plots take their axis labels from here.
METRICS: dict[str, tuple[str, str]] = {
    # NVML's "GPU utilisation" is the share of time any kernel ran, not how many SMs were busy: a small kernel
    # running back to back reads 100%. Low values are meaningful (the GPU waited); high ones are an upper bound.
    "util_gpu_pct": ("GPU utilisation", "%"),
    "util_mem_pct": ("memory-controller utilisation", "%"),
    "mem_used_bytes": ("GPU memory used", "bytes"),
    "mem_total_bytes": ("GPU memory total", "bytes"),
    "temp_c": ("GPU temperature", "°C"),
    "power_w": ("power draw", "W"),
    # NVML's energy counter (nvmlDeviceGetTotalEnergyConsumption, Volta and newer), from the monitor's start. Power
    # readings are a 1-second average on recent GPUs, so integrating them misses short bursts; the counter does not.
    "energy_j": ("energy since the monitor started", "J"),
    "sm_clock_mhz": ("SM clock", "MHz"),
    "throttle_reasons": ("clock event (throttle) reasons, NVML bitmask", "bitmask"),
    "pcie_tx_mb_per_s": ("PCIe transmit", "MB/s"),
    "pcie_rx_mb_per_s": ("PCIe receive", "MB/s"),
    "nvlink_tx_mb_per_s": ("NVLink transmit, all links", "MB/s"),
    "nvlink_rx_mb_per_s": ("NVLink receive, all links", "MB/s"),
    # device "host": all cores together; device "cpu<N>": one core.
    "cpu_util_pct": ("CPU utilisation", "%"),
    # This process plus its children; a sum of RSS counts pages they share more than once.
    "rss_bytes": ("process RSS", "bytes"),
    "sys_mem_used_pct": ("host memory in use", "%"),
}
# Each active reason also gets its own row, "throttle_<name>" = 1, so a plot or a grep needs no bit arithmetic.
THROTTLE_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
# Reasons that mean "slower than it could be because of power or heat"; idle and app-clock settings do not count.
PERF_THROTTLE_MASK = 0x004 | 0x008 | 0x020 | 0x040 | 0x080

IDLE_UTIL_PCT = 10.0     # a GPU under this utilisation is idle (issue 8)
IDLE_TIME_FRAC = 0.20    # flag a GPU idle for more than this share of the time the others worked
THROTTLE_TIME_FRAC = 0.05  # flag throttling seen in at least this share of samples; one blip is not a finding

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
        try:
            nvml = nvml_api.load()
            nvml.nvmlInit()
        except Exception as exc:
            if self._requested:
                raise DeviceError(f"GPU(s) {self._requested} requested for monitoring, but no GPU can be queried "
                                  f"({nvml_api.error_text(exc)}); pass gpu_indices=None to monitor the host only") from None
            self._gpu_note = f"NVML unavailable ({nvml_api.error_text(exc)})"
            return
        try:
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
                self._gpu_indices = self._requested
            else:
                # NVML sees every GPU on the machine whatever CUDA_VISIBLE_DEVICES says; monitoring GPUs another
                # job owns would make this run's GPUs look unbalanced and others' look idle.
                seen = gpus.visible()
                visible = None if seen is None else gpus.nvml_indices(seen, nvml)
                self._gpu_indices = list(range(count)) if visible is None else visible  # unmappable: all
        except DeviceError:
            raise
        except Exception as exc:
            if self._requested:
                raise DeviceError(f"cannot list GPUs ({nvml_api.error_text(exc)}); pass gpu_indices=None to monitor the host only") \
                    from None
            self._gpu_note = f"cannot list GPUs ({nvml_api.error_text(exc)})"
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass

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
        import psutil

        # A large buffer plus explicit flushes: the OS only ever sees whole samples, so a killed run leaves
        # complete lines (read_monitor drops a torn last line anyway).
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "w", newline="", buffering=1 << 20)
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
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

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
            nvml = nvml_api.load()
            nvml.nvmlInit()
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
        import psutil

        def cpu():
            now = psutil.cpu_times(percpu=True)
            # Our own deltas rather than psutil.cpu_percent(), whose baseline is global and reset by any other caller.
            out, busy_all, total_all = [], 0.0, 0.0
            for k, (a, b) in enumerate(zip(self._last_cpu, now)):
                busy, total = _busy(b) - _busy(a), _total(b) - _total(a)
                busy_all, total_all = busy_all + busy, total_all + total
                if self.per_core and total > 0:
                    out.append((f"cpu{k}", "cpu_util_pct", _pct(busy, total)))
            self._last_cpu = now
            if total_all <= 0:
                return []  # no clock tick since the last reading (the sample at start): no figure, not 0%
            return [("host", "cpu_util_pct", _pct(busy_all, total_all))] + out

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


def _total(ct) -> float:
    # Guest time is already counted inside user time on Linux.
    return sum(ct) - getattr(ct, "guest", 0.0) - getattr(ct, "guest_nice", 0.0)


def _busy(ct) -> float:
    return _total(ct) - ct.idle - getattr(ct, "iowait", 0.0)


def _pct(busy: float, total: float) -> float:
    # Rounded: tick counters are integers in disguise, and 6e-11 % reads like a bug.
    return round(max(0.0, min(100.0, 100.0 * busy / total)), 2)


# ----------------------------------------------------------------------------------------------------------------------
# Reading and summarising
# ----------------------------------------------------------------------------------------------------------------------
def read_monitor(path):
    """``monitor.csv`` (or a run directory holding one) as a DataFrame with the columns of ``COLUMNS``."""
    import pandas as pd

    path = Path(path)
    if path.is_dir():
        path = path / "monitor.csv"
    if not path.is_file():
        raise DataError(f"no monitor file at {path}: was the run started with a Monitor?")
    data = path.read_bytes()
    # A run killed mid-write can leave a torn last line; everything up to the last newline is whole.
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
    if not data.strip():
        return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("time_s", "value") else "object") for c in COLUMNS})
    df = pd.read_csv(BytesIO(data), dtype={"device": str, "metric": str, "phase": str})
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"{path} is not a monitor file: columns {missing} are missing")
    df["time_s"] = pd.to_numeric(df["time_s"], errors="coerce")
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    return df.dropna(subset=["time_s", "value"]).reset_index(drop=True)[COLUMNS]


def _series(df, device: str, metric: str):
    s = df[(df["device"] == device) & (df["metric"] == metric)]
    return s.sort_values("time_s")[["time_s", "value"]]


def _energy_j(power, counter=None) -> tuple[float | None, float | None, str | None]:
    """(energy in J, mean power in W, how): from NVML's energy counter where the GPU has one (the difference of its
    first and last readings), else the trapezoid integral of the power samples."""
    if counter is not None and len(counter) >= 2:
        t, e = counter["time_s"].to_numpy(float), counter["value"].to_numpy(float)
        if t[-1] > t[0] and e[-1] >= e[0]:
            energy = float(e[-1] - e[0])
            return energy, energy / float(t[-1] - t[0]), "energy counter"
    energy, mean = _power_integral(power)
    return energy, mean, ("power samples" if energy is not None else None)


def _power_integral(power) -> tuple[float | None, float | None]:
    """Energy (J) as the trapezoid integral of power over the sample times, and the time-weighted mean power."""
    if power.empty:
        return None, None
    t, p = power["time_s"].to_numpy(float), power["value"].to_numpy(float)
    if len(t) < 2 or t[-1] <= t[0]:
        return 0.0, float(p.mean())
    energy = float(((p[1:] + p[:-1]) / 2 * (t[1:] - t[:-1])).sum())
    return energy, energy / float(t[-1] - t[0])


def _idle_fracs(df, gpus: list[str]) -> dict[str, float | None]:
    """Per GPU: of the samples where another GPU worked (>= IDLE_UTIL_PCT), the share where this one did not."""
    util = df[(df["metric"] == "util_gpu_pct") & df["device"].isin(gpus)]
    if util.empty or len(gpus) < 2:
        return {g: None for g in gpus}
    wide = util.pivot_table(index="time_s", columns="device", values="value", aggfunc="mean")
    out = {}
    for g in gpus:
        if g not in wide.columns:
            out[g] = None
            continue
        others = wide.drop(columns=[g])
        mine = wide[g]
        worked = (others >= IDLE_UTIL_PCT).any(axis=1) & mine.notna()
        out[g] = float((mine[worked] < IDLE_UTIL_PCT).mean()) if worked.any() else None
    return out


def summarize(df, images: float | None = None, duration_s: float | None = None, *, phase: str | None = None) -> dict:
    """Per-GPU and host figures of a monitor frame (JSON-able), with idle and throttle flags.

    ``images``: images processed over the same span, for images per joule. ``duration_s``: the wall time
    those images took; when given, energy is mean power x duration_s, so images/J covers exactly that window
    even if the samples span a little more or less. ``phase``: only rows of that phase (e.g. "train").
    ``df`` may also be a path: a monitor.csv or the run directory holding one (read with read_monitor).
    """
    import pandas as pd

    if isinstance(df, (str, Path)):
        df = read_monitor(df)
    elif not isinstance(df, pd.DataFrame):
        raise DataError(f"summarize takes a monitor frame (read_monitor) or the path of a monitor.csv or run "
                        f"directory, got {type(df).__name__}")
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"summarize: the frame lacks column(s) {', '.join(missing)}; read monitor.csv with read_monitor")
    if phase is not None:
        df = df[df["phase"] == phase]
    span = float(df["time_s"].max() - df["time_s"].min()) if len(df) else 0.0
    duration = float(duration_s) if duration_s is not None else span
    gpus = sorted((d for d in df["device"].unique() if str(d).startswith("gpu")), key=lambda d: int(d[3:]))
    idle = _idle_fracs(df, gpus)
    out_gpus: dict[str, dict] = {}
    flags: list[str] = []
    total_energy = 0.0
    have_energy = False
    for g in gpus:
        util = _series(df, g, "util_gpu_pct")["value"]
        mem = _series(df, g, "mem_used_bytes")["value"]
        mem_total = _series(df, g, "mem_total_bytes")["value"]
        temp = _series(df, g, "temp_c")["value"]
        energy, mean_power, energy_source = _energy_j(_series(df, g, "power_w"), _series(df, g, "energy_j"))
        if duration_s is not None and mean_power is not None:
            energy = mean_power * duration
        thr = _series(df, g, "throttle_reasons")["value"].astype("int64")
        perf = thr & PERF_THROTTLE_MASK
        throttle_frac = float((perf != 0).mean()) if len(thr) else None
        reasons = sorted({name for bit, name in THROTTLE_REASONS.items() if bit & PERF_THROTTLE_MASK
                          and bool((thr & bit).any())})
        s = {
            "util_mean_pct": float(util.mean()) if len(util) else None,
            "util_max_pct": float(util.max()) if len(util) else None,
            "mem_peak_bytes": int(mem.max()) if len(mem) else None,
            "mem_total_bytes": int(mem_total.max()) if len(mem_total) else None,
            "mem_peak_frac": float(mem.max() / mem_total.max()) if len(mem) and len(mem_total) and mem_total.max() > 0
            else None,
            "temp_max_c": float(temp.max()) if len(temp) else None,
            "power_mean_w": mean_power,
            "energy_j": energy,
            "energy_source": energy_source,
            "idle_frac": idle.get(g),
            "idle": bool(idle.get(g) is not None and idle[g] > IDLE_TIME_FRAC),
            "throttle_frac": throttle_frac,
            "throttle_reasons": reasons,
            "throttled": bool(throttle_frac is not None and throttle_frac >= THROTTLE_TIME_FRAC),
        }
        if energy is not None:
            total_energy += energy
            have_energy = True
        out_gpus[g] = s
        if s["idle"]:
            flags.append(f"{g} was under {IDLE_UTIL_PCT:g}% utilisation {s['idle_frac']:.0%} of the time other GPUs "
                         "worked: check input sharding and per-replica batch")
        if s["throttled"]:
            flags.append(f"{g} throttled in {throttle_frac:.0%} of samples ({', '.join(reasons)}): "
                         "check cooling and power limits")
    if images is not None:
        n = len(gpus)
        for g, s in out_gpus.items():
            # Data parallelism splits every global batch equally, so each GPU processed images / n of them.
            s["images_per_joule"] = (images / n / s["energy_j"]) if s["energy_j"] else None
    cpu = _series(df, "host", "cpu_util_pct")["value"]
    rss = _series(df, "host", "rss_bytes")["value"]
    return {
        "duration_s": duration,
        "samples": int(df["time_s"].nunique()) if len(df) else 0,
        "gpus": out_gpus,
        "gpu_energy_j": total_energy if have_energy else None,
        "images": images,
        "images_per_joule": (images / total_energy) if images is not None and have_energy and total_energy > 0
        else None,
        "host": {
            "cpu_util_mean_pct": float(cpu.mean()) if len(cpu) else None,
            "cpu_util_max_pct": float(cpu.max()) if len(cpu) else None,
            "rss_peak_bytes": int(rss.max()) if len(rss) else None,
        },
        "flags": flags,
    }
