"""The achieved fraction of peak a forecast from FLOPs uses, and where it comes from.

A fraction is kept per model family, GPU chip and the unit the precision runs on (validation.fraction_key). Found,
in this order:

1. **fitted**: the median over published.csv's 1-GPU rows of that family, chip and unit (validation.release);
2. **a catalogue rate**: tftoolkit/catalogue/rates.toml's single-GPU rates of that family on that chip in that unit
   (median of rate x 3 x forward FLOPs / peak), each with its source; a rate not run with TensorFlow says so;
3. **borrowed**: the same family and unit from the nearest chip that has one (by compute capability; a tie
   takes the geometric mean of the tied chips). bfloat16 and float16 share a pool: both run on the same tensor
   cores at the same peak. The interval of a borrowed forecast is widened by BORROW's spread and says so.

Otherwise the forecast is refused, naming the family, chip and unit it lacked.

The borrowed spread is measured, not assumed (spread()): every chip's fraction that has one is predicted the way a
borrow would (from the nearest other chip, its own left out) and the largest |ln(actual / borrowed)| widens the
interval both ways.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import catalogue
from . import validation
from .catalogue_links import find_gpu

_SHARED = {"bf16": "16-bit", "fp16": "16-bit"}  # units whose fractions stand in for each other


@dataclass(frozen=True)
class Achieved:
    """A fraction of peak and where it came from: ``how`` is fitted, catalogue rate or borrowed; ``widen`` the
    |ln| factor the forecast's interval is widened by each way (0 unless borrowed)."""
    value: float
    how: str
    words: str
    widen: float = 0.0


def _capability(chip: str) -> float:
    """The compute capability of a chip (the first catalogue GPU with that die)."""
    for g in catalogue.gpus():
        if (g.chip or g.architecture) == chip and g.compute_capability:
            return float(g.compute_capability)
    return math.nan


def reference_fractions() -> dict[tuple[str, str, str], tuple[float, str]]:
    """(family, chip, unit) -> (median fraction of the catalogue's single-GPU rates, the rates' keys and frameworks)."""
    out: dict[tuple[str, str, str], list] = {}
    for r in catalogue.rates():
        gflops = validation.FORWARD_GFLOPS.get(r.model)
        if gflops is None or not r.images_per_sec:
            continue
        peak, _ = catalogue.matmul_tflops(find_gpu(r.gpu), r.precision)
        if not peak:
            continue
        out.setdefault(validation.fraction_key(r.model, r.gpu, r.precision), []).append(
            (r.images_per_sec * 3 * gflops * 1e9 / (peak * 1e12), f"{r.key} ({r.framework}, {r.date})"))
    return {k: (float(np.median([f for f, _ in v])), "; ".join(w for _, w in v)) for k, v in out.items()}


def _pool(v: dict) -> dict[tuple[str, str, str], tuple[float, str]]:
    """Every fraction there is: the catalogue's rates, and the fitted ones over them."""
    pool = dict(reference_fractions())
    pool.update({k: (f, "fitted to the published validation rows") for k, f in (v.get("fractions") or {}).items()})
    return pool


def _borrow(pool: dict, family: str, chip: str, unit: str) -> tuple[float, list] | None:
    """(fraction, the keys it came from) from the nearest other chip with the family and the unit (or its pool)."""
    target = _capability(chip)
    same = [(k, f) for k, (f, _) in pool.items()
            if k[0] == family and _SHARED.get(k[2], k[2]) == _SHARED.get(unit, unit) and k[1] != chip]
    if not same or math.isnan(target):
        return None
    dist = {k: abs(_capability(k[1]) - target) for k, _ in same}
    best = min(dist.values())
    tied = [(k, f) for k, f in same if dist[k] == best]
    return float(np.exp(np.mean([np.log(f) for _, f in tied]))), [k for k, _ in tied]


def spread(v: dict) -> float:
    """The largest |ln(fraction / borrowed)| over the chips that have a fraction, each borrowed without its own."""
    pool = _pool(v)
    errors = []
    for (family, chip, unit), (f, _) in pool.items():
        b = _borrow(pool, family, chip, unit)
        if b is not None:
            errors.append(abs(math.log(f / b[0])))
    return max(errors) if errors else math.nan


def resolve(v: dict, model: str | None, gpu: str, precision: str) -> Achieved | None:
    """The fraction of peak for ``model``'s family on ``gpu``'s chip in ``precision``'s unit, or None."""
    family, chip, unit = key = validation.fraction_key(model or "", gpu, precision)
    fitted = (v.get("fractions") or {}).get(key)
    if fitted is not None:
        return Achieved(fitted, "fitted", f"{fitted:.3f} for {family} on {chip} in {unit}, fitted to the published "
                                          "validation rows (validation/published.csv)")
    refs = reference_fractions()
    if key in refs:
        f, where = refs[key]
        return Achieved(f, "catalogue rate", f"{f:.3f} for {family} on {chip} in {unit}, from single-GPU rates in "
                                             f"tftoolkit/catalogue/rates.toml: {where}")
    pool = _pool(v)
    b = _borrow(pool, family, chip, unit)
    if b is None:
        return None
    f, keys = b
    w = spread(v)
    w = 0.0 if math.isnan(w) else w
    came = " and ".join(f"{k[1]}'s {k[2]}" for k in keys)
    return Achieved(f, "borrowed", f"{f:.3f} for {family} BORROWED from {came} ({pool[keys[0]][1]}): {chip} has no "
                                   f"{unit} fraction of its own; the interval is widened x{math.exp(w):.2f} each way, "
                                   "the largest error of such a borrow among the chips that have one (planner/"
                                   "achieved.py)", w)


def refusal(model: str | None, gpu: str, precision: str) -> str:
    """The one line a forecast from FLOPs is refused with: the family, chip and unit it lacked."""
    family, chip, unit = validation.fraction_key(model or "", gpu, precision)
    return (f"no achieved fraction of peak for the {family!r} model family on {chip} ({find_gpu(gpu).key}) in "
            f"{unit} ({precision}): neither the published validation rows nor tftoolkit/catalogue/rates.toml have "
            f"one for {family} in {unit} on any chip; give --images-per-sec (a measured 1-GPU rate) or --compute-ms")
