"""The planner checked against published rows, and the interval every forecast carries.

validation/published.csv (fitted to) and validation/heldout.csv (only checked) hold one row per published point:
``baseline`` (the rows of one configuration at several GPU counts), ``gpus``, ``images_per_sec`` (published), and
the planner's inputs (``system`` or ``interconnect``, ``gpu``, ``inter_host``, ``gpus_per_host``, ``model``,
``per_gpu_batch``, ``precision``, ``allreduce``); validation/README.md describes every column.

Each row is forecast the way the CLI does (plan.Plan, plan.forecast: what ``tftoolkit predict --gpu ...
--json`` prints; tests/planner/test_planner.py checks the two agree), with its own hardware, host layout and
all-reduce, in two cases:

- **rate**: the series' 1-GPU published rate given (``--images-per-sec``), forecast at the row's GPU count (rows of
  one ``baseline`` may differ in their link: Lambda's 2-GPU rows with and without an NVLink bridge share the 1-GPU
  row);
- **flops**: no rate, the 1-GPU rate from FLOPs over the peak (the achieved fraction fitted per model family, GPU
  chip and the unit the precision runs on, on published.csv's 1-GPU rows: the median of published /
  peak-implied rate).

The exchange's dtype: float16 for tf_cnn_benchmarks' fp16 rows (exchange_dtype), else float32.

The all-reduce a row's ``allreduce`` column names, as planner.ALGORITHMS models it (ALGORITHM_OF):
``parameter_server (local_parameter_device cpu)``: host (the variables in host memory);
``replicated (with NCCL)`` (TensorFlow's 2017 page: TensorFlow 1.x's contrib NCCL, NCCL 1.x): ring-in-order;
``reduce_to_one``: star; everything else (Horovod and NCCL 2, the parameter server sharded over the GPUs,
``replicated`` without NCCL, which sums each variable on one GPU in turn, ``distributed_replicated``): ring.

Overlap: none is modelled for the rows. Horovod (NVIDIA's rows) overlaps its all-reduce with the backward pass, but
there its all-reduce is 1-3% of the step over NVLink / NVSwitch, so the rows cannot tell any overlap fraction from
none. For tf_cnn_benchmarks' graph-mode rows, a hidden fraction of their all-reduce given to every such row at once
(σ refitted each time; measured 2026-12-04): 0 / 0.25 / 0.5 / 0.75 give the fitted rows' efficiency error p90
8.5 / 7.6 / 7.0 / 7.5% and the held-back rows' 10.2 / 9.2 / 11.3 / 14.3%, their coverage 82 / 79 / 80 / 82%. What
the fitted rows gain does not carry to the held-back ones, and the rows do not say what their framework hid: none
is kept.

Step costs: one σ (planner's ``straggler``) and one fixed cost per multi-GPU step (``overhead_ms``) fitted to all of
published.csv's rate-case rows at once (fit_step_costs: the pair on a grid, σ from 0 to 0.1 by 0.0025 and the cost
0, 0.5, 1, 2, 5, 10, 20 ms, with the least mean |ln(published / forecast)|), then every row forecast with them. The
fixed cost comes out 0 ms: what the rows add per step grows with the compute and with N.

The interval of a forecast without a run directory comes from out-of-sample residuals (intervals.py: each source
left out in turn, heldout.csv never fitted to). with_interval here keeps the in-sample band for the run-directory
forecast: the log-ratio residuals r = ln(published / forecast) of published.csv's rows, per case, [forecast · e^q5,
forecast · e^q95], the 5th and 95th percentiles of r (a 90% interval by construction on the rows it was made from;
its "checked" line says in-sample).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .. import catalogue
from ..errors import ConfigError, DataError
from .forecast import expected_max
from .plan import Plan, forecast
from .catalogue_links import find_gpu
from .kept import kept

ROOT = Path(__file__).resolve().parents[2] / "validation"
PUBLISHED = ROOT / "published.csv"
HELDOUT = ROOT / "heldout.csv"
QUANTILES = (0.05, 0.95)
NEEDS = ("baseline", "gpus", "images_per_sec", "gpu", "per_gpu_batch")
PARAMS = {"resnet50": 25_636_712, "resnet50v1.5": 25_636_712, "resnet152": 60_419_944, "inceptionv3": 23_851_784,
          "inceptionv4": 42_679_816, "vgg16": 138_357_544, "alexnet": 61_100_840}
# Forward FLOPs per example counted by the toolkit's own counter on the keras.applications models (measure.flops:
# TensorFlow's profiler; 224 px, InceptionV3 at 299; tests/planner/test_modelsize.py recounts ResNet-50). Only
# the models it counted: AlexNet and InceptionV4 are not in keras.applications, and ResNet-50 v1.5 (a stride
# moved) is not its v1. Parameters above: counted the same way where keras.applications has the model, else the
# tf_cnn_benchmarks definitions' published counts (alexnet, inceptionv4: unconfirmed here).
FORWARD_GFLOPS = {"resnet50": 7.755, "resnet152": 22.646, "inceptionv3": 11.469, "vgg16": 30.960,
                  "resnet50v1.5": 8.217}
# ResNet-50 v1.5 (NVIDIA DeepLearningExamples' model: the stride of each downsampling block moved from its first 1x1
# convolution to its 3x3) is v1's count plus what that move adds: the three blocks' first 1x1 convolutions run at
# their input's resolution instead of a quarter of it, (56²−28²)·256·128 = (28²−14²)·512·256 = (14²−7²)·1024·512
# = 77.07 M multiply-adds each, 3 x 2 x 77.07 M = 0.462 GFLOPs (torchvision's ResNet-50, which is v1.5, lists
# 4.09 G multiply-adds = 8.18 GFLOPs).
PRECISION = {"fp32": "float32", "tf32": "float32", "amp": "mixed_float16"}


def family(model: str) -> str:
    """The model family an achieved fraction is fitted for: the name's leading letters, a version's "v" dropped
    (resnet50v1.5 and resnet152 -> resnet, inceptionv3 -> inception, vgg16 -> vgg)."""
    m = re.match(r"[a-z]+", str(model).lower().replace("-", "").replace("_", ""))
    name = m.group(0) if m else ""
    if name.endswith("v") and len(name) > 1 and str(model).lower()[len(name):len(name) + 1].isdigit():
        name = name[:-1]
    return name or "unknown"


def chip(gpu: str) -> str:
    """The GPU's die (gpus.toml ``chip``: GA100 for an A100, GA102 for an RTX 3090 or A6000): a fraction of peak
    fitted on one die does not transfer to another of the same generation (GA102's TF32 tensor peak is its FP32
    peak, GA100's is 8x it)."""
    g = find_gpu(gpu)
    return g.chip or g.architecture or "unknown"


def unit(gpu: str, precision: str) -> str:
    """The unit a Keras policy's matmuls run on for ``gpu`` (fp32, tf32, fp16 tensor cores, ...)."""
    return catalogue.matmul_tflops(find_gpu(gpu), precision)[1]


def fraction_key(model: str, gpu: str, precision: str) -> tuple[str, str, str]:
    """(family, GPU chip, unit): what one achieved fraction of peak is fitted for."""
    return family(model), chip(gpu), unit(gpu, precision)


def fraction_for(v: dict, model: str | None, gpu: str, precision: str) -> float | None:
    """The release's achieved fraction for this model family, GPU chip and unit, or None."""
    return (v.get("fractions") or {}).get(fraction_key(model or "", gpu, precision))


def read(path) -> pd.DataFrame:
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p} does not exist")
    df = pd.read_csv(p)
    missing = [c for c in NEEDS if c not in df.columns]
    if missing:
        raise DataError(f"{p} lacks column(s) {', '.join(missing)}")
    return df


def _get(r, key, default=None):
    v = r.get(key, default)
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


ALGORITHM_OF = (("local_parameter_device cpu", "host"), ("replicated (with nccl)", "ring-in-order"),
                ("reduce_to_one", "star"))


def algorithm_of(text) -> str:
    """The planner's algorithm for a row's ``allreduce`` text (the module's docstring says why each)."""
    low = str(text or "").lower()
    return next((alg for key, alg in ALGORITHM_OF if key in low), "ring")


def exchange_known(text) -> bool:
    """Whether a row's source says how it combined gradients (Lambda's tables do not: "unconfirmed")."""
    low = str(text or "").lower()
    return bool(low) and "unconfirmed" not in low and "unknown" not in low


def plan_of(r, rate: float | None, counts, gpus_per_host: int) -> Plan:
    """The Plan a published row is forecast with: its system (else its link), GPU, batch, precision, and the
    all-reduce its source names (algorithm_of)."""
    gflops = _get(r, "forward_gflops") or FORWARD_GFLOPS.get(str(r["model"]))
    algorithm = algorithm_of(_get(r, "allreduce", ""))
    precision = PRECISION.get(str(_get(r, "precision", "fp32")), "float32")
    return Plan(gpu=r["gpu"], per_replica_batch=int(r["per_gpu_batch"]), params=PARAMS.get(str(r["model"])),
                model=_get(r, "model"), gpus_per_host=gpus_per_host,
                interconnect=_get(r, "system") or _get(r, "interconnect"), inter_host=_get(r, "inter_host"),
                images_per_sec=rate, forward_flops=gflops * 1e9 if gflops else None,
                precision=precision, replica_counts=counts, algorithm=algorithm,
                allreduce_dtype=exchange_dtype(_get(r, "framework", ""), precision))


def exchange_dtype(framework, precision: str) -> str:
    """The dtype a row's gradients were exchanged in: tf_cnn_benchmarks in fp16 casts them to float16 first
    (``--compact_gradient_transfer``, default True, applied when ``--use_fp16``: tensorflow/benchmarks,
    scripts/tf_cnn_benchmarks/variable_mgr.py, preprocess_device_grads); everything else float32 (Keras and Horovod
    without compression keep float32 gradients under mixed precision)."""
    return "float16" if precision == "mixed_float16" and "tf_cnn_benchmarks" in str(framework) else "float32"


def achieved_fractions(published: pd.DataFrame) -> dict[tuple[str, str, str], float]:
    """(model family, GPU chip, unit) -> median fraction of peak the published 1-GPU rows reach."""
    gflops = published["model"].map(FORWARD_GFLOPS)
    if "forward_gflops" in published.columns:
        gflops = published["forward_gflops"].fillna(gflops)
    ones = published[(published["gpus"] == 1) & gflops.notna()]
    out: dict[tuple[str, str], list[float]] = {}
    for _, r in ones.iterrows():
        implied = forecast(plan_of(r, None, (1,), 1), achieved=1.0)[0]["images_per_sec"].iloc[0]
        plan = plan_of(r, None, (1,), 1)
        out.setdefault(fraction_key(_get(r, "model", ""), r["gpu"], plan.precision), []).append(
            r["images_per_sec"] / implied)
    return {k: float(np.median(v)) for k, v in out.items()}


def residuals(rows: pd.DataFrame, fractions: dict, straggler: float = 0.0, overhead_ms: float = 0.0,
              cases: tuple[str, ...] = ("rate", "flops")) -> pd.DataFrame:
    """One row per published point and case (of ``cases``): forecast, ln(published / forecast), efficiency error.
    Each row is forecast on its own (its link, hosts and all-reduce), the rate case from its series' 1-GPU rate."""
    out = []
    for case_id, g in rows.groupby("baseline", sort=False):
        g = g.sort_values("gpus", kind="stable")
        one = g[g["gpus"] == 1]
        base = float(one["images_per_sec"].iloc[0]) if len(one) else None
        for _, pub in g.iterrows():
            n = int(pub["gpus"])
            frac = fractions.get(fraction_key(_get(pub, "model", ""), pub["gpu"],
                                              PRECISION.get(str(_get(pub, "precision", "fp32")), "float32")))
            flops_ok = frac is not None and bool(_get(pub, "forward_gflops") or str(pub["model"]) in FORWARD_GFLOPS)
            for case, rate in (("rate", base), ("flops", None)):
                if case not in cases or (case == "rate" and (base is None or n == 1)) or (case == "flops"
                                                                                       and not flops_ok):
                    continue  # a 1-GPU row is the given rate itself
                try:
                    df, _ = forecast(plan_of(pub, rate, (n,), int(pub["gpus_per_host"])), achieved=frac,
                                     straggler=straggler, overhead_ms=overhead_ms)
                except ConfigError:
                    continue
                fc = df.iloc[0]
                eff_pub = pub["images_per_sec"] / (n * base) if base else math.nan
                out.append({"case_id": case_id, "case": case, "gpus": n, "published": float(pub["images_per_sec"]),
                            "forecast": float(fc["images_per_sec"]),
                            "log_ratio": math.log(pub["images_per_sec"] / fc["images_per_sec"]),
                            "efficiency_published": eff_pub,
                            "efficiency_forecast": float(fc["images_per_sec"]) / (n * base) if base else math.nan,
                            "compute_s": float(fc["compute_s"]), "step_time_s": float(fc["step_time_s"]),
                            "straggler_s": float(fc["straggler_s"]), "overhead_s": float(fc["overhead_s"]),
                            "global_batch": float(fc["global_batch"]),
                            "allreduce_s": float(fc["allreduce_s"]) - float(fc["hidden_s"]),
                            "hardware_class": fc["hardware_class"],
                            "exchange_known": exchange_known(_get(pub, "allreduce", "")),
                            "algorithm": algorithm_of(_get(pub, "allreduce", "")),
                            "source": _get(pub, "source", "")})
    res = pd.DataFrame(out)
    if len(res):
        res["efficiency_error"] = (res["efficiency_forecast"] - res["efficiency_published"]).abs()
    return res


STRAGGLER_GRID = np.round(np.arange(0.0, 0.1001, 0.0025), 4)
OVERHEAD_GRID_MS = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)


def fit_step_costs(res: pd.DataFrame) -> tuple[float, float]:
    """(σ, fixed ms per multi-GPU step) with the least mean |ln(published / forecast)| over the rate case's rows of
    ``res``, made at σ = 0 and no fixed cost (the step at σ, c is the step at 0 plus σ · E[max of N] · compute + c,
    plan.forecast)."""
    g = res[res["case"] == "rate"]
    if g.empty:
        return 0.0, 0.0
    best = (math.inf, 0.0, 0.0)
    for s in STRAGGLER_GRID:
        for c in OVERHEAD_GRID_MS:
            step, _, _ = _step_at(g, s, c)
            cost = float(np.mean(np.abs(np.log(g["published"] * step / g["global_batch"]))))
            if cost < best[0] - 1e-12:
                best = (cost, float(s), float(c))
    return best[1], best[2]


def _step_at(res: pd.DataFrame, straggler: float, overhead_ms: float):
    """(step time, straggler wait, fixed cost) of each row of ``res`` at σ and the fixed cost, from its step without
    them: plan.forecast's arithmetic (the fixed cost on multi-GPU steps only)."""
    wait = res["compute_s"] * straggler * res["gpus"].map(expected_max)
    fixed = np.where(res["gpus"] > 1, overhead_ms / 1e3, 0.0)
    return res["step_time_s"] - res["straggler_s"] - res["overhead_s"] + wait + fixed, wait, fixed


def at_step_costs(res: pd.DataFrame, straggler: float, overhead_ms: float) -> pd.DataFrame:
    """``res`` (made at σ = 0 and no fixed cost) as residuals(rows, fractions, straggler, overhead_ms) would make it,
    by the same arithmetic as plan.forecast's step, without forecasting every row again (the CLI computes the
    release's validation on every forecast; tests/planner/test_planner.py checks the two agree)."""
    out = res.copy()
    out["step_time_s"], out["straggler_s"], out["overhead_s"] = _step_at(res, straggler, overhead_ms)
    out["forecast"] = out["global_batch"] / out["step_time_s"]
    out["log_ratio"] = np.log(out["published"] / out["forecast"])
    base = res["forecast"] / res["efficiency_forecast"] / res["gpus"]  # each row's 1-GPU rate (NaN without one)
    out["efficiency_forecast"] = out["forecast"] / (out["gpus"] * base)
    out["efficiency_error"] = (out["efficiency_forecast"] - out["efficiency_published"]).abs()
    return out


def bands(res: pd.DataFrame) -> dict[str, tuple[float, float, int]]:
    """case -> (q10, q90, rows) of the log-ratio residuals."""
    return {case: (float(np.quantile(g["log_ratio"], QUANTILES[0])), float(np.quantile(g["log_ratio"], QUANTILES[1])),
                   int(len(g)))
            for case, g in res.groupby("case")}


@kept  # about 1 s of fitting, the same until the tables, the catalogue or the planner change (planner.kept)
def release() -> dict:
    """The release's validation: fractions and bands from published.csv, or an empty dict without it."""
    if not PUBLISHED.exists():
        return {}
    pub = read(PUBLISHED)
    fractions = achieved_fractions(pub)
    res0 = residuals(pub, fractions)
    straggler, overhead_ms = fit_step_costs(res0)
    res = at_step_costs(res0, straggler, overhead_ms)
    return {"fractions": fractions, "straggler": straggler, "overhead_ms": overhead_ms, "bands": bands(res),
            "residuals": res, "residuals_unfitted": res0}


def summary_line(res: pd.DataFrame, case: str) -> str:
    g = res[res["case"] == case]
    err = (g["forecast"] / g["published"] - 1).abs()
    return (f"checked against {len(g)} published rows, in-sample (the rows it was fitted to): relative error median "
            f"{err.median():.1%}, 90th percentile {err.quantile(0.9):.1%}")


EFFICIENCY_CAP_NOTE = "efficiency capped at 100% (weak scaling: N GPUs do at most N times one GPU's work)"


def efficiency_cap(high):
    """An efficiency interval's upper end within what is possible: at most 100% (EFFICIENCY_CAP_NOTE)."""
    return np.minimum(1.0, high)


def with_interval(frame: pd.DataFrame, case: str, v: dict) -> tuple[pd.DataFrame, dict]:
    """The frame with images_per_sec_low/high (and efficiency_low/high), and how the interval was made."""
    out = frame.copy()
    if not v or case not in v["bands"]:
        out["images_per_sec_low"] = out["images_per_sec_high"] = math.nan
        return out, {"method": "none: no published validation rows for this case", "checked": "not checked"}
    lo, hi, n = v["bands"][case]
    out["images_per_sec_low"] = out["images_per_sec"] * math.exp(lo)
    out["images_per_sec_high"] = out["images_per_sec"] * math.exp(hi)
    if case == "rate":  # the given rate at one GPU is not a forecast
        one = out["replicas"] == 1
        out.loc[one, "images_per_sec_low"] = out.loc[one, "images_per_sec_high"] = out.loc[one, "images_per_sec"]
    # Efficiency is against the same forecast's 1-GPU rate, so the compute's own error cancels: its band is the
    # scaling error alone (the rate case's residuals), and at one GPU it is 100% exactly.
    e_lo, e_hi, _ = v["bands"].get("rate", (lo, hi, n))
    several = out["replicas"] > 1
    out["efficiency_low"] = out["efficiency"].where(~several, out["efficiency"] * math.exp(e_lo))
    out["efficiency_high"] = out["efficiency"].where(~several, efficiency_cap(out["efficiency"] * math.exp(e_hi)))
    return out, {"method": f"{int(QUANTILES[0] * 100)}th-{int(QUANTILES[1] * 100)}th percentiles of ln(published / "
                           f"forecast) over {n} published rows ({case} case): x{math.exp(lo):.3f} .. "
                           f"x{math.exp(hi):.3f}; {EFFICIENCY_CAP_NOTE}" + (" (wider than with a rate: the compute is FLOPs over the peak x a "
                                                    "fitted fraction, not measured)" if case == "flops" else ""),
                 "checked": summary_line(v["residuals"], case)}


def table(res: pd.DataFrame, case: str = "rate") -> str:
    """The validation table as Markdown: published vs forecast vs interval, per row of ``case``."""
    v = release()
    lo, hi, _ = v["bands"][case]
    lines = ["| series | GPUs | published img/s | forecast img/s | interval | error | efficiency published / forecast |",
             "|---|---|---|---|---|---|---|"]
    for _, r in res[res["case"] == case].iterrows():
        lines.append(f"| {r['case_id']} | {r['gpus']} | {r['published']:,.0f} | {r['forecast']:,.0f} | "
                     f"{r['forecast'] * math.exp(lo):,.0f} .. {r['forecast'] * math.exp(hi):,.0f} | "
                     f"{r['forecast'] / r['published'] - 1:+.1%} | {r['efficiency_published']:.0%} / "
                     f"{r['efficiency_forecast']:.0%} |")
    return "\n".join(lines)

