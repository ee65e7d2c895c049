"""Does a configuration fit? One GPU's training memory at a per-GPU batch against the GPU's memory.

    need = fixed + ACTIVATION_SCALE x per_example x per-GPU batch
    fixed       = weights + gradients + optimizer slots (+ frozen weights): estimate_memory's ``fixed``,
                  or, from a parameter count alone, params x 4 bytes x (2 + the optimizer's slots)
    per_example = estimate_memory's ``per_example`` (2 x every layer's output, in the precision's bytes):
                  the batch finder's own estimate, counted on the model (science.modelsize.memory)
    largest batch that fits = floor((GPU memory - fixed) / (ACTIVATION_SCALE x per_example))

ACTIVATION_SCALE: the batch finder's estimate keeps every layer's output twice, an upper bound (frameworks free,
fuse and run in place much of it). Against published.csv's rows, which ran where they ran, the estimate asked for
up to 2.65x the memory the GPU has: P100 16 GB with ResNet-152 at per-GPU batch 64 in fp32 needs 0.377 x the
estimate's activations to fit, V100 16 GB with ResNet-50 at 128 (fp32) or 256 (mixed float16) 0.413, A100 40 GB
at 256 in TF32 0.522, K80 12 GB with ResNet-50 at 64 0.615 (counted 2026-12-04 with science.modelsize.memory at
224 px, 299 for InceptionV3; ResNet-50 fp32: fixed 0.307 GB, 297 MB per example). 0.37 is the largest scale at
which every one of those rows fits: "does not fit" means needing more than any published row showed a GPU holding.
Framework workspace, the CUDA context and fragmentation are not counted; GPU memory is the catalogue's GB (10^9 B).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from .topology import find_gpu

log = logging.getLogger("tftoolkit")

# Optimizer state per trainable weight, in copies of it (SGD none, momentum one, Adam's two moments): the batch
# finder's estimate (estimate_memory) and this check count it alike.
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "lamb": 2}
ACTIVATION_SCALE = 0.37
OPTIMIZER = "momentum"  # the planner's optimizer: SGD with momentum (one slot per weight), as the published rows


def usage(gpu: str, per_replica_batch: int, *, fixed: float | None = None, per_example: float | None = None,
          params: int | None = None, optimizer: str = OPTIMIZER) -> dict:
    """One GPU's memory need at ``per_replica_batch`` against ``gpu``'s memory: ``fits`` (True, False, or None when
    the GPU's memory is not in the catalogue), ``largest_batch`` (None without activations), and how."""
    g = find_gpu(gpu)
    if fixed is None:
        fixed = (params or 0) * 4.0 * (2 + OPTIMIZER_SLOTS.get(optimizer, 2))
    activations = ACTIVATION_SCALE * per_example * per_replica_batch if per_example is not None else None
    need = fixed + (activations or 0.0)
    capacity = g.memory_gb * 1e9 if g.memory_gb else None
    largest = None
    if capacity is not None and per_example:
        largest = max(0, math.floor((capacity - fixed) / (ACTIVATION_SCALE * per_example)))
    return {"gpu": g.key, "gpu_memory_gb": g.memory_gb, "per_replica_batch": per_replica_batch,
            "fixed_gb": fixed / 1e9, "activations_gb": activations / 1e9 if activations is not None else None,
            "need_gb": need / 1e9, "fits": (need <= capacity) if capacity is not None else None,
            "largest_batch": largest, "optimizer": optimizer, "activation_scale": ACTIVATION_SCALE,
            "activations_counted": per_example is not None}


def text(m: dict) -> str:
    """One line: the need against the GPU's memory, and what to do when it does not fit."""
    parts = f"weights, gradients and {m['optimizer']} slots {m['fixed_gb']:.2f} GB"
    if m["activations_counted"]:
        parts += (f" + activations {m['activations_gb']:.1f} GB at per-GPU batch {m['per_replica_batch']}, the batch "
                  f"finder's estimate x {m['activation_scale']:g} (science/memory.py)")
    else:
        parts += "; activations not counted: give --model to count them"
    head = f"memory per GPU: {m['need_gb']:.1f} GB needed ({parts})"
    if m["fits"] is None:
        return f"{head}; {m['gpu']}'s memory is not in the catalogue"
    if m["fits"]:
        more = (f"; up to per-GPU batch {m['largest_batch']} fits" if m["largest_batch"] is not None else "")
        return f"{head} of {m['gpu']}'s {m['gpu_memory_gb']:g} GB: fits{more}"
    if m["largest_batch"]:
        what = f"the largest per-GPU batch that fits is {m['largest_batch']}"
    elif m["largest_batch"] == 0:
        what = "not even one example fits beside the weights: use a GPU with more memory or mixed precision"
    else:
        what = "the weights alone do not fit: use a GPU with more memory"
    return f"{head} of {m['gpu']}'s {m['gpu_memory_gb']:g} GB: DOES NOT FIT; {what}"


def estimate_memory(model, per_replica_batch: int, optimizer: str, precision: str = "float32",
                    accumulate: int = 1) -> dict:
    """Rough training memory of one replica in bytes: {"fixed", "per_example", "total", "accumulator"}.

    fixed = trainable bytes x (weights + gradients + optimizer slots) + non-trainable bytes, + the accumulator
    when ``accumulate`` > 1 (the float32 sum of the micro-batches' gradients the step carries: 4 bytes per
    trainable element); per_example = 2 x Σ layer output elements x activation bytes (kept for the backward
    pass, plus the gradient flowing back through it). Framework workspace and allocator fragmentation are not
    counted.
    """
    trainable = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.trainable_variables)
    accumulator = 4 * sum(int(np.prod(v.shape)) for v in model.trainable_variables) if accumulate > 1 else 0
    frozen = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.non_trainable_variables)
    act_bytes = 2 if precision.startswith("mixed") else 4
    elements = 0
    try:
        shapes = [model.input_shape] + [_shape(layer.output) for layer in model.layers
                                        if type(layer).__name__ != "InputLayer"]
    except (AttributeError, ValueError):  # a subclassed model has no symbolic layer outputs
        log.warning("memory estimate counts only inputs and outputs: %s is not a functional model", model.name)
        shapes = [model.input_shape, model.output_shape]
    for shape in shapes:
        for s in (shape if isinstance(shape, list) else [shape]):
            elements += int(np.prod([d for d in s[1:] if d is not None]))
    per_example = 2 * elements * act_bytes
    fixed = trainable * (2 + OPTIMIZER_SLOTS.get(optimizer, 2)) + frozen + accumulator
    return {"fixed": fixed, "per_example": per_example, "total": fixed + per_example * per_replica_batch,
            "accumulator": accumulator}


def _shape(tensor):
    if isinstance(tensor, (list, tuple)):
        return [tuple(t.shape) for t in tensor]
    return tuple(tensor.shape)
