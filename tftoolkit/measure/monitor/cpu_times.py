"""CPU utilisation from psutil's cumulative CPU times: the share of ticks between two readings that were busy."""

from __future__ import annotations


def total(ct) -> float:
    # Guest time is already counted inside user time on Linux.
    return sum(ct) - getattr(ct, "guest", 0.0) - getattr(ct, "guest_nice", 0.0)


def busy(ct) -> float:
    return total(ct) - ct.idle - getattr(ct, "iowait", 0.0)


def pct(busy_ticks: float, total_ticks: float) -> float:
    # Rounded: tick counters are integers in disguise, and 6e-11 % reads like a bug.
    return round(max(0.0, min(100.0, 100.0 * busy_ticks / total_ticks)), 2)
