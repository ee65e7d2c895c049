"""Reading and summarising a ``monitor.csv`` (written by ``measure.monitor.sampler.Monitor``).

``summarize`` gives per-GPU utilisation, memory, temperature, energy and images per joule, with flags for a GPU
idle while the others worked and for thermal or hardware slowdowns, and a note (not a flag) for a GPU that ran at
its software power cap: under a full load that is how data-centre GPUs run (an H200 at full bf16 load reports it in
most samples), not a cooling fault. It imports no TensorFlow.
"""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

import pandas as pd

from ...errors import DataError
from .metrics import COLUMNS, PERF_THROTTLE_MASK, POWER_CAP_MASK, SLOWDOWN_MASK, THROTTLE_REASONS

IDLE_UTIL_PCT = 10.0     # a GPU under this utilisation is idle
IDLE_TIME_FRAC = 0.20    # flag a GPU idle for more than this share of the time the others worked
THROTTLE_TIME_FRAC = 0.05  # flag throttling seen in at least this share of samples; one blip is not a finding


def _share(bits, mask: int) -> float | None:
    """The share of samples with any bit of ``mask`` set; None without samples."""
    return float(((bits & mask) != 0).mean()) if len(bits) else None


def _names(bits, mask: int) -> list[str]:
    return sorted({name for bit, name in THROTTLE_REASONS.items() if bit & mask and bool((bits & bit).any())})


def read_monitor(path):
    """``monitor.csv`` (or a run directory holding one) as a DataFrame with the columns of ``COLUMNS``."""
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
    df = _monitor_frame(df, phase)
    span = float(df["time_s"].max() - df["time_s"].min()) if len(df) else 0.0
    duration = float(duration_s) if duration_s is not None else span
    gpus = sorted((d for d in df["device"].unique() if str(d).startswith("gpu")), key=lambda d: int(d[3:]))
    idle = _idle_fracs(df, gpus)
    out_gpus: dict[str, dict] = {}
    flags: list[str] = []
    notes: list[str] = []  # what is worth knowing and is not a fault
    for g in gpus:
        s = _gpu_figures(df, g, idle.get(g), duration if duration_s is not None else None)
        out_gpus[g] = s
        gpu_flags, gpu_notes = _gpu_findings(g, s)
        flags += gpu_flags
        notes += gpu_notes
    energies = [s["energy_j"] for s in out_gpus.values() if s["energy_j"] is not None]
    total_energy = sum(energies, 0.0)
    have_energy = bool(energies)
    if images is not None:
        n = len(gpus)
        for g, s in out_gpus.items():
            # Data parallelism splits every global batch equally, so each GPU processed images / n of them.
            s["images_per_joule"] = (images / n / s["energy_j"]) if s["energy_j"] else None
    return {
        "duration_s": duration,
        "samples": int(df["time_s"].nunique()) if len(df) else 0,
        "gpus": out_gpus,
        "gpu_energy_j": total_energy if have_energy else None,
        "images": images,
        "images_per_joule": (images / total_energy) if images is not None and have_energy and total_energy > 0
        else None,
        "host": _host_figures(df),
        "flags": flags,
        "notes": notes,
    }


def _monitor_frame(df, phase: str | None):
    """The monitor frame ``summarize`` was given (or read from its path), checked, and cut to ``phase``."""
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
    return df


def _gpu_figures(df, g: str, idle_frac: float | None, duration: float | None) -> dict:
    """One GPU's figures: utilisation, memory, temperature, power and energy (over ``duration`` when given, else
    over its samples), idle share, and its throttle reasons told apart."""
    util = _series(df, g, "util_gpu_pct")["value"]
    mem = _series(df, g, "mem_used_bytes")["value"]
    mem_total = _series(df, g, "mem_total_bytes")["value"]
    temp = _series(df, g, "temp_c")["value"]
    energy, mean_power, energy_source = _energy_j(_series(df, g, "power_w"), _series(df, g, "energy_j"))
    if duration is not None and mean_power is not None:
        energy = mean_power * duration
    thr = _series(df, g, "throttle_reasons")["value"].astype("int64")
    throttle_frac = _share(thr, PERF_THROTTLE_MASK)
    power_cap_frac, slowdown_frac = _share(thr, POWER_CAP_MASK), _share(thr, SLOWDOWN_MASK)
    return {
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
        "idle_frac": idle_frac,
        "idle": bool(idle_frac is not None and idle_frac > IDLE_TIME_FRAC),
        "throttle_frac": throttle_frac,
        "throttle_reasons": _names(thr, PERF_THROTTLE_MASK),
        "throttled": bool(throttle_frac is not None and throttle_frac >= THROTTLE_TIME_FRAC),
        # Told apart: the power cap is how a loaded GPU runs; a thermal or hardware slowdown is a fault.
        "power_cap_frac": power_cap_frac,
        "power_capped": bool(power_cap_frac is not None and power_cap_frac >= THROTTLE_TIME_FRAC),
        "slowdown_frac": slowdown_frac,
        "slowdown_reasons": _names(thr, SLOWDOWN_MASK),
        "slowed_down": bool(slowdown_frac is not None and slowdown_frac >= THROTTLE_TIME_FRAC),
    }


def _gpu_findings(g: str, s: dict) -> tuple[list[str], list[str]]:
    """(flags, notes) for one GPU's figures: idle and slowdown are faults; the power cap is a note."""
    flags, notes = [], []
    if s["idle"]:
        flags.append(f"{g} was under {IDLE_UTIL_PCT:g}% utilisation {s['idle_frac']:.0%} of the time other GPUs "
                     "worked: check input sharding and per-replica batch")
    if s["slowed_down"]:
        flags.append(f"{g} slowed down in {s['slowdown_frac']:.0%} of samples ({', '.join(s['slowdown_reasons'])}): "
                     "a thermal or hardware slowdown, not the power cap: check cooling, airflow and the power "
                     "supply (nvidia-smi -q -d PERFORMANCE says which)")
    if s["power_capped"]:
        notes.append(f"{g} ran at its software power cap in {s['power_cap_frac']:.0%} of samples (sw_power_cap): the "
                     "driver held the clocks to the board's power limit, which is how data-centre GPUs run under "
                     "a full load, not a cooling fault (nvidia-smi -q -d POWER shows the limit)")
    return flags, notes


def _host_figures(df) -> dict:
    """The host's CPU utilisation and peak resident memory over the frame."""
    cpu = _series(df, "host", "cpu_util_pct")["value"]
    rss = _series(df, "host", "rss_bytes")["value"]
    return {
        "cpu_util_mean_pct": float(cpu.mean()) if len(cpu) else None,
        "cpu_util_max_pct": float(cpu.max()) if len(cpu) else None,
        "rss_peak_bytes": int(rss.max()) if len(rss) else None,
    }
