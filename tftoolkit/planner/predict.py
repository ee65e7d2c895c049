"""``tftoolkit predict``: data-parallel step time, speedup and efficiency for N GPUs from one measured run.

The model (one line per term; every figure it uses is in the output so a prediction can be checked):

    t(N)        = K · t_micro(per-replica batch) + t_allreduce(S, N) − hidden
    t_allreduce = P · [2(G−1)/G · S/(P·B_intra) + 2(G−1)·α_intra          inside each host (G GPUs)
                     + 2(H−1)/H · S/(P·nics·B_inter) + 2(H−1)·α_inter]    between H hosts
    hidden      = min(overlap · t_allreduce, ⅔ · t_micro)                  with --overlap
                = (P−1)/P · min(t_allreduce, ⅔ · t_micro)                  otherwise (modelled, not measured)

K micro-batches per optimizer step (``accumulate``), P packs (``allreduce_packs``), S the bytes one all-reduce
moves in its dtype (``allreduce_dtype``); each defaults to the calibration run's.

The parts live in their own modules: the links and all-reduce times in ``comms``, the compute figure from the run
directory in ``calibration``, the tables in ``forecast``, the input limit in ``inputlimit``. This module holds the
scenario a forecast is asked for (Scenario), the command (run) and what it prints (forecast_text, plan_text).

S = gradient bytes as the all-reduce moves them: the run's ``gradient_bytes`` (or ``params`` × the bytes of its
``allreduce_dtype``), converted to the asked dtype by the bytes per element (DTYPE_BYTES: bfloat16 and float16
move half of float32's). Runs written before these fields moved float32 in one pack without accumulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import fileio, summary
from ..config import DEFAULT_MAX_REPLICAS, DTYPE_BYTES, SCALING_MODES, whole_number
from ..errors import ConfigError
from .calibration import calibrate, finite, gpu_forecast_refusal, measured_frame
from .comms import ALGORITHMS, INTRA_PRESETS, Link, fit_link, parse_link, read_allreduce_csvs
from .forecast import DEFAULT_GPUS_PER_HOST, DEVICES, compare, crossover, exchange, predict, run_point
from . import achieved, memory, validation
from .inputlimit import input_host, input_lines, with_input_limit
from . import intervals
from .plan import Plan, crossover_text
from .plan import forecast as plan_forecast


def _names(v) -> tuple[str, ...] | None:
    if v is None:
        return None
    if isinstance(v, str):
        return tuple(x.strip() for x in v.split(",") if x.strip())
    return tuple(str(x) for x in v)


@dataclass(frozen=True)
class Scenario:
    """What a forecast is asked for: the links, layout and exchange of the GPUs it models, and how its compute is
    found. Validated at construction; ``None`` means "the run's own" (dtype, packs, accumulate) or "not given".

    ``interconnects``: links inside a host (preset names or NAME=GBps[:latency_us]; default: every intra-host
    preset, or none when ``allreduce_csv`` gives a fitted link); ``inter_host``: the link between hosts (None: one
    host only); ``measured``: run directories or CSV tables to compare the model with."""
    interconnects: tuple[str, ...] | None = None
    inter_host: str | None = "ib200"
    allreduce_csv: tuple[str, ...] | None = None
    impl: str | None = None
    mode: str = "weak"
    devices: str = "dedicated"
    overlap: float | None = None
    max_replicas: int = DEFAULT_MAX_REPLICAS
    gpus_per_host: int = DEFAULT_GPUS_PER_HOST
    nics_per_host: int = 1
    measured: tuple[str, ...] | None = None
    algorithm: str = "ring"
    compute_ms: float | None = None
    host_cores: int | None = None
    allreduce_dtype: str | None = None
    allreduce_packs: int | None = None
    accumulate: int | None = None
    straggler: float | None = None  # σ of a replica's compute; default: fitted to the published rows (GPUs only)

    def __post_init__(self):
        # Lists and comma-separated strings become tuples, so a scenario is hashable and compares by value.
        for name in ("interconnects", "allreduce_csv", "measured"):
            object.__setattr__(self, name, _names(getattr(self, name)))
        if self.mode not in SCALING_MODES:
            raise ConfigError(f"mode must be one of {', '.join(SCALING_MODES)}, got {self.mode!r}")
        if self.devices not in DEVICES:
            raise ConfigError(f"devices must be one of {', '.join(DEVICES)}, got {self.devices!r}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"all-reduce algorithm must be one of {', '.join(ALGORITHMS)} with a run directory, got "
                              f"{self.algorithm!r}" + (" (it needs the catalogue's hardware: forecast without a run "
                                                        "directory, with --gpu)" if self.algorithm in
                                                       ("host", "ring-in-order") else ""))
        for flag, v in (("--max-replicas", self.max_replicas), ("--gpus-per-host", self.gpus_per_host),
                        ("--nics-per-host", self.nics_per_host)):
            if not (whole_number(v) and v >= 1):
                raise ConfigError(f"{flag} must be a whole number >= 1, got {v!r}")
        for flag, v in (("--allreduce-packs", self.allreduce_packs), ("--accumulate", self.accumulate)):
            if v is not None and not (whole_number(v) and v >= 1):
                raise ConfigError(f"{flag} must be a whole number >= 1, got {v!r}")
        if self.straggler is not None and not (finite(self.straggler) and 0 <= self.straggler < 1):
            raise ConfigError(f"--straggler is a coefficient of variation in [0, 1), got {self.straggler!r}")
        if self.allreduce_dtype is not None and self.allreduce_dtype not in DTYPE_BYTES:
            raise ConfigError(f"--allreduce-dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.allreduce_dtype!r}")
        if self.overlap is not None and not (finite(self.overlap) and 0.0 <= self.overlap <= 1.0):
            raise ConfigError(f"--overlap is a fraction of the all-reduce in [0, 1], got {self.overlap}")
        if self.compute_ms is not None and not (finite(self.compute_ms) and self.compute_ms > 0):
            raise ConfigError(f"--compute-ms must be a number of milliseconds > 0, got {self.compute_ms!r}")
        if self.max_replicas > self.gpus_per_host and not self.inter_host:
            raise ConfigError(f"--max-replicas {self.max_replicas} spans several hosts of {self.gpus_per_host} GPUs; "
                              "give --inter-host")

    def links(self) -> list[Link]:
        """The intra-host links named (not the fitted one): the presets by default, none beside an allreduce.csv."""
        names = self.interconnects if self.interconnects is not None else (
            () if self.allreduce_csv else INTRA_PRESETS)
        return [parse_link(x) for x in names]


def run(run_dir, out=None, scenario: Scenario = Scenario(), *, figures: bool = True,
        on_refusal: str = "raise") -> dict:
    """``tftoolkit predict``: prediction.csv, prediction.json and figures in ``out`` (default: RUN_DIR), for the
    ``scenario`` asked.

    A GPU forecast from compute measured on CPU-simulated replicas is refused (gpu_forecast_refusal) unless
    ``scenario.compute_ms`` gives the compute: a ConfigError, or with ``on_refusal="report"`` (a notebook) a result
    that says why and holds no forecast. Every forecast carries where its compute figure came from, and when it
    covers the run's own replica count, the run's measured point beside it. It also says at which GPU count the
    input of hosts like the run's (or of ``host_cores`` cores) becomes the limit: ``input_limit``, and the frame's
    input columns (add_input_limit). ``allreduce_dtype``, ``allreduce_packs`` and ``accumulate`` (default: the
    run's) set how each forecast step exchanges its gradients (ExchangeModel); without ``overlap`` the packs'
    overlap is modelled, and prediction.json says so (``overlap_model``)."""
    sc = scenario
    cal = calibrate(run_dir, sc.compute_ms)
    ex = exchange(cal, sc.allreduce_dtype, sc.allreduce_packs, sc.accumulate, sc.overlap)
    host, why = input_host(summary.read(Path(run_dir) / "summary.json"), sc.host_cores)
    out = Path(out) if out is not None else Path(run_dir)
    refusal = gpu_forecast_refusal(cal, sc.devices)
    if refusal:
        if on_refusal != "report":
            raise ConfigError(refusal)
        return _refused(run_dir, out, cal, refusal, figures)
    links, fit = _links(sc)
    inter = parse_link(sc.inter_host) if sc.inter_host else None
    v = validation.release()
    # The published rows are GPU servers: their straggler σ and interval speak for dedicated devices only.
    gpus = sc.devices == "dedicated"
    sigma = sc.straggler if sc.straggler is not None else (v.get("straggler", 0.0) if gpus else 0.0)
    frame = pd.concat([predict(cal, link, inter, mode=sc.mode, devices=sc.devices, overlap=sc.overlap,
                               max_replicas=sc.max_replicas, gpus_per_host=sc.gpus_per_host,
                               nics_per_host=sc.nics_per_host, algorithm=sc.algorithm, allreduce_dtype=ex.dtype,
                               allreduce_packs=ex.packs, accumulate=ex.accumulate, straggler=sigma)
                       for link in links],
                      ignore_index=True)
    if gpus:
        frame, interval = validation.with_interval(frame, "rate", v)
    else:
        frame, interval = validation.with_interval(frame, "none", {})
        interval = {"method": "none: replicas sharing one host's cores (--devices shared); the published validation "
                              "rows are GPU servers", "checked": "not checked"}
    frame, input_fields = with_input_limit(frame, host, why, sc.devices, sc.gpus_per_host)
    result = {
        "run_dir": str(run_dir), "mode": sc.mode, "devices": sc.devices, "overlap": sc.overlap,
        "gpus_per_host": sc.gpus_per_host, "nics_per_host": sc.nics_per_host, "max_replicas": sc.max_replicas,
        "algorithm": sc.algorithm, "accumulate": ex.accumulate, "allreduce_dtype": ex.dtype,
        "allreduce_packs": ex.packs, "gradient_bytes": cal.gradient_bytes_in(ex.dtype),
        "overlap_model": ex.note, "overlap_modelled": ex.modelled,
        "calibration": _calibration_fields(cal),
        "run_point": run_point(run_dir, frame, ex, cal),
        "links": {lk.name: {"bandwidth_GBps": lk.bandwidth_GBps, "latency_us": lk.latency_us, "source": lk.source}
                  for lk in links + ([inter] if inter is not None else [])},
        "allreduce_fit": fit,
        "straggler": sigma,
        "stragglers": (f"the slowest of N replicas sets the step: compute x (1 + {sigma:.3g} x E[max of N]) / (1 + "
                       f"{sigma:.3g} x E[max of {cal.replicas}]), the run's own replicas' wait already in its compute"
                       + (" (given, --straggler)" if sc.straggler is not None else
                          " (sigma fitted to the published validation rows)" if gpus else
                          " (none: replicas share one pool of cores)")),
        "interval": interval,
        "crossover_replicas": crossover(frame),
        "input_limit": input_fields,
        "model": "t = K*micro_compute*straggler_factor + P*[2(G-1)/G*S/(P*B_intra) + 2(G-1)*alpha_intra + 2(H-1)/H*S/(P*nics*B_inter) "
                 "+ 2(H-1)*alpha_inter] - hidden; hidden = min(overlap*allreduce, 2/3*micro_compute) with --overlap, "
                 "else (P-1)/P*min(allreduce, 2/3*micro_compute) for K = 1 (modelled, not measured), 0 for K > 1",
    }
    comparison = None
    if sc.measured:
        comparison = compare(cal, links[0], measured_frame(sc.measured, sc.gpus_per_host), sc.devices, sc.overlap,
                             sc.algorithm, inter, sc.nics_per_host, straggler=sigma)
        result["comparison"] = _comparison_fields(comparison, links[0], inter)
    _write(out, result, frame, comparison, figures)
    result["frame"] = frame
    result["comparison_frame"] = comparison
    return result


def _refused(run_dir, out: Path, cal, refusal: str, figures: bool) -> dict:
    """The result of a refused forecast (a notebook's ``on_refusal="report"``): why, and no forecast, written."""
    frame = pd.DataFrame(columns=["scenario", "replicas", "efficiency", "speedup", "comm_exceeds_compute"])
    frame.attrs["why"] = refusal
    result = {"run_dir": str(run_dir), "refused": refusal, "calibration": {"source": cal.label}, "frame": frame,
              "comparison_frame": None}
    fileio.write_json(out / "prediction.json", {k: v for k, v in result.items() if "frame" not in k})
    if figures:
        from ..plots import predict as pplots  # matplotlib and seaborn: only where a figure is drawn
        from ..plots.theme import save_figure

        save_figure(pplots.efficiency(frame), out, "efficiency_vs_replicas", formats=("png",))
    return result


def _links(sc: Scenario) -> tuple[list[Link], dict | None]:
    """(the intra-host links to forecast over, the allreduce.csv fit or None): the fitted link first."""
    links: list[Link] = []
    fit = None
    if sc.allreduce_csv:
        link, fit = fit_link(read_allreduce_csvs(sc.allreduce_csv), sc.impl, algorithm=sc.algorithm)
        links.append(link)
    links += sc.links()
    if not links:
        raise ConfigError("no interconnect to predict for; give --interconnect and/or --allreduce-csv")
    return links, fit


def _calibration_fields(cal) -> dict:
    """prediction.json's ``calibration``: the compute figure every forecast rests on, and where it came from."""
    return {"compute_s": cal.compute_s, "per_replica_batch": cal.per_replica_batch,
            "replicas": cal.replicas, "gradient_bytes": cal.gradient_bytes, "source": cal.label,
            "device_kind": cal.device_kind, "given": cal.given, "measured_by_tftoolkit": cal.measured,
            "accumulate": cal.accumulate,
            "allreduce_dtype": cal.allreduce_dtype, "allreduce_packs": cal.allreduce_packs}


def _comparison_fields(comparison, link: Link, inter: Link | None) -> dict:
    """prediction.json's ``comparison``: the measured runs' layouts and the forecast's error over them."""
    several = comparison["hosts"] > 1
    return {"link": link.name, "inter_host": inter.name if several.any() else None,
            "layouts": sorted({f"{int(h)} x {int(g)}" for h, g in
                               zip(comparison["hosts"], comparison["gpus_per_host"])}),
            "runs": len(comparison),
            "not_measured_by_tftoolkit": sorted(set(
                comparison.loc[~comparison["measured_by_tftoolkit"].astype(bool), "source"])),
            "median_abs_error": float(comparison["error"].abs().median()),
            "max_abs_error": float(comparison["error"].abs().max())}


def _write(out: Path, result: dict, frame, comparison, figures: bool) -> None:
    """prediction.csv, prediction_vs_measured.csv (with a comparison), prediction.json and the figures."""
    fileio.write_csv(out / "prediction.csv", frame)
    if comparison is not None:
        fileio.write_csv(out / "prediction_vs_measured.csv", comparison)
    fileio.write_json(out / "prediction.json", result)
    if figures:
        from ..plots import predict as pplots  # matplotlib and seaborn: only where a figure is drawn
        from ..plots.theme import save_figure

        save_figure(pplots.efficiency(frame), out, "efficiency_vs_replicas", formats=("png",))
        if comparison is not None:
            save_figure(pplots.predicted_vs_measured(comparison), out, "predicted_vs_measured", formats=("png",))


def forecast_text(result: dict) -> str:
    """The lines the CLI prints."""
    lines = []
    if result.get("refused"):
        return f"no forecast: {result['refused']}"
    frame = result["frame"]
    cal = result["calibration"]
    lines.append(f"calibration: {cal['source']} at per-replica batch {cal['per_replica_batch']:g}; gradients "
                 f"{cal['gradient_bytes'] / 1e6:.2f} MB (every forecast below rests on this compute figure)")
    if "allreduce_dtype" in result:
        k, dtype, packs = result["accumulate"], result["allreduce_dtype"], result["allreduce_packs"]
        moved = f"{result['gradient_bytes'] / 1e6:.2f} MB in {dtype}"
        if dtype != cal.get("allreduce_dtype", dtype):
            moved += f" (the run's {cal['gradient_bytes'] / 1e6:.2f} MB in {cal['allreduce_dtype']}, converted)"
        lines.append(f"step: accumulate {k} (compute {k} x one micro-step, global batch = per-replica x replicas x "
                     f"{k}), one all-reduce of {moved} in {packs} pack{'s' if packs != 1 else ''}; hidden behind the "
                     f"backward pass: {result['overlap_model']}")
    for name, g in frame.groupby("scenario", sort=False):
        pick = g[g["replicas"].isin([1, 2, 4, 8, 16, 32, 64])]
        eff = ", ".join(f"{int(r['replicas'])}: {r['efficiency']:.0%}" + (
            f" [{r['efficiency_low']:.0%}..{r['efficiency_high']:.0%}]"
            if r["replicas"] > 1 and finite(r.get("efficiency_low")) else "") for _, r in pick.iterrows())
        cross = result["crossover_replicas"].get(name)
        where = (f"communication overtakes compute at {cross} replicas" if cross
                 else f"compute stays larger than communication up to {int(g['replicas'].max())} replicas")
        lines.append(f"{name}: efficiency {eff}; {where}")
    if result.get("interval"):
        lines.append(f"interval: {result['interval']['method']}; {result['interval']['checked']}; "
                     f"{result.get('stragglers', '')}")
    mp = result.get("run_point")
    if mp:
        # Only a run tftoolkit trained was measured; a summary written by hand holds someone's figures.
        where = ("measured" if mp["measured_by_tftoolkit"]
                 else "the run directory's summary.json (not measured by tftoolkit)")
        said = "measured" if mp["measured_by_tftoolkit"] else "in the summary"
        for name, r in mp["scenarios"].items():
            frac = mp.get("communication_fraction")
            lines.append(f"{where} at {mp['replicas']} replica(s) ({mp['device_kind']}): step "
                         f"{mp['step_time_s'] * 1e3:.2f} ms against {name}'s {r['predicted_step_time_s'] * 1e3:.2f} ms "
                         f"({r['error']:+.0%})" + (f"; communication {frac:.0%} {said}, "
                                                   f"{r['predicted_communication_fraction']:.0%} predicted"
                                                   if finite(frac) else ""))
    if result.get("comparison"):
        c = result["comparison"]
        link = c["link"] + (f" + {c['inter_host']} between hosts" if c.get("inter_host") else "")
        hosts = f", each run on its own hosts x GPUs ({', '.join(c['layouts'])})" if c.get("layouts") else ""
        others = c.get("not_measured_by_tftoolkit") or []
        against = ("measured step time" if not others else
                   f"the given step times ({len(others)} of {c['runs']} not measured by tftoolkit: summaries written "
                   "by hand or tables)")
        lines.append(f"predicted vs {against} over {link}{hosts}: median |error| {c['median_abs_error']:.1%}, "
                     f"max {c['max_abs_error']:.1%}")
    return "\n".join(lines + input_lines(result.get("input_limit")))


ROW_FIELDS = ("replicas", "hosts", "gpus_per_host", "images_per_sec", "images_per_sec_low", "images_per_sec_high",
              "efficiency", "efficiency_low", "efficiency_high", "step_time_s", "compute_s", "allreduce_s",
              "hidden_s", "overhead_s", "scenario")


def _plain(key: str, v):
    """A row's value as JSON holds it: whole counts as int, NaN as null."""
    if key in ("replicas", "hosts", "gpus_per_host"):
        return int(v)
    if isinstance(v, str):
        return v
    return float(v) if finite(v) else None


def run_plan(plan: Plan, out=None, counted: dict | None = None) -> dict:
    """A forecast without a run directory (plan.forecast) with its interval from the release's validation
    (intervals.with_interval: out of sample); prediction.json / .csv in ``out`` when given. ``counted``: what
    modelsize.memory counted on the model (``fixed`` and ``per_example`` training bytes for the memory check,
    planner.memory, and ``about``, what the name builds), else the check counts the parameters' weights, gradients
    and optimizer slots only."""
    v = validation.release()
    found = None
    if plan.case == "flops" and plan.achieved is None and plan.forward_flops:
        found = achieved.resolve(v, plan.model, plan.gpu, plan.precision)
        if found is None:
            raise ConfigError(achieved.refusal(plan.model, plan.gpu, plan.precision))
    frame, assumed = plan_forecast(plan, achieved=found.value if found else None, straggler=v.get("straggler", 0.0),
                                   overhead_ms=v.get("overhead_ms", 0.0))
    frame, interval = intervals.with_interval(frame, plan.case)  # out-of-sample residuals, widened per row
    if found is not None:
        assumed["achieved"] = {"fraction": found.value, "how": found.how, "source": found.words}
        if found.widen:  # a fraction from another chip: the rate's interval widened (the efficiency's is not: the
            for col, sign in (("images_per_sec_low", -1), ("images_per_sec_high", 1)):  # compute cancels in it)
                frame[col] = frame[col] * math.exp(sign * found.widen)
            interval = {**interval, "method": interval["method"] + f"; widened x{math.exp(found.widen):.2f} each "
                                                                   "way: the achieved fraction is borrowed"}
        elif found.how == "catalogue rate":
            interval = {**interval, "method": interval["method"] + "; the achieved fraction is not from those rows "
                                                                   "but from tftoolkit/catalogue/rates.toml"}
    counted = counted or {}
    mem = memory.usage(plan.gpu, plan.per_replica_batch, params=plan.params,
                       **{k: counted[k] for k in ("fixed", "per_example") if k in counted})
    result = {"rows": [{k: _plain(k, r[k]) for k in ROW_FIELDS if k in r} for r in frame.to_dict("records")],
              "assumed": assumed, "interval": interval, "checked": interval["checked"], "memory": mem,
              "crossover": crossover_text(frame),
              "model": {"name": plan.model if isinstance(plan.model, str) else None, "params": plan.params,
                        "forward_flops": plan.forward_flops, "about": counted.get("about", "")}}
    if out is not None:
        fileio.write_csv(Path(out) / "prediction.csv", frame)
        fileio.write_json(Path(out) / "prediction.json", result)
    result["frame"] = frame
    return result


def plan_text(result: dict) -> str:
    """The lines the CLI prints for run_plan's result: every number with its interval, and what it assumed."""
    a = result["assumed"]
    m, lines = result.get("model") or {}, []
    if m.get("params"):  # the counts the forecast rests on, and what a keras.applications name built
        lines.append(f"model: {m.get('name') or 'given by --params'}: {m['params'] / 1e6:.1f}M parameters"
                     + (f", {m['forward_flops'] / 1e9:.3g} GFLOPs forward per example" if m.get("forward_flops")
                        else "") + (f" ({m['about']})" if m.get("about") else ""))
    if a.get("achieved"):
        lines.append(f"achieved fraction of peak: {a['achieved']['source']}")
    lines += [f"compute: {a['compute']} ({a['compute_s'] * 1e3:.3g} ms per step); gradients "
             f"{a['gradient_bytes'] / 1e6:.1f} MB, {a['algorithm']} all-reduce; links: "
             + "; ".join(f"{k}: {v}" for k, v in a["links"].items())
             + (f"; between hosts {a['inter_host']} x {a['nics_per_host']} NIC(s)" if a["inter_host"] else "")
             + (f"; {a['stragglers']}" if a.get("stragglers") else "")]
    for r in result["rows"]:
        lo, hi = r.get("images_per_sec_low"), r.get("images_per_sec_high")
        band = (f" [{lo:,.0f} .. {hi:,.0f}]" if finite(lo) and finite(hi) else " [no interval]")
        eff = f"{r['efficiency']:.0%}"
        if finite(r.get("efficiency_low")):
            eff += f" [{r['efficiency_low']:.0%} .. {r['efficiency_high']:.0%}]"
        lines.append(f"{int(r['replicas'])} GPU(s) ({int(r['hosts'])} host(s)): {r['images_per_sec']:,.0f} images/s"
                     f"{band}, efficiency {eff}")
    if result.get("crossover"):
        lines.append(result["crossover"])
    lines.append(f"interval: {result['interval']['method']}; {result['checked']}")
    if result.get("memory"):
        lines.append(memory.text(result["memory"]))
    return "\n".join(lines)
