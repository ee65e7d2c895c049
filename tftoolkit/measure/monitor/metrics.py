"""What a ``monitor.csv`` holds: its columns, every metric with its unit, and NVML's throttle-reason bits.

Columns: ``time_s, device, metric, value, phase``. ``device`` is ``gpu<N>`` (N = NVML index, as nvidia-smi
shows it), ``host`` (this process and the whole machine) or ``cpu<N>`` (one core).
"""

from __future__ import annotations

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
# The bits are NVML's (nvml.h; nvidia-ml-py's nvmlClocksEventReason* / nvmlClocksThrottleReason* constants,
# checked by tests/measure/test_monitor.py against the installed pynvml).
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
# The software power cap: the driver holds the clocks so the board stays at its power limit. Data-centre GPUs
# (A100, H100, H200) under a full load run there most of the time by design: it says the GPU is power-limited,
# not that anything is wrong with its cooling or power supply.
POWER_CAP_MASK = 0x004
# Slowdowns that are faults or stresses to look at: thermal (software or hardware), the hardware slowdown (high
# temperature or an external power-brake signal, as nvidia-smi -q -d PERFORMANCE explains) and the power brake.
SLOWDOWN_MASK = 0x008 | 0x020 | 0x040 | 0x080
# Reasons that mean "slower than it could be because of power or heat"; idle and app-clock settings do not count.
PERF_THROTTLE_MASK = POWER_CAP_MASK | SLOWDOWN_MASK
