"""What a doctor check returns (``Check``) and what the checks share (``Context``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Check:
    name: str
    status: str                 # pass | fail | skip
    figure: str = ""            # the number measured, with its unit
    detail: str = ""            # what was seen
    fix: str = ""               # what to do when it fails
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    """What the checks share: the replica count, the device set-up and the NVML report."""

    replicas: int
    setup: object = None
    report: dict = field(default_factory=dict)   # measure.hardware.collect()
