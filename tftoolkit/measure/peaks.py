"""Rated peak dense FLOP/s of a GPU, the MFU denominator, by the name NVML and TensorFlow report.

The figures live in the hardware catalogue (``tftoolkit/catalogue/gpus.toml``, each with its source); this module
maps a precision or a Keras policy name onto the catalogue's units and answers None for anything unknown or
unconfirmed rather than a guess, because a wrong denominator makes a wrong MFU look right.

A policy maps onto the unit that does the matmuls: float32 -> the FP32 rate (TF32 only when asked for by name),
mixed_float16 -> the FP16 tensor rate, mixed_bfloat16 -> the BF16 one, all with FP32 accumulation.
"""

from __future__ import annotations

from .. import catalogue
from ..errors import ConfigError

UNITS = ("fp32", "tf32", "fp16", "bf16")

# Keras precision policy names map onto the rate of the unit that does the matmuls.
PRECISIONS = {
    "fp32": "fp32", "float32": "fp32",
    "tf32": "tf32",
    "fp16": "fp16", "float16": "fp16", "mixed_float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "mixed_bfloat16": "bf16",
}

# GPUs the catalogue does not carry yet, with their sources, until tftoolkit/catalogue/gpus.toml takes them (then
# this table goes). Dense = the datasheet's figure without its "* with sparsity" (half the starred one).
#   D1 NVIDIA L40 datasheet, as reproduced by resellers (mullet.se product 355414: "L40 | L40S" table, TF32 90.5|181*,
#      BF16 181.05|362.1*).
#   D2 NVIDIA A40 datasheet (FP32 37.4, TF32 74.8|149.6*, BF16/FP16 149.7|299.4*); hmc-tech.com agrees.
#   D4 NVIDIA HGX B200 per-GPU specification (as tabled by zdszero.github.io from nvidia.com: TF32 2.2 PF*,
#      FP16/BF16 4.5 PF*, FP32 75 TF); glennklockwood.com/garden/processors/B200 gives the same dense 1100 / 2250
#      (and FP32 80 at 1,000 W: the lower, NVIDIA's 75, is taken).
#   D5 GH200's GPU is the H100 SXM part (132 SMs, same clocks): the H100 SXM dense rates (glennklockwood.com
#      garden/processors/h100: 66.9 / 494.7 / 989.4). NVML name "NVIDIA GH200 480GB" (the 96 GB HBM3 module;
#      the 144 GB HBM3e one is "NVIDIA GH200 144G HBM3e"): seen in public nvidia-smi logs, unconfirmed here.
NOT_YET_CATALOGUED: dict[str, dict[str, float]] = {
    "NVIDIA L40":               {"fp32": 90.5, "tf32": 90.5, "fp16": 181.05, "bf16": 181.05},   # D1
    "NVIDIA A40":               {"fp32": 37.4, "tf32": 74.8, "fp16": 149.7, "bf16": 149.7},     # D2
    "NVIDIA B200":              {"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0},  # D4
    "NVIDIA GH200 480GB":       {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},   # D5
    "NVIDIA GH200 144G HBM3e":  {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},   # D5
}


def peak_tflops(name: str) -> dict[str, float | None] | None:
    """{fp32, tf32, fp16, bf16: TFLOP/s or None} of the GPU called ``name``; None when the catalogue has no such GPU.

    ``name`` as NVML prints it ("NVIDIA A100-SXM4-80GB"), case and spacing aside, or a catalogue key or alias.
    A unit the GPU lacks (BF16 on a V100) or whose figure is unconfirmed is None.
    """
    try:
        gpu = catalogue.gpu(name)
    except ConfigError:
        wanted = catalogue.normalise(name)
        return next((dict(row) for n, row in NOT_YET_CATALOGUED.items() if catalogue.normalise(n) == wanted), None)
    return {unit: getattr(gpu, f"{unit}_tflops") for unit in UNITS}


def peak_flops(name: str, precision: str) -> float | None:
    """Peak dense FLOP/s of one GPU named ``name`` at ``precision``, or None if unknown.

    ``precision`` is fp32 | tf32 | fp16 | bf16, or a Keras policy name (float32, mixed_float16, mixed_bfloat16).
    """
    unit = PRECISIONS.get(str(precision).strip().lower())
    if unit is None:
        raise ConfigError(f"unknown precision {precision!r}; use one of {sorted(set(PRECISIONS))}")
    row = peak_tflops(name)
    if row is None or row[unit] is None:
        return None
    return row[unit] * 1e12
