"""The links a forecast moves gradients over: a preset by name or ``NAME=GBps[:latency_us]`` of one's own.

Light on purpose (no NumPy, no pandas): the CLI's --help lists the presets without importing the planner. The sources
the presets cite (HN, ML, GK, I1-I8, NT, SB) are planner/comms.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth_GBps: float  # per direction, as a ring achieves it (bus bandwidth)
    latency_us: float      # per ring step
    source: str = ""

    def __post_init__(self):
        if not (isinstance(self.bandwidth_GBps, (int, float)) and math.isfinite(self.bandwidth_GBps)
                and self.bandwidth_GBps > 0):
            raise ConfigError(f"link {self.name!r}: bandwidth must be a finite number of GB/s > 0, got "
                              f"{self.bandwidth_GBps!r}")
        if not (isinstance(self.latency_us, (int, float)) and math.isfinite(self.latency_us) and self.latency_us >= 0):
            raise ConfigError(f"link {self.name!r}: latency must be a finite number of µs >= 0, got {self.latency_us!r}")

    @property
    def bandwidth_Bps(self) -> float:
        return self.bandwidth_GBps * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


PRESETS: dict[str, Link] = {
    "pcie4": Link("pcie4", 31.5, 3.0, "PCIe 4.0 x16 rated per direction (HN, ML, GK); alpha from I6"),
    "pcie5": Link("pcie5", 63.0, 3.0, "PCIe 5.0 x16 rated per direction (HN, ML, GK); alpha as pcie4"),
    "nvlink3": Link("nvlink3", 235.0, 0.6, "8xA100 measured busbw (ML); alpha from I5 / NCCL LL (NT)"),
    "nvlink4": Link("nvlink4", 370.0, 0.6, "H100/H200 app-level target (I1), 367.6 measured 8xH200 (SB)"),
    "ib100": Link("ib100", 12.0, 9.8, "NCCL NET_BW '100Gbit' (NT); alpha from I8 (HDR)"),
    "ib200": Link("ib200", 22.6, 9.8, "HDR: 85-96 of 100 GB/s over 4 NICs (I2); alpha from I8"),
    "ib400": Link("ib400", 47.0, 9.8, "NDR: 46-48 GB/s busbw per NIC (I3); alpha from I8 (unconfirmed for NDR)"),
}
INTRA_PRESETS = ("pcie4", "pcie5", "nvlink3", "nvlink4")
INTER_PRESETS = ("ib100", "ib200", "ib400")


def parse_link(text: str) -> Link:
    """A preset name, or ``NAME=BANDWIDTH_GBps[:LATENCY_us]`` for a link of your own."""
    text = str(text).strip()
    if "=" in text:
        name, _, spec = text.partition("=")
        bw, _, lat = spec.partition(":")
        try:
            bw_v, lat_v = float(bw), float(lat) if lat else 0.0
        except ValueError:
            raise ConfigError(f"cannot read link {text!r}; write NAME=GBps[:latency_us], e.g. mylink=25:5") from None
        return Link(name.strip() or "custom", bw_v, lat_v, "given on the command line")
    if text not in PRESETS:
        raise ConfigError(f"unknown interconnect {text!r}; use one of {', '.join(PRESETS)} or NAME=GBps[:latency_us]")
    return PRESETS[text]
